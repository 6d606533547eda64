/*
 * libtensord: writes retried once and never applied twice (docs/restart.md,
 * section 5, "Idempotence"). Every client handle has a random token, which
 * its Hello carries and the connections that follow it after a lost one
 * keep; every effecting request (a put, a publish, a commit, an unlink
 * outside a transaction) carries the token's next seq, and the daemon
 * remembers what the last ones did, in its state log too.
 *
 * A write whose connection was lost is looked up, not guessed: after the
 * reconnect, a daemon of the same lineage is asked (Resolve) what became of
 * the last effecting request the write sent. Applied: its recorded result
 * is returned as if the reply had come. Not applied: the whole operation
 * is done again (a put from the caller's source, which is still there; an
 * unlink), or, when what it would publish died with the connection (a
 * user's draft or transaction), the loss is the error. A daemon of another
 * lineage started empty: a put is done again, an unlink finds nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

/* The last effecting request this thread sent, and to whom. */
static __thread struct td_write_note last_write;
/* What this thread is to an event loop (tensord_thread_role()). */
static __thread int role;

void tensord_thread_role(int r)
{
	role = r;
}

/* Keeps w, lost on a loop's thread, for the same call on c from another thread. */
static void hold(tensord_client *c, enum td_write_kind kind, const char *what,
		 const struct td_write_note *w)
{
	pthread_mutex_lock(&c->lock);
	c->held = (struct td_held_write){ .valid = true, .kind = kind, .note = *w };
	snprintf(c->held.what, sizeof(c->held.what), "%s", what);
	pthread_mutex_unlock(&c->lock);
}

/*
 * What hold() kept, taken by the loop's worker making the same call again
 * (kind and what the same): true and *w. Only a worker's call takes it, so
 * a plain call never answers with a kept write's result.
 */
static bool take_held(tensord_client *c, enum td_write_kind kind, const char *what,
		      struct td_write_note *w)
{
	bool same;

	pthread_mutex_lock(&c->lock);
	same = c->held.valid && c->held.kind == (int)kind &&
	       strncmp(c->held.what, what, sizeof(c->held.what) - 1) == 0;
	if (same)
		*w = c->held.note;
	c->held.valid = false;
	pthread_mutex_unlock(&c->lock);
	return same;
}

uint64_t td_token_new(void)
{
	uint64_t t = 0;

	while (!t)
		if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
			struct timespec ts;

			clock_gettime(CLOCK_MONOTONIC, &ts);
			t = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
			    ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&t;
		}
	return t;
}

static bool effecting(const Tensord__Request *req)
{
	switch (req->body_case) {
	case TENSORD__REQUEST__BODY_PUT:
		return req->put->create && !req->put->create->tx;
	case TENSORD__REQUEST__BODY_PUBLISH:
	case TENSORD__REQUEST__BODY_COMMIT:
		return true;
	case TENSORD__REQUEST__BODY_UNLINK:
		return !req->unlink->tx;
	default:
		return false;
	}
}

void td_idem_stamp(tensord_client *c, Tensord__Request *req)
{
	if (!c->token || !effecting(req))
		return;
	req->seq = ++c->seq;
	last_write = (struct td_write_note){ .sent = true,
					     .token = c->token,
					     .seq = req->seq,
					     .instance = c->maps.daemon_instance,
					     .lineage = c->lineage };
}

/* What Resolve says of w, asked of cur: 1 applied (*ret), 0 not, -errno (error set). */
static int resolve_once(tensord_client *cur, const struct td_write_note *w,
			Tensord__ResolveReply *ret)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Resolve rs = TENSORD__RESOLVE__INIT;
	Tensord__Reply *rep;
	int r;

	rs.token = w->token;
	rs.seq = w->seq;
	rs.instance = w->instance;
	req.body_case = TENSORD__REQUEST__BODY_RESOLVE;
	req.resolve = &rs;
	r = td_rpc(cur, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_RESOLVE) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTO, "resolve: tensord answered with no result");
	}
	*ret = *rep->resolve;
	ret->base = (ProtobufCMessage)PROTOBUF_C_MESSAGE_INIT(&tensord__resolve_reply__descriptor);
	tensord__reply__free_unpacked(rep, NULL);
	return ret->applied ? 1 : 0;
}

/*
 * Resolve, asked again while the daemon cannot know yet (ESTALE: the old
 * connection is still open there, closing), within the reconnect grace.
 */
static int resolve(tensord_client *c, const struct td_write_note *w, Tensord__ResolveReply *ret)
{
	uint64_t grace_ms = td_reconnect_grace_ms(), waited_ms = 0;
	unsigned tries = 0;
	int r;

	for (;;) {
		r = resolve_once(c, w, ret);
		if (r != -ESTALE || waited_ms >= grace_ms ||
		    strstr(tensord_last_error(), "remembers too few"))
			return r;
		struct timespec ts = { 0, (long)td_reconnect_pause_ms(tries) * 1000000L };

		nanosleep(&ts, NULL);
		waited_ms += td_reconnect_pause_ms(tries++);
	}
}

