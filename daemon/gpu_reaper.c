/*
 * The GPU worker (gpu_reaper.h): a FIFO of jobs, one thread that runs them,
 * and a list of finished jobs whose completions wait for the loop. A plain
 * pthread rather than libuv's thread pool: the backends that queue frees
 * know no loop, the jobs must run one at a time and in order (an
 * allocation and a free on the same device share its context count), and
 * libuv's pool is shared with file-system work whose latency these calls
 * should not add to.
 */
#include "gpu_reaper.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "log.h"

struct job {
	void (*fn)(void *arg);
	void (*done)(void *arg); /* NULL: nothing to complete */
	void *arg;
	struct job *next;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;             /* a job was queued, one finished, or stop */
	struct job *head, *tail;         /* queued, not yet started */
	struct job *fin_head, *fin_tail; /* run, their completion not yet */
	unsigned running;                /* 1 while the worker runs a job */
	bool started, stop;
	pthread_t thread;
	void (*notify)(void *ctx);
	void *notify_ctx;
} reaper = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/*
 * j ran; lock held. A job with a completion joins the finished list, and
 * whoever listens is told, under the lock so that after
 * gpu_reaper_set_notify(NULL) returns nobody calls the old hook.
 */
static void finished(struct job *j)
{
	if (!j->done) {
		free(j);
		return;
	}
	j->next = NULL;
	if (reaper.fin_tail)
		reaper.fin_tail->next = j;
	else
		reaper.fin_head = j;
	reaper.fin_tail = j;
	if (reaper.notify)
		reaper.notify(reaper.notify_ctx);
}

static void *reaper_main(void *unused)
{
	pthread_mutex_lock(&reaper.lock);
	for (;;) {
		struct job *j = reaper.head;

		if (!j) {
			if (reaper.stop)
				break;
			pthread_cond_wait(&reaper.cond, &reaper.lock);
			continue;
		}
		reaper.head = j->next;
		if (!reaper.head)
			reaper.tail = NULL;
		reaper.running = 1;
		pthread_mutex_unlock(&reaper.lock);
		j->fn(j->arg);
		pthread_mutex_lock(&reaper.lock);
		finished(j);
		reaper.running = 0;
		pthread_cond_broadcast(&reaper.cond);
	}
	pthread_mutex_unlock(&reaper.lock);
	return NULL;
}

/* Lock held. */
static bool reaper_start(void)
{
	if (reaper.started)
		return true;
	reaper.stop = false;
	if (pthread_create(&reaper.thread, NULL, reaper_main, NULL) != 0) {
		log_warn("gpu worker: no thread, running GPU driver calls on the loop thread");
		return false;
	}
	reaper.started = true;
	return true;
}

/* Queues j, or runs it here when no worker can be had. */
static void enqueue(struct job *j)
{
	pthread_mutex_lock(&reaper.lock);
	if (!reaper_start()) {
		pthread_mutex_unlock(&reaper.lock);
		j->fn(j->arg);
		pthread_mutex_lock(&reaper.lock);
		finished(j);
		pthread_mutex_unlock(&reaper.lock);
		return;
	}
	if (reaper.tail)
		reaper.tail->next = j;
	else
		reaper.head = j;
	reaper.tail = j;
	pthread_cond_broadcast(&reaper.cond);
	pthread_mutex_unlock(&reaper.lock);
}

void gpu_reaper_run(void (*fn)(void *arg), void *arg)
{
	struct job *j = malloc(sizeof(*j));

	if (!j) {
		fn(arg);
		return;
	}
	*j = (struct job){ fn, NULL, arg, NULL };
	enqueue(j);
}

int gpu_reaper_submit(void (*fn)(void *arg), void (*done)(void *arg), void *arg)
{
	struct job *j = malloc(sizeof(*j));

	if (!j)
		return -ENOMEM;
	*j = (struct job){ fn, done, arg, NULL };
	enqueue(j);
	return 0;
}

void gpu_reaper_set_notify(void (*fn)(void *ctx), void *ctx)
{
	pthread_mutex_lock(&reaper.lock);
	reaper.notify = fn;
	reaper.notify_ctx = ctx;
	pthread_mutex_unlock(&reaper.lock);
}

unsigned gpu_reaper_complete(void)
{
	struct job *j, *next;
	unsigned n = 0;

	pthread_mutex_lock(&reaper.lock);
	j = reaper.fin_head;
	reaper.fin_head = reaper.fin_tail = NULL;
	pthread_mutex_unlock(&reaper.lock);
	for (; j; j = next, n++) {
		next = j->next;
		j->done(j->arg);
		free(j);
	}
	return n;
}

void gpu_reaper_drain(void)
{
	pthread_mutex_lock(&reaper.lock);
	while (reaper.head || reaper.running)
		pthread_cond_wait(&reaper.cond, &reaper.lock);
	pthread_mutex_unlock(&reaper.lock);
}

void gpu_reaper_stop(void)
{
	pthread_mutex_lock(&reaper.lock);
	if (!reaper.started) {
		pthread_mutex_unlock(&reaper.lock);
		return;
	}
	reaper.stop = true;
	pthread_cond_broadcast(&reaper.cond);
	pthread_mutex_unlock(&reaper.lock);
	pthread_join(reaper.thread, NULL);
	pthread_mutex_lock(&reaper.lock);
	reaper.started = false;
	reaper.stop = false;
	pthread_mutex_unlock(&reaper.lock);
}
