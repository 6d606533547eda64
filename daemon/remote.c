/*
 * Remote attach of host tensors (remote.h; docs/remote.md).
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
#include <stdarg.h>
#include <search.h>
#include <sys/mman.h>
#include <sys/queue.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "common/desc.h"
#include "dispatch_int.h"
#include "figures.h"
#include "gpu_worker.h"
#include "log.h"
#include "peer.h"
#include "reply.h"
#include "server.h"
#include "xport.h"

#define ATTACH TENSORD__REQUEST__BODY_ATTACH
/* A pull's deadline: 5 s and the size at 100 MB/s. */
#define PULL_BASE_MS 5000u
#define PULL_BYTES_PER_MS 100000u

struct rpeer;
struct gjob;

/* A: one pull of a peer's being served. */
struct serve {
	struct rpeer *rp;
	uint64_t id; /* the peer's pull id */
	uint64_t epoch;
	uint64_t lease;   /* in rp->rc, while epoch is current */
	struct tensor *t; /* borrowed: valid while that lease lives */
	uint64_t fd_off, len;
	void *map; /* owned; NULL until mapped (a GPU tensor's: its copy in host memory) */
	size_t map_len;
	size_t pop_off; /* populated ahead of UCX up to here (populate_step) */
	/*
	 * A GPU tensor's (docs/remote.md, "GPU tensors across nodes"): waiting
	 * for room to copy it out, then being copied by the GPU worker; the
	 * reply goes once its bytes are in host memory.
	 */
	enum { SV_STAGE_WAIT, SV_STAGING, SV_LEASED, SV_QUEUED, SV_SENDING } st;
	struct gjob *job; /* the copy under way; NULL: none */
	uint64_t staged;  /* bytes of host memory it counts in rp->staged */
	char *member;     /* a set's member: its name, for the reply (owned); NULL: a single pull */
	TAILQ_ENTRY(serve) link;
};

/* One peer as remote attach sees it (peer->data). */
struct rpeer {
	struct remote *rm;
	struct peer *p;
	struct xport_ep *ep; /* to its worker, made when its address comes; NULL: none */
	void *addr;          /* its worker's address (owned); NULL until it came */
	size_t addr_len;
	uint64_t epoch; /* connections up so far */
	bool up;
	struct reg_client rc; /* A: owns the pull leases of this connection */
	bool rc_live;
	uint64_t inflight; /* bytes being sent to it */
	uint64_t staged;   /* host memory holding copies of GPU tensors being served to it */
	unsigned n_serves;
	TAILQ_HEAD(, serve) serves;
	void *watched; /* A: tsearch tree of names it holds replicas of (owned strings) */
	unsigned n_watched;
};

/* B: a client's attach waiting on a pull. */
struct pwait {
	struct client *cl;
	uint64_t id, have_id;
	bool bind;
	size_t n_have_shares;
	uint64_t *have_shares; /* owned: slabs whose descriptor the client holds */
	LIST_ENTRY(pwait) link;
};

static void pwait_free(struct pwait *w)
{
	free(w->have_shares);
	free(w);
}

/* B: one pull. */
struct pull {
	struct remote *rm;
	struct rpeer *rp;
	uint64_t id;
	char name[TENSORD_NAME_MAX + 1]; /* "@a/m/w" */
	size_t name_len, peer_len;
	/* waiting: A said not yet; allocating: a GPU replica's memory, on the GPU worker */
	enum { PL_ASKING, PL_ALLOCATING, PL_RECEIVING, PL_WAITING } st;
	bool wait;            /* an attach with a timeout or after: not yet is not an error */
	uint64_t after;       /* nonzero: only a generation newer */
	uint64_t deadline_ns; /* a wait's end; 0: none (forever) */
	bool dead;            /* failed with its receive posted: waits for that to end */
	bool posted;          /* UCX has the mapping */
	bool watched;         /* A tells of the name's next change */
	bool stale;           /* A told of a change after its reply: not kept as watched */
	uint64_t lease, generation, nbytes;
	struct tensor *t; /* the replica being made: borrowed, valid while lease lives */
	bool gpu;         /* a GPU replica: received into host memory (map), then copied in */
	bool filled;      /* a GPU replica's bytes are on its device */
	bool in_host;     /* a GPU replica's bytes all arrived inline, in map */
	struct gjob *job; /* a GPU worker job of its under way; NULL: none */
	void *map;        /* owned */
	size_t map_len;
	size_t pop_off; /* populated ahead of UCX up to here (populate_step) */
	uint64_t started_ns;
	uv_timer_t timer;
	LIST_HEAD(, pwait) waits;
	LIST_ENTRY(pull) link;
	struct spull *set; /* a set's member; NULL: a pull of its own */
	bool done;         /* a set's member whose bytes are in: it waits for the others */
};

/* B: one set pull (docs/remote.md, "Sets"). */
struct spull {
	struct remote *rm;
	struct rpeer *rp;
	uint64_t id;           /* its members' pull ids follow: id+1 .. */
	struct client *cl;     /* NULL once its connection closed: the set is published anyway */
	uint64_t req_id;       /* cl's AttachMany */
	uint64_t *have_shares; /* cl's slabs, as its request said (owned) */
	size_t n_have_shares;
	char what[300]; /* "set '@a/m/' of node a", for errors and logs */
	char **names;   /* a list: the names asked for, on A (owned) */
	size_t n_names;
	char prefix[TENSORD_NAME_MAX + 1]; /* with no names: A's prefix */
	uint32_t tx;                       /* the transaction of rm->rc its replicas are made in */
	enum { SP_ASKING, SP_PULLING } st;
	uint32_t count, n_done; /* members, and those whose bytes are in */
	struct pull **members;  /* count of them (owned array) */
	uint64_t commit_a;      /* the set's commit on A */
	uint64_t started_ns;
	uv_timer_t timer; /* the answer's deadline */
	LIST_ENTRY(spull) link;
};

/* B: a replica this daemon published. */
struct replica {
	char name[TENSORD_NAME_MAX + 1];
	size_t name_len;
	struct rpeer *rp;
	uint64_t tensor_id, generation, nbytes;
	uint64_t idle_since_ns; /* 0 while leased */
	bool watched;           /* the peer tells of a change: served without asking */
	LIST_ENTRY(replica) link;
};

struct remote {
	struct server *srv;
	struct xport *x;
	char why[300];        /* why there is no data path */
	struct reg_client rc; /* B: creates the replicas */
	uint64_t next_id;     /* ids when the random source fails */
	LIST_HEAD(, pull) pulls;
	LIST_HEAD(, replica) replicas;
	LIST_HEAD(, spull) sets;
	void *replica_index; /* tsearch tree of the replicas, by name */
	unsigned n_sets;
	uint32_t next_tx;
	struct remote_figures *figs; /* the server's gauges (srv->remote_figs), kept here */
	uint64_t max_replica_bytes;  /* --peer-max-replica-bytes, or its default resolved */
	uv_timer_t keep;
	uv_idle_t populate; /* active while a mapping of a transfer is not populated yet */
	bool no_populate;   /* MADV_POPULATE_* unknown to this kernel (before 5.14) */
	bool stopping;
	LIST_HEAD(, gjob) jobs; /* on the GPU worker */
	int open_handles;
};

/*
 * A GPU worker job of remote attach's (docs/remote.md, "GPU tensors across
 * nodes"): A copies a GPU tensor out to host memory before serving it
 * (GJ_STAGE); B allocates a GPU replica (GJ_ALLOC) and copies the bytes it
 * received into it (GJ_FILL). Whoever it works for may end first: it then
 * only frees. Done on the loop by gjob_done().
 */
struct gjob {
	struct remote *rm; /* NULL once remote attach stopped: then it only frees */
	struct registry *reg;
	enum { GJ_STAGE, GJ_ALLOC, GJ_FILL } kind;
	struct serve *s;            /* GJ_STAGE: NULL once the serve ended */
	struct pull *pl;            /* GJ_ALLOC, GJ_FILL: NULL once the pull ended */
	struct reg_alloc_job alloc; /* GJ_ALLOC */
	/*
	 * The copies': the tensor's allocation, by value: the tensor may go
	 * while the copy runs, its memory not (its free queues behind).
	 */
	struct backend_alloc a;
	void *buf; /* the host side of a copy (an anonymous mapping): the job's */
	size_t len;
	uint64_t staged; /* GJ_STAGE whose serve ended: bytes still in remote_staged_bytes */
	int status;
	LIST_ENTRY(gjob) link; /* rm->jobs */
};

static void gjob_done(void *arg);

static void gjob_run(void *arg)
{
	struct gjob *j = arg;

	if (j->kind == GJ_ALLOC)
		registry_alloc_run(&j->alloc);
	else
		j->status = j->a.ops->copy(&j->a, 0, j->buf, j->len, j->kind == GJ_STAGE);
}

/* Queues j for the GPU worker: 0, or -ENOMEM with nothing queued (j is the caller's). */
static int gjob_submit(struct remote *rm, struct gjob *j)
{
	j->rm = rm;
	j->reg = &rm->srv->reg;
	LIST_INSERT_HEAD(&rm->jobs, j, link);
	if (gpu_worker_submit(gjob_run, gjob_done, j) == 0)
		return 0;
	LIST_REMOVE(j, link);
	return -ENOMEM;
}

/* Host memory for a copy of a GPU tensor: an anonymous mapping, or NULL (errno). */
static void *stage_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static struct remote *rm_of(const struct server *srv)
{
	return srv->remote;
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

static void send_frame(struct rpeer *rp, Tensord__PeerFrame *f)
{
	if (peer_send(rp->p, f) < 0)
		log_debug("peer %s: a frame not sent: the connection is down", rp->p->name);
}

/* --- A: serving --------------------------------------------------------------- */

static void pull_reply_error(struct rpeer *rp, uint64_t id, int status, const char *why)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullReply m = TENSORD__PEER_PULL_REPLY__INIT;

	m.id = id;
	m.status = status;
	m.error = (char *)why;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
	f.pull_reply = &m;
	send_frame(rp, &f);
}

/* Ends s: unmaps (never while UCX reads it) and ends its lease (if its connection lives). */
static void serve_stage_next(struct rpeer *rp);

static void serve_end(struct serve *s)
{
	struct rpeer *rp = s->rp;
	uint64_t staged = s->staged;
	bool job = s->job != NULL;

	if (s->job) { /* the copy's end frees its memory, and counts it gone */
		s->job->s = NULL;
		s->job->staged = staged;
	}
	if (s->map)
		munmap(s->map, s->map_len);
	if (s->epoch == rp->epoch && rp->rc_live) {
		registry_release(&rp->rm->srv->reg, &rp->rc, s->lease);
		rp->rm->figs->pull_leases--;
	}
	TAILQ_REMOVE(&rp->serves, s, link);
	rp->n_serves--;
	free(s->member);
	free(s);
	if (staged) {
		rp->staged -= staged;
		if (!job)
			rp->rm->figs->staged_bytes -= staged;
		serve_stage_next(rp);
	}
}

static struct serve *serve_find(struct rpeer *rp, uint64_t id)
{
	struct serve *s;

	TAILQ_FOREACH(s, &rp->serves, link)
	if (s->id == id && s->epoch == rp->epoch)
		return s;
	return NULL;
}

static void serve_start_queued(struct rpeer *rp);
static int serve_map(struct serve *s);
static int serve_read(struct serve *s, void *buf);
static int serve_check(struct server *srv, const struct tensor *t, char *why, size_t why_len);
static void serve_reply(struct rpeer *rp, uint64_t id, struct tensor *t, uint64_t lease,
			const char *member);
