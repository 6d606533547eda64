/*
 * The registry (registry.h): the name table, lifetimes, permissions,
 * publish, attach, unlink and list. Leases, holders and a client's end are
 * in registry_lease.c, creates in registry_create.c; what they share is in
 * registry_int.h.
 */
#include "registry.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/desc.h"
#include "common/hash.h"
#include "daemon/figures.h"
#include "daemon/base/log.h"
#include "registry_int.h"

#define PERM_READ 4u
#define PERM_WRITE 2u

static int cmp_names(const struct tensor *a, const struct tensor *b)
{
	return strcmp(a->name, b->name);
}

RB_GENERATE_STATIC(tensor_names, tensor, byname, cmp_names)

static struct tensor **bucket_of(struct registry *reg, const char *name, size_t len)
{
	return &reg->buckets[td_hash_name(name, len) & (reg->n_buckets - 1)];
}

struct tensor *reg_find_named(struct registry *reg, const char *name, size_t len)
{
	for (struct tensor *t = *bucket_of(reg, name, len); t; t = t->hnext)
		if (t->name_len == len && memcmp(t->name, name, len) == 0)
			return t;
	return NULL;
}

/* Doubles the name table's buckets. 0 or -ENOMEM (the table stays as it was). */
static int reg_grow_buckets(struct registry *reg)
{
	size_t n = reg->n_buckets * 2;
	struct tensor **nb = calloc(n, sizeof(*nb));

	if (!nb)
		return -ENOMEM;
	for (size_t i = 0; i < reg->n_buckets; i++) {
		struct tensor *t = reg->buckets[i], *next;

		for (; t; t = next) {
			next = t->hnext;
			struct tensor **b = &nb[td_hash_name(t->name, t->name_len) & (n - 1)];
			t->hnext = *b;
			*b = t;
		}
	}
	free(reg->buckets);
	reg->buckets = nb;
	reg->n_buckets = n;
	return 0;
}

static void unhash(struct registry *reg, struct tensor *t)
{
	for (struct tensor **p = bucket_of(reg, t->name, t->name_len); *p; p = &(*p)->hnext) {
		if (*p == t) {
			*p = t->hnext;
			t->hnext = NULL;
			reg->n_named--;
			RB_REMOVE(tensor_names, &reg->names, t);
			return;
		}
	}
}

struct reg_device *registry_device(struct registry *reg, DLDevice dev)
{
	for (int i = 0; i < reg->n_devices; i++) {
		struct reg_device *d = &reg->devices[i];

		if (d->device.device_type == dev.device_type &&
		    d->device.device_id == dev.device_id)
			return d;
	}
	return NULL;
}

int registry_init(struct registry *reg, uint64_t host_capacity)
{
	memset(reg, 0, sizeof(*reg));
	RB_INIT(&reg->names);
	LIST_INIT(&reg->all);
	LIST_INIT(&reg->holds);
	reg->n_buckets = 64;
	reg->buckets = calloc(reg->n_buckets, sizeof(*reg->buckets));
	if (!reg->buckets)
		return -ENOMEM;
	reg->next_id = 1;
	reg_versions_init(reg);

	for (int b = 0; backends[b]; b++) {
		const struct backend_ops *ops = backends[b];
		char why[160] = "";
		int rc = ops->init(why, sizeof(why));
		int n = rc == 0 ? ops->device_count() : 0;

		if (rc < 0)
			log_info("backend %s: unavailable: %s", ops->name, why);
		/* A backend with no device still gets a slot for device 0, so that a
		 * request for it is answered with its reason. */
		for (int i = 0; i < (n > 0 ? n : 1) && reg->n_devices < REGISTRY_DEVICES_MAX; i++) {
			struct reg_device *d = &reg->devices[reg->n_devices++];

			d->ops = ops;
			d->device = (DLDevice){ (DLDeviceType)ops->device_type, i };
			d->init_rc = rc < 0 ? rc : n > 0 ? 0 : -ENODEV;
			snprintf(d->why, sizeof(d->why), "%s",
				 rc < 0  ? why
				 : n > 0 ? ""
					 : "no such device");
			if (d->init_rc == 0) {
				d->capacity = ops->default_capacity(i);
				if (ops->device_type == kDLCPU && host_capacity)
					d->capacity = host_capacity;
				log_info("backend %s: device %d ready, capacity %llu bytes, %s",
					 ops->name, i, (unsigned long long)d->capacity,
					 ops->path(i));
			}
		}
	}
	return 0;
}

