/*
 * Peering: one control connection's life once made (peer_int.h, struct
 * peer_conn): reading whole frames and handing them on by phase, writing
 * them, backpressure, the handshake's deadline and the heartbeats, and
 * closing.
 *
 * Each connection is a libuv TCP stream (peers pass no descriptors, so
 * libuv's own reads and writes serve, unlike the clients' sockets).
 * Either side closes at the first thing out of order: a frame whose
 * header is wrong or too long, one that does not decode, a frame its
 * phase does not expect (peer_handshake.c has the rest), a handshake that
 * takes over PEER_HANDSHAKE_MS. Those closes are logged with the address
 * and the reason, rate-limited (a stranger can cause them at will), and
 * counted (peer_auth_failures_total). The other side is told nothing:
 * the connection just ends.
 *
 * Once up, each side sends a heartbeat every PEER_HEARTBEAT_MS, and a
 * connection that brought nothing for PEER_HEARTBEAT_MISSES of them is
 * closed as lost (a peer killed or cut off without a FIN); TCP keepalive
 * is on as well.
 *
 * What this side sends a peer is bounded as a client's replies are (the
 * limits of conn.h): a peer that does not read makes this side stop
 * reading its requests once CONN_OUT_HIGH bytes are queued for it, and
 * lose the connection past CONN_OUT_MAX or after PEER_STALL_MS with
 * nothing taken. The clients' transport (conn.c) is not reused itself: it
 * is built around sendmsg() and descriptors on its own socket, where a
 * peer's is a libuv stream, so only its limits and its rule are shared.
 */
#include "peer_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "daemon/conn.h"
#include "daemon/base/log.h"
#include "daemon/figures.h"
#include "proto/peer.pb-c.h"
#include "daemon/base/ratelimit.h"
#include "daemon/base/clock.h"

struct peer_write {
	uv_write_t req;
	struct peer_conn *pc;
	size_t len;
	uint8_t buf[];
};

/* Who a connection is with, for the log: a peer's name, or the DNS name that gave its address. */
static const char *conn_who(const struct peer_conn *pc)
{
	if (pc->peer)
		return pc->peer->name;
	if (pc->target)
		return pc->target->dns->host;
	return "?";
}

/* --- connections: closing ------------------------------------------------------ */

static void pc_free(uv_handle_t *h)
{
	struct peer_conn *pc = h->data;

	if (--pc->open_handles == 0) {
		peer_auth_fini(&pc->auth);
		free(pc);
	}
}