static void pull_complete(struct pull *pl);

static void serve_send(struct serve *s)
{
	struct rpeer *rp = s->rp;
	char why[300] = "";
	int r = 0;

	s->st = SV_SENDING;
	rp->inflight += s->len;
	rp->rm->figs->inflight_bytes += s->len;
	/* The endpoint is made when the peer's worker address comes (on_peer_frame), or here. */
	if (!rp->ep && (!rp->addr || !rp->rm->x))
		r = -ENOTCONN;
	else if (!rp->ep)
		r = xport_connect(rp->rm->x, rp->addr, rp->addr_len, rp, &rp->ep, why, sizeof(why));
	if (r == 0)
		r = xport_send(rp->ep, s->id, (const char *)s->map + (s->fd_off & 4095), s->len, s);
	if (r < 0) {
		log_warn("peer %s: cannot send pull %" PRIu64 " (%" PRIu64 " bytes): %s%s%s",
			 rp->p->name, s->id, s->len, strerror(-r), why[0] ? ": " : "", why);
		rp->inflight -= s->len;
		rp->rm->figs->inflight_bytes -= s->len;
		serve_end(s);
	}
}

static void serve_start_queued(struct rpeer *rp)
{
	struct serve *s, *next;

	for (s = TAILQ_FIRST(&rp->serves); s; s = next) {
		next = TAILQ_NEXT(s, link);
		if (s->st != SV_QUEUED)
			continue;
		if (rp->inflight && rp->inflight + s->len > rp->rm->srv->cfg.remote.max_inflight)
			return; /* in order: the first that does not fit waits, and those behind it */
		serve_send(s);
	}
}

/* A: the names a peer holds replicas of (docs/remote.md, "Freshness"). */

static int name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* rp will be told of name's next change: true, or false when it watches too many. */
static bool watch_add(struct rpeer *rp, const char *name)
{
	char *k;

	if (tfind(name, &rp->watched, name_cmp))
		return true;
	if (rp->n_watched >= REMOTE_WATCH_MAX || !(k = strdup(name)))
		return false;
	if (!tsearch(k, &rp->watched, name_cmp)) {
		free(k);
		return false;
	}
	rp->n_watched++;
	rp->rm->figs->watched++;
	return true;
}

/* Whether rp watched name; it no longer does. */
static bool watch_del(struct rpeer *rp, const char *name)
{
	char **at = rp->n_watched ? tfind(name, &rp->watched, name_cmp) : NULL;
	char *k;

	if (!at)
		return false;
	k = *at;
	tdelete(name, &rp->watched, name_cmp);
	free(k);
	rp->n_watched--;
	rp->rm->figs->watched--;
	return true;
}

static void watch_clear(struct rpeer *rp)
{
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
	send_frame(rp, &f);
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

	twalk_r(rp->watched, changed_all_add, &ca);
	if (ca.k)
		changed_send(rp, ca.names, ca.gens, &ca.k);
	watch_clear(rp);
}

void remote_on_commit(struct server *srv, const struct reg_change *v, size_t n, bool lost)
{
	char *names[CHANGED_BATCH];
	uint64_t gens[CHANGED_BATCH];
	size_t k;

	if (!rm_of(srv))
		return;
	for (unsigned i = 0; i < srv->peers.n_peers; i++) {
		struct rpeer *rp = srv->peers.peers[i]->data;

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
			gens[k++] = v[j].generation;
			if (k == CHANGED_BATCH)
				changed_send(rp, names, gens, &k);
		}
		if (k)
			changed_send(rp, names, gens, &k);
	}
}

/*
 * Pull id waits for its name (watch_name, when exported to rp: told with
 * PeerChanged at its next change; NULL: never told, and said the same).
 */
static void pull_reply_waiting(struct rpeer *rp, uint64_t id, const char *watch_name)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullReply rep = TENSORD__PEER_PULL_REPLY__INIT;

	rep.id = id;
	rep.waiting = true;
	rep.watched = watch_name ? watch_add(rp, watch_name) : true;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
	f.pull_reply = &rep;
	send_frame(rp, &f);
}

static void on_unwatch(struct rpeer *rp, const Tensord__PeerUnwatch *m)
{
	for (size_t i = 0; i < m->n_names; i++)
		watch_del(rp, m->names[i]);
}

static void on_pull(struct rpeer *rp, const Tensord__PeerPull *m)
{
	struct remote *rm = rp->rm;
	struct server *srv = rm->srv;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullReply rep = TENSORD__PEER_PULL_REPLY__INIT;
	char why[800], reason[300];
	size_t len = strlen(m->name);
	struct tensor *t;
	uint64_t lease;
	bool writable, exported;
	int r;

	figure_count(FIG_remote_pull_requests_total, 1);
	if (td_name_check(m->name, len, reason, sizeof(reason)) < 0) {
		snprintf(why, sizeof(why), "node %s: %s", srv->peers.self, reason);
		pull_reply_error(rp, m->id, -EINVAL, why);
		return;
	}
	exported = remote_exported(&srv->cfg.remote, rp->p->name, m->name, len);
	if (!exported || !registry_published(&srv->reg, m->name, len)) {
		if (m->wait) {
			pull_reply_waiting(rp, m->id, exported ? m->name : NULL);
			return;
		}
		/* Not exported and not published are told apart to nobody. */
		snprintf(why, sizeof(why),
			 "tensor '%s' is not published on node %s, or not exported to node %s",
			 m->name, srv->peers.self, rp->p->name);
		pull_reply_error(rp, m->id, -ENOENT, why);
		return;
	}
	if (m->after && registry_generation(&srv->reg, m->name, len) <= m->after) {
		if (m->wait) {
			pull_reply_waiting(rp, m->id, m->name);
			return;
		}
		snprintf(why, sizeof(why),
			 "tensor '%s' on node %s: no generation newer than %" PRIu64, m->name,
			 srv->peers.self, m->after);
		pull_reply_error(rp, m->id, -ETIMEDOUT, why);
		return;
	}
	if (m->have_generation &&
	    registry_generation(&srv->reg, m->name, len) == m->have_generation) {
		rep.id = m->id;
		rep.current = true;
		rep.generation = m->have_generation;
		rep.watched = watch_add(rp, m->name);
		f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
		f.pull_reply = &rep;
		send_frame(rp, &f);
		return;
	}
	if (rp->n_serves >= REMOTE_SERVES_MAX) {
		snprintf(why, sizeof(why),
			 "node %s: node %s holds %d pull leases already, the most", srv->peers.self,
			 rp->p->name, REMOTE_SERVES_MAX);
		pull_reply_error(rp, m->id, -EAGAIN, why);
		return;
	}
	r = registry_attach(&srv->reg, &rp->rc, m->name, len, &t, &lease, &writable, reason,
			    sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "node %s, acting as uid %u for peers: %s",
			 srv->peers.self, REMOTE_PEER_UID, reason);
		pull_reply_error(rp, m->id, r == -ENOENT ? -EACCES : r, why);
		return;
	}
	r = serve_check(srv, t, why, sizeof(why));
	if (r < 0) {
		registry_release(&srv->reg, &rp->rc, lease);
		pull_reply_error(rp, m->id, r, why);
		return;
	}
	serve_reply(rp, m->id, t, lease, NULL);
}

/* Whether t may be served to a peer: 0, or -errno with the reason naming it. */
static int serve_check(struct server *srv, const struct tensor *t, char *why, size_t why_len)
{
	if (t->device.device_type == kDLCPU ? !t->alloc.ops->export_fd : !t->alloc.ops->copy) {
		snprintf(why, why_len,
			 "tensor '%s' on node %s: its %s memory cannot be read by the "
			 "daemon, so it cannot be pulled",
			 t->name, srv->peers.self, t->alloc.ops->name);
		return -EOPNOTSUPP;
	}
	if (t->flags & TENSORD_MUTABLE) {
		snprintf(why, why_len,
			 "tensor '%s' on node %s is mutable: mutable tensors cannot be exported "
			 "(their bytes could change during the transfer)",
			 t->name, srv->peers.self);
		return -EPERM;
	}
	return 0;
}

static void serve_answer(struct serve *s);

/*
 * Serves pull id of t, which rp->rc's lease holds (the serve's now): the
 * PullReply with t's descriptor (and member's name: a set's member), the
 * bytes inline when small (the lease then ends at once), else the lease
 * kept until PullGo's send or PullDone. A GPU tensor is copied to host
 * memory first, on the GPU worker (serve_stage()); the reply follows.
 */
static void serve_reply(struct rpeer *rp, uint64_t id, struct tensor *t, uint64_t lease,
			const char *member)
{
	struct remote *rm = rp->rm;
	struct server *srv = rm->srv;
	struct serve *s = calloc(1, sizeof(*s));
	char why[300];

	if (s && member && !(s->member = strdup(member))) {
		free(s);
		s = NULL;
	}
	if (!s) {
		registry_release(&srv->reg, &rp->rc, lease);
		snprintf(why, sizeof(why), "node %s: out of memory", srv->peers.self);
		pull_reply_error(rp, id, -ENOMEM, why);
		return;
	}
	s->rp = rp;
	s->id = id;
	s->epoch = rp->epoch;
	s->lease = lease;
	s->t = t;
	s->fd_off = t->alloc.share_id ? t->alloc.ipc_offset : 0;
	s->len = t->nbytes;
	s->st = SV_LEASED;
	TAILQ_INSERT_TAIL(&rp->serves, s, link);
	rp->n_serves++;
	rm->figs->pull_leases++;
	if (t->device.device_type != kDLCPU && t->nbytes) {
		s->fd_off = 0;
		s->st = SV_STAGE_WAIT;
		serve_stage_next(rp);
		return;
	}
	serve_answer(s);
}

/* The reply to s, its bytes readable (host memory, or a GPU tensor's copy in s->map). */
static void serve_answer(struct serve *s)
{
	struct rpeer *rp = s->rp;
	struct tensor *t = s->t;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullReply rep = TENSORD__PEER_PULL_REPLY__INIT;
	uint8_t inline_buf[REMOTE_INLINE_MAX];
	bool staged = s->map != NULL;

	rep.id = s->id;
	rep.generation = t->generation;
	/*
	 * A single pull's replica is watched; a set's members are not (B asks
	 * for them). A GPU tensor's copy took a while: if its name changed
	 * meanwhile, B is not told it is watched (it then asks at each attach).
	 */
	rep.watched = !s->member && watch_add(rp, t->name);
	if (rep.watched && staged &&
	    registry_generation(&rp->rm->srv->reg, t->name, strlen(t->name)) != t->generation)
		rep.watched = false;
	rep.nbytes = t->nbytes;
	rep.dtype_code = t->dtype.code;
	rep.dtype_bits = t->dtype.bits;
	rep.dtype_lanes = t->dtype.lanes;
	rep.n_shape = rep.n_strides = (size_t)t->ndim;
	rep.shape = t->shape;
	rep.strides = t->strides;
	rep.name = s->member ? s->member : "";
	rep.device_type = (uint32_t)t->device.device_type;
	rep.device_id = t->device.device_id;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
	f.pull_reply = &rep;
	/* Small tensors go inline, in the reply: one round trip, no UCX message. */
	if (t->nbytes && t->nbytes <= REMOTE_INLINE_MAX && staged)
		memcpy(inline_buf, s->map, (size_t)t->nbytes);
	if (t->nbytes && t->nbytes <= REMOTE_INLINE_MAX &&
	    (staged || serve_read(s, inline_buf) == 0)) {
		rep.data.data = inline_buf;
		rep.data.len = (size_t)t->nbytes;
		send_frame(rp, &f);
		figure_count(FIG_remote_served_total, 1);
		figure_count(FIG_remote_served_bytes_total, t->nbytes);
		rp->p->remote.served++;
		rp->p->remote.served_bytes += t->nbytes;
		serve_end(s);
		return;
	}
	send_frame(rp, &f);
	log_debug("peer %s: pull %" PRIu64 " of '%s' (%" PRIu64 " bytes): leased", rp->p->name,
		  s->id, t->name, t->nbytes);
}

