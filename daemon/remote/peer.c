/*
 * Peering: the control connections to other nodes' daemons (peer.h).
 *
 * Each connection is a libuv TCP stream (peers pass no descriptors, so
 * libuv's own reads and writes serve, unlike the clients' sockets). Its
 * life: the dialler connects and sends its Hello; the listener answers
 * with its Hello and proof; the dialler checks that proof and sends its
 * own; the listener checks it. Either side closes at the first thing out
 * of order: a frame whose header is wrong or too long, one that does not
 * decode, anything but a Hello first, a second Hello, a wrong proof, a
 * name that is this node's own, a handshake that takes over
 * PEER_HANDSHAKE_MS. Those closes are logged with the address and the
 * reason, rate-limited (a stranger can cause them at will), and counted
 * (peer_auth_failures_total). The other side is told nothing: the
 * connection just ends.
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
 *
 * The --peers-dns names and their addresses are peer_dns.c's (peer_int.h);
 * it dials them with peer_conn_dial_target().
 */
#include "peer_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <tensord/tensord.h>

#include "daemon/conn.h"
#include "daemon/base/log.h"
#include "daemon/figures.h"
#include "proto/frame.h"
#include "proto/peer.pb-c.h"
#include "daemon/base/ratelimit.h"
#include "daemon/server.h"

/* The peer protocol's version, in each Hello. */
#define PEER_PROTOCOL 1

enum pc_phase {
	PC_CONNECTING, /* dialler: TCP connect under way */
	PC_HELLO,      /* waiting for the other side's Hello */
	PC_PROOF,      /* listener: waiting for the dialler's Proof */
	PC_UP,
};

struct peer_conn {
	struct peer_set *set;
	struct peer *peer; /* the dialled peer; for an accepted one, set once it authenticated */
	struct peer_target *target; /* a dial of a --peers-dns address, until it authenticated */
	uint64_t id;
	bool dialler;
	bool closing;
	bool failed;         /* a send failed: closed from the set's reap (pc_fail()) */
	bool counted_unauth; /* counted in set->n_unauth */
	enum pc_phase phase;
	uv_tcp_t tcp;
	uv_connect_t connect_req;
	uv_timer_t timer; /* the handshake's deadline, then the heartbeat */
	int open_handles; /* freed when both are closed */
	struct peer_auth auth;
	uint64_t other_instance;
	uint64_t last_rx_ns, hb_seq;
	bool paused;           /* reading stopped: over CONN_OUT_HIGH queued for it */
	uint64_t last_took_ns; /* a write of ours completed (the peer is taking them) */
	uint64_t rx, tx;       /* bytes, before it is known whose connection it is included */
	char addr[PEER_ADDR_MAX];
	size_t in_len;
	uint8_t in[TD_FRAME_HEADER + PEER_FRAME_MAX];
	LIST_ENTRY(peer_conn) link;
	LIST_ENTRY(peer_conn) fail_link; /* set->failed, while failed */
	char fail_why[160];
};

struct peer_write {
	uv_write_t req;
	struct peer_conn *pc;
	size_t len;
	uint8_t buf[];
};

const char *peer_state_name(enum peer_state s)
{
	switch (s) {
	case PEER_CONNECTING:
		return "connecting";
	case PEER_AUTHENTICATING:
		return "authenticating";
	case PEER_UP:
		return "up";
	case PEER_DOWN:
		return "down";
	case PEER_REFUSED:
		return "refused";
	}
	return "?";
}

static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void set_state(struct peer *p, enum peer_state s)
{
	if (p->state != s)
		p->since_ns = wall_ns();
	p->state = s;
}

static void set_error(struct peer *p, const char *reason)
{
	snprintf(p->error, sizeof(p->error), "%s", reason);
}

/* --- peers ------------------------------------------------------------------- */

static void on_redial(uv_timer_t *t);

