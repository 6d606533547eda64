/*
 * Watches (docs/design.md, "Watches"): a connection's watchers of a prefix
 * get the changes of every commit step as Events replies carrying the
 * Watch request's id, in commit order, for names their uid may read.
 *
 * Memory is bounded per watcher: events wait in a queue of at most its
 * size (grown as needed from a few slots) while the connection has more
 * than WATCH_OUT_LIMIT bytes of replies unread; a full queue coalesces (a
 * newer event of a name replaces the one queued) or drops the oldest, and
 * the next batch starts with a lagged event. A watcher that never reads
 * costs its queue and no more.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/desc.h"
#include "dispatch_int.h"
#include "log.h"
#include "reply.h"
#include "server.h"
#include "watch.h"

struct watch_event {
	uint8_t kind; /* Tensord__Event__Kind */
	uint16_t name_len;
	uint64_t generation, commit;
	char name[TENSORD_NAME_MAX + 1];
};

struct watcher {
	struct client *cl; /* borrowed: the connection it belongs to */
	uint64_t id;       /* the Watch request's: its replies carry it */
	size_t prefix_len;
	char prefix[TENSORD_NAME_MAX + 1];
	uint32_t size;         /* the most events it queues */
	struct watch_event *q; /* owned ring of cap slots, n queued from head */
	uint32_t cap, head, n;
	bool lagged;              /* events were lost since the last batch */
	LIST_ENTRY(watcher) link; /* every watcher: watches.all */
	LIST_ENTRY(watcher) mine; /* its client's */
};

static struct {
	LIST_HEAD(, watcher) all;
	unsigned n;
	bool init;
} watches;

static void watches_init(void)
{
	if (!watches.init) {
		LIST_INIT(&watches.all);
		watches.init = true;
	}
}

static struct watch_event *slot(struct watcher *w, uint32_t i)
{
	return &w->q[(w->head + i) % w->cap];
}

/* Room for one more event: the ring grows up to the watcher's size. */
static bool grow(struct watcher *w)
{
	uint32_t cap = w->cap ? 2 * w->cap : 16;
	struct watch_event *nq;

	if (cap > w->size)
		cap = w->size;
	if (cap <= w->cap)
		return false;
	nq = malloc((size_t)cap * sizeof(*nq));
	if (!nq)
		return false;
	for (uint32_t i = 0; i < w->n; i++)
		nq[i] = *slot(w, i);
	free(w->q);
	w->q = nq;
	w->cap = cap;
	w->head = 0;
	return true;
}

/* Queues one event for w; a full queue coalesces or drops, and says so. */
static void enqueue(struct watcher *w, const struct reg_change *c)
{
	struct watch_event *e;

	if (w->n == w->cap && !grow(w)) {
		w->lagged = true;
		/* The newest event of a name replaces the one queued, in place. */
		for (uint32_t i = 0; i < w->n; i++) {
			e = slot(w, i);
			if (e->name_len == c->name_len &&
			    memcmp(e->name, c->name, c->name_len) == 0)
				goto fill;
		}
		/* Else the oldest goes. */
		w->head = (w->head + 1) % w->cap;
		w->n--;
	}
	e = slot(w, w->n++);
fill:
	e->kind = c->kind == REG_PUBLISHED ? TENSORD__EVENT__KIND__PUBLISHED
					   : TENSORD__EVENT__KIND__UNLINKED;
	e->generation = c->generation;
	e->commit = c->commit;
	e->name_len = (uint16_t)c->name_len;
	memcpy(e->name, c->name, c->name_len + 1);
}

/* Whether w hears of c: under its prefix, and readable by its uid. */
static bool hears(const struct watcher *w, const struct reg_change *c)
{
	const struct reg_client *rc = &w->cl->rc;

	return c->name_len >= w->prefix_len && memcmp(c->name, w->prefix, w->prefix_len) == 0 &&
	       registry_may_hear(c->owner_uid, c->owner_gid, c->mode, rc);
}

/* Sends what w queued, in batches, while its connection takes them. */
static void flush(struct watcher *w)
{
	Tensord__Event ev[WATCH_BATCH], *pev[WATCH_BATCH];
	struct conn *c = w->cl->conn;

	while ((w->n || w->lagged) && !c->dead && c->out_bytes < WATCH_OUT_LIMIT) {
		Tensord__Reply rep = TENSORD__REPLY__INIT;
		Tensord__Events es = TENSORD__EVENTS__INIT;
		size_t k = 0;

		if (w->lagged) {
			tensord__event__init(&ev[k]);
			ev[k].kind = TENSORD__EVENT__KIND__LAGGED;
			ev[k].name = "";
			pev[k] = &ev[k];
			k++;
			w->lagged = false;
		}
		while (w->n && k < WATCH_BATCH) {
			struct watch_event *e = slot(w, 0);

			tensord__event__init(&ev[k]);
			ev[k].kind = (Tensord__Event__Kind)e->kind;
			ev[k].name = e->name;
			ev[k].generation = e->generation;
			ev[k].commit = e->commit;
			pev[k] = &ev[k];
			k++;
			/* Sent before the slot is reused: the frame is packed below. */
			w->head = (w->head + 1) % w->cap;
			w->n--;
		}
		es.n_events = k;
		es.events = pev;
		rep.id = w->id;
		rep.body_case = TENSORD__REPLY__BODY_EVENTS;
		rep.events = &es;
		reply_send(c, &rep, NULL);
	}
}