void pc_close(struct peer_conn *pc, enum close_kind kind, const char *fmt, ...)
{
	struct peer_set *set = pc->set;
	struct peer *p = pc->peer;
	char reason[PEER_ERROR_MAX - 32];
	va_list ap;

	if (pc->closing)
		return;
	pc_check(pc);
	if (p)
		peer_check(p);
	pc->closing = true;
	if (pc->failed)
		LIST_REMOVE(pc, fail_link);
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (pc->counted_unauth) {
		set->n_unauth--;
		pc->counted_unauth = false;
	}
	if (kind == CLOSE_REFUSED) {
		set->auth_failures++;
		figure_count(FIG_peer_auth_failures_total, 1);
		log_limited(TD_LOG_WARN, LOG_KIND_PEER_REFUSED, NULL, NULL,
			    "peer connection %s %s%s%s: refused: %s", pc->dialler ? "to" : "from",
			    p || pc->target ? conn_who(pc) : "", p || pc->target ? " at " : "",
			    pc->addr, reason);
	} else if (kind == CLOSE_LOST) {
		log_at(p && p->up == pc ? TD_LOG_WARN : TD_LOG_INFO, "peer %s (%s): %s",
		       conn_who(pc), pc->addr, reason);
	} else {
		log_debug("peer %s (%s): closed: %s", conn_who(pc), pc->addr, reason);
	}
	if (p && p->up == pc) {
		assert(pc->phase == PC_UP && set->n_up > 0);
		p->up = NULL;
		set->n_up--;
		if (set->on_down)
			set->on_down(set->hooks_ctx, p, reason);
		if (kind != CLOSE_QUIET) {
			figure_count(FIG_peer_lost_total, 1);
			p->failures++;
			peer_mark_state(p, PEER_DOWN);
			snprintf(p->error, sizeof(p->error), "connection lost: %s", reason);
		}
		peer_redial_later(p);
		peer_targets_redial(p);
	} else if (p && p->dial == pc) {
		p->dial = NULL;
		if (kind != CLOSE_QUIET && !p->up) {
			p->failures++;
			peer_mark_state(p, kind == CLOSE_REFUSED ? PEER_REFUSED : PEER_DOWN);
			if (kind == CLOSE_REFUSED)
				snprintf(p->error, sizeof(p->error), "authentication failed: %s",
					 reason);
			else
				peer_mark_error(p, reason);
		}
		peer_redial_later(p);
	} else if (pc->target) {
		struct peer_target *t = pc->target;

		t->dial = NULL;
		pc->target = NULL;
		peer_target_redial_later(t);
	}
	assert(!pc->target && (!p || (p->up != pc && p->dial != pc)));
	LIST_REMOVE(pc, link);
	uv_timer_stop(&pc->timer);
	uv_close((uv_handle_t *)&pc->timer, pc_free);
	uv_close((uv_handle_t *)&pc->tcp, pc_free);
}

/*
 * A send to pc failed (why: a sentence fragment): it sends and reads
 * nothing more and is closed from the loop's check phase, after the
 * callback that is running returns. Closing it there, under the caller,
 * would run on_down, which frees the pulls, serves and watched names that
 * the caller (remote attach, inside a commit) may still be using.
 */
static void pc_reap(uv_check_t *h);
static void pc_reap_idle(uv_idle_t *h);

static void pc_fail(struct peer_conn *pc, const char *why)
{
	struct peer_set *set = pc->set;

	if (pc->closing || pc->failed)
		return;
	pc_check(pc);
	pc->failed = true;
	snprintf(pc->fail_why, sizeof(pc->fail_why), "%s", why);
	uv_read_stop((uv_stream_t *)&pc->tcp);
	LIST_INSERT_HEAD(&set->failed, pc, fail_link);
	if (!uv_is_active((uv_handle_t *)&set->reap)) {
		uv_check_start(&set->reap, pc_reap);
		uv_idle_start(&set->reap_idle, pc_reap_idle);
	}
}

static void pc_reap(uv_check_t *h)
{
	struct peer_set *set = h->data;
	struct peer_conn *pc;

	while ((pc = LIST_FIRST(&set->failed))) {
		assert(pc->failed && !pc->closing);
		pc_close(pc, CLOSE_LOST, "%s", pc->fail_why);
	}
	uv_check_stop(&set->reap);
	uv_idle_stop(&set->reap_idle);
}

static void pc_reap_idle(uv_idle_t *h)
{
	/* While active it keeps the loop from blocking in poll: reap runs this turn. */
}

/* --- connections: writing ------------------------------------------------------ */

static size_t pc_queued(struct peer_conn *pc)
{
	return uv_stream_get_write_queue_size((uv_stream_t *)&pc->tcp);
}

static void pc_resume(struct peer_conn *pc);

static void on_written(uv_write_t *req, int status)
{
	struct peer_write *w = (struct peer_write *)req;
	struct peer_conn *pc = w->pc;

	free(w);
	if (status < 0 && status != UV_ECANCELED && !pc->closing)
		pc_close(pc, CLOSE_LOST, "cannot send: %s", uv_strerror(status));
	if (pc->closing)
		return;
	pc->last_took_ns = now_ns();
	/*
	 * Its requests wait until half the queue has gone (not just under the
	 * mark, as a client's do): a peer's socket takes a write now and then
	 * while its reader lags, and each would resume and pause it again.
	 */
	if (pc->paused && pc_queued(pc) < CONN_OUT_HIGH / 2)
		pc_resume(pc);
}

