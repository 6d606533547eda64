/*
 * libtensord's ring buffers (ring.c): the memory of a writer's earlier
 * versions, which the daemon hands back for later ones (docs/recycle.md).
 * The client's internal header (client.h) includes it: the state lives in
 * struct tensord_client, guarded by the client's lock.
 */
#ifndef TENSORD_CLIENT_RING_H
#define TENSORD_CLIENT_RING_H

#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

#include "proto/tensord.pb-c.h"

#include "reserve.h"

/* Sizes whose put interval a client's ring remembers. */
#define TD_RING_SIZES 8

/* One ring buffer this client maps writable (ring.c, docs/recycle.md). */
struct td_ring_buf {
	uint64_t id;   /* the daemon's name for it (Lease.ring) */
	uint8_t *base; /* owned: map_size bytes, shared, writable, MADV_DONTFORK */
	uint64_t map_size;
	uint64_t size;    /* the tensor size it serves (Lease.map_size) */
	uint64_t used_ns; /* the last create that named it (CLOCK_MONOTONIC) */
	unsigned pins;    /* created tensors' leases whose view it is: never given back */
	bool revoked; /* read-only since a created tensor's publish: writable again when reused */
};

/*
 * The ring buffers of one client: memory of its earlier versions, which
 * the daemon hands back for later ones (ring.c). Guarded by the client's lock.
 */
struct td_ring {
	struct td_ring_buf *bufs; /* owned */
	unsigned n, cap;
	uint64_t bytes;     /* mapped */
	uint64_t budget;    /* the most bytes mapped (TENSORD_RECYCLE_BYTES) */
	unsigned creating;  /* recycled creates between their request and their copy's end */
	bool sweeping;      /* giving back idle buffers: no recycled create meanwhile */
	bool off;           /* TENSORD_RECYCLE=0 */
	bool protect;       /* TENSORD_RECYCLE_PROTECT=1: read-only between versions */
	uint64_t sweep_due; /* CLOCK_MONOTONIC; 0: nothing to expire */
	uint64_t idle_ns;   /* a buffer unused this long is given back, at least */
	/* The sizes this client puts lately, and how far apart: a buffer of
	 * a size put every S is kept 4 S (at most a minute), so a loop with
	 * slower steps than idle_ns still recycles (ring.c). */
	struct td_ring_size {
		uint64_t size, last_ns, interval_ns;
	} sizes[TD_RING_SIZES];
};

/*
 * ring.c: recycled memory (docs/recycle.md). td_ring_init() reads
 * TENSORD_RECYCLE and TENSORD_RECYCLE_BYTES.
 */
void td_ring_init(struct td_ring *r);

/*
 * Whether a put of nbytes with flags should ask the daemon to recycle; if
 * true, td_ring_end() must follow once the reply was used and the copy is
 * done, and *ret_mapped (when not NULL) says how many buffers of nbytes
 * this client maps (two or more: a reserve would only cost memory). May
 * give back buffers idle for TD_RING_IDLE_NS first. Lock not held.
 */
bool td_ring_begin(tensord_client *c, uint64_t nbytes, uint32_t flags, unsigned *ret_mapped);
void td_ring_end(tensord_client *c);

/*
 * Whether a create of GPU memory of spec asks the daemon to recycle
 * (docs/recycle.md, section 4): TENSORD_RECYCLE in its flags, neither
 * sealed nor mutable, recycling not off in this process. Nothing to end:
 * the process keeps no writable mapping of GPU ring buffers of its own
 * (its one import of each is parked between versions, import_gpu.h).
 */
bool td_ring_gpu(tensord_client *c, const tensord_spec *spec);

/*
 * A GPU create took ring buffer id of size bytes (Lease.ring): listed
 * among the client's ring buffers with nothing mapped, so that when it
 * stays unused as long as a host buffer would (TENSORD_RECYCLE_IDLE_MS,
 * or four of its size's put intervals) the flusher gives it back
 * (Unreserve) and the daemon frees it.
 */
void td_ring_gpu_used(tensord_client *c, uint64_t id, uint64_t size);

/*
 * Where to write the tensor of a recycled create's lease w: *ret_base,
 * the ring buffer's mapping (0); 1 when w names no ring buffer (write
 * through the descriptor as before). A buffer new to this client comes
 * as *fd (mapped here, then closed and set to -1) or as reserve rs's
 * memfd (its mapping moves to the ring; rs forgets it). -errno with the
 * error set when it cannot be mapped or is unknown. Lock not held.
 */
int td_ring_target(tensord_client *c, const Tensord__Lease *w, int *fd, struct td_reserve_slot *rs,
		   const char *name, uint8_t **ret_base);

/*
 * For a create with TENSORD_RECYCLE: as td_ring_target(), and the buffer
 * is pinned (never given back) until td_ring_unpin(); *ret_len gets its
 * mapping's length. 1 when w names no ring buffer.
 */
int td_ring_lend(tensord_client *c, const Tensord__Lease *w, int *fd, struct td_reserve_slot *rs,
		 const char *name, uint8_t **ret_base, uint64_t *ret_len);
void td_ring_unpin(tensord_client *c, uint64_t id);

/* A created tensor's view of ring buffer id was made read-only at its publish. */
void td_ring_revoked(tensord_client *c, uint64_t id);

/*
 * A put's copy into ring buffer id is done: with TENSORD_RECYCLE_PROTECT=1
 * its mapping turns read-only until its next version (a stray write of
 * this process then faults), at an mprotect() pair per version.
 */
void td_ring_written(tensord_client *c, uint64_t id);

/*
 * The flusher's turn (release.c): gives back the buffers idle now, when no
 * recycled create is in flight. When the next sweep is due (0: none).
 * Lock not held.
 */
uint64_t td_ring_sweep(tensord_client *c);

/* tensord_close(): unmaps every buffer (the daemon frees them with the connection). */
void td_ring_close(tensord_client *c);

/* In a forked child: forgets the parent's buffers (MADV_DONTFORK: not mapped here). */
void td_ring_after_fork(struct td_ring *r);

#endif
