/*
 * Reply building. Messages point into the daemon's own structures (and a
 * little stack storage) while they are packed, so nothing is copied
 * twice: conn_send() packs straight into the outgoing frame.
 */
#include "reply.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "daemon/base/log.h"
#include "proto/frame.h"
#include "proto/tensord.pb-c.h"
#include "daemon/memory/pool.h"

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
	/* GPUs travel by UUID too: each process numbers them its own way. */
	if (t->alloc.ops && t->alloc.ops->device_uuid(t->alloc.device_id, s->uuid) == 0) {
		s->device.uuid.data = s->uuid;
		s->device.uuid.len = sizeof(s->uuid);
	}
	s->info.device = &s->device;
	s->info.nbytes = t->nbytes;
	s->info.byte_offset = 0;
	s->info.state = (Tensord__State)t->state;
	s->info.refcount = registry_refcount(t);
	s->info.owner_uid = t->owner_uid;
	s->info.owner_gid = t->owner_gid;
	s->info.mode = t->mode;
	s->info.flags = t->flags;
	s->info.created_ns = t->created_ns;
	s->info.id = t->id;
	s->info.generation = tensor_shown_generation(t);
	s->info.commit = tensor_shown_commit(t);
}

void reply_send(struct conn *c, const Tensord__Reply *rep, const struct conn_fd_ticket *tk)
{
	reply_send_fds(c, rep, tk, tk ? 1 : 0);
}

void reply_send_fds(struct conn *c, const Tensord__Reply *rep, const struct conn_fd_ticket *tks,
		    size_t n)
{
	if (conn_send_fds(c, &rep->base, tks, n) == -EMSGSIZE) {
		Tensord__Reply err = TENSORD__REPLY__INIT;

		err.id = rep->id;
		err.status = -EMSGSIZE;
		err.message = "the reply would be larger than a frame may be (256 MiB)";
		conn_send(c, &err.base, NULL);
	}
}

size_t reply_pack_refusal(uint8_t *buf, size_t cap, int status, const char *msg)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	size_t n;

	rep.status = status;
	rep.message = (char *)msg;
	n = tensord__reply__get_packed_size(&rep);
	if (n + TD_FRAME_HEADER > cap)
		return 0;
	td_frame_header(buf, (uint32_t)n, 0);
	tensord__reply__pack(&rep, buf + TD_FRAME_HEADER);
	return n + TD_FRAME_HEADER;
}

void (*reply_on_status)(unsigned kind, int status);

void reply_status(struct conn *c, unsigned kind, uint64_t req_id, int status, const char *msg)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;

	/* Every refusal the daemon answers passes here: one debug line each. */
	if (status < 0)
		log_debug("conn %llu: refused with %s: %s", (unsigned long long)c->id,
			  tensord_err_name(status), msg);
	rep.id = req_id;
	rep.status = status;
	rep.message = (char *)msg;
	if (reply_on_status)
		reply_on_status(kind, status);
	reply_send(c, &rep, NULL);
}

void reply_fill_lease(struct reply_lease_store *s, const struct tensor *t, uint64_t lease,
		      bool writable, bool reused)
{
	Tensord__Lease *l = &s->lease;

	tensord__lease__init(l);
	fill_info(&s->info, t);
	l->lease = lease;
	l->info = &s->info.info;
	l->handle = (Tensord__HandleKind)t->alloc.handle_kind;
	l->map_size = t->alloc.size;
	l->writable = writable;
	l->reused = reused;
	if (t->alloc.ipc_handle_len) {
		l->ipc_handle.data = (uint8_t *)t->alloc.ipc_handle;
		l->ipc_handle.len = t->alloc.ipc_handle_len;
	}
	l->ipc_offset = t->alloc.ipc_offset;
	l->share_id = t->alloc.share_id;
	/* Its writer's lease names the ring buffer it writes (docs/recycle.md). */
	if (writable && t->ring_rc)
		l->ring = t->ring_id;
	/* Its writer's lease of a member names the set allocation, whole (a
	 * ring buffer: host memory, or a GPU ring buffer, whose member's
	 * map_size is the whole already). */
	if (writable && t->arena && t->arena->rc &&
	    (!t->arena->gpu || (t->arena->alloc.share_id & REG_GPU_RING_SHARE))) {
		l->ring = t->arena->id;
		l->arena_size = t->arena->gpu ? 0 : t->arena->alloc.size;
	}
}