/*
 * Copies GPU tensor s's bytes to host memory on the GPU worker; the reply
 * follows (serve_staged()). On failure s is answered and ended.
 */
static void serve_stage(struct serve *s)
{
	struct rpeer *rp = s->rp;
	const char *self = rp->rm->srv->peers.self;
	struct gjob *j = calloc(1, sizeof(*j));
	char why[400];
	int e = ENOMEM;

	if (j) {
		j->kind = GJ_STAGE;
		j->s = s;
		j->a = s->t->alloc;
		j->len = (size_t)s->len;
		j->buf = stage_map(j->len);
		e = errno;
		if (j->buf && gjob_submit(rp->rm, j) == 0) {
			s->job = j;
			s->st = SV_STAGING;
			s->staged = s->len;
			rp->staged += s->len;
			rp->rm->figs->staged_bytes += s->len;
			log_debug("peer %s: pull %" PRIu64 " of GPU tensor '%s': copying %" PRIu64
				  " bytes to host memory (%" PRIu64 " staged for it)",
				  rp->p->name, s->id, s->t->name, s->len, rp->staged);
			return;
		}
		if (j->buf)
			munmap(j->buf, j->len);
		free(j);
	}
	snprintf(why, sizeof(why),
		 "node %s: no host memory to copy GPU tensor '%s' (%" PRIu64 " bytes) into: %s",
		 self, s->t->name, s->len, strerror(e));
	pull_reply_error(rp, s->id, -ENOMEM, why);
	serve_end(s);
}

/*
 * Starts the copies of rp's GPU tensors waiting, in order, while the host
 * memory they take for rp stays within --peer-max-inflight (one at a time
 * when a tensor alone is larger).
 */
static void serve_stage_next(struct rpeer *rp)
{
	uint64_t max = rp->rm->srv->cfg.remote.max_inflight;
	struct serve *s, *next;

	if (!rp->up || rp->rm->stopping)
		return;
	for (s = TAILQ_FIRST(&rp->serves); s; s = next) {
		next = TAILQ_NEXT(s, link);
		if (s->st != SV_STAGE_WAIT || s->epoch != rp->epoch)
			continue;
		if (rp->staged && rp->staged + s->len > max)
			return;
		serve_stage(s);
	}
}

/* The copy of j->s's GPU tensor ended (on the loop): the reply goes, or why not. */
static void serve_staged(struct gjob *j)
{
	struct serve *s = j->s;
	char why[400];

	if (!s) { /* the serve ended meanwhile */
		munmap(j->buf, j->len);
		if (j->rm)
			j->rm->figs->staged_bytes -= j->staged;
		return;
	}
	s->job = NULL;
	s->map = j->buf;
	s->map_len = j->len;
	s->pop_off = j->len;
	if (j->status < 0) {
		snprintf(why, sizeof(why),
			 "node %s: cannot copy GPU tensor '%s' (%s:%d, %" PRIu64
			 " bytes) to host memory: %s",
			 s->rp->rm->srv->peers.self, s->t->name, s->t->alloc.ops->name,
			 s->t->device.device_id, s->len, strerror(-j->status));
		log_warn("peer %s: pull %" PRIu64 ": %s", s->rp->p->name, s->id, why);
		pull_reply_error(s->rp, s->id, j->status, why);
		serve_end(s);
		return;
	}
	s->st = SV_LEASED;
	serve_answer(s);
}

static void set_pull_refuse(struct rpeer *rp, uint64_t id, int status, const char *why)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSetPullReply m = TENSORD__PEER_SET_PULL_REPLY__INIT;

	m.id = id;
	m.status = status;
	m.error = (char *)why;
	f.body_case = TENSORD__PEER_FRAME__BODY_SET_PULL_REPLY;
	f.set_pull_reply = &m;
	send_frame(rp, &f);
}

/*
 * The members of set pull m as rp may pull them (*ret_v, n; the caller
 * frees the array): resolved in one step as a local AttachMany by uid
 * REMOTE_PEER_UID, a listed name not exported told apart from one not
 * published to nobody, the names under a prefix that are not exported to
 * rp left out (as those it may not read are). 0 or -errno with the reason.
 */
static int set_members(struct rpeer *rp, const Tensord__PeerSetPull *m, struct tensor ***ret_v,
		       size_t *ret_n, uint64_t *ret_commit, char *why, size_t why_len)
{
	struct server *srv = rp->rm->srv;
	Tensord__AttachMany am = TENSORD__ATTACH_MANY__INIT;
	const char *self = srv->peers.self, *peer = rp->p->name;
	struct tensor **v;
	char reason[400];
	size_t n, k = 0;
	int r;

	if (m->n_names > REMOTE_SET_MAX) {
		snprintf(why, why_len, "node %s: a set of %zu names; at most %u", self, m->n_names,
			 REMOTE_SET_MAX);
		return -E2BIG;
	}
	for (size_t i = 0; i < m->n_names; i++) {
		size_t len = strlen(m->names[i]);

		if (td_name_check(m->names[i], len, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "node %s: %s", self, reason);
			return -EINVAL;
		}
		/* As a single pull's: not exported and not published told apart to nobody. */
		if (!remote_exported(&srv->cfg.remote, peer, m->names[i], len) ||
		    !registry_published(&srv->reg, m->names[i], len)) {
			snprintf(why, why_len,
				 "tensor '%s' is not published on node %s, or not exported to "
				 "node %s",
				 m->names[i], self, peer);
			return -ENOENT;
		}
		if (!registry_lookup(&srv->reg, &rp->rc, m->names[i], len)) {
			snprintf(why, why_len,
				 "node %s, acting as uid %u for peers: tensor '%s': its mode "
				 "refuses that uid",
				 self, REMOTE_PEER_UID, m->names[i]);
			return -EACCES;
		}
	}
	am.n_names = m->n_names;
	am.names = m->names;
	am.prefix = m->prefix;
	r = dispatch_set_members(&srv->reg, &rp->rc, &am, &v, &n, ret_commit, reason,
				 sizeof(reason));
	if (r == -ENOENT)
		snprintf(why, why_len, "node %s: %s (not published, or not exported to node %s)",
			 self, reason, peer);
	else if (r < 0)
		snprintf(why, why_len, "node %s, acting as uid %u for peers: %s", self,
			 REMOTE_PEER_UID, reason);
	if (r < 0)
		return r;
	/* The set's commit is its members' newest: those left out do not count. */
	*ret_commit = 0;
	for (size_t i = 0; i < n; i++) {
		if (!remote_exported(&srv->cfg.remote, peer, v[i]->name, v[i]->name_len))
			continue;
		v[k++] = v[i];
		if (v[i]->commit > *ret_commit)
			*ret_commit = v[i]->commit;
	}
	if (k > REMOTE_SET_MAX) {
		free(v);
		snprintf(why, why_len, "node %s: prefix '%s' has %zu members; a set has at most %u",
			 self, m->prefix, k, REMOTE_SET_MAX);
		return -E2BIG;
	}
	*ret_v = v;
	*ret_n = k;
	return 0;
}

/*
 * A set pull: every member resolved, checked and leased in this one step
 * (so all of one commit: nothing else runs on the loop meanwhile), or the
 * whole set refused naming the member; then the SetPullReply and one
 * PullReply per member.
 */
static void on_set_pull(struct rpeer *rp, const Tensord__PeerSetPull *m)
{
	struct server *srv = rp->rm->srv;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSetPullReply rep = TENSORD__PEER_SET_PULL_REPLY__INIT;
	struct tensor **v = NULL, *t;
	uint64_t *lease, commit = 0;
	char why[800];
	size_t n = 0, i;
	bool writable;
	int r = set_members(rp, m, &v, &n, &commit, why, sizeof(why));

	for (i = 0; r == 0 && i < n; i++)
		r = serve_check(srv, v[i], why, sizeof(why));
	if (r == 0 && rp->n_serves + n > REMOTE_SERVES_MAX) {
		snprintf(why, sizeof(why),
			 "node %s: node %s holds %u pull leases already; a set of %zu more "
			 "passes the most, %d",
			 srv->peers.self, rp->p->name, rp->n_serves, n, REMOTE_SERVES_MAX);
		r = -EAGAIN;
	}
	lease = r == 0 ? calloc(n ? n : 1, sizeof(*lease)) : NULL;
	if (r == 0 && !lease) {
		snprintf(why, sizeof(why), "node %s: out of memory", srv->peers.self);
		r = -ENOMEM;
	}
	for (i = 0; r == 0 && i < n; i++)
		r = registry_attach(&srv->reg, &rp->rc, v[i]->name, v[i]->name_len, &t, &lease[i],
				    &writable, why, sizeof(why));
	if (r < 0) {
		for (size_t j = 0; j + 1 < i; j++)
			registry_release(&srv->reg, &rp->rc, lease[j]);
		set_pull_refuse(rp, m->id, r, why);
		free(lease);
		free(v);
		return;
	}
	rep.id = m->id;
	rep.commit = commit;
	rep.count = (uint32_t)n;
	f.body_case = TENSORD__PEER_FRAME__BODY_SET_PULL_REPLY;
	f.set_pull_reply = &rep;
	send_frame(rp, &f);
	log_debug("peer %s: set pull %" PRIu64 ": %zu members of commit %" PRIu64 " leased",
		  rp->p->name, m->id, n, commit);
	for (i = 0; i < n; i++)
		serve_reply(rp, m->id + 1 + i, v[i], lease[i], v[i]->name);
	free(lease);
	free(v);
}

/* Maps s's bytes read-only (s->map): 0, or -errno, logged. */
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

static void populate_kick(struct remote *rm)
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
	struct server *srv = rm->srv;
	bool more = false;
	struct pull *pl;
	struct serve *sv;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead)
		more |= populate_slice(rm, pl->map, pl->map_len, &pl->pop_off, MADV_POPULATE_WRITE);
	for (unsigned i = 0; i < srv->peers.n_peers; i++) {
		struct rpeer *rp = srv->peers.peers[i]->data;

		if (rp)
			TAILQ_FOREACH(sv, &rp->serves, link)
		more |= populate_slice(rm, sv->map, sv->map_len, &sv->pop_off, MADV_POPULATE_READ);
	}
	if (!more)
		uv_idle_stop(h);
}

/*
 * Reads s's bytes (at most REMOTE_INLINE_MAX) into buf: a pread of a
 * read-only descriptor, cheaper than a mapping whose unmap would stop the
 * daemon's other threads' CPUs (a TLB shootdown). 0, or -errno, logged.
 */
