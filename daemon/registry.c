#include "registry.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/desc.h"
#include "common/hash.h"
#include "log.h"

#define PERM_READ 4u
#define PERM_WRITE 2u

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_names(const struct tensor *a, const struct tensor *b)
{
	return strcmp(a->name, b->name);
}

RB_GENERATE_STATIC(tensor_names, tensor, byname, cmp_names)

static struct tensor **bucket_of(struct registry *reg, const char *name, size_t len)
{
	return &reg->buckets[td_hash_name(name, len) & (reg->n_buckets - 1)];
}

static struct tensor *find_named(struct registry *reg, const char *name, size_t len)
{
	for (struct tensor *t = *bucket_of(reg, name, len); t; t = t->hnext)
		if (t->name_len == len && memcmp(t->name, name, len) == 0)
			return t;
	return NULL;
}

static int grow_buckets(struct registry *reg)
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
	reg->n_buckets = 64;
	reg->buckets = calloc(reg->n_buckets, sizeof(*reg->buckets));
	if (!reg->buckets)
		return -ENOMEM;
	reg->next_id = 1;

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

static void create_uncharge(struct registry *reg, const struct tensor *t);

/* t is on its creator's list while the creator lives. */
static void creator_link(struct reg_client *rc, struct tensor *t)
{
	t->creator = rc;
	t->cprev = NULL;
	t->cnext = rc->created;
	if (rc->created)
		rc->created->cprev = t;
	rc->created = t;
}

static void creator_unlink(struct tensor *t)
{
	struct reg_client *rc = t->creator;

	if (!rc)
		return;
	if (t->cprev)
		t->cprev->cnext = t->cnext;
	else
		rc->created = t->cnext;
	if (t->cnext)
		t->cnext->cprev = t->cprev;
	t->cprev = t->cnext = NULL;
	t->creator = NULL;
}

static void tensor_free(struct registry *reg, struct tensor *t)
{
	creator_unlink(t);
	create_uncharge(reg, t);
	if (t->prev)
		t->prev->next = t->next;
	else
		reg->all = t->next;
	if (t->next)
		t->next->prev = t->prev;
	if (t->dev) {
		t->dev->used -= t->alloc.size;
		t->dev->tensors--;
	}
	if (t->alloc.ops)
		t->alloc.ops->release(&t->alloc);
	reg->n_tensors--;
	log_debug("tensor '%s' (id %llu): freed", t->name, (unsigned long long)t->id);
	free(t);
}

void registry_fini(struct registry *reg)
{
	while (reg->all) {
		reg->all->creator = NULL; /* its client may be gone without client_gone() */
		tensor_free(reg, reg->all);
	}
	free(reg->buckets);
	reg->buckets = NULL;
	for (int b = 0; backends[b]; b++)
		if (backends[b]->fini)
			backends[b]->fini();
}

/* Removes the name; frees the tensor if no lease holds it. */
static void tensor_unlink(struct registry *reg, struct tensor *t)
{
	if (t->state != TENSORD_STATE_UNLINKED) {
		unhash(reg, t);
		t->state = TENSORD_STATE_UNLINKED;
	}
	if (t->refcount == 0)
		tensor_free(reg, t);
}

void registry_client_init(struct reg_client *rc, uint64_t id, uint32_t uid, uint32_t gid,
			  uint32_t pid)
{
	memset(rc, 0, sizeof(*rc));
	rc->id = id;
	rc->uid = uid;
	rc->gid = gid;
	rc->pid = pid;
}

static int lease_add(struct registry *reg, struct reg_client *rc, struct tensor *t,
		     uint64_t *ret_lease)
{
	uint32_t slot;

	if (rc->free_head) {
		slot = rc->free_head - 1;
		rc->free_head = rc->leases[slot].next_free;
	} else {
		if (rc->n_slots >= REGISTRY_LEASES_MAX)
			return -EAGAIN;
		if (rc->n_slots == rc->cap_slots) {
			uint32_t cap = rc->cap_slots ? rc->cap_slots * 2 : 16;
			struct reg_lease *nl = realloc(rc->leases, cap * sizeof(*nl));

			if (!nl)
				return -ENOMEM;
			rc->leases = nl;
			rc->cap_slots = cap;
		}
		slot = rc->n_slots++;
		rc->leases[slot].gen = 0;
	}
	rc->leases[slot].t = t;
	rc->leases[slot].gen++;
	rc->leases[slot].next_free = 0;
	rc->leases[slot].since_ns = mono_ns();
	rc->n_leases++;
	reg->n_leases++;
	t->refcount++;
	*ret_lease = (uint64_t)rc->leases[slot].gen << 32 | (slot + 1);
	return 0;
}