/* t is on its creator's list while the creator lives. */
void reg_creator_link(struct reg_client *rc, struct tensor *t)
{
	t->creator = rc;
	LIST_INSERT_HEAD(&rc->created, t, creator_link);
}

void reg_creator_unlink(struct tensor *t)
{
	if (!t->creator)
		return;
	LIST_REMOVE(t, creator_link);
	t->creator = NULL;
}

void reg_tensor_free(struct registry *reg, struct tensor *t)
{
	assert(!t->draft && !t->replaces);
	reg_tx_remove(t);
	assert(t->refcount == 0 || !t->creator); /* registry_fini() frees what is leased */
	assert(t->holds == 0);                   /* registry_fini() ends the holds first */
	free(t->hv);
	/* Only registry_fini() frees a tensor that is still bound. */
	reg_bindings_detach(t);
	reg_creator_unlink(t);
	reg_create_uncharge(reg, t);
	/* Its end is logged before its memory can be freed or reused (and a
	 * rewrite meanwhile no longer counts it as alive). */
	if (t->retired_logged) {
		t->retired_logged = false;
		if (reg->on_retired_gone)
			reg->on_retired_gone(reg->on_commit_ctx, t);
	}
	LIST_REMOVE(t, all_link);
	if (t->dev) {
		reg_figures(reg, t, t->state, 0, -(int64_t)t->alloc.footprint);
		t->dev->used -= t->alloc.footprint;
		t->dev->tensors--;
	}
	/* A member's memory is its arena's; memory of a ring goes back to it
	 * (registry_ring.c); else it is freed. */
	if (t->arena)
		reg_arena_member_gone(reg, t);
	else if (t->alloc.ops && !reg_ring_return(reg, t))
		t->alloc.ops->release(&t->alloc);
	reg->n_tensors--;
	log_debug("tensor '%s' (id %llu): freed", t->name, (unsigned long long)t->id);
	free(t);
}

void registry_fini(struct registry *reg)
{
	struct tensor *t;

	registry_readopt_end(reg);
	while (!LIST_EMPTY(&reg->holds))
		registry_hold_end(reg, LIST_FIRST(&reg->holds));
	/* Arenas forget their writers first: a client may be gone already. */
	LIST_FOREACH(t, &reg->all, all_link)
	if (t->arena)
		t->arena->rc = NULL;
	while (!LIST_EMPTY(&reg->all)) {
		t = LIST_FIRST(&reg->all);

		t->creator = NULL; /* its client may be gone without client_gone() */
		t->ring_rc = NULL; /* likewise its ring's: the memory is freed */
		if (t->draft)
			t->draft->replaces = NULL;
		if (t->replaces)
			t->replaces->draft = NULL;
		t->draft = t->replaces = NULL;
		reg_tensor_free(reg, t);
	}
	free(reg->buckets);
	reg->buckets = NULL;
	reg_versions_fini(reg);
	for (int b = 0; backends[b]; b++)
		if (backends[b]->fini)
			backends[b]->fini();
}

/*
 * Takes t's name away. A draft only lets go of the version it would have
 * replaced; a named tensor with a draft hands the name to it, unpublished
 * (one name out, one in: the table does not grow).
 */
