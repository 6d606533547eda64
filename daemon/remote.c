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
#include <sys/mman.h>
#include <sys/queue.h>
#include <unistd.h>

#include "common/desc.h"
#include "dispatch_int.h"
#include "figures.h"
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

/* A: one pull of a peer's being served. */
struct serve {
	struct rpeer *rp;
	uint64_t id; /* the peer's pull id */
	uint64_t epoch;
	uint64_t lease;   /* in rp->rc, while epoch is current */
	struct tensor *t; /* borrowed: valid while that lease lives */
	uint64_t fd_off, len;
	void *map; /* owned; NULL until mapped */
	size_t map_len;
	enum { SV_LEASED, SV_QUEUED, SV_SENDING } st;
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
	unsigned n_serves;
	TAILQ_HEAD(, serve) serves;
};

/* B: a client's attach waiting on a pull. */
struct pwait {
	struct client *cl;
	uint64_t id, have_id;
	bool bind;
	LIST_ENTRY(pwait) link;
};

/* B: one pull. */
struct pull {
	struct remote *rm;
	struct rpeer *rp;
	uint64_t id;
	char name[TENSORD_NAME_MAX + 1]; /* "@a/m/w" */
	size_t name_len, peer_len;
	enum { PL_ASKING, PL_RECEIVING } st;
	bool dead;   /* failed with its receive posted: waits for that to end */
	bool posted; /* UCX has the mapping */
	uint64_t lease, generation, nbytes;
	void *map; /* owned */
	size_t map_len;
	uint64_t started_ns;
	uv_timer_t timer;
	LIST_HEAD(, pwait) waits;
	LIST_ENTRY(pull) link;
};

/* B: a replica this daemon published. */
struct replica {
	char name[TENSORD_NAME_MAX + 1];
	size_t name_len;
	struct rpeer *rp;
	uint64_t tensor_id, generation, nbytes;
	uint64_t idle_since_ns; /* 0 while leased */
	LIST_ENTRY(replica) link;
};

