/*
 * The per-client mapping cache: every mapping that some lease of one client
 * uses, refcounted by those leases. A repeat attach of a name this process
 * already maps reuses the mapping (one round trip, no mmap), and the
 * creator's publish finds its own view here. Knows nothing of the socket.
 */
#ifndef TENSORD_CLIENT_MAPCACHE_H
#define TENSORD_CLIENT_MAPCACHE_H

#include <pthread.h>
#include <stdbool.h>

#include "import.h"

/* Shared memory (slabs) whose descriptor this client keeps, at most this many. */
#define TD_SHARES_MAX 64
/*
 * Ring buffers (docs/recycle.md) whose descriptor and whole mapping it
 * keeps besides, at most this many: memory later versions reuse. Never
 * listed in an Attach's have_shares (each lease brings its descriptor,
 * which the entry makes redundant), so an entry may go at any time: each
 * goes TD_PARK_NS after its last use once no lease points into it, since
 * it keeps memory its writer may have given back.
 */
#define TD_RING_SHARES_MAX 64
/* The share ids of ring buffers: the daemon's REG_RING_SHARE bit. */
#define TD_RING_SHARE (1ull << 62)

/*
 * Parked mappings: a read-only mapping of a whole host tensor whose last
 * lease ended keeps its descriptor (not its pages mapped) so that the next
 * attach of that name in this process is one round trip with no
 * descriptor passed. The daemon cannot tell us when such a tensor is
 * freed, and the descriptor keeps its memory alive, so parking is bounded:
 * at most TD_PARK_MAX mappings and TD_PARK_BYTES bytes, each for at most
 * TD_PARK_NS after its last lease (the flusher thread sweeps).
 */
#define TD_PARK_MAX 64
#define TD_PARK_BYTES (64ull << 20)
#define TD_PARK_NS 1000000000ull

struct td_mapcache {
	pthread_mutex_t *lock; /* borrowed: the client's; guards maps and every m->refs */
	/* Each mapping whose refs is above 0, and the parked ones; no reference of its own. */
	LIST_HEAD(td_mapping_list, td_mapping) maps;
	/* The same mappings by name (a table of lists, grown as they grow), so
	 * that a process attaching a million distinct tensors finds each in
	 * O(1); NULL when it could not be allocated: maps is searched. */
	struct td_mapping_list *by_name;
	size_t n_buckets; /* a power of two, or 0 */
	size_t n_maps;    /* on maps */
	struct {
		uint64_t id; /* the daemon's share id */
		int fd;      /* owned, read-only; closed by td_mapcache_fini() */
		/* The slab mapped whole (import.h), one reference; NULL: not yet.
		 * Dropped by td_mapcache_fini(); unmapped when the last mapping
		 * pointing into it goes too. */
		struct td_slabmap *map;
		uint64_t used_ns; /* a ring buffer's: its last use (CLOCK_MONOTONIC) */
	} shares[TD_SHARES_MAX + TD_RING_SHARES_MAX];
	int n_shares;
	int n_ring_shares; /* of n_shares, ring buffers' */
	/* Parked mappings, oldest first; each is also on maps, with refs 0. */
	TAILQ_HEAD(, td_mapping) parked;
	int n_parked;
	uint64_t parked_bytes;
	/* Called, without the lock, when a mapping is parked and none was: the
	 * owner then runs td_mapcache_sweep() when it falls due. */
	void (*on_park)(void *arg);
	void *on_park_arg;
	/* Called, without the lock, when a lent mapping (import.h) is gone,
	 * with its ring_id: its owner may reuse or unmap the memory. */
	void (*on_lent_gone)(void *arg, uint64_t ring_id);
	void *on_lent_arg;
	/* The daemon's HelloReply.instance (0: it sent none); set once at connect. */
	uint64_t daemon_instance;
};

/* Starts an empty cache. Borrowed: lock, valid until the cache is empty and unused. */
void td_mapcache_init(struct td_mapcache *mc, pthread_mutex_t *lock);

/*
 * Closes the descriptors of shared memory the cache keeps, drops its
 * references on the slabs' whole mappings (each unmapped once no mapping
 * points into it) and drops parked mappings.
 */
void td_mapcache_fini(struct td_mapcache *mc);

/*
 * Drops parked mappings older than TD_PARK_NS. Returns when the next one
 * falls due (CLOCK_MONOTONIC ns), or 0 when none is parked.
 */
uint64_t td_mapcache_sweep(struct td_mapcache *mc);

/*
 * Keeps fd as the descriptor of share id, for the next tensors in that
 * memory. Takes ownership of fd: kept, or closed when the cache is full or
 * already holds one for id.
 */
void td_mapcache_share_add(struct td_mapcache *mc, uint64_t id, int fd);

/* A new descriptor (a duplicate, owned by the caller) for share id, or -1. */
int td_mapcache_share_fd(struct td_mapcache *mc, uint64_t id);

/*
 * The whole mapping of share id (a slab), made on first use from the
 * descriptor the cache keeps, or NULL when the cache keeps none or it
 * cannot be mapped (the caller maps a window). Returns a new reference;
 * release with td_slabmap_unref(). name: the tensor's, for errors.
 */
struct td_slabmap *td_mapcache_share_map(struct td_mapcache *mc, uint64_t id, const char *name);

/* Writes up to max share ids the cache holds into ids; returns how many. */
size_t td_mapcache_share_ids(struct td_mapcache *mc, uint64_t *ids, size_t max);

/*
 * Adds m, just filled in by its importer, with one reference, which the
 * caller keeps: it now belongs to the cache; release with td_mapcache_unref().
 */
void td_mapcache_insert(struct td_mapcache *mc, struct td_mapping *m);

/*
 * A mapping that a repeat attach of name may reuse (in use, or parked), or
 * NULL. Returns a new reference; release with td_mapcache_unref().
 */
struct td_mapping *td_mapcache_find_reusable(struct td_mapcache *mc, const char *name);

/*
 * The writable mapping this process made when it created name, for its
 * publish, or NULL. Returns a new reference; release with td_mapcache_unref().
 */
struct td_mapping *td_mapcache_find_created(struct td_mapcache *mc, const char *name);

/*
 * Records that the creator published m immutable: new handles on it say
 * read-only, and when private_view is set m now holds the creator's private
 * view, which no attach may reuse. Borrowed: m, on which the caller holds a
 * reference.
 */
void td_mapcache_mark_published(struct td_mapcache *mc, struct td_mapping *m, bool private_view);

/*
 * Before the connection ends (tensord_close()): unmaps, on the calling
 * thread, every mapping whose importer says unmap_before_close (memory the
 * daemon exports itself: legacy CUDA IPC, HIP IPC), and marks it revoked,
 * so that its last td_mapcache_unref() only frees it. The leases that use
 * such a mapping keep pointing at an address that is no longer mapped.
 * Returns how many mappings it unmapped.
 */
int td_mapcache_revoke(struct td_mapcache *mc);

/*
 * In a child just forked (fork.c's handler, before any other thread
 * exists): closes the descriptors of shared memory, drops parked mappings
 * and parks no more, so that the child holds only what its inherited
 * leases map. Takes no lock.
 */
void td_mapcache_after_fork(struct td_mapcache *mc);

/*
 * Takes ownership of one reference on m; the last one parks m (see above)
 * or unmaps it (unless it was revoked) and frees it. Never fails, never waits for the daemon; any
 * thread.
 */
void td_mapcache_unref(struct td_mapcache *mc, struct td_mapping *m);

#endif /* TENSORD_CLIENT_MAPCACHE_H */
