/*
 * Remote attach, node B: pulling "@PEER/NAME" for this node's clients
 * (docs/remote.md, "Remote attach: the data flow"). One pull per name, the
 * attaches waiting on it; a waiting attach's pull asks again when A tells
 * of a change; the replica is made by this daemon's pseudo-client, its
 * bytes received into its mapping (a GPU replica's into host memory, then
 * copied in on the GPU worker), published, and kept as a replica while
 * leased, for --replica-keep after, and within its peer's share
 * (--peer-max-replica-bytes).
 *
 * A mapping UCX may still write is never unmapped before UCX says it is
 * done with it, whatever else failed: a failed pull whose receive is
 * posted stays, dead, until its completion.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <search.h>
#include <sys/mman.h>
#include <sys/queue.h>

#include <openssl/rand.h>

#include "common/desc.h"
#include "daemon/figures.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

/* --- B: pulling ------------------------------------------------------------------ */

/*
 * A pull's states, and what the asserts below hold it to:
 *   PL_ASKING ──PullReply──▶ PL_RECEIVING (bytes coming, or a GPU replica's
 *       memory being allocated) ──▶ published (rm_pull_complete()) and freed;
 *   PL_ASKING ──"not yet"──▶ PL_WAITING (only a pull that waits) ──▶ PL_ASKING;
 *   any state ──failure──▶ ended (rm_pull_end_failed()): freed, or dead while
 *       UCX may still write its mapping (posted), then freed by the receive's end.
 * A dead pull is on rm->pulls but in no other sense: no waits, no timer, never
 * joined, answered or failed again. A pull is freed with no waits left, each
 * having been answered; rm->figs->pulls counts the pulls on rm->pulls.
 */

/* pl is making its replica: its bytes coming, or (a GPU replica) its memory or copy. */
static void pull_assert_receiving(const struct pull *pl)
{
	assert(pl->st == PL_RECEIVING && !pl->dead);
	assert(pl->t && (!pl->posted || pl->map));
	assert(!pl->allocating || (pl->gpu && pl->job));
	(void)pl;
}

void rm_pwait_free(struct pwait *w)
{
	free(w->have_shares);
	free(w);
}

static struct pull *pull_by_name(struct remote *rm, const char *name)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

/*
 * A pull of name asking A or receiving (a replica of it may be on its way
 * out), or NULL; a wait A said "not yet" to is none: it changes nothing.
 */
static struct pull *pull_busy(struct remote *rm, const char *name)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && pl->st != PL_WAITING && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

/* A pull of name that an attach without a wait may join (one waits for none), or NULL. */
static struct pull *pull_joinable(struct remote *rm, const char *name)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && !pl->wait && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

/* A pull of name receiving its bytes (its replica being made), or NULL. */
static struct pull *pull_receiving(struct remote *rm, const char *name)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && pl->st == PL_RECEIVING && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

struct pull *rm_pull_by_id(struct remote *rm, uint64_t id)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (pl->id == id)
		return pl;
	return NULL;
}

/*
 * A pull's id is the tag of the bytes' message, and the UCX port takes
 * messages from anyone who reaches it, authenticated or not: a guessable
 * id would let a stranger write a replica. So ids are 64 random bits
 * (libcrypto's generator), unique among the pulls alive.
 */
static bool ids_free(struct remote *rm, uint64_t id, uint64_t n);

/* The first of n ids free in a row (a set takes its own and its members'). */
uint64_t rm_pull_new_ids(struct remote *rm, uint64_t n)
{
	uint64_t id = 0;

	do {
		if (RAND_bytes((unsigned char *)&id, sizeof(id)) != 1) {
			/* Only without an entropy source: a guessable id, said. */
			log_warn("remote attach: no random bytes for a pull's id: a counter "
				 "instead");
			id = (rm->next_id += n) ^ now_ns();
		}
		id &= ~(uint64_t)0 >> 1; /* room above it for the n */
	} while (!id || !ids_free(rm, id, n));
	return id;
}

static uint64_t pull_new_id(struct remote *rm)
{
	return rm_pull_new_ids(rm, 1);
}

/* Whether no live pull has an id in [id, id + n) and no live set's range meets it. */
static bool ids_free(struct remote *rm, uint64_t id, uint64_t n)
{
	struct spull *sp;
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (pl->id - id < n)
		return false;
	LIST_FOREACH(sp, &rm->sets, link)
	if (sp->id < id + n && id < sp->id + 1 + REMOTE_SET_MAX)
		return false;
	return true;
}

/* Replicas by name: a tsearch tree whose elements begin with their name (rm_name_cmp). */
_Static_assert(offsetof(struct replica, name) == 0, "a replica begins with its name");

