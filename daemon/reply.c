/*
 * Reply building. Messages point into the daemon's own structures (and a
 * little stack storage) while they are packed, so nothing is copied
 * twice: conn_send() packs straight into the outgoing frame.
 */
#include "reply.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "log.h"
#include "proto/frame.h"
#include "proto/tensord.pb-c.h"
#include "pool.h"

/* Storage that a TensorInfo points into while it is packed. */
struct info_store {
	Tensord__TensorInfo info;
	Tensord__DType dtype;
	Tensord__Device device;
	uint8_t uuid[16];
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
	/* GPUs travel by UUID too: each process numbers them its own way. */
	if (t->alloc.ops && t->alloc.ops->device_uuid(t->alloc.device_id, s->uuid) == 0) {
		s->device.uuid.data = s->uuid;
		s->device.uuid.len = sizeof(s->uuid);
	}
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

/* tk: the descriptor that goes with it, or NULL. */
static void reply_send(struct conn *c, const Tensord__Reply *rep, const struct conn_fd_ticket *tk)
{
	if (conn_send(c, &rep->base, tk) == -EMSGSIZE) {
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

void reply_lease(struct conn *c, uint64_t req_id, const struct tensor *t, uint64_t lease,
		 bool writable, bool reused, const struct conn_fd_ticket *tk)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__Lease l = TENSORD__LEASE__INIT;
	struct info_store s;

	fill_info(&s, t);
	l.lease = lease;
	l.info = &s.info;
	l.handle = (Tensord__HandleKind)t->alloc.handle_kind;
	l.map_size = t->alloc.size;
	l.writable = writable;
	l.reused = reused;
	if (t->alloc.ipc_handle_len) {
		l.ipc_handle.data = (uint8_t *)t->alloc.ipc_handle;
		l.ipc_handle.len = t->alloc.ipc_handle_len;
	}
	l.ipc_offset = t->alloc.ipc_offset;
	l.share_id = t->alloc.share_id;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_LEASE;
	rep.lease = &l;
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

/*
 * Descriptors this process holds. Linux 6.2 and later give the count as
 * the size of /proc/self/fd, in O(1); older kernels say 0 there, and then
 * they are counted with getdents64 into a stack buffer, which costs a pass
 * over every descriptor: stats and scrapes must not allocate, since a
 * client may ask for them in a flood. 0 if unknown.
 */
uint32_t daemon_open_fds(void)
{
	_Alignas(8) char buf[4096];
	struct stat st;
	uint32_t n = 0;
	long got;
	int dfd;

	if (stat("/proc/self/fd", &st) == 0 && st.st_size > 0)
		return (uint32_t)st.st_size;
	dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	while ((got = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < got;) {
			struct dirent64 *e = (struct dirent64 *)(buf + off);

			n += e->d_name[0] != '.';
			off += e->d_reclen;
		}
	}
	close(dfd);
	return n ? n - 1 : 0; /* less the one counting them */
}

/* Per-uid usage, as much as the viewer may see, into a malloc'ed array. */
struct uid_rows {
	const struct stats_fair *fair;
	Tensord__UidUsage *rows;
	Tensord__UidUsage **ptrs;
	size_t n;
};

static void add_uid_row(const struct uid_usage *u, void *arg)
{
	struct uid_rows *r = arg;
	Tensord__UidUsage *w = &r->rows[r->n];

	if (r->fair->viewer_uid != 0 && r->fair->viewer_uid != u->uid)
		return;
	tensord__uid_usage__init(w);
	w->uid = u->uid;
	w->clients = (uint32_t)u->n[QUOTA_CLIENTS];
	w->tensors = u->n[QUOTA_TENSORS];
	w->bytes = u->n[QUOTA_BYTES];
	w->waiters = (uint32_t)u->n[QUOTA_WAITERS];
	w->fds_in_flight = (uint32_t)u->n[QUOTA_FDS_IN_FLIGHT];
	w->fds = u->n[QUOTA_FDS];
	r->ptrs[r->n] = w;
	r->n++;
}

static void fill_fair(Tensord__StatsReply *sr, const struct stats_fair *fair, struct uid_rows *r)
{
	size_t n = fair->quota ? fair->quota->n_used : 0;

	sr->cleanup_steps = fair->cleanup_steps;
	sr->fd_waits = fair->fd_waits;
	r->fair = fair;
	r->n = 0;
	r->rows = n ? malloc(n * sizeof(*r->rows)) : NULL;
	r->ptrs = n ? malloc(n * sizeof(*r->ptrs)) : NULL;
	if (!r->rows || !r->ptrs)
		return; /* out of memory: stats without the per-uid rows */
	quota_each(fair->quota, add_uid_row, r);
	sr->n_uids = r->n;
	sr->uids = r->ptrs;
}

void reply_stats(struct conn *c, uint64_t req_id, const struct registry *reg, unsigned clients,
		 uint64_t uptime_ns, const struct stats_fair *fair)
{
	struct uid_rows rows;
	struct pool *pool = backend_host_pool();
	struct pool_stats ps = { 0 };
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__StatsReply sr = TENSORD__STATS_REPLY__INIT;
	Tensord__DeviceStats ds[REGISTRY_DEVICES_MAX], *pds[REGISTRY_DEVICES_MAX];
	Tensord__Device dev[REGISTRY_DEVICES_MAX];
	size_t n = 0;

	for (int i = 0; i < reg->n_devices; i++) {
		const struct reg_device *d = &reg->devices[i];

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
		ds[n].gpu_bytes = d->ops->gpu_bytes ? d->ops->gpu_bytes(d->device.device_id) : 0;
		pds[n] = &ds[n];
		n++;
	}
	sr.tensors = reg->n_tensors;
	sr.clients = clients;
	sr.leases = reg->n_leases;
	sr.uptime_ns = uptime_ns;
	sr.daemon_pid = (uint32_t)getpid();
	sr.n_devices = n;
	sr.devices = pds;
	if (pool)
		pool_get_stats(pool, &ps);
	sr.daemon_fds = daemon_open_fds();
	sr.host_pool_fds = ps.ready_fds;
	sr.host_pool_bytes = ps.ready_bytes;
	sr.host_pool_budget = ps.budget;
	sr.host_pool_hits = ps.hits;
	sr.host_pool_misses = ps.misses;
	backend_host_slab_stats(&sr.host_slabs, &sr.host_slab_bytes);
	fill_fair(&sr, fair, &rows);
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_STATS;
	rep.stats = &sr;
	reply_send(c, &rep, NULL);
	free(rows.ptrs);
	free(rows.rows);
}

void reply_hello(struct conn *c, uint64_t req_id)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__HelloReply hr = TENSORD__HELLO_REPLY__INIT;

	hr.version = TENSORD_PROTOCOL_VERSION;
	hr.daemon_pid = (uint32_t)getpid();
	hr.max_frame = TD_FRAME_MAX_REQUEST;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_HELLO;
	rep.hello = &hr;
	reply_send(c, &rep, NULL);
}