/*
 * Over CONN_OUT_HIGH queued for pc: its requests are not read (each could
 * queue another reply) until it takes some of what it was sent.
 */
static void pc_pause(struct peer_conn *pc)
{
	struct peer *p = pc->peer;

	if (pc->paused || pc->phase != PC_UP)
		return;
	assert(!pc->closing && !pc->failed);
	pc->paused = true;
	pc->last_took_ns = now_ns();
	uv_read_stop((uv_stream_t *)&pc->tcp);
	log_info("peer %s (%s): %zu bytes queued for it, more than %u: its requests wait "
		 "until it reads",
		 p ? p->name : "?", pc->addr, pc_queued(pc), CONN_OUT_HIGH);
}

void pc_send(struct peer_conn *pc, const Tensord__PeerFrame *f)
{
	size_t n = tensord__peer_frame__get_packed_size(f);
	struct peer_write *w;
	char why[160];
	uv_buf_t b;
	int r;

	if (pc->closing || pc->failed)
		return;
	assert(pc->phase != PC_CONNECTING);
	if (pc_queued(pc) + TD_FRAME_HEADER + n > CONN_OUT_MAX) {
		snprintf(why, sizeof(why),
			 "it stopped reading: %zu bytes queued for it, a frame of %zu more would "
			 "pass %u",
			 pc_queued(pc), TD_FRAME_HEADER + n, CONN_OUT_MAX);
		pc_fail(pc, why);
		return;
	}
	w = malloc(sizeof(*w) + TD_FRAME_HEADER + n);
	if (!w) {
		snprintf(why, sizeof(why), "out of memory for a frame of %zu bytes", n);
		pc_fail(pc, why);
		return;
	}
	w->pc = pc;
	w->len = TD_FRAME_HEADER + n;
	td_frame_header(w->buf, (uint32_t)n, 0);
	tensord__peer_frame__pack(f, w->buf + TD_FRAME_HEADER);
	b = uv_buf_init((char *)w->buf, (unsigned)w->len);
	r = uv_write(&w->req, (uv_stream_t *)&pc->tcp, &b, 1, on_written);
	if (r < 0) {
		free(w);
		snprintf(why, sizeof(why), "cannot send: %s", uv_strerror(r));
		pc_fail(pc, why);
		return;
	}
	pc->tx += w->len;
	if (pc->peer)
		pc->peer->bytes_out += w->len;
	if (pc_queued(pc) >= CONN_OUT_HIGH)
		pc_pause(pc);
}

int peer_send(struct peer *p, const Tensord__PeerFrame *f)
{
	if (!p->up || p->up->closing || p->up->failed)
		return -ENOTCONN;
	peer_check(p);
	pc_send(p->up, f);
	return p->up->failed ? -ENOTCONN : 0;
}
static const char *body_name(Tensord__PeerFrame__BodyCase c)
{
	switch (c) {
	case TENSORD__PEER_FRAME__BODY_HELLO:
		return "a Hello";
	case TENSORD__PEER_FRAME__BODY_PROOF:
		return "a Proof";
	case TENSORD__PEER_FRAME__BODY_HEARTBEAT:
		return "a heartbeat";
	case TENSORD__PEER_FRAME__BODY_UCX:
		return "a UCX address";
	case TENSORD__PEER_FRAME__BODY_PULL:
		return "a Pull";
	case TENSORD__PEER_FRAME__BODY_PULL_REPLY:
		return "a PullReply";
	case TENSORD__PEER_FRAME__BODY_PULL_GO:
		return "a PullGo";
	case TENSORD__PEER_FRAME__BODY_PULL_DONE:
		return "a PullDone";
	default:
		return "a frame of no known kind";
	}
}

