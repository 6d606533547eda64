/*
 * Request dispatch: protobuf-c unpack -> checks -> registry or waiter call
 * -> reply. This is the decoding boundary: every name a peer sends (create,
 * publish, attach, unlink, stat, the list prefix) is checked here, once,
 * before the registry or the waiters see it; they assume valid names.
 */
#include "dispatch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common/desc.h"
#include "common/gpu/gpu_util.h"
#include "gpu_worker.h"
#include "inspect.h"
#include "log.h"
#include "metrics.h"
#include "proto/tensord.pb-c.h"
#include "reply.h"
#include "server.h"

/*
 * Requests are unpacked into a bump arena that is reset after each one,
 * so the hot path does not call malloc. A request frame is at most 64 KiB;
 * its unpacked form is bounded by about 8x that (packed varints widening to
 * int64). A request that needs more is malformed anyway.
 */
static struct {
	size_t used;
	_Alignas(16) uint8_t buf[1u << 20];
} arena;

static void *arena_alloc(void *data, size_t size)
{
	size_t n = (size + 15) & ~(size_t)15;
	void *p;

	if (n < size || n > sizeof(arena.buf) - arena.used)
		return NULL;
	p = arena.buf + arena.used;
	arena.used += n;
	return p;
}

static void arena_free(void *data, void *p)
{
}

static ProtobufCAllocator arena_allocator = { arena_alloc, arena_free, NULL };

/* The one check of a name from a peer. 0, or -EINVAL with the reason. */
static int check_name(const char *name, char *why, size_t why_len)
{
	return td_name_check(name, strlen(name), why, why_len);
}

/* Whether the client said it holds the descriptor of share id (a slab). */
static bool holds_share(uint64_t id, const uint64_t *have, size_t n)
{
	for (size_t i = 0; id && i < n; i++)
		if (have[i] == id)
			return true;
	return false;
}

/* Whether a lease on t comes with a descriptor to map. */
static bool travels_as_fd(const struct tensor *t)
{
	return t->alloc.handle_kind == TENSORD__HANDLE_KIND__HANDLE_MEMFD ||
	       t->alloc.handle_kind == TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD;
}

/*
 * Replies with a lease on t. The descriptor, if one goes with it, is made
 * when the reply is sent (dispatch_export_fd), not now: a client that does
 * not read its replies holds no descriptors of ours.
 */
static void send_lease(struct client *cl, unsigned kind, uint64_t req_id, struct tensor *t,
		       uint64_t lease, bool writable, uint64_t have_id, const uint64_t *have_shares,
		       size_t n_have_shares)
{
	/* The client already maps this very tensor, or holds the slab it is
	 * in: send no descriptor. */
	bool reused = have_id && have_id == t->id;
	struct conn_fd_ticket tk = {
		.req_id = req_id, .kind = kind, .lease = lease, .writable = writable
	};
	bool with_fd = !reused && travels_as_fd(t) &&
		       !holds_share(t->alloc.share_id, have_shares, n_have_shares);

	reply_lease(cl->conn, req_id, t, lease, writable, reused, with_fd ? &tk : NULL);
}

int dispatch_export_fd(struct conn *c, const struct conn_fd_ticket *tk, void *ctx)
{
	struct client *cl = conn_data(c);
	struct tensor *t = registry_lease_tensor(&cl->rc, tk->lease);
	int fd = -1, r;

	/* A client may release a lease before it read the reply that names it. */
	if (!t)
		return -ESRCH;
	r = t->alloc.ops->export_fd(&t->alloc, tk->writable, &fd);
	if (r == 0 && fd < 0)
		r = -EPROTO;
	return r < 0 ? r : fd;
}

void dispatch_export_failed(struct conn *c, const struct conn_fd_ticket *tk, int err, void *ctx)
{
	struct client *cl = conn_data(c);
	struct tensor *t = registry_lease_tensor(&cl->rc, tk->lease);
	char why[400];

	if (t) {
		snprintf(why, sizeof(why), "tensor '%s': exporting its memory failed: %s", t->name,
			 strerror(-err));
		registry_release(&cl->srv->reg, &cl->rc, tk->lease);
	} else {
		snprintf(why, sizeof(why), "lease %llx was released before its reply was sent",
			 (unsigned long long)tk->lease);
	}
	reply_status(c, tk->kind, tk->req_id, err, why);
}

