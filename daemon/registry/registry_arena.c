/*
 * A set in one allocation (docs/recycle.md, section 5): put_many lays the
 * members of one transaction out in one ring buffer of its writer's
 * connection, an arena, so its writer maps one buffer per set and its
 * readers one descriptor and one mapping, not one per member.
 *
 * The first member's create opens the arena (Create.arena_size): a free
 * buffer of the connection's ring of that size, group and mode, or new
 * memory. Each later member (Create.in_arena) takes the next offset. A
 * member is an ordinary tensor (name, generation, leases, charges of its
 * own bytes) whose memory is its slice: alloc.fd borrows the arena's
 * descriptor and alloc.ipc_offset says where it lies; a reader maps the
 * arena once, as it maps a ring buffer (Lease.share_id). The arena lives
 * while any member does (named, or leased), so a reader keeping one member
 * of version g keeps g's whole arena. When its last member goes it goes
 * back to its writer's ring as one free buffer (registry_ring.c), unless
 * its writer is gone or gave it back, or a client leasing a member forked:
 * then it is freed.
 *
 * What it costs: the whole arena is charged to its writer's uid and the
 * host from its opening (bytes and one descriptor, as a reserve); a member
 * being created takes its own bytes out of that charge (reg_arena_lend())
 * and is charged them as any tensor, and gives them back to the arena when
 * it goes. A member that does not fit the arena is created as if it asked
 * for none.
 *
 * On a GPU whose backend has arenas (CUDA: one cuMemCreate, or one
 * cuMemAlloc on legacy IPC), the arena is one device allocation, never a
 * ring buffer: its opening charges the size asked, its first member's
 * create makes it on the GPU worker as any GPU create makes its memory
 * (-EINPROGRESS, then reg_arena_allocated() on the loop, which charges
 * the granularity's rounding too), and it is freed (on the worker) with
 * its last member. A member's lease hands over the whole allocation
 * (alloc.size) and its offset, with the arena's share id, so a reader
 * imports it once per process (client/lib/import_gpu.h). Members that
 * come while it is being made, or after it failed, get memory of their
 * own. Members go in at offsets as on the host (256 bytes, or a page),
 * which the driver's granularity is a multiple of.
 */
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/base/log.h"
#include "registry.h"
#include "registry_int.h"

/* Where a member of nbytes starts: at a page when it is a page or more, else at 256 bytes. */
static uint64_t member_align(uint64_t nbytes)
{
	return nbytes >= 4096 ? 4096 : 256;
}

/* Bytes of a's spare given back to its uid and device (a member takes them, or a goes). */
static void spare_take(struct registry *reg, struct reg_arena *a, uint64_t n)
{
	a->spare -= n;
	if (reg->quota)
		quota_uncharge(reg->quota, a->uid, QUOTA_BYTES, n);
	a->dev->used -= n;
}

/* Bytes back into a's spare (a member gone, a lend undone): charged whatever the room. */
static void spare_add(struct registry *reg, struct reg_arena *a, uint64_t n)
{
	a->spare += n;
	if (reg->quota)
		quota_add(reg->quota, a->uid, QUOTA_BYTES, n);
	a->dev->used += n;
}

/* Counts a in the daemon's figures of its kind: delta arenas, bytes more or less. */
static void arena_count(struct registry *reg, const struct reg_arena *a, int delta, int64_t bytes)
{
	if (a->gpu) {
		reg->n_gpu_arenas += delta;
		reg->gpu_arena_bytes += bytes;
	} else {
		reg->n_arenas += delta;
		reg->arena_bytes += bytes;
	}
}

/*
 * A GPU arena of size bytes on dev for tx: charged and open; a free buffer
 * of rc's ring when recycle and one of size, gid and mode is free (memory
 * its writer imported before, an older version's bytes in it: nothing for
 * the worker to do), else allocating (its first member's create makes it).
 */