static void lease_drop_slot(struct registry *reg, struct reg_client *rc, uint32_t slot)
{
	struct tensor *t = rc->leases[slot].t;

	rc->leases[slot].t = NULL;
	rc->leases[slot].next_free = rc->free_head;
	rc->free_head = slot + 1;
	rc->n_leases--;
	reg->n_leases--;
	if (--t->refcount == 0 && t->state == TENSORD_STATE_UNLINKED)
		tensor_free(reg, t);
}

/* The slot of a live lease, or -1. */
static long lease_slot(const struct reg_client *rc, uint64_t lease)
{
	uint32_t slot = (uint32_t)lease - 1, gen = (uint32_t)(lease >> 32);

	if ((uint32_t)lease == 0 || slot >= rc->n_slots || !rc->leases[slot].t ||
	    rc->leases[slot].gen != gen)
		return -1;
	return slot;
}

struct tensor *registry_lease_tensor(struct reg_client *rc, uint64_t lease)
{
	long slot = lease_slot(rc, lease);

	return slot < 0 ? NULL : rc->leases[slot].t;
}

int registry_release(struct registry *reg, struct reg_client *rc, uint64_t lease)
{
	long slot = lease_slot(rc, lease);

	if (slot < 0)
		return -ESRCH;
	log_debug("tensor '%s': lease %llx released by pid %u", rc->leases[slot].t->name,
		  (unsigned long long)lease, rc->pid);
	lease_drop_slot(reg, rc, (uint32_t)slot);
	return 0;
}

void registry_client_gone(struct registry *reg, struct reg_client *rc)
{
	struct tensor *t;

	/* Names first: a tensor it created but never published, or created
	 * with connection lifetime, goes with it. Leases second, so the last
	 * one frees the memory. Only what rc created and leased is visited. */
	while ((t = rc->created)) {
		reg->visits++;
		creator_unlink(t);
		if (t->state == TENSORD_STATE_CREATED || (t->flags & TENSORD_LIFETIME_CONNECTION)) {
			log_debug("tensor '%s': unlinked with its creator's connection", t->name);
			/* Leases of this client still hold it; they are dropped below. */
			if (t->state != TENSORD_STATE_UNLINKED) {
				unhash(reg, t);
				t->state = TENSORD_STATE_UNLINKED;
			}
			/* A tensor with no lease left is freed by tensor_unlink(); one
			 * leased by others lives on until their last lease. */
			if (t->refcount == 0)
				tensor_free(reg, t);
		}
	}
	reg->visits += rc->n_slots;
	for (uint32_t s = 0; s < rc->n_slots; s++)
		if (rc->leases[s].t)
			lease_drop_slot(reg, rc, s);
	free(rc->leases);
	rc->leases = NULL;
	rc->n_slots = rc->cap_slots = rc->free_head = 0;
}

static bool mode_allows(const struct tensor *t, const struct reg_client *rc, uint32_t perm)
{
	if (rc->uid == 0)
		return true;
	if (rc->uid == t->owner_uid)
		return t->mode & (perm << 6);
	if (rc->gid == t->owner_gid)
		return t->mode & (perm << 3);
	return t->mode & perm;
}

static bool visible_to(const struct tensor *t, const struct reg_client *rc)
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
 * who may read the tensor (issue 10, item 12). */
static bool may_see(const struct registry *reg, const struct tensor *t, const struct reg_client *rc)
{
	if (!visible_to(t, rc))
		return false;
	return reg->show_all_metadata || t->creator == rc || rc->uid == t->owner_uid ||
	       mode_allows(t, rc, PERM_READ);
}