/* One whole frame's payload. */
static void on_frame(struct peer_conn *pc, const uint8_t *payload, size_t len)
{
	Tensord__PeerFrame *f = tensord__peer_frame__unpack(NULL, len, payload);
	Tensord__PeerFrame__BodyCase c;

	if (!f) {
		pc_close(pc, pc->phase == PC_UP ? CLOSE_LOST : CLOSE_REFUSED,
			 "a frame of %zu bytes that does not decode", len);
		return;
	}
	c = f->body_case;
	pc_check(pc);
	pc->last_rx_ns = now_ns();
	if (pc->phase == PC_HELLO && c == TENSORD__PEER_FRAME__BODY_HELLO)
		pc_on_hello(pc, f->hello);
	else if (pc->phase == PC_PROOF && c == TENSORD__PEER_FRAME__BODY_PROOF)
		pc_on_proof(pc, f->proof);
	else if (pc->phase == PC_UP && c == TENSORD__PEER_FRAME__BODY_HEARTBEAT)
		; /* last_rx_ns is all it is for */
	else if (pc->phase == PC_UP && c > TENSORD__PEER_FRAME__BODY_HEARTBEAT &&
		 pc->peer->up == pc && pc->set->on_frame) {
		char why[PEER_ERROR_MAX - 64];

		if (pc->set->on_frame(pc->set->hooks_ctx, pc->peer, f, why, sizeof(why)) < 0)
			pc_close(pc, CLOSE_LOST, "%s: %s", body_name(c), why);
	} else if (pc->phase == PC_UP)
		pc_close(pc, CLOSE_LOST, "%s after the handshake", body_name(c));
	else
		pc_close(pc, CLOSE_REFUSED, "%s when %s was due", body_name(c),
			 pc->phase == PC_HELLO ? "a Hello" : "a Proof");
	tensord__peer_frame__free_unpacked(f, NULL);
}