/* Times a write is done again at most when each try loses its daemon. */
#define TD_WRITE_TRIES 4

/* What about names, written into buf (len bytes). */
static const char *what_text(struct td_what about, char *buf, size_t len)
{
	if (about.name)
		snprintf(buf, len, "tensor '%s': %s", about.name, about.verb);
	else
		snprintf(buf, len, "%s", about.verb);
	return buf;
}

int td_write(tensord_client *c, enum td_write_kind kind, struct td_what about,
	     int (*call)(tensord_client *c, void *arg), void *arg, tensord_version *ret_version,
	     uint64_t *ret_commit)
{
	struct td_write_note held;
	char what[300] = ""; /* what_text(about), once a loss needs it */
	bool resume = role == TENSORD_THREAD_LOOP_WORKER &&
		      take_held(c, kind, what_text(about, what, sizeof(what)), &held);
	struct td_retry rt = { .seen = tensord_epoch(c) };
	bool begun = false;
	int r, left = 0;

	for (unsigned attempt = 0;; attempt++) {
		Tensord__ResolveReply res = TENSORD__RESOLVE_REPLY__INIT;
		struct td_write_note w;
		tensord_client *cur;
		char lost[512];

		if (resume) {
			/* Lost on a loop's thread before (tensord_thread_role()), or
			 * the Resolve of it lost its connection: its fate is asked
			 * (again), here, where connecting may wait. */
			resume = false;
			w = held;
			r = -ECONNRESET;
			snprintf(lost, sizeof(lost), "connection to tensord lost");
			rt.seen = (unsigned)-1; /* any epoch: the loss was before */
			if (!begun) {
				td_retry_begin(&rt, c, -1);
				rt.seen = (unsigned)-1;
				begun = true;
			}
		} else {
			last_write.sent = false;
			r = call(c, arg);
			w = last_write;
			last_write.sent = false;
			if (r >= 0 || !td_gone(c, r, rt.seen) || attempt + 1 >= TD_WRITE_TRIES)
				return r;
			snprintf(lost, sizeof(lost), "%s", tensord_last_error());
			if (!*what)
				what_text(about, what, sizeof(what));
			if (role == TENSORD_THREAD_LOOP) {
				/* Never connects here: kept for the caller's worker. */
				hold(c, kind, what, &w);
				return r;
			}
		}
		/* The retry's clock starts at the first loss: a write that goes
		 * through pays one epoch read, not a retry's bookkeeping. */
		if (!begun) {
			unsigned seen = rt.seen;

			td_retry_begin(&rt, c, -1);
			rt.seen = seen;
			begun = true;
		}
		if (!td_retry_again(&rt, r, &left))
			return r;
		/* Lost before its effecting request went: nothing of it took effect. */
		if (!w.sent) {
			if (kind == TD_WRITE_DRAFT)
				return td_set_error(r,
						    "%s: %s; what it would publish was lost with "
						    "the connection",
						    what, lost);
			continue;
		}
		cur = td_client_latest(c);
		if (!w.lineage || cur->lineage != w.lineage) {
			/* Another lineage: the daemon started empty. */
			if (kind == TD_WRITE_PUT)
				continue;
			if (kind == TD_WRITE_UNLINK)
				return td_set_error(-ENOENT,
						    "%s: the daemon restarted empty (%s): "
						    "no such tensor any more",
						    what, lost);
			return td_set_error(r,
					    "%s: %s, and the daemon restarted empty: what it "
					    "would publish was lost",
					    what, lost);
		}
		r = resolve(cur, &w, &res);
		if (r < 0) {
			/* The Resolve's own connection went too: asked again after
			 * the next reconnect (never done again unasked), within the tries. */
			if (td_gone(c, r, rt.seen) && attempt + 2 < TD_WRITE_TRIES) {
				held = w;
				resume = true;
				continue;
			}
			return td_set_error(r,
					    "%s: its connection was lost (%s), and whether it "
					    "took effect is not known: %s",
					    what, lost, tensord_last_error());
		}
		if (r == 1) {
			/* It took effect: its reply, as it would have come. */
			if (ret_version) {
				ret_version->generation = res.generation;
				ret_version->commit = res.commit;
			}
			if (ret_commit)
				*ret_commit = res.commit;
			td_clear_error();
			return 0;
		}
		if (kind == TD_WRITE_DRAFT)
			return td_set_error(-ECONNRESET,
					    "%s: %s; it did not take effect, and what it would "
					    "publish was lost with the connection",
					    what, lost);
	}
}