static void do_hello(struct client *cl, uint64_t id, const Tensord__Hello *m)
{
	struct conn *c = cl->conn;

	if (m->version != TENSORD_PROTOCOL_VERSION) {
		char why[160];

		snprintf(why, sizeof(why),
			 "protocol version %u is not supported; tensord speaks %u", m->version,
			 TENSORD_PROTOCOL_VERSION);
		conn_log_limited(c, TD_LOG_WARN, LOG_KIND_BAD_FRAME,
				 "conn %llu: pid %u: %s, closing", (unsigned long long)c->id,
				 cl->rc.pid, why);
		reply_status(c, TENSORD__REQUEST__BODY_HELLO, id, -EPROTO, why);
		if (!c->dead)
			conn_shutdown(c);
		return;
	}
	cl->hello_done = true;
	inspect_client_hello(cl, m->client);
	reply_hello(c, id);
}

/*
 * A GPU named by UUID (as every client library sends it) becomes the
 * daemon's own ordinal: processes number GPUs differently. Without a UUID
 * the ordinal is taken as the daemon's (old clients, HIP without UUIDs).
 */
static int device_from(const Tensord__Device *d, const char *name, DLDevice *ret, char *why,
		       size_t why_len)
{
	char ustr[48];
	int ord = -ENODEV;

	*ret = d ? (DLDevice){ (DLDeviceType)d->type, d->id } : (DLDevice){ kDLCPU, 0 };
	if (!d || !d->uuid.len)
		return 0;
	if (d->uuid.len != TD_GPU_UUID_LEN) {
		snprintf(why, why_len, "tensor '%s': device uuid of %zu bytes, expected %d", name,
			 d->uuid.len, TD_GPU_UUID_LEN);
		return -EINVAL;
	}
	for (int b = 0; backends[b] && ord < 0; b++) {
		if (backends[b]->device_type != (int)d->type)
			continue;
		/* A backend without devices: the registry says why (no driver, ...). */
		if (backends[b]->device_count() <= 0)
			return 0;
		ord = backend_ordinal_of_uuid(backends[b], d->uuid.data, d->uuid.len);
	}
	if (ord < 0) {
		snprintf(why, why_len,
			 "tensor '%s': the client's device %u:%d is %s, which this "
			 "daemon does not serve",
			 name, d->type, d->id,
			 td_gpu_uuid_format(d->uuid.data, d->uuid.len, ustr, sizeof(ustr)));
		return -ENODEV;
	}
	ret->device_id = ord;
	return 0;
}

/* Turns a Create into registry arguments. 0, or -EINVAL with the reason. */
static int create_args_from(const Tensord__Create *m, struct create_args *a, char *why,
			    size_t why_len)
{
	int r = check_name(m->name, why, why_len);

	if (r < 0)
		return r;
	if (!m->dtype || m->dtype->code > 255 || m->dtype->bits > 255 || m->dtype->lanes > 65535 ||
	    m->dtype->bits == 0 || m->dtype->lanes == 0) {
		snprintf(why, why_len, "tensor '%s': missing or out-of-range dtype", m->name);
		return -EINVAL;
	}
	if (m->n_shape > TENSORD_NDIM_MAX) {
		snprintf(why, why_len, "tensor '%s': %zu dimensions; tensors have 0 to %d", m->name,
			 m->n_shape, TENSORD_NDIM_MAX);
		return -EINVAL;
	}
	if (m->n_strides && m->n_strides != m->n_shape) {
		snprintf(why, why_len, "tensor '%s': %zu strides for %zu dimensions", m->name,
			 m->n_strides, m->n_shape);
		return -EINVAL;
	}
	a->name = m->name;
	a->name_len = strlen(m->name);
	a->dtype = (DLDataType){ (uint8_t)m->dtype->code, (uint8_t)m->dtype->bits,
				 (uint16_t)m->dtype->lanes };
	a->ndim = (int32_t)m->n_shape;
	a->shape = m->shape;
	a->strides = m->n_strides ? m->strides : NULL;
	a->flags = m->flags;
	a->mode = m->mode;
	a->replace = m->replace;
	return device_from(m->device, m->name, &a->device, why, why_len);
}

