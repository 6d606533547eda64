/*
 * Remote attach of host tensors (remote.h; docs/remote.md): what holds
 * the parts together. Starting and stopping, peers up and down and their
 * frames handed to the parts, the data path's callbacks, the GPU worker's
 * jobs, mappings populated ahead of UCX, the replica keep timer, and a
 * client's close and cancel. Serving (node A) is remote_serve.c,
 * remote_serve_set.c and remote_watch.c; pulling (node B) remote_attach.c,
 * remote_pull.c, remote_wait.c, remote_replica.c and remote_pull_gpu.c;
 * pulling a set remote_set.c; remote_int.h is what they share.
 *
 * Pulling, on B, for an attach of "@a/m/w":
 *   Pull{id, "m/w", have_generation} ──▶ A
 *   ◀── PullReply{id, descriptor, generation} (or current, or an error)
 *   a replica created by this daemon's own pseudo-client (unpublished),
 *   its memfd mapped writable
 *   PullGo{id} ──▶ A;  ◀══ one UCX active message tagged id: the bytes
 *   unmapped, published (sealed), the creator's lease ended; every
 *   waiting attach gets a normal local lease on it.
 * Serving, on A: a Pull takes a lease owned by the peer's reg_client
 * (uid REMOTE_PEER_UID), after the export rule and the mode check; a
 * PullGo maps the tensor read-only and sends it; the send's end unmaps it
 * and ends the lease. The peer's connection ending ends every such lease.
 *
 * A mapping UCX may still write (a receive) or read (a send) is never
 * unmapped before UCX says it is done with it, whatever else failed: a
 * failed pull whose receive is posted stays, dead, until its completion.
 */
#include "remote.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <search.h>
#include <sys/mman.h>
#include <sys/queue.h>
#include <unistd.h>

#include "daemon/figures.h"
#include "daemon/memory/gpu_worker.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"
#include "xport.h"

static void gjob_done(void *arg);

static void gjob_run(void *arg)
{
	struct gjob *j = arg;

	j->ran_ns = now_ns();
	/*
	 * The copy out lands in fresh anonymous memory: fault it in at once
	 * (the kernel does it in bulk) rather than page by page under the
	 * driver's copy from its bounce buffer. On the H200 the copy of 256
	 * MiB took 166-237 ms that way.
	 */
	if (j->kind == GJ_STAGE)
		(void)madvise(j->buf, j->len, MADV_POPULATE_WRITE);
	if (j->kind == GJ_ALLOC)
		registry_alloc_run(&j->alloc);
	else
		j->status = j->a.ops->copy(&j->a, 0, j->buf, j->len, j->kind == GJ_STAGE);
	j->done_ns = now_ns();
}

/* Queues j for the GPU worker: 0, or -ENOMEM with nothing queued (j is the caller's). */
int rm_gjob_submit(struct remote *rm, struct gjob *j)
{
	j->rm = rm;
	j->reg = rm->env->reg;
	j->queued_ns = now_ns();
	LIST_INSERT_HEAD(&rm->jobs, j, link);
	if (gpu_worker_submit(gjob_run, gjob_done, j) == 0)
		return 0;
	LIST_REMOVE(j, link);
	return -ENOMEM;
}

static void gjob_done(void *arg)
{
	struct gjob *j = arg;

	static const char *const what[] = { "copy out to host memory", "allocation",
					    "copy in from host memory" };

	if (j->rm)
		LIST_REMOVE(j, link);
	/* What each step of a GPU tensor's crossing costs (docs/remote.md, "Measured"). */
	log_debug("remote attach: GPU %s of %" PRIu64 " bytes: %.2f ms on the GPU worker, "
		  "queued %.2f ms",
		  what[j->kind], j->kind == GJ_ALLOC ? j->alloc.t->nbytes : (uint64_t)j->len,
		  (double)(j->done_ns - j->ran_ns) / 1e6, (double)(j->ran_ns - j->queued_ns) / 1e6);
	switch (j->kind) {
	case GJ_STAGE:
		rm_serve_staged(j);
		break;
	case GJ_ALLOC:
		rm_pull_allocated(j);
		break;
	case GJ_FILL:
		rm_pull_filled(j);
		break;
	}
	free(j);
}

/* Host memory for a copy of a GPU tensor: an anonymous mapping, or NULL (errno). */
void *rm_stage_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