struct remote {
	struct server *srv;
	struct xport *x;
	char why[300];        /* why there is no data path */
	struct reg_client rc; /* B: creates the replicas */
	uint64_t next_id;
	LIST_HEAD(, pull) pulls;
	LIST_HEAD(, replica) replicas;
	struct remote_figures *figs; /* the server's gauges (srv->remote_figs), kept here */
	uint64_t max_replica_bytes;  /* --peer-max-replica-bytes, or its default resolved */
	uv_timer_t keep;
};

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
static void serve_end(struct serve *s)
{
	struct rpeer *rp = s->rp;

	if (s->map)
		munmap(s->map, s->map_len);
	if (s->epoch == rp->epoch && rp->rc_live) {
		registry_release(&rp->rm->srv->reg, &rp->rc, s->lease);
		rp->rm->figs->pull_leases--;
	}
	TAILQ_REMOVE(&rp->serves, s, link);
	rp->n_serves--;
	free(s);
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

static void on_pull(struct rpeer *rp, const Tensord__PeerPull *m)
{
	struct remote *rm = rp->rm;
	struct server *srv = rm->srv;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerPullReply rep = TENSORD__PEER_PULL_REPLY__INIT;
	char why[800], reason[300];
	size_t len = strlen(m->name);
	struct tensor *t;
	struct serve *s = NULL;
	uint64_t lease;
	bool writable;
	int r;

	if (td_name_check(m->name, len, reason, sizeof(reason)) < 0) {
		snprintf(why, sizeof(why), "node %s: %s", srv->peers.self, reason);
		pull_reply_error(rp, m->id, -EINVAL, why);
		return;
	}
	if (!remote_exported(&srv->cfg.remote, rp->p->name, m->name, len) ||
	    !registry_published(&srv->reg, m->name, len)) {
		/* Not exported and not published are told apart to nobody. */
		snprintf(why, sizeof(why),
			 "tensor '%s' is not published on node %s, or not exported to node %s",
			 m->name, srv->peers.self, rp->p->name);
		pull_reply_error(rp, m->id, -ENOENT, why);
		return;
	}
	if (m->have_generation &&
	    registry_generation(&srv->reg, m->name, len) == m->have_generation) {
		rep.id = m->id;
		rep.current = true;
		rep.generation = m->have_generation;
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
	r = 0;
	if (t->device.device_type != kDLCPU || !t->alloc.ops->export_fd) {
		snprintf(why, sizeof(why), "tensor '%s' on node %s is not in host memory: %s",
			 m->name, srv->peers.self, "only host tensors can be pulled yet");
		r = -EOPNOTSUPP;
	} else if (t->flags & TENSORD_MUTABLE) {
		snprintf(why, sizeof(why),
			 "tensor '%s' on node %s is mutable: mutable tensors cannot be exported "
			 "(their bytes could change during the transfer)",
			 m->name, srv->peers.self);
		r = -EPERM;
	} else if (!(s = calloc(1, sizeof(*s)))) {
		snprintf(why, sizeof(why), "node %s: out of memory", srv->peers.self);
		r = -ENOMEM;
	}
	if (r < 0) {
		registry_release(&srv->reg, &rp->rc, lease);
		pull_reply_error(rp, m->id, r, why);
		return;
	}
	s->rp = rp;
	s->id = m->id;
	s->epoch = rp->epoch;
	s->lease = lease;
	s->t = t;
	s->fd_off = t->alloc.share_id ? t->alloc.ipc_offset : 0;
	s->len = t->nbytes;
	s->st = SV_LEASED;
	TAILQ_INSERT_TAIL(&rp->serves, s, link);
	rp->n_serves++;
	rm->figs->pull_leases++;

	rep.id = m->id;
	rep.generation = t->generation;
	rep.nbytes = t->nbytes;
	rep.dtype_code = t->dtype.code;
	rep.dtype_bits = t->dtype.bits;
	rep.dtype_lanes = t->dtype.lanes;
	rep.n_shape = rep.n_strides = (size_t)t->ndim;
	rep.shape = t->shape;
	rep.strides = t->strides;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
	f.pull_reply = &rep;
	/* Small tensors go inline, in the reply: one round trip, no UCX message. */
	if (t->nbytes && t->nbytes <= REMOTE_INLINE_MAX && serve_map(s) == 0) {
		rep.data.data = (uint8_t *)s->map + (s->fd_off & 4095);
		rep.data.len = (size_t)t->nbytes;
		send_frame(rp, &f);
		figure_count(FIG_remote_served_total, 1);
		figure_count(FIG_remote_served_bytes_total, t->nbytes);
		serve_end(s);
		return;
	}
	send_frame(rp, &f);
	log_debug("peer %s: pull %" PRIu64 " of '%s' (%" PRIu64 " bytes): leased", rp->p->name,
		  m->id, m->name, t->nbytes);
}

/* Maps s's bytes read-only (s->map): 0, or -errno, logged. */
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
	s->map = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)base);
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
	if (s->len == 0 || serve_map(s) < 0) {
		serve_end(s);
		return;
	}
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

static struct pull *pull_by_id(struct remote *rm, uint64_t id)
{
	struct pull *pl;

	LIST_FOREACH(pl, &rm->pulls, link)
	if (pl->id == id)
		return pl;
	return NULL;
}

static struct replica *replica_find(struct remote *rm, const char *name)
{
	struct replica *r;

	LIST_FOREACH(r, &rm->replicas, link)
	if (strcmp(r->name, name) == 0)
		return r;
	return NULL;
}

/* Unlinks the replica's name (its leases keep its bytes) and forgets it. */
static void replica_drop(struct remote *rm, struct replica *r, const char *why)
{
	char buf[300];
	struct tensor *t = registry_lookup(&rm->srv->reg, &rm->rc, r->name, r->name_len);

	if (t && t->id == r->tensor_id)
		registry_unlink(&rm->srv->reg, &rm->rc, r->name, r->name_len, buf, sizeof(buf));
	log_debug("replica '%s': unlinked: %s", r->name, why);
	LIST_REMOVE(r, link);
	rm->figs->replicas--;
	rm->figs->replica_bytes -= r->nbytes;
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
	const struct replica *r;
	const struct pull *pl;
	uint64_t n = 0;

	LIST_FOREACH(r, &rm->replicas, link)
	if (r->rp == rp)
		n += r->nbytes;
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
	LIST_REMOVE(pl, link);
	uv_close((uv_handle_t *)&pl->timer, on_pull_closed);
}