static int gpu_open(struct registry *reg, struct reg_client *rc, struct reg_tx *tx,
		    struct reg_device *dev, uint64_t size, uint32_t gid, uint32_t mode,
		    bool recycle, char *why, size_t why_len)
{
	struct reg_reserve *ring = NULL, charge = { .dev = dev };
	struct reg_arena *a = calloc(1, sizeof(*a));
	int r;

	if (!a) {
		snprintf(why, why_len, "arena of %llu bytes: out of memory",
			 (unsigned long long)size);
		return -ENOMEM;
	}
	if (recycle && reg->recycle)
		ring = reg_ring_take(reg, rc, dev, size, gid, mode);
	if (ring) {
		/* Its share id (REG_GPU_RING_SHARE) stays: readers' imports of it are kept. */
		a->alloc = ring->alloc;
		a->id = ring->id;
		free(ring);
	} else {
		a->alloc.fd = -1;
		a->alloc.ops = dev->ops;
		a->alloc.device_id = dev->device.device_id;
		a->alloc.size = size;
		/* What it is charged until the worker says what the rounding took. */
		a->alloc.footprint = size;
		/* Readers import it once, by this name (Lease.share_id). */
		a->alloc.share_id = REG_RING_SHARE | ++reg->next_ring_share;
		a->id = ++rc->next_reserve;
		a->allocating = true;
	}
	charge.alloc.footprint = a->alloc.footprint;
	r = reg_reserve_charge(reg, rc, &charge, why, why_len);
	if (r < 0) {
		if (!a->allocating &&
		    !reg_ring_keep(reg, rc, a->id, dev, &a->alloc, size, gid, mode))
			dev->ops->release(&a->alloc);
		free(a);
		return r;
	}
	a->rc = rc;
	a->uid = rc->uid;
	a->spare = a->alloc.footprint;
	a->dev = dev;
	a->gid = gid;
	a->mode = mode;
	a->open = true;
	a->gpu = true;
	a->recycle = recycle && reg->recycle;
	a->want = size;
	LIST_INSERT_HEAD(&rc->arenas, a, link);
	arena_count(reg, a, 1, (int64_t)a->alloc.footprint);
	reg_tx_set_arena(reg, tx, true, a);
	return 0;
}

int reg_arena_open(struct registry *reg, struct reg_client *rc, struct reg_tx *tx,
		   struct reg_device *dev, uint64_t size, uint32_t gid, uint32_t mode, bool recycle,
		   char *why, size_t why_len)
{
	struct reg_reserve *ring, charge = { .dev = dev };
	struct reg_arena *a;
	int r;

	if (dev->ops->alloc_blocks) {
		reg_tx_set_arena(reg, tx, true, NULL);
		return gpu_open(reg, rc, tx, dev, size, gid, mode, recycle, why, why_len);
	}
	reg_tx_set_arena(reg, tx, false, NULL);
	a = calloc(1, sizeof(*a));
	if (!a) {
		snprintf(why, why_len, "arena of %llu bytes: out of memory",
			 (unsigned long long)size);
		return -ENOMEM;
	}
	ring = reg_ring_take(reg, rc, dev, size, gid, mode);
	if (ring) {
		a->alloc = ring->alloc;
		a->id = ring->id;
		a->fd_sent = true; /* its writer maps it already */
		free(ring);
	} else {
		a->alloc.fd = -1;
		r = dev->ops->alloc(&a->alloc, size, dev->device.device_id, "tensord-arena");
		a->alloc.ops = dev->ops;
		if (r < 0) {
			snprintf(why, why_len, "arena of %llu bytes on %s: %s",
				 (unsigned long long)size, dev->ops->name, tensord_strerror(r));
			free(a);
			return r;
		}
		a->alloc.recycled = true;
		a->alloc.share_id = REG_RING_SHARE | ++reg->next_ring_share;
		a->id = ++rc->next_reserve;
	}
	/* The whole of it is charged until members take their bytes. */
	charge.alloc.footprint = a->alloc.footprint;
	r = reg_reserve_charge(reg, rc, &charge, why, why_len);
	if (r < 0) {
		if (!ring ||
		    !reg_ring_keep(reg, rc, a->id, dev, &a->alloc, a->alloc.size, gid, mode))
			dev->ops->release(&a->alloc);
		free(a);
		return r;
	}
	a->rc = rc;
	a->uid = rc->uid;
	a->spare = a->alloc.footprint;
	a->dev = dev;
	a->gid = gid;
	a->mode = mode;
	a->open = true;
	LIST_INSERT_HEAD(&rc->arenas, a, link);
	arena_count(reg, a, 1, (int64_t)a->alloc.footprint);
	reg_tx_set_arena(reg, tx, false, a);
	return 0;
}

