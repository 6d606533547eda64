/*
 * libtensord: leases and DLPack. Every create or attach yields one struct
 * td_lease; each DLManagedTensor(Versioned) handed out for it holds one
 * reference, and the last deleter ends the lease (a one-way Release to the
 * daemon), drops the mapping and the client reference. Deleters never take
 * the GIL or wait for the daemon, so they are safe on any thread, during
 * interpreter shutdown, and after tensord_close().
 *
 * Mappings are cached per client by tensor id while any lease uses them, so
 * attaching a tensor this process already maps costs one round trip and no
 * mmap (the daemon then sends no descriptor).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"

#define LEASE_MAGIC 0x7e45d1ea

struct td_lease {
	uint32_t magic;
	atomic_uint refs;        /* handles alive */
	tensord_client *c;       /* holds a client reference */
	uint64_t lease_id;
	struct td_mapping *map;  /* holds a mapping reference; NULL for zero-size */
	bool readonly;
	tensord_info info;       /* shape and strides the handles point into */
};

struct td_handle {
	DLManagedTensorVersioned mt;
	struct td_lease *l;
};

struct td_handle_legacy {
	DLManagedTensor mt;
	struct td_lease *l;
};

/* Zero-size tensors point here: a valid, aligned, never-dereferenced address. */
static _Alignas(256) const uint8_t empty_data[256];

static void mapping_unref(tensord_client *c, struct td_mapping *m)
{
	const struct td_importer *imp;

	pthread_mutex_lock(&c->lock);
	if (--m->refs) {
		pthread_mutex_unlock(&c->lock);
		return;
	}
	for (struct td_mapping **pm = &c->maps; *pm; pm = &(*pm)->next) {
		if (*pm == m) {
			*pm = m->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	imp = td_importer_for(m->handle_kind);
	if (imp)
		imp->unmap(m);
	free(m);
}

static void lease_unref(struct td_lease *l)
{
	if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) != 1)
		return;
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Release rel = TENSORD__RELEASE__INIT;

	/* Unmap before the daemon may free: with legacy GPU IPC handles the
	 * exporter freeing memory an importer still has open is undefined. */
	if (l->map)
		mapping_unref(l->c, l->map);
	rel.lease = l->lease_id;
	req.body_case = TENSORD__REQUEST__BODY_RELEASE;
	req.release = &rel;
	/* A failure means the connection is gone, and with it the lease. */
	td_send_oneway(l->c, &req);
	td_client_unref(l->c);
	l->magic = 0;
	free(l);
}

static void handle_deleter(DLManagedTensorVersioned *self)
{
	struct td_handle *h = (struct td_handle *)self;
	struct td_lease *l = h->l;

	free(h);
	lease_unref(l);
}

static void legacy_deleter(DLManagedTensor *self)
{
	struct td_handle_legacy *h = (struct td_handle_legacy *)self;
	struct td_lease *l = h->l;

	free(h);
	lease_unref(l);
}

static void fill_dltensor(DLTensor *t, struct td_lease *l)
{
	t->data = l->map ? l->map->data : (void *)empty_data;
	t->device = l->map ? l->map->device : l->info.device;
	t->ndim = l->info.ndim;
	t->dtype = l->info.dtype;
	t->shape = l->info.ndim ? l->info.shape : NULL;
	t->strides = l->info.ndim ? l->info.strides : NULL;
	t->byte_offset = 0;
}

/* A new handle on l; takes a reference on l. */
static DLManagedTensorVersioned *handle_new(struct td_lease *l)
{
	struct td_handle *h = malloc(sizeof(*h));

	if (!h)
		return NULL;
	h->mt.version.major = DLPACK_MAJOR_VERSION;
	h->mt.version.minor = DLPACK_MINOR_VERSION;
	h->mt.manager_ctx = l;
	h->mt.deleter = handle_deleter;
	h->mt.flags = l->readonly || (l->map && !l->map->writable) ? DLPACK_FLAG_BITMASK_READ_ONLY
								  : 0;
	fill_dltensor(&h->mt.dl_tensor, l);
	h->l = l;
	atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
	return &h->mt;
}

