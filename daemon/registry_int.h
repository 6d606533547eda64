/*
 * What registry.c (the table, lifetimes, leases, permissions) and
 * registry_create.c (creates) share, and nothing else includes. The
 * invariants are those of registry.h: every name in the table is valid, a
 * tensor lives while it is named or leased (or pinned by an allocation in
 * flight), and the last of those to go frees it.
 */
#ifndef TENSORD_REGISTRY_INT_H
#define TENSORD_REGISTRY_INT_H

#include "registry.h"

/* The named tensor with exactly these bytes, whoever may see it, or NULL. */
struct tensor *reg_find_named(struct registry *reg, const char *name, size_t len);

/*
 * What name means to rc: rc's draft of it if it has one (which only rc
 * sees), else the named tensor, or NULL.
 */
struct tensor *reg_view(struct registry *reg, const struct reg_client *rc, const char *name,
			size_t len);

/* Room for one more name in the table: 0, or -ENOMEM with the reason. */
int reg_name_room(struct registry *reg, const struct tensor *t, char *why, size_t why_len);

/* Puts t in the name table (reg_name_room() made room). */
void reg_tensor_name(struct registry *reg, struct tensor *t);

/* Charges t to dev and puts it on the list of live tensors. */
void reg_tensor_link(struct registry *reg, struct reg_device *dev, struct tensor *t);

/* Removes the name (if t has it); frees t if nothing holds it. */
void reg_tensor_unlink(struct registry *reg, struct tensor *t);

/* Frees t and its memory, and gives back what it was charged. */
void reg_tensor_free(struct registry *reg, struct tensor *t);

/* t goes on rc's list of tensors it created, for its close to walk. */
void reg_creator_link(struct reg_client *rc, struct tensor *t);

/* A new lease of rc on t: 0, -EAGAIN (too many leases) or -ENOMEM. */
int reg_lease_add(struct registry *reg, struct reg_client *rc, struct tensor *t,
		  uint64_t *ret_lease);

/* Whether rc sees t at all: published, or its own draft. */
bool reg_visible_to(const struct tensor *t, const struct reg_client *rc);

/* Tells on_figures (registry.h) that t goes from state `from` to `to`, by `bytes`. */
static inline void reg_figures(struct registry *reg, const struct tensor *t, int from, int to,
			       int64_t bytes)
{
	if (reg->on_figures)
		reg->on_figures(reg->on_figures_ctx, t, from, to, bytes);
}

/* Gives back t's per-uid charges (registry_create.c charges them). */
void reg_create_uncharge(struct registry *reg, const struct tensor *t);

#endif /* TENSORD_REGISTRY_INT_H */
