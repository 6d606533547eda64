/*
 * libtensord: leases and DLPack. Every create or attach yields one struct
 * td_lease; each DLManagedTensor(Versioned) handed out for it holds one
 * reference, and the last deleter ends the lease (a one-way Release to the
 * daemon), drops the mapping and the client reference. Deleters never take
 * the GIL or wait for the daemon, so they are safe on any thread, during
 * interpreter shutdown, and after tensord_close().
 *
 * Mappings are cached per client (mapcache.c) while any lease uses them, so
 * attaching a tensor this process already maps costs one round trip and no
 * mmap (the daemon then sends no descriptor).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"
#include "lease_int.h"

static atomic_uint_fast64_t lease_serial;

struct td_handle {
	DLManagedTensorVersioned mt;
	struct td_lease *l; /* holds one reference */
};

struct td_handle_legacy {
	DLManagedTensor mt;
	struct td_lease *l; /* holds one reference */
};

/*
 * Zero-size host tensors point here: a valid, aligned, never-dereferenced
 * address. Zero-size GPU tensors point nowhere (NULL): a host address
 * labelled with a GPU would be a lie a consumer might act on.
 */
static _Alignas(256) const uint8_t empty_data[256];

/* Tells the daemon a lease is over (release.c decides when); no reply. A
 * failure means the connection is gone, and with it the lease. */
static void send_release(tensord_client *c, uint64_t lease_id)
{
	td_release(c, lease_id);
}

void td_lease_end(tensord_client *c, uint64_t lease_id)
{
	send_release(c, lease_id);
}

void td_lease_release_ipc(tensord_client *c)
{
	uint64_t ids[TD_RELQ_MAX];
	struct td_lease *l;
	int n;

	/* In batches, so that no send happens under the client's lock. */
	do {
		n = 0;
		pthread_mutex_lock(&c->lock);
		while (n < TD_RELQ_MAX && (l = LIST_FIRST(&c->ipc_leases))) {
			LIST_REMOVE(l, ipc_link);
			l->released_by_close = true;
			ids[n++] = l->lease_id;
		}
		pthread_mutex_unlock(&c->lock);
		for (int i = 0; i < n; i++)
			td_release(c, ids[i]);
	} while (n == TD_RELQ_MAX);
}

/*
 * Ends a lease the daemon granted (0: none) for a reply we could not use,
 * or it would live until close; keeps the calling thread's error message.
 * Returns err.
 */
static int end_granted(tensord_client *c, uint64_t lease_id, int err)
{
	char saved[512];

	if (!lease_id)
		return err;
	snprintf(saved, sizeof(saved), "%s", tensord_last_error());
	send_release(c, lease_id);
	td_set_error(err, "%s", saved);
	return err;
}

/* l, made on c, goes on c's list of live leases. */
static void lease_list(tensord_client *c, struct td_lease *l)
{
	l->serial = atomic_fetch_add_explicit(&lease_serial, 1, memory_order_relaxed) + 1;
	atomic_init(&l->at, c);
	pthread_mutex_lock(&c->lock);
	LIST_INSERT_HEAD(&c->leases, l, live_link);
	pthread_mutex_unlock(&c->lock);
	if (atomic_fetch_add(&c->n_live, 1) == 0)
		td_relq_live(c);
}

tensord_client *td_lease_lock_at(struct td_lease *l)
{
	for (;;) {
		tensord_client *at = atomic_load(&l->at);

		pthread_mutex_lock(&at->lock);
		if (atomic_load(&l->at) == at)
			return at;
		pthread_mutex_unlock(&at->lock);
	}
}

/*
 * l leaves its list: *ret_id is the daemon's lease to end (0: none), on
 * the client returned, which holds a reference of l's when it is not l->c.
 */
static tensord_client *lease_unlist(struct td_lease *l, uint64_t *ret_id)
{
	tensord_client *at = td_lease_lock_at(l);

	LIST_REMOVE(l, live_link);
	atomic_fetch_sub(&at->n_live, 1);
	*ret_id = l->lease_id;
	pthread_mutex_unlock(&at->lock);
	return at;
}

/* Ends lease id on c: at once, or after a device sync when its memory is recycled. */
static void lease_send_release(tensord_client *c, uint64_t id, bool after_sync, DLDevice dev)
{
	if (after_sync)
		td_release_after_sync(c, id, dev);
	else
		send_release(c, id);
}