static struct td_lease *lease_of(const DLManagedTensorVersioned *t)
{
	struct td_lease *l;

	if (!t || t->deleter != handle_deleter)
		return NULL;
	l = t->manager_ctx;
	return l && l->magic == LEASE_MAGIC ? l : NULL;
}

int tensord_share(DLManagedTensorVersioned *t, DLManagedTensorVersioned **ret_tensor)
{
	struct td_lease *l = lease_of(t);
	DLManagedTensorVersioned *s;

	if (!l)
		return td_set_error(-EINVAL, "not a tensor made by libtensord");
	s = handle_new(l);
	if (!s)
		return td_set_error(-ENOMEM, "out of memory");
	s->flags |= t->flags;
	*ret_tensor = s;
	return 0;
}

struct td_mapping *td_tensor_mapping(const DLManagedTensorVersioned *t)
{
	struct td_lease *l = lease_of(t);

	return l ? l->map : NULL;
}

int tensord_tensor_info(const DLManagedTensorVersioned *t, tensord_info *ret_info)
{
	struct td_lease *l = lease_of(t);

	if (!l)
		return td_set_error(-EINVAL, "not a tensor made by libtensord");
	*ret_info = l->info;
	return 0;
}

/* A cached mapping that a repeat attach of name may reuse, pinned. Lock held. */
static struct td_mapping *find_reusable(tensord_client *c, const char *name)
{
	for (struct td_mapping *m = c->maps; m; m = m->next) {
		if (m->reusable && strcmp(m->name, name) == 0) {
			m->refs++;
			return m;
		}
	}
	return NULL;
}

/*
 * Turns a Lease reply into a td_lease with one handle. Takes ownership of
 * fd and of the pinned mapping reference in pinned (either may be absent).
 */
static int lease_from_reply(tensord_client *c, const Tensord__Lease *w, int fd,
			    struct td_mapping *pinned, bool created, struct td_lease **ret)
{
	struct td_lease *l = calloc(1, sizeof(*l));
	struct td_mapping *m = NULL;
	int r;

	if (!l || !w->info) {
		r = td_set_error(l ? -EPROTO : -ENOMEM, l ? "tensord sent a lease without a tensor"
							   : "out of memory");
		goto fail;
	}
	td_info_from_wire(&l->info, w->info);
	if (w->reused) {
		if (!pinned || pinned->id != w->info->id) {
			r = td_set_error(-EPROTO, "tensor '%s': tensord reused a mapping we do not hold",
					 l->info.name);
			goto fail;
		}
		m = pinned;
		pinned = NULL;
	} else if (w->handle != TENSORD__HANDLE_KIND__HANDLE_NONE) {
		const struct td_importer *imp = td_importer_for(w->handle);
		struct td_import_desc d = {
			.handle_kind = w->handle,
			.map_size = w->map_size,
			.writable = w->writable,
			.device = l->info.device,
			.uuid = w->info->device ? w->info->device->uuid.data : NULL,
			.uuid_len = w->info->device ? w->info->device->uuid.len : 0,
			.ipc_handle = w->ipc_handle.data,
			.ipc_handle_len = w->ipc_handle.len,
			.ipc_offset = w->ipc_offset,
		};

		if (!imp) {
			r = td_set_error(-ENOTSUP, "tensor '%s': this libtensord cannot map handle kind %d",
					 l->info.name, (int)w->handle);
			goto fail;
		}
		m = calloc(1, sizeof(*m));
		if (!m) {
			r = td_set_error(-ENOMEM, "out of memory");
			goto fail;
		}
		m->id = l->info.id;
		m->handle_kind = w->handle;
		r = imp->map(m, fd, &d);
		fd = -1;
		if (r < 0) {
			free(m);
			m = NULL;
			goto fail;
		}
		m->writable = w->writable;
		m->refs = 1;
		m->created_here = created;
		m->flags = l->info.flags;
		m->reusable = true;
		snprintf(m->name, sizeof(m->name), "%s", l->info.name);
		pthread_mutex_lock(&c->lock);
		m->next = c->maps;
		c->maps = m;
		pthread_mutex_unlock(&c->lock);
	}
	if (fd >= 0)
		close(fd);
	if (pinned)
		mapping_unref(c, pinned);
	l->magic = LEASE_MAGIC;
	atomic_init(&l->refs, 0);
	l->c = c;
	td_client_ref(c);
	l->lease_id = w->lease;
	l->map = m;
	l->readonly = !w->writable;
	*ret = l;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	if (pinned)
		mapping_unref(c, pinned);
	if (w->lease) {
		/* End the lease the daemon granted, or it would live until close. */
		Tensord__Request req = TENSORD__REQUEST__INIT;
		Tensord__Release rel = TENSORD__RELEASE__INIT;

		rel.lease = w->lease;
		req.body_case = TENSORD__REQUEST__BODY_RELEASE;
		req.release = &rel;
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		td_send_oneway(c, &req);
		td_set_error(r, "%s", saved);
	}
	free(l);
	return r;
}

