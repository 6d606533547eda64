/*
 * What the registry's files share, private to daemon/registry/ (a unit
 * test, test_versions.c, reads it too): registry.c (the name table,
 * lifetimes, permissions), registry_lease.c (leases, holders, a client's
 * end), registry_create.c (creates), registry_reserve.c, registry_bind.c,
 * commit.c and txn.c. The invariants are those of registry.h: every name in the table is valid, a
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

/* t leaves its creator's list (if it is on one). */
void reg_creator_unlink(struct tensor *t);

/* registry_lease.c: the ledger of leases and holders. */

/*
 * t was unlinked while leases hold it: from now on its bytes count against
 * each uid that holds a lease on it, not against its owner, who no longer
 * names it and must not be starved by others' leases.
 */
void reg_pin_to_holders(struct registry *reg, struct tensor *t);

/* A new lease of rc on t: 0, -EAGAIN (too many leases) or -ENOMEM. */
int reg_lease_add(struct registry *reg, struct reg_client *rc, struct tensor *t,
		  uint64_t *ret_lease);

/* Whether rc may unlink t: root, its owner, or its mode's write bit for rc. */
bool reg_may_unlink(const struct tensor *t, const struct reg_client *rc);

/* Whether rc sees t at all: published, or its own draft. */
bool reg_visible_to(const struct tensor *t, const struct reg_client *rc);

/* Tells on_figures (registry.h) that t goes from state `from` to `to`, by `bytes`. */
static inline void reg_figures(struct registry *reg, const struct tensor *t, int from, int to,
			       int64_t bytes)
{
	if (reg->on_figures)
		reg->on_figures(reg->on_figures_ctx, t, from, to, bytes);
}

/* commit.c: versions and commit steps (docs/design.md, "Versions, sets and watches"). */
void reg_versions_init(struct registry *reg);
void reg_versions_fini(struct registry *reg);

/* Room for n more changes in this step: 0 or -ENOMEM. */
int reg_step_reserve(struct registry *reg, size_t n);

/* The commit id of this step, taken on first use. */
uint64_t reg_step_commit(struct registry *reg);

/*
 * t was just published in this step: its generation (one more than
 * replaced_gen, the generation of the version it replaced, or, for 0, than
 * the name's tombstone or the floor) and the step's commit id. retired:
 * the version it replaced when that lives on (leased), else NULL.
 */
void reg_step_published(struct registry *reg, struct tensor *t, uint64_t replaced_gen,
			struct tensor *retired);

/* t, published, is losing its name for good in this step: its tombstone and change. */
void reg_step_unlinked(struct registry *reg, struct tensor *t);

/* The step is over: on_commit hears of its changes. */
void reg_step_end(struct registry *reg);

/*
 * What a publish of t needs before the step that publishes it: its memory
 * allocated, and frozen (sealed) unless it is mutable. 0 or -errno with the
 * reason; nothing is published either way.
 */
int reg_publish_ready(struct registry *reg, struct tensor *t, char *why, size_t why_len);

/*
 * Publishes t (ready, and no member of a transaction any more) in this
 * step: takes the name from the version it replaces, if any, and gives t
 * its generation and the step's commit. Cannot fail (reg_step_reserve()
 * made room for its change).
 */
void reg_publish_now(struct registry *reg, struct tensor *t);

/* txn.c: transactions. */
uint32_t reg_tx_id(const struct reg_tx *tx);

/*
 * rc's transaction id. stage: to stage one more change in it (made when rc
 * has none, refused when full); else to end it (found only, full or not).
 * 0 with *ret_tx set, or -errno with the reason and *ret_tx NULL (-ENOENT:
 * none and !stage; -EAGAIN: rc has REGISTRY_TX_PER_CLIENT open; -E2BIG:
 * stage and it has REGISTRY_TX_MEMBERS_MAX members and staged names;
 * -ENOMEM).
 */
int reg_tx_get(struct reg_client *rc, uint32_t id, bool stage, struct reg_tx **ret_tx, char *why,
	       size_t why_len);