static int serve_read(struct serve *s, void *buf)
{
	struct rpeer *rp = s->rp;
	int fd = -1, r;
	ssize_t k;

	r = s->t->alloc.ops->export_fd(&s->t->alloc, false, &fd);
	if (r < 0 || fd < 0) {
		log_warn("peer %s: pull %" PRIu64 " of '%s': no descriptor: %s", rp->p->name, s->id,
			 s->t->name, strerror(r < 0 ? -r : EBADF));
		return r < 0 ? r : -EBADF;
	}
	k = pread(fd, buf, (size_t)s->len, (off_t)s->fd_off);
	r = k < 0 ? -errno : 0;
	close(fd);
	if (k >= 0 && (uint64_t)k != s->len)
		r = -EIO;
	if (r < 0)
		log_warn("peer %s: pull %" PRIu64 " of '%s': cannot read %" PRIu64 " bytes: %s",
			 rp->p->name, s->id, s->t->name, s->len, strerror(-r));
	return r;
}

static int serve_map(struct serve *s)
{
	struct rpeer *rp = s->rp;
	size_t page = 4096;
	uint64_t base;
	int fd = -1, r, e;

	/* A read-only descriptor, as a reader client would get (a slab's too). */
	r = s->t->alloc.ops->export_fd(&s->t->alloc, false, &fd);
	if (r < 0 || fd < 0) {
		log_warn("peer %s: pull %" PRIu64 " of '%s': no descriptor: %s", rp->p->name, s->id,
			 s->t->name, strerror(r < 0 ? -r : EBADF));
		return r < 0 ? r : -EBADF;
	}
	base = s->fd_off & ~(uint64_t)(page - 1);
	s->map_len = (size_t)(s->fd_off - base + s->len);
	/*
	 * Not populated at once: filling a gigabyte's page tables would hold
	 * the loop for a tenth of a second or more; populate_step() does it a
	 * slice per loop turn, ahead of UCX's copy.
	 */
	s->map = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, fd, (off_t)base);
	e = errno;
	close(fd);
	if (s->map == MAP_FAILED) {
		log_warn("peer %s: pull %" PRIu64 ": cannot map %" PRIu64 " bytes: %s", rp->p->name,
			 s->id, s->len, strerror(e));
		s->map = NULL;
		return -e;
	}
	return 0;
}

static void on_pull_go(struct rpeer *rp, uint64_t id)
{
	struct serve *s = serve_find(rp, id);

	if (!s || s->st != SV_LEASED)
		return; /* ended meanwhile; B's timer or its receive says so */
	if (s->len == 0 || (!s->map && serve_map(s) < 0)) {
		serve_end(s);
		return;
	}
	populate_kick(rp->rm);
	s->st = SV_QUEUED;
	serve_start_queued(rp);
}

static void on_pull_done(struct rpeer *rp, uint64_t id)
{
	struct serve *s = serve_find(rp, id);

	if (s && s->st != SV_SENDING)
		serve_end(s);
}

/* --- B: pulling ------------------------------------------------------------------ */

static struct pull *pull_by_name(struct remote *rm, const char *name)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (!pl->dead && strcmp(pl->name, name) == 0)
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
	if (!pl->dead && (pl->st == PL_RECEIVING || pl->st == PL_ALLOCATING) &&
	    strcmp(pl->name, name) == 0)
		return pl;
	return NULL;
}

static struct pull *pull_by_id(struct remote *rm, uint64_t id)
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
static uint64_t pull_new_ids(struct remote *rm, uint64_t n)
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
	return pull_new_ids(rm, 1);
}

/* Replicas by name: a tsearch tree whose elements begin with their name (name_cmp). */
_Static_assert(offsetof(struct replica, name) == 0, "a replica begins with its name");

static struct replica *replica_find(struct remote *rm, const char *name)
{
	struct replica **at = tfind(name, &rm->replica_index, name_cmp);

	return at ? *at : NULL;
}

static void noop_free(void *node)
{
	(void)node; /* a tree's element owned elsewhere */
}

/* Counts r (its size delta bytes: +, or - to uncount) in the figures and its peer's. */
static void replica_count(struct remote *rm, const struct replica *r, int n, int64_t delta)
{
	rm->figs->replicas += (uint64_t)(int64_t)n;
	rm->figs->replica_bytes += (uint64_t)delta;
	r->rp->p->remote.replicas += (uint64_t)(int64_t)n;
	r->rp->p->remote.replica_bytes += (uint64_t)delta;
}

/*
 * r, its name, peer and size set, joins rm's list and index and is
 * counted; false when the index has no room.
 */
static bool replica_link(struct remote *rm, struct replica *r)
{
	if (!tsearch(r, &rm->replica_index, name_cmp))
		return false;
	LIST_INSERT_HEAD(&rm->replicas, r, link);
	replica_count(rm, r, 1, (int64_t)r->nbytes);
	return true;
}

static void replica_unlink(struct remote *rm, struct replica *r)
{
	tdelete(r, &rm->replica_index, name_cmp);
	LIST_REMOVE(r, link);
	replica_count(rm, r, -1, -(int64_t)r->nbytes);
}

/* Unlinks the replica's name (its leases keep its bytes) and forgets it. */
static void replica_drop(struct remote *rm, struct replica *r, const char *why)
{
	char buf[300];
	struct tensor *t = registry_lookup(&rm->srv->reg, &rm->rc, r->name, r->name_len);

	if (t && t->id == r->tensor_id)
		registry_unlink(&rm->srv->reg, &rm->rc, r->name, r->name_len, buf, sizeof(buf));
	log_debug("replica '%s': unlinked: %s", r->name, why);
	replica_unlink(rm, r);
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
	uint64_t n = rp->p->remote.replica_bytes; /* kept by replica_link() and _unlink() */
	const struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (pl->rp == rp && pl->st == PL_RECEIVING && !pl->dead)
		n += pl->nbytes;
	return n;
}

static bool replica_leased(struct remote *rm, const struct replica *r)
{
	struct tensor *t = registry_lookup(&rm->srv->reg, &rm->rc, r->name, r->name_len);

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
		used -= r->nbytes;
		replica_drop(rm, r,
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

static void pull_free(struct pull *pl)
{
	if (pl->job)
		pl->job->pl = NULL; /* its end frees what it holds */
	LIST_REMOVE(pl, link);
	pl->rm->figs->pulls--;
	uv_close((uv_handle_t *)&pl->timer, on_pull_closed);
}

/*
 * Ends failed pull pl, its waiting attaches answered with status and why:
 * the replica being made is discarded (a set's member: by the abort of its
 * set's transaction, before this); A is told to end its lease. The mapping
 * stays while UCX may write it.
 */
static void pull_end_failed(struct pull *pl, int status, const char *why)
{
	struct remote *rm = pl->rm;
	char buf[300];
	struct pwait *w;

	while ((w = LIST_FIRST(&pl->waits))) {
		LIST_REMOVE(w, link);
		reply_status(w->cl->conn, ATTACH, w->id, status, why);
		pwait_free(w);
	}
	if (pl->st == PL_RECEIVING) {
		if (!pl->set)
			registry_unlink(&rm->srv->reg, &rm->rc, pl->name, pl->name_len, buf,
					sizeof(buf));
		registry_release(&rm->srv->reg, &rm->rc, pl->lease);
	}
	if (pl->rp->up && !pl->done) {
		Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
		Tensord__PeerPullDone d = TENSORD__PEER_PULL_DONE__INIT;

		d.id = pl->id;
		f.body_case = TENSORD__PEER_FRAME__BODY_PULL_DONE;
		f.pull_done = &d;
		send_frame(pl->rp, &f);
	}
	uv_timer_stop(&pl->timer);
	pl->set = NULL;
	if (pl->posted) {
		pl->dead = true; /* its receive's end unmaps and frees it */
		return;
	}
	if (pl->map)
		munmap(pl->map, pl->map_len);
	pull_free(pl);
}

static void set_fail(struct spull *sp, int status, const char *why);

/*
 * pl failed: every attach waiting on it gets status and "peer P: tensor
 * 'N': <reason>"; a set's member fails its whole set with those words.
 */
static void __attribute__((format(printf, 3, 4)))
pull_fail(struct pull *pl, int status, const char *fmt, ...)
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
	pl->rp->p->remote.pull_errors++;
	if (pl->set) {
		set_fail(pl->set, status, why);
		return;
	}
	log_info("pull %" PRIu64 " of '%s' failed: %s", pl->id, pl->name, why);
	figure_count(FIG_remote_pull_failures_total, 1);
	pull_end_failed(pl, status, why);
}

/*
 * Every waiting attach gets a lease on the replica. Bound (issue 22's
 * bindings: later attaches served in the client) only when A watches the
 * name for this node, so that a change unlinks the replica and clears them.
 */
static void answer_local(struct pull *pl, bool watched)
{
	struct pwait *w;

	while ((w = LIST_FIRST(&pl->waits))) {
		LIST_REMOVE(w, link);
		dispatch_attach_local(w->cl, w->id, pl->name, pl->name_len, w->have_id,
				      w->have_shares, w->n_have_shares, w->bind && watched);
		pwait_free(w);
	}
}

static int pull_ask(struct pull *pl, uint64_t have_generation);
static void on_pull_timeout(uv_timer_t *t);
static void pull_unwanted(struct pull *pl);

/* A waiting pull whose deadline passed: its attaches time out as a local wait does. */
static void pull_wait_over(struct pull *pl)
{
	if (pl->after)
		pull_fail(pl, -ETIMEDOUT, "no generation newer than %" PRIu64 " within the timeout",
			  pl->after);
	else
		pull_fail(pl, -ETIMEDOUT, "not published within the timeout");
}

/* A waiting pull asks A again: A told of a change, or it is time to look. */
static void pull_wait_again(struct pull *pl)
{
	if (pl->deadline_ns && now_ns() >= pl->deadline_ns) {
		pull_wait_over(pl);
		return;
	}
	pl->st = PL_ASKING;
	uv_timer_start(&pl->timer, on_pull_timeout, PULL_BASE_MS, 0);
	if (pull_ask(pl, 0) < 0)
		pull_fail(pl, -ECONNRESET, "the connection to it was lost");
}

/*
 * A said not yet: wait for its PeerChanged of the name (watched), or ask
 * again in a second (not watched: A watches too many names of this node's),
 * at most until the attach's deadline.
 */
static void pull_wait(struct pull *pl, bool watched)
{
	uint64_t now = now_ns(), ms = watched ? 0 : 1000;

	pl->st = PL_WAITING;
	if (LIST_EMPTY(&pl->waits)) { /* its attaches went meanwhile */
		pull_unwanted(pl);
		return;
	}
	if (pl->deadline_ns) {
		uint64_t left =
			pl->deadline_ns > now ? (pl->deadline_ns - now + 999999u) / 1000000u : 0;

		if (!left) {
			pull_wait_over(pl);
			return;
		}
		ms = ms && ms < left ? ms : left;
	}
	if (ms)
		uv_timer_start(&pl->timer, on_pull_timeout, ms, 0);
	else
		uv_timer_stop(&pl->timer);
}

static void on_pull_timeout(uv_timer_t *t)
{
	struct pull *pl = t->data;
	uint64_t ms = (now_ns() - pl->started_ns) / 1000000u;

	if (pl->st == PL_WAITING) {
		pull_wait_again(pl);
		return;
	}
	pull_fail(pl, -ETIMEDOUT, "no %s after %" PRIu64 " ms",
		  pl->st == PL_ASKING ? "answer" : "bytes", ms);
}

static int pull_ask(struct pull *pl, uint64_t have_generation)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPull m = TENSORD__PEER_PULL__INIT;

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
static struct rpeer *rpeer_ready(struct client *cl, unsigned kind, uint64_t id, const char *what,
				 const char *peer)
{
	struct server *srv = cl->srv;
	struct remote *rm = rm_of(srv);
	char why[700], known[200];
	struct rpeer *rp;
	struct peer *p;
	size_t k = 0;

	p = srv->peers.on ? peer_lookup(&srv->peers, peer) : NULL;
	if (!p) {
		known[0] = '\0';
		for (unsigned i = 0; i < srv->peers.n_peers && k < sizeof(known); i++)
			k += (size_t)snprintf(known + k, sizeof(known) - k, "%s%s", i ? ", " : "",
					      srv->peers.peers[i]->name);
		snprintf(why, sizeof(why), "%s: no peer '%s' (%s%s)", what, peer,
			 srv->peers.on ? "known peers: " : "peering is off",
			 srv->peers.on ? (known[0] ? known : "none") : "");
		reply_status(cl->conn, kind, id, -ENOENT, why);
		return NULL;
	}
	rp = p->data;
	if (!rm || !rp || !rp->up) {
		snprintf(why, sizeof(why), "%s: peer %s is not connected (%s%s%s)", what, peer,
			 peer_state_name(p->state), p->error[0] ? ": " : "", p->error);
		reply_status(cl->conn, kind, id, -EHOSTUNREACH, why);
		return NULL;
	}
	if (!rm->x || !rp->addr) {
		snprintf(why, sizeof(why), "%s: no data path to peer %s: %s", what, peer,
			 !rm->x ? rm->why : "it has not sent its UCX worker address");
		reply_status(cl->conn, kind, id, -EHOSTUNREACH, why);
		return NULL;
	}
	return rp;
}

void remote_attach(struct client *cl, uint64_t id, const char *name, uint64_t have_id,
		   const uint64_t *have_shares, size_t n_have_shares, bool bind, int64_t timeout_ms,
		   uint64_t after)
{
	struct server *srv = cl->srv;
	struct remote *rm = rm_of(srv);
	char why[600], peer[PEER_NAME_MAX + 1], what[300];
	size_t len = strlen(name), peer_len;
	struct rpeer *rp;
	struct pull *pl;
	struct pwait *w;
	struct replica *rep;
	int r;

	r = td_remote_name_check(name, len, &peer_len, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, ATTACH, id, r, why);
		return;
	}
	memcpy(peer, name + 1, peer_len);
	peer[peer_len] = '\0';
	snprintf(what, sizeof(what), "tensor '%s'", name);
	rp = rpeer_ready(cl, ATTACH, id, what, peer);
	if (!rp)
		return;
	rep = replica_find(rm, name);
	if (rep && rep->watched && rep->generation > after && !pull_by_name(rm, name)) {
		/* A tells of its next change before anything else: this is current. */
		figure_count(FIG_remote_replica_hits_total, 1);
		dispatch_attach_local(cl, id, name, len, have_id, have_shares, n_have_shares, bind);
		return;
	}
	w = calloc(1, sizeof(*w));
	if (w && n_have_shares) {
		w->have_shares = malloc(n_have_shares * sizeof(*have_shares));
		if (w->have_shares)
			memcpy(w->have_shares, have_shares, n_have_shares * sizeof(*have_shares));
		else
			n_have_shares = 0; /* the descriptors are sent again: costs, works */
	}
	if (!w) {
		reply_status(cl->conn, ATTACH, id, -ENOMEM, "out of memory for a remote attach");
		return;
	}
	w->cl = cl;
	w->id = id;
	w->have_id = have_id;
	w->bind = bind;
	w->n_have_shares = n_have_shares;
	pl = timeout_ms || after ? NULL : pull_joinable(rm, name);
	if (pl) { /* one pull per name: this attach waits on it */
		LIST_INSERT_HEAD(&pl->waits, w, link);
		return;
	}
	pl = calloc(1, sizeof(*pl));
	if (!pl) {
		pwait_free(w);
		reply_status(cl->conn, ATTACH, id, -ENOMEM, "out of memory for a remote attach");
		return;
	}
	pl->rm = rm;
	pl->rp = rp;
	pl->id = pull_new_id(rm);
	memcpy(pl->name, name, len + 1);
	pl->name_len = len;
	pl->peer_len = peer_len;
	pl->st = PL_ASKING;
	pl->started_ns = now_ns();
	/* A waiting attach gets a pull of its own: A answers it "not yet" while it is. */
	pl->wait = timeout_ms != 0 || after;
	pl->after = after;
	pl->deadline_ns = timeout_ms > 0 ? pl->started_ns + (uint64_t)timeout_ms * 1000000u : 0;
	LIST_INIT(&pl->waits);
	LIST_INSERT_HEAD(&pl->waits, w, link);
	LIST_INSERT_HEAD(&rm->pulls, pl, link);
	rm->figs->pulls++;
	uv_timer_init(srv->loop, &pl->timer);
	pl->timer.data = pl;
	uv_timer_start(&pl->timer, on_pull_timeout, PULL_BASE_MS, 0);
	if (pull_ask(pl, rep && !pl->wait ? rep->generation : 0) < 0)
		pull_fail(pl, -ECONNRESET, "the connection to it was lost");
}

