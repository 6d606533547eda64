/*
 * Remote attach, node B: a client's attach of "@PEER/NAME"
 * (docs/remote.md, "Naming", "Freshness"): the peer it names, ready or
 * not; served by the replica once this node has heard from A since the
 * attach came (a PeerSync and its reply, the attaches parked on it meanwhile),
 * else joined to a pull under way or to a wait A watches for, else a pull
 * of its own (remote_pull.c).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "common/desc.h"
#include "daemon/figures.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

/*
 * The connected peer named peer for a request (kind, id) of cl about
 * `what` ("tensor '@a/x'"), or NULL with the request answered: no such
 * peer, not connected, or no data path to it.
 */
struct rpeer *rm_rpeer_ready(struct remote_env *env, struct client *cl, unsigned kind, uint64_t id,
			     const char *what, const char *peer)
{
	struct remote *rm = env->rm;
	char why[700], known[200];
	struct rpeer *rp;
	struct peer *p;
	size_t k = 0;

	p = env->peers->on ? peer_lookup(env->peers, peer) : NULL;
	if (!p) {
		known[0] = '\0';
		for (unsigned i = 0; i < env->peers->n_peers && k < sizeof(known); i++)
			k += (size_t)snprintf(known + k, sizeof(known) - k, "%s%s", i ? ", " : "",
					      env->peers->peers[i]->name);
		snprintf(why, sizeof(why), "%s: no peer '%s' (%s%s)", what, peer,
			 env->peers->on ? "known peers: " : "peering is off",
			 env->peers->on ? (known[0] ? known : "none") : "");
		rm_reply_status(env, cl, kind, id, -ENOENT, why);
		return NULL;
	}
	rp = p->data;
	if (!rm || !rp || !rp->up) {
		snprintf(why, sizeof(why), "%s: peer %s is not connected (%s%s%s)", what, peer,
			 peer_state_name(p->state), p->error[0] ? ": " : "", p->error);
		rm_reply_status(env, cl, kind, id, -EHOSTUNREACH, why);
		return NULL;
	}
	if (!rm->x || !rp->addr) {
		snprintf(why, sizeof(why), "%s: no data path to peer %s: %s", what, peer,
			 !rm->x ? rm->why : "it has not sent its UCX worker address");
		rm_reply_status(env, cl, kind, id, -EHOSTUNREACH, why);
		return NULL;
	}
	return rp;
}

/*
 * Freshness (docs/remote.md, "Freshness"; issue 30 item 7). A replica A
 * watches for this node is current up to the PeerChanged frames still on
 * their way: an attach that began after a put on A returned could read the
 * version before it. So a replica serves an attach only once this node has
 * heard from A after the attach came: A answers a PeerSync at once, on the
 * connection that carries its PeerChanged frames, so by its reply every
 * change A made before the attach began has been told. Every answer is then
 * A's version at some moment after the attach began: read-your-writes for a
 * caller whose put returned before its attach, and a client's attaches,
 * one after the other, never go back.
 */
void rm_sync_park(struct rpeer *rp, struct pwait *w)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSync m = TENSORD__PEER_SYNC__INIT;
	char why[700];

	w->sync_seq = m.seq = ++rp->sync_sent;
	f.body_case = TENSORD__PEER_FRAME__BODY_SYNC;
	f.sync = &m;
	if (peer_send(rp->p, &f) < 0) {
		snprintf(why, sizeof(why), "peer %s: tensor '%s': the connection to it was lost",
			 rp->p->name, w->name + strlen(rp->p->name) + 2);
		rm_reply_status(rp->rm->env, w->cl, ATTACH, w->id, -ECONNRESET, why);
		rm_pwait_free(w);
		return;
	}
	LIST_INSERT_HEAD(&rp->syncs, w, link);
}