static struct peer *peer_find(struct peer_set *set, const char *name)
{
	for (unsigned i = 0; i < set->n_peers; i++)
		if (strcmp(set->peers[i]->name, name) == 0)
			return set->peers[i];
	return NULL;
}

static struct peer *peer_add(struct peer_set *set, const char *name)
{
	struct peer *p;

	if (set->n_peers == PEER_KNOWN_MAX)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->set = set;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->state = PEER_DOWN;
	p->since_ns = wall_ns();
	p->backoff_ms = PEER_REDIAL_MIN_MS;
	uv_timer_init(set->loop, &p->redial);
	p->redial.data = p;
	set->peers[set->n_peers++] = p;
	return p;
}

/* A configured peer is dialled again after its back-off, which then doubles. */
static void schedule_redial(struct peer *p)
{
	if (!p->configured || p->set->stopping || p->up || p->dial || p->resolving)
		return;
	uv_timer_start(&p->redial, on_redial, p->backoff_ms, 0);
	p->backoff_ms =
		p->backoff_ms >= PEER_REDIAL_MAX_MS / 2 ? PEER_REDIAL_MAX_MS : p->backoff_ms * 2;
}

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

enum close_kind {
	CLOSE_REFUSED, /* the handshake failed: counted, rate-limited warning */
	CLOSE_LOST,    /* a dial that failed, or an up connection that ended */
	CLOSE_QUIET,   /* a duplicate, or the daemon stopping */
};

/*
 * Closes pc for reason (a sentence fragment: "wrong proof"), and says so
 * in the log and, where this node knows whose connection it was, on the
 * peer. Safe to call twice; pc is freed once its handles have closed.
 */
static void __attribute__((format(printf, 3, 4)))
pc_close(struct peer_conn *pc, enum close_kind kind, const char *fmt, ...)
{
	struct peer_set *set = pc->set;
	struct peer *p = pc->peer;
	char reason[PEER_ERROR_MAX - 32];
	va_list ap;

	if (pc->closing)
		return;
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
		p->up = NULL;
		set->n_up--;
		if (set->on_down)
			set->on_down(set->hooks_ctx, p, reason);
		if (kind != CLOSE_QUIET) {
			figure_count(FIG_peer_lost_total, 1);
			p->failures++;
			set_state(p, PEER_DOWN);
			snprintf(p->error, sizeof(p->error), "connection lost: %s", reason);
		}
		schedule_redial(p);
		peer_targets_redial(p);
	} else if (p && p->dial == pc) {
		p->dial = NULL;
		if (kind != CLOSE_QUIET && !p->up) {
			p->failures++;
			set_state(p, kind == CLOSE_REFUSED ? PEER_REFUSED : PEER_DOWN);
			if (kind == CLOSE_REFUSED)
				snprintf(p->error, sizeof(p->error), "authentication failed: %s",
					 reason);
			else
				set_error(p, reason);
		}
		schedule_redial(p);
	} else if (pc->target) {
		struct peer_target *t = pc->target;

		t->dial = NULL;
		pc->target = NULL;
		peer_target_redial_later(t);
	}
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

	while ((pc = LIST_FIRST(&set->failed)))
		pc_close(pc, CLOSE_LOST, "%s", pc->fail_why);
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
	pc->paused = true;
	pc->last_took_ns = now_ns();
	uv_read_stop((uv_stream_t *)&pc->tcp);
	log_info("peer %s (%s): %zu bytes queued for it, more than %u: its requests wait "
		 "until it reads",
		 p ? p->name : "?", pc->addr, pc_queued(pc), CONN_OUT_HIGH);
}

/* Sends one frame; on failure pc fails (pc_fail()): closed soon, not now. */
static void pc_send(struct peer_conn *pc, const Tensord__PeerFrame *f)
{
	size_t n = tensord__peer_frame__get_packed_size(f);
	struct peer_write *w;
	char why[160];
	uv_buf_t b;
	int r;

	if (pc->closing || pc->failed)
		return;
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
	pc_send(p->up, f);
	return p->up->failed ? -ENOTCONN : 0;
}