/* t, just created in its place, becomes a member of tx. */
void reg_tx_add(struct reg_tx *tx, struct tensor *t);

/* t leaves its transaction (it is freed, or was published). */
void reg_tx_remove(struct tensor *t);

/* rc is gone: every transaction of its ends, its members discarded. */
void reg_tx_client_gone(struct registry *reg, struct reg_client *rc);

/* Gives back t's per-uid charges (registry_create.c charges them). */
void reg_create_uncharge(struct registry *reg, const struct tensor *t);

/* registry_reserve.c: rc's reserve of that id, off rc's list and uncharged; the caller owns it. */
struct reg_reserve *reg_reserve_take(struct registry *reg, struct reg_client *rc, uint64_t id);

/* Frees r (taken, or still on its client's list: then taken first). */
void reg_reserve_free(struct registry *reg, struct reg_client *rc, struct reg_reserve *r);

/* What reserve (or free ring buffer) r costs rc's uid and its device: charged, or -errno and why. */
int reg_reserve_charge(struct registry *reg, const struct reg_client *rc, struct reg_reserve *r,
		       char *why, size_t why_len);
void reg_reserve_uncharge(struct registry *reg, const struct reg_client *rc, struct reg_reserve *r);

/*
 * registry_ring.c (docs/recycle.md). rc's free ring buffer on dev that a
 * tensor of nbytes, group gid and mode may take: off the list and
 * uncharged, the caller's (free the struct, keep the memory); NULL: none.
 */
struct reg_reserve *reg_ring_take(struct registry *reg, struct reg_client *rc,
				  const struct reg_device *dev, uint64_t nbytes, uint32_t gid,
				  uint32_t mode);

/* Whether rc has such a buffer free, taking nothing. */
bool reg_ring_has(const struct reg_client *rc, const struct reg_device *dev, uint64_t nbytes,
		  uint32_t gid, uint32_t mode);

/* t's memory is rc's ring buffer id from now on (recycled when t is freed). */
void reg_ring_link(struct reg_client *rc, struct tensor *t, uint64_t id);

/*
 * t is being freed, uncharged already: true when its memory went back to
 * its ring as a free buffer (t->alloc no longer holds it), false when the
 * caller must release it. Either way t leaves its ring.
 */
bool reg_ring_return(struct registry *reg, struct tensor *t);

/*
 * Keeps alloc, memory of rc's ring buffer id that held a version of nbytes
 * (host: alloc->size), group gid and mode, as a free buffer of rc's ring
 * (charged like a reserve; alloc->fd becomes -1): true; false when it
 * cannot (the caller frees it). GPU memory is kept only on the CUDA VMM
 * path, whole allocations.
 */
bool reg_ring_keep(struct registry *reg, struct reg_client *rc, uint64_t id, struct reg_device *dev,
		   struct backend_alloc *alloc, uint64_t nbytes, uint32_t gid, uint32_t mode);

/* Unreserve of a ring buffer's id: a free one is freed, a used one is freed with its tensor. */
int reg_ring_drop(struct registry *reg, struct reg_client *rc, uint64_t id);

/* Frees rc's free ring buffers (room for a create; its close). Returns how many. */
unsigned reg_ring_drop_free(struct registry *reg, struct reg_client *rc);

/* rc is going: its free buffers are freed, its ring's tensors freed with their last lease. */
void reg_ring_client_gone(struct registry *reg, struct reg_client *rc);

/* Frees every reserve rc holds: its close, or room for a create. Returns how many. */
unsigned reg_reserves_drop(struct registry *reg, struct reg_client *rc);

/*
 * registry_arena.c: a set in one allocation (docs/recycle.md, section 5).
 * Opens tx's arena of size bytes on dev for members of rc's group gid and
 * mode (closing the one it had of dev's kind, host or GPU): 0, or -errno
 * and why (then none is open). On a GPU the arena is only charged here,
 * and allocating: its first member's create makes it on the GPU worker
 * (reg_arena_place_pending(), reg_arena_allocated()), unless recycle and
 * rc's ring has a free GPU buffer of size bytes, gid and mode: that one
 * is the arena at once. A GPU arena opened with recycle goes back to rc's
 * ring with its last member (registry_ring.c decides whether it can).
 */