/* Where a member of nbytes would go in a: its offset, or UINT64_MAX when it does not fit. */
static uint64_t next_offset(const struct reg_arena *a, uint64_t nbytes)
{
	uint64_t align = member_align(nbytes);
	uint64_t off = (a->fill + align - 1) & ~(align - 1);

	return off > a->alloc.size || nbytes > a->alloc.size - off ? UINT64_MAX : off;
}

uint64_t reg_arena_lend(struct registry *reg, struct reg_tx *tx, const struct reg_device *dev,
			uint32_t gid, uint32_t mode, uint32_t flags, uint64_t nbytes)
{
	struct reg_arena *a = tx ? reg_tx_arena(tx, dev->ops->alloc_blocks) : NULL;

	if (!a || !a->open || a->lent || a->dev != dev || a->gid != gid || a->mode != mode ||
	    (flags & TENSORD_MUTABLE) || !nbytes || next_offset(a, nbytes) == UINT64_MAX)
		return 0;
	/* A GPU arena being made takes only the member that makes it. */
	if (a->failed || (a->allocating && a->members))
		return 0;
	spare_take(reg, a, nbytes);
	a->lent = nbytes;
	return nbytes;
}

/* tx's arena that lent room to the create under way, or NULL. */
static struct reg_arena *lent_arena(const struct reg_tx *tx)
{
	for (int gpu = 0; tx && gpu < 2; gpu++) {
		struct reg_arena *a = reg_tx_arena(tx, gpu);

		if (a && a->lent)
			return a;
	}
	return NULL;
}

void reg_arena_unlend(struct registry *reg, struct reg_tx *tx)
{
	struct reg_arena *a = lent_arena(tx);

	if (a) {
		spare_add(reg, a, a->lent);
		a->lent = 0;
	}
}

/* t's memory: a's, from offset off (the whole allocation on a GPU: what a lease maps). */
static void member_alloc(const struct reg_arena *a, struct tensor *t, uint64_t off)
{
	t->alloc = a->alloc;
	t->alloc.size = a->gpu ? a->alloc.size : t->nbytes;
	t->alloc.footprint = t->nbytes;
	t->alloc.ipc_offset = a->alloc.ipc_offset + off;
}

void reg_arena_place(struct reg_tx *tx, struct tensor *t)
{
	struct reg_arena *a = lent_arena(tx);
	uint64_t off = next_offset(a, t->nbytes);

	/* reg_arena_lend() found the room, in memory that exists. */
	assert(a && a->lent == t->nbytes && off != UINT64_MAX && !a->allocating);
	a->lent = 0;
	member_alloc(a, t, off);
	/* A GPU member's lease always carries the export: the client keeps no
	 * descriptor of it, only its import (which may be gone). */
	t->ring_hit = !a->gpu && a->fd_sent;
	a->fd_sent = true;
	a->fill = off + t->nbytes;
	a->members++;
	t->arena = a;
}

bool reg_arena_lent_pending(const struct reg_tx *tx)
{
	const struct reg_arena *a = lent_arena(tx);

	return a && a->allocating;
}

void reg_arena_place_pending(struct reg_tx *tx, struct tensor *t)
{
	struct reg_arena *a = lent_arena(tx);

	assert(a && a->allocating && a->members == 0 && a->lent == t->nbytes);
	a->lent = 0;
	a->fill = t->nbytes;
	a->members++;
	t->arena = a;
}

uint64_t reg_arena_alloc_size(const struct tensor *t)
{
	/* Set before the job was queued, and unchanged until its completion. */
	return t->arena && t->arena->allocating ? t->arena->want : t->nbytes;
}