bool remote_exported(const struct remote_config *rc, const char *peer, const char *name, size_t len)
{
	for (unsigned i = 0; i < rc->n_exports; i++) {
		const struct remote_export *e = &rc->exports[i];
		size_t pl = strlen(e->prefix);
		bool to_peer = e->n_peers == 0;

		if (pl > len || memcmp(e->prefix, name, pl) != 0)
			continue;
		for (unsigned j = 0; j < e->n_peers && !to_peer; j++)
			to_peer = strcmp(e->peers[j], peer) == 0;
		if (to_peer)
			return true;
	}
	return false;
}

void rm_send_frame(struct rpeer *rp, Tensord__PeerFrame *f)
{
	if (peer_send(rp->p, f) < 0)
		log_debug("peer %s: a frame not sent: the connection is down", rp->p->name);
}

/* Names in tsearch trees: a peer's watched names (A), the replicas by name (B). */
int rm_name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

/*
 * Mappings of a transfer are populated ahead of UCX, a slice per loop turn
 * (POPULATE_SLICE): faulting a gigabyte in page by page as UCX copies costs
 * a quarter of the transfer's time here, and MAP_POPULATE would hold the
 * loop for a tenth of a second or more. A slice is populated only while
 * its mapping lives; everything runs on the loop thread, so an unmap never
 * races with a populate.
 */
#define POPULATE_SLICE (8u << 20)

static void populate_step(uv_idle_t *h);

void rm_populate_kick(struct remote *rm)
{
	if (!rm->no_populate && !uv_is_active((uv_handle_t *)&rm->populate))
		uv_idle_start(&rm->populate, populate_step);
}

/* One slice more of [map, map + len) from *off: true while some is left. */
static bool populate_slice(struct remote *rm, void *map, size_t len, size_t *off, int advice)
{
	size_t n;

	if (!map || *off >= len || rm->no_populate)
		return false;
	n = len - *off < POPULATE_SLICE ? len - *off : POPULATE_SLICE;
	if (madvise((char *)map + *off, n, advice) < 0) {
		if (errno == EINVAL) {
			log_info("remote attach: this kernel cannot populate ahead (madvise: %s): "
				 "transfers fault their pages in",
				 strerror(errno));
			rm->no_populate = true;
		}
		*off = len; /* a failure here is UCX's fault to take later, as without it */
		return false;
	}
	*off += n;
	return *off < len;
}

static void populate_step(uv_idle_t *h)
{
	struct remote *rm = h->data;
	struct remote_env *env = rm->env;
	bool more = false;
	struct pull *pl;
	struct serve *sv;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead)
		more |= populate_slice(rm, pl->map, pl->map_len, &pl->pop_off, MADV_POPULATE_WRITE);
	for (unsigned i = 0; i < env->peers->n_peers; i++) {
		struct rpeer *rp = env->peers->peers[i]->data;

		if (rp)
			TAILQ_FOREACH(sv, &rp->serves, link)
		more |= populate_slice(rm, sv->map, sv->map_len, &sv->pop_off, MADV_POPULATE_READ);
	}
	if (!more)
		uv_idle_stop(h);
}

/* --- the data path's callbacks ---------------------------------------------------- */

static void *x_recv_dest(void *ctx, uint64_t tag, size_t len)
{
	struct pull *pl = rm_pull_by_id(ctx, tag);

	if (!pl || pl->dead || pl->st != PL_RECEIVING || pl->posted || len != pl->nbytes ||
	    !pl->map)
		return NULL;
	pl->posted = true;
	return pl->map;
}

static void x_recv_done(void *ctx, uint64_t tag, int status)
{
	struct pull *pl = rm_pull_by_id(ctx, tag);

	if (!pl)
		return;
	pl->posted = false;
	if (pl->dead) {
		if (pl->map)
			munmap(pl->map, pl->map_len);
		rm_pull_free(pl);
		return;
	}
	if (status < 0)
		rm_pull_fail(pl, status == -ECONNRESET ? -ECONNRESET : status,
			     "the transfer failed: %s", strerror(-status));
	else
		rm_pull_complete(pl);
}

static void x_send_done(void *ctx, void *arg, int status)
{
	struct serve *s = arg;
	struct rpeer *rp = s->rp;

	rp->inflight -= s->len;
	rp->rm->figs->inflight_bytes -= s->len;
	if (status < 0)
		log_info("peer %s: sending pull %" PRIu64 " (%" PRIu64 " bytes) failed: %s",
			 rp->p->name, s->id, s->len, strerror(-status));
	else {
		figure_count(FIG_remote_served_total, 1);
		figure_count(FIG_remote_served_bytes_total, s->len);
		rp->p->remote.served++;
		rp->p->remote.served_bytes += s->len;
	}
	rm_serve_end(s);
	rm_serve_start_queued(rp);
}

