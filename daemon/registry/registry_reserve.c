/*
 * Reserves (docs/design.md, "The reserve"): ready host memory a connection
 * keeps mapped for its next creates, so that filling a new tensor costs
 * its client a copy, not the page tables of a fresh mapping. The registry
 * owns each reserve, on its connection's list, and charges it like memory
 * of the connection's uid (bytes and a descriptor of their shares, the
 * host's capacity) until a create takes it (registry_create.c), the client
 * gives it back, or the connection closes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/base/log.h"
#include "registry.h"
#include "registry_int.h"

/* What r is charged: its bytes and its descriptor to rc's uid, its bytes to its device. */
int reg_reserve_charge(struct registry *reg, const struct reg_client *rc, struct reg_reserve *r,
		       char *why, size_t why_len)
{
	char reason[200];
	int e;

	if (r->alloc.footprint > r->dev->capacity - r->dev->used) {
		snprintf(why, why_len, "reserve of %llu bytes: only %llu of %llu are free on %s",
			 (unsigned long long)r->alloc.footprint,
			 (unsigned long long)(r->dev->capacity - r->dev->used),
			 (unsigned long long)r->dev->capacity, r->dev->ops->name);
		return -ENOSPC;
	}
	if (reg->quota) {
		if (!quota_fd_room(reg->quota, rc->uid)) {
			snprintf(why, why_len,
				 "reserve: the daemon's descriptors are all in use but the %u it "
				 "keeps for root",
				 reg->quota->lim.fd_reserve);
			return -ENOSPC;
		}
		e = quota_charge(reg->quota, rc->uid, QUOTA_BYTES, r->alloc.footprint, reason,
				 sizeof(reason));
		if (e == 0) {
			e = quota_charge(reg->quota, rc->uid, QUOTA_FDS, 1, reason, sizeof(reason));
			if (e < 0)
				quota_uncharge(reg->quota, rc->uid, QUOTA_BYTES,
					       r->alloc.footprint);
		}
		if (e < 0) {
			snprintf(why, why_len, "reserve of %llu bytes: %s",
				 (unsigned long long)r->alloc.footprint, reason);
			return e;
		}
	}
	r->dev->used += r->alloc.footprint;
	return 0;
}

void reg_reserve_uncharge(struct registry *reg, const struct reg_client *rc, struct reg_reserve *r)
{
	if (reg->quota) {
		quota_uncharge(reg->quota, rc->uid, QUOTA_BYTES, r->alloc.footprint);
		quota_uncharge(reg->quota, rc->uid, QUOTA_FDS, 1);
	}
	r->dev->used -= r->alloc.footprint;
}

int registry_reserve(struct registry *reg, struct reg_client *rc, uint64_t size,
		     struct reg_reserve **ret, char *why, size_t why_len)
{
	struct reg_device *dev = registry_device(reg, (DLDevice){ kDLCPU, 0 });
	struct reg_reserve *r;
	int e;

