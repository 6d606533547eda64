/*
 * Remote attach, node B: GPU replicas (docs/remote.md, "GPU tensors
 * across nodes"). The replica's memory is allocated on the GPU worker
 * while its bytes are received into host memory; once both are there the
 * worker copies them in, and the replica is published as any other
 * (rm_pull_complete()).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/queue.h>

#include "common/desc.h"
#include "daemon/figures.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

/*
 * pl's replica t is on a GPU (docs/remote.md, "GPU tensors across nodes"):
 * registry_create() left its memory to the GPU worker. The bytes are
 * received into host memory meanwhile (PullGo goes at once; or they were
 * inline in m), and copied in once both are there (rm_pull_complete()).
 */
void rm_pull_gpu_begin(struct pull *pl, const Tensord__PeerPullReply *m, struct tensor *t,
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
			rm_pull_go(pl);
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
	rm_pull_assert_receiving(pl);
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