struct replica *rm_replica_find(struct remote *rm, const char *name)
{
	struct replica **at = tfind(name, &rm->replica_index, rm_name_cmp);

	return at ? *at : NULL;
}

void rm_noop_free(void *node)
{
	(void)node; /* a tree's element owned elsewhere */
}

/* Counts r (its size delta bytes: +, or - to uncount) in the figures and its peer's. */
void rm_replica_count(struct remote *rm, const struct replica *r, int n, int64_t delta)
{
	/* The counts never go below zero: what is uncounted was counted. */
	assert(n >= 0 ||
	       (rm->figs->replicas >= (uint64_t)-n && r->rp->p->remote.replicas >= (uint64_t)-n));
	assert(delta >= 0 || (rm->figs->replica_bytes >= (uint64_t)-delta &&
			      r->rp->p->remote.replica_bytes >= (uint64_t)-delta));
	rm->figs->replicas += (uint64_t)(int64_t)n;
	rm->figs->replica_bytes += (uint64_t)delta;
	r->rp->p->remote.replicas += (uint64_t)(int64_t)n;
	r->rp->p->remote.replica_bytes += (uint64_t)delta;
}

/*
 * r, its name, peer and size set, joins rm's list and index and is
 * counted; false when the index has no room.
 */
bool rm_replica_link(struct remote *rm, struct replica *r)
{
	if (!tsearch(r, &rm->replica_index, rm_name_cmp))
		return false;
	LIST_INSERT_HEAD(&rm->replicas, r, link);
	rm_replica_count(rm, r, 1, (int64_t)r->nbytes);
	return true;
}

void rm_replica_unlink(struct remote *rm, struct replica *r)
{
	tdelete(r, &rm->replica_index, rm_name_cmp);
	LIST_REMOVE(r, link);
	rm_replica_count(rm, r, -1, -(int64_t)r->nbytes);
}

/* Unlinks the replica's name (its leases keep its bytes) and forgets it. */
void rm_replica_drop(struct remote *rm, struct replica *r, const char *why)
{
	char buf[300];
	struct tensor *t = registry_lookup(rm->env->reg, &rm->rc, r->name, r->name_len);

	if (t && t->id == r->tensor_id)
		registry_unlink(rm->env->reg, &rm->rc, r->name, r->name_len, buf, sizeof(buf));
	log_debug("replica '%s': unlinked: %s", r->name, why);
	rm_replica_unlink(rm, r);
	free(r);
}

/* --- B: the replica share of one peer (--peer-max-replica-bytes) ------------------- */

/*
 * Bytes of rp's replicas on this node: those named, and those being
 * received. (A replica unlinked while leased is no longer counted: it is
 * its readers' now, charged like any unlinked tensor until they let go.)
 */
static uint64_t replica_bytes_of(struct remote *rm, const struct rpeer *rp)
{
	uint64_t n = rp->p->remote.replica_bytes; /* kept by rm_replica_link() and _unlink() */
	const struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (pl->rp == rp && pl->st == PL_RECEIVING && !pl->dead)
		n += pl->nbytes;
	return n;
}

static bool replica_leased(struct remote *rm, const struct replica *r)
{
	struct tensor *t = registry_lookup(rm->env->reg, &rm->rc, r->name, r->name_len);

	return t && t->id == r->tensor_id && t->refcount;
}

/* rp's oldest replica that nobody leases (replicas are added at the head), or NULL. */
static struct replica *replica_oldest_idle(struct remote *rm, const struct rpeer *rp)
{
	struct replica *r, *found = NULL;

	LIST_FOREACH(r, &rm->replicas, link)
	if (r->rp == rp && !replica_leased(rm, r))
		found = r;
	return found;
}

/*
 * Makes room for a replica of nbytes from rp within its share: rp's
 * unleased replicas are unlinked, oldest first, while it does not fit.
 * 0; or -EDQUOT with the reason in why when even that is not enough (its
 * replicas are leased or being received), so that one peer's replicas
 * cannot take this node's memory from its own users.
 */
static int replica_share_room(struct remote *rm, struct rpeer *rp, uint64_t nbytes, char *why,
			      size_t why_len)
{
	uint64_t max = rm->max_replica_bytes, used = replica_bytes_of(rm, rp);
	struct replica *r;

	while ((nbytes > max || used > max - nbytes) && (r = replica_oldest_idle(rm, rp))) {
		assert(used >= r->nbytes); /* rp's replicas are in used */
		used -= r->nbytes;
		rm_replica_drop(rm, r,
				"room for a newer replica of its peer (--peer-max-replica-bytes)");
	}
	if (nbytes <= max && used <= max - nbytes)
		return 0;
	snprintf(why, why_len,
		 "over --peer-max-replica-bytes (%" PRIu64 " bytes for the replicas of one "
		 "peer): this one needs %" PRIu64 ", and its replicas here hold %" PRIu64
		 " bytes leased or being pulled",
		 max, nbytes, used);
	return -EDQUOT;
}