static void name_drop(struct registry *reg, struct tensor *t)
{
	struct tensor *d = t->draft;

	/* A draft and what it replaces point at each other; a draft is never named. */
	assert(!d || (d->replaces == t && d->state == TENSORD_STATE_CREATED));
	assert(!t->replaces || (t->replaces->draft == t && t->state != TENSORD_STATE_PUBLISHED));

	if (t->state == TENSORD_STATE_UNLINKED)
		return;
	/* Before anyone hears of it: no attach that starts later uses a binding. */
	reg_bindings_clear(t);
	reg_figures(reg, t, t->state, TENSORD_STATE_UNLINKED, 0);
	t->state = TENSORD_STATE_UNLINKED;
	if (t->replaces) {
		t->replaces->draft = NULL;
		t->replaces = NULL;
		return;
	}
	unhash(reg, t);
	if (d) {
		t->draft = NULL;
		d->replaces = NULL;
		reg_tensor_name(reg, d);
		log_debug("tensor '%s': unlinked; its draft takes the name", d->name);
	}
}

void reg_tensor_unlink(struct registry *reg, struct tensor *t)
{
	name_drop(reg, t);
	if (t->refcount)
		reg_pin_to_holders(reg, t);
	if (t->refcount == 0)
		reg_tensor_free(reg, t);
}

struct tensor *reg_view(struct registry *reg, const struct reg_client *rc, const char *name,
			size_t len)
{
	struct tensor *t = reg_find_named(reg, name, len);

	return t && t->draft && t->draft->creator == rc ? t->draft : t;
}

/* Room for one more name in the table. */
int reg_name_room(struct registry *reg, const struct tensor *t, char *why, size_t why_len)
{
	if (reg->n_named + 1 > reg->n_buckets && reg_grow_buckets(reg) < 0) {
		snprintf(why, why_len, "tensor '%s': out of memory", t->name);
		return -ENOMEM;
	}
	return 0;
}

/* Puts t in the name table (reg_name_room() made room). */
void reg_tensor_name(struct registry *reg, struct tensor *t)
{
	assert(t->state != TENSORD_STATE_UNLINKED && !t->replaces && !t->hnext);
	struct tensor **b = bucket_of(reg, t->name, t->name_len);

	t->hnext = *b;
	*b = t;
	reg->n_named++;
	RB_INSERT(tensor_names, &reg->names, t);
}

/* Charges t to dev and puts it on the list of live tensors. */
void reg_tensor_link(struct registry *reg, struct reg_device *dev, struct tensor *t)
{
	t->id = reg->next_id++;
	t->dev = dev;
	dev->used += t->alloc.footprint;
	dev->tensors++;
	LIST_INSERT_HEAD(&reg->all, t, all_link);
	reg->n_tensors++;
	reg_figures(reg, t, 0, t->state, (int64_t)t->alloc.footprint);
}

bool registry_mode_allows(uint32_t owner_uid, uint32_t owner_gid, uint32_t mode, uint32_t uid,
			  uint32_t gid, uint32_t perm)
{
	if (uid == 0)
		return true;
	if (uid == owner_uid)
		return mode & (perm << 6);
	if (gid == owner_gid)
		return mode & (perm << 3);
	return mode & perm;
}

bool registry_may_hear(uint32_t owner_uid, uint32_t owner_gid, uint32_t mode,
		       const struct reg_client *rc)
{
	return registry_mode_allows(owner_uid, owner_gid, mode, rc->uid, rc->gid, PERM_READ);
}

static bool mode_allows(const struct tensor *t, const struct reg_client *rc, uint32_t perm)
{
	return registry_mode_allows(t->owner_uid, t->owner_gid, t->mode, rc->uid, rc->gid, perm);
}

bool registry_may_read(const struct tensor *t, const struct reg_client *rc)
{
	return mode_allows(t, rc, PERM_READ);
}

bool reg_may_unlink(const struct tensor *t, const struct reg_client *rc)
{
	return rc->uid == 0 || rc->uid == t->owner_uid || mode_allows(t, rc, PERM_WRITE);
}

bool reg_visible_to(const struct tensor *t, const struct reg_client *rc)
{
	return t->state == TENSORD_STATE_PUBLISHED || t->creator == rc;
}