/* Wraps one lease into a first handle, or ends it. */
static int lease_handle(struct td_lease *l, DLManagedTensorVersioned **ret)
{
	DLManagedTensorVersioned *h;

	atomic_store(&l->refs, 1);
	h = handle_new(l);
	if (!h) {
		lease_unref(l);
		return td_set_error(-ENOMEM, "out of memory");
	}
	atomic_fetch_sub(&l->refs, 1);
	*ret = h;
	return 0;
}

static int check_name(const char *name)
{
	char why[300];

	if (!name)
		return td_set_error(-EINVAL, "name is NULL");
	if (td_name_check(name, strlen(name), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "%s", why);
	return 0;
}

int tensord_create(tensord_client *c, const char *name, const tensord_spec *spec,
		   DLManagedTensorVersioned **ret_tensor)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Create cr = TENSORD__CREATE__INIT;
	Tensord__DType dt = TENSORD__DTYPE__INIT;
	Tensord__Device dev = TENSORD__DEVICE__INIT;
	Tensord__Reply *rep;
	struct td_lease *l;
	int fd, r;

	r = check_name(name);
	if (r < 0)
		return r;
	if (!spec || spec->ndim < 0 || spec->ndim > TENSORD_NDIM_MAX || (spec->ndim && !spec->shape))
		return td_set_error(-EINVAL, "tensor '%s': bad spec (ndim %d)", name,
				    spec ? spec->ndim : -1);
	dt.code = spec->dtype.code;
	dt.bits = spec->dtype.bits;
	dt.lanes = spec->dtype.lanes;
	dev.type = (uint32_t)spec->device.device_type;
	dev.id = spec->device.device_id;
	cr.name = (char *)name;
	cr.dtype = &dt;
	cr.n_shape = (size_t)spec->ndim;
	cr.shape = (int64_t *)spec->shape;
	cr.n_strides = spec->strides ? (size_t)spec->ndim : 0;
	cr.strides = (int64_t *)spec->strides;
	cr.device = &dev;
	cr.flags = spec->flags;
	cr.mode = spec->mode;
	req.body_case = TENSORD__REQUEST__BODY_CREATE;
	req.create = &cr;
	r = td_rpc(c, &req, &rep, &fd);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_LEASE) {
		tensord__reply__free_unpacked(rep, NULL);
		if (fd >= 0)
			close(fd);
		return td_set_error(-EPROTO, "tensor '%s': tensord answered create without a lease",
				    name);
	}
	r = lease_from_reply(c, rep->lease, fd, NULL, true, &l);
	tensord__reply__free_unpacked(rep, NULL);
	if (r < 0)
		return r;
	return lease_handle(l, ret_tensor);
}

