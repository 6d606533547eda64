/*
 * Request dispatch: protobuf-c unpack -> registry call -> reply. Also the
 * waiters of attach-with-timeout, which are woken by publish (no polling)
 * or by their loop timer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/desc.h"
#include "proto/frame.h"
#include "log.h"
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

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Storage that a TensorInfo points into while it is packed. */
struct info_store {
	Tensord__TensorInfo info;
	Tensord__DType dtype;
	Tensord__Device device;
};

static void fill_info(struct info_store *s, const struct tensor *t)
{
	tensord__tensor_info__init(&s->info);
	tensord__dtype__init(&s->dtype);
	tensord__device__init(&s->device);
	s->info.name = (char *)t->name;
	s->dtype.code = t->dtype.code;
	s->dtype.bits = t->dtype.bits;
	s->dtype.lanes = t->dtype.lanes;
	s->info.dtype = &s->dtype;
	s->info.n_shape = (size_t)t->ndim;
	s->info.shape = (int64_t *)t->shape;
	s->info.n_strides = (size_t)t->ndim;
	s->info.strides = (int64_t *)t->strides;
	s->device.type = (uint32_t)t->device.device_type;
	s->device.id = t->device.device_id;
	s->info.device = &s->device;
	s->info.nbytes = t->nbytes;
	s->info.byte_offset = 0;
	s->info.state = (Tensord__State)t->state;
	s->info.refcount = t->refcount;
	s->info.owner_uid = t->owner_uid;
	s->info.owner_gid = t->owner_gid;
	s->info.mode = t->mode;
	s->info.flags = t->flags;
	s->info.created_ns = t->created_ns;
	s->info.id = t->id;
}

/* Replies with a lease on t; on failure ends the lease and replies with the error. */
static void reply_lease(struct conn *c, uint64_t req_id, struct tensor *t, uint64_t lease,
			bool writable, uint64_t have_id)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__Lease l = TENSORD__LEASE__INIT;
	struct info_store s;
	uint8_t uuid[16];
	int fd = -1, r;

	fill_info(&s, t);
	l.lease = lease;
	l.info = &s.info;
	l.handle = (Tensord__HandleKind)t->alloc.handle_kind;
	l.map_size = t->alloc.size;
	l.writable = writable;
	if (t->alloc.ipc_handle_len) {
		l.ipc_handle.data = t->alloc.ipc_handle;
		l.ipc_handle.len = t->alloc.ipc_handle_len;
	}
	l.ipc_offset = t->alloc.ipc_offset;
	if (t->alloc.ops->device_uuid(t->alloc.device_id, uuid) == 0) {
		s.device.uuid.data = uuid;
		s.device.uuid.len = sizeof(uuid);
	}
	/* The client already maps this very tensor: send no descriptor. */
	if (have_id && have_id == t->id) {
		l.reused = true;
	} else {
		r = t->alloc.ops->export_fd(&t->alloc, writable, &fd);
		if (r < 0) {
			char why[300];

			snprintf(why, sizeof(why), "tensor '%s': exporting its memory failed: %s",
				 t->name, strerror(-r));
			registry_release(&c->srv->reg, &c->rc, lease);
			conn_reply_error(c, req_id, r, why);
			return;
		}
	}
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_LEASE;
	rep.lease = &l;
	conn_reply(c, &rep, fd);
}

static int check_name_field(const char *name, char *why, size_t why_len)
{
	return td_name_check(name, strlen(name), why, why_len);
}