/*
 * Attach w of rp's name (fresh: this node has heard from A since w came):
 * served by the replica A watches when fresh, else after a sync; else by a
 * pull: a wait joins one A watches the name for already, a plain attach
 * joins the name's pull under way (synced again at its end if that pull
 * asked A before w came), or a pull of its own asks A.
 */
static void attach_go(struct remote *rm, struct rpeer *rp, struct pwait *w, bool fresh)
{
	size_t len = strlen(w->name);
	bool wait = w->timeout_ms || w->after;
	struct replica *rep = rm_replica_find(rm, w->name);
	struct pull *pl;

	if (rep && rep->watched && rep->generation > w->after && !rm_pull_busy(rm, w->name)) {
		if (!fresh) {
			rm_sync_park(rp, w);
			return;
		}
		/* A told of every change up to after w came: this is current. */
		figure_count(FIG_remote_replica_hits_total, 1);
		rm->env->hooks.attach_local(w->cl, w->id, w->name, len, w->have_id, w->have_shares,
					    w->n_have_shares, false);
		rm_pwait_free(w);
		return;
	}
	if (wait) { /* a wait: joins one A watches the name for already */
		pl = rm_pull_wait_joinable(rm, w->name, w->after);
		if (pl) {
			assert(pl->st == PL_WAITING && !pl->dead);
			LIST_INSERT_HEAD(&pl->waits, w, link);
			rm_pull_wait_arm(pl);
			return;
		}
	}
	pl = wait ? NULL : rm_pull_joinable(rm, w->name);
	if (pl) { /* one pull per name: this attach waits on it */
		assert(!pl->dead && !pl->wait);
		w->late = pl->asked < w->arrived;
		LIST_INSERT_HEAD(&pl->waits, w, link);
		return;
	}
	pl = calloc(1, sizeof(*pl));
	if (!pl) {
		rm_reply_status(rm->env, w->cl, ATTACH, w->id, -ENOMEM,
				"out of memory for a remote attach");
		rm_pwait_free(w);
		return;
	}
	pl->rm = rm;
	pl->rp = rp;
	pl->id = rm_pull_new_id(rm);
	memcpy(pl->name, w->name, len + 1);
	pl->name_len = len;
	pl->peer_len = strlen(rp->p->name);
	pl->st = PL_ASKING;
	pl->started_ns = now_ns();
	/* A waiting attach gets a pull of its own: A answers it "not yet" while it is. */
	pl->wait = wait;
	pl->after = w->after;
	LIST_INIT(&pl->waits);
	LIST_INSERT_HEAD(&pl->waits, w, link);
	LIST_INSERT_HEAD(&rm->pulls, pl, link);
	rm->figs->pulls++;
	uv_timer_init(rm->env->loop, &pl->timer);
	pl->timer.data = pl;
	uv_timer_start(&pl->timer, rm_on_pull_timeout, PULL_BASE_MS, 0);
	if (rm_pull_ask(pl, rep && !pl->wait ? rep->generation : 0) < 0)
		rm_pull_fail(pl, -ECONNRESET, "the connection to it was lost");
}

