/*
 * The host memory pool (pool.h says what it promises). One worker thread
 * does all the slow work: memfd_create + ftruncate + allocating every page
 * (fallocate, or MADV_POPULATE_WRITE to get huge pages) for memfds
 * that are wanted, and close() of discarded ones, which is where the kernel
 * frees their pages. The loop thread only ever takes the lock for a few
 * list operations.
 *
 * The worker refills while every condition holds: a wanted class has fewer
 * than POOL_READY_PER_CLASS ready memfds, the budget has room, the system
 * keeps a sixteenth of its memory available afterwards, and the last
 * allocation did not fail. A ready memfd whose class is no longer wanted is
 * closed; a class stops being wanted when POOL_CLASSES others were taken
 * since, or when nobody took it for POOL_IDLE_NS. So the pool follows the sizes clients actually create and gives
 * its memory back when they change or when memory runs short.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "pool.h"

struct ready {
	int fd;        /* owned by the pool */
	uint64_t size; /* a class size */
};

struct closing {
	int fd;         /* owned by the pool */
	uint64_t bytes; /* what closing it frees (0: unknown, small) */
};

struct pool {
	pthread_mutex_t lock;
	pthread_cond_t wake; /* the worker has something to do */
	pthread_cond_t idle; /* the worker has nothing to do */
	pthread_t thread;
	bool stop;
	bool working; /* the worker is outside the lock on a job */
	bool starved; /* the last allocation failed; wait for the next take */
	uint64_t budget;
	enum pool_pages pages;
	uint64_t ready_bytes;
	struct ready *ready;
	size_t n_ready, cap_ready;
	struct closing *closing; /* owned descriptors the worker will close */
	size_t n_closing, cap_closing;
	uint64_t closing_bytes;           /* theirs: freed memory not yet given back */
	uint64_t closing_max;             /* past it, pool_discard() closes on the caller */
	bool held;                        /* pool_hold(): the worker does nothing (tests) */
	uint64_t wanted[POOL_CLASSES];    /* class sizes, most recently wanted first; 0: none */
	uint64_t wanted_ns[POOL_CLASSES]; /* when each was last taken (idle_now()) */
	uint64_t idle_ns;                 /* a class not taken for this long is forgotten */
	uint64_t (*clock)(void);          /* pool_set_clock(): a test's; NULL: CLOCK_MONOTONIC */
	bool clock_moved;                 /* since the worker last forgot idle classes */
	uint64_t last_take_ns;            /* when pool_take() last ran */
	struct pool_stats st;
};

static uint64_t now_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Lock held. The clock idle classes are timed by. */
static uint64_t idle_now(struct pool *p)
{
	return p->clock ? p->clock() : now_mono_ns();
}

uint64_t pool_class_size(uint64_t size)
{
	uint64_t top, step, r;

	if (size <= POOL_MIN_SIZE)
		return POOL_MIN_SIZE;
	/* Eight steps between consecutive powers of two. */
	top = 1ull << (63 - __builtin_clzll(size));
	step = top / 8;
	if (__builtin_add_overflow(size, step - 1, &r))
		return 0;
	return r / step * step;
}

/* Bytes the system can still give without swapping, or UINT64_MAX if unknown. */
static uint64_t mem_available(uint64_t *ret_total)
{
	char line[128];
	uint64_t avail = UINT64_MAX, total = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f) {
		*ret_total = 0;
		return UINT64_MAX;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long long kb;

		if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
			total = kb * 1024;
		else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			avail = kb * 1024;
	}
	fclose(f);
	*ret_total = total;
	return avail;
}

enum pool_pages pool_pages_parse(const char *text)
{
	static const struct {
		const char *word;
		enum pool_pages pages;
	} words[] = {
		{ "[advise]", POOL_PAGES_ADVISE },
		{ "[always]", POOL_PAGES_HUGE },
		{ "[within_size]", POOL_PAGES_HUGE },
		{ "[force]", POOL_PAGES_HUGE },
	};

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (strstr(text, words[i].word))
			return words[i].pages;
	return POOL_PAGES_SMALL;
}