/* --- B: pulling a set ------------------------------------------------------------------ */

bool remote_set_is_remote(const Tensord__AttachMany *m)
{
	if (!m->n_names)
		return m->prefix[0] == '@';
	for (size_t i = 0; i < m->n_names; i++)
		if (m->names[i][0] == '@')
			return true;
	return false;
}

static void on_set_closed(uv_handle_t *h)
{
	struct spull *sp = h->data;

	for (size_t i = 0; i < sp->n_names; i++)
		free(sp->names[i]);
	free(sp->names);
	free(sp->members);
	free(sp->have_shares);
	free(sp);
}

static void set_free(struct spull *sp)
{
	LIST_REMOVE(sp, link);
	sp->rm->n_sets--;
	uv_timer_stop(&sp->timer);
	uv_close((uv_handle_t *)&sp->timer, on_set_closed);
}

/*
 * sp failed (why names the peer, the member when one failed, and the
 * reason): cl's AttachMany gets it; the transaction holding the replicas
 * made so far is aborted, so that none is ever seen; every member's pull
 * ends as a failed pull does.
 */
static void set_fail(struct spull *sp, int status, const char *why)
{
	struct remote *rm = sp->rm;
	char buf[300];

	log_info("set pull %" PRIu64 " (%s) failed: %s", sp->id, sp->what, why);
	figure_count(FIG_remote_pull_failures_total, 1);
	if (sp->cl)
		reply_status(sp->cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, sp->req_id, status,
			     why);
	/* -ENOENT: no member had been made yet (or the failed commit ended it). */
	registry_tx_abort(&rm->srv->reg, &rm->rc, sp->tx, buf, sizeof(buf));
	for (uint32_t i = 0; i < sp->count; i++)
		if (sp->members[i])
			pull_end_failed(sp->members[i], status, why);
	set_free(sp);
}

static void on_set_timeout(uv_timer_t *t)
{
	struct spull *sp = t->data;
	char why[500];

	snprintf(why, sizeof(why), "peer %s: %s: no answer after %" PRIu64 " ms", sp->rp->p->name,
		 sp->what, (now_ns() - sp->started_ns) / 1000000u);
	set_fail(sp, -ETIMEDOUT, why);
}

/*
 * The peer of AttachMany m's names (all "@PEER/NAME" of one peer) or of
 * its prefix ("@PEER/" and a prefix of A's names, maybe empty): into peer,
 * its length returned; -errno with the reason.
 */
static int set_peer(const Tensord__AttachMany *m, char *peer, char *why, size_t why_len)
{
	size_t peer_len = 0, pl;
	char reason[300];

	if (!m->n_names) {
		size_t len = strlen(m->prefix);
		char probe[TENSORD_NAME_MAX + 2];

		/* "@PEER/" alone is checked as "@PEER/x" would be: the whole export to us. */
		snprintf(probe, sizeof(probe), "%s%s", m->prefix,
			 len && m->prefix[len - 1] == '/' && !memchr(m->prefix + 1, '/', len - 2)
				 ? "x"
				 : "");
		if (len > TENSORD_NAME_MAX ||
		    td_remote_name_check(probe, strlen(probe), &pl, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "attach_many: prefix of another node's set: %s",
				 len > TENSORD_NAME_MAX ? "longer than a name" : reason);
			return -EINVAL;
		}
		memcpy(peer, m->prefix + 1, pl);
		peer[pl] = '\0';
		return (int)pl;
	}
	for (size_t i = 0; i < m->n_names; i++) {
		const char *name = m->names[i];

		if (name[0] != '@') {
			snprintf(why, why_len,
				 "attach_many: '%.260s' is a local name and '%.260s' another "
				 "node's: one set is all of one node",
				 name,
				 m->names[0][0] == '@' ? m->names[0] : m->names[m->n_names - 1]);
			return -EINVAL;
		}
		if (td_remote_name_check(name, strlen(name), &pl, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "attach_many: %s", reason);
			return -EINVAL;
		}
		if (i && (pl != peer_len || memcmp(name + 1, peer, pl) != 0)) {
			snprintf(why, why_len,
				 "attach_many: '%.260s' and '%.260s' are of different peers: one "
				 "set is all of one node",
				 m->names[0], name);
			return -EINVAL;
		}
		peer_len = pl;
		memcpy(peer, name + 1, pl);
		peer[pl] = '\0';
	}
	return (int)peer_len;
}

/* sp's names (A's, without "@PEER/") and cl's share ids, copied from m. */
static int set_copy_request(struct spull *sp, const Tensord__AttachMany *m, size_t peer_len)
{
	if (m->n_have_shares) {
		sp->have_shares = malloc(m->n_have_shares * sizeof(uint64_t));
		if (!sp->have_shares)
			return -ENOMEM;
		memcpy(sp->have_shares, m->have_shares, m->n_have_shares * sizeof(uint64_t));
		sp->n_have_shares = m->n_have_shares;
	}
	if (!m->n_names) {
		snprintf(sp->prefix, sizeof(sp->prefix), "%s", m->prefix + peer_len + 2);
		return 0;
	}
	sp->names = calloc(m->n_names, sizeof(char *));
	if (!sp->names)
		return -ENOMEM;
	sp->n_names = m->n_names;
	for (size_t i = 0; i < m->n_names; i++)
		if (!(sp->names[i] = strdup(m->names[i] + peer_len + 2)))
			return -ENOMEM;
	return 0;
}