struct peer *peer_lookup(struct peer_set *set, const char *name)
{
	return peer_find(set, name);
}

static void send_hello(struct peer_conn *pc, const uint8_t *proof)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerHello h = TENSORD__PEER_HELLO__INIT;

	h.version = PEER_PROTOCOL;
	h.name = pc->set->self;
	h.instance = pc->set->instance;
	h.nonce.data = (uint8_t *)peer_auth_nonce(&pc->auth);
	h.nonce.len = PEER_AUTH_NONCE_LEN;
	if (proof) {
		h.proof.data = (uint8_t *)proof;
		h.proof.len = PEER_AUTH_MAC_LEN;
	}
	f.body_case = TENSORD__PEER_FRAME__BODY_HELLO;
	f.hello = &h;
	pc_send(pc, &f);
}

/* --- connections: the handshake ------------------------------------------------ */

static void on_timer(uv_timer_t *t);

/*
 * pc has authenticated: it becomes its peer's connection, unless the peer
 * has one already, in which case the one dialled by the node with the
 * smaller name survives (both sides pick the same one).
 */
static void pc_up(struct peer_conn *pc, const char *name)
{
	struct peer_set *set = pc->set;
	struct peer *p = pc->peer ? pc->peer : peer_find(set, name);
	bool keep_dialled;

	if (!p)
		p = peer_add(set, name);
	if (!p) {
		pc_close(pc, CLOSE_QUIET, "too many peers (%d)", PEER_KNOWN_MAX);
		return;
	}
	if (pc->target) { /* a --peers-dns address: the node there is p */
		pc->target->peer = p;
		pc->target->dial = NULL;
		pc->target->backoff_ms = PEER_REDIAL_MIN_MS;
		pc->target = NULL;
	}
	if (!pc->peer) { /* accepted or found by DNS: its handshake's bytes count from now */
		p->bytes_in += pc->rx;
		p->bytes_out += pc->tx;
	}
	pc->peer = p;
	if (pc->counted_unauth) {
		set->n_unauth--;
		pc->counted_unauth = false;
	}
	if (p->up) {
		keep_dialled = strcmp(set->self, p->name) < 0;
		if (pc->dialler != keep_dialled) {
			if (p->dial == pc)
				p->dial = NULL;
			pc_close(pc, CLOSE_QUIET,
				 "a second connection; keeping the one dialled by %s",
				 keep_dialled ? set->self : p->name);
			return;
		}
		pc_close(p->up, CLOSE_QUIET, "a second connection; keeping the one dialled by %s",
			 keep_dialled ? set->self : p->name);
	}
	if (p->dial == pc)
		p->dial = NULL;
	if (p->instance && p->instance != pc->other_instance)
		log_info("peer %s: a new instance (%016" PRIx64 ", was %016" PRIx64
			 "): the daemon restarted",
			 p->name, pc->other_instance, p->instance);
	p->instance = pc->other_instance;
	p->up = pc;
	p->up_dialled = pc->dialler;
	p->connects++;
	figure_count(FIG_peer_connects_total, 1);
	p->backoff_ms = PEER_REDIAL_MIN_MS;
	if (!p->configured) /* a configured one shows what it is dialled at */
		snprintf(p->addr, sizeof(p->addr), "%s", pc->addr);
	uv_timer_stop(&p->redial);
	set_state(p, PEER_UP);
	set->n_up++;
	pc->phase = PC_UP;
	pc->last_rx_ns = now_ns();
	uv_timer_start(&pc->timer, on_timer, PEER_HEARTBEAT_MS, PEER_HEARTBEAT_MS);
	log_info("peer %s: up (%s, %s, instance %016" PRIx64 ")", p->name, pc->addr,
		 pc->dialler ? "dialled" : "accepted", p->instance);
	if (set->on_up)
		set->on_up(set->hooks_ctx, p);
}

