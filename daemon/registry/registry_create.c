/*
 * The table's creation half (registry_create.c): the checks a create must
 * pass, the per-uid charges, the memory, and the asynchronous completion of
 * GPU creates (registry.h, struct reg_alloc_job).
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/desc.h"
#include "daemon/base/log.h"
#include "registry.h"
#include "registry_int.h"

/*
 * Whether rc may replace old: it owns it (or is root), old is no one else's
 * unpublished tensor, and no one else is replacing it.
 */
static int replace_check(const struct tensor *old, const struct reg_client *rc, char *why,
			 size_t why_len)
{
	if (!reg_visible_to(old, rc)) {
		snprintf(why, why_len,
			 "tensor '%s': already exists, being created by another client", old->name);
		return -EEXIST;
	}
	if (rc->uid != 0 && rc->uid != old->owner_uid) {
		snprintf(why, why_len,
			 "tensor '%s': owned by uid %u; only its owner may replace it", old->name,
			 old->owner_uid);
		return -EPERM;
	}
	if (old->draft && old->draft->creator != rc) {
		snprintf(why, why_len,
			 "tensor '%s': another client is replacing it (its new version is not "
			 "published yet)",
			 old->name);
		return -EEXIST;
	}
	return 0;
}

/* What create can refuse before it allocates anything. */
static int create_check(struct registry *reg, const struct reg_client *rc,
			const struct create_args *a, char *why, size_t why_len)
{
	const struct tensor *old;

	/* The registry's one name check, where a name enters the table: dispatch
	 * has checked every name from a peer already, but the table's invariant
	 * (every name in it is valid) does not rest on that. */
	size_t peer_len;
	int r = a->replica ? td_remote_name_check(a->name, a->name_len, &peer_len, why, why_len)
			   : td_name_check(a->name, a->name_len, why, why_len);

	if (r < 0)
		return r;
	old = reg_find_named(reg, a->name, a->name_len);
	if (old && (old->tx || (old->draft && old->draft->creator == rc && old->draft->tx))) {
		snprintf(why, why_len, "tensor '%s': a new version is a member of transaction %u",
			 old->name, reg_tx_id(old->tx ? old->tx : old->draft->tx));
		return -EEXIST;
	}
	if (old && a->replace) {
		r = replace_check(old, rc, why, why_len);
		if (r < 0)
			return r;
	} else if (old) {
		snprintf(why, why_len, "tensor '%.*s': already exists", (int)a->name_len, a->name);
		return -EEXIST;
	}
	if (a->mode & ~0777u) {
		snprintf(why, why_len, "tensor '%.*s': mode %o has bits outside 0777",
			 (int)a->name_len, a->name, a->mode);
		return -EINVAL;
	}
	if (a->flags & ~(uint32_t)(TENSORD_MUTABLE | TENSORD_LIFETIME_CONNECTION)) {
		snprintf(why, why_len, "tensor '%.*s': unknown flags 0x%x", (int)a->name_len,
			 a->name, a->flags);
		return -EINVAL;
	}
	return 0;
}

/* The device slot a's tensor of nbytes goes to, if it serves it and has room. */
static int create_device(struct registry *reg, const struct create_args *a, uint64_t nbytes,
			 struct reg_device **ret_dev, char *why, size_t why_len)
{
	struct reg_device *dev = registry_device(reg, a->device);

	if (!dev || dev->init_rc < 0) {
		char dn[32];

		tensord_device_name(a->device, dn, sizeof(dn));
		snprintf(why, why_len, "tensor '%.*s': no backend for device %s: %s",
			 (int)a->name_len, a->name, dn,
			 dev ? dev->why : "the daemon serves no such device");
		return -ENODEV;
	}
	if (nbytes > dev->capacity - dev->used) {
		snprintf(why, why_len,
			 "tensor '%.*s': needs %llu bytes, only %llu of %llu are free on %s",
			 (int)a->name_len, a->name, (unsigned long long)nbytes,
			 (unsigned long long)(dev->capacity - dev->used),
			 (unsigned long long)dev->capacity, dev->ops->name);
		return -ENOSPC;
	}
	*ret_dev = dev;
	return 0;
}