static void on_pull_closed(uv_handle_t *h)
{
	free(h->data);
}

void rm_pull_free(struct pull *pl)
{
	assert(LIST_EMPTY(&pl->waits)); /* each answered, or gone with its client */
	assert(pl->rm->figs->pulls > 0);
	assert(!pl->job || pl->job->pl == pl);
	if (pl->job)
		pl->job->pl = NULL; /* its end frees what it holds */
	LIST_REMOVE(pl, link);
	pl->rm->figs->pulls--;
	uv_close((uv_handle_t *)&pl->timer, on_pull_closed);
}

/* PullDone{id} to rp: A ends the lease of that pull (or of a set's member). */
static void pull_done_send(struct rpeer *rp, uint64_t id)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullDone d = TENSORD__PEER_PULL_DONE__INIT;

	d.id = id;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_DONE;
	f.pull_done = &d;
	rm_send_frame(rp, &f);
}

/*
 * Ends failed pull pl, its waiting attaches answered with status and why:
 * the replica being made is discarded (a set's member: by the abort of its
 * set's transaction, before this); A is told to end its lease. The mapping
 * stays while UCX may write it.
 */
void rm_pull_end_failed(struct pull *pl, int status, const char *why)
{
	struct remote *rm = pl->rm;
	char buf[300];
	struct pwait *w;

	assert(!pl->dead); /* ended once */
	assert(!pl->done || pl->set);
	while ((w = LIST_FIRST(&pl->waits))) {
		LIST_REMOVE(w, link);
		rm_reply_status(rm->env, w->cl, ATTACH, w->id, status, why);
		rm_pwait_free(w);
	}
	if (pl->st == PL_RECEIVING && !pl->allocating) { /* allocating: its job ends it */
		if (!pl->set)
			registry_unlink(rm->env->reg, &rm->rc, pl->name, pl->name_len, buf,
					sizeof(buf));
		registry_release(rm->env->reg, &rm->rc, pl->lease);
	}
	if (pl->rp->up && !pl->done)
		pull_done_send(pl->rp, pl->id);
	uv_timer_stop(&pl->timer);
	pl->set = NULL;
	if (pl->posted) {
		pl->dead = true; /* its receive's end unmaps and frees it */
		return;
	}
	if (pl->map)
		munmap(pl->map, pl->map_len);
	rm_pull_free(pl);
}

/*
 * pl failed: every attach waiting on it gets status and "peer P: tensor
 * 'N': <reason>"; a set's member fails its whole set with those words.
 */
void __attribute__((format(printf, 3, 4)))
rm_pull_fail(struct pull *pl, int status, const char *fmt, ...)
{
	char reason[300], why[1000];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (pl->set && !pl->name[0])
		snprintf(why, sizeof(why), "peer %s: %s: member %" PRIu64 " (not named yet): %s",
			 pl->rp->p->name, pl->set->what, pl->id - pl->set->id, reason);
	else
		snprintf(why, sizeof(why), "peer %s: tensor '%s': %s", pl->rp->p->name,
			 pl->name + pl->peer_len + 2, reason);
	if (pl->set) {
		pl->rp->p->remote.pull_errors++;
		rm_set_fail(pl->set, status, why);
		return;
	}
	if (pl->wait && LIST_EMPTY(&pl->waits)) { /* a wait that lingers: nobody to fail */
		log_debug("pull %" PRIu64 " of '%s' ended: %s", pl->id, pl->name, why);
		rm_pull_end_failed(pl, status, why);
		return;
	}
	pl->rp->p->remote.pull_errors++;
	log_info("pull %" PRIu64 " of '%s' failed: %s", pl->id, pl->name, why);
	figure_count(FIG_remote_pull_failures_total, 1);
	rm_pull_end_failed(pl, status, why);
}

static void sync_park(struct rpeer *rp, struct pwait *w);

/*
 * Every waiting attach gets a lease on the replica, never bound: a binding
 * serves later attaches in the client, without this node hearing from A
 * (docs/remote.md, "Freshness"). An attach that came after pl asked A
 * (it joined a pull under way) is served after a sync, as a replica's.
 */
void rm_answer_local(struct pull *pl, bool watched)
{
	struct pwait *w;

	(void)watched; /* never bound: a binding would serve it without hearing from A */
	assert(!pl->dead);
	while ((w = LIST_FIRST(&pl->waits))) {
		LIST_REMOVE(w, link);
		if (w->late) { /* pl asked A before w came: w hears from A first */
			sync_park(pl->rp, w);
			continue;
		}
		pl->rm->env->hooks.attach_local(w->cl, w->id, pl->name, pl->name_len, w->have_id,
						w->have_shares, w->n_have_shares, false);
		rm_pwait_free(w);
	}
}