static void fail_pulls_of(struct remote *rm, struct rpeer *rp, const char *reason)
{
	struct spull *sp, *snext;
	struct pull *pl, *next;
	char why[700];

	/* Sets first: each ends its members, which the loop below would otherwise meet. */
	for (sp = LIST_FIRST(&rm->sets); sp; sp = snext) {
		snext = LIST_NEXT(sp, link);
		if (sp->rp != rp)
			continue;
		snprintf(why, sizeof(why), "peer %s: %s: %s", rp->p->name, sp->what, reason);
		rm_set_fail(sp, -ECONNRESET, why);
	}

	for (pl = LIST_FIRST(&rm->pulls); pl; pl = next) {
		next = LIST_NEXT(pl, link);
		if (pl->rp == rp && !pl->dead)
			rm_pull_fail(pl, -ECONNRESET, "%s", reason);
	}
}

static void x_ep_failed(void *ctx, void *ep_ctx, int status)
{
	struct rpeer *rp = ep_ctx;
	char reason[200];

	snprintf(reason, sizeof(reason), "its UCX endpoint failed: %s", strerror(-status));
	log_warn("peer %s: %s", rp->p->name, reason);
	fail_pulls_of(rp->rm, rp, reason);
	xport_ep_close(rp->ep);
	rp->ep = NULL;
}

/* --- peers up and down --------------------------------------------------------------- */

static void on_peer_up(void *ctx, struct peer *p)
{
	struct remote *rm = ctx;
	struct rpeer *rp = p->data;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerUcx u = TENSORD__PEER_UCX__INIT;
	const void *addr;
	size_t len;

	if (!rp) {
		rp = calloc(1, sizeof(*rp));
		if (!rp) {
			log_error("peer %s: out of memory: no remote attach with it", p->name);
			return;
		}
		rp->rm = rm;
		rp->p = p;
		TAILQ_INIT(&rp->serves);
		p->data = rp;
	}
	rp->epoch++;
	rp->up = true;
	registry_client_init(&rp->rc, UINT64_MAX - 1000 - rp->epoch, REMOTE_PEER_UID,
			     REMOTE_PEER_UID, 0);
	rp->rc_live = true;
	if (!rm->x)
		return;
	xport_address(rm->x, &addr, &len);
	u.address.data = (uint8_t *)addr;
	u.address.len = len;
	f.body_case = TENSORD__PEER_FRAME__BODY_UCX;
	f.ucx = &u;
	rm_send_frame(rp, &f);
}

static void on_peer_down(void *ctx, struct peer *p, const char *reason)
{
	struct remote *rm = ctx;
	struct rpeer *rp = p->data;
	struct serve *s, *snext;
	struct replica *r, *rnext;
	char why[PEER_ERROR_MAX + 40];

	if (!rp || !rp->up)
		return;
	rp->up = false;
	rm_watch_clear(rp); /* its replicas go below: the next connection starts afresh */
	snprintf(why, sizeof(why), "connection lost: %s", reason);
	rm_syncs_fail(rp, -ECONNRESET, why);
	rm_lists_fail(rm, rp, -ECONNRESET, why);
	fail_pulls_of(rm, rp, why);
	/* Its replicas: this node can no longer tell whether they are current. */
	for (r = LIST_FIRST(&rm->replicas); r; r = rnext) {
		rnext = LIST_NEXT(r, link);
		if (r->rp == rp)
			rm_replica_drop(rm, r, "its peer's connection was lost");
	}
	/* Serving: sends in flight end with an error once the endpoint closes. */
	for (s = TAILQ_FIRST(&rp->serves); s; s = snext) {
		snext = TAILQ_NEXT(s, link);
		if (s->st != SV_SENDING)
			rm_serve_end(s);
	}
	xport_ep_close(rp->ep);
	rp->ep = NULL;
	free(rp->addr);
	rp->addr = NULL;
	{
		uint32_t n = rp->rc.n_leases;

		registry_client_gone(rm->env->reg, &rp->rc);
		rm->figs->pull_leases -= n;
	}
	rp->rc_live = false;
}