/*
 * A create whose memory the GPU worker allocates (registry_create()'s
 * -EINPROGRESS). Its reply is sent when the allocation completes, perhaps
 * after replies to later requests: clients match replies by id. If the
 * connection closes first, cl becomes NULL and the completion only frees.
 */
struct pending_create {
	struct reg_alloc_job job;
	struct server *srv;
	struct client *cl; /* NULL once its connection closed */
	uint64_t req_id;
	LIST_ENTRY(pending_create) link; /* on cl->pending */
};

static void pending_unlink(struct pending_create *p)
{
	p->cl->n_pending--;
	LIST_REMOVE(p, link);
}

/* On the GPU worker. */
static void create_work(void *arg)
{
	struct pending_create *p = arg;

	registry_alloc_run(&p->job);
}

/* Back on the loop (gpu_worker_complete()): the lease, or why not. */
static void create_done(void *arg)
{
	struct pending_create *p = arg;
	struct client *cl = p->cl;
	struct tensor *t = p->job.t;
	char why[400];
	uint64_t lease;
	int r;

	if (cl)
		pending_unlink(p);
	r = registry_create_finish(&p->srv->reg, &p->job, &lease, why, sizeof(why));
	if (r < 0)
		log_debug("create (request %llu): %s", (unsigned long long)p->req_id, why);
	if (cl && r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_CREATE, p->req_id, r, why);
	} else if (cl) {
		log_debug("tensor '%s': created by pid %u, %llu bytes", t->name, cl->rc.pid,
			  (unsigned long long)t->nbytes);
		send_lease(cl, TENSORD__REQUEST__BODY_CREATE, p->req_id, t, lease, true, 0, NULL,
			   0);
	}
	free(p);
}

/* Hands t's allocation to the GPU worker; the reply follows from create_done(). */
static void create_defer(struct client *cl, uint64_t id, struct tensor *t)
{
	struct pending_create *p = calloc(1, sizeof(*p));
	struct reg_alloc_job nomem = { .t = t, .rc = -ENOMEM, .got = { .fd = -1 } };
	char why[400];
	uint64_t lease;

	if (p) {
		*p = (struct pending_create){
			.job = { .t = t }, .srv = cl->srv, .cl = cl, .req_id = id
		};
		LIST_INSERT_HEAD(&cl->pending, p, link);
		cl->n_pending++;
		if (gpu_worker_submit(create_work, create_done, p) == 0)
			return;
		pending_unlink(p);
		free(p);
	}
	registry_create_finish(&cl->srv->reg, &nomem, &lease, why, sizeof(why));
	reply_status(cl->conn, TENSORD__REQUEST__BODY_CREATE, id, -ENOMEM, why);
}

static void do_create(struct client *cl, uint64_t id, const Tensord__Create *m)
{
	struct create_args a = { 0 };
	char why[400];
	struct tensor *t;
	uint64_t lease;
	int r;

	r = create_args_from(m, &a, why, sizeof(why));
	if (r == 0 && a.device.device_type != kDLCPU &&
	    cl->n_pending >= DISPATCH_CREATES_IN_FLIGHT) {
		snprintf(why, sizeof(why),
			 "tensor '%s': this connection has %u GPU creates still being allocated, "
			 "the most at once; wait for their replies",
			 a.name, cl->n_pending);
		r = -EAGAIN;
	}
	if (r == 0)
		r = registry_create(&cl->srv->reg, &cl->rc, &a, &t, &lease, why, sizeof(why));
	if (r == -EINPROGRESS) {
		create_defer(cl, id, t);
		return;
	}
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_CREATE, id, r, why);
		return;
	}
	log_debug("tensor '%s': created by pid %u, %llu bytes", t->name, cl->rc.pid,
		  (unsigned long long)t->nbytes);
	send_lease(cl, TENSORD__REQUEST__BODY_CREATE, id, t, lease, true, 0, NULL, 0);
}

/*
 * Create, write the inline bytes, publish, end the creator's lease: a small
 * host put in one round trip. On any failure after the create the half-made
 * tensor is removed again.
 */