/* Whether t goes into a shared slab (no descriptor of its own). */
static bool goes_to_slab(const struct backend_ops *ops, bool shared, uint64_t nbytes)
{
	return shared && ops->alloc_shared && nbytes && nbytes <= ops->shared_max;
}

/*
 * Counts t against its owner's shares of tensors, bytes and (when it will
 * hold a descriptor of its own) descriptors, and checks that such a
 * descriptor is not one of the reserve. 0, -EDQUOT or -ENOSPC with the
 * reason; nothing is counted on failure.
 */
static int create_charge(struct registry *reg, struct reg_device *dev, struct tensor *t,
			 bool shared, char *why, size_t why_len)
{
	static const enum quota_kind kinds[] = { QUOTA_TENSORS, QUOTA_BYTES, QUOTA_FDS };
	uint64_t amount[] = { 1, t->nbytes, 1 };
	size_t n = t->nbytes && !goes_to_slab(dev->ops, shared, t->nbytes) ? 3 : 2;
	char reason[200];
	int r = 0;

	if (!reg->quota)
		return 0;
	if (n == 3 && !quota_fd_room(reg->quota, t->owner_uid)) {
		snprintf(why, why_len,
			 "tensor '%s': the daemon's descriptors are all in use but the %u "
			 "it keeps "
			 "for root (RLIMIT_NOFILE %u)",
			 t->name, reg->quota->lim.fd_reserve, reg->quota->lim.fd_budget);
		return -ENOSPC;
	}
	for (size_t i = 0; i < n && r == 0; i++) {
		r = quota_charge(reg->quota, t->owner_uid, kinds[i], amount[i], reason,
				 sizeof(reason));
		for (size_t j = i; r < 0 && j-- > 0;)
			quota_uncharge(reg->quota, t->owner_uid, kinds[j], amount[j]);
	}
	if (r < 0) {
		snprintf(why, why_len, "tensor '%s': %s", t->name, reason);
		return r;
	}
	t->fd_charged = n == 3;
	t->bytes_charged = t->nbytes;
	return 0;
}

void reg_create_uncharge(struct registry *reg, const struct tensor *t)
{
	if (!reg->quota)
		return;
	quota_uncharge(reg->quota, t->owner_uid, QUOTA_TENSORS, 1);
	quota_uncharge(reg->quota, t->owner_uid, QUOTA_BYTES, t->bytes_charged);
	if (t->fd_charged)
		quota_uncharge(reg->quota, t->owner_uid, QUOTA_FDS, 1);
}