/* --- connections: reading ------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct peer_conn *pc = h->data;

	*buf = uv_buf_init((char *)pc->in + pc->in_len, (unsigned)(sizeof(pc->in) - pc->in_len));
}

/* Handles the whole frames read, unless reading is paused (they wait in pc->in). */
static void pc_parse(struct peer_conn *pc)
{
	enum close_kind lost = pc->phase == PC_UP ? CLOSE_LOST : CLOSE_REFUSED;
	struct td_frame fr;
	long got;

	while (!pc->closing && !pc->failed && !pc->paused &&
	       (got = td_frame_parse(pc->in, pc->in_len, PEER_FRAME_MAX, 0, &fr))) {
		if (got < 0) {
			if (got == -EMSGSIZE)
				pc_close(pc, lost, "a frame of %u bytes, more than %u", fr.len,
					 PEER_FRAME_MAX);
			else if (got == -EPROTO)
				pc_close(pc, lost,
					 "a frame header of version %u (not a tensord "
					 "peer?)",
					 fr.version);
			else
				pc_close(pc, lost, "a frame header counting descriptors");
			return;
		}
		on_frame(pc, fr.payload, fr.len);
		if (pc->closing || pc->failed)
			return;
		pc->in_len -= (size_t)got;
		memmove(pc->in, pc->in + got, pc->in_len);
	}
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

/* pc took enough of its queue: the requests read meanwhile, then reading again. */
static void pc_resume(struct peer_conn *pc)
{
	int r;

	pc->paused = false;
	/* Its heartbeats sat unread while paused: its silence counts from now. */
	pc->last_rx_ns = now_ns();
	log_debug("peer %s (%s): reading its requests again (%zu bytes queued for it)",
		  pc->peer ? pc->peer->name : "?", pc->addr, pc_queued(pc));
	pc_parse(pc);
	if (pc->closing || pc->failed || pc->paused)
		return;
	r = uv_read_start((uv_stream_t *)&pc->tcp, on_alloc, on_read);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot read: %s", uv_strerror(r));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct peer_conn *pc = s->data;
	enum close_kind lost = pc->phase == PC_UP ? CLOSE_LOST : CLOSE_REFUSED;

	if (n == 0 || pc->closing || pc->failed)
		return;
	if (n < 0) {
		if (n == UV_EOF && pc->in_len)
			pc_close(pc, lost,
				 "it closed the connection in the middle of a frame "
				 "(%zu bytes of it came)",
				 pc->in_len);
		else if (n == UV_EOF)
			pc_close(pc, lost, "it closed the connection%s",
				 pc->phase == PC_UP ? "" : " during the handshake");
		else
			pc_close(pc, lost, "%s", uv_strerror((int)n));
		return;
	}
	pc->in_len += (size_t)n;
	pc->rx += (uint64_t)n;
	if (pc->peer)
		pc->peer->bytes_in += (uint64_t)n;
	pc_parse(pc);
}

/* --- connections: timers, a new one ------------------------------------------ */

static void on_timer(uv_timer_t *t)
{
	struct peer_conn *pc = t->data;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerHeartbeat hb = TENSORD__PEER_HEARTBEAT__INIT;

	assert(!pc->closing);
	pc_check(pc);

	if (pc->phase != PC_UP) {
		pc_close(pc, pc->phase == PC_CONNECTING ? CLOSE_LOST : CLOSE_REFUSED,
			 "no %s within %d ms",
			 pc->phase == PC_CONNECTING ? "connection" : "completed handshake",
			 PEER_HANDSHAKE_MS);
		return;
	}
	if (pc->paused && now_ns() - pc->last_took_ns > (uint64_t)PEER_STALL_MS * 1000000ull) {
		pc_close(pc, CLOSE_LOST,
			 "it stopped reading: %zu bytes queued for it and none taken for %d ms",
			 pc_queued(pc), PEER_STALL_MS);
		return;
	}
	if (!pc->paused && now_ns() - pc->last_rx_ns > (uint64_t)PEER_HEARTBEAT_MISSES *
							       PEER_HEARTBEAT_MS * 1000000ull) {
		pc_close(pc, CLOSE_LOST, "no heartbeat for %d ms",
			 PEER_HEARTBEAT_MISSES * PEER_HEARTBEAT_MS);
		return;
	}
	hb.seq = ++pc->hb_seq;
	f.body_case = TENSORD__PEER_FRAME__BODY_HEARTBEAT;
	f.heartbeat = &hb;
	pc_send(pc, &f);
}

struct peer_conn *pc_new(struct peer_set *set, bool dialler)
{
	struct peer_conn *pc = calloc(1, sizeof(*pc));

	if (!pc)
		return NULL;
	pc->set = set;
	pc->id = ++set->next_conn_id;
	pc->dialler = dialler;
	uv_tcp_init(set->loop, &pc->tcp);
	uv_timer_init(set->loop, &pc->timer);
	pc->tcp.data = pc->timer.data = pc;
	pc->open_handles = 2;
	pc->counted_unauth = true;
	set->n_unauth++;
	LIST_INSERT_HEAD(&set->conns, pc, link);
	uv_timer_start(&pc->timer, on_timer, PEER_HANDSHAKE_MS, 0);
	return pc;
}

void pc_heartbeats_start(struct peer_conn *pc)
{
	assert(pc->phase == PC_UP && !pc->closing);
	uv_timer_start(&pc->timer, on_timer, PEER_HEARTBEAT_MS, PEER_HEARTBEAT_MS);
}

void pc_start_reading(struct peer_conn *pc)
{
	int r;

	uv_tcp_nodelay(&pc->tcp, 1);
	uv_tcp_keepalive(&pc->tcp, 1, 10);
	r = uv_read_start((uv_stream_t *)&pc->tcp, on_alloc, on_read);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot read: %s", uv_strerror(r));
}