/*
 * pl failed: every attach waiting on it gets status and "peer P: tensor
 * 'N': <reason>"; the replica being made is discarded; A is told to end
 * its lease. The mapping stays while UCX may write it.
 */
static void __attribute__((format(printf, 3, 4)))
pull_fail(struct pull *pl, int status, const char *fmt, ...)
{
	struct remote *rm = pl->rm;
	char reason[300], why[600], buf[300];
	struct pwait *w;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	snprintf(why, sizeof(why), "peer %s: tensor '%s': %s", pl->rp->p->name,
		 pl->name + pl->peer_len + 2, reason);
	log_info("pull %" PRIu64 " of '%s' failed: %s", pl->id, pl->name, why);
	figure_count(FIG_remote_pull_failures_total, 1);
	while ((w = LIST_FIRST(&pl->waits))) {
		LIST_REMOVE(w, link);
		reply_status(w->cl->conn, ATTACH, w->id, status, why);
		free(w);
	}
	if (pl->st == PL_RECEIVING) {
		registry_unlink(&rm->srv->reg, &rm->rc, pl->name, pl->name_len, buf, sizeof(buf));
		registry_release(&rm->srv->reg, &rm->rc, pl->lease);
	}
	if (pl->rp->up) {
		Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
		Tensord__PeerPullDone d = TENSORD__PEER_PULL_DONE__INIT;

		d.id = pl->id;
		f.body_case = TENSORD__PEER_FRAME__BODY_PULL_DONE;
		f.pull_done = &d;
		send_frame(pl->rp, &f);
	}
	uv_timer_stop(&pl->timer);
	if (pl->posted) {
		pl->dead = true; /* its receive's end unmaps and frees it */
		return;
	}
	if (pl->map)
		munmap(pl->map, pl->map_len);
	pull_free(pl);
}

static void answer_local(struct pull *pl)
{
	struct pwait *w;

	while ((w = LIST_FIRST(&pl->waits))) {
		LIST_REMOVE(w, link);
		dispatch_attach_local(w->cl, w->id, pl->name, pl->name_len, w->have_id, w->bind);
		free(w);
	}
}

static void on_pull_timeout(uv_timer_t *t)
{
	struct pull *pl = t->data;
	uint64_t ms = (now_ns() - pl->started_ns) / 1000000u;

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
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL;
	f.pull = &m;
	return peer_send(pl->rp->p, &f);
}

