/*
 * What the peering files share, and nothing outside them includes:
 * peer.c (the peer table, the set's start and stop), peer_link.c (one
 * connection's reading, writing, backpressure, heartbeats and closing),
 * peer_handshake.c (Hello and Proof, a connection coming up), peer_dial.c
 * (making connections: --peer dials, accepting, the listener) and
 * peer_dns.c (--peers-dns: names resolved to the peers' addresses).
 * peer_dns.c knows targets and names, not a connection's fields.
 *
 * The pc_* functions are this folder's internal ones (the daemon is
 * built with -fvisibility=hidden; nothing else defines pc_*).
 */
#ifndef TENSORD_PEER_INT_H
#define TENSORD_PEER_INT_H

#include <assert.h>

#include "peer.h"
#include "proto/frame.h"

/* The peer protocol's version, in each Hello. */
#define PEER_PROTOCOL 1

/*
 * A connection's phase. It only moves forward: CONNECTING (a dialler
 * only) -> HELLO -> (a listener only) PROOF -> UP; a close ends it in
 * any phase.
 */
enum pc_phase {
	PC_CONNECTING, /* dialler: TCP connect under way */
	PC_HELLO,      /* waiting for the other side's Hello */
	PC_PROOF,      /* listener: waiting for the dialler's Proof */
	PC_UP,
};

/*
 * One control connection. Its invariants (pc_check() asserts them):
 * - counted_unauth (counted in set->n_unauth) until it comes up or
 *   closes, never while PC_UP;
 * - while PC_UP and not closing, it is its peer's connection in use
 *   (peer->up == pc), and was never a target's dial any more;
 * - a peer's dial (p->dial == pc) is a dialler before PC_UP;
 * - failed (on set->failed) only until closing: pc_close() takes it off.
 */
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

/* The invariants above, asserted where a connection changes hands or phase. */
static inline void pc_check(const struct peer_conn *pc)
{
	assert(pc->open_handles == 2 || pc->closing);
	assert(!pc->counted_unauth || (pc->phase != PC_UP && pc->set->n_unauth > 0));
	assert(!pc->closing || !pc->counted_unauth);
	assert(pc->phase != PC_CONNECTING || pc->dialler);
	assert(pc->phase != PC_PROOF || !pc->dialler);
	assert(pc->phase != PC_UP || pc->closing ||
	       (pc->peer && pc->peer->up == pc && !pc->target));
	assert(!pc->peer || pc->peer->dial != pc || (pc->dialler && pc->phase != PC_UP));
	assert(!pc->target || pc->target->dial == pc);
}

/* A peer's two connections, as pc_check() sees them from its side. */
static inline void peer_check(const struct peer *p)
{
	assert(!p->up || (p->up->peer == p && p->up->phase == PC_UP && p->state == PEER_UP));
	assert(!p->dial || (p->dial->peer == p && p->dial->dialler && p->dial != p->up));
}

/* peer.c */

/* p's state becomes s (since_ns moves only when it changes). */
void peer_mark_state(struct peer *p, enum peer_state s);

/* p's last error becomes reason. */
void peer_mark_error(struct peer *p, const char *reason);

/* A peer new to the table, down; NULL when the table is full or out of memory. */
struct peer *peer_add(struct peer_set *set, const char *name);

/* peer_link.c */

enum close_kind {
	CLOSE_REFUSED, /* the handshake failed: counted, rate-limited warning */
	CLOSE_LOST,    /* a dial that failed, or an up connection that ended */
	CLOSE_QUIET,   /* a duplicate, or the daemon stopping */
};

/*
 * A new connection of set's, PC_CONNECTING, counted as authenticating,
 * its handshake's deadline running; NULL when out of memory.
 */
struct peer_conn *pc_new(struct peer_set *set, bool dialler);

/*
 * Closes pc for reason (a sentence fragment: "wrong proof"), and says so
 * in the log and, where this node knows whose connection it was, on the
 * peer. Safe to call twice; pc is freed once its handles have closed.
 */
void __attribute__((format(printf, 3, 4)))
pc_close(struct peer_conn *pc, enum close_kind kind, const char *fmt, ...);

/* Sends one frame; on failure pc fails (pc_fail()): closed soon, not now. */
void pc_send(struct peer_conn *pc, const Tensord__PeerFrame *f);

/* TCP options set and reading started; on failure pc is closed. */
void pc_start_reading(struct peer_conn *pc);

/* pc is up: its handshake's deadline becomes the heartbeat. */
void pc_heartbeats_start(struct peer_conn *pc);

/* peer_handshake.c */

/*
 * pc is connected (PC_CONNECTING for a dialler, accepted for a
 * listener): it waits for a Hello, reading; a dialler sends its own
 * first. On failure pc is closed.
 */
void pc_handshake_start(struct peer_conn *pc);

/* The Hello due in PC_HELLO. */
void pc_on_hello(struct peer_conn *pc, const Tensord__PeerHello *h);

/* The dialler's Proof due in PC_PROOF. */
void pc_on_proof(struct peer_conn *pc, const Tensord__PeerProof *m);

/* peer_dial.c */

/* Dials p (resolving its name first), unless it is up, being dialled or the daemon stops. */
void peer_dial(struct peer *p);

/* A configured peer is dialled again after its back-off, which then doubles. */
void peer_redial_later(struct peer *p);

/*
 * Listens at cfg->listen for peers dialling in: on fd when it is not -1 (a
 * socket a predecessor bound there, peer_set_listen()), else on a socket
 * bound now. why says what failed.
 */
int peer_listen(struct peer_set *set, const struct peer_config *cfg, int fd, char *why,
		size_t why_len);

/* No new connection is made: the daemon stops, or drains for its successor. */
static inline bool peer_set_quiet(const struct peer_set *set)
{
	return set->stopping || set->draining;
}

/*
 * Dials t's address for it (t->dial is the connection). -ENOMEM when no
 * connection could be made (t->dial stays NULL), else 0: a connect that
 * fails at once closes the dial as any failed dial does, and the close
 * has t dialled again later.
 */
int peer_conn_dial_target(struct peer_target *t);

/* The dial pc serves no target any more (its address left the answer); it goes on, on its own. */
void peer_conn_forget_target(struct peer_conn *pc);

/*
 * sa as text, an IPv4-mapped IPv6 address as the IPv4 one: a listener on
 * [::] sees an IPv4 dialler as ::ffff:a.b.c.d, the dialler itself as
 * a.b.c.d.
 */
void peer_sockaddr_text_plain(const struct sockaddr *sa, char *out, size_t len);

/* peer_dns.c */

/* Starts resolving each --peers-dns name of cfg, at once and every PEER_DNS_INTERVAL_MS. */
void peer_dns_start(struct peer_set *set, const struct peer_config *cfg);

/* Stops resolving and dialling the names' addresses (the daemon stopping). */
void peer_dns_stop(struct peer_set *set);

/* Stops asking the names and dialling their addresses for now (a drain); the handles stay. */
void peer_dns_pause(struct peer_set *set);

/* t is dialled again after its back-off, which then doubles (as a --peer's). */
void peer_target_redial_later(struct peer_target *t);

/* Each --peers-dns address that led to p is dialled again (p went down). */
void peer_targets_redial(struct peer *p);

#endif /* TENSORD_PEER_INT_H */
