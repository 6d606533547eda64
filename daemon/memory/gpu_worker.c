/*
 * The GPU worker (gpu_worker.h): a FIFO of jobs, one thread that runs them,
 * a list of timers that join the FIFO when they fall due, and a list of
 * finished jobs whose completions wait for the loop. A plain
 * pthread rather than libuv's thread pool: the backends that queue frees
 * know no loop, the jobs must run one at a time and in order (an
 * allocation and a free on the same device share its context count), and
 * libuv's pool is shared with file-system work whose latency these calls
 * should not add to.
 */
#include "gpu_worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "daemon/base/log.h"

struct job {
	void (*fn)(void *arg);
	void (*done)(void *arg); /* NULL: nothing to complete */
	void *arg;
	uint64_t due_ns; /* a timer's: when it joins the queue (gpu_worker_now_ns()) */
	struct job *next;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;             /* a job was queued, one finished, or stop */
	struct job *head, *tail;         /* queued, not yet started */
	struct job *timers;              /* not yet due, the soonest first */
	struct job *fin_head, *fin_tail; /* run, their completion not yet */
	unsigned running;                /* 1 while the worker runs a job */
	bool started, stop;
	pthread_t thread;
	void (*notify)(void *ctx);
	void *notify_ctx;
	uint64_t (*clock)(void); /* gpu_worker_set_clock(): a test's; NULL: CLOCK_MONOTONIC */
} worker = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/*
 * j ran; lock held. A job with a completion joins the finished list, and
 * whoever listens is told, under the lock so that after
 * gpu_worker_set_notify(NULL) returns nobody calls the old hook.
 */