static void sockaddr_text(const struct sockaddr *sa, char *out, size_t len);

/*
 * sa as text, an IPv4-mapped IPv6 address as the IPv4 one: a listener on
 * [::] sees an IPv4 dialler as ::ffff:a.b.c.d, the dialler itself as
 * a.b.c.d.
 */
void peer_sockaddr_text_plain(const struct sockaddr *sa, char *out, size_t len)
{
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
	struct sockaddr_in s4 = { .sin_family = AF_INET };

	if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
		s4.sin_port = s6->sin6_port;
		memcpy(&s4.sin_addr, &s6->sin6_addr.s6_addr[12], 4);
		sa = (const struct sockaddr *)&s4;
	}
	sockaddr_text(sa, out, len);
}

/* pc's address at the end named (getsockname when local, else getpeername), as plain text. */
static bool conn_end_text(struct peer_conn *pc, bool local, char *out, size_t len)
{
	struct sockaddr_storage ss;
	int n = sizeof(ss);
	int r = local ? uv_tcp_getsockname(&pc->tcp, (struct sockaddr *)&ss, &n)
		      : uv_tcp_getpeername(&pc->tcp, (struct sockaddr *)&ss, &n);

	if (r < 0)
		return false;
	peer_sockaddr_text_plain((struct sockaddr *)&ss, out, len);
	return true;
}

/*
 * A Hello with this node's name and this very instance: this daemon has
 * dialled itself (a --peers-dns name whose answer includes its own
 * address, or a --peer naming it). The dial is among this daemon's own
 * connections: the one whose local address is where pc came from. Both
 * are ended; a --peers-dns address is marked as this daemon's and never
 * dialled again; a --peer shows why it is refused. false when no such dial
 * is here: then the Hello is someone else's claiming this node's name
 * (the instance is no secret), refused as any other.
 */
static bool self_dial_found(struct peer_conn *pc)
{
	char from[PEER_ADDR_MAX], local[PEER_ADDR_MAX];
	struct peer_conn *d;

	if (!conn_end_text(pc, false, from, sizeof(from)))
		return false;
	LIST_FOREACH(d, &pc->set->conns, link)
	{
		if (d->dialler && !d->closing && d->phase == PC_HELLO &&
		    conn_end_text(d, true, local, sizeof(local)) && strcmp(from, local) == 0)
			break;
	}
	if (!d)
		return false;
	if (d->target) {
		d->target->self = true;
		log_info("--peers-dns %s: %s is this daemon itself: not dialled again",
			 d->target->dns->host, d->target->addr);
		pc_close(d, CLOSE_QUIET, "it is this daemon itself");
	} else {
		pc_close(d, CLOSE_REFUSED, "%s is this daemon itself", d->addr);
	}
	pc_close(pc, CLOSE_QUIET, "this daemon dialled itself");
	return true;
}

/* Why set_peer refused a Hello's name or nonce. */
static const char *hello_refusal(int r)
{
	return r == -ELOOP    ? "its Hello names this node itself"
	       : r == -EINVAL ? "its Hello's node name is not 1-63 bytes of [A-Za-z0-9._-]"
			      : "its Hello's nonce is not 32 bytes";
}

/* Starts one side's handshake with the secrets in use. */
static int auth_start(struct peer_set *set, struct peer_auth *a, enum peer_auth_role role)
{
	int r = peer_auth_init(a, role, set->self, set->secret, set->secret_len);

	if (r == 0 && set->also_len)
		r = peer_auth_also_accept(a, set->also, set->also_len);
	return r;
}

