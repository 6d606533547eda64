/*
 * libtensord: watches. A watch is a Watch request whose id the daemon puts
 * on every Events reply that follows its status; the reader hands those to
 * the watch's queue (td_watch_deliver()), and tensord_watch_next() takes
 * them in order. The queue is bounded like the daemon's: a watch that is
 * not read keeps at most its size, the oldest going first, and the next
 * event it gives is a lagged one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "common/desc.h"

struct td_watch_q {
	uint64_t id;
	tensord_event *v; /* owned ring of cap */
	uint32_t cap, head, n;
	bool lagged;
	struct td_watch_q *next;
};

struct tensord_watch {
	tensord_client *c; /* a reference of its own */
	struct td_watch_q q;
	bool open;
};

void td_watch_set_id(struct td_watch_q *q, uint64_t id)
{
	q->id = id;
}

void td_watch_register(struct td_conn *conn, struct td_watch_q *q)
{
	q->next = conn->watches;
	conn->watches = q;
}

void td_watch_unregister(struct td_conn *conn, struct td_watch_q *q)
{
	for (struct td_watch_q **pq = &conn->watches; *pq; pq = &(*pq)->next) {
		if (*pq == q) {
			*pq = q->next;
			return;
		}
	}
}

static void push(struct td_watch_q *q, const Tensord__Event *e)
{
	tensord_event *ev;

	if (e->kind == TENSORD__EVENT__KIND__LAGGED) {
		q->lagged = true;
		return;
	}
	if (q->n == q->cap) {
		q->head = (q->head + 1) % q->cap;
		q->n--;
		q->lagged = true;
	}
	ev = &q->v[(q->head + q->n) % q->cap];
	q->n++;
	ev->kind = e->kind == TENSORD__EVENT__KIND__UNLINKED ? TENSORD_EVENT_UNLINKED
							     : TENSORD_EVENT_PUBLISHED;
	ev->generation = e->generation;
	ev->commit = e->commit;
	snprintf(ev->name, sizeof(ev->name), "%s", e->name);
}

bool td_watch_deliver(struct td_conn *conn, const Tensord__Reply *rep)
{
	struct td_watch_q *q;

	for (q = conn->watches; q && q->id != rep->id; q = q->next)
		;
	if (!q || rep->body_case != TENSORD__REPLY__BODY_EVENTS)
		return false;
	for (size_t i = 0; i < rep->events->n_events; i++)
		push(q, rep->events->events[i]);
	return true;
}

/* The next event of q into *ev; false when none. Lock held. */
static bool pop(struct td_watch_q *q, tensord_event *ev)
{
	if (q->lagged) {
		q->lagged = false;
		memset(ev, 0, sizeof(*ev));
		ev->kind = TENSORD_EVENT_LAGGED;
		return true;
	}
	if (!q->n)
		return false;
	*ev = q->v[q->head];
	q->head = (q->head + 1) % q->cap;
	q->n--;
	return true;
}

int tensord_watch_start(tensord_client *c, const char *prefix, bool replay, uint64_t after,
			uint32_t queue, tensord_watch **ret_watch)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Watch wm = TENSORD__WATCH__INIT;
	struct td_pending p = { .fd = -1 };
	char why[300];
	tensord_watch *w;
	int r;

	if (!ret_watch)
		return td_set_error(-EINVAL, "watch: NULL output");
	prefix = prefix ? prefix : "";
	if (*prefix && td_name_check(prefix, strlen(prefix), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "watch: prefix: %s", why);
	r = td_client_current(&c);
	if (r < 0)
		return r;
	w = calloc(1, sizeof(*w));
	queue = queue ? queue : 1024;
	queue = queue < 65536 ? queue : 65536;
	if (w)
		w->q.v = calloc(queue, sizeof(*w->q.v));
	if (!w || !w->q.v) {
		if (w)
			free(w->q.v);
		free(w);
		return td_set_error(-ENOMEM, "watch: out of memory for %u events", queue);
	}
	w->q.cap = queue;
	w->c = c;
	wm.prefix = (char *)prefix;
	wm.replay = replay;
	wm.after = after;
	wm.queue = queue;
	req.body_case = TENSORD__REQUEST__BODY_WATCH;
	req.watch = &wm;
	/* Registered with the request's id as it goes: its events may come in
	 * the read that brings its reply. */
	p.watch = &w->q;
	r = td_rpc_start(c, &req, &p);
	if (r == 0) {
		td_rpc_wait(c, &p);
		r = td_rpc_end(c, &p);
		td_pending_clear(&p);
	}
	pthread_mutex_lock(&c->lock);
	if (r < 0)
		td_watch_unregister(&c->conn, &w->q);
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		free(w->q.v);
		free(w);
		return r;
	}
	td_client_ref(c);
	w->open = true;
	*ret_watch = w;
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int tensord_watch_next(tensord_watch *w, int timeout_ms, tensord_event *ret_event)
{
	tensord_client *c;
	uint64_t end;
	int r;

	if (!w || !ret_event)
		return td_set_error(-EINVAL, "watch_next: NULL argument");
	c = w->c;
	end = timeout_ms > 0 ? now_ms() + (uint64_t)timeout_ms : 0;
	for (;;) {
		bool got;

		pthread_mutex_lock(&c->lock);
		got = pop(&w->q, ret_event);
		r = c->conn.closed ? (c->conn.err ? c->conn.err : -ENOTCONN) : 0;
		pthread_mutex_unlock(&c->lock);
		if (got)
			return 0;
		if (r < 0)
			return td_set_error(r, "watch: %s",
					    c->conn.why[0] ? c->conn.why : tensord_strerror(r));
		if (timeout_ms == 0) {
			/* Whatever the socket holds now, then none. */
			r = td_poll(c);
			pthread_mutex_lock(&c->lock);
			got = pop(&w->q, ret_event);
			pthread_mutex_unlock(&c->lock);
			return got ? 0 : r < 0 ? r : -EAGAIN;
		}
		if (timeout_ms > 0 && now_ms() >= end)
			return td_set_error(-ETIMEDOUT, "watch: no event within %d ms", timeout_ms);
		r = td_wait_event(c, timeout_ms < 0 ? -1 : (int)(end - now_ms()));
		if (r < 0)
			return r;
	}
}

tensord_watch *tensord_watch_close(tensord_watch *w)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Unwatch uw = TENSORD__UNWATCH__INIT;
	Tensord__Reply *rep;
	tensord_client *c;

	if (!w)
		return NULL;
	c = w->c;
	if (w->open) {
		uw.id = w->q.id;
		req.body_case = TENSORD__REQUEST__BODY_UNWATCH;
		req.unwatch = &uw;
		/* The daemon's queue goes with the connection otherwise. */
		if (td_rpc(c, &req, &rep, NULL) == 0)
			tensord__reply__free_unpacked(rep, NULL);
	}
	pthread_mutex_lock(&c->lock);
	td_watch_unregister(&c->conn, &w->q);
	pthread_mutex_unlock(&c->lock);
	free(w->q.v);
	free(w);
	td_client_unref(c);
	return NULL;
}