static void finished(struct job *j)
{
	if (!j->done) {
		free(j);
		return;
	}
	j->next = NULL;
	if (worker.fin_tail)
		worker.fin_tail->next = j;
	else
		worker.fin_head = j;
	worker.fin_tail = j;
	if (worker.notify)
		worker.notify(worker.notify_ctx);
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t gpu_worker_now_ns(void)
{
	uint64_t (*clock)(void) = __atomic_load_n(&worker.clock, __ATOMIC_ACQUIRE);

	return clock ? clock() : mono_ns();
}

/* Lock held. Appends j to the queue. */
static void queue(struct job *j)
{
	j->next = NULL;
	if (worker.tail)
		worker.tail->next = j;
	else
		worker.head = j;
	worker.tail = j;
}

/* Lock held. Moves the timers due by now to the queue, in the order they fall due. */
static void timers_due(uint64_t now)
{
	while (worker.timers && worker.timers->due_ns <= now) {
		struct job *j = worker.timers;

		worker.timers = j->next;
		queue(j);
	}
}

/* Lock held. Sleeps until something is queued, the stop, or the soonest timer. */
static void worker_wait(void)
{
	struct timespec until;

	/* A test's clock moves only by gpu_worker_set_clock(), which wakes us. */
	if (!worker.timers || worker.clock) {
		pthread_cond_wait(&worker.cond, &worker.lock);
		return;
	}
	until.tv_sec = (time_t)(worker.timers->due_ns / 1000000000ull);
	until.tv_nsec = (long)(worker.timers->due_ns % 1000000000ull);
	pthread_cond_clockwait(&worker.cond, &worker.lock, CLOCK_MONOTONIC, &until);
}

static void *worker_main(void *unused)
{
	pthread_mutex_lock(&worker.lock);
	for (;;) {
		struct job *j;

		timers_due(gpu_worker_now_ns());
		j = worker.head;
		if (!j) {
			if (worker.stop)
				break;
			worker_wait();
			continue;
		}
		worker.head = j->next;
		if (!worker.head)
			worker.tail = NULL;
		worker.running = 1;
		pthread_mutex_unlock(&worker.lock);
		j->fn(j->arg);
		pthread_mutex_lock(&worker.lock);
		finished(j);
		worker.running = 0;
		pthread_cond_broadcast(&worker.cond);
	}
	pthread_mutex_unlock(&worker.lock);
	return NULL;
}

/* Lock held. */
static bool worker_start(void)
{
	if (worker.started)
		return true;
	worker.stop = false;
	if (pthread_create(&worker.thread, NULL, worker_main, NULL) != 0) {
		log_warn("gpu worker: no thread, running GPU driver calls on the loop thread");
		return false;
	}
	worker.started = true;
	return true;
}

/* Queues j, or runs it here when no worker can be had. */
static void enqueue(struct job *j)
{
	pthread_mutex_lock(&worker.lock);
	if (!worker_start()) {
		pthread_mutex_unlock(&worker.lock);
		j->fn(j->arg);
		pthread_mutex_lock(&worker.lock);
		finished(j);
		pthread_mutex_unlock(&worker.lock);
		return;
	}
	queue(j);
	pthread_cond_broadcast(&worker.cond);
	pthread_mutex_unlock(&worker.lock);
}

void gpu_worker_run(void (*fn)(void *arg), void *arg)
{
	struct job *j = malloc(sizeof(*j));

	if (!j) {
		fn(arg);
		return;
	}
	*j = (struct job){ fn, NULL, arg, 0, NULL };
	enqueue(j);
}

int gpu_worker_run_after(uint64_t delay_ns, void (*fn)(void *arg), void *arg)
{
	struct job *j = malloc(sizeof(*j)), **at;
	uint64_t now = gpu_worker_now_ns();

	if (!j)
		return -ENOMEM;
	*j = (struct job){ fn, NULL, arg, delay_ns > UINT64_MAX - now ? UINT64_MAX : now + delay_ns,
			   NULL };
	pthread_mutex_lock(&worker.lock);
	if (!worker_start()) {
		pthread_mutex_unlock(&worker.lock);
		free(j);
		return -EAGAIN;
	}
	for (at = &worker.timers; *at && (*at)->due_ns <= j->due_ns; at = &(*at)->next)
		;
	j->next = *at;
	*at = j;
	pthread_cond_broadcast(&worker.cond);
	pthread_mutex_unlock(&worker.lock);
	return 0;
}

int gpu_worker_submit(void (*fn)(void *arg), void (*done)(void *arg), void *arg)
{
	struct job *j = malloc(sizeof(*j));

	if (!j)
		return -ENOMEM;
	*j = (struct job){ fn, done, arg, 0, NULL };
	enqueue(j);
	return 0;
}

void gpu_worker_set_clock(uint64_t (*now_ns)(void))
{
	pthread_mutex_lock(&worker.lock);
	__atomic_store_n(&worker.clock, now_ns, __ATOMIC_RELEASE);
	timers_due(gpu_worker_now_ns());
	pthread_cond_broadcast(&worker.cond);
	pthread_mutex_unlock(&worker.lock);
}

void gpu_worker_set_notify(void (*fn)(void *ctx), void *ctx)
{
	pthread_mutex_lock(&worker.lock);
	worker.notify = fn;
	worker.notify_ctx = ctx;
	pthread_mutex_unlock(&worker.lock);
}

unsigned gpu_worker_complete(void)
{
	struct job *j, *next;
	unsigned n = 0;

	pthread_mutex_lock(&worker.lock);
	j = worker.fin_head;
	worker.fin_head = worker.fin_tail = NULL;
	pthread_mutex_unlock(&worker.lock);
	for (; j; j = next, n++) {
		next = j->next;
		j->done(j->arg);
		free(j);
	}
	return n;
}

void gpu_worker_drain(void)
{
	pthread_mutex_lock(&worker.lock);
	while (worker.head || worker.running)
		pthread_cond_wait(&worker.cond, &worker.lock);
	pthread_mutex_unlock(&worker.lock);
}

void gpu_worker_stop(void)
{
	pthread_mutex_lock(&worker.lock);
	if (!worker.started) {
		pthread_mutex_unlock(&worker.lock);
		return;
	}
	worker.stop = true;
	pthread_cond_broadcast(&worker.cond);
	pthread_mutex_unlock(&worker.lock);
	pthread_join(worker.thread, NULL);
	pthread_mutex_lock(&worker.lock);
	worker.started = false;
	worker.stop = false;
	/* Timers not yet due never run (gpu_worker.h). */
	while (worker.timers) {
		struct job *j = worker.timers;

		worker.timers = j->next;
		free(j);
	}
	pthread_mutex_unlock(&worker.lock);
}