static int pull_ask(struct pull *pl, uint64_t have_generation);

/*
 * The waits on pl whose deadline passed end with ETIMEDOUT, as a local
 * wait does: a wait that ends so is no failure of the pull (nothing is
 * counted in remote_pull_failures_total or the peer's pull errors, and
 * it is logged at debug level only); the pull goes on for the others.
 */
static void pull_waits_expire(struct pull *pl, uint64_t now)
{
	struct pwait *w, *next;
	char why[700];

	for (w = LIST_FIRST(&pl->waits); w; w = next) {
		next = LIST_NEXT(w, link);
		if (!w->deadline_ns || w->deadline_ns > now)
			continue;
		if (pl->after)
			snprintf(why, sizeof(why),
				 "peer %s: tensor '%s': no generation newer than %" PRIu64
				 " within the timeout",
				 pl->rp->p->name, pl->name + pl->peer_len + 2, pl->after);
		else
			snprintf(why, sizeof(why),
				 "peer %s: tensor '%s': not published within the timeout",
				 pl->rp->p->name, pl->name + pl->peer_len + 2);
		log_debug("pull %" PRIu64 " of '%s': a wait ended: %s", pl->id, pl->name, why);
		LIST_REMOVE(w, link);
		rm_reply_status(pl->rm->env, w->cl, ATTACH, w->id, -ETIMEDOUT, why);
		rm_pwait_free(w);
	}
}

/* A waiting pull asks A again: A told of a change, or it is time to look. */
static void pull_wait_again(struct pull *pl)
{
	assert(pl->st == PL_WAITING && pl->wait && !pl->dead);
	pl->st = PL_ASKING;
	pl->told = false;
	pl->linger_ns = 0;
	uv_timer_start(&pl->timer, rm_on_pull_timeout, PULL_BASE_MS, 0);
	if (pull_ask(pl, 0) < 0)
		rm_pull_fail(pl, -ECONNRESET, "the connection to it was lost");
}

/*
 * pl waits (PL_WAITING): its waits past their deadline end; with none
 * left it lingers for the next wait of the name, then ends; A is asked
 * again when it told of a change, or (A not watching) every second; the
 * timer is set for the next of these.
 */
static void pull_wait_arm(struct pull *pl)
{
	uint64_t now = now_ns(), next = 0;
	struct pwait *w;

	assert(pl->st == PL_WAITING && pl->wait && !pl->dead);
	pull_waits_expire(pl, now);
	if (LIST_EMPTY(&pl->waits)) {
		if (!pl->linger_ns)
			pl->linger_ns = now + (uint64_t)REMOTE_WAIT_LINGER_MS * 1000000u;
		if (pl->told || now >= pl->linger_ns) { /* a change unasked for: A forgot it */
			uv_timer_stop(&pl->timer);
			rm_pull_free(pl);
			return;
		}
		next = pl->linger_ns;
	} else {
		pl->linger_ns = 0;
		if (pl->told || (!pl->wait_watched && now >= pl->reask_ns)) {
			pull_wait_again(pl);
			return;
		}
		LIST_FOREACH(w, &pl->waits, link)
		if (w->deadline_ns && (!next || w->deadline_ns < next))
			next = w->deadline_ns;
		if (!pl->wait_watched && (!next || pl->reask_ns < next))
			next = pl->reask_ns;
	}
	if (next)
		uv_timer_start(&pl->timer, rm_on_pull_timeout,
			       next > now ? (next - now + 999999u) / 1000000u : 0, 0);
	else
		uv_timer_stop(&pl->timer);
}

/*
 * A said not yet: wait for its PeerChanged of the name (watched), or ask
 * again in a second (not watched: A watches too many names of this node's),
 * each attach at most until its own deadline.
 */
static void pull_wait(struct pull *pl, bool watched)
{
	assert(pl->st == PL_ASKING && pl->wait); /* only a pull that waits hears "not yet" */
	pl->st = PL_WAITING;
	pl->wait_watched = watched;
	pl->told = false;
	pl->reask_ns = watched ? 0 : now_ns() + 1000000000u;
	pull_wait_arm(pl);
}

void rm_on_pull_timeout(uv_timer_t *t)
{
	struct pull *pl = t->data;
	uint64_t ms = (now_ns() - pl->started_ns) / 1000000u;

	assert(!pl->dead); /* its end stopped the timer */
	if (pl->st == PL_WAITING) {
		pull_wait_arm(pl);
		return;
	}
	rm_pull_fail(pl, -ETIMEDOUT, "no %s after %" PRIu64 " ms",
		     pl->st == PL_ASKING ? "answer" : "bytes", ms);
}