void remote_attach_many(struct client *cl, uint64_t id, const Tensord__AttachMany *m)
{
	struct server *srv = cl->srv;
	struct remote *rm = rm_of(srv);
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSetPull sm = TENSORD__PEER_SET_PULL__INIT;
	char why[700], peer[PEER_NAME_MAX + 1], what[300];
	size_t bytes = 64;
	struct spull *sp;
	struct rpeer *rp;
	int peer_len = set_peer(m, peer, why, sizeof(why));

	if (peer_len < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, peer_len, why);
		return;
	}
	if (m->n_names)
		snprintf(what, sizeof(what), "set of %zu names ('%.200s'%s)", m->n_names,
			 m->names[0], m->n_names > 1 ? ", ..." : "");
	else
		snprintf(what, sizeof(what), "set '%.250s'", m->prefix);
	if (m->after) {
		snprintf(why, sizeof(why),
			 "attach_many of %s: `after` is not supported for another node's set yet "
			 "(attach the set again to get its newest commit)",
			 what);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -EOPNOTSUPP, why);
		return;
	}
	for (size_t i = 0; i < m->n_names; i++)
		bytes += strlen(m->names[i]) + 4;
	if (m->n_names > REMOTE_SET_MAX || bytes > PEER_FRAME_MAX - 128) {
		snprintf(why, sizeof(why),
			 "attach_many of %s: one set pull holds at most %u names and %u bytes of "
			 "them; use a prefix",
			 what, REMOTE_SET_MAX, PEER_FRAME_MAX - 128);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -E2BIG, why);
		return;
	}
	rp = rpeer_ready(cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, what, peer);
	if (!rp)
		return;
	if (rm->n_sets >= REMOTE_SETS_MAX) {
		snprintf(why, sizeof(why),
			 "attach_many of %s: %u sets are being pulled on this node already, the "
			 "most at once; try again",
			 what, REMOTE_SETS_MAX);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -EAGAIN, why);
		return;
	}
	sp = calloc(1, sizeof(*sp));
	if (!sp || set_copy_request(sp, m, (size_t)peer_len) < 0) {
		if (sp) {
			for (size_t i = 0; i < sp->n_names; i++)
				free(sp->names[i]);
			free(sp->names);
			free(sp->have_shares);
			free(sp);
		}
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -ENOMEM,
			     "out of memory for a remote attach_many");
		return;
	}
	sp->rm = rm;
	sp->rp = rp;
	sp->cl = cl;
	sp->req_id = id;
	snprintf(sp->what, sizeof(sp->what), "%s", what);
	/* Its members' ids follow its own, random as a single pull's. */
	sp->id = pull_new_ids(rm, 1 + REMOTE_SET_MAX);
	sp->tx = ++rm->next_tx ? rm->next_tx : ++rm->next_tx;
	sp->st = SP_ASKING;
	sp->started_ns = now_ns();
	LIST_INSERT_HEAD(&rm->sets, sp, link);
	rm->n_sets++;
	uv_timer_init(srv->loop, &sp->timer);
	sp->timer.data = sp;
	uv_timer_start(&sp->timer, on_set_timeout, PULL_BASE_MS, 0);
	sm.id = sp->id;
	sm.n_names = sp->n_names;
	sm.names = sp->names;
	sm.prefix = sp->prefix;
	f.body_case = TENSORD__PEER_FRAME__BODY_SET_PULL;
	f.set_pull = &sm;
	if (peer_send(rp->p, &f) < 0) {
		snprintf(why, sizeof(why), "peer %s: %s: the connection to it was lost", peer,
			 what);
		set_fail(sp, -ECONNRESET, why);
	}
}

static struct spull *set_by_id(struct remote *rm, uint64_t id)
{
	struct spull *sp;

	LIST_FOREACH(sp, &rm->sets, link)
	if (sp->id == id)
		return sp;
	return NULL;
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

/* A's answer to set pull sp: refused, or count members leased, whose PullReplies follow. */
static int on_set_pull_reply(struct rpeer *rp, const Tensord__PeerSetPullReply *m, char *why,
			     size_t why_len)
{
	struct remote *rm = rp->rm;
	struct spull *sp = set_by_id(rm, m->id);
	char buf[1024];

	/* A set given up: the members' PullReplies that follow are answered PullDone. */
	if (!sp || sp->st != SP_ASKING || sp->rp != rp)
		return 0;
	if (m->status < 0) {
		/* A's own words: they name A, the member and the reason. */
		snprintf(buf, sizeof(buf), "peer %s: %s: %.500s", rp->p->name, sp->what,
			 m->error && m->error[0] ? m->error : "refused");
		set_fail(sp, m->status >= -4095 ? m->status : -EPROTO, buf);
		return 0;
	}
	if (m->count > REMOTE_SET_MAX) {
		snprintf(why, why_len, "a set of %u members, more than the %u asked for at most",
			 m->count, REMOTE_SET_MAX);
		snprintf(buf, sizeof(buf), "peer %s: %s: it answered %s", rp->p->name, sp->what,
			 why);
		set_fail(sp, -EPROTO, buf);
		return -EPROTO;
	}
	uv_timer_stop(&sp->timer);
	sp->st = SP_PULLING;
	sp->commit_a = m->commit;
	if (m->count == 0) {
		if (sp->cl)
			dispatch_set_answer(sp->cl, sp->req_id, NULL, 0, sp->have_shares,
					    sp->n_have_shares);
		set_free(sp);
		return 0;
	}
	sp->members = calloc(m->count, sizeof(*sp->members));
	if (!sp->members) {
		snprintf(buf, sizeof(buf), "peer %s: %s: out of memory for %u members", rp->p->name,
			 sp->what, m->count);
		set_fail(sp, -ENOMEM, buf);
		return 0;
	}
	sp->count = m->count;
	for (uint32_t i = 0; i < m->count; i++) {
		struct pull *pl = calloc(1, sizeof(*pl));

		if (!pl) {
			snprintf(buf, sizeof(buf), "peer %s: %s: out of memory for %u members",
				 rp->p->name, sp->what, m->count);
			set_fail(sp, -ENOMEM, buf);
			return 0;
		}
		pl->rm = rm;
		pl->rp = rp;
		pl->id = sp->id + 1 + i;
		pl->st = PL_ASKING;
		pl->started_ns = sp->started_ns;
		pl->set = sp;
		LIST_INIT(&pl->waits);
		LIST_INSERT_HEAD(&rm->pulls, pl, link);
		rm->figs->pulls++;
		uv_timer_init(rm->srv->loop, &pl->timer);
		pl->timer.data = pl;
		uv_timer_start(&pl->timer, on_pull_timeout, PULL_BASE_MS, 0);
		sp->members[i] = pl;
	}
	return 0;
}

/* Whether a's name (A's) is one sp asked for. */
static bool set_wants(const struct spull *sp, const char *name)
{
	if (!sp->n_names)
		return strncmp(name, sp->prefix, strlen(sp->prefix)) == 0;
	for (size_t i = 0; i < sp->n_names; i++)
		if (strcmp(sp->names[i], name) == 0)
			return true;
	return false;
}

/*
 * Names set member pl from its PullReply (A's name m->name): "@PEER/NAME",
 * one the set asked for, no other member's, and no other pull's under way
 * (whose replica it would replace). 0, or -errno with pl failed.
 */
static int set_member_named(struct pull *pl, const Tensord__PeerPullReply *m)
{
	struct spull *sp = pl->set;
	const char *peer = pl->rp->p->name;
	size_t plen = strlen(peer), len = m->name ? strlen(m->name) : 0;
	char reason[300];
	struct pull *other;

	pl->peer_len = plen;
	if (!len || td_name_check(m->name, len, reason, sizeof(reason)) < 0 ||
	    plen + 2 + len > TENSORD_NAME_MAX || !set_wants(sp, m->name)) {
		pull_fail(pl, -EPROTO,
			  "it answered with a member named '%.255s', which the set "
			  "did not ask for",
			  m->name ? m->name : "");
		return -EPROTO;
	}
	snprintf(pl->name, sizeof(pl->name), "@%s/%s", peer, m->name);
	pl->name_len = plen + 2 + len;
	LIST_FOREACH(other, &pl->rm->pulls, link)
	{
		if (other == pl || other->dead || strcmp(other->name, pl->name) != 0)
			continue;
		pull_fail(pl, other->set == sp ? -EPROTO : -EAGAIN, "%s",
			  other->set == sp ? "it answered with this member twice"
					   : "another pull of it is under way on this node; "
					     "try again");
		return other->set == sp ? -EPROTO : -EAGAIN;
	}
	return 0;
}

/*
 * Every member's bytes are in: the replicas published in one commit (the
 * transaction of rm->rc), so that no watcher or attach_many here sees
 * part of the set; cl's AttachMany answered with leases on them all, the
 * attaches waiting on members too; the creator's leases end.
 */
static void set_publish(struct spull *sp)
{
	struct remote *rm = sp->rm;
	struct registry *reg = &rm->srv->reg;
	uint64_t commit = 0, bytes = 0;
	uint32_t published, unlinked;
	const char **names = calloc(sp->count, sizeof(*names));
	char reason[400], why[800];
	int r;

	if (!names) {
		snprintf(why, sizeof(why), "peer %s: %s: out of memory to publish it",
			 sp->rp->p->name, sp->what);
		set_fail(sp, -ENOMEM, why);
		return;
	}
	r = registry_tx_commit(reg, &rm->rc, sp->tx, &commit, &published, &unlinked, reason,
			       sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "peer %s: %s: cannot publish its replicas: %s",
			 sp->rp->p->name, sp->what, reason);
		free(names);
		set_fail(sp, r, why);
		return;
	}
	for (uint32_t i = 0; i < sp->count; i++) {
		struct pull *pl = sp->members[i];
		struct tensor *t = registry_lookup(reg, &rm->rc, pl->name, pl->name_len);
		struct replica *rep = replica_find(rm, pl->name);

		names[i] = pl->name;
		bytes += pl->nbytes;
		if (rep) { /* an older replica of the name: this one took its place */
			replica_count(rm, rep, 0, (int64_t)pl->nbytes - (int64_t)rep->nbytes);
			rep->nbytes = pl->nbytes;
		} else if ((rep = calloc(1, sizeof(*rep)))) {
			memcpy(rep->name, pl->name, pl->name_len + 1);
			rep->name_len = pl->name_len;
			rep->rp = pl->rp;
			rep->nbytes = pl->nbytes;
			if (!replica_link(rm, rep)) { /* untracked: unlinked below */
				free(rep);
				rep = NULL;
			}
		}
		if (rep) {
			rep->tensor_id = t ? t->id : 0;
			rep->generation = pl->generation;
			rep->idle_since_ns = 0;
			rep->watched = false; /* A watches no set's members: attaches ask */
		}
	}
	figure_count(FIG_remote_pulls_total, sp->count);
	figure_count(FIG_remote_pull_bytes_total, bytes);
	sp->rp->p->remote.pulled += sp->count;
	sp->rp->p->remote.pulled_bytes += bytes;
	log_debug("%s of peer %s: %u replicas, %" PRIu64 " bytes, commit %" PRIu64
		  " there, %" PRIu64 " here, in %.3f ms",
		  sp->what, sp->rp->p->name, sp->count, bytes, sp->commit_a, commit,
		  (double)(now_ns() - sp->started_ns) / 1e6);
	if (sp->cl)
		dispatch_set_answer(sp->cl, sp->req_id, names, sp->count, sp->have_shares,
				    sp->n_have_shares);
	free(names);
	for (uint32_t i = 0; i < sp->count; i++) {
		struct pull *pl = sp->members[i];

		answer_local(pl, false);
		/* The client holds its leases now: the creator's goes. */
		registry_release(reg, &rm->rc, pl->lease);
		if (!replica_find(rm, pl->name)) /* untracked: unlinked, its leases keep it */
			registry_unlink(reg, &rm->rc, pl->name, pl->name_len, reason,
					sizeof(reason));
		pull_free(pl);
	}
	sp->count = 0;
	set_free(sp);
}

/* A's answer: the replica is current, or the descriptor of a new one to receive. */
/* B has memory ready for pl's bytes: A sends them. */
static void pull_go(struct pull *pl)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullGo g = TENSORD__PEER_PULL_GO__INIT;

	g.id = pl->id;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_GO;
	f.pull_go = &g;
	send_frame(pl->rp, &f);
}

