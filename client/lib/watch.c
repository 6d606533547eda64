/*
 * libtensord: watches. A watch is a Watch request whose id the daemon puts
 * on every Events reply that follows its status; the reader hands those to
 * the watch's queue (td_watch_deliver()), and tensord_watch_next() takes
 * them in order. The queue is bounded like the daemon's: a watch that is
 * not read keeps at most its size, the oldest going first, and the next
 * event it gives is a lagged one.
 *
 * A watch outlives its daemon's restart (docs/restart.md, "Clients carry
 * on"): once its connection is lost, tensord_watch_next() connects anew
 * (the client's successor) and watches again, replaying what came after
 * the newest commit it received when the new daemon restored the old one's
 * state (the same lineage), else everything the new daemon has, after a
 * restarted event.
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
	/* The newest commit the watch received, or the after it replayed
	 * from; 0: none yet. Where a watch resumes after a restart. */
	uint64_t seen;
	struct td_watch_q *next;
};

struct tensord_watch {
	tensord_client *c; /* a reference of its own: the connection it watches on */
	struct td_watch_q q;
	bool open;
	/* What watching again on a new connection takes. */
	char prefix[TENSORD_NAME_MAX + 1];
	bool replay;      /* it wants every commit of its daemon's lineage after q.seen */
	uint64_t lineage; /* of the daemon its events came from (tensord_lineage()) */
	uint64_t lost_ms; /* CLOCK_MONOTONIC when its daemon stopped answering; 0: it answers */
	unsigned tries;   /* connect attempts since */
	bool said;        /* the event that says what this loss did is queued */
	/* Held by tensord_watch_next(): threads take turns (resuming moves c and q). */
	pthread_mutex_t turn;
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

/* A place at the queue's end, the oldest event dropping (and lagged said) when full. */
static tensord_event *push_slot(struct td_watch_q *q)
{
	if (q->n == q->cap) {
		q->head = (q->head + 1) % q->cap;
		q->n--;
		q->lagged = true;
	}
	return &q->v[(q->head + q->n++) % q->cap];
}

static void push(struct td_watch_q *q, const Tensord__Event *e)
{
	tensord_event *ev;

	if (e->kind == TENSORD__EVENT__KIND__LAGGED) {
		q->lagged = true;
		return;
	}
	ev = push_slot(q);
	ev->kind = e->kind == TENSORD__EVENT__KIND__UNLINKED ? TENSORD_EVENT_UNLINKED
							     : TENSORD_EVENT_PUBLISHED;
	ev->generation = e->generation;
	ev->commit = e->commit;
	snprintf(ev->name, sizeof(ev->name), "%s", e->name);
	if (e->commit > q->seen)
		q->seen = e->commit;
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

/*
 * Sends w's Watch on c and waits for its answer; w's queue is registered
 * with c's connection from the request on, and again not when it fails.
 * 0 or -errno, set.
 */
static int watch_send(tensord_client *c, tensord_watch *w, bool replay, uint64_t after)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Watch wm = TENSORD__WATCH__INIT;
	struct td_pending p = { .fd = -1 };
	int r;

	wm.prefix = w->prefix;
	wm.replay = replay;
	wm.after = after;
	wm.queue = w->q.cap;
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
	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		td_watch_unregister(&c->conn, &w->q);
		pthread_mutex_unlock(&c->lock);
	}
	return r;
}

