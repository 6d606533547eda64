/*
 * The host memory pool: memfds that a worker thread allocated and zeroed
 * ahead of time, so that creating a large host tensor on the loop thread
 * costs a trim and a seal instead of allocating every page, and so that
 * freeing one costs the loop nothing.
 *
 * Who owns what:
 *  - a ready memfd belongs to the pool until pool_take() hands it to a
 *    caller; it was never handed to anyone before, so its bytes are the
 *    zeroes the kernel allocated (a memfd that left the pool never comes
 *    back: some process may still hold a descriptor of it);
 *  - pool_discard() takes ownership of a descriptor and closes it on the
 *    worker, where the kernel frees the pages; while more than
 *    max(budget, POOL_CLOSING_MIN) bytes wait for the worker (which runs
 *    at nice 19 and may fall behind on a busy host), it closes on the
 *    caller instead, so freed memory not yet given back stays bounded.
 *
 * Which sizes are kept: each take, hit or miss, marks its size class as
 * wanted; the worker keeps POOL_READY_PER_CLASS memfds of each of the
 * POOL_CLASSES most recently wanted classes, within the byte budget, and
 * frees those of a class nobody took for POOL_IDLE_NS. Size
 * classes are eight steps per power of two, so a memfd is at most 1/8
 * larger than the tensor that takes it; the excess is trimmed off.
 *
 * Thread safety: every function may be called from any thread; none of
 * them blocks on memory allocation (the worker does that).
 */
#ifndef TENSORD_POOL_H
#define TENSORD_POOL_H

#include <stdbool.h>
#include <stdint.h>

/* Tensors from this size up come from the pool; smaller ones are cheap to make. */
#define POOL_MIN_SIZE (1u << 20)
/* Classes kept warm, and memfds ready per class. */
#define POOL_CLASSES 8
#define POOL_READY_PER_CLASS 2
/* A class that still has a memfd ready is refilled once takes were quiet this long. */
#define POOL_QUIET_NS (50ull * 1000000ull)
/* Freed bytes that may wait for the worker at least (the budget, if larger). */
#define POOL_CLOSING_MIN (256ull << 20)
/* A class nobody took for this long is forgotten, and its ready memory freed. */
#define POOL_IDLE_NS (60ull * 1000000000ull)

struct pool;

/*
 * How the worker allocates a memfd's pages. What pays off depends on the
 * kernel's policy for huge pages in shared memory
 * (/sys/kernel/mm/transparent_hugepage/shmem_enabled): with 2 MiB pages a
 * later pwrite() or mapping of the tensor costs one lookup per 2 MiB
 * instead of per 4 KiB, which is what brings a large put near memcpy speed.
 */
enum pool_pages {
	POOL_PAGES_SMALL,  /* zeroes written: 4 KiB pages ("never", "deny") */
	POOL_PAGES_ADVISE, /* map, MADV_HUGEPAGE, MADV_POPULATE_WRITE ("advise") */
	POOL_PAGES_HUGE,   /* fallocate(); the kernel picks huge pages itself
			    * ("always", "within_size", "force") */
};

/* The policy named by the bracketed word of a shmem_enabled text; SMALL if none. */
enum pool_pages pool_pages_parse(const char *shmem_enabled);
/* This kernel's policy, read from sysfs; SMALL when it cannot be read. */
enum pool_pages pool_pages_default(void);
const char *pool_pages_name(enum pool_pages pages);

struct pool_stats {
	uint64_t budget;        /* most bytes the pool holds ready */
	uint64_t ready_bytes;   /* bytes allocated in ready memfds */
	uint32_t ready_fds;     /* ready memfds (descriptors the pool holds) */
	uint32_t closing_fds;   /* descriptors waiting for the worker to close them */
	uint64_t closing_bytes; /* the memory those hold */
	uint64_t inline_closes; /* discards closed on the caller: the worker was behind */
	uint64_t hits;          /* takes served from a ready memfd */
	uint64_t misses;        /* takes that found none ready (the caller allocates) */
	uint64_t trims;         /* ready memfds dropped under memory pressure */
	uint64_t expired;       /* ready memfds dropped because their class went idle */
	uint64_t refill_ns;     /* time the worker spent allocating */
	enum pool_pages pages;  /* how the worker allocates pages */
};

/*
 * Starts the pool and its worker. budget: the most bytes held ready; 0
 * makes a pool that never holds anything but still frees off the loop.
 * pages: how to allocate (pool_pages_default() for this kernel's policy).
 * 0 or -errno (pthread_create failing).
 */
int pool_new(uint64_t budget, enum pool_pages pages, struct pool **ret_pool);

/* Stops the worker, closes every descriptor the pool holds. NULL-safe. */
void pool_free(struct pool *p);

/*
 * A ready memfd of exactly size bytes (size >= POOL_MIN_SIZE), allocated
 * and zeroed, sealable (MFD_ALLOW_SEALING), never handed out before.
 * Returns the descriptor, owned by the caller, or -ENOENT when none is
 * ready (the class is then wanted, so a later take may hit).
 */
int pool_take(struct pool *p, uint64_t size);

/*
 * pool_take() for a client's reserve (docs/design.md, "The reserve"):
 * nothing is copied into it when it is taken (its client maps it and
 * reads every page; a copy comes only when a later create names it), so
 * the take does not defer the class's refill by POOL_QUIET_NS.
 * The refill then runs while the client is between calls, not 50 ms
 * later, when a producer that pauses about that long (py_put --gap-ms 50)
 * was filling its next tensor on the same CPU.
 */
int pool_take_reserve(struct pool *p, uint64_t size);

/*
 * size's class is served by other means now (a writer's ring keeps buffers
 * of it, docs/recycle.md): it stops being wanted, so the worker neither
 * refills it nor keeps what it has ready of it. A later take of the class
 * wants it again.
 */
void pool_unwant(struct pool *p, uint64_t size);

/*
 * Takes ownership of fd, whose memory is bytes (its size; 0 if small or
 * unknown): the worker closes it, or the caller, at once, when more than
 * max(budget, POOL_CLOSING_MIN) bytes already wait for the worker.
 */
void pool_discard(struct pool *p, int fd, uint64_t bytes);

/* Holds the worker (true): it neither refills nor closes until let go (tests). */
void pool_hold(struct pool *p, bool held);

/* Drops every ready memfd now (memory pressure). Returns the bytes freed. */
uint64_t pool_trim(struct pool *p);

void pool_get_stats(struct pool *p, struct pool_stats *ret);

/* The size class of size: the smallest class size >= size. 0 on overflow. */
uint64_t pool_class_size(uint64_t size);

/* How long a class may go untaken before it is forgotten (tests; default POOL_IDLE_NS). */
void pool_set_idle(struct pool *p, uint64_t idle_ns);

/*
 * Times idle classes by now_ns() (ns, monotonic) instead of
 * CLOCK_MONOTONIC: a test's clock, which moves only when the test says.
 * The worker forgets the classes idle by then on its next round (and
 * pool_settle() waits for that round); call it again each time the clock
 * moved (NULL: CLOCK_MONOTONIC again).
 */
void pool_set_clock(struct pool *p, uint64_t (*now_ns)(void));

/* Waits until the worker has nothing left to do (tests and benchmarks). */
void pool_settle(struct pool *p);

#endif /* TENSORD_POOL_H */