static void do_put(struct client *cl, uint64_t id, const Tensord__Put *m)
{
	struct registry *reg = &cl->srv->reg;
	struct create_args a = { 0 };
	char why[400];
	struct tensor *t;
	uint64_t lease;
	int r;

	if (!m->create) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PUT, id, -EINVAL,
			     "put without a tensor description");
		return;
	}
	r = create_args_from(m->create, &a, why, sizeof(why));
	a.shared = !(a.flags & TENSORD_MUTABLE);
	if (r == 0 && (a.strides || a.device.device_type != kDLCPU)) {
		snprintf(why, sizeof(why),
			 "tensor '%s': put with inline bytes makes compact host "
			 "tensors only",
			 a.name);
		r = -EINVAL;
	}
	if (r == 0)
		r = registry_create(reg, &cl->rc, &a, &t, &lease, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PUT, id, r, why);
		return;
	}
	if (m->data.len != t->nbytes) {
		snprintf(why, sizeof(why), "tensor '%s': %zu bytes sent for a tensor of %llu",
			 t->name, m->data.len, (unsigned long long)t->nbytes);
		r = -EINVAL;
	} else if (t->nbytes &&
		   (r = t->alloc.ops->write(&t->alloc, 0, m->data.data, m->data.len)) < 0) {
		snprintf(why, sizeof(why), "tensor '%s': writing its bytes failed: %s", t->name,
			 strerror(-r));
	}
	if (r == 0)
		r = registry_publish(reg, &cl->rc, a.name, a.name_len, why, sizeof(why));
	if (r < 0) {
		char ignored[8];

		registry_unlink(reg, &cl->rc, a.name, a.name_len, ignored, sizeof(ignored));
	}
	registry_release(reg, &cl->rc, lease);
	reply_status(cl->conn, TENSORD__REQUEST__BODY_PUT, id, r, r < 0 ? why : "");
}

static void do_publish(struct client *cl, uint64_t id, const Tensord__Publish *m)
{
	char why[400];
	int r;

	r = check_name(m->name, why, sizeof(why));
	if (r == 0)
		r = registry_publish(&cl->srv->reg, &cl->rc, m->name, strlen(m->name), why,
				     sizeof(why));
	reply_status(cl->conn, TENSORD__REQUEST__BODY_PUBLISH, id, r, r < 0 ? why : "");
}

/* name: already checked. */
static void attach_now(struct client *cl, uint64_t id, const char *name, size_t len,
		       uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares)
{
	char why[400];
	struct tensor *t;
	uint64_t lease;
	bool writable;
	int r;

	r = registry_attach(&cl->srv->reg, &cl->rc, name, len, &t, &lease, &writable, why,
			    sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, r, why);
		return;
	}
	log_debug("tensor '%s': attached by pid %u, lease %llx%s", t->name, cl->rc.pid,
		  (unsigned long long)lease, writable ? ", writable" : "");
	send_lease(cl, TENSORD__REQUEST__BODY_ATTACH, id, t, lease, writable, have_id, have_shares,
		   n_have_shares);
	metrics_attach_served();
}

static void do_attach(struct client *cl, uint64_t id, const Tensord__Attach *m)
{
	struct server *srv = cl->srv;
	struct waiter_req req = { .req_id = id, .have_id = m->have_id };
	char why[400], reason[200];
	int r;

	r = check_name(m->name, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, r, why);
		return;
	}
	req.name_len = strlen(m->name);
	if (m->timeout_ms == 0 || registry_published(&srv->reg, m->name, req.name_len)) {
		attach_now(cl, id, m->name, req.name_len, m->have_id, m->have_shares,
			   m->n_have_shares);
		return;
	}
	if (cl->waits.n_waiters >= srv->quota.lim.waiters_per_conn) {
		snprintf(why, sizeof(why),
			 "tensor '%s': %u attaches already waiting on this connection, the "
			 "most one may have (--max-waiters-per-conn)",
			 m->name, cl->waits.n_waiters);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, -EAGAIN, why);
		return;
	}
	r = quota_charge(&srv->quota, cl->rc.uid, QUOTA_WAITERS, 1, reason, sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "tensor '%s': %s", m->name, reason);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, r, why);
		return;
	}
	memcpy(req.name, m->name, req.name_len + 1);
	if (waiters_add(&srv->waiters, &cl->waits, &req, m->timeout_ms) < 0) {
		quota_uncharge(&srv->quota, cl->rc.uid, QUOTA_WAITERS, 1);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, -ENOMEM,
			     "out of memory for a waiter");
		return;
	}
	metrics_attach_parked();
	log_debug("conn %llu: waiting for '%s' (%lld ms)", (unsigned long long)cl->conn->id,
		  req.name, (long long)m->timeout_ms);
}