void remote_attach(struct client *cl, uint64_t id, const char *name, uint64_t have_id, bool bind)
{
	struct server *srv = cl->srv;
	struct remote *rm = rm_of(srv);
	char why[600], peer[PEER_NAME_MAX + 1], known[200];
	size_t len = strlen(name), peer_len, k = 0;
	struct rpeer *rp;
	struct pull *pl;
	struct pwait *w;
	struct replica *rep;
	struct peer *p;
	int r;

	r = td_remote_name_check(name, len, &peer_len, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, ATTACH, id, r, why);
		return;
	}
	memcpy(peer, name + 1, peer_len);
	peer[peer_len] = '\0';
	p = srv->peers.on ? peer_lookup(&srv->peers, peer) : NULL;
	if (!p) {
		known[0] = '\0';
		for (unsigned i = 0; i < srv->peers.n_peers && k < sizeof(known); i++)
			k += (size_t)snprintf(known + k, sizeof(known) - k, "%s%s", i ? ", " : "",
					      srv->peers.peers[i]->name);
		snprintf(why, sizeof(why), "tensor '%s': no peer '%s' (%s%s)", name, peer,
			 srv->peers.on ? "known peers: " : "peering is off",
			 srv->peers.on ? (known[0] ? known : "none") : "");
		reply_status(cl->conn, ATTACH, id, -ENOENT, why);
		return;
	}
	rp = p->data;
	if (!rm || !rp || !rp->up) {
		snprintf(why, sizeof(why), "tensor '%s': peer %s is not connected (%s%s%s)", name,
			 peer, peer_state_name(p->state), p->error[0] ? ": " : "", p->error);
		reply_status(cl->conn, ATTACH, id, -EHOSTUNREACH, why);
		return;
	}
	if (!rm->x || !rp->addr) {
		snprintf(why, sizeof(why), "tensor '%s': no data path to peer %s: %s", name, peer,
			 !rm->x ? rm->why : "it has not sent its UCX worker address");
		reply_status(cl->conn, ATTACH, id, -EHOSTUNREACH, why);
		return;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		reply_status(cl->conn, ATTACH, id, -ENOMEM, "out of memory for a remote attach");
		return;
	}
	*w = (struct pwait){ .cl = cl, .id = id, .have_id = have_id, .bind = bind };
	pl = pull_by_name(rm, name);
	if (pl) { /* one pull per name: this attach waits on it */
		LIST_INSERT_HEAD(&pl->waits, w, link);
		return;
	}
	pl = calloc(1, sizeof(*pl));
	if (!pl) {
		free(w);
		reply_status(cl->conn, ATTACH, id, -ENOMEM, "out of memory for a remote attach");
		return;
	}
	pl->rm = rm;
	pl->rp = rp;
	pl->id = ++rm->next_id;
	memcpy(pl->name, name, len + 1);
	pl->name_len = len;
	pl->peer_len = peer_len;
	pl->st = PL_ASKING;
	pl->started_ns = now_ns();
	LIST_INIT(&pl->waits);
	LIST_INSERT_HEAD(&pl->waits, w, link);
	LIST_INSERT_HEAD(&rm->pulls, pl, link);
	uv_timer_init(srv->loop, &pl->timer);
	pl->timer.data = pl;
	uv_timer_start(&pl->timer, on_pull_timeout, PULL_BASE_MS, 0);
	rep = replica_find(rm, name);
	if (pull_ask(pl, rep ? rep->generation : 0) < 0)
		pull_fail(pl, -ECONNRESET, "the connection to it was lost");
}

/* A's answer: the replica is current, or the descriptor of a new one to receive. */
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
	if (m->status < 0) {
		/* A's own words, cut to a line: they name A, the tensor and the reason. */
		pull_fail(pl, m->status >= -4095 ? m->status : -EPROTO, "%.300s",
			  m->error ? m->error : "refused");
		return 0;
	}
	rep = replica_find(rm, pl->name);
	if (m->current) {
		if (!rep || rep->generation != m->generation) {
			pull_fail(pl, -EPROTO, "it called a replica current that this node lacks");
			return 0;
		}
		figure_count(FIG_remote_replica_hits_total, 1);
		uv_timer_stop(&pl->timer);
		answer_local(pl);
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
	a.device = (DLDevice){ kDLCPU, 0 };
	a.mode = 0444;
	a.replica = true;
	r = registry_create(reg, &rm->rc, &a, &t, &pl->lease, reason, sizeof(reason));
	if (r < 0) {
		pull_fail(pl, r, "no room for its replica on this node: %s", reason);
		return 0;
	}
	pl->st = PL_RECEIVING;
	pl->generation = m->generation;
	pl->nbytes = nbytes;
	if (nbytes) {
		pl->map_len = (size_t)nbytes;
		pl->map = mmap(NULL, pl->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
			       t->alloc.fd, 0);
		if (pl->map == MAP_FAILED) {
			int e = errno;

			pl->map = NULL;
			pull_fail(pl, -e, "cannot map its replica (%" PRIu64 " bytes): %s", nbytes,
				  strerror(e));
			return 0;
		}
	}
	if (m->data.len) { /* inline: the bytes are here */
		if (m->data.len != nbytes) {
			snprintf(why, why_len, "inline bytes of '%s': %zu, not %" PRIu64, pl->name,
				 m->data.len, nbytes);
			pull_fail(pl, -EPROTO, "it sent %zu bytes inline for %" PRIu64, m->data.len,
				  nbytes);
			return -EPROTO;
		}
		memcpy(pl->map, m->data.data, m->data.len);
		pull_complete(pl);
		return 0;
	}
	uv_timer_start(&pl->timer, on_pull_timeout,
		       PULL_BASE_MS + (uint64_t)nbytes / PULL_BYTES_PER_MS, 0);
	{
		Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
		Tensord__PeerPullGo g = TENSORD__PEER_PULL_GO__INIT;

		g.id = pl->id;
		f.body_case = TENSORD__PEER_FRAME__BODY_PULL_GO;
		f.pull_go = &g;
		send_frame(rp, &f);
	}
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

	if (pl->map) {
		munmap(pl->map, pl->map_len);
		pl->map = NULL;
	}
	r = registry_publish(reg, &rm->rc, pl->name, pl->name_len, &t, reason, sizeof(reason));
	if (r < 0) {
		pull_fail(pl, r, "cannot publish its replica: %s", reason);
		return;
	}
	rep = calloc(1, sizeof(*rep));
	if (rep) {
		memcpy(rep->name, pl->name, pl->name_len + 1);
		rep->name_len = pl->name_len;
		rep->rp = pl->rp;
		rep->tensor_id = t->id;
		rep->generation = pl->generation;
		rep->nbytes = pl->nbytes;
		LIST_INSERT_HEAD(&rm->replicas, rep, link);
		rm->figs->replicas++;
		rm->figs->replica_bytes += pl->nbytes;
	}
	figure_count(FIG_remote_pulls_total, 1);
	figure_count(FIG_remote_pull_bytes_total, pl->nbytes);
	log_debug("replica '%s': pulled, %" PRIu64 " bytes in %.3f ms", pl->name, pl->nbytes,
		  (double)(now_ns() - pl->started_ns) / 1e6);
	uv_timer_stop(&pl->timer);
	answer_local(pl);
	/* Waiters hold their leases now: the creator's goes. */
	registry_release(reg, &rm->rc, pl->lease);
	if (!rep) /* untracked: unlinked at once, its leases keep it */
		registry_unlink(reg, &rm->rc, pl->name, pl->name_len, reason, sizeof(reason));
	pull_free(pl);
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
	}
	serve_end(s);
	serve_start_queued(rp);
}