static void do_create(struct conn *c, uint64_t id, const Tensord__Create *m)
{
	struct create_args a = { 0 };
	char why[400];
	struct tensor *t;
	uint64_t lease;
	int r;

	r = check_name_field(m->name, why, sizeof(why));
	if (r < 0)
		goto fail;
	if (!m->dtype || m->dtype->code > 255 || m->dtype->bits > 255 || m->dtype->lanes > 65535 ||
	    m->dtype->bits == 0 || m->dtype->lanes == 0) {
		snprintf(why, sizeof(why), "tensor '%s': missing or out-of-range dtype", m->name);
		r = -EINVAL;
		goto fail;
	}
	if (m->n_shape > TENSORD_NDIM_MAX) {
		snprintf(why, sizeof(why), "tensor '%s': %zu dimensions; tensors have 0 to %d",
			 m->name, m->n_shape, TENSORD_NDIM_MAX);
		r = -EINVAL;
		goto fail;
	}
	if (m->n_strides && m->n_strides != m->n_shape) {
		snprintf(why, sizeof(why), "tensor '%s': %zu strides for %zu dimensions", m->name,
			 m->n_strides, m->n_shape);
		r = -EINVAL;
		goto fail;
	}
	a.name = m->name;
	a.name_len = strlen(m->name);
	a.dtype = (DLDataType){ (uint8_t)m->dtype->code, (uint8_t)m->dtype->bits,
				(uint16_t)m->dtype->lanes };
	a.ndim = (int32_t)m->n_shape;
	a.shape = m->shape;
	a.strides = m->n_strides ? m->strides : NULL;
	a.device = m->device ? (DLDevice){ (DLDeviceType)m->device->type, m->device->id }
			     : (DLDevice){ kDLCPU, 0 };
	a.flags = m->flags;
	a.mode = m->mode;
	r = registry_create(&c->srv->reg, &c->rc, &a, &t, &lease, why, sizeof(why));
	if (r < 0)
		goto fail;
	log_debug("tensor '%s': created by pid %u, %llu bytes", t->name, c->rc.pid,
		  (unsigned long long)t->nbytes);
	reply_lease(c, id, t, lease, true, 0);
	return;
fail:
	log_debug("conn %llu: create refused: %s", (unsigned long long)c->id, why);
	conn_reply_error(c, id, r, why);
}

static void waiter_free_cb(uv_handle_t *h)
{
	free(h->data);
}

static void waiter_unlink(struct server *srv, struct waiter *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		srv->waiters = w->next;
	if (w->next)
		w->next->prev = w->prev;
	w->prev = w->next = NULL;
	if (w->conn)
		w->conn->n_waiters--;
}

static void waiter_free(struct waiter *w)
{
	if (w->has_timer) {
		uv_timer_stop(&w->timer);
		uv_close((uv_handle_t *)&w->timer, waiter_free_cb);
	} else {
		free(w);
	}
}

static void on_waiter_timeout(uv_timer_t *h)
{
	struct waiter *w = h->data;
	struct conn *c = w->conn;
	char why[400];

	waiter_unlink(c->srv, w);
	snprintf(why, sizeof(why), "tensor '%s': not published within the timeout", w->name);
	conn_reply_error(c, w->req_id, -ETIMEDOUT, why);
	waiter_free(w);
}

void waiters_drop_conn(struct server *srv, struct conn *c)
{
	struct waiter *w, *next;

	for (w = srv->waiters; w && c->n_waiters; w = next) {
		next = w->next;
		if (w->conn == c) {
			waiter_unlink(srv, w);
			w->conn = NULL;
			waiter_free(w);
		}
	}
}

void waiters_drop_all(struct server *srv)
{
	while (srv->waiters) {
		struct waiter *w = srv->waiters;

		waiter_unlink(srv, w);
		waiter_free(w);
	}
}

static void attach_now(struct conn *c, uint64_t id, const char *name, size_t len,
		       uint64_t have_id)
{
	char why[400];
	struct tensor *t;
	uint64_t lease;
	bool writable;
	int r;

	r = registry_attach(&c->srv->reg, &c->rc, name, len, &t, &lease, &writable, why,
			    sizeof(why));
	if (r < 0) {
		conn_reply_error(c, id, r, why);
		return;
	}
	reply_lease(c, id, t, lease, writable, have_id);
}

void dispatch_on_publish(void *ctx, struct tensor *t)
{
	struct server *srv = ctx;
	struct waiter *ready = NULL, *w, *next;

	/* Take the matching waiters off the list first: answering one may
	 * close its connection, which edits the list. */
	for (w = srv->waiters; w; w = next) {
		next = w->next;
		if (w->name_len == t->name_len && memcmp(w->name, t->name, t->name_len) == 0) {
			waiter_unlink(srv, w);
			w->next = ready;
			ready = w;
		}
	}
	for (w = ready; w; w = next) {
		next = w->next;
		if (w->conn && !w->conn->dead)
			attach_now(w->conn, w->req_id, w->name, w->name_len, w->have_id);
		waiter_free(w);
	}
}