void dispatch_waiter_done(struct waiter_owner *o, const struct waiter_req *req, int status,
			  void *ctx)
{
	struct client *cl = o->data;
	char why[400];

	metrics_attach_woken();
	quota_uncharge(&cl->srv->quota, cl->rc.uid, QUOTA_WAITERS, 1);
	if (status == 0) {
		/* A waiter keeps no share list: the slab's descriptor comes again. */
		attach_now(cl, req->req_id, req->name, req->name_len, req->have_id, NULL, 0);
		return;
	}
	snprintf(why, sizeof(why), "tensor '%s': not published within the timeout", req->name);
	reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, req->req_id, status, why);
}

static void do_release(struct client *cl, const Tensord__Release *m)
{
	/* One-way: deleters must never wait for the daemon. */
	if (registry_release(&cl->srv->reg, &cl->rc, m->lease) < 0)
		conn_log_limited(cl->conn, TD_LOG_WARN, LOG_KIND_BAD_RELEASE,
				 "conn %llu: pid %u released unknown lease %llx, ignoring",
				 (unsigned long long)cl->conn->id, cl->rc.pid,
				 (unsigned long long)m->lease);
}

static void do_unlink(struct client *cl, uint64_t id, const Tensord__Unlink *m)
{
	char why[400];
	int r;

	r = check_name(m->name, why, sizeof(why));
	if (r == 0)
		r = registry_unlink(&cl->srv->reg, &cl->rc, m->name, strlen(m->name), why,
				    sizeof(why));
	reply_status(cl->conn, TENSORD__REQUEST__BODY_UNLINK, id, r, r < 0 ? why : "");
}

static void do_stat(struct client *cl, uint64_t id, const Tensord__Stat *m)
{
	char why[400];
	struct tensor *t;
	int r;

	r = check_name(m->name, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_STAT, id, r, why);
		return;
	}
	t = registry_lookup(&cl->srv->reg, &cl->rc, m->name, strlen(m->name));
	if (!t) {
		snprintf(why, sizeof(why), "tensor '%s': no such tensor", m->name);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_STAT, id, -ENOENT, why);
		return;
	}
	reply_info(cl->conn, id, t);
}

static void do_list(struct client *cl, uint64_t id, const Tensord__List *m)
{
	struct tensor *v[DISPATCH_LIST_PAGE];
	size_t len = strlen(m->prefix), n = 0;
	size_t limit = m->limit && m->limit < DISPATCH_LIST_PAGE ? m->limit : DISPATCH_LIST_PAGE;
	const char *next = NULL;
	char why[8];

	/* A prefix is checked like a name, except that it may be empty. One
	 * that no name can start with (too long, a byte names never have)
	 * matches nothing: the answer is the empty list, as tensord_list()
	 * documents, without walking the registry. */
	if (len && td_name_check(m->prefix, len, why, sizeof(why)) < 0) {
		reply_list(cl->conn, id, NULL, 0, NULL);
		return;
	}
	/* A page, never the whole registry: the reply stays far below the
	 * frame limit, and a client that asks and never reads holds a few. */
	registry_list(&cl->srv->reg, &cl->rc, m->prefix, len, m->after, limit, v, &n, &next);
	reply_list(cl->conn, id, v, n, next);
}

static void do_stats(struct client *cl, uint64_t id)
{
	struct server *srv = cl->srv;
	struct stats_fair fair = {
		.quota = &srv->quota,
		.viewer_uid = cl->rc.uid,
		.cleanup_steps = srv->reg.visits + srv->waiters.visits,
		.fd_waits = srv->conns.fd_waits,
	};

	reply_stats(cl->conn, id, &srv->reg, srv->conns.n, now_ns() - srv->start_ns, &fair);
}

