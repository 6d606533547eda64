/*
 * Peering: the handshake (peer_auth.h's challenge-response carried in
 * Hello and Proof frames) and a connection coming up. The dialler
 * connects and sends its Hello; the listener answers with its Hello and
 * proof; the dialler checks that proof and sends its own; the listener
 * checks it. Anything else is refused (peer_link.c closes it): anything
 * but a Hello first, a second Hello, a wrong proof, a name that is this
 * node's own. A connection that authenticated becomes its peer's, one per
 * pair of nodes: the one dialled by the node with the smaller name.
 */
#include "peer_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <tensord/tensord.h>

#include "daemon/base/log.h"
#include "daemon/figures.h"
#include "proto/peer.pb-c.h"
#include "daemon/base/clock.h"

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

/*
 * pc has authenticated: it becomes its peer's connection, unless the peer
 * has one already, in which case the one dialled by the node with the
 * smaller name survives (both sides pick the same one).
 */
static void pc_up(struct peer_conn *pc, const char *name)
{
	struct peer_set *set = pc->set;
	struct peer *p = pc->peer ? pc->peer : peer_lookup(set, name);
	bool keep_dialled;

	assert(!pc->closing && pc->phase == (pc->dialler ? PC_HELLO : PC_PROOF));
	pc_check(pc);
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
	assert(!p->up && p->dial != pc && !pc->target && !pc->counted_unauth);
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
	peer_mark_state(p, PEER_UP);
	set->n_up++;
	assert(set->n_up <= set->n_peers);
	pc->phase = PC_UP;
	pc->last_rx_ns = now_ns();
	pc_check(pc);
	peer_check(p);
	pc_heartbeats_start(pc);
	log_info("peer %s: up (%s, %s, instance %016" PRIx64 ")", p->name, pc->addr,
		 pc->dialler ? "dialled" : "accepted", p->instance);
	if (set->on_up)
		set->on_up(set->hooks_ctx, p);
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

void pc_handshake_start(struct peer_conn *pc)
{
	int r;

	assert(!pc->closing && pc->phase == PC_CONNECTING && pc->counted_unauth);
	if (pc->dialler) {
		r = auth_start(pc->set, &pc->auth, PEER_AUTH_DIALLER);
		if (r < 0) {
			pc_close(pc, CLOSE_LOST, "cannot start the handshake: %s", strerror(-r));
			return;
		}
	}
	pc->phase = PC_HELLO;
	/* It may have come up meanwhile, over a connection it dialled. */
	if (pc->dialler && pc->peer && !pc->peer->up)
		peer_mark_state(pc->peer, PEER_AUTHENTICATING);
	pc_start_reading(pc);
	if (pc->dialler)
		send_hello(pc, NULL);
}

void pc_on_hello(struct peer_conn *pc, const Tensord__PeerHello *h)
{
	uint8_t proof[PEER_AUTH_MAC_LEN];
	size_t name_len = strlen(h->name);
	int r;

	assert(pc->phase == PC_HELLO && !pc->closing);

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

void pc_on_proof(struct peer_conn *pc, const Tensord__PeerProof *m)
{
	int r;

	assert(pc->phase == PC_PROOF && !pc->dialler && !pc->closing);
	r = peer_auth_verify(&pc->auth, m->proof.data, m->proof.len);

	if (r < 0) {
		pc_close(pc, CLOSE_REFUSED, "%s",
			 r == -EACCES ? "its proof is wrong (not the same secret?)"
				      : "its proof is not 32 bytes");
		return;
	}
	pc_up(pc, pc->auth.other);
}