static void do_attach(struct conn *c, uint64_t id, const Tensord__Attach *m)
{
	struct server *srv = c->srv;
	size_t len = strlen(m->name);
	struct waiter *w;
	char why[400];
	int r;

	r = check_name_field(m->name, why, sizeof(why));
	if (r < 0) {
		conn_reply_error(c, id, r, why);
		return;
	}
	if (m->timeout_ms == 0 || registry_published(&srv->reg, m->name, len)) {
		attach_now(c, id, m->name, len, m->have_id);
		return;
	}
	if (c->n_waiters >= CONN_WAITERS_MAX) {
		snprintf(why, sizeof(why), "tensor '%s': %u attaches already waiting on this connection",
			 m->name, c->n_waiters);
		conn_reply_error(c, id, -EAGAIN, why);
		return;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		conn_reply_error(c, id, -ENOMEM, "out of memory for a waiter");
		return;
	}
	w->conn = c;
	w->req_id = id;
	w->have_id = m->have_id;
	memcpy(w->name, m->name, len + 1);
	w->name_len = len;
	if (m->timeout_ms > 0) {
		uv_timer_init(srv->loop, &w->timer);
		w->timer.data = w;
		w->has_timer = true;
		uv_timer_start(&w->timer, on_waiter_timeout, (uint64_t)m->timeout_ms, 0);
	}
	w->next = srv->waiters;
	if (srv->waiters)
		srv->waiters->prev = w;
	srv->waiters = w;
	c->n_waiters++;
	log_debug("conn %llu: waiting for '%s' (%lld ms)", (unsigned long long)c->id, w->name,
		  (long long)m->timeout_ms);
}

static void reply_info(struct conn *c, uint64_t id, const struct tensor *t)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	struct info_store s;

	fill_info(&s, t);
	rep.id = id;
	rep.body_case = TENSORD__REPLY__BODY_INFO;
	rep.info = &s.info;
	conn_reply(c, &rep, -1);
}

static void do_list(struct conn *c, uint64_t id, const Tensord__List *m)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ListReply lr = TENSORD__LIST_REPLY__INIT;
	struct tensor **v;
	struct info_store *s = NULL;
	Tensord__TensorInfo **pi = NULL;
	size_t n;

	if (registry_list(&c->srv->reg, &c->rc, m->prefix, strlen(m->prefix), &v, &n) < 0 ||
	    !(s = malloc((n ? n : 1) * sizeof(*s))) || !(pi = malloc((n ? n : 1) * sizeof(*pi)))) {
		free(s);
		conn_reply_error(c, id, -ENOMEM, "out of memory listing tensors");
		return;
	}
	for (size_t i = 0; i < n; i++) {
		fill_info(&s[i], v[i]);
		pi[i] = &s[i].info;
	}
	lr.n_tensors = n;
	lr.tensors = pi;
	rep.id = id;
	rep.body_case = TENSORD__REPLY__BODY_LIST;
	rep.list = &lr;
	conn_reply(c, &rep, -1);
	free(pi);
	free(s);
	free(v);
}

static void do_stats(struct conn *c, uint64_t id)
{
	struct server *srv = c->srv;
	struct registry *reg = &srv->reg;
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__StatsReply sr = TENSORD__STATS_REPLY__INIT;
	Tensord__DeviceStats ds[REGISTRY_DEVICES_MAX], *pds[REGISTRY_DEVICES_MAX];
	Tensord__Device dev[REGISTRY_DEVICES_MAX];
	size_t n = 0;

	for (int i = 0; i < reg->n_devices; i++) {
		struct reg_device *d = &reg->devices[i];

		if (d->init_rc < 0)
			continue;
		tensord__device_stats__init(&ds[n]);
		tensord__device__init(&dev[n]);
		dev[n].type = (uint32_t)d->device.device_type;
		dev[n].id = d->device.device_id;
		ds[n].device = &dev[n];
		ds[n].backend = (char *)d->ops->name;
		ds[n].path = (char *)d->ops->path(d->device.device_id);
		ds[n].bytes_used = d->used;
		ds[n].bytes_capacity = d->capacity;
		ds[n].tensors = d->tensors;
		pds[n] = &ds[n];
		n++;
	}
	sr.tensors = reg->n_tensors;
	sr.clients = srv->n_conns;
	sr.leases = reg->n_leases;
	sr.uptime_ns = now_ns() - srv->start_ns;
	sr.daemon_pid = (uint32_t)getpid();
	sr.n_devices = n;
	sr.devices = pds;
	rep.id = id;
	rep.body_case = TENSORD__REPLY__BODY_STATS;
	rep.stats = &sr;
	conn_reply(c, &rep, -1);
}