bool registry_may_inspect(const struct tensor *t, const struct reg_client *rc)
{
	if (rc->uid == 0 || rc->uid == t->owner_uid)
		return true;
	return t->state != TENSORD_STATE_CREATED && mode_allows(t, rc, PERM_READ);
}

/* What list and stat show: a name, shape and owner tell a lot, so only to
 * who may read the tensor (--show-all-metadata: every published one). */
static bool may_see(const struct registry *reg, const struct tensor *t, const struct reg_client *rc)
{
	if (!reg_visible_to(t, rc))
		return false;
	return reg->show_all_metadata || t->creator == rc || rc->uid == t->owner_uid ||
	       mode_allows(t, rc, PERM_READ);
}

struct tensor *registry_lookup(struct registry *reg, struct reg_client *rc, const char *name,
			       size_t len)
{
	struct tensor *t = reg_find_named(reg, name, len);

	return t && may_see(reg, t, rc) ? t : NULL;
}

uint64_t registry_generation(struct registry *reg, const char *name, size_t len)
{
	struct tensor *t = reg_find_named(reg, name, len);

	return t && t->state == TENSORD_STATE_PUBLISHED ? t->generation : 0;
}

bool registry_published(struct registry *reg, const char *name, size_t len)
{
	struct tensor *t = reg_find_named(reg, name, len);

	return t && t->state == TENSORD_STATE_PUBLISHED;
}

/*
 * A small immutable tensor made with create moves into its owner's slab at
 * publish, so that from now on it holds no descriptor of its own in the
 * daemon (docs/design.md, "Slabs"). Best effort: without room there it
 * keeps its sealed memfd, which serves just as well.
 */
static void move_to_slab(struct registry *reg, struct tensor *t)
{
	const struct backend_ops *ops = t->alloc.ops;
	uint64_t was = t->alloc.footprint, now;
	int r;

	if (!ops->share || t->alloc.share_id || !t->nbytes || t->nbytes > ops->shared_max ||
	    (t->flags & TENSORD_MUTABLE))
		return;
	r = ops->share(&t->alloc, t->owner_uid, t->owner_gid, t->mode);
	if (r < 0) {
		log_debug("tensor '%s': keeps its own memfd: %s", t->name, tensord_strerror(r));
		return;
	}
	/* A slot takes less than whole pages: device and owner count the slot. */
	now = t->alloc.footprint;
	if (now < was && t->dev) {
		reg_figures(reg, t, t->state, t->state, -(int64_t)(was - now));
		t->dev->used -= was - now;
	}
	if (reg->quota && now < t->bytes_charged) {
		quota_uncharge(reg->quota, t->owner_uid, QUOTA_BYTES, t->bytes_charged - now);
		t->bytes_charged = now;
	}
	/* It no longer holds a descriptor against its owner's share. */
	if (reg->quota && t->fd_charged)
		quota_uncharge(reg->quota, t->owner_uid, QUOTA_FDS, 1);
	t->fd_charged = false;
}

int reg_publish_ready(struct registry *reg, struct tensor *t, char *why, size_t why_len)
{
	int r;

	if (t->allocating) {
		snprintf(why, why_len,
			 "tensor '%s': its memory is still being allocated; publish after create "
			 "answered",
			 t->name);
		return -EBUSY;
	}
	if (t->flags & TENSORD_MUTABLE)
		return 0;
	r = t->alloc.ops->freeze(&t->alloc);
	if (r < 0) {
		snprintf(why, why_len,
			 "tensor '%s': cannot make it immutable: %s (a writable shared "
			 "mapping of it still exists, e.g. in a forked child, or its pages "
			 "stayed pinned, e.g. by I/O, through %d tries of about 150 ms)",
			 t->name, tensord_strerror(r), HOST_SEAL_TRIES);
		return r;
	}
	move_to_slab(reg, t);
	return 0;
}