/*
 * pl's replica t is on a GPU (docs/remote.md, "GPU tensors across nodes"):
 * registry_create() left its memory to the GPU worker. The bytes are
 * received into host memory meanwhile (or were inline in m), and copied
 * in once both are there (pull_complete()).
 */
static void pull_gpu_begin(struct pull *pl, const Tensord__PeerPullReply *m, struct tensor *t,
			   uint64_t nbytes)
{
	struct gjob *j = calloc(1, sizeof(*j));
	int e = ENOMEM;

	pl->st = PL_ALLOCATING;
	pl->gpu = true;
	pl->t = t;
	pl->generation = m->generation;
	pl->watched = m->watched;
	pl->nbytes = nbytes;
	pl->map_len = (size_t)nbytes;
	pl->map = j ? stage_map(pl->map_len) : NULL;
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
	if (pl->map && gjob_submit(pl->rm, j) == 0) {
		pl->job = j;
		uv_timer_start(&pl->timer, on_pull_timeout,
			       PULL_BASE_MS + (uint64_t)nbytes / PULL_BYTES_PER_MS, 0);
		if (!pl->in_host)
			populate_kick(pl->rm);
		return;
	}
	free(j);
	/* The create is finished (which unpins t and frees it), as a failed allocation. */
	{
		struct reg_alloc_job nomem = { .t = t, .rc = -ENOMEM, .got = { .fd = -1 } };
		char reason[300];
		uint64_t lease;

		registry_create_finish(&pl->rm->srv->reg, &nomem, &lease, reason, sizeof(reason));
	}
	pull_fail(pl, -e, "no host memory to receive its GPU replica (%" PRIu64 " bytes) in: %s",
		  nbytes, strerror(e));
}

/* pl's GPU replica's memory is allocated (on the loop): the bytes may come. */
static void pull_allocated(struct gjob *j)
{
	struct pull *pl = j->pl;
	char why[400];
	uint64_t lease;
	int r;

	r = registry_create_finish(j->reg, &j->alloc, &lease, why, sizeof(why));
	if (!pl) { /* the pull ended meanwhile: so does its replica */
		if (r == 0 && j->rm) {
			struct tensor *t = j->alloc.t;

			registry_unlink(j->reg, &j->rm->rc, t->name, strlen(t->name), why,
					sizeof(why));
			registry_release(j->reg, &j->rm->rc, lease);
		}
		return;
	}
	pl->job = NULL;
	if (r < 0) {
		pull_fail(pl, r, "cannot make its replica on this node: %s", why);
		return;
	}
	pl->lease = lease;
	pl->st = PL_RECEIVING;
	if (pl->in_host || pl->nbytes == 0)
		pull_complete(pl);
	else
		pull_go(pl);
}

/* pl's GPU replica's bytes were copied in (on the loop): it is published, or fails. */
static void pull_filled(struct gjob *j)
{
	struct pull *pl = j->pl;

	munmap(j->buf, j->len);
	if (!pl)
		return;
	pl->job = NULL;
	if (j->status < 0) {
		pull_fail(pl, j->status, "cannot copy its replica's bytes into %s:%d: %s",
			  pl->t->alloc.ops->name, pl->t->device.device_id, strerror(-j->status));
		return;
	}
	pl->filled = true;
	figure_count(FIG_remote_gpu_pulls_total, 1);
	pull_complete(pl);
}

static void gjob_done(void *arg)
{
	struct gjob *j = arg;

	if (j->rm)
		LIST_REMOVE(j, link);
	switch (j->kind) {
	case GJ_STAGE:
		serve_staged(j);
		break;
	case GJ_ALLOC:
		pull_allocated(j);
		break;
	case GJ_FILL:
		pull_filled(j);
		break;
	}
	free(j);
}

static int on_pull_reply(struct rpeer *rp, const Tensord__PeerPullReply *m, char *why,
			 size_t why_len)
{
	struct remote *rm = rp->rm;
	struct registry *reg = &rm->srv->reg;
	struct pull *pl = pull_by_id(rm, m->id);
	struct create_args a = { 0 };
	char reason[400];
	int64_t strides[32];
	struct replica *rep;
	struct tensor *t;
	uint64_t nbytes;
	DLDataType dt;
	int r;

	if (!pl || pl->dead || pl->st != PL_ASKING || pl->rp != rp) {
		if (m->status == 0 && !m->current) { /* a pull given up: end A's lease */
			Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
			Tensord__PeerPullDone d = TENSORD__PEER_PULL_DONE__INIT;

			d.id = m->id;
			f.body_case = TENSORD__PEER_FRAME__BODY_PULL_DONE;
			f.pull_done = &d;
			send_frame(rp, &f);
		}
		return 0;
	}
	if (m->waiting) {
		if (!pl->wait) {
			snprintf(why, why_len, "a 'not yet' for '%s', which did not ask to wait",
				 pl->name);
			pull_fail(pl, -EPROTO,
				  "it answered 'not yet' to a pull that does not wait");
			return -EPROTO;
		}
		pull_wait(pl, m->watched);
		return 0;
	}
	if (m->status < 0) {
		/* A's own words, cut to a line: they name A, the tensor and the reason. */
		pull_fail(pl, m->status >= -4095 ? m->status : -EPROTO, "%.300s",
			  m->error ? m->error : "refused");
		return 0;
	}
	if (pl->set && set_member_named(pl, m) < 0)
		return 0;
	/* A set's member replaces its replica in the set's commit, not before. */
	rep = pl->set ? NULL : replica_find(rm, pl->name);
	if (m->current) {
		if (pl->set || !rep || rep->generation != m->generation) {
			pull_fail(pl, -EPROTO, "it called a replica current that this node lacks");
			return 0;
		}
		figure_count(FIG_remote_replica_hits_total, 1);
		rep->watched = m->watched;
		uv_timer_stop(&pl->timer);
		answer_local(pl, rep->watched);
		pull_free(pl);
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
		pull_fail(pl, -EPROTO, "its descriptor fails this node's checks");
		return -EPROTO;
	}
	if (pl->wait && pull_receiving(rm, pl->name)) {
		/* Another pull is making this replica: end A's lease, ask again soon. */
		Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
		Tensord__PeerPullDone d = TENSORD__PEER_PULL_DONE__INIT;

		d.id = pl->id;
		f.body_case = TENSORD__PEER_FRAME__BODY_PULL_DONE;
		f.pull_done = &d;
		send_frame(rp, &f);
		pl->st = PL_WAITING;
		uv_timer_start(&pl->timer, on_pull_timeout, 10, 0);
		return 0;
	}
	if (rep)
		replica_drop(rm, rep, "the peer publishes a newer generation");
	r = replica_share_room(rm, rp, nbytes, reason, sizeof(reason));
	if (r < 0) {
		pull_fail(pl, r, "%s", reason);
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
		pull_fail(pl, -EPROTO, "it sent %zu bytes inline for %" PRIu64, m->data.len,
			  nbytes);
		return -EPROTO;
	}
	r = registry_create(reg, &rm->rc, &a, &t, &pl->lease, reason, sizeof(reason));
	if (r == -EINPROGRESS) {
		pull_gpu_begin(pl, m, t, nbytes);
		return 0;
	}
	if (r < 0) {
		pull_fail(pl, r, "%s its replica on this node: %s",
			  r == -ENOSPC || r == -EDQUOT ? "no room for" : "cannot make", reason);
		return 0;
	}
	pl->st = PL_RECEIVING;
	pl->generation = m->generation;
	pl->watched = m->watched;
	pl->nbytes = nbytes;
	pl->t = t;
	if (m->data.len) { /* inline: the bytes are here */
		r = t->alloc.ops->write(&t->alloc, 0, m->data.data, m->data.len);
		if (r < 0) {
			pull_fail(pl, r, "cannot write its replica (%" PRIu64 " bytes): %s", nbytes,
				  strerror(-r));
			return 0;
		}
		pull_complete(pl);
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
			pull_fail(pl, -e, "cannot map its replica (%" PRIu64 " bytes): %s", nbytes,
				  strerror(e));
			return 0;
		}
		populate_kick(rm);
	}
	uv_timer_start(&pl->timer, on_pull_timeout,
		       PULL_BASE_MS + (uint64_t)nbytes / PULL_BYTES_PER_MS, 0);
	pull_go(pl);
	return 0;
}

/* The bytes are in place: the replica is sealed, published and handed out. */
static void pull_complete(struct pull *pl)
{
	struct remote *rm = pl->rm;
	struct registry *reg = &rm->srv->reg;
	char reason[400];
	struct replica *rep;
	struct tensor *t;
	int r;

	if (pl->gpu && !pl->filled && pl->nbytes) { /* the bytes go to the device first */
		struct gjob *j = calloc(1, sizeof(*j));

		if (j) {
			j->kind = GJ_FILL;
			j->pl = pl;
			j->a = pl->t->alloc;
			j->buf = pl->map;
			j->len = pl->map_len;
		}
		if (!j || gjob_submit(rm, j) < 0) {
			free(j);
			pull_fail(pl, -ENOMEM, "out of memory");
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
		pl->done = true;
		uv_timer_stop(&pl->timer);
		if (++pl->set->n_done == pl->set->count)
			set_publish(pl->set);
		return;
	}
	r = registry_publish(reg, &rm->rc, pl->name, pl->name_len, &t, reason, sizeof(reason));
	if (r < 0) {
		pull_fail(pl, r, "cannot publish its replica: %s", reason);
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
		if (!replica_link(rm, rep)) {
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
	answer_local(pl, rep && rep->watched);
	/* Waiters hold their leases now: the creator's goes. */
	registry_release(reg, &rm->rc, pl->lease);
	if (!rep) /* stale or untracked: unlinked at once, its leases keep it */
		registry_unlink(reg, &rm->rc, pl->name, pl->name_len, reason, sizeof(reason));
	pull_free(pl);
}

/*
 * A says names changed: their replicas are dropped (leases keep the
 * bytes), and a pull A answered before the change is not kept as watched.
 */
static int on_changed(struct rpeer *rp, const Tensord__PeerChanged *m, char *why, size_t why_len)
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
		r = replica_find(rm, full);
		if (r && r->rp == rp) {
			figure_count(FIG_remote_replicas_changed_total, 1);
			replica_drop(rm, r, "its peer published it anew or unlinked it");
		}
		LIST_FOREACH(pl, &rm->pulls, link)
		if (!pl->dead && pl->rp == rp && strcmp(pl->name, full) == 0 &&
		    pl->st == PL_RECEIVING)
			pl->stale = true;
		/* Waiting pulls ask again (after this loop: asking may fail one). */
		LIST_FOREACH(pl, &rm->pulls, link)
		if (!pl->dead && pl->rp == rp && pl->st == PL_WAITING &&
		    strcmp(pl->name, full) == 0)
			uv_timer_start(&pl->timer, on_pull_timeout, 0, 0);
	}
	return 0;
}

/* B no longer holds r: A need not tell of its changes (unless a pull is on the way). */
static void unwatch_send(struct remote *rm, struct replica *r)
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
	send_frame(r->rp, &f);
}

/* --- the data path's callbacks ---------------------------------------------------- */

static void *x_recv_dest(void *ctx, uint64_t tag, size_t len)
{
	struct pull *pl = pull_by_id(ctx, tag);

	if (!pl || pl->dead || pl->st != PL_RECEIVING || pl->posted || len != pl->nbytes ||
	    !pl->map)
		return NULL;
	pl->posted = true;
	return pl->map;
}