static int attach_lease(tensord_client *c, const char *name, int timeout_ms, struct td_lease **ret)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Attach at = TENSORD__ATTACH__INIT;
	struct td_mapping *pinned;
	Tensord__Reply *rep;
	int fd, r;

	r = check_name(name);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	pinned = find_reusable(c, name);
	pthread_mutex_unlock(&c->lock);
	at.name = (char *)name;
	at.timeout_ms = timeout_ms;
	at.have_id = pinned ? pinned->id : 0;
	req.body_case = TENSORD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	r = td_rpc(c, &req, &rep, &fd);
	if (r < 0) {
		if (pinned)
			mapping_unref(c, pinned);
		return r;
	}
	if (rep->body_case != TENSORD__REPLY__BODY_LEASE) {
		tensord__reply__free_unpacked(rep, NULL);
		if (fd >= 0)
			close(fd);
		if (pinned)
			mapping_unref(c, pinned);
		return td_set_error(-EPROTO, "tensor '%s': tensord answered attach without a lease",
				    name);
	}
	r = lease_from_reply(c, rep->lease, fd, pinned, false, ret);
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

int tensord_attach(tensord_client *c, const char *name, int timeout_ms,
		   DLManagedTensorVersioned **ret_tensor)
{
	struct td_lease *l;
	int r = attach_lease(c, name, timeout_ms, &l);

	if (r < 0)
		return r;
	return lease_handle(l, ret_tensor);
}

int tensord_attach_legacy(tensord_client *c, const char *name, int timeout_ms,
			  DLManagedTensor **ret_tensor)
{
	struct td_handle_legacy *h;
	struct td_lease *l;
	int r = attach_lease(c, name, timeout_ms, &l);

	if (r < 0)
		return r;
	h = malloc(sizeof(*h));
	if (!h) {
		atomic_store(&l->refs, 1);
		lease_unref(l);
		return td_set_error(-ENOMEM, "out of memory");
	}
	atomic_store(&l->refs, 1);
	fill_dltensor(&h->mt.dl_tensor, l);
	h->mt.manager_ctx = l;
	h->mt.deleter = legacy_deleter;
	h->l = l;
	*ret_tensor = &h->mt;
	return 0;
}

static int simple_rpc(tensord_client *c, Tensord__Request *req)
{
	Tensord__Reply *rep;
	int r = td_rpc(c, req, &rep, NULL);

	if (r == 0)
		tensord__reply__free_unpacked(rep, NULL);
	return r;
}

int tensord_publish(tensord_client *c, const char *name)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Publish pub = TENSORD__PUBLISH__INIT;
	struct td_mapping *mine = NULL;
	const struct td_importer *imp = NULL;
	int r;

	r = check_name(name);
	if (r < 0)
		return r;
	/*
	 * An immutable tensor's bytes must never change once published, not
	 * even through views its creator made before: our own shared writable
	 * mapping becomes a private one at the same address (so those views
	 * stay valid and later writes stay private), and then the daemon seals
	 * the memory, which the kernel refuses if any shared writer remains.
	 */
	pthread_mutex_lock(&c->lock);
	for (struct td_mapping *m = c->maps; m; m = m->next) {
		if (m->created_here && m->writable && strcmp(m->name, name) == 0) {
			mine = m;
			mine->refs++;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (mine) {
		imp = td_importer_for(mine->handle_kind);
		/* GPU writes still queued on a stream must land first. */
		if (imp && imp->sync) {
			r = imp->sync(mine);
			if (r < 0) {
				mapping_unref(c, mine);
				return r;
			}
		}
		if (!(mine->flags & TENSORD_MUTABLE) && imp && imp->make_private) {
			r = imp->make_private(mine);
			if (r < 0) {
				mapping_unref(c, mine);
				return r;
			}
		} else {
			imp = NULL;
		}
	}
	pub.name = (char *)name;
	req.body_case = TENSORD__REQUEST__BODY_PUBLISH;
	req.publish = &pub;
	r = simple_rpc(c, &req);
	if (mine) {
		if (r < 0 && imp && imp->make_shared) {
			imp->make_shared(mine);
		} else if (r == 0 && !(mine->flags & TENSORD_MUTABLE)) {
			/* New handles on the creator's lease say read-only now. */
			pthread_mutex_lock(&c->lock);
			if (imp)
				mine->reusable = false; /* holds the creator's private view */
			mine->writable = false;
			pthread_mutex_unlock(&c->lock);
		}
		mapping_unref(c, mine);
	}
	return r;
}

int tensord_unlink(tensord_client *c, const char *name)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Unlink ul = TENSORD__UNLINK__INIT;
	int r = check_name(name);

	if (r < 0)
		return r;
	ul.name = (char *)name;
	req.body_case = TENSORD__REQUEST__BODY_UNLINK;
	req.unlink = &ul;
	return simple_rpc(c, &req);
}