	if (size < REGISTRY_RESERVE_MIN || size > REGISTRY_RESERVE_BYTES_MAX) {
		snprintf(why, why_len, "reserve of %llu bytes: reserves take %u to %llu bytes",
			 (unsigned long long)size, REGISTRY_RESERVE_MIN,
			 (unsigned long long)REGISTRY_RESERVE_BYTES_MAX);
		return -EINVAL;
	}
	if (!dev || dev->init_rc < 0 || !dev->ops->reserve) {
		snprintf(why, why_len, "reserve: the daemon keeps no host memory ready");
		return -ENODEV;
	}
	if (rc->n_reserves >= REGISTRY_RESERVES_MAX ||
	    size > REGISTRY_RESERVE_BYTES_MAX - rc->reserved_bytes) {
		snprintf(why, why_len,
			 "reserve of %llu bytes: this connection holds %u reserves of %llu bytes, "
			 "the most it may (%u, %llu bytes)",
			 (unsigned long long)size, rc->n_reserves,
			 (unsigned long long)rc->reserved_bytes, REGISTRY_RESERVES_MAX,
			 (unsigned long long)REGISTRY_RESERVE_BYTES_MAX);
		return -EAGAIN;
	}
	if (size > dev->capacity - dev->used) {
		snprintf(why, why_len, "reserve of %llu bytes: only %llu of %llu are free on %s",
			 (unsigned long long)size, (unsigned long long)(dev->capacity - dev->used),
			 (unsigned long long)dev->capacity, dev->ops->name);
		return -ENOSPC;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(why, why_len, "reserve: out of memory");
		return -ENOMEM;
	}
	r->dev = dev;
	r->alloc.ops = dev->ops;
	r->alloc.fd = -1;
	e = dev->ops->reserve(&r->alloc, size);
	if (e == -EAGAIN)
		snprintf(why, why_len,
			 "reserve of %llu bytes: no memory of its size is ready yet; ask again "
			 "later",
			 (unsigned long long)size);
	else if (e < 0)
		snprintf(why, why_len, "reserve of %llu bytes: %s", (unsigned long long)size,
			 tensord_strerror(e));
	else if (r->alloc.footprint > REGISTRY_RESERVE_BYTES_MAX - rc->reserved_bytes) {
		/* Its size class is larger than what was asked. */
		snprintf(why, why_len,
			 "reserve of %llu bytes: with the %llu this connection holds, more "
			 "than %llu",
			 (unsigned long long)r->alloc.footprint,
			 (unsigned long long)rc->reserved_bytes,
			 (unsigned long long)REGISTRY_RESERVE_BYTES_MAX);
		e = -EAGAIN;
	}
	if (e == 0)
		e = reg_reserve_charge(reg, rc, r, why, why_len);
	if (e < 0) {
		dev->ops->release(&r->alloc);
		free(r);
		return e;
	}
	r->id = ++rc->next_reserve;
	LIST_INSERT_HEAD(&rc->reserves, r, link);
	rc->n_reserves++;
	rc->reserved_bytes += r->alloc.footprint;
	reg->n_reserves++;
	reg->reserve_bytes += r->alloc.footprint;
	log_debug("conn %llu: pid %u reserved %llu bytes (reserve %llu)",
		  (unsigned long long)rc->id, rc->pid, (unsigned long long)r->alloc.size,
		  (unsigned long long)r->id);
	*ret = r;
	return 0;
}

struct reg_reserve *registry_reserve_find(struct reg_client *rc, uint64_t id)
{
	struct reg_reserve *r;

	LIST_FOREACH(r, &rc->reserves, link)
	if (r->id == id)
		return r;
	return NULL;
}

struct reg_reserve *reg_reserve_take(struct registry *reg, struct reg_client *rc, uint64_t id)
{
	struct reg_reserve *r = id ? registry_reserve_find(rc, id) : NULL;

	if (!r)
		return NULL;
	LIST_REMOVE(r, link);
	rc->n_reserves--;
	rc->reserved_bytes -= r->alloc.footprint;
	reg->n_reserves--;
	reg->reserve_bytes -= r->alloc.footprint;
	reg_reserve_uncharge(reg, rc, r);
	r->id = 0; /* off the list */
	return r;
}

void reg_reserve_free(struct registry *reg, struct reg_client *rc, struct reg_reserve *r)
{
	if (!r)
		return;
	if (r->id)
		reg_reserve_take(reg, rc, r->id);
	/* Its memfd (if no tensor took it) is closed on the pool's worker. */
	r->dev->ops->release(&r->alloc);
	free(r);
}

int registry_unreserve(struct registry *reg, struct reg_client *rc, uint64_t id)
{
	struct reg_reserve *r = reg_reserve_take(reg, rc, id);

	if (!r)
		return reg_ring_drop(reg, rc, id); /* a ring buffer's id, or -ESRCH */
	reg_reserve_free(reg, rc, r);
	return 0;
}

unsigned reg_reserves_drop(struct registry *reg, struct reg_client *rc)
{
	struct reg_reserve *r;
	unsigned n = 0;

	while ((r = LIST_FIRST(&rc->reserves))) {
		reg_reserve_free(reg, rc, r);
		n++;
	}
	return n + reg_ring_drop_free(reg, rc);
}