static int peer_frame(struct remote *rm, struct rpeer *rp, const Tensord__PeerFrame *f, char *why,
		      size_t why_len);

static int on_peer_frame(void *ctx, struct peer *p, const Tensord__PeerFrame *f, char *why,
			 size_t why_len)
{
	struct remote *rm = ctx;
	struct rpeer *rp = p->data;
	int r;

	if (!rp || !rp->up) {
		snprintf(why, why_len, "remote attach is not set up for this peer");
		return -EPROTO;
	}
	rm->env->hooks.frame_seen(rm->env->hooks.ctx);
	r = peer_frame(rm, rp, f, why, why_len);
	/* A pull's next frame (its answer, or the next pull) often follows within microseconds. */
	rm->env->hooks.frame_done(rm->env->hooks.ctx);
	return r;
}

static int peer_frame(struct remote *rm, struct rpeer *rp, const Tensord__PeerFrame *f, char *why,
		      size_t why_len)
{
	switch (f->body_case) {
	case TENSORD__PEER_FRAME__BODY_UCX:
		if (!rm->x)
			return 0; /* no data path here: attaches say why */
		if (!f->ucx->address.len) {
			snprintf(why, why_len, "an empty UCX worker address");
			return -EPROTO;
		}
		xport_ep_close(rp->ep);
		rp->ep = NULL;
		free(rp->addr);
		rp->addr = malloc(f->ucx->address.len);
		if (!rp->addr) {
			snprintf(why, why_len, "out of memory for its UCX worker address");
			return -ENOMEM;
		}
		memcpy(rp->addr, f->ucx->address.data, f->ucx->address.len);
		rp->addr_len = f->ucx->address.len;
		/*
		 * The endpoint is made now, not at the first send, so that UCX's
		 * wireup is over before any tensor is on the way: UCX 1.13 aborts
		 * a receiving worker whose peer dies while a wireup reply of its
		 * is still pending behind a transfer (an assertion purging the
		 * TCP endpoint's pending queue). Failing here is not fatal: the
		 * first send tries again.
		 */
		{
			char cwhy[300] = "";

			if (xport_connect(rm->x, rp->addr, rp->addr_len, rp, &rp->ep, cwhy,
					  sizeof(cwhy)) < 0) {
				log_warn("peer %s: UCX endpoint: %s; the first pull tries again",
					 rp->p->name, cwhy);
				rp->ep = NULL;
			}
		}
		return 0;
	case TENSORD__PEER_FRAME__BODY_PULL:
		rm_on_pull(rp, f->pull);
		return 0;
	case TENSORD__PEER_FRAME__BODY_PULL_REPLY:
		return rm_on_pull_reply(rp, f->pull_reply, why, why_len);
	case TENSORD__PEER_FRAME__BODY_PULL_GO:
		rm_on_pull_go(rp, f->pull_go->id);
		return 0;
	case TENSORD__PEER_FRAME__BODY_PULL_DONE:
		rm_on_pull_done(rp, f->pull_done->id);
		return 0;
	case TENSORD__PEER_FRAME__BODY_CHANGED:
		if (f->changed->n_names != f->changed->n_generations) {
			snprintf(why, why_len, "a change list of %zu names and %zu generations",
				 f->changed->n_names, f->changed->n_generations);
			return -EPROTO;
		}
		return rm_on_changed(rp, f->changed, why, why_len);
	case TENSORD__PEER_FRAME__BODY_UNWATCH:
		rm_on_unwatch(rp, f->unwatch);
		return 0;
	case TENSORD__PEER_FRAME__BODY_SET_PULL:
		rm_on_set_pull(rp, f->set_pull);
		return 0;
	case TENSORD__PEER_FRAME__BODY_SET_PULL_REPLY:
		return rm_on_set_pull_reply(rp, f->set_pull_reply, why, why_len);
	case TENSORD__PEER_FRAME__BODY_NAME_LIST:
		rm_on_list(rp, f->name_list);
		return 0;
	case TENSORD__PEER_FRAME__BODY_NAME_LIST_REPLY:
		return rm_on_list_reply(rp, f->name_list_reply, why, why_len);
	case TENSORD__PEER_FRAME__BODY_SYNC:
		rm_on_sync(rp, f->sync->seq);
		return 0;
	case TENSORD__PEER_FRAME__BODY_SYNC_REPLY:
		if (f->sync_reply->seq > rp->sync_sent) {
			snprintf(why, why_len,
				 "a sync reply %" PRIu64 " to no sync sent (%" PRIu64 " sent)",
				 f->sync_reply->seq, rp->sync_sent);
			return -EPROTO;
		}
		rm_on_sync_reply(rp, f->sync_reply->seq);
		return 0;
	default:
		snprintf(why, why_len, "a frame of kind %d, which this node does not know",
			 (int)f->body_case);
		return -EPROTO;
	}
}