/* Takes ownership of one reference on l; the last one ends the lease. */
static void lease_unref(struct td_lease *l)
{
	bool released = false, after_sync, revoked;
	DLDevice dev = { kDLCPU, 0 };
	tensord_client *at;
	uint64_t id;

	if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (l->ipc_listed) {
		pthread_mutex_lock(&l->c->lock);
		released = l->released_by_close;
		if (!released)
			LIST_REMOVE(l, ipc_link);
		pthread_mutex_unlock(&l->c->lock);
	}
	/* Unmap before the daemon may free: with legacy GPU IPC handles the
	 * exporter freeing memory an importer still has open is undefined. */
	after_sync = td_release_needs_sync(l->map, &dev);
	revoked = l->map && l->map->revoked;
	if (l->view)
		td_importer_for(l->map->handle_kind)->unview(l->map, l->view);
	if (l->map)
		td_mapcache_unref(&l->c->maps, l->map);
	after_sync = after_sync && td_release_last_of_import(revoked);
	if (l->binding)
		td_binding_local_end(l->binding);
	/* A local lease has no daemon lease of its own, unless re-adopted. */
	at = lease_unlist(l, &id);
	if (id && !released)
		lease_send_release(at, id, after_sync, dev);
	if (at != l->c)
		td_client_unref(at);
	td_client_unref(l->c);
	l->magic = 0;
	free(l);
}

/* The handles' deleters: free the handle and drop its reference on the lease. */
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

/* Points t into l's mapping and info: borrowed, valid while l lives. */
static void fill_dltensor(DLTensor *t, struct td_lease *l)
{
	if (l->view)
		t->data = (uint8_t *)l->view + ((uint8_t *)l->map->data - (uint8_t *)l->map->base);
	else
		t->data = l->map ? l->map->data
			  : td_device_host_accessible(l->info.device.device_type)
				  ? (void *)empty_data
				  : NULL;
	t->device = l->info.device;
	t->ndim = l->info.ndim;
	t->dtype = l->info.dtype;
	t->shape = l->info.ndim ? l->info.shape : NULL;
	t->strides = l->info.ndim ? l->info.strides : NULL;
	t->byte_offset = 0;
}

/* A new handle on l, which takes a reference on l; its deleter drops it. NULL: no memory. */
static DLManagedTensorVersioned *handle_new(struct td_lease *l)
{
	struct td_handle *h = malloc(sizeof(*h));

	if (!h)
		return NULL;
	h->mt.version.major = DLPACK_MAJOR_VERSION;
	h->mt.version.minor = DLPACK_MINOR_VERSION;
	h->mt.manager_ctx = l;
	h->mt.deleter = handle_deleter;
	h->mt.flags =
		l->readonly || (l->map && !l->map->writable) ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
	fill_dltensor(&h->mt.dl_tensor, l);
	h->l = l;
	atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
	return &h->mt;
}

/* The lease behind t, or NULL if t is not ours. Borrowed: valid while t lives. */
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

int tensord_tensor_read_only_enforced(const DLManagedTensorVersioned *t)
{
	struct td_lease *l = lease_of(t);

	if (!l)
		return td_set_error(-EINVAL, "not a tensor made by libtensord");
	/* A private view (l->view) is a writable copy-on-write mapping. */
	return l->map && !l->view && l->map->ro_enforced ? 1 : 0;
}

/*
 * Takes ownership of fd and of the reference on pinned (either may be
 * absent): closes the one and drops the other.
 */
static void drop(struct td_mapcache *mc, int fd, struct td_mapping *pinned)
{
	if (fd >= 0)
		close(fd);
	if (pinned)
		td_mapcache_unref(mc, pinned);
}

/*
 * Maps the memory a Lease reply hands over and adds it to mc. info is the
 * reply's tensor, borrowed for the call.
 * Takes ownership of fd (-1 when none): it is closed on every path.
 * On success *ret_map is a new reference; release with td_mapcache_unref().
 */
static int import_mapping(struct td_mapcache *mc, const Tensord__Lease *w, const tensord_info *info,
			  int fd, bool created, const struct td_reserve_slot *rs,
			  struct td_mapping **ret_map)
{
	const struct td_importer *imp = td_importer_for(w->handle);
	struct td_import_desc d = {
		.handle_kind = w->handle,
		.map_size = w->map_size,
		.writable = w->writable,
		.populate = created, /* the creator is about to fill it */
		.shared = w->share_id != 0 && !(rs && rs->lent),
		.device = info->device,
		.uuid = w->info->device ? w->info->device->uuid.data : NULL,
		.uuid_len = w->info->device ? w->info->device->uuid.len : 0,
		.ipc_handle = w->ipc_handle.data,
		.ipc_handle_len = w->ipc_handle.len,
		.ipc_offset = w->ipc_offset,
		.premapped = rs ? rs->base : NULL,
		.premapped_len = rs ? rs->size : 0,
		.premapped_lent = rs && rs->lent,
		.daemon_instance = mc->daemon_instance,
		.tensor_id = info->id,
		.share_id = w->share_id,
		.name = info->name,
	};
	struct td_mapping *m;
	int r;

