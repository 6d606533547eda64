/*
 * Remote attach, node B: waiting pulls (docs/remote.md, "Remote attach:
 * the data flow": waits). An attach with a timeout or after= whose name A
 * has not published (or not anew) waits in a pull A answered "not yet":
 * told by A's PeerChanged, or asking again every second when A does not
 * watch; each attach until its own deadline; a pull nobody waits on
 * lingers for the next wait, then ends. The pull's timer, for waits and
 * for pulls that take too long.
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
	if (rm_pull_ask(pl, 0) < 0)
		rm_pull_fail(pl, -ECONNRESET, "the connection to it was lost");
}

/*
 * pl waits (PL_WAITING): its waits past their deadline end; with none
 * left it lingers for the next wait of the name, then ends; A is asked
 * again when it told of a change, or (A not watching) every second; the
 * timer is set for the next of these.
 */
void rm_pull_wait_arm(struct pull *pl)
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
void rm_pull_wait(struct pull *pl, bool watched)
{
	assert(pl->st == PL_ASKING && pl->wait); /* only a pull that waits hears "not yet" */
	pl->st = PL_WAITING;
	pl->wait_watched = watched;
	pl->told = false;
	pl->reask_ns = watched ? 0 : now_ns() + 1000000000u;
	rm_pull_wait_arm(pl);
}

void rm_on_pull_timeout(uv_timer_t *t)
{
	struct pull *pl = t->data;
	uint64_t ms = (now_ns() - pl->started_ns) / 1000000u;

	assert(!pl->dead); /* its end stopped the timer */
	if (pl->st == PL_WAITING) {
		rm_pull_wait_arm(pl);
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
struct pull *rm_pull_wait_joinable(struct remote *rm, const char *name, uint64_t after)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && pl->wait && pl->st == PL_WAITING && pl->wait_watched &&
	    pl->after == after && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

/*
 * A waiting pull nobody waits on any more lingers for the next wait of its
 * name, then ends (A holds nothing for it).
 */
void rm_pull_unwanted(struct pull *pl)
{
	if (pl->wait && pl->st == PL_WAITING && LIST_EMPTY(&pl->waits))
		rm_pull_wait_arm(pl);
}