static void on_hello(struct peer_conn *pc, const Tensord__PeerHello *h)
{
	uint8_t proof[PEER_AUTH_MAC_LEN];
	size_t name_len = strlen(h->name);
	int r;

	if (h->version != PEER_PROTOCOL) {
		pc_close(pc, CLOSE_REFUSED, "peer protocol %u, this node speaks %d", h->version,
			 PEER_PROTOCOL);
		return;
	}
	if (!pc->dialler && h->instance == pc->set->instance &&
	    strcmp(h->name, pc->set->self) == 0 && self_dial_found(pc))
		return;
	if (!pc->dialler) {
		r = auth_start(pc->set, &pc->auth, PEER_AUTH_LISTENER);
		if (r < 0) {
			pc_close(pc, CLOSE_QUIET, "cannot start the handshake: %s", strerror(-r));
			return;
		}
	}
	r = peer_auth_set_peer(&pc->auth, h->name, name_len, h->nonce.data, h->nonce.len);
	if (r < 0) {
		pc_close(pc, CLOSE_REFUSED, "%s", hello_refusal(r));
		return;
	}
	pc->other_instance = h->instance;
	if (pc->dialler) {
		if (pc->peer && strcmp(h->name, pc->peer->name) != 0) {
			pc_close(pc, CLOSE_REFUSED, "it answered as node '%s', not '%s'", h->name,
				 pc->peer->name);
			return;
		}
		r = peer_auth_verify(&pc->auth, h->proof.data, h->proof.len);
		if (r < 0) {
			pc_close(pc, CLOSE_REFUSED, "%s",
				 r == -EACCES   ? "its proof is wrong (not the same secret?)"
				 : r == -EPROTO ? "its Hello carries no proof of 32 bytes"
						: "cannot compute the proof");
			return;
		}
		if (peer_auth_prove(&pc->auth, proof) < 0) {
			pc_close(pc, CLOSE_QUIET, "cannot compute the proof");
			return;
		}
		{
			Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
			Tensord__PeerProof pf = TENSORD__PEER_PROOF__INIT;

			pf.proof.data = proof;
			pf.proof.len = sizeof(proof);
			f.body_case = TENSORD__PEER_FRAME__BODY_PROOF;
			f.proof = &pf;
			pc_send(pc, &f);
		}
		if (!pc->closing)
			pc_up(pc, h->name);
		return;
	}
	if (h->proof.len) {
		pc_close(pc, CLOSE_REFUSED, "the dialler's Hello carries a proof");
		return;
	}
	if (peer_auth_prove(&pc->auth, proof) < 0) {
		pc_close(pc, CLOSE_QUIET, "cannot compute the proof");
		return;
	}
	send_hello(pc, proof);
	pc->phase = PC_PROOF;
}

static void on_proof(struct peer_conn *pc, const Tensord__PeerProof *m)
{
	int r = peer_auth_verify(&pc->auth, m->proof.data, m->proof.len);

	if (r < 0) {
		pc_close(pc, CLOSE_REFUSED, "%s",
			 r == -EACCES ? "its proof is wrong (not the same secret?)"
				      : "its proof is not 32 bytes");
		return;
	}
	pc_up(pc, pc->auth.other);
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
	pc->last_rx_ns = now_ns();
	if (pc->phase == PC_HELLO && c == TENSORD__PEER_FRAME__BODY_HELLO)
		on_hello(pc, f->hello);
	else if (pc->phase == PC_PROOF && c == TENSORD__PEER_FRAME__BODY_PROOF)
		on_proof(pc, f->proof);
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

/* --- connections: timers, making them ------------------------------------------ */

static void on_timer(uv_timer_t *t)
{
	struct peer_conn *pc = t->data;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerHeartbeat hb = TENSORD__PEER_HEARTBEAT__INIT;

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

static struct peer_conn *pc_new(struct peer_set *set, bool dialler)
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

static void sockaddr_text(const struct sockaddr *sa, char *out, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

		uv_ip6_name(s6, ip, sizeof(ip));
		snprintf(out, len, "[%s]:%u", ip, ntohs(s6->sin6_port));
	} else if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;

		uv_ip4_name(s4, ip, sizeof(ip));
		snprintf(out, len, "%s:%u", ip, ntohs(s4->sin_port));
	} else {
		snprintf(out, len, "?");
	}
}