	if (!imp) {
		r = td_set_error(-ENOTSUP, "tensor '%s': this libtensord cannot map handle kind %d",
				 info->name, (int)w->handle);
		drop(mc, fd, NULL);
		return r;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		drop(mc, fd, NULL);
		return td_set_error(-ENOMEM, "out of memory");
	}
	m->id = info->id;
	m->handle_kind = w->handle;
	/* A read-only lease of a tensor in a slab points into the slab's
	 * mapping, made once per client, when the pages under it are clean. */
	if (d.shared && !d.writable && !created && !rs &&
	    w->handle == TENSORD__HANDLE_KIND__HANDLE_MEMFD)
		d.slab = td_mapcache_share_map(mc, w->share_id, info->name);
	r = imp->map(m, fd, &d);
	if (d.slab)
		td_slabmap_unref(d.slab); /* map() took its own when it points into it */
	if (r < 0) {
		free(m);
		return r;
	}
	m->writable = w->writable;
	m->created_here = created;
	m->flags = info->flags;
	/* A tensor in a slab has no descriptor of its own for a view: its window,
	 * or its place in the slab's mapping, is reused only while clean
	 * (td_mapcache_find_reusable()). A ring buffer's view lent to its
	 * creator is no attach's. */
	m->reusable = !(rs && rs->lent);
	m->ring_id = rs && rs->lent ? rs->id : 0;
	m->in_slab = w->share_id != 0 && !(rs && rs->lent);
	m->gpu_ring = td_gpu_handle_fd(w->handle) && (w->share_id & TD_GPU_RING_SHARE);
	snprintf(m->name, sizeof(m->name), "%s", info->name);
	td_mapcache_insert(mc, m);
	*ret_map = m;
	return 0;
}

/*
 * The descriptor to map a tensor in shared memory (a slab) from: fd when
 * the daemon sent one, which the cache also keeps a duplicate of for the
 * next tensors there, else a duplicate of the one the cache keeps (-1 when
 * none). Takes ownership of fd; the result is owned by the caller.
 */
static int share_fd(struct td_mapcache *mc, uint64_t id, int fd)
{
	int keep;

	if (fd < 0)
		return td_mapcache_share_fd(mc, id);
	keep = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (keep >= 0)
		td_mapcache_share_add(mc, id, keep);
	return fd;
}

/*
 * Whether pinned, a tensor in a slab that a stray write of this process
 * dirtied since the attach found it clean (a neighbour's on its page,
 * say), is to be left for a mapping made afresh from the slab's kept
 * descriptor: it has none for a view of its own.
 */
static bool slab_gone_dirty(const Tensord__Lease *w, const struct td_mapping *pinned)
{
	const struct td_importer *imp = td_importer_for(pinned->handle_kind);

	return pinned->in_slab && !pinned->writable && w->share_id &&
	       w->handle == pinned->handle_kind && imp && imp->clean && !imp->clean(pinned);
}

/*
 * The mapping a Lease reply's lease uses: pinned when the daemon says we
 * may reuse it, a new one when it sent a handle, NULL for zero-size
 * tensors. info is the reply's tensor, borrowed for the call.
 * Takes ownership of fd (-1 when none): it is closed on every path.
 * Takes ownership of the reference on pinned (NULL when none): moved to
 * *ret_map or dropped. On success *ret_map is a new reference or NULL;
 * release with td_mapcache_unref(); *ret_reused says it is pinned.
 */
