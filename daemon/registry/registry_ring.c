/*
 * Recycled memory (docs/recycle.md): the ring of a writer's connection.
 *
 * A create that asks to recycle (Create.recycle) gets host memory that is
 * a ring buffer of its connection: a memfd its client maps shared and
 * writable once and keeps. The publish seals it F_SEAL_FUTURE_WRITE
 * (backend_host.c), which refuses every later write, writable mapping and
 * mprotect to everyone but leaves the writer's mapping, made before the
 * seal, writable. When the version is freed (its name gone and its last
 * lease ended, the same moment memory is freed without rings) the buffer
 * goes back to its connection's free list, charged like a reserve, and a
 * later create of the same size, group and mode takes it: the writer
 * copies into memory it mapped and faulted in before, and nothing is
 * zeroed, allocated, mapped or sealed.
 *
 * What a buffer may hold next: only versions of the same owner (the
 * connection's uid), group and mode, so a reader that kept a descriptor
 * of an earlier version sees nothing it could not attach. It is never
 * recycled when its writer's connection is gone (nobody can write it), or
 * when a client holding a lease on it forked (its child may read it
 * without a lease of its own: registry_forked()).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/base/log.h"
#include "daemon/memory/pool.h"
#include "registry.h"
#include "registry_int.h"

/* Free buffers a connection keeps at most; past them a freed version's memory is freed. */
#define RING_FREE_MAX 1024

static bool fits(const struct reg_reserve *r, const struct reg_device *dev, uint64_t nbytes,
		 uint32_t gid, uint32_t mode)
{
	return r->dev == dev && r->nbytes == nbytes && r->gid == gid && r->mode == mode;
}

/* A GPU ring buffer: a device allocation freed on the worker, counted apart. */
static bool is_gpu(const struct reg_reserve *r)
{
	return r->dev->ops->alloc_blocks;
}

/* Counts r in the daemon's free buffers of its kind: delta buffers. */
static void free_count(struct registry *reg, const struct reg_reserve *r, int delta)
{
	if (is_gpu(r)) {
		reg->n_gpu_ring_free += delta;
		reg->gpu_ring_free_bytes += (int64_t)delta * (int64_t)r->alloc.footprint;
	} else {
		reg->n_ring_free += delta;
		reg->ring_free_bytes += (int64_t)delta * (int64_t)r->alloc.footprint;
	}
}

bool reg_ring_has(const struct reg_client *rc, const struct reg_device *dev, uint64_t nbytes,
		  uint32_t gid, uint32_t mode)
{
	const struct reg_reserve *r;

	LIST_FOREACH(r, &rc->ring_free, link)
	if (fits(r, dev, nbytes, gid, mode))
		return true;
	return false;
}

static void unlist(struct registry *reg, struct reg_client *rc, struct reg_reserve *r)
{
	LIST_REMOVE(r, link);
	rc->n_ring_free--;
	free_count(reg, r, -1);
	reg_reserve_uncharge(reg, rc, r);
}

struct reg_reserve *reg_ring_take(struct registry *reg, struct reg_client *rc,
				  const struct reg_device *dev, uint64_t nbytes, uint32_t gid,
				  uint32_t mode)
{
	struct reg_reserve *r;

	LIST_FOREACH(r, &rc->ring_free, link)
	if (fits(r, dev, nbytes, gid, mode)) {
		unlist(reg, rc, r);
		if (is_gpu(r))
			reg->gpu_ring_hits++;
		else
			reg->ring_hits++;
		return r;
	}
	return NULL;
}

void reg_ring_link(struct reg_client *rc, struct tensor *t, uint64_t id)
{
	t->ring_id = id;
	t->ring_rc = rc;
	LIST_INSERT_HEAD(&rc->ring_tensors, t, ring_link);
}

static void ring_unlink(struct tensor *t)
{
	if (!t->ring_rc)
		return;
	LIST_REMOVE(t, ring_link);
	t->ring_rc = NULL;
}

/*
 * Whether alloc may be kept as a free buffer: host memory with a memfd of
 * its own, or a whole CUDA VMM allocation with its export (the only GPU memory
 * a reader's import can keep across versions; legacy IPC is not recycled).
 */
