/*
 * libtensord: the copy pool (docs/recycle.md, section 7). A put's copy of
 * 8 MiB or more into memory this process maps (a ring buffer, a reserve)
 * is split into 2 MiB chunks that the caller and the pool's helper
 * threads take from one counter, so the caller never waits for a chunk
 * nobody started, only for the ones helpers are in the middle of. One
 * helper per CPU this process may run on, but the caller's, at most
 * TD_COPY_THREADS_MAX - 1, or TENSORD_COPY_THREADS - 1; read at each copy
 * (sched_getaffinity), the threads started when first wanted and kept.
 * One copy is shared at a time; another caller meanwhile copies alone.
 *
 * Fork: the pool's lock is taken around fork() (pthread_atfork), and a
 * child starts with no helpers (threads are not copied) and makes its own.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define TD_COPY_CHUNK (2u << 20)
/* Copies from this size up are shared; a smaller one is over before a helper wakes. */
#define TD_COPY_SHARED_MIN (8u << 20)
#define TD_COPY_THREADS_MAX 8

/*
 * One copy job, on its caller's stack: parts, each split into chunks
 * numbered across all of them (part i's first is first[i]); helpers let go
 * of it before the caller returns.
 */
struct job {
	const struct td_copy_part *parts;
	size_t n_parts;
	const size_t *first; /* n_parts + 1 entries: the last is the count of chunks */
	atomic_size_t next;  /* the next chunk to take */
	unsigned helpers;    /* helpers in it now; pool.lock */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work; /* a job was posted */
	pthread_cond_t left; /* a helper left a job */
	struct job *job;     /* posted; NULL: none */
	uint64_t seq;        /* jobs posted: a helper joins each at most once */
	unsigned threads;    /* helpers started in this process */
} pool = { .lock = PTHREAD_MUTEX_INITIALIZER,
	   .work = PTHREAD_COND_INITIALIZER,
	   .left = PTHREAD_COND_INITIALIZER };

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void chunks(struct job *j)
{
	size_t p = 0;

	for (;;) {
		size_t k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed), off, len;
		const struct td_copy_part *pt;

		if (k >= j->first[j->n_parts])
			return;
		/* Chunks are taken in order: the part moves forward only. */
		while (k >= j->first[p + 1])
			p++;
		pt = &j->parts[p];
		off = (k - j->first[p]) * (size_t)TD_COPY_CHUNK;
		len = pt->n - off < TD_COPY_CHUNK ? pt->n - off : TD_COPY_CHUNK;
		memcpy((uint8_t *)pt->dst + off, (const uint8_t *)pt->src + off, len);
	}
}

static void *helper(void *arg)
{
	uint64_t seen = 0;

	(void)arg;
	pthread_mutex_lock(&pool.lock);
	for (;;) {
		struct job *j;

		while (!pool.job || pool.seq == seen)
			pthread_cond_wait(&pool.work, &pool.lock);
		j = pool.job;
		seen = pool.seq;
		j->helpers++;
		pthread_mutex_unlock(&pool.lock);
		chunks(j);
		pthread_mutex_lock(&pool.lock);
		if (--j->helpers == 0)
			pthread_cond_broadcast(&pool.left);
	}
	return NULL;
}

static void prepare(void)
{
	pthread_mutex_lock(&pool.lock);
}

static void parent(void)
{
	pthread_mutex_unlock(&pool.lock);
}

/* In the child: no helper came along, and no copy is in flight here. */
static void child(void)
{
	pthread_mutex_unlock(&pool.lock);
	pthread_cond_init(&pool.work, NULL);
	pthread_cond_init(&pool.left, NULL);
	pool.job = NULL;
	pool.threads = 0;
}

static void register_fork(void)
{
	pthread_atfork(prepare, parent, child);
}

/* Helpers this copy may have: the CPUs this thread may run on but its own, capped. */
static unsigned helpers_wanted(void)
{
	const char *env = getenv("TENSORD_COPY_THREADS");
	unsigned most = TD_COPY_THREADS_MAX;
	cpu_set_t set;
	int cpus;

	if (env && *env) {
		long v = strtol(env, NULL, 10);

		most = v < 1 ? 1 : v > TD_COPY_THREADS_MAX ? TD_COPY_THREADS_MAX : (unsigned)v;
	}
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return 0;
	cpus = CPU_COUNT(&set);
	return (unsigned)(cpus < (int)most ? cpus : (int)most) - 1;
}

/* pool.lock held. Starts helpers until there are want (fewer if threads cannot start). */
static void start(unsigned want)
{
	while (pool.threads < want) {
		pthread_attr_t attr;
		pthread_t t;
		int e;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		e = pthread_create(&t, &attr, helper, NULL);
		pthread_attr_destroy(&attr);
		if (e)
			return;
		pool.threads++;
	}
}

static void run(const struct td_copy_part *parts, size_t n_parts, const size_t *first, size_t total)
{
	struct job j = { .parts = parts, .n_parts = n_parts, .first = first };
	unsigned want = total >= TD_COPY_SHARED_MIN ? helpers_wanted() : 0;
	bool posted = false;

	atomic_init(&j.next, 0);
	if (want) {
		pthread_once(&once, register_fork);
		pthread_mutex_lock(&pool.lock);
		start(want);
		if (!pool.job && pool.threads) {
			pool.job = &j;
			pool.seq++;
			pthread_cond_broadcast(&pool.work);
			posted = true;
		}
		pthread_mutex_unlock(&pool.lock);
	}
	chunks(&j);
	if (!posted)
		return;
	pthread_mutex_lock(&pool.lock);
	pool.job = NULL;
	while (j.helpers)
		pthread_cond_wait(&pool.left, &pool.lock);
	pthread_mutex_unlock(&pool.lock);
}

void td_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
	struct td_copy_part part = { dst, src, n };
	size_t first[2] = { 0, (n + TD_COPY_CHUNK - 1) / TD_COPY_CHUNK };

	run(&part, 1, first, n);
}

void td_copy_many(const struct td_copy_part *parts, size_t n)
{
	size_t stack[17], *first = n < 17 ? stack : malloc((n + 1) * sizeof(*first)), total = 0;

	if (!first) {
		/* Out of memory for the index: one part at a time. */
		for (size_t i = 0; i < n; i++)
			td_copy(parts[i].dst, parts[i].src, parts[i].n);
		return;
	}
	first[0] = 0;
	for (size_t i = 0; i < n; i++) {
		first[i + 1] = first[i] + (parts[i].n + TD_COPY_CHUNK - 1) / TD_COPY_CHUNK;
		total += parts[i].n;
	}
	run(parts, n, first, total);
	if (first != stack)
		free(first);
}