/*
 * A waiting pull that a new wait of the same name and after may join: A
 * said not yet and watches the name for this node (it tells of the next
 * change, and the pull then asks again), or NULL.
 */
static struct pull *pull_wait_joinable(struct remote *rm, const char *name, uint64_t after)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && pl->wait && pl->st == PL_WAITING && pl->wait_watched &&
	    pl->after == after && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

static int pull_ask(struct pull *pl, uint64_t have_generation)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPull m = TENSORD__PEER_PULL__INIT;

	pl->asked = ++pl->rm->tick;
	m.id = pl->id;
	m.name = pl->name + pl->peer_len + 2;
	m.have_generation = have_generation;
	m.after = pl->after;
	m.wait = pl->wait;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL;
	f.pull = &m;
	return peer_send(pl->rp->p, &f);
}

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
static void sync_park(struct rpeer *rp, struct pwait *w)
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

	if (rep && rep->watched && rep->generation > w->after && !pull_busy(rm, w->name)) {
		if (!fresh) {
			sync_park(rp, w);
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
		pl = pull_wait_joinable(rm, w->name, w->after);
		if (pl) {
			assert(pl->st == PL_WAITING && !pl->dead);
			LIST_INSERT_HEAD(&pl->waits, w, link);
			pull_wait_arm(pl);
			return;
		}
	}
	pl = wait ? NULL : pull_joinable(rm, w->name);
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
	pl->id = pull_new_id(rm);
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
	if (pull_ask(pl, rep && !pl->wait ? rep->generation : 0) < 0)
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

/* B has memory ready for pl's bytes: A sends them. */
static void pull_go(struct pull *pl)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullGo g = TENSORD__PEER_PULL_GO__INIT;

	g.id = pl->id;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_GO;
	f.pull_go = &g;
	rm_send_frame(pl->rp, &f);
}

/*
 * pl's replica t is on a GPU (docs/remote.md, "GPU tensors across nodes"):
 * registry_create() left its memory to the GPU worker. The bytes are
 * received into host memory meanwhile (PullGo goes at once; or they were
 * inline in m), and copied in once both are there (rm_pull_complete()).
 */
static void pull_gpu_begin(struct pull *pl, const Tensord__PeerPullReply *m, struct tensor *t,
			   uint64_t nbytes)
{
	struct gjob *j = calloc(1, sizeof(*j));
	int e = ENOMEM;

	assert(pl->st == PL_ASKING && !pl->job && !pl->map);
	pl->st = PL_RECEIVING;
	pl->allocating = true;
	pl->gpu = true;
	pl->t = t;
	pl->generation = m->generation;
	pl->watched = m->watched;
	pl->nbytes = nbytes;
	pl->map_len = (size_t)nbytes;
	pl->map = j ? rm_stage_map(pl->map_len) : NULL;
	if (pl->map)
		e = 0;
	else if (j)
		e = errno;
	if (pl->map && m->data.len) {
		memcpy(pl->map, m->data.data, m->data.len);
		pl->in_host = true;
	}
	if (j) {
		j->kind = GJ_ALLOC;
		j->pl = pl;
		j->alloc.t = t;
	}
	if (pl->map && rm_gjob_submit(pl->rm, j) == 0) {
		pl->job = j;
		uv_timer_start(&pl->timer, rm_on_pull_timeout,
			       PULL_BASE_MS + (uint64_t)nbytes / PULL_BYTES_PER_MS, 0);
		if (!pl->in_host) {
			rm_populate_kick(pl->rm);
			pull_go(pl);
		}
		return;
	}
	free(j);
	pl->allocating = false;
	/* The create is finished (which unpins t and frees it), as a failed allocation. */
	{
		struct reg_alloc_job nomem = { .t = t, .rc = -ENOMEM, .got = { .fd = -1 } };
		char reason[300];
		uint64_t lease;

		registry_create_finish(pl->rm->env->reg, &nomem, &lease, reason, sizeof(reason));
	}
	rm_pull_fail(pl, -e, "no host memory to receive its GPU replica (%" PRIu64 " bytes) in: %s",
		     nbytes, strerror(e));
}

/*
 * pl's GPU replica's memory is allocated (on the loop): once its bytes are
 * in host memory too, they are copied in.
 */