void reg_publish_now(struct registry *reg, struct tensor *t)
{
	uint64_t replaced_gen = 0;
	struct tensor *retired = NULL;

	assert(t->state == TENSORD_STATE_CREATED && !t->allocating && !t->tx);
	if (t->replaces) {
		/* The swap: from this step on the name is the new version's. */
		struct tensor *old = t->replaces;

		assert(old->draft == t && old->state == TENSORD_STATE_PUBLISHED);
		log_debug("tensor '%s': replaced, %u leases live on", old->name, old->refcount);
		old->draft = NULL;
		t->replaces = NULL;
		replaced_gen = old->generation;
		/* Leased, it lives on past the unlink: the step says so. */
		retired = old->refcount ? old : NULL;
		reg_tensor_unlink(reg, old);
		reg_tensor_name(reg, t);
		figure_count(FIG_replaces_total, 1);
	}
	reg_figures(reg, t, t->state, TENSORD_STATE_PUBLISHED, 0);
	t->state = TENSORD_STATE_PUBLISHED;
	reg_step_published(reg, t, replaced_gen, retired);
	log_debug("tensor '%s': published, generation %llu, commit %llu", t->name,
		  (unsigned long long)t->generation, (unsigned long long)t->commit);
}

int registry_publish(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		     struct tensor **ret_t, char *why, size_t why_len)
{
	struct tensor *t;
	int r;

	assert(len > 0 && len <= TENSORD_NAME_MAX);
	t = reg_view(reg, rc, name, len);
	if (!t || !reg_visible_to(t, rc)) {
		snprintf(why, why_len, "tensor '%.*s': no such tensor", (int)len, name);
		return -ENOENT;
	}
	if (t->state == TENSORD_STATE_PUBLISHED) {
		snprintf(why, why_len, "tensor '%s': already published", t->name);
		return t->creator == rc ? -EINVAL : -EPERM;
	}
	if (t->creator != rc) {
		snprintf(why, why_len, "tensor '%s': only its creator may publish it", t->name);
		return -EPERM;
	}
	if (t->tx) {
		snprintf(why, why_len,
			 "tensor '%s': a member of transaction %u, published by its commit",
			 t->name, reg_tx_id(t->tx));
		return -EBUSY;
	}
	if (reg_step_reserve(reg, 1) < 0) {
		snprintf(why, why_len, "tensor '%s': out of memory", t->name);
		return -ENOMEM;
	}
	r = reg_publish_ready(reg, t, why, why_len);
	if (r < 0)
		return r;
	reg_publish_now(reg, t);
	if (ret_t)
		*ret_t = t;
	reg_step_end(reg);
	return 0;
}

int registry_attach(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		    struct tensor **ret_t, uint64_t *ret_lease, bool *ret_writable, char *why,
		    size_t why_len)
{
	struct tensor *t;
	int r;

	assert(len > 0 && len <= TENSORD_NAME_MAX);
	t = reg_find_named(reg, name, len);
	if (!t || t->state != TENSORD_STATE_PUBLISHED) {
		snprintf(why, why_len, "tensor '%.*s': no such tensor%s", (int)len, name,
			 t && t->creator == rc ? " (created but not yet published)" : "");
		return -ENOENT;
	}
	if (!mode_allows(t, rc, PERM_READ)) {
		snprintf(why, why_len, "tensor '%s': mode %03o refuses uid %u", t->name, t->mode,
			 rc->uid);
		return -EACCES;
	}
	/* A uid that keeps too many unlinked versions alive attaches no more. */
	if (reg->quota) {
		char reason[200];

		r = quota_charge(reg->quota, rc->uid, QUOTA_PINNED, 0, reason, sizeof(reason));
		if (r < 0) {
			snprintf(why, why_len, "tensor '%s': %s: release old versions first",
				 t->name, reason);
			return r;
		}
	}
	r = reg_lease_add(reg, rc, t, ret_lease);
	if (r < 0) {
		snprintf(why, why_len, "tensor '%s': client holds too many leases (%u)", t->name,
			 rc->n_leases);
		return r;
	}
	*ret_writable = (t->flags & TENSORD_MUTABLE) && mode_allows(t, rc, PERM_WRITE);
	*ret_t = t;
	return 0;
}