static void start_reading(struct peer_conn *pc)
{
	int r;

	uv_tcp_nodelay(&pc->tcp, 1);
	uv_tcp_keepalive(&pc->tcp, 1, 10);
	r = uv_read_start((uv_stream_t *)&pc->tcp, on_alloc, on_read);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot read: %s", uv_strerror(r));
}

static void on_connected(uv_connect_t *req, int status)
{
	struct peer_conn *pc = req->data;
	int r;

	if (pc->closing)
		return;
	if (status < 0) {
		pc_close(pc, CLOSE_LOST, "cannot connect to %s: %s", pc->addr, uv_strerror(status));
		return;
	}
	r = auth_start(pc->set, &pc->auth, PEER_AUTH_DIALLER);
	if (r < 0) {
		pc_close(pc, CLOSE_LOST, "cannot start the handshake: %s", strerror(-r));
		return;
	}
	pc->phase = PC_HELLO;
	/* It may have come up meanwhile, over a connection it dialled. */
	if (pc->peer && !pc->peer->up)
		set_state(pc->peer, PEER_AUTHENTICATING);
	start_reading(pc);
	send_hello(pc, NULL);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *ai)
{
	struct peer *p = req->data;
	struct peer_set *set = p->set;
	struct peer_conn *pc;
	int r;

	p->resolving = false;
	if (set->stopping || p->up) {
		uv_freeaddrinfo(ai);
		return;
	}
	if (status < 0 || !ai) {
		p->failures++;
		set_state(p, PEER_DOWN);
		snprintf(p->error, sizeof(p->error), "cannot resolve %.200s: %s", p->host,
			 uv_strerror(status));
		log_limited(TD_LOG_WARN, LOG_KIND_PEER_REFUSED, NULL, NULL, "peer %s: %s", p->name,
			    p->error);
		uv_freeaddrinfo(ai);
		schedule_redial(p);
		return;
	}
	pc = pc_new(set, true);
	if (!pc) {
		uv_freeaddrinfo(ai);
		set_error(p, "out of memory");
		schedule_redial(p);
		return;
	}
	pc->peer = p;
	p->dial = pc;
	sockaddr_text(ai->ai_addr, pc->addr, sizeof(pc->addr));
	pc->connect_req.data = pc;
	r = uv_tcp_connect(&pc->connect_req, &pc->tcp, ai->ai_addr, on_connected);
	uv_freeaddrinfo(ai);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot connect to %s: %s", pc->addr, uv_strerror(r));
}

static void peer_dial(struct peer *p)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	char port[8];
	int r;

	if (p->set->stopping || p->up || p->dial || p->resolving)
		return;
	set_state(p, PEER_CONNECTING);
	snprintf(port, sizeof(port), "%u", p->port);
	p->gai.data = p;
	/* Resolved again at each dial: a peer's DNS name may move. */
	r = uv_getaddrinfo(p->set->loop, &p->gai, on_resolved, p->host, port, &hints);
	if (r < 0) {
		set_state(p, PEER_DOWN);
		snprintf(p->error, sizeof(p->error), "cannot resolve %.200s: %s", p->host,
			 uv_strerror(r));
		schedule_redial(p);
		return;
	}
	p->resolving = true;
}

static void on_redial(uv_timer_t *t)
{
	peer_dial(t->data);
}

int peer_conn_dial_target(struct peer_target *t)
{
	struct peer_conn *pc = pc_new(t->dns->set, true);
	int r;

	if (!pc)
		return -ENOMEM;
	pc->target = t;
	t->dial = pc;
	snprintf(pc->addr, sizeof(pc->addr), "%s", t->addr);
	pc->connect_req.data = pc;
	r = uv_tcp_connect(&pc->connect_req, &pc->tcp, (const struct sockaddr *)&t->sa,
			   on_connected);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot connect to %s: %s", pc->addr, uv_strerror(r));
	return 0;
}