void rm_pull_allocated(struct gjob *j)
{
	struct pull *pl = j->pl;
	char why[400];
	uint64_t lease;
	int r;

	r = registry_create_finish(j->reg, &j->alloc, &lease, why, sizeof(why));
	if (pl && pl->dead) { /* failed, waiting for its receive to end: it ends with it */
		pl->job = NULL;
		pl = NULL;
	}
	if (!pl) { /* the pull ended meanwhile: so does its replica */
		if (r == 0 && j->rm) {
			struct tensor *t = j->alloc.t;

			registry_unlink(j->reg, &j->rm->rc, t->name, strlen(t->name), why,
					sizeof(why));
			registry_release(j->reg, &j->rm->rc, lease);
		}
		return;
	}
	assert(pl->job == j && pl->allocating && pl->gpu && pl->st == PL_RECEIVING);
	pl->job = NULL;
	pl->allocating = false;
	if (r < 0) {
		rm_pull_fail(pl, r, "cannot make its replica on this node: %s", why);
		return;
	}
	pl->lease = lease;
	if (pl->in_host || pl->nbytes == 0)
		rm_pull_complete(pl);
	/* else the receive's end completes it */
}

/* pl's GPU replica's bytes were copied in (on the loop): it is published, or fails. */
void rm_pull_filled(struct gjob *j)
{
	struct pull *pl = j->pl;

	munmap(j->buf, j->len);
	if (!pl)
		return;
	assert(pl->job == j && pl->gpu && !pl->filled && !pl->dead);
	pull_assert_receiving(pl);
	pl->job = NULL;
	if (j->status < 0) {
		rm_pull_fail(pl, j->status, "cannot copy its replica's bytes into %s:%d: %s",
			     pl->t->alloc.ops->name, pl->t->device.device_id, strerror(-j->status));
		return;
	}
	pl->filled = true;
	figure_count(FIG_remote_gpu_pulls_total, 1);
	rm_pull_complete(pl);
}