void remote_attach(struct remote_env *env, struct client *cl, uint64_t id, const char *name,
		   uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares, bool bind,
		   int64_t timeout_ms, uint64_t after)
{
	struct remote *rm = env->rm;
	char why[600], peer[PEER_NAME_MAX + 1], what[300];
	size_t len = strlen(name), peer_len;
	struct rpeer *rp;
	struct pwait *w;
	int r;

	(void)bind; /* never bound: a binding would serve it without hearing from A */
	r = td_remote_name_check(name, len, &peer_len, why, sizeof(why));
	if (r < 0) {
		rm_reply_status(env, cl, ATTACH, id, r, why);
		return;
	}
	memcpy(peer, name + 1, peer_len);
	peer[peer_len] = '\0';
	snprintf(what, sizeof(what), "tensor '%s'", name);
	rp = rm_rpeer_ready(env, cl, ATTACH, id, what, peer);
	if (!rp)
		return;
	w = calloc(1, sizeof(*w));
	if (w && n_have_shares) {
		w->have_shares = malloc(n_have_shares * sizeof(*have_shares));
		if (w->have_shares)
			memcpy(w->have_shares, have_shares, n_have_shares * sizeof(*have_shares));
		else
			n_have_shares = 0; /* the descriptors are sent again: costs, works */
	}
	if (!w) {
		rm_reply_status(env, cl, ATTACH, id, -ENOMEM, "out of memory for a remote attach");
		return;
	}
	w->cl = cl;
	w->id = id;
	w->have_id = have_id;
	w->n_have_shares = n_have_shares;
	memcpy(w->name, name, len + 1);
	w->after = after;
	w->timeout_ms = timeout_ms;
	w->arrived = ++rm->tick;
	/* A wait's own end: timeout 0 (with after) ends at the first "not yet". */
	if (timeout_ms >= 0 && (timeout_ms || after))
		w->deadline_ns = now_ns() + (uint64_t)timeout_ms * 1000000u;
	attach_go(rm, rp, w, false);
}

void rm_on_sync(struct rpeer *rp, uint64_t seq)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSyncReply m = TENSORD__PEER_SYNC_REPLY__INIT;

	figure_count(FIG_remote_sync_requests_total, 1);
	m.seq = seq;
	f.body_case = TENSORD__PEER_FRAME__BODY_SYNC_REPLY;
	f.sync_reply = &m;
	rm_send_frame(rp, &f);
}

void rm_on_sync_reply(struct rpeer *rp, uint64_t seq)
{
	LIST_HEAD(, pwait) ready = LIST_HEAD_INITIALIZER(ready);
	struct pwait *w, *next;

	if (seq > rp->sync_heard)
		rp->sync_heard = seq;
	for (w = LIST_FIRST(&rp->syncs); w; w = next) {
		next = LIST_NEXT(w, link);
		assert(w->sync_seq && w->sync_seq <= rp->sync_sent); /* a PeerSync sent for it */
		if (w->sync_seq <= rp->sync_heard) {
			LIST_REMOVE(w, link);
			LIST_INSERT_HEAD(&ready, w, link);
		}
	}
	while ((w = LIST_FIRST(&ready))) {
		LIST_REMOVE(w, link);
		w->late = false;
		attach_go(rp->rm, rp, w, true);
	}
}

void rm_syncs_fail(struct rpeer *rp, int status, const char *reason)
{
	char why[900];
	struct pwait *w;

	while ((w = LIST_FIRST(&rp->syncs))) {
		LIST_REMOVE(w, link);
		snprintf(why, sizeof(why), "peer %s: tensor '%s': %s", rp->p->name,
			 w->name + strlen(rp->p->name) + 2, reason);
		rm_reply_status(rp->rm->env, w->cl, ATTACH, w->id, status, why);
		rm_pwait_free(w);
	}
}

void rm_syncs_client_gone(struct rpeer *rp, struct client *cl)
{
	struct pwait *w, *next;

	for (w = LIST_FIRST(&rp->syncs); w; w = next) {
		next = LIST_NEXT(w, link);
		if (w->cl == cl) {
			LIST_REMOVE(w, link);
			rm_pwait_free(w);
		}
	}
}

int rm_syncs_cancel(struct rpeer *rp, struct client *cl, uint64_t req_id)
{
	char why[400];
	struct pwait *w;

	LIST_FOREACH(w, &rp->syncs, link)
	if (w->cl == cl && w->id == req_id && (w->timeout_ms || w->after)) {
		snprintf(why, sizeof(why), "tensor '%s': the wait was cancelled", w->name);
		rm_reply_status(rp->rm->env, cl, ATTACH, w->id, -ECANCELED, why);
		LIST_REMOVE(w, link);
		rm_pwait_free(w);
		return 0;
	}
	return -ENOENT;
}
