/*
 * Remote attach, node A: the names a peer holds replicas of (docs/
 * remote.md, "Freshness"). A single pull served, or answered "current" or "not
 * yet", watches its name for the peer; the step that changes a watched
 * name tells the peer (PeerChanged) on the connection that carried the
 * replies, and the name is watched no more until the next pull. A peer's
 * Unwatch drops names it no longer holds; a connection's end drops all.
 */
#include <assert.h>
#include <search.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"
#include "remote_int.h"

bool rm_watch_add(struct rpeer *rp, const char *name)
{
	char *k;

	assert(rp->n_watched <= rp->rm->figs->watched);
	if (tfind(name, &rp->watched, rm_name_cmp))
		return true;
	if (rp->n_watched >= REMOTE_WATCH_MAX || !(k = strdup(name)))
		return false;
	if (!tsearch(k, &rp->watched, rm_name_cmp)) {
		free(k);
		return false;
	}
	rp->n_watched++;
	rp->rm->figs->watched++;
	assert(rp->n_watched <= REMOTE_WATCH_MAX);
	return true;
}

/* Whether rp watched name; it no longer does. */
static bool watch_del(struct rpeer *rp, const char *name)
{
	char **at = rp->n_watched ? tfind(name, &rp->watched, rm_name_cmp) : NULL;
	char *k;

	if (!at)
		return false;
	assert(rp->n_watched > 0 && rp->rm->figs->watched >= rp->n_watched);
	k = *at;
	tdelete(name, &rp->watched, rm_name_cmp);
	free(k);
	rp->n_watched--;
	rp->rm->figs->watched--;
	return true;
}

void rm_watch_clear(struct rpeer *rp)
{
	assert(rp->rm->figs->watched >= rp->n_watched);
	assert(!rp->n_watched == !rp->watched);
	tdestroy(rp->watched, free);
	rp->watched = NULL;
	rp->rm->figs->watched -= rp->n_watched;
	rp->n_watched = 0;
}

/* A PeerChanged of names[0..n) to rp, and empties the batch. */
static void changed_send(struct rpeer *rp, char **names, uint64_t *gens, size_t *n)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerChanged c = TENSORD__PEER_CHANGED__INIT;

	c.n_names = c.n_generations = *n;
	c.names = names;
	c.generations = gens;
	f.body_case = TENSORD__PEER_FRAME__BODY_CHANGED;
	f.changed = &c;
	rm_send_frame(rp, &f);
	*n = 0;
}

/*
 * Told in the step that made the changes, on the connection that carried
 * the replies: B hears of a change after the reply it makes stale, and
 * before any later reply. A batch stays under a frame's 16 KiB.
 */
enum { CHANGED_BATCH = 48 }; /* names of at most 255 bytes each */

struct changed_all {
	struct rpeer *rp;
	char *names[CHANGED_BATCH];
	uint64_t gens[CHANGED_BATCH];
	size_t k;
};

static void changed_all_add(const void *node, VISIT which, void *arg)
{
	struct changed_all *ca = arg;

	if (which != postorder && which != leaf)
		return;
	ca->names[ca->k] = *(char *const *)node;
	ca->gens[ca->k++] = 0;
	if (ca->k == CHANGED_BATCH)
		changed_send(ca->rp, ca->names, ca->gens, &ca->k);
}

/* Changes of the step were lost (out of memory): rp is told every name it watches. */
static void changed_all(struct rpeer *rp)
{
	struct changed_all ca = { .rp = rp };

	assert(rp->n_watched && rp->watched);
	twalk_r(rp->watched, changed_all_add, &ca);
	if (ca.k)
		changed_send(rp, ca.names, ca.gens, &ca.k);
	rm_watch_clear(rp);
}

void remote_on_commit(struct remote_env *env, const struct reg_change *v, size_t n, bool lost)
{
	char *names[CHANGED_BATCH];
	uint64_t gens[CHANGED_BATCH];
	size_t k;

	if (!env->rm)
		return;
	for (unsigned i = 0; i < env->peers->n_peers; i++) {
		struct rpeer *rp = env->peers->peers[i]->data;

		if (!rp || !rp->up || !rp->n_watched)
			continue;
		if (lost) {
			changed_all(rp);
			continue;
		}
		k = 0;
		for (size_t j = 0; j < n; j++) {
			if (!watch_del(rp, v[j].name))
				continue;
			names[k] = (char *)v[j].name;
			/* Told that it changed, which B asks again about; its
			 * generation only when the peers' uid may read it. */
			gens[k++] = registry_may_hear(v[j].owner_uid, v[j].owner_gid, v[j].mode,
						      &rp->rc)
					    ? v[j].generation
					    : 0;
			if (k == CHANGED_BATCH)
				changed_send(rp, names, gens, &k);
		}
		if (k)
			changed_send(rp, names, gens, &k);
	}
}

void rm_on_unwatch(struct rpeer *rp, const Tensord__PeerUnwatch *m)
{
	for (size_t i = 0; i < m->n_names; i++)
		watch_del(rp, m->names[i]);
}
