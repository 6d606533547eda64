/*
 * Remote attach, node A: a pull served (docs/remote.md, "Remote attach:
 * the data flow"). A Pull takes a lease owned by the peer's reg_client
 * (uid REMOTE_PEER_UID), after the export rule and the mode check; a
 * PullGo maps the tensor read-only and sends it; the send's end unmaps it
 * and ends the lease. A GPU tensor is copied to host memory on the GPU
 * worker before its reply. Set pulls are remote_serve_set.c; the names a
 * peer watches and their change notices, remote_watch.c.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/queue.h>
#include <unistd.h>

#include "common/desc.h"
#include "daemon/figures.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"
#include "xport.h"

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
	rm_send_frame(rp, &f);
}

static void serve_stage_next(struct rpeer *rp);

/* Whether s is on its peer's list of serves: a serve ends (and is freed) once. */
static inline bool serve_listed(const struct serve *s)
{
	const struct serve *o;

	TAILQ_FOREACH(o, &s->rp->serves, link)
	if (o == s)
		return true;
	return false;
}

/* Ends s: unmaps (never while UCX reads it) and ends its lease (if its connection lives). */
void rm_serve_end(struct serve *s)
{
	struct rpeer *rp = s->rp;
	uint64_t staged = s->staged;
	bool job = s->job != NULL;

	assert(rp->n_serves > 0 && serve_listed(s));
	assert(!job || (s->st == SV_STAGING && s->job->s == s));
	assert(rp->staged >= staged);
	if (s->job) { /* the copy's end frees its memory, and counts it gone */
		s->job->s = NULL;
		s->job->staged = staged;
	}
	if (s->map)
		munmap(s->map, s->map_len);
	if (s->epoch == rp->epoch && rp->rc_live) {
		assert(rp->rm->figs->pull_leases > 0);
		registry_release(rp->rm->env->reg, &rp->rc, s->lease);
		rp->rm->figs->pull_leases--;
	}
	TAILQ_REMOVE(&rp->serves, s, link);
	rp->n_serves--;
	free(s->member);
	free(s);
	if (staged) {
		rp->staged -= staged;
		assert(job || rp->rm->figs->staged_bytes >= staged);
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

static int serve_map(struct serve *s);
static int serve_read(struct serve *s, void *buf);

static void serve_send(struct serve *s)
{
	struct rpeer *rp = s->rp;
	char why[300] = "";
	int r = 0;

	assert(s->st == SV_QUEUED && s->map && s->len);
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
		assert(rp->inflight >= s->len && rp->rm->figs->inflight_bytes >= s->len);
		rp->inflight -= s->len;
		rp->rm->figs->inflight_bytes -= s->len;
		rm_serve_end(s);
	}
}

void rm_serve_start_queued(struct rpeer *rp)
{
	struct serve *s, *next;

	for (s = TAILQ_FIRST(&rp->serves); s; s = next) {
		next = TAILQ_NEXT(s, link);
		if (s->st != SV_QUEUED)
			continue;
		if (rp->inflight && rp->inflight + s->len > rp->rm->env->cfg->max_inflight)
			return; /* in order: the first that does not fit waits, and those behind it */
		serve_send(s);
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
	rep.watched = watch_name ? rm_watch_add(rp, watch_name) : true;
	f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
	f.pull_reply = &rep;
	rm_send_frame(rp, &f);
}

/*
 * Whether rp's uid (REMOTE_PEER_UID) may read the published name: 0, or
 * -EACCES with the refusal. Asked before anything of the tensor is told
 * (its generation: a pull with have_generation or after, a wait, a set's
 * listed name), so every pull form gets this same refusal.
 */
int rm_pull_may_read(struct rpeer *rp, const char *name, size_t len, char *why, size_t why_len)
{
	struct remote_env *env = rp->rm->env;
	struct tensor *t = registry_lookup(env->reg, &rp->rc, name, len);

	if (t && registry_may_read(t, &rp->rc))
		return 0;
	snprintf(why, why_len,
		 "node %s, acting as uid %u for peers: tensor '%.*s': its mode refuses that uid",
		 env->peers->self, REMOTE_PEER_UID, (int)len, name);
	return -EACCES;
}

void rm_on_pull(struct rpeer *rp, const Tensord__PeerPull *m)
{
	struct remote *rm = rp->rm;
	struct remote_env *env = rm->env;
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
		snprintf(why, sizeof(why), "node %s: %s", env->peers->self, reason);
		pull_reply_error(rp, m->id, -EINVAL, why);
		return;
	}
	exported = remote_exported(env->cfg, rp->p->name, m->name, len);
	if (!exported || !registry_published(env->reg, m->name, len)) {
		if (m->wait) {
			pull_reply_waiting(rp, m->id, exported ? m->name : NULL);
			return;
		}
		/* Not exported and not published are told apart to nobody. */
		snprintf(why, sizeof(why),
			 "tensor '%s' is not published on node %s, or not exported to node %s",
			 m->name, env->peers->self, rp->p->name);
		pull_reply_error(rp, m->id, -ENOENT, why);
		return;
	}
	r = rm_pull_may_read(rp, m->name, len, why, sizeof(why));
	if (r < 0) {
		pull_reply_error(rp, m->id, r, why);
		return;
	}
	if (m->after && registry_generation(env->reg, m->name, len) <= m->after) {
		if (m->wait) {
			pull_reply_waiting(rp, m->id, m->name);
			return;
		}
		snprintf(why, sizeof(why),
			 "tensor '%s' on node %s: no generation newer than %" PRIu64, m->name,
			 env->peers->self, m->after);
		pull_reply_error(rp, m->id, -ETIMEDOUT, why);
		return;
	}
	if (m->have_generation &&
	    registry_generation(env->reg, m->name, len) == m->have_generation) {
		rep.id = m->id;
		rep.current = true;
		rep.generation = m->have_generation;
		rep.watched = rm_watch_add(rp, m->name);
		f.body_case = TENSORD__PEER_FRAME__BODY_PULL_REPLY;
		f.pull_reply = &rep;
		rm_send_frame(rp, &f);
		return;
	}
	if (rp->n_serves >= REMOTE_SERVES_MAX) {
		snprintf(why, sizeof(why),
			 "node %s: node %s holds %d pull leases already, the most",
			 env->peers->self, rp->p->name, REMOTE_SERVES_MAX);
		pull_reply_error(rp, m->id, -EAGAIN, why);
		return;
	}
	r = registry_attach(env->reg, &rp->rc, m->name, len, &t, &lease, &writable, reason,
			    sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "node %s, acting as uid %u for peers: %s",
			 env->peers->self, REMOTE_PEER_UID, reason);
		pull_reply_error(rp, m->id, r == -ENOENT ? -EACCES : r, why);
		return;
	}
	r = rm_serve_check(env, t, why, sizeof(why));
	if (r < 0) {
		registry_release(env->reg, &rp->rc, lease);
		pull_reply_error(rp, m->id, r, why);
		return;
	}
	rm_serve_reply(rp, m->id, t, lease, NULL);
}