enum pool_pages pool_pages_default(void)
{
	char text[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");

	if (f) {
		if (!fgets(text, sizeof(text), f))
			text[0] = 0;
		fclose(f);
	}
	return pool_pages_parse(text);
}

const char *pool_pages_name(enum pool_pages pages)
{
	switch (pages) {
	case POOL_PAGES_ADVISE:
		return "huge pages (madvise)";
	case POOL_PAGES_HUGE:
		return "huge pages";
	default:
		return "4 KiB pages";
	}
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/*
 * Allocates every page of fd through a mapping that asks for huge pages:
 * with shmem_enabled "advise" only a mapping's MADV_HUGEPAGE gets them
 * (fallocate() has no mapping to ask with). 0, or -errno; -EINVAL means
 * the kernel lacks MADV_POPULATE_WRITE.
 */
static int populate_huge(int fd, uint64_t size)
{
	void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int r = 0;

	if (m == MAP_FAILED)
		return -errno;
	(void)madvise(m, (size_t)size, MADV_HUGEPAGE);
	while (madvise(m, (size_t)size, MADV_POPULATE_WRITE) < 0) {
		if (errno != EINTR) {
			r = errno == EFAULT ? -ENOSPC : -errno; /* EFAULT: it would SIGBUS */
			break;
		}
	}
	munmap(m, (size_t)size);
	return r;
}

/*
 * Allocates every page of fd by writing zeroes into it. fallocate() would
 * be cheaper here (it allocates without touching), but it leaves each page
 * "not up to date": whoever touches it first zeroes it in a fault of its
 * own, one page at a time, and the kernel's fault-around (which maps up to
 * 16 pages a fault) skips such pages. So a client mapping a fallocated
 * memfd with MAP_POPULATE paid a fault and a zeroing per 4 KiB on its own
 * thread (64 MiB: 24-31 ms, beside a 10-20 ms copy), and its later unmap
 * cost 5-7 ms; written pages map 16 at a time (2-6 ms) and unmap in
 * 1.2-2 ms. Written zeroes cost the worker about twice what fallocate()
 * does, off every caller's thread. 0 or -errno (-ENOSPC when tmpfs is full).
 */
static int write_zeroes(int fd, uint64_t size)
{
	static const uint8_t zero[64 << 10];
	struct iovec iov[16];
	uint64_t off = 0;

	for (int i = 0; i < 16; i++)
		iov[i] = (struct iovec){ (void *)zero, sizeof(zero) };
	while (off < size) {
		uint64_t left = size - off;
		int n = left >= 16 * sizeof(zero) ? 16
						  : (int)((left + sizeof(zero) - 1) / sizeof(zero));
		ssize_t k;

		if (left < (uint64_t)n * sizeof(zero))
			iov[n - 1].iov_len = (size_t)(left - (uint64_t)(n - 1) * sizeof(zero));
		k = pwritev(fd, iov, n, (off_t)off);
		iov[n - 1].iov_len = sizeof(zero);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 && errno != ENOSPC ? -errno : -ENOSPC;
		off += (uint64_t)k;
	}
	return 0;
}

/* A new memfd of size bytes with every page allocated and zeroed. */
static int make_memfd(uint64_t size, enum pool_pages pages)
{
	int fd = memfd_create("tensord:pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int r = -EINVAL;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	if (pages == POOL_PAGES_ADVISE)
		r = populate_huge(fd, size);
	else if (pages == POOL_PAGES_SMALL)
		r = write_zeroes(fd, size);
	if (r == -EINVAL) {
		do
			r = fallocate(fd, 0, 0, (off_t)size);
		while (r < 0 && errno == EINTR);
		if (r < 0)
			r = -errno;
	}
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

static bool is_wanted(const struct pool *p, uint64_t size)
{
	for (int i = 0; i < POOL_CLASSES; i++)
		if (p->wanted[i] == size)
			return true;
	return false;
}

static size_t count_ready(const struct pool *p, uint64_t size)
{
	size_t n = 0;

	for (size_t i = 0; i < p->n_ready; i++)
		n += p->ready[i].size == size;
	return n;
}

/* Lock held. Takes ownership of fd, of bytes. False only when out of memory (fd is then closed). */
static bool push_closing(struct pool *p, int fd, uint64_t bytes)
{
	if (p->n_closing == p->cap_closing) {
		size_t cap = p->cap_closing ? p->cap_closing * 2 : 64;
		struct closing *v = realloc(p->closing, cap * sizeof(*v));

		if (!v) {
			close(fd); /* on the caller's thread, but nothing leaks */
			return false;
		}
		p->closing = v;
		p->cap_closing = cap;
	}
	p->closing[p->n_closing++] = (struct closing){ fd, bytes };
	p->closing_bytes += bytes;
	return true;
}

/* Lock held. Moves ready memfd i to the closing list. */
static void drop_ready(struct pool *p, size_t i)
{
	p->ready_bytes -= p->ready[i].size;
	push_closing(p, p->ready[i].fd, p->ready[i].size);
	p->ready[i] = p->ready[--p->n_ready];
}

/*
 * Lock held. The wanted class that most needs a memfd and fits, or 0. A
 * class with none ready is refilled at once; one that still has a memfd
 * ready waits until takes have been quiet for POOL_QUIET_NS, so that
 * zeroing the next memfd does not compete for memory bandwidth with the
 * copy into the one just taken. *due (if not NULL) gets when such a
 * deferred refill falls due, or is left alone.
 */
static uint64_t next_refill(struct pool *p, uint64_t now, uint64_t *due)
{
	if (p->starved || p->stop)
		return 0;
	for (int i = 0; i < POOL_CLASSES && p->wanted[i]; i++) {
		uint64_t c = p->wanted[i], quiet = p->last_take_ns + POOL_QUIET_NS;
		size_t n = count_ready(p, c);

		if (n >= POOL_READY_PER_CLASS || c > p->budget - p->ready_bytes)
			continue;
		if (n == 0 || now >= quiet)
			return c;
		if (due && (!*due || quiet < *due))
			*due = quiet;
	}
	return 0;
}

/* Unlocked: allocates one memfd of class c and adds it, or gives up until the next take. */
static void refill_one(struct pool *p, uint64_t c)
{
	uint64_t total, avail = mem_available(&total);
	uint64_t t0 = now_mono_ns();
	int fd = -ENOMEM;

	if (avail == UINT64_MAX || (avail > c && avail - c > total / 16))
		fd = make_memfd(c, p->pages);
	pthread_mutex_lock(&p->lock);
	p->st.refill_ns += now_mono_ns() - t0;
	if (fd < 0) {
		log_debug("pool: no memfd of %llu bytes: %s; waiting for the next take",
			  (unsigned long long)c, strerror(-fd));
		p->starved = true;
		return;
	}
	if (!is_wanted(p, c) || c > p->budget - p->ready_bytes || p->stop) {
		push_closing(p, fd, c);
		return;
	}
	if (p->n_ready == p->cap_ready) {
		size_t cap = p->cap_ready ? p->cap_ready * 2 : 16;
		struct ready *v = realloc(p->ready, cap * sizeof(*v));

		if (!v) {
			push_closing(p, fd, c);
			return;
		}
		p->ready = v;
		p->cap_ready = cap;
	}
	p->ready[p->n_ready++] = (struct ready){ fd, c };
	p->ready_bytes += c;
}

/* Lock held on entry and exit; drops it while closing. */
static void close_pending(struct pool *p)
{
	while (p->n_closing) {
		struct closing batch[64];
		size_t n = p->n_closing < 64 ? p->n_closing : 64;

		p->n_closing -= n;
		memcpy(batch, p->closing + p->n_closing, n * sizeof(*batch));
		p->working = true;
		pthread_mutex_unlock(&p->lock);
		for (size_t i = 0; i < n; i++)
			close(batch[i].fd);
		pthread_mutex_lock(&p->lock);
		/* Given back only now that the kernel has the pages. */
		for (size_t i = 0; i < n; i++)
			p->closing_bytes -= batch[i].bytes;
		p->working = false;
	}
}

/* Lock held. Forgets classes idle for idle_ns; returns when the next one would be (0: none). */
static uint64_t forget_idle(struct pool *p, uint64_t now)
{
	uint64_t due = 0;
	int n = 0;

	for (int i = 0; i < POOL_CLASSES && p->wanted[i]; i++) {
		if (now - p->wanted_ns[i] >= p->idle_ns) {
			p->st.expired += count_ready(p, p->wanted[i]);
			continue;
		}
		if (!due || p->wanted_ns[i] + p->idle_ns < due)
			due = p->wanted_ns[i] + p->idle_ns;
		p->wanted[n] = p->wanted[i];
		p->wanted_ns[n++] = p->wanted_ns[i];
	}
	for (int i = n; i < POOL_CLASSES; i++)
		p->wanted[i] = 0;
	return due;
}

static void wait_for_work(struct pool *p, uint64_t due)
{
	struct timespec ts = { .tv_sec = (time_t)(due / 1000000000ull),
			       .tv_nsec = (long)(due % 1000000000ull) };

	if (due)
		pthread_cond_timedwait(&p->wake, &p->lock, &ts);
	else
		pthread_cond_wait(&p->wake, &p->lock);
}

static void *worker(void *arg)
{
	struct pool *p = arg;

	/*
	 * Background work at the lowest priority (nice 19, this thread only):
	 * a refill takes a CPU only when nothing of normal priority wants it,
	 * and still goes on, slowly, on a host kept busy. At normal priority a
	 * 1 GiB refill took a CPU from a transfer on two CPUs (bench/
	 * py_remote.py, 1 GiB remote attach, medians of 7, A B A B A B: 1.03-1.04
	 * GB/s, and 1.08-1.43 at nice 19). A
	 * create that finds no ready memory allocates its own (fallocate), as
	 * without a pool. Failing to lower it is harmless.
	 */
	(void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
	pthread_mutex_lock(&p->lock);
	for (;;) {
		uint64_t c, due;

		while (p->held && !p->stop)
			pthread_cond_wait(&p->wake, &p->lock);
		due = forget_idle(p, idle_now(p));
		p->clock_moved = false;
		/* A test's clock is looked at when it says it moved, not on a timer. */
		if (p->clock)
			due = 0;

		/* Ready memfds of classes nobody wants any more go first. */
		for (size_t i = p->n_ready; i-- > 0;)
			if (!is_wanted(p, p->ready[i].size) || p->stop)
				drop_ready(p, i);
		close_pending(p);
		if (p->stop)
			break;
		c = next_refill(p, now_mono_ns(), &due);
		if (c) {
			p->working = true;
			pthread_mutex_unlock(&p->lock);
			refill_one(p, c); /* returns with the lock held */
			p->working = false;
			continue;
		}
		pthread_cond_broadcast(&p->idle);
		if (!p->clock_moved) /* else it moved while the lock was let go: look again */
			wait_for_work(p, due);
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int pool_new(uint64_t budget, enum pool_pages pages, struct pool **ret_pool)
{
	struct pool *p = calloc(1, sizeof(*p));
	pthread_condattr_t attr;
	int r;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	/* The worker times idle classes on the monotonic clock. */
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&p->wake, &attr);
	pthread_condattr_destroy(&attr);
	pthread_cond_init(&p->idle, NULL);
	p->budget = budget;
	p->closing_max = budget > POOL_CLOSING_MIN ? budget : POOL_CLOSING_MIN;
	p->pages = pages;
	p->idle_ns = POOL_IDLE_NS;
	r = pthread_create(&p->thread, NULL, worker, p);
	if (r) {
		pthread_mutex_destroy(&p->lock);
		pthread_cond_destroy(&p->wake);
		pthread_cond_destroy(&p->idle);
		free(p);
		return -r;
	}
	*ret_pool = p;
	return 0;
}

void pool_free(struct pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->thread, NULL);
	/* The worker closed everything on its way out. */
	free(p->ready);
	free(p->closing);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->idle);
	free(p);
}

/* Lock held. Moves class c to the front of the wanted list. */
static void want(struct pool *p, uint64_t c)
{
	int i;

	for (i = 0; i < POOL_CLASSES - 1 && p->wanted[i] != c; i++)
		;
	memmove(p->wanted + 1, p->wanted, (size_t)i * sizeof(p->wanted[0]));
	memmove(p->wanted_ns + 1, p->wanted_ns, (size_t)i * sizeof(p->wanted_ns[0]));
	p->wanted[0] = c;
	p->wanted_ns[0] = idle_now(p);
}

void pool_unwant(struct pool *p, uint64_t size)
{
	uint64_t c = pool_class_size(size);
	int i;

	if (!c)
		return;
	pthread_mutex_lock(&p->lock);
	for (i = 0; i < POOL_CLASSES && p->wanted[i] && p->wanted[i] != c; i++)
		;
	if (i < POOL_CLASSES && p->wanted[i] == c) {
		memmove(p->wanted + i, p->wanted + i + 1,
			(size_t)(POOL_CLASSES - 1 - i) * sizeof(p->wanted[0]));
		memmove(p->wanted_ns + i, p->wanted_ns + i + 1,
			(size_t)(POOL_CLASSES - 1 - i) * sizeof(p->wanted_ns[0]));
		p->wanted[POOL_CLASSES - 1] = 0;
		p->wanted_ns[POOL_CLASSES - 1] = 0;
		/* Its ready memfds go first (the worker's loop), which looks
		 * again as when its clock moved (pool_settle() waits for it). */
		p->clock_moved = true;
		pthread_cond_signal(&p->wake);
	}
	pthread_mutex_unlock(&p->lock);
}

static int take(struct pool *p, uint64_t size, bool copy_follows)
{
	uint64_t c = pool_class_size(size);
	int fd = -ENOENT;

	if (!c || size < POOL_MIN_SIZE)
		return -ENOENT;
	pthread_mutex_lock(&p->lock);
	want(p, c);
	p->starved = false;
	if (copy_follows)
		p->last_take_ns = now_mono_ns();
	for (size_t i = 0; i < p->n_ready; i++) {
		if (p->ready[i].size == c) {
			fd = p->ready[i].fd;
			p->ready_bytes -= c;
			p->ready[i] = p->ready[--p->n_ready];
			break;
		}
	}
	if (fd >= 0)
		p->st.hits++;
	else
		p->st.misses++;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	/* Trim the excess; the kernel frees those pages, at most 1/8 of them. */
	if (fd >= 0 && size < c && ftruncate(fd, (off_t)size) < 0) {
		int r = -errno;

		pool_discard(p, fd, c);
		return r;
	}
	return fd;
}

int pool_take(struct pool *p, uint64_t size)
{
	return take(p, size, true);
}

int pool_take_reserve(struct pool *p, uint64_t size)
{
	return take(p, size, false);
}

void pool_discard(struct pool *p, int fd, uint64_t bytes)
{
	if (fd < 0)
		return;
	pthread_mutex_lock(&p->lock);
	/* The worker runs at nice 19: on a host kept busy it may fall behind a
	 * churn of large tensors, and freed memory would pile up unbounded. */
	if (p->closing_bytes + bytes > p->closing_max) {
		p->st.inline_closes++;
		pthread_mutex_unlock(&p->lock);
		close(fd);
		return;
	}
	push_closing(p, fd, bytes);
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
}

void pool_hold(struct pool *p, bool held)
{
	pthread_mutex_lock(&p->lock);
	p->held = held;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
}

uint64_t pool_trim(struct pool *p)
{
	uint64_t freed;

	pthread_mutex_lock(&p->lock);
	freed = p->ready_bytes;
	p->st.trims += p->n_ready;
	while (p->n_ready)
		drop_ready(p, p->n_ready - 1);
	p->starved = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	return freed;
}

void pool_get_stats(struct pool *p, struct pool_stats *ret)
{
	pthread_mutex_lock(&p->lock);
	*ret = p->st;
	ret->budget = p->budget;
	ret->pages = p->pages;
	ret->ready_bytes = p->ready_bytes;
	ret->ready_fds = (uint32_t)p->n_ready;
	ret->closing_fds = (uint32_t)p->n_closing;
	ret->closing_bytes = p->closing_bytes;
	pthread_mutex_unlock(&p->lock);
}

void pool_set_idle(struct pool *p, uint64_t idle_ns)
{
	pthread_mutex_lock(&p->lock);
	p->idle_ns = idle_ns;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
}

void pool_set_clock(struct pool *p, uint64_t (*now_ns)(void))
{
	pthread_mutex_lock(&p->lock);
	p->clock = now_ns;
	p->clock_moved = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
}

void pool_settle(struct pool *p)
{
	pthread_mutex_lock(&p->lock);
	while (!p->stop && !p->held &&
	       (p->working || p->n_closing || p->clock_moved || next_refill(p, UINT64_MAX, NULL)))
		pthread_cond_wait(&p->idle, &p->lock);
	pthread_mutex_unlock(&p->lock);
}