static int lease_mapping(struct td_mapcache *mc, const Tensord__Lease *w, const tensord_info *info,
			 int fd, struct td_mapping *pinned, bool created,
			 const struct td_reserve_slot *rs, struct td_mapping **ret_map,
			 bool *ret_reused)
{
	struct td_mapping *m = NULL;
	bool reused = w->reused;
	int r = 0;

	if (reused && pinned && pinned->id == w->info->id && slab_gone_dirty(w, pinned)) {
		td_mapcache_unref(mc, pinned);
		pinned = NULL;
		reused = false;
	}
	if (reused) {
		if (!pinned || pinned->id != w->info->id) {
			r = td_set_error(-EPROTO,
					 "tensor '%s': tensord reused a mapping we do not hold",
					 info->name);
		} else {
			m = pinned;
			pinned = NULL;
		}
	} else if (w->handle != TENSORD__HANDLE_KIND__HANDLE_NONE) {
		/* A ring buffer lent to its creator is mapped already; a GPU
		 * set's legacy IPC handle comes with every lease, as bytes. */
		bool share = w->share_id && !(rs && rs->lent) &&
			     (w->handle == TENSORD__HANDLE_KIND__HANDLE_MEMFD ||
			      td_gpu_handle_fd(w->handle));

		if (share)
			fd = share_fd(mc, w->share_id, fd);
		if (share && fd < 0)
			r = td_set_error(-EPROTO,
					 "tensor '%s': tensord sent no descriptor for "
					 "shared memory %llu, which we do not hold",
					 info->name, (unsigned long long)w->share_id);
		else
			r = import_mapping(mc, w, info, fd, created, rs, &m);
		fd = -1;
	}
	drop(mc, fd, pinned);
	if (r < 0)
		return r;
	*ret_map = m;
	*ret_reused = reused;
	return 0;
}

/*
 * A reused private mapping gets a view of its own for this lease (see
 * td_importer.view), unless no stray write has touched it (its importer's
 * clean()): then the lease shares it, so many leases of one tensor cost
 * one mapping. On failure drops the reference on m. On success *ret_view
 * is owned by the lease (NULL: it uses m itself).
 */
static int lease_view(struct td_mapcache *mc, struct td_mapping *m, bool reused, void **ret_view)
{
	const struct td_importer *imp;
	int r;

	*ret_view = NULL;
	if (!m || !reused || m->writable)
		return 0;
	imp = td_importer_for(m->handle_kind);
	if (!imp || !imp->view || (imp->clean && imp->clean(m)))
		return 0;
	r = imp->view(m, ret_view);
	if (r < 0)
		td_mapcache_unref(mc, m);
	return r;
}

/*
 * The lease's device as this process numbers it: the mapping's, or for a
 * tensor with nothing mapped (zero-size), found by the UUID the daemon
 * sent. *dev holds the daemon's numbering on entry.
 */
static int lease_device(const Tensord__Lease *w, const struct td_mapping *m, DLDevice *dev)
{
	const Tensord__Device *wd = w->info->device;

	if (m) {
		*dev = m->device;
		return 0;
	}
	if (!td_device_is_gpu(dev->device_type))
		return 0;
	return td_gpu_local_device(*dev, wd ? wd->uuid.data : NULL, wd ? wd->uuid.len : 0, dev);
}

static int lease_from(tensord_client *c, const Tensord__Lease *w, int fd, struct td_mapping *pinned,
		      bool created, const struct td_reserve_slot *rs, struct td_lease **ret_lease)
{
	struct td_lease *l = calloc(1, sizeof(*l));
	struct td_mapping *m = NULL;
	bool reused = false;
	int r;

	if (!l || !w->info) {
		r = td_set_error(l ? -EPROTO : -ENOMEM,
				 l ? "tensord sent a lease without a tensor" : "out of memory");
		drop(&c->maps, fd, pinned);
		goto fail;
	}
	td_info_from_wire(&l->info, w->info);
	r = lease_mapping(&c->maps, w, &l->info, fd, pinned, created, rs, &m, &reused);
	if (r < 0)
		goto fail;
	r = lease_view(&c->maps, m, reused, &l->view);
	if (r < 0)
		goto fail;
	r = lease_device(w, m, &l->info.device);
	if (r < 0) {
		if (l->view)
			td_importer_for(m->handle_kind)->unview(m, l->view);
		if (m)
			td_mapcache_unref(&c->maps, m);
		goto fail;
	}
	l->magic = LEASE_MAGIC;
	atomic_init(&l->refs, 0);
	l->c = c;
	td_client_ref(c);
	l->lease_id = w->lease;
	l->map = m;
	l->readonly = !w->writable;
	if (m && td_importer_for(m->handle_kind)->unmap_before_close) {
		pthread_mutex_lock(&c->lock);
		LIST_INSERT_HEAD(&c->ipc_leases, l, ipc_link);
		l->ipc_listed = true;
		pthread_mutex_unlock(&c->lock);
	}
	lease_list(c, l);
	*ret_lease = l;
	return 0;
fail:
	end_granted(c, w->lease, r);
	free(l);
	return r;
}

int td_lease_from_reply(tensord_client *c, const Tensord__Lease *w, int fd,
			struct td_mapping *pinned, bool created, struct td_lease **ret_lease)
{
	return lease_from(c, w, fd, pinned, created, NULL, ret_lease);
}