struct tensor *registry_lookup(struct registry *reg, struct reg_client *rc, const char *name,
			       size_t len)
{
	struct tensor *t = find_named(reg, name, len);

	return t && may_see(reg, t, rc) ? t : NULL;
}

bool registry_published(struct registry *reg, const char *name, size_t len)
{
	struct tensor *t = find_named(reg, name, len);

	return t && t->state == TENSORD_STATE_PUBLISHED;
}

/* Whether rc may replace old: it owns it (or is root), and old is no one else's draft. */
static int replace_check(const struct tensor *old, const struct reg_client *rc, char *why,
			 size_t why_len)
{
	if (!visible_to(old, rc)) {
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
	int r = td_name_check(a->name, a->name_len, why, why_len);

	if (r < 0)
		return r;
	old = find_named(reg, a->name, a->name_len);
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
	return 0;
}

static void create_uncharge(struct registry *reg, const struct tensor *t)
{
	if (!reg->quota)
		return;
	quota_uncharge(reg->quota, t->owner_uid, QUOTA_TENSORS, 1);
	quota_uncharge(reg->quota, t->owner_uid, QUOTA_BYTES, t->nbytes);
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
 * dev, where `counted` bytes of dev are charged for t already. On failure
 * releases *a and writes the reason.
 */
static int alloc_result(struct registry *reg, struct reg_device *dev, const struct tensor *t,
			struct backend_alloc *a, int r, uint64_t counted, char *why, size_t why_len)
{
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
	} else if (a->size > dev->capacity - dev->used + counted) {
		/* Rounding to the backend's granularity pushed it over. */
		snprintf(why, why_len,
			 "tensor '%s': needs %llu bytes after rounding, only %llu free", t->name,
			 (unsigned long long)a->size,
			 (unsigned long long)(dev->capacity - dev->used + counted));
		r = -ENOSPC;
	}
	if (r < 0)
		dev->ops->release(a);
	return r;
}

/* Room for one more name in the table. */
static int name_room(struct registry *reg, const struct tensor *t, char *why, size_t why_len)
{
	if (reg->n_named + 1 > reg->n_buckets && grow_buckets(reg) < 0) {
		snprintf(why, why_len, "tensor '%s': out of memory", t->name);
		return -ENOMEM;
	}
	return 0;
}

/*
 * Gets t its memory on dev, and room for its name in the table. On failure
 * releases what it got; the caller frees t.
 */
static int tensor_alloc(struct registry *reg, struct reg_device *dev, struct tensor *t, bool shared,
			char *why, size_t why_len)
{
	const struct backend_ops *ops = dev->ops;
	int r;

	if (goes_to_slab(ops, shared, t->nbytes))
		r = ops->alloc_shared(&t->alloc, t->nbytes, t->owner_uid, t->owner_gid, t->mode);
	else
		r = ops->alloc(&t->alloc, t->nbytes, dev->device.device_id, t->name);
	r = alloc_result(reg, dev, t, &t->alloc, r, 0, why, why_len);
	if (r < 0)
		return r;
	r = name_room(reg, t, why, why_len);
	if (r < 0)
		dev->ops->release(&t->alloc);
	return r;
}

/* Puts t in the name table (name_room() made room). */
static void tensor_name(struct registry *reg, struct tensor *t)
{
	struct tensor **b = bucket_of(reg, t->name, t->name_len);

	t->hnext = *b;
	*b = t;
	reg->n_named++;
	RB_INSERT(tensor_names, &reg->names, t);
}

/* Charges t to dev and puts it on the list of live tensors. */
static void tensor_link(struct registry *reg, struct reg_device *dev, struct tensor *t)
{
	t->id = reg->next_id++;
	t->dev = dev;
	dev->used += t->alloc.size;
	dev->tensors++;
	t->next = reg->all;
	if (reg->all)
		reg->all->prev = t;
	reg->all = t;
	reg->n_tensors++;
}

/* Unlinks the tensor a replaces, if there is one (create_check allowed it). */
static void replace_old(struct registry *reg, const struct reg_client *rc,
			const struct create_args *a)
{
	struct tensor *old = find_named(reg, a->name, a->name_len);

	if (!old)
		return;
	log_debug("tensor '%s': replaced by pid %u, %u leases live on", old->name, rc->pid,
		  old->refcount);
	tensor_unlink(reg, old);
}

/*
 * The first half of a create whose memory the GPU worker allocates
 * (registry.h, struct reg_alloc_job): t is charged, linked and (unless it
 * replaces a tensor of its name) named, and pinned without a lease.
 */
static int create_begin(struct registry *reg, struct reg_client *rc, const struct create_args *a,
			struct reg_device *dev, struct tensor *t, struct tensor **ret_t, char *why,
			size_t why_len)
{
	int r = name_room(reg, t, why, why_len);

	if (r < 0) {
		create_uncharge(reg, t);
		free(t);
		return r;
	}
	t->allocating = true;
	t->refcount = 1;
	/* What dev->used counts for it until the rounded size is known. */
	t->alloc.size = t->nbytes;
	t->alloc.device_id = dev->device.device_id;
	creator_link(rc, t);
	tensor_link(reg, dev, t);
	/* A tensor it replaces keeps the name, and serves, until the memory is there. */
	t->name_deferred = a->replace && find_named(reg, a->name, a->name_len);
	if (!t->name_deferred)
		tensor_name(reg, t);
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
	j->rc = t->dev->ops->alloc(&j->got, t->nbytes, t->device.device_id, t->name);
}

/* Why a finished allocation can no longer become t's, or 0. */
static int finish_check(struct registry *reg, struct tensor *t, char *why, size_t why_len)
{
	struct tensor *old;
	int r;

	if (!t->creator || t->state != TENSORD_STATE_CREATED) {
		snprintf(why, why_len, "tensor '%s': %s while its memory was being allocated",
			 t->name, t->creator ? "unlinked" : "its creator went away");
		return -ECANCELED;
	}
	if (!t->name_deferred)
		return 0;
	old = find_named(reg, t->name, t->name_len);
	if (old) {
		r = replace_check(old, t->creator, why, why_len);
		if (r < 0)
			return r;
	}
	return name_room(reg, t, why, why_len);
}

int registry_create_finish(struct registry *reg, struct reg_alloc_job *j, uint64_t *ret_lease,
			   char *why, size_t why_len)
{
	struct tensor *t = j->t;
	struct reg_device *dev = t->dev;
	int r;

	assert(t->allocating && t->refcount > 0);
	t->allocating = false;
	r = alloc_result(reg, dev, t, &j->got, j->rc, t->alloc.size, why, why_len);
	if (r == 0) {
		r = finish_check(reg, t, why, why_len);
		if (r < 0)
			dev->ops->release(&j->got);
	}
	if (r == 0 && t->name_deferred) {
		struct tensor *old = find_named(reg, t->name, t->name_len);

		if (old) {
			log_debug("tensor '%s': replaced by pid %u, %u leases live on", old->name,
				  t->creator->pid, old->refcount);
			tensor_unlink(reg, old);
		}
		tensor_name(reg, t);
		t->name_deferred = false;
	}
	if (r == 0) {
		dev->used += j->got.size - t->alloc.size;
		t->alloc = j->got;
		t->refcount--; /* the pin; the lease takes over */
		r = lease_add(reg, t->creator, t, ret_lease);
		if (r < 0) {
			snprintf(why, why_len, "tensor '%s': client holds too many leases (%u)",
				 t->name, t->creator->n_leases);
			tensor_unlink(reg, t);
		}
		return r;
	}
	/* Failed: t goes, with nothing of the allocation (alloc_result released it). */
	t->refcount--;
	tensor_unlink(reg, t); /* unhash() passes over a name it never took */
	return r;
}

int registry_create(struct registry *reg, struct reg_client *rc, const struct create_args *a,
		    struct tensor **ret_t, uint64_t *ret_lease, char *why, size_t why_len)
{
	char reason[200];
	struct reg_device *dev;
	struct tensor *t;
	uint64_t nbytes;
	int r;

	r = create_check(reg, rc, a, why, why_len);
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
	if (r < 0)
		snprintf(why, why_len, "tensor '%.*s': %s", (int)a->name_len, a->name, reason);
	else
		r = create_device(reg, a, nbytes, &dev, why, why_len);
	if (r < 0) {
		free(t);
		return r;
	}
	tensor_fill(t, a, rc, nbytes);
	r = create_charge(reg, dev, t, a->shared, why, why_len);
	if (r < 0) {
		free(t);
		return r;
	}
	if (dev->ops->alloc_blocks && nbytes && !goes_to_slab(dev->ops, a->shared, nbytes))
		return create_begin(reg, rc, a, dev, t, ret_t, why, why_len);
	r = tensor_alloc(reg, dev, t, a->shared, why, why_len);
	if (r < 0) {
		create_uncharge(reg, t);
		free(t);
		return r;
	}
	if (a->replace)
		replace_old(reg, rc, a);
	creator_link(rc, t);
	tensor_link(reg, dev, t);
	tensor_name(reg, t);
	rc->n_created++;
	r = lease_add(reg, rc, t, ret_lease);
	if (r < 0) {
		snprintf(why, why_len, "tensor '%s': client holds too many leases (%u)", t->name,
			 rc->n_leases);
		tensor_unlink(reg, t);
		return r;
	}
	*ret_t = t;
	return 0;
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
	int r;

	if (!ops->share || t->alloc.share_id || !t->nbytes || t->nbytes > ops->shared_max ||
	    (t->flags & TENSORD_MUTABLE))
		return;
	r = ops->share(&t->alloc, t->owner_uid, t->owner_gid, t->mode);
	if (r < 0) {
		log_debug("tensor '%s': keeps its own memfd: %s", t->name, tensord_strerror(r));
		return;
	}
	/* It no longer holds a descriptor against its owner's share. */
	if (reg->quota && t->fd_charged)
		quota_uncharge(reg->quota, t->owner_uid, QUOTA_FDS, 1);
	t->fd_charged = false;
}

int registry_publish(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		     char *why, size_t why_len)
{
	struct tensor *t;
	int r;

	assert(len > 0 && len <= TENSORD_NAME_MAX);
	t = find_named(reg, name, len);
	if (!t || !visible_to(t, rc)) {
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
	if (t->allocating) {
		snprintf(why, why_len,
			 "tensor '%s': its memory is still being allocated; publish after create "
			 "answered",
			 t->name);
		return -EBUSY;
	}
	if (!(t->flags & TENSORD_MUTABLE)) {
		r = t->alloc.ops->freeze(&t->alloc);
		if (r < 0) {
			snprintf(why, why_len,
				 "tensor '%s': cannot make it immutable: %s (a writable shared "
				 "mapping of it still exists, e.g. in a forked child)",
				 t->name, tensord_strerror(r));
			return r;
		}
		move_to_slab(reg, t);
	}
	t->state = TENSORD_STATE_PUBLISHED;
	log_debug("tensor '%s': published by pid %u", t->name, rc->pid);
	if (reg->on_publish)
		reg->on_publish(reg->on_publish_ctx, t);
	return 0;
}

int registry_attach(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		    struct tensor **ret_t, uint64_t *ret_lease, bool *ret_writable, char *why,
		    size_t why_len)
{
	struct tensor *t;
	int r;

	assert(len > 0 && len <= TENSORD_NAME_MAX);
	t = find_named(reg, name, len);
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
	r = lease_add(reg, rc, t, ret_lease);
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
	t = find_named(reg, name, len);
	if (!t || !visible_to(t, rc)) {
		snprintf(why, why_len, "tensor '%.*s': no such tensor", (int)len, name);
		return -ENOENT;
	}
	if (rc->uid != 0 && rc->uid != t->owner_uid && !mode_allows(t, rc, PERM_WRITE)) {
		snprintf(why, why_len, "tensor '%s': owned by uid %u, mode %03o refuses uid %u",
			 t->name, t->owner_uid, t->mode, rc->uid);
		return -EPERM;
	}
	log_debug("tensor '%s': unlinked by pid %u, %u leases live", t->name, rc->pid, t->refcount);
	tensor_unlink(reg, t);
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

int registry_list(struct registry *reg, struct reg_client *rc, const char *prefix, size_t len,
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
	return 0;
}