void peer_conn_forget_target(struct peer_conn *pc)
{
	pc->target = NULL;
}

static void on_connection(uv_stream_t *server, int status)
{
	struct peer_set *set = server->data;
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	struct peer_conn *pc;

	if (status < 0 || set->stopping)
		return;
	pc = pc_new(set, false);
	if (!pc) {
		uv_tcp_t *t = malloc(sizeof(*t));

		/* Take it off the backlog and close it, or the loop spins on it. */
		if (t && uv_tcp_init(set->loop, t) == 0) {
			if (uv_accept(server, (uv_stream_t *)t) == 0)
				log_warn("peer connection refused: out of memory");
			uv_close((uv_handle_t *)t, (uv_close_cb)free);
		} else {
			free(t);
		}
		return;
	}
	if (uv_accept(server, (uv_stream_t *)&pc->tcp) < 0) {
		pc_close(pc, CLOSE_QUIET, "accept failed");
		return;
	}
	if (uv_tcp_getpeername(&pc->tcp, (struct sockaddr *)&ss, &len) == 0)
		sockaddr_text((struct sockaddr *)&ss, pc->addr, sizeof(pc->addr));
	else
		snprintf(pc->addr, sizeof(pc->addr), "?");
	if (set->n_unauth > PEER_UNAUTH_MAX) {
		pc_close(pc, CLOSE_REFUSED, "%d connections are authenticating already",
			 PEER_UNAUTH_MAX);
		return;
	}
	pc->phase = PC_HELLO;
	start_reading(pc);
}

/* --- the set ------------------------------------------------------------------- */

static int start_listener(struct peer_set *set, const struct peer_config *cfg, char *why,
			  size_t why_len)
{
	const char *host = cfg->listen_host;
	struct sockaddr_storage ss;
	int r;

	if (!host[0])
		r = uv_ip6_addr("::", cfg->listen_port, (struct sockaddr_in6 *)&ss);
	else if (strchr(host, ':'))
		r = uv_ip6_addr(host, cfg->listen_port, (struct sockaddr_in6 *)&ss);
	else
		r = uv_ip4_addr(host, cfg->listen_port, (struct sockaddr_in *)&ss);
	if (r < 0) {
		snprintf(why, why_len, "--peer-listen %s: '%s' is not an IP address", cfg->listen,
			 host);
		return -EINVAL;
	}
	uv_tcp_init(set->loop, &set->listener);
	set->listener.data = set;
	set->listening = true;
	r = uv_tcp_bind(&set->listener, (struct sockaddr *)&ss, 0);
	if (r == 0)
		r = uv_listen((uv_stream_t *)&set->listener, 64, on_connection);
	if (r < 0) {
		snprintf(why, why_len, "--peer-listen %s: cannot listen: %s", cfg->listen,
			 uv_strerror(r));
		return r;
	}
	snprintf(set->listen_addr, sizeof(set->listen_addr), "%s", cfg->listen);
	return 0;
}

/* The secret file into set->secret (and set->also); on failure set is unchanged. */
static int secrets_load(struct peer_set *set, char *why, size_t why_len)
{
	uint8_t buf[PEER_SECRET_MAX];
	const uint8_t *also;
	size_t len, first, also_len;
	int r;

	r = peer_secret_load(set->secret_file, buf, sizeof(buf), &len, why, why_len);
	if (r == 0)
		r = peer_secret_split(set->secret_file, buf, len, &first, &also, &also_len, why,
				      why_len);
	if (r == 0) {
		memcpy(set->secret, buf, first);
		set->secret_len = first;
		explicit_bzero(set->also, sizeof(set->also));
		memcpy(set->also, also ? also : buf, also_len);
		set->also_len = also_len;
	}
	explicit_bzero(buf, sizeof(buf));
	return r;
}

int peer_set_reload_secret(struct peer_set *set, char *why, size_t why_len)
{
	int r;

	if (!set->on)
		return 0;
	r = secrets_load(set, why, why_len);
	if (r == 0)
		log_info("peer secret file %s read again: %s", set->secret_file,
			 set->also_len ? "two secrets (proving with the first, accepting both)"
				       : "one secret");
	return r;
}