static void dispatch_request(struct client *cl, const Tensord__Request *req)
{
	struct conn *c = cl->conn;

	if (!cl->hello_done && req->body_case != TENSORD__REQUEST__BODY_HELLO) {
		conn_log_limited(c, TD_LOG_WARN, LOG_KIND_BEFORE_HELLO,
				 "conn %llu: pid %u: request before hello, closing",
				 (unsigned long long)c->id, cl->rc.pid);
		reply_status(c, (unsigned)req->body_case, req->id, -EPROTO,
			     "the first request must be hello");
		if (!c->dead)
			conn_shutdown(c);
		return;
	}
	switch (req->body_case) {
	case TENSORD__REQUEST__BODY_HELLO:
		do_hello(cl, req->id, req->hello);
		break;
	case TENSORD__REQUEST__BODY_CREATE:
		do_create(cl, req->id, req->create);
		break;
	case TENSORD__REQUEST__BODY_PUBLISH:
		do_publish(cl, req->id, req->publish);
		break;
	case TENSORD__REQUEST__BODY_ATTACH:
		do_attach(cl, req->id, req->attach);
		break;
	case TENSORD__REQUEST__BODY_RELEASE:
		do_release(cl, req->release);
		break;
	case TENSORD__REQUEST__BODY_UNLINK:
		do_unlink(cl, req->id, req->unlink);
		break;
	case TENSORD__REQUEST__BODY_STAT:
		do_stat(cl, req->id, req->stat);
		break;
	case TENSORD__REQUEST__BODY_LIST:
		do_list(cl, req->id, req->list);
		break;
	case TENSORD__REQUEST__BODY_STATS:
		do_stats(cl, req->id);
		break;
	case TENSORD__REQUEST__BODY_PUT:
		do_put(cl, req->id, req->put);
		break;
	case TENSORD__REQUEST__BODY_LEASE_LIST:
		inspect_leases(cl, req->id, req->lease_list);
		break;
	case TENSORD__REQUEST__BODY_CLIENT_LIST:
		inspect_clients(cl, req->id, req->client_list);
		break;
	case TENSORD__REQUEST__BODY_METRICS:
		metrics_reply(c, req->id, cl->srv);
		break;
	default:
		reply_status(c, 0, req->id, -EBADMSG, "unknown request type");
		break;
	}
}

void dispatch_frame(struct conn *c, const uint8_t *payload, size_t len, void *ctx)
{
	struct client *cl = conn_data(c);
	Tensord__Request *req;

	arena.used = 0;
	req = tensord__request__unpack(&arena_allocator, len, payload);
	cl->requests++;
	metrics_request(req ? (unsigned)req->body_case : 0);
	if (!req) {
		conn_log_limited(c, TD_LOG_DEBUG, LOG_KIND_BAD_FRAME,
				 "conn %llu: pid %u sent a malformed request (%zu bytes)",
				 (unsigned long long)c->id, cl->rc.pid, len);
		/* The framing is intact, so the connection can go on. */
		reply_status(c, 0, 0, -EBADMSG, "malformed request: not a tensord.Request message");
		return;
	}
	dispatch_request(cl, req);
	arena.used = 0;
}

void dispatch_open(struct conn *c, void *ctx)
{
	struct client *cl = conn_data(c);

	cl->srv = ctx;
	cl->conn = c;
	cl->waits.data = cl;
	registry_client_init(&cl->rc, c->id, c->uid, c->gid, c->pid);
	inspect_client_opened(cl);
	metrics_connection();
}

void dispatch_protocol_error(struct conn *c, int status, const char *msg, void *ctx)
{
	metrics_request(0);
	reply_status(c, 0, 0, status, msg);
}

void dispatch_close(struct conn *c, void *ctx)
{
	struct client *cl = conn_data(c);
	struct server *srv = cl->srv;

	log_debug("conn %llu: pid %u closed, dropping %u leases", (unsigned long long)c->id,
		  cl->rc.pid, cl->rc.n_leases);
	quota_uncharge(&srv->quota, cl->rc.uid, QUOTA_WAITERS, cl->waits.n_waiters);
	waiters_drop_owner(&srv->waiters, &cl->waits);
	/* Allocations in flight complete without it (create_done()). */
	while (!LIST_EMPTY(&cl->pending)) {
		struct pending_create *p = LIST_FIRST(&cl->pending);

		LIST_REMOVE(p, link);
		p->cl = NULL;
	}
	cl->n_pending = 0;
	registry_client_gone(&srv->reg, &cl->rc);
}