int registry_unlink(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		    char *why, size_t why_len)
{
	struct tensor *t;

	assert(len > 0 && len <= TENSORD_NAME_MAX);
	t = reg_view(reg, rc, name, len);
	if (!t || !reg_visible_to(t, rc)) {
		snprintf(why, why_len, "tensor '%.*s': no such tensor", (int)len, name);
		return -ENOENT;
	}
	if (!reg_may_unlink(t, rc)) {
		snprintf(why, why_len, "tensor '%s': owned by uid %u, mode %03o refuses uid %u",
			 t->name, t->owner_uid, t->mode, rc->uid);
		return -EPERM;
	}
	if (t->tx) {
		snprintf(why, why_len,
			 "tensor '%s': a member of transaction %u; abort it to discard the member",
			 t->name, reg_tx_id(t->tx));
		return -EBUSY;
	}
	if (t->state == TENSORD_STATE_PUBLISHED && reg_step_reserve(reg, 1) < 0) {
		snprintf(why, why_len, "tensor '%s': out of memory", t->name);
		return -ENOMEM;
	}
	log_debug("tensor '%s': unlinked by pid %u, %u leases live", t->name, rc->pid, t->refcount);
	if (t->state == TENSORD_STATE_PUBLISHED)
		reg_step_unlinked(reg, t);
	reg_tensor_unlink(reg, t);
	reg_step_end(reg);
	return 0;
}

/* The first named tensor whose name sorts after `after` and not before prefix. */
static struct tensor *list_start(struct registry *reg, const char *prefix, size_t len,
				 const char *after)
{
	char key_name[TENSORD_NAME_MAX + 2];
	struct tensor key, *t;
	bool from_prefix = strncmp(after, prefix, len) < 0;

	if (from_prefix) {
		/* Every name with the prefix sorts at or after the prefix itself. */
		snprintf(key_name, sizeof(key_name), "%.*s",
			 (int)(len <= TENSORD_NAME_MAX ? len : TENSORD_NAME_MAX + 1), prefix);
		key.name = key_name;
	} else {
		key.name = (char *)after;
	}
	t = RB_NFIND(tensor_names, &reg->names, &key);
	if (t && !from_prefix && strcmp(t->name, after) == 0)
		t = RB_NEXT(tensor_names, &reg->names, t);
	return t;
}

void registry_list(struct registry *reg, struct reg_client *rc, const char *prefix, size_t len,
		   const char *after, size_t limit, struct tensor **ret, size_t *ret_n,
		   const char **ret_next)
{
	struct tensor *t = list_start(reg, prefix, len, after), *last = NULL;
	size_t n = 0, visited = 0;

	/* In name order from where the last page ended: O(log names + page). */
	for (; t; t = RB_NEXT(tensor_names, &reg->names, t)) {
		if (t->name_len < len || memcmp(t->name, prefix, len) != 0) {
			t = NULL; /* past the prefix: the end */
			break;
		}
		if (n == limit || visited == REGISTRY_LIST_SCAN_MAX)
			break;
		visited++;
		last = t;
		if (may_see(reg, t, rc))
			ret[n++] = t;
	}
	*ret_n = n;
	*ret_next = t && last ? last->name : NULL;
}

void registry_each_published(struct registry *reg, void (*fn)(void *arg, struct tensor *t),
			     void *arg)
{
	struct tensor *t;

	RB_FOREACH(t, tensor_names, &reg->names)
	if (t->state == TENSORD_STATE_PUBLISHED && t->generation)
		fn(arg, t);
}

void registry_each_retired(struct registry *reg, void (*fn)(void *arg, struct tensor *t), void *arg)
{
	struct tensor *t;

	LIST_FOREACH(t, &reg->all, all_link)
	if (t->retired_logged)
		fn(arg, t);
}