static void do_hello(struct conn *c, uint64_t id, const Tensord__Hello *m)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__HelloReply hr = TENSORD__HELLO_REPLY__INIT;

	if (m->version != TENSORD_PROTOCOL_VERSION) {
		char why[160];

		snprintf(why, sizeof(why), "protocol version %u is not supported; tensord speaks %u",
			 m->version, TENSORD_PROTOCOL_VERSION);
		log_warn("conn %llu: pid %u: %s, closing", (unsigned long long)c->id, c->rc.pid,
			 why);
		conn_reply_error(c, id, -EPROTO, why);
		if (!c->dead)
			conn_shutdown(c);
		return;
	}
	c->hello_done = true;
	hr.version = TENSORD_PROTOCOL_VERSION;
	hr.daemon_pid = (uint32_t)getpid();
	hr.max_frame = TD_FRAME_MAX_REQUEST;
	rep.id = id;
	rep.body_case = TENSORD__REPLY__BODY_HELLO;
	rep.hello = &hr;
	conn_reply(c, &rep, -1);
}

static void dispatch_request(struct conn *c, const Tensord__Request *req)
{
	struct registry *reg = &c->srv->reg;
	char why[400];
	int r;

	if (!c->hello_done && req->body_case != TENSORD__REQUEST__BODY_HELLO) {
		log_warn("conn %llu: pid %u: request before hello, closing",
			 (unsigned long long)c->id, c->rc.pid);
		conn_reply_error(c, req->id, -EPROTO, "the first request must be hello");
		if (!c->dead)
			conn_shutdown(c);
		return;
	}
	switch (req->body_case) {
	case TENSORD__REQUEST__BODY_HELLO:
		do_hello(c, req->id, req->hello);
		break;
	case TENSORD__REQUEST__BODY_CREATE:
		do_create(c, req->id, req->create);
		break;
	case TENSORD__REQUEST__BODY_PUBLISH:
		r = registry_publish(reg, &c->rc, req->publish->name, strlen(req->publish->name),
				     why, sizeof(why));
		conn_reply_error(c, req->id, r, r < 0 ? why : "");
		break;
	case TENSORD__REQUEST__BODY_ATTACH:
		do_attach(c, req->id, req->attach);
		break;
	case TENSORD__REQUEST__BODY_RELEASE:
		/* One-way: deleters must never wait for the daemon. */
		if (registry_release(reg, &c->rc, req->release->lease) < 0)
			log_warn("conn %llu: pid %u released unknown lease %llx, ignoring",
				 (unsigned long long)c->id, c->rc.pid,
				 (unsigned long long)req->release->lease);
		break;
	case TENSORD__REQUEST__BODY_UNLINK:
		r = registry_unlink(reg, &c->rc, req->unlink->name, strlen(req->unlink->name), why,
				    sizeof(why));
		conn_reply_error(c, req->id, r, r < 0 ? why : "");
		break;
	case TENSORD__REQUEST__BODY_STAT: {
		const char *name = req->stat->name;
		struct tensor *t;

		r = check_name_field(name, why, sizeof(why));
		if (r < 0) {
			conn_reply_error(c, req->id, r, why);
			break;
		}
		t = registry_lookup(reg, &c->rc, name, strlen(name));
		if (!t) {
			snprintf(why, sizeof(why), "tensor '%s': no such tensor", name);
			conn_reply_error(c, req->id, -ENOENT, why);
			break;
		}
		reply_info(c, req->id, t);
		break;
	}
	case TENSORD__REQUEST__BODY_LIST:
		do_list(c, req->id, req->list);
		break;
	case TENSORD__REQUEST__BODY_STATS:
		do_stats(c, req->id);
		break;
	default:
		conn_reply_error(c, req->id, -EBADMSG, "unknown request type");
		break;
	}
}

void dispatch_frame(struct conn *c, const uint8_t *payload, size_t len)
{
	Tensord__Request *req;

	arena.used = 0;
	req = tensord__request__unpack(&arena_allocator, len, payload);
	if (!req) {
		log_debug("conn %llu: pid %u sent a malformed request (%zu bytes)",
			  (unsigned long long)c->id, c->rc.pid, len);
		/* The framing is intact, so the connection can go on. */
		conn_reply_error(c, 0, -EBADMSG, "malformed request: not a tensord.Request message");
		return;
	}
	dispatch_request(c, req);
	arena.used = 0;
}