int reg_arena_allocated(struct registry *reg, struct tensor *t, struct backend_alloc *got, int rc,
			char *why, size_t why_len)
{
	struct reg_arena *a = t->arena;
	struct reg_device *dev = a->dev;
	uint64_t extra = 0, share = a->alloc.share_id;
	char reason[200];

	assert(a->allocating);
	a->allocating = false;
	got->ops = dev->ops;
	/* Its footprint is what it is charged: never less than it was so far. */
	if (rc == 0 && got->footprint < a->alloc.footprint)
		got->footprint = a->alloc.footprint;
	if (rc < 0) {
		snprintf(why, why_len,
			 "tensor '%s': allocating its set's %llu bytes on %s failed: %s", t->name,
			 (unsigned long long)a->want, dev->ops->name, tensord_strerror(rc));
	} else if (got->footprint > a->alloc.footprint) {
		/* The granularity's rounding, charged as the rest was. */
		extra = got->footprint - a->alloc.footprint;
		if (extra > dev->capacity - dev->used) {
			snprintf(why, why_len,
				 "tensor '%s': its set needs %llu bytes after rounding, only %llu "
				 "free",
				 t->name, (unsigned long long)got->footprint,
				 (unsigned long long)(dev->capacity - dev->used +
						      a->alloc.footprint));
			rc = -ENOSPC;
		} else if (reg->quota) {
			rc = quota_charge(reg->quota, a->uid, QUOTA_BYTES, extra, reason,
					  sizeof(reason));
			if (rc < 0)
				snprintf(why, why_len, "tensor '%s': its set takes %llu bytes: %s",
					 t->name, (unsigned long long)got->footprint, reason);
		}
	}
	if (rc < 0) {
		a->failed = true;
		dev->ops->release(got);
		return rc;
	}
	dev->used += extra;
	a->spare += extra;
	arena_count(reg, a, 0, (int64_t)extra);
	a->alloc = *got;
	/* A CUDA VMM allocation that recycles is a GPU ring buffer from now on:
	 * readers keep their import of it parked between versions. */
	if (a->recycle && got->handle_kind == TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD)
		share |= REG_GPU_RING_SHARE;
	a->alloc.share_id = share;
	member_alloc(a, t, 0);
	a->fd_sent = true;
	return 0;
}

/* a has no member left and no transaction to place more: back to its writer's ring, or freed. */
static void arena_end(struct registry *reg, struct reg_arena *a)
{
	struct reg_client *rc = a->rc;

	if (rc)
		LIST_REMOVE(a, link);
	spare_take(reg, a, a->spare);
	if (reg->quota)
		quota_uncharge(reg->quota, a->uid, QUOTA_FDS, 1);
	arena_count(reg, a, -1, -(int64_t)a->alloc.footprint);
	/* GPU memory is freed on the worker (its backend's release()); a GPU
	 * arena is kept only when it recycles (reg_ring_keep() refuses what a
	 * reader's import cannot keep: legacy IPC), by the size its put_many
	 * asks for, not the driver's rounding. */
	if (!rc || a->tainted || (a->gpu && !a->recycle) ||
	    !reg_ring_keep(reg, rc, a->id, a->dev, &a->alloc, a->gpu ? a->want : a->alloc.size,
			   a->gid, a->mode))
		a->dev->ops->release(&a->alloc);
	free(a);
}

void reg_arena_member_gone(struct registry *reg, struct tensor *t)
{
	struct reg_arena *a = t->arena;

	t->arena = NULL;
	t->alloc.fd = -1; /* the arena's */
	/* Its bytes stay in the arena, charged to it, until the arena goes. */
	spare_add(reg, a, t->nbytes);
	if (--a->members == 0 && !a->open)
		arena_end(reg, a);
}

void reg_arena_close(struct registry *reg, struct reg_arena *a)
{
	a->open = false;
	if (a->lent) {
		spare_add(reg, a, a->lent);
		a->lent = 0;
	}
	if (a->members == 0)
		arena_end(reg, a);
}

int reg_arena_drop(struct reg_client *rc, uint64_t id)
{
	struct reg_arena *a;

	LIST_FOREACH(a, &rc->arenas, link)
	if (!id || a->id == id) {
		LIST_REMOVE(a, link);
		a->rc = NULL;
		return 0;
	}
	return -ESRCH;
}

bool reg_arena_taint(struct reg_arena *a)
{
	if (a->tainted)
		return false;
	a->tainted = true;
	return true;
}