/* Whether t may be served to a peer: 0, or -errno with the reason naming it. */
int rm_serve_check(const struct remote_env *env, const struct tensor *t, char *why, size_t why_len)
{
	if (t->device.device_type == kDLCPU ? !t->alloc.ops->export_fd : !t->alloc.ops->copy) {
		snprintf(why, why_len,
			 "tensor '%s' on node %s: its %s memory cannot be read by the "
			 "daemon, so it cannot be pulled",
			 t->name, env->peers->self, t->alloc.ops->name);
		return -EOPNOTSUPP;
	}
	if (t->flags & TENSORD_MUTABLE) {
		snprintf(why, why_len,
			 "tensor '%s' on node %s is mutable: mutable tensors cannot be exported "
			 "(their bytes could change during the transfer)",
			 t->name, env->peers->self);
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
void rm_serve_reply(struct rpeer *rp, uint64_t id, struct tensor *t, uint64_t lease,
		    const char *member)
{
	struct remote *rm = rp->rm;
	struct remote_env *env = rm->env;
	struct serve *s = calloc(1, sizeof(*s));
	char why[300];

	if (s && member && !(s->member = strdup(member))) {
		free(s);
		s = NULL;
	}
	if (!s) {
		registry_release(env->reg, &rp->rc, lease);
		snprintf(why, sizeof(why), "node %s: out of memory", env->peers->self);
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
	assert(rp->n_serves <= REMOTE_SERVES_MAX);
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

	assert(s->st == SV_LEASED && !s->job);
	rep.id = s->id;
	rep.generation = t->generation;
	rep.commit = t->commit;
	/*
	 * A single pull's replica is watched; a set's members are not (B asks
	 * for them). A GPU tensor's copy took a while: if its name changed
	 * meanwhile, B is not told it is watched (it then asks at each attach).
	 */
	rep.watched = !s->member && rm_watch_add(rp, t->name);
	if (rep.watched && staged &&
	    registry_generation(rp->rm->env->reg, t->name, strlen(t->name)) != t->generation)
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
		rm_send_frame(rp, &f);
		figure_count(FIG_remote_served_total, 1);
		figure_count(FIG_remote_served_bytes_total, t->nbytes);
		rp->p->remote.served++;
		rp->p->remote.served_bytes += t->nbytes;
		rm_serve_end(s);
		return;
	}
	rm_send_frame(rp, &f);
	log_debug("peer %s: pull %" PRIu64 " of '%s' (%" PRIu64 " bytes): leased", rp->p->name,
		  s->id, t->name, t->nbytes);
}

/*
 * Copies GPU tensor s's bytes to host memory on the GPU worker; the reply
 * follows (rm_serve_staged()). On failure s is answered and ended.
 */
static void serve_stage(struct serve *s)
{
	struct rpeer *rp = s->rp;
	const char *self = rp->rm->env->peers->self;
	struct gjob *j = calloc(1, sizeof(*j));
	char why[400];
	int e = ENOMEM;

	assert(s->st == SV_STAGE_WAIT && !s->job && !s->staged && !s->map);
	if (j) {
		j->kind = GJ_STAGE;
		j->s = s;
		j->a = s->t->alloc;
		j->len = (size_t)s->len;
		j->buf = rm_stage_map(j->len);
		e = errno;
		if (j->buf && rm_gjob_submit(rp->rm, j) == 0) {
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
	rm_serve_end(s);
}

/*
 * Starts the copies of rp's GPU tensors waiting, in order, while the host
 * memory they take for rp stays within --peer-max-inflight (one at a time
 * when a tensor alone is larger).
 */
static void serve_stage_next(struct rpeer *rp)
{
	uint64_t max = rp->rm->env->cfg->max_inflight;
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
void rm_serve_staged(struct gjob *j)
{
	struct serve *s = j->s;
	char why[400];

	if (!s) { /* the serve ended meanwhile */
		munmap(j->buf, j->len);
		if (j->rm)
			j->rm->figs->staged_bytes -= j->staged;
		return;
	}
	assert(j->kind == GJ_STAGE && s->job == j && s->st == SV_STAGING);
	s->job = NULL;
	s->map = j->buf;
	s->map_len = j->len;
	s->pop_off = j->len;
	if (j->status < 0) {
		snprintf(why, sizeof(why),
			 "node %s: cannot copy GPU tensor '%s' (%s:%d, %" PRIu64
			 " bytes) to host memory: %s",
			 s->rp->rm->env->peers->self, s->t->name, s->t->alloc.ops->name,
			 s->t->device.device_id, s->len, strerror(-j->status));
		log_warn("peer %s: pull %" PRIu64 ": %s", s->rp->p->name, s->id, why);
		pull_reply_error(s->rp, s->id, j->status, why);
		rm_serve_end(s);
		return;
	}
	s->st = SV_LEASED;
	serve_answer(s);
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

void rm_on_pull_go(struct rpeer *rp, uint64_t id)
{
	struct serve *s = serve_find(rp, id);

	if (!s || s->st != SV_LEASED)
		return; /* ended meanwhile; B's timer or its receive says so */
	if (s->len == 0 || (!s->map && serve_map(s) < 0)) {
		rm_serve_end(s);
		return;
	}
	rm_populate_kick(rp->rm);
	s->st = SV_QUEUED;
	rm_serve_start_queued(rp);
}

void rm_on_pull_done(struct rpeer *rp, uint64_t id)
{
	struct serve *s = serve_find(rp, id);

	if (s && s->st != SV_SENDING)
		rm_serve_end(s);
}
