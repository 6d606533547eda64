/*
 * Remote attach, node B: pulling "@PEER/NAME" for this node's clients
 * (docs/remote.md, "Remote attach: the data flow"): a pull's ids, its
 * question to A and A's answer, the replica made by this daemon's
 * pseudo-client, its bytes received into its mapping, published, and
 * handed to the attaches waiting on it; a failed pull's end. One pull per
 * name. The attaches themselves are remote_attach.c, waiting pulls
 * remote_wait.c, GPU replicas remote_pull_gpu.c, the replicas kept
 * remote_replica.c.
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
 * A pull's states, and what the asserts (here, in remote_wait.c and in
 * remote_pull_gpu.c) hold it to:
 *   PL_ASKING ──PullReply──▶ PL_RECEIVING (bytes coming, or a GPU replica's
 *       memory being allocated) ──▶ published (rm_pull_complete()) and freed;
 *   PL_ASKING ──"not yet"──▶ PL_WAITING (only a pull that waits) ──▶ PL_ASKING;
 *   any state ──failure──▶ ended (rm_pull_end_failed()): freed, or dead while
 *       UCX may still write its mapping (posted), then freed by the receive's end.
 * A dead pull is on rm->pulls but in no other sense: no waits, no timer, never
 * joined, answered or failed again. A pull is freed with no waits left, each
 * having been answered; rm->figs->pulls counts the pulls on rm->pulls.
 */

void rm_pwait_free(struct pwait *w)
{
	free(w->have_shares);
	free(w);
}

struct pull *rm_pull_by_name(struct remote *rm, const char *name)
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
struct pull *rm_pull_busy(struct remote *rm, const char *name)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && pl->st != PL_WAITING && strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

/* A pull of name that an attach without a wait may join (one waits for none), or NULL. */
struct pull *rm_pull_joinable(struct remote *rm, const char *name)
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

uint64_t rm_pull_new_id(struct remote *rm)
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
			rm_sync_park(pl->rp, w);
			continue;
		}
		pl->rm->env->hooks.attach_local(w->cl, w->id, pl->name, pl->name_len, w->have_id,
						w->have_shares, w->n_have_shares, false);
		rm_pwait_free(w);
	}
}

int rm_pull_ask(struct pull *pl, uint64_t have_generation)
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

/* B has memory ready for pl's bytes: A sends them. */
void rm_pull_go(struct pull *pl)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullGo g = TENSORD__PEER_PULL_GO__INIT;

	g.id = pl->id;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_GO;
	f.pull_go = &g;
	rm_send_frame(pl->rp, &f);
}

/* A's answer: the replica is current, or the descriptor of a new one to receive. */
int rm_on_pull_reply(struct rpeer *rp, const Tensord__PeerPullReply *m, char *why, size_t why_len)
{
	struct remote *rm = rp->rm;
	struct registry *reg = rm->env->reg;
	struct pull *pl = rm_pull_by_id(rm, m->id);
	struct create_args a = { 0 };
	char reason[400];
	int64_t strides[TENSORD_NDIM_MAX];
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
		rm_pull_wait(pl, m->watched);
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
	if (td_desc_from_wire(m->dtype_code, m->dtype_bits, m->dtype_lanes, m->n_shape,
			      m->n_strides, true, &dt, reason, sizeof(reason)) < 0 ||
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
	r = rm_replica_share_room(rm, rp, nbytes, reason, sizeof(reason));
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
		rm_pull_gpu_begin(pl, m, t, nbytes);
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
	rm_pull_go(pl);
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

	rm_pull_assert_receiving(pl);
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