int reg_arena_open(struct registry *reg, struct reg_client *rc, struct reg_tx *tx,
		   struct reg_device *dev, uint64_t size, uint32_t gid, uint32_t mode, bool recycle,
		   char *why, size_t why_len);

/*
 * Room in tx's open arena for a tensor of nbytes on dev of group gid, mode
 * and flags about to be created: its bytes taken out of the arena's charge
 * (the tensor's own create charges them) and returned; 0 when tx has no
 * arena open or the tensor does not fit it (another class or device, no
 * room). reg_arena_place() then puts it there, or reg_arena_unlend() gives
 * the bytes back when its create fails.
 */
uint64_t reg_arena_lend(struct registry *reg, struct reg_tx *tx, const struct reg_device *dev,
			uint32_t gid, uint32_t mode, uint32_t flags, uint64_t nbytes);
void reg_arena_unlend(struct registry *reg, struct reg_tx *tx);

/* t, lent room, goes into tx's arena at the next offset: t->alloc borrows its descriptor. */
void reg_arena_place(struct reg_tx *tx, struct tensor *t);

/* Whether the room tx lent is in a GPU arena still to be made (t must then make it). */
bool reg_arena_lent_pending(const struct reg_tx *tx);

/*
 * t, lent room in tx's arena still to be made, is its first member, at
 * offset 0: the arena counts it, and t's create allocates the arena's
 * want bytes on the GPU worker (registry_alloc_run()).
 */
void reg_arena_place_pending(struct reg_tx *tx, struct tensor *t);

/*
 * The GPU worker made t's arena (rc, what alloc() answered, got): on
 * success the arena owns *got, charged at its rounded size, and t's memory
 * is its slice; on failure (rc < 0, no room for the rounding) *got is
 * released, the arena takes no member, and why says so. 0 or -errno.
 */
int reg_arena_allocated(struct registry *reg, struct tensor *t, struct backend_alloc *got, int rc,
			char *why, size_t why_len);

/* The bytes a create of t allocates: its arena's, when t makes one; else its own. */
uint64_t reg_arena_alloc_size(const struct tensor *t);

/* t, a member, is being freed: the arena forgets it; its last member's end frees or recycles it. */
void reg_arena_member_gone(struct registry *reg, struct tensor *t);

/* tx ends: its arena takes no more members (freed or recycled now if it has none). */
void reg_arena_close(struct registry *reg, struct reg_arena *a);

/* tx's open arena of one kind, host or GPU (NULL: none), and a new one for it (the old one closed). */
struct reg_arena *reg_tx_arena(const struct reg_tx *tx, bool gpu);
void reg_tx_set_arena(struct registry *reg, struct reg_tx *tx, bool gpu, struct reg_arena *a);

/*
 * Unreserve of arena id of rc (0: any one): its writer let go of its
 * mapping, so it is freed with its last member, never recycled. 0, or
 * -ESRCH when rc has no such arena.
 */
int reg_arena_drop(struct reg_client *rc, uint64_t id);

/* A client leasing a member forked: the arena is never recycled. True the first time. */
bool reg_arena_taint(struct reg_arena *a);

/* registry_bind.c: t's name no longer means t: every slot bound to it is cleared, its client woken. */
void reg_bindings_clear(struct tensor *t);

/* t goes while bound (registry_fini()): its slots are freed. */
void reg_bindings_detach(struct tensor *t);

/* The lease in rc's slot lease_slot ends: its binding, if any, goes (no wake: rc let go). */
void reg_binding_end(struct reg_client *rc, uint32_t lease_slot);

/* rc is gone, its leases ended: its page is unmapped and closed. */
void reg_page_free(struct reg_client *rc);

#endif /* TENSORD_REGISTRY_INT_H */