/* --- the replica policy -------------------------------------------------------------- */

static void on_keep(uv_timer_t *t)
{
	struct remote *rm = t->data;
	uint64_t now = now_ns(), keep = (uint64_t)rm->env->cfg->replica_keep_ms * 1000000u;
	struct replica *r, *next;
	struct tensor *tn;

	for (r = LIST_FIRST(&rm->replicas); r; r = next) {
		next = LIST_NEXT(r, link);
		tn = registry_lookup(rm->env->reg, &rm->rc, r->name, r->name_len);
		if (!tn || tn->id != r->tensor_id) {
			rm_unwatch_send(rm, r);
			rm_replica_unlink(rm, r);
			free(r);
		} else if (tn->refcount) {
			r->idle_since_ns = 0;
		} else if (!r->idle_since_ns) {
			r->idle_since_ns = now;
		} else if (now - r->idle_since_ns >= keep) {
			rm_unwatch_send(rm, r);
			rm_replica_drop(rm, r, "unleased for --replica-keep");
		}
	}
}

/* --- start, stop ------------------------------------------------------------------------ */

void remote_start(struct remote_env *env)
{
	struct remote *rm;
	struct xport_cbs cbs;
	unsigned tick;
	int r;

	if (!env->peers->on)
		return;
	rm = calloc(1, sizeof(*rm));
	if (!rm) {
		log_error("remote attach: out of memory: off");
		return;
	}
	rm->env = env;
	rm->figs = env->figs;
	rm->max_replica_bytes = env->cfg->max_replica_bytes;
	if (!rm->max_replica_bytes) {
		struct reg_device *d = registry_device(env->reg, (DLDevice){ kDLCPU, 0 });

		rm->max_replica_bytes = d && d->capacity ? d->capacity / 4 : UINT64_MAX;
	}
	LIST_INIT(&rm->pulls);
	LIST_INIT(&rm->replicas);
	LIST_INIT(&rm->sets);
	LIST_INIT(&rm->lists);
	LIST_INIT(&rm->jobs);
	registry_client_init(&rm->rc, UINT64_MAX - 1, (uint32_t)geteuid(), (uint32_t)getegid(),
			     (uint32_t)getpid());
	cbs = (struct xport_cbs){ .recv_dest = x_recv_dest,
				  .recv_done = x_recv_done,
				  .send_done = x_send_done,
				  .ep_failed = x_ep_failed,
				  .ctx = rm };
	r = xport_init(&rm->x, env->loop, &cbs, rm->why, sizeof(rm->why));
	if (r < 0)
		log_warn("remote attach: no data path, ignoring: %s", rm->why);
	else
		log_info("remote attach: %s; %u export rules, replicas kept %u ms after their "
			 "last lease, at most %" PRIu64 " bytes of them per peer",
			 xport_describe(rm->x), env->cfg->n_exports, env->cfg->replica_keep_ms,
			 rm->max_replica_bytes);
	uv_timer_init(env->loop, &rm->keep);
	rm->keep.data = rm;
	uv_idle_init(env->loop, &rm->populate);
	rm->populate.data = rm;
	rm->open_handles = 2;
	tick = env->cfg->replica_keep_ms / 4;
	tick = tick < 50 ? 50 : tick > 1000 ? 1000 : tick;
	uv_timer_start(&rm->keep, on_keep, tick, tick);
	env->rm = rm;
	env->peers->on_up = on_peer_up;
	env->peers->on_down = on_peer_down;
	env->peers->on_frame = on_peer_frame;
	env->peers->hooks_ctx = rm;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct remote *rm = h->data;

	if (--rm->open_handles == 0)
		free(rm);
}