void reply_lease(struct conn *c, uint64_t req_id, const struct tensor *t, uint64_t lease,
		 bool writable, bool reused, uint64_t reserve, uint32_t bind_slot,
		 uint64_t bind_gen, const struct conn_fd_ticket *tk)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	struct reply_lease_store s;

	reply_fill_lease(&s, t, lease, writable, reused);
	s.lease.reserve = reserve;
	s.lease.bind_slot = bind_slot;
	s.lease.bind_gen = bind_gen;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_LEASE;
	rep.lease = &s.lease;
	reply_send(c, &rep, tk);
}

void reply_bind_page(struct conn *c, uint64_t req_id, uint32_t words,
		     const struct conn_fd_ticket *tk)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__BindPageReply br = TENSORD__BIND_PAGE_REPLY__INIT;

	br.slots = words;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_BIND_PAGE;
	rep.bind_page = &br;
	reply_send(c, &rep, tk);
}

void reply_reserve(struct conn *c, uint64_t req_id, uint64_t id, uint64_t size,
		   const struct conn_fd_ticket *tk)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ReserveReply rr = TENSORD__RESERVE_REPLY__INIT;

	rr.id = id;
	rr.size = size;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_RESERVE;
	rep.reserve = &rr;
	reply_send(c, &rep, tk);
}

void reply_info(struct conn *c, uint64_t req_id, const struct tensor *t)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	struct info_store s;

	fill_info(&s, t);
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_INFO;
	rep.info = &s.info;
	reply_send(c, &rep, NULL);
}

void reply_published(struct conn *c, uint64_t req_id, const struct tensor *t)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__Published pr = TENSORD__PUBLISHED__INIT;

	pr.generation = t->generation;
	pr.commit = t->commit;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_PUBLISHED;
	rep.published = &pr;
	reply_send(c, &rep, NULL);
}

void reply_commit(struct conn *c, uint64_t req_id, uint64_t commit, uint32_t published,
		  uint32_t unlinked)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__CommitReply cr = TENSORD__COMMIT_REPLY__INIT;

	cr.commit = commit;
	cr.published = published;
	cr.unlinked = unlinked;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_COMMIT;
	rep.commit = &cr;
	reply_send(c, &rep, NULL);
}

void reply_list(struct conn *c, uint64_t req_id, struct tensor *const *v, size_t n,
		const char *next)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ListReply lr = TENSORD__LIST_REPLY__INIT;
	struct info_store *s = malloc((n ? n : 1) * sizeof(*s));
	Tensord__TensorInfo **pi = malloc((n ? n : 1) * sizeof(*pi));

	if (!s || !pi) {
		free(pi);
		free(s);
		reply_status(c, TENSORD__REQUEST__BODY_LIST, req_id, -ENOMEM,
			     "out of memory listing tensors");
		return;
	}
	for (size_t i = 0; i < n; i++) {
		fill_info(&s[i], v[i]);
		pi[i] = &s[i].info;
	}
	lr.n_tensors = n;
	lr.tensors = pi;
	lr.more = next != NULL;
	lr.next = (char *)(next ? next : "");
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_LIST;
	rep.list = &lr;
	reply_send(c, &rep, NULL);
	free(pi);
	free(s);
}

/* HelloReply.instance: random, nonzero, chosen on the first Hello (the loop's thread). */
static uint64_t daemon_instance(void)
{
	static uint64_t instance;

	while (instance == 0) {
		if (getrandom(&instance, sizeof(instance), 0) != (ssize_t)sizeof(instance)) {
			struct timespec ts;

			/* No entropy: the start time and pid are unique enough on one host. */
			clock_gettime(CLOCK_REALTIME, &ts);
			instance = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
			instance ^= (uint64_t)getpid() << 40;
		}
	}
	return instance;
}

uint64_t reply_instance(void)
{
	return daemon_instance();
}

/* HelloReply.lineage: the instance's, unless a restart restored another (reply_set_lineage()). */
static uint64_t daemon_lineage;

void reply_set_lineage(uint64_t lineage)
{
	daemon_lineage = lineage;
}

void reply_hello(struct conn *c, uint64_t req_id)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__HelloReply hr = TENSORD__HELLO_REPLY__INIT;

	hr.version = TENSORD_PROTOCOL_VERSION;
	hr.daemon_pid = (uint32_t)getpid();
	hr.max_frame = TD_FRAME_MAX_REQUEST;
	hr.instance = daemon_instance();
	hr.lineage = daemon_lineage ? daemon_lineage : hr.instance;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_HELLO;
	rep.hello = &hr;
	reply_send(c, &rep, NULL);
}