/* A's answer: the replica is current, or the descriptor of a new one to receive. */
int rm_on_pull_reply(struct rpeer *rp, const Tensord__PeerPullReply *m, char *why, size_t why_len)
{
	struct remote *rm = rp->rm;
	struct registry *reg = rm->env->reg;
	struct pull *pl = rm_pull_by_id(rm, m->id);
	struct create_args a = { 0 };
	char reason[400];
	int64_t strides[32];
	struct replica *rep;
	struct tensor *t;
	uint64_t nbytes;
	DLDataType dt;
	int r;

	if (!pl || pl->dead || pl->st != PL_ASKING || pl->rp != rp) {
		if (m->status == 0 && !m->current) /* a pull given up: end A's lease */
			pull_done_send(rp, m->id);
		return 0;
	}
	if (m->waiting) {
		if (!pl->wait) {
			snprintf(why, why_len, "a 'not yet' for '%s', which did not ask to wait",
				 pl->name);
			rm_pull_fail(pl, -EPROTO,
				     "it answered 'not yet' to a pull that does not wait");
			return -EPROTO;
		}
		pull_wait(pl, m->watched);
		return 0;
	}
	if (m->status < 0) {
		/* A's own words, cut to a line: they name A, the tensor and the reason. */
		rm_pull_fail(pl, m->status >= -4095 ? m->status : -EPROTO, "%.300s",
			     m->error ? m->error : "refused");
		return 0;
	}
	if (pl->set && rm_set_member_named(pl, m) < 0)
		return 0;
	/* A set's member replaces its replica in the set's commit, not before. */
	rep = pl->set ? NULL : rm_replica_find(rm, pl->name);
	if (m->current) {
		if (pl->set || !rep || rep->generation != m->generation) {
			rm_pull_fail(pl, -EPROTO,
				     "it called a replica current that this node lacks");
			return 0;
		}
		figure_count(FIG_remote_replica_hits_total, 1);
		rep->watched = m->watched;
		uv_timer_stop(&pl->timer);
		rm_answer_local(pl, rep->watched);
		rm_pull_free(pl);
		return 0;
	}
	/* A peer's descriptor is input like a client's: the same checks as a create. */
	dt = (DLDataType){ (uint8_t)m->dtype_code, (uint8_t)m->dtype_bits,
			   (uint16_t)m->dtype_lanes };
	if (m->n_shape > 32 || m->n_strides != m->n_shape || m->dtype_code > 255 ||
	    m->dtype_bits > 255 || m->dtype_lanes > 65535 ||
	    td_dtype_check(dt, reason, sizeof(reason)) < 0 ||
	    td_layout(dt, (int32_t)m->n_shape, m->shape, m->strides, strides, &nbytes, reason,
		      sizeof(reason)) < 0 ||
	    nbytes != m->nbytes) {
		snprintf(why, why_len, "a descriptor for '%s' that fails this node's checks",
			 pl->name);
		rm_pull_fail(pl, -EPROTO, "its descriptor fails this node's checks");
		return -EPROTO;
	}
	if (pl->wait && pull_receiving(rm, pl->name)) {
		/* Another pull is making this replica: end A's lease, ask again soon. */
		pull_done_send(rp, pl->id);
		pl->st = PL_WAITING;
		pl->told = true; /* A's answer is there: ask again (not joinable meanwhile) */
		pl->wait_watched = false;
		uv_timer_start(&pl->timer, rm_on_pull_timeout, 10, 0);
		return 0;
	}
	if (rep)
		rm_replica_drop(rm, rep, "the peer publishes a newer generation");
	r = replica_share_room(rm, rp, nbytes, reason, sizeof(reason));
	if (r < 0) {
		rm_pull_fail(pl, r, "%s", reason);
		return 0;
	}
	a.name = pl->name;
	a.name_len = pl->name_len;
	a.dtype = dt;
	a.ndim = (int32_t)m->n_shape;
	a.shape = m->shape;
	a.strides = m->strides;
	/* A GPU tensor's replica: on this node's device of that type and ordinal. */
	a.device =
		(DLDevice){ m->device_type ? (DLDeviceType)m->device_type : kDLCPU, m->device_id };
	a.mode = 0444;
	a.replica = true;
	/* Inline bytes are written by the daemon: the replica may share a slab, as a put's. */
	a.shared = m->data.len > 0 && a.device.device_type == kDLCPU;
	a.tx = pl->set ? pl->set->tx : 0;
	a.replace = pl->set != NULL; /* the set's commit swaps an older replica out */
	if (m->data.len && m->data.len != nbytes) {
		snprintf(why, why_len, "inline bytes of '%s': %zu, not %" PRIu64, pl->name,
			 m->data.len, nbytes);
		rm_pull_fail(pl, -EPROTO, "it sent %zu bytes inline for %" PRIu64, m->data.len,
			     nbytes);
		return -EPROTO;
	}
	r = registry_create(reg, &rm->rc, &a, &t, &pl->lease, reason, sizeof(reason));
	if (r == 0 || r == -EINPROGRESS) {
		/* Its clients see A's version of it, which after= compares with. */
		t->origin_generation = m->generation;
		t->origin_commit = m->commit;
	}
	if (r == -EINPROGRESS) {
		pull_gpu_begin(pl, m, t, nbytes);
		return 0;
	}
	if (r < 0) {
		rm_pull_fail(pl, r, "%s its replica on this node: %s",
			     r == -ENOSPC || r == -EDQUOT ? "no room for" : "cannot make", reason);
		return 0;
	}
	assert(pl->st == PL_ASKING && !pl->map);
	pl->st = PL_RECEIVING;
	pl->generation = m->generation;
	pl->watched = m->watched;
	pl->nbytes = nbytes;
	pl->t = t;
	if (m->data.len) { /* inline: the bytes are here */
		r = t->alloc.ops->write(&t->alloc, 0, m->data.data, m->data.len);
		if (r < 0) {
			rm_pull_fail(pl, r, "cannot write its replica (%" PRIu64 " bytes): %s",
				     nbytes, strerror(-r));
			return 0;
		}
		rm_pull_complete(pl);
		return 0;
	}
	if (nbytes) {
		pl->map_len = (size_t)nbytes;
		/* Populated a slice at a time, ahead of the receive (populate_step). */
		pl->map =
			mmap(NULL, pl->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, t->alloc.fd, 0);
		if (pl->map == MAP_FAILED) {
			int e = errno;

			pl->map = NULL;
			rm_pull_fail(pl, -e, "cannot map its replica (%" PRIu64 " bytes): %s",
				     nbytes, strerror(e));
			return 0;
		}
		rm_populate_kick(rm);
	}
	uv_timer_start(&pl->timer, rm_on_pull_timeout,
		       PULL_BASE_MS + (uint64_t)nbytes / PULL_BYTES_PER_MS, 0);
	pull_go(pl);
	return 0;
}