int td_lease_from_reserve(tensord_client *c, const Tensord__Lease *w, struct td_reserve_slot *rs,
			  struct td_lease **ret_lease)
{
	int fd = rs->fd;
	int r;

	/* The lease's mapping takes over the slot's, the descriptor with it. */
	rs->fd = -1;
	r = lease_from(c, w, fd, NULL, true, rs, ret_lease);
	/* A failure never got as far as taking the mapping over. */
	if (r == 0)
		rs->base = NULL;
	return r;
}

int td_lease_from_ring(tensord_client *c, const Tensord__Lease *w, uint8_t *base, uint64_t len,
		       struct td_lease **ret_lease)
{
	struct td_reserve_slot lent = {
		.id = w->ring, .fd = -1, .base = base, .size = len, .lent = true
	};

	return lease_from(c, w, -1, NULL, true, &lent, ret_lease);
}

int td_lease_local(tensord_client *c, struct td_binding *b, const tensord_info *info,
		   struct td_mapping *m, bool readonly, bool need_view, struct td_lease **ret_lease)
{
	struct td_lease *l = calloc(1, sizeof(*l));
	int r;

	if (!l) {
		r = td_set_error(-ENOMEM, "out of memory");
		goto fail;
	}
	if (need_view) {
		r = td_importer_for(m->handle_kind)->view(m, &l->view);
		if (r < 0)
			goto fail;
	}
	l->magic = LEASE_MAGIC;
	atomic_init(&l->refs, 0);
	l->c = c;
	td_client_ref(c);
	l->map = m;
	l->readonly = readonly;
	l->info = *info;
	l->binding = b;
	lease_list(c, l);
	*ret_lease = l;
	return 0;
fail:
	free(l);
	if (m)
		td_mapcache_unref(&c->maps, m);
	td_binding_local_end(b);
	return r;
}

uint64_t td_lease_bind(struct td_lease *l, struct td_binding *b, tensord_info *ret_info,
		       bool *ret_writable)
{
	uint64_t id = l->lease_id;

	/* Under l->c's lock (the caller's), as a re-adoption changes it. */
	l->lease_id = 0;
	l->binding = b;
	*ret_info = l->info;
	*ret_writable = !l->readonly;
	return id;
}

struct td_mapping *td_lease_mapping(const struct td_lease *l)
{
	return l->map;
}

int td_lease_handle(struct td_lease *l, DLManagedTensorVersioned **ret_tensor)
{
	DLManagedTensorVersioned *h;

	atomic_store(&l->refs, 1);
	h = handle_new(l);
	if (!h) {
		lease_unref(l);
		return td_set_error(-ENOMEM, "out of memory");
	}
	atomic_fetch_sub(&l->refs, 1);
	*ret_tensor = h;
	return 0;
}

int td_lease_handle_legacy(struct td_lease *l, DLManagedTensor **ret_tensor)
{
	struct td_handle_legacy *h = malloc(sizeof(*h));

	atomic_store(&l->refs, 1);
	if (!h) {
		lease_unref(l);
		return td_set_error(-ENOMEM, "out of memory");
	}
	fill_dltensor(&h->mt.dl_tensor, l);
	h->mt.manager_ctx = l;
	h->mt.deleter = legacy_deleter;
	h->l = l;
	*ret_tensor = &h->mt;
	return 0;
}

void td_info_from_wire(tensord_info *info, const Tensord__TensorInfo *w)
{
	memset(info, 0, sizeof(*info));
	snprintf(info->name, sizeof(info->name), "%s", w->name);
	if (w->dtype)
		info->dtype = (DLDataType){ (uint8_t)w->dtype->code, (uint8_t)w->dtype->bits,
					    (uint16_t)w->dtype->lanes };
	info->ndim = (int32_t)(w->n_shape <= TENSORD_NDIM_MAX ? w->n_shape : TENSORD_NDIM_MAX);
	for (int i = 0; i < info->ndim; i++) {
		info->shape[i] = w->shape[i];
		info->strides[i] = (size_t)i < w->n_strides ? w->strides[i] : 0;
	}
	if (w->device)
		info->device = (DLDevice){ (DLDeviceType)w->device->type, w->device->id };
	info->nbytes = w->nbytes;
	info->byte_offset = w->byte_offset;
	info->state = (tensord_state)w->state;
	info->refcount = w->refcount;
	info->owner_uid = w->owner_uid;
	info->owner_gid = w->owner_gid;
	info->mode = w->mode;
	info->flags = w->flags;
	info->created_ns = w->created_ns;
	info->id = w->id;
	info->generation = w->generation;
	info->commit = w->commit;
}