int peer_set_start(struct peer_set *set, uv_loop_t *loop, const struct peer_config *cfg, char *why,
		   size_t why_len)
{
	int r;

	LIST_INIT(&set->conns);
	LIST_INIT(&set->failed);
	set->loop = loop;
	uv_check_init(loop, &set->reap);
	set->reap.data = set;
	uv_idle_init(loop, &set->reap_idle);
	set->reap_idle.data = set;
	if (!peer_config_on(cfg)) {
		if (cfg->secret_file)
			log_warn(
				"--peer-secret-file %s: not read, ignoring: peering is off without "
				"--peer-listen, --peer or --peers-dns",
				cfg->secret_file);
		return 0;
	}
	if (!cfg->secret_file) {
		snprintf(why, why_len,
			 "--peer-secret-file is required with --peer-listen, --peer and "
			 "--peers-dns");
		return -EINVAL;
	}
	snprintf(set->secret_file, sizeof(set->secret_file), "%s", cfg->secret_file);
	r = secrets_load(set, why, why_len);
	if (r < 0)
		return r;
	set->on = true;
	snprintf(set->self, sizeof(set->self), "%s", cfg->node_name);
	if (getrandom(&set->instance, sizeof(set->instance), 0) != sizeof(set->instance))
		set->instance = wall_ns() ^ ((uint64_t)getpid() << 32);
	for (unsigned i = 0; i < cfg->n_peers; i++) {
		struct peer *p = peer_add(set, cfg->peers[i].name);

		if (!p) {
			snprintf(why, why_len, "out of memory");
			return -ENOMEM;
		}
		p->configured = true;
		snprintf(p->host, sizeof(p->host), "%s", cfg->peers[i].host);
		p->port = cfg->peers[i].port;
		snprintf(p->addr, sizeof(p->addr), "%s%s%s:%u", strchr(p->host, ':') ? "[" : "",
			 p->host, strchr(p->host, ':') ? "]" : "", p->port);
	}
	if (cfg->listen) {
		r = start_listener(set, cfg, why, why_len);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < set->n_peers; i++)
		peer_dial(set->peers[i]);
	peer_dns_start(set, cfg);
	log_info("peering as node %s (instance %016" PRIx64
		 "): %s%s, %u peers configured, %u DNS names of peers",
		 set->self, set->instance, cfg->listen ? "listening on " : "not listening",
		 cfg->listen ? cfg->listen : "", cfg->n_peers, cfg->n_dns);
	return 0;
}

void peer_set_stop(struct peer_set *set)
{
	struct peer_conn *pc;

	if (!set->loop || set->stopping)
		return;
	set->stopping = true;
	if (set->listening)
		uv_close((uv_handle_t *)&set->listener, NULL);
	while ((pc = LIST_FIRST(&set->conns)))
		pc_close(pc, CLOSE_QUIET, "the daemon is stopping");
	uv_check_stop(&set->reap);
	uv_idle_stop(&set->reap_idle);
	uv_close((uv_handle_t *)&set->reap, NULL);
	uv_close((uv_handle_t *)&set->reap_idle, NULL);
	for (unsigned i = 0; i < set->n_peers; i++) {
		struct peer *p = set->peers[i];

		if (p->resolving)
			uv_cancel((uv_req_t *)&p->gai);
		uv_close((uv_handle_t *)&p->redial, NULL);
	}
	peer_dns_stop(set);
}

void peer_set_fini(struct peer_set *set)
{
	for (unsigned i = 0; i < set->n_peers; i++)
		free(set->peers[i]);
	set->n_peers = 0;
	explicit_bzero(set->secret, sizeof(set->secret));
	explicit_bzero(set->also, sizeof(set->also));
	set->secret_len = set->also_len = 0;
}
