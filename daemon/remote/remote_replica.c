/*
 * Remote attach, node B: the replicas (docs/remote.md, "Leases and
 * replicas across nodes", "Per-peer shares"). A replica is a pulled tensor
 * this daemon published as "@PEER/NAME": found by name, counted in the
 * figures and its peer's, dropped when its peer says the name changed
 * (PeerChanged) or to make room within its peer's share
 * (--peer-max-replica-bytes), and unwatched on A when B no longer holds
 * it. Pulling them is remote_pull.c.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <search.h>
#include <sys/queue.h>

#include "common/desc.h"
#include "daemon/figures.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

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
int rm_replica_share_room(struct remote *rm, struct rpeer *rp, uint64_t nbytes, char *why,
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

	if (!r->watched || !r->rp->up || rm_pull_by_name(rm, r->name))
		return;
	u.n_names = 1;
	u.names = &name;
	f.body_case = TENSORD__PEER_FRAME__BODY_UNWATCH;
	f.unwatch = &u;
	rm_send_frame(r->rp, &f);
}