static void x_recv_done(void *ctx, uint64_t tag, int status)
{
	struct pull *pl = pull_by_id(ctx, tag);

	if (!pl)
		return;
	pl->posted = false;
	if (pl->dead) {
		if (pl->map)
			munmap(pl->map, pl->map_len);
		pull_free(pl);
		return;
	}
	if (status < 0)
		pull_fail(pl, status == -ECONNRESET ? -ECONNRESET : status,
			  "the transfer failed: %s", strerror(-status));
	else
		pull_complete(pl);
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
	serve_end(s);
	serve_start_queued(rp);
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
		set_fail(sp, -ECONNRESET, why);
	}

	for (pl = LIST_FIRST(&rm->pulls); pl; pl = next) {
		next = LIST_NEXT(pl, link);
		if (pl->rp == rp && !pl->dead)
			pull_fail(pl, -ECONNRESET, "%s", reason);
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
	send_frame(rp, &f);
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
	watch_clear(rp); /* its replicas go below: the next connection starts afresh */
	snprintf(why, sizeof(why), "connection lost: %s", reason);
	fail_pulls_of(rm, rp, why);
	/* Its replicas: this node can no longer tell whether they are current. */
	for (r = LIST_FIRST(&rm->replicas); r; r = rnext) {
		rnext = LIST_NEXT(r, link);
		if (r->rp == rp)
			replica_drop(rm, r, "its peer's connection was lost");
	}
	/* Serving: sends in flight end with an error once the endpoint closes. */
	for (s = TAILQ_FIRST(&rp->serves); s; s = snext) {
		snext = TAILQ_NEXT(s, link);
		if (s->st != SV_SENDING)
			serve_end(s);
	}
	xport_ep_close(rp->ep);
	rp->ep = NULL;
	free(rp->addr);
	rp->addr = NULL;
	{
		uint32_t n = rp->rc.n_leases;

		registry_client_gone(&rm->srv->reg, &rp->rc);
		rm->figs->pull_leases -= n;
	}
	rp->rc_live = false;
}

static int on_peer_frame(void *ctx, struct peer *p, const Tensord__PeerFrame *f, char *why,
			 size_t why_len)
{
	struct remote *rm = ctx;
	struct rpeer *rp = p->data;

	if (!rp || !rp->up) {
		snprintf(why, why_len, "remote attach is not set up for this peer");
		return -EPROTO;
	}
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
					 p->name, cwhy);
				rp->ep = NULL;
			}
		}
		return 0;
	case TENSORD__PEER_FRAME__BODY_PULL:
		on_pull(rp, f->pull);
		return 0;
	case TENSORD__PEER_FRAME__BODY_PULL_REPLY:
		return on_pull_reply(rp, f->pull_reply, why, why_len);
	case TENSORD__PEER_FRAME__BODY_PULL_GO:
		on_pull_go(rp, f->pull_go->id);
		return 0;
	case TENSORD__PEER_FRAME__BODY_PULL_DONE:
		on_pull_done(rp, f->pull_done->id);
		return 0;
	case TENSORD__PEER_FRAME__BODY_CHANGED:
		if (f->changed->n_names != f->changed->n_generations) {
			snprintf(why, why_len, "a change list of %zu names and %zu generations",
				 f->changed->n_names, f->changed->n_generations);
			return -EPROTO;
		}
		return on_changed(rp, f->changed, why, why_len);
	case TENSORD__PEER_FRAME__BODY_UNWATCH:
		on_unwatch(rp, f->unwatch);
		return 0;
	case TENSORD__PEER_FRAME__BODY_SET_PULL:
		on_set_pull(rp, f->set_pull);
		return 0;
	case TENSORD__PEER_FRAME__BODY_SET_PULL_REPLY:
		return on_set_pull_reply(rp, f->set_pull_reply, why, why_len);
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
	uint64_t now = now_ns(), keep = (uint64_t)rm->srv->cfg.remote.replica_keep_ms * 1000000u;
	struct replica *r, *next;
	struct tensor *tn;

	for (r = LIST_FIRST(&rm->replicas); r; r = next) {
		next = LIST_NEXT(r, link);
		tn = registry_lookup(&rm->srv->reg, &rm->rc, r->name, r->name_len);
		if (!tn || tn->id != r->tensor_id) {
			unwatch_send(rm, r);
			replica_unlink(rm, r);
			free(r);
		} else if (tn->refcount) {
			r->idle_since_ns = 0;
		} else if (!r->idle_since_ns) {
			r->idle_since_ns = now;
		} else if (now - r->idle_since_ns >= keep) {
			unwatch_send(rm, r);
			replica_drop(rm, r, "unleased for --replica-keep");
		}
	}
}

/* --- start, stop ------------------------------------------------------------------------ */

void remote_start(struct server *srv)
{
	struct remote *rm;
	struct xport_cbs cbs;
	unsigned tick;
	int r;

	if (!srv->peers.on)
		return;
	rm = calloc(1, sizeof(*rm));
	if (!rm) {
		log_error("remote attach: out of memory: off");
		return;
	}
	rm->srv = srv;
	rm->figs = &srv->remote_figs;
	rm->max_replica_bytes = srv->cfg.remote.max_replica_bytes;
	if (!rm->max_replica_bytes) {
		struct reg_device *d = registry_device(&srv->reg, (DLDevice){ kDLCPU, 0 });

		rm->max_replica_bytes = d && d->capacity ? d->capacity / 4 : UINT64_MAX;
	}
	LIST_INIT(&rm->pulls);
	LIST_INIT(&rm->replicas);
	LIST_INIT(&rm->sets);
	LIST_INIT(&rm->jobs);
	registry_client_init(&rm->rc, UINT64_MAX - 1, (uint32_t)geteuid(), (uint32_t)getegid(),
			     (uint32_t)getpid());
	cbs = (struct xport_cbs){ .recv_dest = x_recv_dest,
				  .recv_done = x_recv_done,
				  .send_done = x_send_done,
				  .ep_failed = x_ep_failed,
				  .ctx = rm };
	r = xport_init(&rm->x, srv->loop, &cbs, rm->why, sizeof(rm->why));
	if (r < 0)
		log_warn("remote attach: no data path, ignoring: %s", rm->why);
	else
		log_info("remote attach: %s; %u export rules, replicas kept %u ms after their "
			 "last lease, at most %" PRIu64 " bytes of them per peer",
			 xport_describe(rm->x), srv->cfg.remote.n_exports,
			 srv->cfg.remote.replica_keep_ms, rm->max_replica_bytes);
	uv_timer_init(srv->loop, &rm->keep);
	rm->keep.data = rm;
	uv_idle_init(srv->loop, &rm->populate);
	rm->populate.data = rm;
	rm->open_handles = 2;
	tick = srv->cfg.remote.replica_keep_ms / 4;
	tick = tick < 50 ? 50 : tick > 1000 ? 1000 : tick;
	uv_timer_start(&rm->keep, on_keep, tick, tick);
	srv->remote = rm;
	srv->peers.on_up = on_peer_up;
	srv->peers.on_down = on_peer_down;
	srv->peers.on_frame = on_peer_frame;
	srv->peers.hooks_ctx = rm;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct remote *rm = h->data;

	if (--rm->open_handles == 0)
		free(rm);
}

void remote_stop(struct server *srv)
{
	struct remote *rm = srv->remote;
	struct pull *pl, *next;
	struct replica *r;
	struct serve *s;
	struct gjob *j;

	if (!rm)
		return;
	rm->stopping = true;
	while (!LIST_EMPTY(&rm->sets))
		set_fail(LIST_FIRST(&rm->sets), -ESHUTDOWN, "this daemon is stopping");
	for (pl = LIST_FIRST(&rm->pulls); pl; pl = next) {
		next = LIST_NEXT(pl, link);
		if (!pl->dead)
			pull_fail(pl, -ESHUTDOWN, "this daemon is stopping");
	}
	/* The peers' closes that follow are no news to remote attach now. */
	srv->peers.on_up = NULL;
	srv->peers.on_down = NULL;
	srv->peers.on_frame = NULL;
	/* After this no UCX callback comes: what UCX held may go. */
	xport_fini(rm->x);
	rm->x = NULL;
	while ((pl = LIST_FIRST(&rm->pulls))) {
		if (pl->map)
			munmap(pl->map, pl->map_len);
		pull_free(pl);
	}
	for (unsigned i = 0; i < srv->peers.n_peers; i++) {
		struct rpeer *rp = srv->peers.peers[i]->data;

		if (!rp)
			continue;
		while ((s = TAILQ_FIRST(&rp->serves)))
			serve_end(s);
		if (rp->rc_live)
			registry_client_gone(&srv->reg, &rp->rc);
		watch_clear(rp);
		free(rp->addr);
		free(rp);
		srv->peers.peers[i]->data = NULL;
	}
	/* Their peers' counts went with the peers above: only the memory now. */
	tdestroy(rm->replica_index, noop_free);
	rm->replica_index = NULL;
	while ((r = LIST_FIRST(&rm->replicas))) {
		LIST_REMOVE(r, link);
		free(r);
	}
	registry_client_gone(&srv->reg, &rm->rc);
	/* GPU jobs still running end after rm: they free what they hold and touch nothing else. */
	while ((j = LIST_FIRST(&rm->jobs))) {
		LIST_REMOVE(j, link);
		j->rm = NULL;
	}
	srv->remote = NULL;
	uv_close((uv_handle_t *)&rm->keep, on_handle_closed);
	uv_close((uv_handle_t *)&rm->populate, on_handle_closed); /* the last frees rm */
}

/* A waiting pull nobody waits on any more ends (A holds nothing for it). */
static void pull_unwanted(struct pull *pl)
{
	if (pl->wait && pl->st == PL_WAITING && LIST_EMPTY(&pl->waits)) {
		uv_timer_stop(&pl->timer);
		pull_free(pl);
	}
}

void remote_client_gone(struct client *cl)
{
	struct remote *rm = rm_of(cl->srv);
	struct pull *pl, *pnext;
	struct pwait *w, *next;
	struct spull *sp;

	if (!rm)
		return;
	LIST_FOREACH(sp, &rm->sets, link)
	if (sp->cl == cl)
		sp->cl = NULL; /* pulled and published all the same, as a single pull is */
	for (pl = LIST_FIRST(&rm->pulls); pl; pl = pnext) {
		pnext = LIST_NEXT(pl, link);
		for (w = LIST_FIRST(&pl->waits); w; w = next) {
			next = LIST_NEXT(w, link);
			if (w->cl == cl) {
				LIST_REMOVE(w, link);
				pwait_free(w);
			}
		}
		pull_unwanted(pl);
	}
}

int remote_cancel(struct client *cl, uint64_t req_id)
{
	struct remote *rm = rm_of(cl->srv);
	struct pwait *w;
	struct pull *pl;
	char why[400];

	if (!rm)
		return -ENOENT;
	LIST_FOREACH(pl, &rm->pulls, link)
	LIST_FOREACH(w, &pl->waits, link)
	if (w->cl == cl && w->id == req_id && pl->wait) {
		snprintf(why, sizeof(why), "tensor '%s': the wait was cancelled", pl->name);
		reply_status(cl->conn, ATTACH, w->id, -ECANCELED, why);
		LIST_REMOVE(w, link);
		pwait_free(w);
		pull_unwanted(pl);
		return 0;
	}
	return -ENOENT;
}