static void tensor_fill(struct tensor *t, const struct create_args *a, struct reg_client *rc,
			uint64_t nbytes)
{
	struct timespec ts;

	memcpy(t->name, a->name, a->name_len);
	t->name[a->name_len] = '\0';
	t->name_len = a->name_len;
	t->dtype = a->dtype;
	t->ndim = a->ndim;
	if (a->ndim)
		memcpy(t->shape, a->shape, (size_t)a->ndim * sizeof(int64_t));
	t->device = a->device;
	t->nbytes = nbytes;
	t->state = TENSORD_STATE_CREATED;
	t->flags = a->flags;
	t->mode = a->mode ? a->mode : 0600;
	t->owner_uid = rc->uid;
	t->owner_gid = rc->gid;
	clock_gettime(CLOCK_REALTIME, &ts);
	t->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * Checks what alloc() or alloc_shared() answered (r) for t's memory *a on
 * dev, where `counted` bytes of dev are charged for t already, and charges
 * its owner's byte share with what it takes (its footprint: a slab slot,
 * whole pages, a GPU's rounding) rather than what was asked. On failure
 * releases *a and writes the reason.
 */
static int alloc_result(struct registry *reg, struct reg_device *dev, struct tensor *t,
			struct backend_alloc *a, int r, uint64_t counted, char *why, size_t why_len)
{
	char reason[200];

	a->ops = dev->ops;
	if (r == -EMFILE || r == -ENFILE) {
		/* Out of descriptors is the daemon's capacity, not the client's
		 * file table: never answer EMFILE. */
		snprintf(why, why_len, "tensor '%s': the daemon has no descriptor left for it (%s)",
			 t->name, r == -EMFILE ? "RLIMIT_NOFILE" : "the system's file table");
		r = -ENOSPC;
	} else if (r < 0) {
		snprintf(why, why_len, "tensor '%s': allocating %llu bytes on %s failed: %s",
			 t->name, (unsigned long long)t->nbytes, dev->ops->name,
			 tensord_strerror(r));
	} else if (a->footprint > dev->capacity - dev->used + counted) {
		/* Rounding to the backend's granularity pushed it over. */
		snprintf(why, why_len,
			 "tensor '%s': needs %llu bytes after rounding, only %llu free", t->name,
			 (unsigned long long)a->footprint,
			 (unsigned long long)(dev->capacity - dev->used + counted));
		r = -ENOSPC;
	} else if (reg->quota && a->footprint > t->bytes_charged) {
		r = quota_charge(reg->quota, t->owner_uid, QUOTA_BYTES,
				 a->footprint - t->bytes_charged, reason, sizeof(reason));
		if (r < 0)
			snprintf(why, why_len, "tensor '%s': takes %llu bytes: %s", t->name,
				 (unsigned long long)a->footprint, reason);
		else
			t->bytes_charged = a->footprint;
	}
	if (r < 0)
		dev->ops->release(a);
	return r;
}

/*
 * Whether t's memory may be reserve res (NULL: none): the same device, a
 * memfd of its own, and a size that leaves at most an ninth of it unused.
 */
static bool fits_reserve(const struct reg_reserve *res, const struct reg_device *dev,
			 const struct tensor *t, bool shared)
{
	return res && res->alloc.fd >= 0 && res->dev == dev && dev->ops->adopt &&
	       !goes_to_slab(dev->ops, shared, t->nbytes) && t->nbytes <= res->alloc.size &&
	       t->nbytes > res->alloc.size - res->alloc.size / 9;
}

/*
 * Whether a tensor of a create that asks to recycle (docs/recycle.md) may
 * live in a ring buffer: host memory with a memfd of its own (the backend
 * keeps reserves), larger than a slab slot, immutable.
 */
static bool may_recycle(const struct registry *reg, const struct reg_device *dev, bool recycle,
			bool shared, uint32_t flags, uint64_t nbytes)
{
	return recycle && reg->recycle && dev->ops->adopt && !dev->ops->alloc_blocks && !shared &&
	       !(flags & TENSORD_MUTABLE) && nbytes > dev->ops->shared_max;
}

/*
 * Whether a GPU tensor of create a may live in a ring buffer of its own
 * (docs/recycle.md, section 4): a create that asks to recycle and no set
 * allocation (a set's arena recycles whole, registry_arena.c), memory of a
 * backend whose alloc() blocks, immutable, not empty. Only CUDA VMM memory
 * is kept when freed (registry_ring.c); other GPU memory asked for so is
 * freed as before.
 */
static bool gpu_ring_version(const struct registry *reg, const struct reg_device *dev,
			     const struct create_args *a, uint32_t flags, uint64_t nbytes)
{
	return a->recycle && reg->recycle && !a->arena_size && !a->in_arena &&
	       dev->ops->alloc_blocks && !a->shared && !(flags & TENSORD_MUTABLE) && nbytes &&
	       !goes_to_slab(dev->ops, a->shared, nbytes);
}

/*
 * Whether a's tensor finds a free buffer in rc's ring, taking nothing:
 * then the reserve it names stays rc's for a later create.
 */
static bool ring_ready(struct registry *reg, const struct reg_client *rc,
		       const struct create_args *a)
{
	int64_t strides[TENSORD_NDIM_MAX];
	struct reg_device *dev;
	uint64_t nbytes;
	char reason[200];

	if (!a->recycle || !reg->recycle || a->ndim < 0 || a->ndim > TENSORD_NDIM_MAX ||
	    td_layout(a->dtype, a->ndim, a->shape, a->strides, strides, &nbytes, reason,
		      sizeof(reason)) < 0)
		return false;
	dev = registry_device(reg, a->device);
	return dev && may_recycle(reg, dev, a->recycle, a->shared, a->flags, nbytes) &&
	       reg_ring_has(rc, dev, nbytes, rc->gid, a->mode ? a->mode : 0600);
}

/*
 * Room in a set allocation (registry_arena.c) for a's tensor of nbytes, a
 * member of tx: the bytes lent by tx's arena, which a's create opens first
 * when it asks (Create.arena_size); 0: none (no arena could be opened, or
 * the tensor does not fit the open one), and its memory comes as without.
 * On a GPU the arena opened is still to be made: by this create, on the
 * worker (reg_arena_lent_pending()).
 */
static uint64_t arena_lend(struct registry *reg, struct reg_client *rc, const struct create_args *a,
			   struct reg_tx *tx, uint64_t nbytes)
{
	struct reg_device *dev = registry_device(reg, a->device);
	uint32_t mode = a->mode ? a->mode : 0600;
	bool gpu = dev && dev->ops->alloc_blocks;
	char reason[200];
	int r;

	/* Host: a ring buffer; GPU: one allocation of a backend that has arenas. */
	if (!tx || !dev || dev->init_rc < 0 || !(a->arena_size || a->in_arena) ||
	    !(gpu ? dev->ops->arenas && !(a->flags & TENSORD_MUTABLE) && nbytes
		  : may_recycle(reg, dev, a->recycle, a->shared, a->flags, nbytes)))
		return 0;
	if (a->arena_size) {
		if (a->arena_size < nbytes || a->arena_size > REGISTRY_ARENA_BYTES_MAX) {
			reg_tx_set_arena(reg, tx, gpu, NULL);
			return 0;
		}
		r = reg_arena_open(reg, rc, tx, dev, a->arena_size, rc->gid, mode, a->recycle,
				   reason, sizeof(reason));
		if (r < 0) {
			log_debug("tensor '%.*s': no set allocation: %s", (int)a->name_len, a->name,
				  reason);
			return 0;
		}
	}
	return reg_arena_lend(reg, tx, dev, rc->gid, mode, a->flags, nbytes);
}

/*
 * Gets t its memory on dev (a free buffer of rc's ring when a asks to
 * recycle and one fits; else reserve res's when it fits, which it then
 * takes over), and room for its name in the table. A recycled tensor's
 * memory is a buffer of rc's ring from then on. A GPU tensor comes here
 * only when its memory needs no worker: a member of tx's set allocation,
 * or a version into a free buffer of rc's ring (create_one() found one).
 * On failure releases what it got; the caller frees t.
 */
static int tensor_alloc(struct registry *reg, struct reg_client *rc, const struct create_args *a,
			struct reg_tx *tx, uint64_t lent, struct reg_device *dev, struct tensor *t,
			struct reg_reserve *res, char *why, size_t why_len)
{
	const struct backend_ops *ops = dev->ops;
	bool recycle = may_recycle(reg, dev, a->recycle, a->shared, t->flags, t->nbytes);
	bool gpu_ring = !lent && gpu_ring_version(reg, dev, a, t->flags, t->nbytes);
	struct reg_reserve *ring = NULL;
	uint64_t ring_id = 0;
	int r;

	if (lent) {
		/* A member of tx's set allocation. */
		reg_arena_place(tx, t);
		t->alloc.ops = dev->ops;
		r = reg_name_room(reg, t, why, why_len);
		if (r < 0)
			reg_arena_member_gone(reg, t);
		return r;
	}
	if (recycle || gpu_ring)
		ring = reg_ring_take(reg, rc, dev, t->nbytes, t->owner_gid, t->mode);
	if (gpu_ring && !ring) {
		snprintf(why, why_len, "tensor '%s': its ring buffer went meanwhile", t->name);
		return -EAGAIN;
	}
	if (goes_to_slab(ops, a->shared, t->nbytes)) {
		r = ops->alloc_shared(&t->alloc, t->nbytes, t->owner_uid, t->owner_gid, t->mode);
	} else if (ring) {
		/* Host: sealed against growing and shrinking when it was first
		 * made. GPU: memory its writer imported and maps already, an
		 * older version's bytes in it; nothing for the worker to do. */
		t->alloc = ring->alloc;
		ring_id = ring->id;
		t->ring_hit = !gpu_ring; /* a GPU lease always carries the export */
		free(ring);
		r = 0;
	} else if (fits_reserve(res, dev, t, a->shared)) {
		r = ops->adopt(&t->alloc, &res->alloc, t->nbytes);
		t->from_reserve = r == 0;
		ring_id = a->reserve;
	} else {
		r = ops->alloc(&t->alloc, t->nbytes, dev->device.device_id, t->name);
		ring_id = recycle ? ++rc->next_reserve : 0;
	}
	/* On failure alloc_result() released it. */
	r = alloc_result(reg, dev, t, &t->alloc, r, 0, why, why_len);
	if (r < 0)
		return r;
	r = reg_name_room(reg, t, why, why_len);
	if (r < 0) {
		dev->ops->release(&t->alloc);
		return r;
	}
	if (recycle) {
		t->alloc.recycled = true;
		/* Readers name the buffer across its versions (Lease.share_id). */
		if (!t->alloc.share_id)
			t->alloc.share_id = REG_RING_SHARE | ++reg->next_ring_share;
	}
	if (recycle || gpu_ring)
		reg_ring_link(rc, t, ring_id);
	return 0;
}

/*
 * Gives t, a new tensor of a replacing create (its check allowed it), its
 * place: the draft of the published version of its name, which serves
 * until t is published (a draft rc had of it before goes); or, over rc's
 * own unpublished tensor or no tensor at all, the name itself.
 */
static void replace_place(struct registry *reg, const struct reg_client *rc, struct tensor *t)
{
	struct tensor *old = reg_find_named(reg, t->name, t->name_len);

	if (old && old->state == TENSORD_STATE_PUBLISHED) {
		if (old->draft)
			reg_tensor_unlink(reg, old->draft);
		old->draft = t;
		t->replaces = old;
		log_debug("tensor '%s': pid %u makes a new version; the old one serves until "
			  "it is published",
			  t->name, rc->pid);
		return;
	}
	if (old)
		reg_tensor_unlink(reg, old);
	reg_tensor_name(reg, t);
}

/*
 * The first half of a create whose memory the GPU worker allocates
 * (registry.h, struct reg_alloc_job): t is charged, linked and (unless it
 * replaces a tensor of its name) named, and pinned without a lease.
 */
static int create_begin(struct registry *reg, struct reg_client *rc, const struct create_args *a,
			struct reg_tx *tx, struct reg_device *dev, struct tensor *t,
			struct tensor **ret_t, char *why, size_t why_len)
{
	int r = reg_name_room(reg, t, why, why_len);

	if (r < 0) {
		/* The first member of a GPU set: the set's allocation, still to be
		 * made, forgets it (the next member may make it instead). */
		if (t->arena)
			reg_arena_member_gone(reg, t);
		reg_create_uncharge(reg, t);
		free(t);
		return r;
	}
	t->allocating = true;
	t->refcount = 1;
	/* What dev->used counts for it until the rounded size is known. */
	t->alloc.size = t->nbytes;
	t->alloc.footprint = t->nbytes;
	t->alloc.device_id = dev->device.device_id;
	reg_creator_link(rc, t);
	reg_tensor_link(reg, dev, t);
	/* A published tensor it replaces keeps the name, and serves, until t's publish. */
	if (a->replace)
		replace_place(reg, rc, t);
	else
		reg_tensor_name(reg, t);
	if (tx)
		reg_tx_add(tx, t);
	rc->n_created++;
	log_debug("tensor '%s': allocating %llu bytes on %s %d off the loop", t->name,
		  (unsigned long long)t->nbytes, dev->ops->name, dev->device.device_id);
	*ret_t = t;
	return -EINPROGRESS;
}

void registry_alloc_run(struct reg_alloc_job *j)
{
	const struct tensor *t = j->t;

	memset(&j->got, 0, sizeof(j->got));
	j->got.fd = -1;
	/* The first member of a GPU set makes the set's allocation (registry_arena.c). */
	j->rc = t->dev->ops->alloc(&j->got, reg_arena_alloc_size(t), t->device.device_id,
				   t->arena ? "tensord-arena" : t->name);
}

/*
 * t, a GPU create that asked to recycle, got new memory: it becomes a
 * buffer of its creator's ring, named across versions by a share id of its
 * own (REG_GPU_RING_SHARE: readers keep their import of it parked between
 * versions). Memory the ring cannot keep (legacy IPC) stays t's alone.
 */
static void gpu_ring_join(struct registry *reg, struct tensor *t)
{
	if (!t->gpu_ring || !t->creator ||
	    t->alloc.handle_kind != TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD)
		return;
	t->alloc.share_id = REG_RING_SHARE | REG_GPU_RING_SHARE | ++reg->next_ring_share;
	reg_ring_link(t->creator, t, ++t->creator->next_reserve);
}

/* Why a finished allocation can no longer become t's, or 0. */
static int finish_check(const struct tensor *t, char *why, size_t why_len)
{
	if (!t->creator || t->state != TENSORD_STATE_CREATED) {
		snprintf(why, why_len, "tensor '%s': %s while its memory was being allocated",
			 t->name, t->creator ? "unlinked" : "its creator went away");
		return -ECANCELED;
	}
	return 0;
}

int registry_create_finish(struct registry *reg, struct reg_alloc_job *j, uint64_t *ret_lease,
			   char *why, size_t why_len)
{
	struct tensor *t = j->t;
	struct reg_device *dev = t->dev;
	int r;

	assert(t->allocating && t->refcount > 0);
	t->allocating = false;
	if (t->arena) {
		/* Its set's allocation: the arena's, t its first member. */
		r = reg_arena_allocated(reg, t, &j->got, j->rc, why, why_len);
		/* Made, but not for t: it stays the set's, freed with its last member. */
		if (r == 0)
			r = finish_check(t, why, why_len);
	} else {
		r = alloc_result(reg, dev, t, &j->got, j->rc, t->alloc.footprint, why, why_len);
		if (r == 0) {
			r = finish_check(t, why, why_len);
			if (r < 0)
				dev->ops->release(&j->got);
		}
		if (r == 0) {
			reg_figures(reg, t, t->state, t->state,
				    (int64_t)(j->got.footprint - t->alloc.footprint));
			dev->used += j->got.footprint - t->alloc.footprint;
			t->alloc = j->got;
			gpu_ring_join(reg, t);
		}
	}
	if (r == 0) {
		t->refcount--; /* the pin; the lease takes over */
		r = reg_lease_add(reg, t->creator, t, ret_lease);
		if (r < 0) {
			snprintf(why, why_len, "tensor '%s': client holds too many leases (%u)",
				 t->name, t->creator->n_leases);
			reg_tensor_unlink(reg, t);
		}
		return r;
	}
	/* Failed: t goes, with nothing of the allocation (alloc_result released it). */
	t->refcount--;
	reg_tensor_unlink(reg, t); /* a draft only lets go of what it replaced */
	return r;
}

static int create_one(struct registry *reg, struct reg_client *rc, const struct create_args *a,
		      struct reg_reserve *res, struct tensor **ret_t, uint64_t *ret_lease,
		      char *why, size_t why_len)
{
	struct reg_tx *tx = NULL;
	char reason[200];
	struct reg_device *dev;
	struct tensor *t;
	uint64_t nbytes, lent = 0;
	int r;

	r = create_check(reg, rc, a, why, why_len);
	if (r == 0 && a->tx)
		r = reg_tx_get(rc, a->tx, true, &tx, why, why_len);
	if (r < 0)
		return r;
	if (a->ndim < 0 || a->ndim > TENSORD_NDIM_MAX) {
		snprintf(why, why_len, "tensor '%.*s': %d dimensions; tensors have 0 to %d",
			 (int)a->name_len, a->name, (int)a->ndim, TENSORD_NDIM_MAX);
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t) + 2 * (size_t)a->ndim * sizeof(int64_t) + a->name_len + 1);
	if (!t) {
		snprintf(why, why_len, "tensor '%.*s': out of memory", (int)a->name_len, a->name);
		return -ENOMEM;
	}
	t->shape = t->dims;
	t->strides = t->dims + a->ndim;
	t->name = (char *)(t->dims + 2 * a->ndim);
	t->alloc.fd = -1;
	r = td_layout(a->dtype, a->ndim, a->shape, a->strides, t->strides, &nbytes, reason,
		      sizeof(reason));
	if (r < 0) {
		snprintf(why, why_len, "tensor '%.*s': %s", (int)a->name_len, a->name, reason);
	} else {
		/* A member of a set allocation: the room its arena holds for it. */
		lent = arena_lend(reg, rc, a, tx, nbytes);
		r = create_device(reg, a, nbytes, &dev, why, why_len);
	}
	if (r == 0) {
		tensor_fill(t, a, rc, nbytes);
		r = create_charge(reg, dev, t, a->shared, why, why_len);
	}
	if (r < 0) {
		reg_arena_unlend(reg, lent ? tx : NULL);
		free(t);
		return r;
	}
	if (lent && reg_arena_lent_pending(tx)) {
		/* The first member of a GPU set: its create makes the set's allocation. */
		reg_arena_place_pending(tx, t);
		return create_begin(reg, rc, a, tx, dev, t, ret_t, why, why_len);
	}
	if (!lent && dev->ops->alloc_blocks && nbytes &&
	    !goes_to_slab(dev->ops, a->shared, nbytes)) {
		bool ring = gpu_ring_version(reg, dev, a, t->flags, nbytes);

		/* A free buffer of rc's ring serves at once (tensor_alloc()); else
		 * the worker makes the memory, which then joins the ring. */
		if (!ring || !reg_ring_has(rc, dev, nbytes, t->owner_gid, t->mode)) {
			t->gpu_ring = ring;
			return create_begin(reg, rc, a, tx, dev, t, ret_t, why, why_len);
		}
	}
	r = tensor_alloc(reg, rc, a, tx, lent, dev, t, res, why, why_len);
	if (r < 0) {
		reg_create_uncharge(reg, t);
		free(t);
		return r;
	}
	reg_creator_link(rc, t);
	reg_tensor_link(reg, dev, t);
	if (a->replace)
		replace_place(reg, rc, t);
	else
		reg_tensor_name(reg, t);
	if (tx)
		reg_tx_add(tx, t);
	rc->n_created++;
	r = reg_lease_add(reg, rc, t, ret_lease);
	if (r < 0) {
		snprintf(why, why_len, "tensor '%s': client holds too many leases (%u)", t->name,
			 rc->n_leases);
		reg_tensor_unlink(reg, t);
		return r;
	}
	*ret_t = t;
	return 0;
}

int registry_create(struct registry *reg, struct reg_client *rc, const struct create_args *a,
		    struct tensor **ret_t, uint64_t *ret_lease, char *why, size_t why_len)
{
	/* The reserve a create names is consumed whatever happens: off rc's
	 * list and uncharged now, the tensor's memory or freed below. */
	struct reg_reserve *res =
		ring_ready(reg, rc, a) ? NULL : reg_reserve_take(reg, rc, a->reserve);
	int r = create_one(reg, rc, a, res, ret_t, ret_lease, why, why_len);

	/* A reserve never costs its own client a create: room it holds for
	 * later creates goes to this one. */
	if ((r == -EDQUOT || r == -ENOSPC) && reg_reserves_drop(reg, rc)) {
		log_debug("conn %llu: pid %u gave up its reserves to make room for a create",
			  (unsigned long long)rc->id, rc->pid);
		r = create_one(reg, rc, a, res, ret_t, ret_lease, why, why_len);
	}
	reg_reserve_free(reg, rc, res);
	return r;
}