void remote_stop(struct remote_env *env)
{
	struct remote *rm = env->rm;
	struct pull *pl, *next;
	struct replica *r;
	struct serve *s;
	struct gjob *j;

	if (!rm)
		return;
	rm->stopping = true;
	rm_lists_fail(rm, NULL, -ESHUTDOWN, "this daemon is stopping");
	for (unsigned i = 0; i < env->peers->n_peers; i++)
		if (env->peers->peers[i]->data)
			rm_syncs_fail(env->peers->peers[i]->data, -ESHUTDOWN,
				      "this daemon is stopping");
	while (!LIST_EMPTY(&rm->sets))
		rm_set_fail(LIST_FIRST(&rm->sets), -ESHUTDOWN, "this daemon is stopping");
	for (pl = LIST_FIRST(&rm->pulls); pl; pl = next) {
		next = LIST_NEXT(pl, link);
		if (!pl->dead)
			rm_pull_fail(pl, -ESHUTDOWN, "this daemon is stopping");
	}
	/* The peers' closes that follow are no news to remote attach now. */
	env->peers->on_up = NULL;
	env->peers->on_down = NULL;
	env->peers->on_frame = NULL;
	/* After this no UCX callback comes: what UCX held may go. */
	xport_fini(rm->x);
	rm->x = NULL;
	while ((pl = LIST_FIRST(&rm->pulls))) {
		if (pl->map)
			munmap(pl->map, pl->map_len);
		rm_pull_free(pl);
	}
	for (unsigned i = 0; i < env->peers->n_peers; i++) {
		struct rpeer *rp = env->peers->peers[i]->data;

		if (!rp)
			continue;
		while ((s = TAILQ_FIRST(&rp->serves)))
			rm_serve_end(s);
		if (rp->rc_live)
			registry_client_gone(env->reg, &rp->rc);
		rm_watch_clear(rp);
		free(rp->addr);
		free(rp);
		env->peers->peers[i]->data = NULL;
	}
	/* Their peers' counts went with the peers above: only the memory now. */
	tdestroy(rm->replica_index, rm_noop_free);
	rm->replica_index = NULL;
	while ((r = LIST_FIRST(&rm->replicas))) {
		LIST_REMOVE(r, link);
		free(r);
	}
	registry_client_gone(env->reg, &rm->rc);
	/* GPU jobs still running end after rm: they free what they hold and touch nothing else. */
	while ((j = LIST_FIRST(&rm->jobs))) {
		LIST_REMOVE(j, link);
		j->rm = NULL;
	}
	env->rm = NULL;
	uv_close((uv_handle_t *)&rm->keep, on_handle_closed);
	uv_close((uv_handle_t *)&rm->populate, on_handle_closed); /* the last frees rm */
}

void remote_client_gone(struct remote_env *env, struct client *cl)
{
	struct remote *rm = env->rm;
	struct pull *pl, *pnext;
	struct pwait *w, *next;
	struct spull *sp;

	if (!rm)
		return;
	LIST_FOREACH(sp, &rm->sets, link)
	if (sp->cl == cl)
		sp->cl = NULL; /* pulled and published all the same, as a single pull is */
	for (unsigned i = 0; i < env->peers->n_peers; i++)
		if (env->peers->peers[i]->data)
			rm_syncs_client_gone(env->peers->peers[i]->data, cl);
	rm_lists_client_gone(rm, cl);
	for (pl = LIST_FIRST(&rm->pulls); pl; pl = pnext) {
		pnext = LIST_NEXT(pl, link);
		for (w = LIST_FIRST(&pl->waits); w; w = next) {
			next = LIST_NEXT(w, link);
			if (w->cl == cl) {
				LIST_REMOVE(w, link);
				rm_pwait_free(w);
			}
		}
		rm_pull_unwanted(pl);
	}
}

int remote_cancel(struct remote_env *env, struct client *cl, uint64_t req_id)
{
	struct remote *rm = env->rm;
	struct pwait *w;
	struct pull *pl;
	char why[400];

	if (!rm)
		return -ENOENT;
	for (unsigned i = 0; i < env->peers->n_peers; i++)
		if (env->peers->peers[i]->data &&
		    rm_syncs_cancel(env->peers->peers[i]->data, cl, req_id) == 0)
			return 0;
	LIST_FOREACH(pl, &rm->pulls, link)
	LIST_FOREACH(w, &pl->waits, link)
	if (w->cl == cl && w->id == req_id && pl->wait) {
		snprintf(why, sizeof(why), "tensor '%s': the wait was cancelled", pl->name);
		rm_reply_status(env, cl, ATTACH, w->id, -ECANCELED, why);
		LIST_REMOVE(w, link);
		rm_pwait_free(w);
		rm_pull_unwanted(pl);
		return 0;
	}
	return -ENOENT;
}