static bool keepable(const struct reg_device *dev, const struct backend_alloc *alloc)
{
	if (!dev)
		return false;
	/* Its export is the backend's (alloc->priv), kept with it. */
	if (dev->ops->alloc_blocks)
		return alloc->priv && alloc->ipc_offset == 0 &&
		       alloc->handle_kind == TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD;
	return alloc->fd >= 0 && !alloc->priv;
}

bool reg_ring_keep(struct registry *reg, struct reg_client *rc, uint64_t id, struct reg_device *dev,
		   struct backend_alloc *alloc, uint64_t nbytes, uint32_t gid, uint32_t mode)
{
	struct reg_reserve *r;
	char why[200];

	if (!reg->recycle || !keepable(dev, alloc) || rc->n_ring_free >= RING_FREE_MAX)
		return false;
	r = calloc(1, sizeof(*r));
	if (!r)
		return false;
	r->id = id;
	r->dev = dev;
	r->alloc = *alloc;
	r->gid = gid;
	r->mode = mode;
	r->nbytes = nbytes;
	if (reg_reserve_charge(reg, rc, r, why, sizeof(why)) < 0) {
		/* No room to keep it: freed, as memory is without rings. */
		log_debug("conn %llu: ring buffer %llu freed: %s", (unsigned long long)rc->id,
			  (unsigned long long)r->id, why);
		free(r);
		return false;
	}
	alloc->fd = -1;
	alloc->priv = NULL; /* a GPU allocation's export and handle: r's now */
	/* The ring serves this size from now on: the pool keeps none ready for
	 * it (a writer's buffers and the pool's would hold the same memory twice). */
	if (!is_gpu(r) && backend_host_pool())
		pool_unwant(backend_host_pool(), r->alloc.size);
	LIST_INSERT_HEAD(&rc->ring_free, r, link);
	rc->n_ring_free++;
	free_count(reg, r, 1);
	return true;
}

bool reg_ring_return(struct registry *reg, struct tensor *t)
{
	struct reg_client *rc = t->ring_rc;

	ring_unlink(t);
	return rc && !t->ring_tainted &&
	       reg_ring_keep(reg, rc, t->ring_id, t->dev, &t->alloc,
			     t->dev && t->dev->ops->alloc_blocks ? t->nbytes : t->alloc.size,
			     t->owner_gid, t->mode);
}

static void free_one(struct registry *reg, struct reg_client *rc, struct reg_reserve *r)
{
	unlist(reg, rc, r);
	/* Its memfd is closed on the pool's worker; GPU memory freed on the GPU worker. */
	r->dev->ops->release(&r->alloc);
	free(r);
}

int reg_ring_drop(struct registry *reg, struct reg_client *rc, uint64_t id)
{
	struct reg_reserve *r;
	struct tensor *t;

	LIST_FOREACH(r, &rc->ring_free, link)
	if (r->id == id) {
		free_one(reg, rc, r);
		return 0;
	}
	LIST_FOREACH(t, &rc->ring_tensors, ring_link)
	if (t->ring_id == id) {
		/* Its writer let go of its mapping: nobody can write the next version. */
		ring_unlink(t);
		return 0;
	}
	return reg_arena_drop(rc, id);
}

unsigned reg_ring_drop_free(struct registry *reg, struct reg_client *rc)
{
	unsigned n = 0;

	while (!LIST_EMPTY(&rc->ring_free)) {
		free_one(reg, rc, LIST_FIRST(&rc->ring_free));
		n++;
	}
	return n;
}

void reg_ring_client_gone(struct registry *reg, struct reg_client *rc)
{
	reg_ring_drop_free(reg, rc);
	while (!LIST_EMPTY(&rc->ring_tensors))
		ring_unlink(LIST_FIRST(&rc->ring_tensors));
	while (reg_arena_drop(rc, 0) == 0)
		;
}

unsigned registry_forked(struct registry *reg, struct reg_client *rc)
{
	unsigned n = 0;

	reg->visits += rc->n_slots;
	for (uint32_t s = 0; s < rc->n_slots; s++) {
		struct tensor *t = rc->leases[s].t;

		if (t && t->ring_id && !t->ring_tainted) {
			t->ring_tainted = true;
			reg->ring_tainted++;
			n++;
		}
		if (t && t->arena && reg_arena_taint(t->arena)) {
			reg->ring_tainted++;
			n++;
		}
	}
	return n;
}