static void fail_pulls_of(struct remote *rm, struct rpeer *rp, const char *reason)
{
	struct pull *pl, *next;

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
			LIST_REMOVE(r, link);
			rm->figs->replicas--;
			rm->figs->replica_bytes -= r->nbytes;
			free(r);
		} else if (tn->refcount) {
			r->idle_since_ns = 0;
		} else if (!r->idle_since_ns) {
			r->idle_since_ns = now;
		} else if (now - r->idle_since_ns >= keep) {
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
	tick = srv->cfg.remote.replica_keep_ms / 4;
	tick = tick < 50 ? 50 : tick > 1000 ? 1000 : tick;
	uv_timer_start(&rm->keep, on_keep, tick, tick);
	srv->remote = rm;
	srv->peers.on_up = on_peer_up;
	srv->peers.on_down = on_peer_down;
	srv->peers.on_frame = on_peer_frame;
	srv->peers.hooks_ctx = rm;
}

static void on_keep_closed(uv_handle_t *h)
{
	free(h->data);
}

void remote_stop(struct server *srv)
{
	struct remote *rm = srv->remote;
	struct pull *pl, *next;
	struct replica *r;
	struct serve *s;

	if (!rm)
		return;
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
		free(rp->addr);
		free(rp);
		srv->peers.peers[i]->data = NULL;
	}
	while ((r = LIST_FIRST(&rm->replicas))) {
		LIST_REMOVE(r, link);
		free(r);
	}
	registry_client_gone(&srv->reg, &rm->rc);
	srv->remote = NULL;
	uv_close((uv_handle_t *)&rm->keep, on_keep_closed); /* frees rm */
}

void remote_client_gone(struct client *cl)
{
	struct remote *rm = rm_of(cl->srv);
	struct pull *pl;
	struct pwait *w, *next;

	if (!rm)
		return;
	LIST_FOREACH(pl, &rm->pulls, link)
	for (w = LIST_FIRST(&pl->waits); w; w = next) {
		next = LIST_NEXT(w, link);
		if (w->cl == cl) {
			LIST_REMOVE(w, link);
			free(w);
		}
	}
}