int tensord_stat(tensord_client *c, const char *name, tensord_info *ret_info)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Stat st = TENSORD__STAT__INIT;
	Tensord__Reply *rep;
	int r = check_name(name);

	if (r < 0)
		return r;
	st.name = (char *)name;
	req.body_case = TENSORD__REQUEST__BODY_STAT;
	req.stat = &st;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_INFO)
		r = td_set_error(-EPROTO, "tensor '%s': tensord answered stat without a tensor", name);
	else
		td_info_from_wire(ret_info, rep->info);
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

int tensord_list(tensord_client *c, const char *prefix, tensord_info **ret_infos,
		 size_t *ret_count)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__List ls = TENSORD__LIST__INIT;
	Tensord__Reply *rep;
	tensord_info *v;
	size_t n;
	int r;

	ls.prefix = (char *)(prefix ? prefix : "");
	req.body_case = TENSORD__REQUEST__BODY_LIST;
	req.list = &ls;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_LIST) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTO, "tensord answered list without a list");
	}
	n = rep->list->n_tensors;
	v = malloc((n ? n : 1) * sizeof(*v));
	if (!v) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-ENOMEM, "out of memory for %zu tensors", n);
	}
	for (size_t i = 0; i < n; i++)
		td_info_from_wire(&v[i], rep->list->tensors[i]);
	tensord__reply__free_unpacked(rep, NULL);
	*ret_infos = v;
	*ret_count = n;
	return 0;
}

int tensord_stats(tensord_client *c, tensord_daemon_stats *ret_stats, size_t size)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Stats st = TENSORD__STATS__INIT;
	Tensord__Reply *rep;
	Tensord__StatsReply *s;
	tensord_daemon_stats all, *ret = &all;
	int r;

	if (!ret_stats || size < TENSORD_STATS_SIZE_V1)
		return td_set_error(-EINVAL, "stats: a buffer of %zu bytes is smaller than "
				    "tensord_daemon_stats ever was (%zu)", size,
				    (size_t)TENSORD_STATS_SIZE_V1);

	req.body_case = TENSORD__REQUEST__BODY_STATS;
	req.stats = &st;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_STATS) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTO, "tensord answered stats without stats");
	}
	s = rep->stats;
	memset(ret, 0, sizeof(*ret));
	ret->size = (uint32_t)(size < sizeof(*ret) ? size : sizeof(*ret));
	ret->tensors = s->tensors;
	ret->clients = s->clients;
	ret->leases = s->leases;
	ret->uptime_ns = s->uptime_ns;
	ret->daemon_pid = s->daemon_pid;
	for (size_t i = 0; i < s->n_devices && i < TENSORD_STATS_DEVICES_MAX; i++) {
		tensord_device_stats *d = &ret->devices[ret->n_devices++];
		const Tensord__DeviceStats *w = s->devices[i];

		if (w->device)
			d->device = (DLDevice){ (DLDeviceType)w->device->type, w->device->id };
		snprintf(d->backend, sizeof(d->backend), "%s", w->backend);
		snprintf(d->path, sizeof(d->path), "%s", w->path);
		d->bytes_used = w->bytes_used;
		d->bytes_capacity = w->bytes_capacity;
		d->tensors = w->tensors;
	}
	tensord__reply__free_unpacked(rep, NULL);
	memcpy(ret_stats, ret, ret->size);
	return 0;
}