int tensord_watch_start(tensord_client *c, const char *prefix, bool replay, uint64_t after,
			uint32_t queue, tensord_watch **ret_watch)
{
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
	w->q.seen = replay ? after : 0;
	w->c = c;
	snprintf(w->prefix, sizeof(w->prefix), "%s", prefix);
	w->replay = replay;
	w->lineage = tensord_lineage(c);
	r = watch_send(c, w, replay, after);
	if (r < 0) {
		free(w->q.v);
		free(w);
		return r;
	}
	pthread_mutex_init(&w->turn, NULL);
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

/*
 * Watches again on cur, the connection serving w's client now: w's was
 * lost. A daemon of the same lineage restored the old one's names with
 * their commit ids, so the watch replays what came after the newest commit
 * it received: nothing twice, nothing lost but coalesced, after a lagged
 * event. One of another lineage started empty: the watch says so (a
 * restarted event) and replays all it has, each of its commits being news.
 * 0 or -errno, set; on failure w stays where it was, for the next try.
 */
static int watch_again(tensord_watch *w, tensord_client *cur)
{
	tensord_client *old = w->c;
	uint64_t lineage = tensord_lineage(cur);
	tensord_event *ev;
	bool replay = true;
	uint64_t after;
	int r;

	pthread_mutex_lock(&old->lock);
	td_watch_unregister(&old->conn, &w->q);
	/* One event a loss says it with, in its place after what came before
	 * (a try that failed said it already). */
	ev = w->said ? NULL : push_slot(&w->q);
	if (ev)
		memset(ev, 0, sizeof(*ev));
	w->said = true;
	if (!w->lineage || lineage != w->lineage) {
		if (ev)
			ev->kind = TENSORD_EVENT_RESTARTED;
		w->q.seen = 0;
		w->replay = true;
		w->lineage = lineage;
	} else if (ev) {
		/*
		 * The replay gives each name's newest version: versions committed
		 * since the newest event received (in flight when the daemon
		 * went, or made before the watch is back) come coalesced, and a
		 * lagged event says so.
		 */
		ev->kind = TENSORD_EVENT_LAGGED;
	}
	after = w->q.seen;
	/* A live watch that received nothing yet does not know where the old
	 * daemon's commits stood when it began: it goes on live. */
	if (!after && !w->replay)
		replay = false;
	pthread_mutex_unlock(&old->lock);
	r = watch_send(cur, w, replay, after);
	if (r < 0)
		return r;
	td_client_ref(cur);
	w->c = cur;
	td_client_unref(old);
	return 0;
}

/*
 * w's connection was lost: connects anew (w's client's successor) and
 * watches again, trying while no daemon answers for TENSORD_RECONNECT_MS
 * (30 s) in all, pausing 10 ms growing to 100 ms. With timeout_ms 0 (an
 * event loop's call) it never connects, which waits for the daemon's
 * Hello: it takes the connection tensord_fd() made, if any. 0 once it
 * watches again; -EAGAIN (timeout_ms 0) or -ETIMEDOUT when the call's
 * time (until end) ran out first: the next call goes on. Else -errno,
 * set: past the grace, or the new daemon refused the watch.
 */
static int resume(tensord_watch *w, int timeout_ms, uint64_t end)
{
	uint64_t grace = td_reconnect_grace_ms();

	for (;;) {
		tensord_client *cur = w->c;
		unsigned seen = tensord_epoch(w->c);
		uint64_t now, pause;
		char saved[512];
		int r = 0;

		if (timeout_ms != 0) {
			r = td_client_current(&cur);
		} else {
			cur = td_client_latest(w->c);
			if (cur == w->c || td_client_lost(cur))
				r = td_set_error(-ECONNREFUSED,
						 "its connection was lost, and no new one was made "
						 "(tensord_fd() makes one)");
		}

		if (r == 0)
			r = watch_again(w, cur);
		if (r == 0) {
			w->lost_ms = w->tries = 0;
			w->said = false;
			return 0;
		}
		if (!td_gone(w->c, r, seen))
			return r;
		now = now_ms();
		if (!w->lost_ms)
			w->lost_ms = now;
		if (now - w->lost_ms >= grace) {
			snprintf(saved, sizeof(saved), "%s", tensord_last_error());
			w->lost_ms = w->tries = 0;
			return td_set_error(r,
					    "watch of '%s': %s (no daemon answered for %llu ms, "
					    "TENSORD_RECONNECT_MS)",
					    w->prefix, saved, (unsigned long long)grace);
		}
		if (timeout_ms == 0)
			return td_set_error(-EAGAIN, "watch of '%s': reconnecting", w->prefix);
		pause = td_reconnect_pause_ms(w->tries++);
		if (timeout_ms > 0 && now + pause > end)
			pause = end > now ? end - now : 0;
		if (pause) {
			struct timespec ts = { (time_t)(pause / 1000),
					       (long)(pause % 1000) * 1000000L };

			nanosleep(&ts, NULL);
		}
		if (timeout_ms > 0 && now_ms() >= end)
			return td_set_error(-ETIMEDOUT, "watch: no event within %d ms", timeout_ms);
	}
}

/* tensord_watch_next(), its turn taken. */
static int next_event(tensord_watch *w, int timeout_ms, tensord_event *ret_event)
{
	uint64_t end = timeout_ms > 0 ? now_ms() + (uint64_t)timeout_ms : 0;
	int r;

	for (;;) {
		tensord_client *c = w->c;
		bool got;

		pthread_mutex_lock(&c->lock);
		got = pop(&w->q, ret_event);
		r = c->conn.closed ? (c->conn.err ? c->conn.err : -ENOTCONN) : 0;
		pthread_mutex_unlock(&c->lock);
		if (got)
			return 0;
		if (r < 0 && td_client_lost(c)) {
			/* The daemon went away: the watch goes on over a new connection. */
			r = resume(w, timeout_ms, end);
			if (r < 0)
				return r;
			continue;
		}
		if (r < 0)
			return td_set_error(r, "watch: %s",
					    c->conn.why[0] ? c->conn.why : tensord_strerror(r));
		if (timeout_ms == 0) {
			/* Whatever the socket holds now, then none. */
			r = td_poll(c);
			pthread_mutex_lock(&c->lock);
			got = pop(&w->q, ret_event);
			pthread_mutex_unlock(&c->lock);
			if (got)
				return 0;
			if (r < 0 && td_client_lost(c))
				continue;
			return r < 0 ? r : -EAGAIN;
		}
		if (timeout_ms > 0 && now_ms() >= end)
			return td_set_error(-ETIMEDOUT, "watch: no event within %d ms", timeout_ms);
		r = td_wait_event(c, timeout_ms < 0 ? -1 : (int)(end - now_ms()));
		if (r < 0 && !td_client_lost(c))
			return r;
	}
}

int tensord_watch_fd(tensord_watch *w)
{
	tensord_client *c;
	int fd;

	if (!w)
		return td_set_error(-EINVAL, "watch_fd: NULL watch");
	c = w->c;
	pthread_mutex_lock(&c->lock);
	fd = c->conn.closed ? -1 : c->conn.fd;
	pthread_mutex_unlock(&c->lock);
	if (fd < 0)
		return td_set_error(-ENOTCONN,
				    "watch of '%s': its connection was lost; the next "
				    "tensord_watch_next() connects anew",
				    w->prefix);
	return fd;
}

int tensord_watch_next(tensord_watch *w, int timeout_ms, tensord_event *ret_event)
{
	int r;

	if (!w || !ret_event)
		return td_set_error(-EINVAL, "watch_next: NULL argument");
	pthread_mutex_lock(&w->turn);
	r = next_event(w, timeout_ms, ret_event);
	pthread_mutex_unlock(&w->turn);
	return r;
}

tensord_watch *tensord_watch_close(tensord_watch *w)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Unwatch uw = TENSORD__UNWATCH__INIT;
	struct td_pending p = { .fd = -1 };
	tensord_client *c;

	if (!w)
		return NULL;
	c = w->c;
	if (w->open) {
		uw.id = w->q.id;
		req.body_case = TENSORD__REQUEST__BODY_UNWATCH;
		req.unwatch = &uw;
		/* The daemon's queue goes with the connection otherwise; on the
		 * watch's own connection only (a lost one's daemon is gone). */
		if (td_rpc_start(c, &req, &p) == 0) {
			td_rpc_wait(c, &p);
			td_rpc_end(c, &p);
			td_pending_clear(&p);
		}
	}
	pthread_mutex_lock(&c->lock);
	td_watch_unregister(&c->conn, &w->q);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&w->turn);
	free(w->q.v);
	free(w);
	td_client_unref(c);
	return NULL;
}