/* The bytes are in place: the replica is sealed, published and handed out. */
void rm_pull_complete(struct pull *pl)
{
	struct remote *rm = pl->rm;
	struct registry *reg = rm->env->reg;
	char reason[400];
	struct replica *rep;
	struct tensor *t;
	int r;

	pull_assert_receiving(pl);
	if (pl->gpu && !pl->filled && pl->nbytes) { /* the bytes go to the device first */
		struct gjob *j;

		if (pl->allocating) { /* in before the memory: rm_pull_allocated() goes on */
			pl->in_host = true;
			return;
		}
		j = calloc(1, sizeof(*j));
		if (j) {
			j->kind = GJ_FILL;
			j->pl = pl;
			j->a = pl->t->alloc;
			j->buf = pl->map;
			j->len = pl->map_len;
		}
		if (!j || rm_gjob_submit(rm, j) < 0) {
			free(j);
			rm_pull_fail(pl, -ENOMEM, "out of memory");
			return;
		}
		pl->map = NULL; /* the job's now */
		pl->job = j;
		return;
	}
	if (pl->map) {
		munmap(pl->map, pl->map_len);
		pl->map = NULL;
	}
	if (pl->set) { /* published with the others, in one commit */
		assert(!pl->done && pl->set->n_done < pl->set->count);
		pl->done = true;
		uv_timer_stop(&pl->timer);
		if (++pl->set->n_done == pl->set->count)
			rm_set_publish(pl->set);
		return;
	}
	r = registry_publish(reg, &rm->rc, pl->name, pl->name_len, &t, reason, sizeof(reason));
	if (r < 0) {
		rm_pull_fail(pl, r, "cannot publish its replica: %s", reason);
		return;
	}
	/* Stale (A told of a change after its reply): its waiters get it, nobody after. */
	rep = pl->stale ? NULL : calloc(1, sizeof(*rep));
	if (rep) {
		memcpy(rep->name, pl->name, pl->name_len + 1);
		rep->name_len = pl->name_len;
		rep->rp = pl->rp;
		rep->tensor_id = t->id;
		rep->generation = pl->generation;
		rep->nbytes = pl->nbytes;
		rep->watched = pl->watched;
		if (!rm_replica_link(rm, rep)) {
			free(rep);
			rep = NULL;
		}
	}
	figure_count(FIG_remote_pulls_total, 1);
	pl->rp->p->remote.pulled++;
	pl->rp->p->remote.pulled_bytes += pl->nbytes;
	figure_count(FIG_remote_pull_bytes_total, pl->nbytes);
	log_debug("replica '%s': pulled, %" PRIu64 " bytes in %.3f ms", pl->name, pl->nbytes,
		  (double)(now_ns() - pl->started_ns) / 1e6);
	uv_timer_stop(&pl->timer);
	rm_answer_local(pl, rep && rep->watched);
	/* Waiters hold their leases now: the creator's goes. */
	registry_release(reg, &rm->rc, pl->lease);
	if (!rep) /* stale or untracked: unlinked at once, its leases keep it */
		registry_unlink(reg, &rm->rc, pl->name, pl->name_len, reason, sizeof(reason));
	rm_pull_free(pl);
}

/*
 * A says names changed: their replicas are dropped (leases keep the
 * bytes), and a pull A answered before the change is not kept as watched.
 */
int rm_on_changed(struct rpeer *rp, const Tensord__PeerChanged *m, char *why, size_t why_len)
{
	struct remote *rm = rp->rm;
	char full[TENSORD_NAME_MAX + 1];
	const char *peer = rp->p->name;
	struct replica *r;
	struct pull *pl;

	for (size_t i = 0; i < m->n_names; i++) {
		if ((size_t)snprintf(full, sizeof(full), "@%s/%s", peer, m->names[i]) >=
		    sizeof(full)) {
			snprintf(why, why_len, "a change of a name too long for a replica");
			return -EPROTO;
		}
		r = rm_replica_find(rm, full);
		if (r && r->rp == rp) {
			figure_count(FIG_remote_replicas_changed_total, 1);
			rm_replica_drop(rm, r, "its peer published it anew or unlinked it");
		}
		LIST_FOREACH(pl, &rm->pulls, link)
		if (!pl->dead && pl->rp == rp && strcmp(pl->name, full) == 0 &&
		    pl->st == PL_RECEIVING)
			pl->stale = true;
		/* Waiting pulls ask again (after this loop: asking may fail one). */
		LIST_FOREACH(pl, &rm->pulls, link)
		if (!pl->dead && pl->rp == rp && pl->st == PL_WAITING &&
		    strcmp(pl->name, full) == 0) {
			pl->told = true;
			uv_timer_start(&pl->timer, rm_on_pull_timeout, 0, 0);
		}
	}
	return 0;
}

/* B no longer holds r: A need not tell of its changes (unless a pull is on the way). */
void rm_unwatch_send(struct remote *rm, struct replica *r)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerUnwatch u = TENSORD__PEER_UNWATCH__INIT;
	char *name = r->name + strlen(r->rp->p->name) + 2;

	if (!r->watched || !r->rp->up || pull_by_name(rm, r->name))
		return;
	u.n_names = 1;
	u.names = &name;
	f.body_case = TENSORD__PEER_FRAME__BODY_UNWATCH;
	f.unwatch = &u;
	rm_send_frame(r->rp, &f);
}

/*
 * A waiting pull nobody waits on any more lingers for the next wait of its
 * name, then ends (A holds nothing for it).
 */
void rm_pull_unwanted(struct pull *pl)
{
	if (pl->wait && pl->st == PL_WAITING && LIST_EMPTY(&pl->waits))
		pull_wait_arm(pl);
}
