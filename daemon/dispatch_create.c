/*
 * Create and put requests: a Create turned into registry arguments (its
 * GPU named by UUID becomes the daemon's ordinal), the inline put, and the
 * GPU creates whose memory the GPU worker allocates (answered when it
 * completes, perhaps after later requests: clients match replies by id).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/memory/backend.h"
#include "common/desc.h"
#include "gpu/gpu_util.h"
#include "dispatch_int.h"
#include "figures.h"
#include "daemon/memory/gpu_worker.h"
#include "daemon/base/log.h"
#include "reply.h"
#include "server.h"
#include "space.h"

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
	char reason[200];
	int r = dispatch_check_name(m->name, why, why_len);

	if (r < 0)
		return r;
	if (!m->dtype) {
		snprintf(why, why_len, "tensor '%s': missing dtype", m->name);
		return -EINVAL;
	}
	if (td_desc_from_wire(m->dtype->code, m->dtype->bits, m->dtype->lanes, m->n_shape,
			      m->n_strides, false, &a->dtype, reason, sizeof(reason)) < 0) {
		snprintf(why, why_len, "tensor '%s': %s", m->name, reason);
		return -EINVAL;
	}
	a->name = m->name;
	a->name_len = strlen(m->name);
	a->ndim = (int32_t)m->n_shape;
	a->shape = m->shape;
	a->strides = m->n_strides ? m->strides : NULL;
	a->flags = m->flags;
	a->mode = m->mode;
	a->replace = m->replace;
	a->tx = m->tx;
	a->reserve = m->reserve;
	a->recycle = m->recycle;
	a->arena_size = m->arena_size;
	a->in_arena = m->in_arena;
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
	char why[640];
	uint64_t lease;
	int r;

	if (cl)
		pending_unlink(p);
	r = registry_create_finish(&p->srv->reg, &p->job, &lease, why, sizeof(why));
	if (r < 0)
		log_debug("create (request %llu): %s", (unsigned long long)p->req_id, why);
	if (cl && r < 0) {
		if (r == -ENOSPC)
			space_explain(cl, t->device, why, sizeof(why));
		reply_status(cl->conn, TENSORD__REQUEST__BODY_CREATE, p->req_id, r, why);
	} else if (cl) {
		log_debug("tensor '%s': created by pid %u, %llu bytes", t->name, cl->rc.pid,
			  (unsigned long long)t->nbytes);
		dispatch_send_lease(cl, TENSORD__REQUEST__BODY_CREATE, p->req_id, t, lease, true, 0,
				    NULL, 0, false);
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

void dispatch_do_create(struct client *cl, uint64_t id, const Tensord__Create *m)
{
	struct create_args a = { 0 };
	char why[640];
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
		if (r == -ENOSPC)
			space_explain(cl, a.device, why, sizeof(why));
		reply_status(cl->conn, TENSORD__REQUEST__BODY_CREATE, id, r, why);
		return;
	}
	log_debug("tensor '%s': created by pid %u, %llu bytes%s", t->name, cl->rc.pid,
		  (unsigned long long)t->nbytes, t->from_reserve ? ", in its reserve" : "");
	if (t->from_reserve) {
		/* The client holds the memfd already: its reserve's. */
		figure_count(FIG_host_reserve_creates_total, 1);
		reply_lease(cl->conn, id, t, lease, true, false, a.reserve, 0, 0, NULL);
		return;
	}
	if (t->ring_hit) {
		/* The client maps this ring buffer already (Lease.ring). */
		reply_lease(cl->conn, id, t, lease, true, false, 0, 0, 0, NULL);
		return;
	}
	dispatch_send_lease(cl, TENSORD__REQUEST__BODY_CREATE, id, t, lease, true, 0, NULL, 0,
			    false);
}

void dispatch_do_reserve(struct client *cl, uint64_t id, const Tensord__Reserve *m)
{
	struct conn_fd_ticket tk = { .req_id = id, .kind = TENSORD__REQUEST__BODY_RESERVE };
	struct reg_reserve *rs;
	char why[640];
	int r;

	r = registry_reserve(&cl->srv->reg, &cl->rc, m->size, &rs, why, sizeof(why));
	if (r == -ENOSPC)
		space_explain(cl, (DLDevice){ kDLCPU, 0 }, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_RESERVE, id, r, why);
		return;
	}
	/* Its descriptor is made when the reply goes (dispatch_export_fd). */
	tk.reserve = rs->id;
	tk.writable = true;
	reply_reserve(cl->conn, id, rs->id, rs->alloc.size, &tk);
}

void dispatch_do_unreserve(struct client *cl, const Tensord__Unreserve *m)
{
	/* One-way, as Release. */
	if (registry_unreserve(&cl->srv->reg, &cl->rc, m->id) < 0)
		conn_log_limited(cl->conn, TD_LOG_WARN, LOG_KIND_BAD_RELEASE,
				 "conn %llu: pid %u gave back unknown reserve %llu, ignoring",
				 (unsigned long long)cl->conn->id, cl->rc.pid,
				 (unsigned long long)m->id);
}

/*
 * Create, write the inline bytes, publish, end the creator's lease: a small
 * host put in one round trip. On any failure after the create the half-made
 * tensor is removed again.
 */
void dispatch_do_put(struct client *cl, uint64_t id, const Tensord__Put *m)
{
	struct registry *reg = &cl->srv->reg;
	struct create_args a = { 0 };
	char why[640];
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
	if (r == -ENOSPC)
		space_explain(cl, a.device, why, sizeof(why));
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
		figure_count(FIG_inline_puts_total, 1);
	/* A member of a transaction waits for its commit. */
	if (r == 0 && !a.tx)
		r = registry_publish(reg, &cl->rc, a.name, a.name_len, &t, why, sizeof(why));
	if (r < 0) {
		char ignored[8];

		if (t->tx)
			registry_tx_discard(reg, t);
		else
			registry_unlink(reg, &cl->rc, a.name, a.name_len, ignored, sizeof(ignored));
		registry_release(reg, &cl->rc, lease);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PUT, id, r, why);
		return;
	}
	if (a.tx) {
		registry_release(reg, &cl->rc, lease);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PUT, id, 0, "");
		return;
	}
	/* The tensor is named, so the lease's end cannot free it before the reply. */
	reply_published(cl->conn, id, t);
	registry_release(reg, &cl->rc, lease);
}

void dispatch_create_forget(struct client *cl)
{
	while (!LIST_EMPTY(&cl->pending)) {
		struct pending_create *p = LIST_FIRST(&cl->pending);

		LIST_REMOVE(p, link);
		p->cl = NULL;
	}
	cl->n_pending = 0;
}