void watch_on_commit(struct server *srv, const struct reg_change *v, size_t n, bool lost)
{
	struct watcher *w, *next;

	watches_init();
	for (w = LIST_FIRST(&watches.all); w; w = next) {
		bool any = lost;

		next = LIST_NEXT(w, link);
		w->lagged = w->lagged || lost;
		for (size_t i = 0; i < n; i++) {
			if (!hears(w, &v[i]))
				continue;
			enqueue(w, &v[i]);
			any = true;
		}
		if (any)
			flush(w);
	}
}

void watch_drained(struct client *cl)
{
	struct watcher *w;

	LIST_FOREACH(w, &cl->watches, mine)
	flush(w);
}

static void watcher_free(struct watcher *w)
{
	LIST_REMOVE(w, link);
	LIST_REMOVE(w, mine);
	quota_uncharge(&w->cl->srv->quota, w->cl->rc.uid, QUOTA_WATCHES, 1);
	watches.n--;
	free(w->q);
	free(w);
}

void watch_client_gone(struct client *cl)
{
	struct watcher *w;

	while ((w = LIST_FIRST(&cl->watches)))
		watcher_free(w);
}

/* The current state of names under w's prefix committed after `after`, in commit order. */
struct replay {
	struct watcher *w;
	uint64_t after;
	struct reg_change *v; /* owned */
	size_t n, cap;
	bool cut; /* more than fit: the watcher lags */
};

static void replay_add(void *arg, const struct reg_change *c)
{
	struct replay *r = arg;

	if (c->commit <= r->after || !hears(r->w, c))
		return;
	if (r->n == r->cap) {
		r->cut = true;
		return;
	}
	r->v[r->n++] = *c;
}

static int cmp_commit(const void *a, const void *b)
{
	const struct reg_change *x = a, *y = b;

	return x->commit < y->commit ? -1 : x->commit > y->commit;
}

static void replay(struct watcher *w, uint64_t after)
{
	struct registry *reg = &w->cl->srv->reg;
	struct replay r = { .w = w, .after = after, .cap = w->size };
	struct tensor **page = malloc(DISPATCH_SET_MAX * sizeof(*page));
	const char *next;
	size_t n;

	r.v = malloc((size_t)r.cap * sizeof(*r.v));
	if (!r.v || !page) {
		w->lagged = true;
		goto out;
	}
	/* Names published now, then names unlinked: newer than after, visible to w. */
	registry_list(reg, &w->cl->rc, w->prefix, w->prefix_len, "", DISPATCH_SET_MAX, page, &n,
		      &next);
	r.cut = next != NULL;
	for (size_t i = 0; i < n; i++) {
		struct tensor *t = page[i];
		struct reg_change c = { .kind = REG_PUBLISHED,
					.generation = t->generation,
					.commit = t->commit,
					.owner_uid = t->owner_uid,
					.owner_gid = t->owner_gid,
					.mode = t->mode,
					.tensor = t,
					.name_len = t->name_len };

		if (t->state != TENSORD_STATE_PUBLISHED)
			continue;
		memcpy(c.name, t->name, t->name_len + 1);
		replay_add(&r, &c);
	}
	registry_tombs_each(reg, w->prefix, w->prefix_len, replay_add, &r);
	qsort(r.v, r.n, sizeof(*r.v), cmp_commit);
	for (size_t i = 0; i < r.n; i++)
		enqueue(w, &r.v[i]);
	w->lagged = w->lagged || r.cut;
out:
	free(page);
	free(r.v);
}

void dispatch_do_watch(struct client *cl, uint64_t id, const Tensord__Watch *m)
{
	struct server *srv = cl->srv;
	size_t len = strlen(m->prefix);
	char why[400], reason[200];
	struct watcher *w;
	int r;

	watches_init();
	if (len && td_name_check(m->prefix, len, reason, sizeof(reason)) < 0) {
		snprintf(why, sizeof(why), "watch: prefix: %s", reason);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, -EINVAL, why);
		return;
	}
	r = quota_charge(&srv->quota, cl->rc.uid, QUOTA_WATCHES, 1, reason, sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "watch of '%s': %s", m->prefix, reason);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, r, why);
		return;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		quota_uncharge(&srv->quota, cl->rc.uid, QUOTA_WATCHES, 1);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, -ENOMEM,
			     "watch: out of memory");
		return;
	}
	w->cl = cl;
	w->id = id;
	w->prefix_len = len;
	memcpy(w->prefix, m->prefix, len + 1);
	w->size = m->queue ? m->queue : WATCH_QUEUE_DEFAULT;
	if (w->size > WATCH_QUEUE_MAX)
		w->size = WATCH_QUEUE_MAX;
	LIST_INSERT_HEAD(&watches.all, w, link);
	LIST_INSERT_HEAD(&cl->watches, w, mine);
	watches.n++;
	/* The reply first: every event after it belongs to the watch. */
	reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, 0, "");
	if (m->replay)
		replay(w, m->after);
	flush(w);
	log_debug("conn %llu: watching '%s' (queue %u)", (unsigned long long)cl->conn->id,
		  w->prefix, w->size);
}

void dispatch_do_unwatch(struct client *cl, uint64_t id, const Tensord__Unwatch *m)
{
	struct watcher *w;
	char why[120];

	LIST_FOREACH(w, &cl->watches, mine)
	{
		if (w->id != m->id)
			continue;
		watcher_free(w);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_UNWATCH, id, 0, "");
		return;
	}
	snprintf(why, sizeof(why), "watch %llu: no such watch on this connection",
		 (unsigned long long)m->id);
	reply_status(cl->conn, TENSORD__REQUEST__BODY_UNWATCH, id, -ENOENT, why);
}
