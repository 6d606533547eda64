/*
 * What the GPU importers share. See import_gpu.h.
 *
 * Drivers are loaded on the first GPU import, so programs that only use
 * host tensors never load one. The daemon names each device by UUID; a
 * mapping is made on whichever local ordinal has that UUID, because
 * CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES may renumber GPUs
 * differently in each process.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "import_gpu.h"

/* Set by fork.c in a forked child (import.h). */
int td_gpu_forked_from;

/* Each vendor's driver, in the order of common/vendor.h; NULL-terminated. */
#define TD_GPU_CLIENT(id, ...) &td_##id##_client,
static const struct td_gpu_client *const td_gpu_clients[] = {
	TD_GPU_VENDORS(TD_GPU_CLIENT) /* one per vendor */
	NULL,
};
#undef TD_GPU_CLIENT

static const struct td_gpu_client *td_gpu_client_of(int device_type)
{
	for (int i = 0; td_gpu_clients[i]; i++)
		if (td_gpu_clients[i]->device_type == device_type)
			return td_gpu_clients[i];
	return NULL;
}

bool td_gpu_in_use(void)
{
	for (int i = 0; td_gpu_clients[i]; i++)
		if (td_gpu_clients[i]->in_use())
			return true;
	return false;
}

int td_gpu_load(const struct td_gpu_client *gc, const void **ret_api)
{
	const struct td_gpu_vendor *v = td_gpu_vendor_of(gc->device_type);
	const char *why = NULL;
	int err;

	if (td_gpu_forked_from)
		return td_set_error(-ENODEV,
				    "cannot use %s memory in this process: it was forked from "
				    "process %d after tensord %s there, and %s does not survive "
				    "fork(); start it with the 'spawn' or 'forkserver' method "
				    "instead",
				    v->name, td_gpu_forked_from, gc->loaded, v->name);
	err = gc->get(ret_api, &why);
	if (err < 0)
		return td_set_error(err, "cannot use %s memory: %s", v->name, why);
	return 0;
}

int td_gpu_fail(const struct td_gpu_client *gc, const void *api, int r, const char *what)
{
	char err[128];

	return td_set_error(gc->errno_of(r), "%s: %s", what,
			    gc->strerror(api, r, err, sizeof(err)));
}

/* Loads gc's driver and lists this process's devices. 0 or -errno (error set). */
static int td_gpu_devices(const struct td_gpu_client *gc, uint8_t (*uuids)[TD_GPU_UUID_LEN],
			  int *ret_n, bool *ret_have)
{
	const void *api;
	int err = td_gpu_load(gc, &api);

	return err < 0 ? err : gc->uuids(api, uuids, ret_n, ret_have);
}

int td_gpu_ordinal_of_uuid(const struct td_gpu_client *gc, const uint8_t *uuid, size_t uuid_len,
			   int daemon_id, int *ret_ordinal)
{
	const struct td_gpu_vendor *v = td_gpu_vendor_of(gc->device_type);
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	bool have = false;
	char ustr[48];
	int n = 0, ord = daemon_id, err;

	err = td_gpu_devices(gc, uuids, &n, &have);
	if (err < 0)
		return err;
	/* Without a UUID on either side the ordinals are all there is, where the vendor allows. */
	if (!gc->ordinal_fallback || (have && uuid && uuid_len == TD_GPU_UUID_LEN)) {
		ord = td_gpu_uuid_find(uuid, uuid_len, (const uint8_t(*)[TD_GPU_UUID_LEN])uuids, n);
		if (ord < 0)
			return gc->not_seen(daemon_id,
					    td_gpu_uuid_format(uuid, uuid_len, ustr, sizeof(ustr)),
					    n);
	}
	if (ord < 0 || ord >= n)
		return td_set_error(-ENODEV, "%s:%d: only %d %s devices here", v->device, ord, n,
				    v->name);
	*ret_ordinal = ord;
	return 0;
}

/* The UUID of this process's device ordinal; -ENOENT when the daemon must go by the ordinal. */
static int td_gpu_uuid_of_ordinal(const struct td_gpu_client *gc, int ordinal,
				  uint8_t uuid[TD_GPU_UUID_LEN])
{
	const struct td_gpu_vendor *v = td_gpu_vendor_of(gc->device_type);
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	bool have = false;
	int n = 0, err;

	err = td_gpu_devices(gc, uuids, &n, &have);
	if (err < 0)
		return err;
	if (ordinal < 0 || ordinal >= n)
		return td_set_error(-ENODEV, "%s:%d: this process sees %d %s devices (check %s)",
				    v->device, ordinal, n, v->name, gc->visible_env);
	/* No usable UUID: the daemon goes by the ordinal. */
	if (gc->ordinal_fallback && (!have || td_gpu_uuid_is_blank(uuids[ordinal])))
		return -ENOENT;
	memcpy(uuid, uuids[ordinal], TD_GPU_UUID_LEN);
	return 0;
}

int td_gpu_local_device(DLDevice daemon_dev, const uint8_t *uuid, size_t uuid_len,
			DLDevice *ret_local)
{
	const struct td_gpu_client *gc = td_gpu_client_of(daemon_dev.device_type);
	int ord, r;

	if (!gc) {
		*ret_local = daemon_dev;
		return 0;
	}
	r = td_gpu_ordinal_of_uuid(gc, uuid, uuid_len, daemon_dev.device_id, &ord);
	if (r < 0)
		return r;
	*ret_local = (DLDevice){ daemon_dev.device_type, ord };
	return 0;
}

int td_gpu_device_uuid(DLDevice local, uint8_t uuid[16])
{
	const struct td_gpu_client *gc = td_gpu_client_of(local.device_type);

	return gc ? td_gpu_uuid_of_ordinal(gc, local.device_id, uuid) : -ENOENT;
}

/* Every import of this process that some mapping holds (import_gpu.h). */
static pthread_mutex_t td_gpu_shared_mu = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, td_gpu_shared) td_gpu_shared_all = LIST_HEAD_INITIALIZER(td_gpu_shared_all);

void td_gpu_shared_lock(void)
{
	pthread_mutex_lock(&td_gpu_shared_mu);
}

void td_gpu_shared_unlock(void)
{
	pthread_mutex_unlock(&td_gpu_shared_mu);
}

struct td_gpu_shared *td_gpu_shared_find(const struct td_gpu_client *gc, int ordinal,
					 const void *key, size_t key_len)
{
	struct td_gpu_shared *s;

	if (key_len == 0 || key_len > sizeof(s->key))
		return NULL;
	LIST_FOREACH(s, &td_gpu_shared_all, link)
	if (s->gc == gc && s->ordinal == ordinal && s->key_len == key_len &&
	    memcmp(s->key, key, key_len) == 0) {
		/* A parked one is in use again, as it was left. */
		s->refs++;
		s->parked_ns = 0;
		return s;
	}
	return NULL;
}

struct td_gpu_shared *td_gpu_shared_add(const struct td_gpu_client *gc, int ordinal,
					const void *key, size_t key_len, uint64_t value)
{
	struct td_gpu_shared *s = calloc(1, sizeof(*s));

	if (!s) {
		td_set_error(-ENOMEM, "out of memory");
		return NULL;
	}
	s->gc = gc;
	s->ordinal = ordinal;
	if (key_len <= sizeof(s->key)) {
		memcpy(s->key, key, key_len);
		s->key_len = key_len;
	}
	s->value = value;
	s->refs = 1;
	LIST_INSERT_HEAD(&td_gpu_shared_all, s, link);
	return s;
}

/* TD_GPU_PARK_NS, or TENSORD_GPU_PARK_MS from the environment (read once). */
static uint64_t td_gpu_park_ns_v = TD_GPU_PARK_NS;
static pthread_once_t td_gpu_park_once = PTHREAD_ONCE_INIT;

static void td_gpu_park_read(void)
{
	const char *ms = getenv("TENSORD_GPU_PARK_MS");
	char *end;

	if (ms && *ms) {
		unsigned long long v = strtoull(ms, &end, 10);

		if (!*end && v <= 3600000ull)
			td_gpu_park_ns_v = v * 1000000ull;
	}
}

uint64_t td_gpu_park_ns(void)
{
	pthread_once(&td_gpu_park_once, td_gpu_park_read);
	return td_gpu_park_ns_v;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether this thread dropped an import's last reference since td_gpu_last_watch(). */
static _Thread_local bool last_dropped;

void td_gpu_last_watch(void)
{
	last_dropped = false;
}

bool td_gpu_last_dropped(void)
{
	return last_dropped;
}

bool td_gpu_shared_put(struct td_gpu_shared *s)
{
	if (--s->refs > 0)
		return false;
	last_dropped = true;
	if (s->keep && s->gc->unpark && !td_gpu_forked_from) {
		s->parked_ns = mono_ns();
		return false;
	}
	LIST_REMOVE(s, link);
	return true;
}

uint64_t td_gpu_parked_sweep(uint64_t now)
{
	LIST_HEAD(, td_gpu_shared) gone = LIST_HEAD_INITIALIZER(gone);
	struct td_gpu_shared *s, *next;
	uint64_t due = 0;

	td_gpu_shared_lock();
	for (s = LIST_FIRST(&td_gpu_shared_all); s; s = next) {
		next = LIST_NEXT(s, link);
		if (s->refs || !s->parked_ns)
			continue;
		if (now == UINT64_MAX || now - s->parked_ns >= td_gpu_park_ns()) {
			LIST_REMOVE(s, link);
			LIST_INSERT_HEAD(&gone, s, link);
		} else if (!due || s->parked_ns + td_gpu_park_ns() < due) {
			due = s->parked_ns + td_gpu_park_ns();
		}
	}
	td_gpu_shared_unlock();
	/* Off the table: nobody finds them, so the driver calls need no lock. */
	while ((s = LIST_FIRST(&gone))) {
		LIST_REMOVE(s, link);
		/* Inherited across fork(): not ours to undo here. */
		if (!td_gpu_forked_from)
			s->gc->unpark(s);
		free(s->vendor);
		free(s);
	}
	return due;
}

int td_gpu_device_sync(int device_type, int ordinal)
{
	const struct td_gpu_client *gc = td_gpu_client_of(device_type);
	const void *api;

	if (!gc || !gc->sync_ordinal || td_gpu_forked_from || td_gpu_load(gc, &api) < 0)
		return -ENODEV;
	return gc->sync_ordinal(api, ordinal);
}

void td_gpu_shared_drop(struct td_gpu_map *p, void (*undo)(struct td_gpu_map *p, uint64_t value))
{
	struct td_gpu_shared *s = p->shared;

	if (!s)
		return;
	p->shared = NULL;
	td_gpu_shared_lock();
	/* Undone under the lock, so that nobody finds it or imports it anew meanwhile. */
	if (td_gpu_shared_put(s)) {
		undo(p, s->value);
		free(s->vendor);
		free(s);
	}
	td_gpu_shared_unlock();
}

struct td_gpu_map *td_gpu_map_new(const struct td_gpu_client *gc, const void *api, int ordinal)
{
	struct td_gpu_map *p = calloc(1, gc->map_size);

	if (!p)
		return NULL;
	p->gc = gc;
	p->api = api;
	p->ordinal = ordinal;
	return p;
}

void td_gpu_mapped(struct td_mapping *m, struct td_gpu_map *p, const struct td_import_desc *d)
{
	m->base = (void *)(uintptr_t)p->ptr;
	m->data = (char *)m->base + d->ipc_offset;
	m->size = d->map_size;
	m->device = (DLDevice){ (DLDeviceType)p->gc->device_type, p->ordinal };
	m->priv = p;
}

int td_gpu_map_ipc(const struct td_gpu_client *gc, struct td_mapping *m, int fd,
		   const struct td_import_desc *d)
{
	const char *name = td_gpu_vendor_of(gc->device_type)->name;
	struct td_gpu_map *p;
	const void *api;
	int err, ordinal;

	if (fd >= 0)
		close(fd);
	err = td_gpu_load(gc, &api);
	if (err < 0)
		return err;
	if (!d->ipc_handle || d->ipc_handle_len != gc->ipc_handle_len)
		return td_set_error(-EPROTO, "%s IPC handle of %zu bytes, expected %zu", name,
				    d->ipc_handle_len, gc->ipc_handle_len);
	if (d->ipc_offset > d->map_size)
		return td_set_error(-EPROTO, "%s IPC offset %llu beyond %llu bytes", name,
				    (unsigned long long)d->ipc_offset,
				    (unsigned long long)d->map_size);
	err = td_gpu_ordinal_of_uuid(gc, d->uuid, d->uuid_len, d->device.device_id, &ordinal);
	if (err < 0)
		return err;
	p = td_gpu_map_new(gc, api, ordinal);
	if (!p)
		return td_set_error(-ENOMEM, "out of memory");
	/* Opened once per process (import_gpu.h); the lock keeps a second opener waiting. */
	td_gpu_shared_lock();
	p->shared = td_gpu_shared_find(gc, ordinal, d->ipc_handle, d->ipc_handle_len);
	if (p->shared)
		p->ptr = p->shared->value;
	err = gc->ipc_open(p, d->ipc_handle, d->map_size, p->shared != NULL);
	if (err == 0 && !p->shared) {
		p->shared =
			td_gpu_shared_add(gc, ordinal, d->ipc_handle, d->ipc_handle_len, p->ptr);
		if (!p->shared) {
			struct td_gpu_scope sc;

			err = -ENOMEM;
			if (gc->enter(p, &sc, NULL) == 0) {
				gc->release(p); /* closes it: no entry holds it */
				gc->leave(p, &sc);
			}
			if (gc->drop)
				gc->drop(p);
		}
	} else if (err < 0 && p->shared) {
		(void)td_gpu_shared_put(p->shared); /* never the last: others hold it */
	}
	td_gpu_shared_unlock();
	if (err < 0) {
		free(p);
		return err;
	}
	td_gpu_mapped(m, p, d);
	return 0;
}

/*
 * Undoes any GPU map. Runs on any thread; errors cannot be reported and
 * leave nothing to retry.
 */
bool td_gpu_shared_clean(const struct td_mapping *m)
{
	(void)m;
	return true;
}

void td_gpu_unmap(struct td_mapping *m)
{
	struct td_gpu_map *p = m->priv;
	struct td_gpu_scope s;

	if (!p)
		return;
	/* Inherited across fork(): the mapping is not ours here, and the
	 * driver must not be called. Forget it. */
	if (!td_gpu_forked_from) {
		if (p->gc->enter(p, &s, NULL) == 0) {
			/*
			 * Consumers (torch, cupy) call the DLPack deleter as soon
			 * as their array object dies, with kernels that read it
			 * possibly still queued on any stream of the device: wait
			 * for them, as torch's own allocator does before
			 * cuMemUnmap, or they fault.
			 */
			if (!p->gc->waits_in_release || !p->gc->waits_in_release(p))
				(void)p->gc->synchronize(p);
			p->gc->release(p);
			p->gc->leave(p, &s);
		}
		if (p->gc->drop)
			p->gc->drop(p);
	}
	free(p);
	m->priv = NULL;
	m->base = m->data = NULL;
}

/*
 * Publish by the creator: every stream of the device (the runtime and the
 * frameworks write through it), so writes queued anywhere in this process
 * land before readers can attach.
 */
int td_gpu_sync(struct td_mapping *m)
{
	static const char what[] = "synchronizing the device before publish";
	struct td_gpu_map *p = m->priv;
	struct td_gpu_scope s;
	int err, r;

	if (!p)
		return 0;
	err = p->gc->enter(p, &s, what);
	if (err < 0)
		return err;
	r = p->gc->synchronize(p);
	p->gc->leave(p, &s);
	return r ? td_gpu_fail(p->gc, p->api, r, what) : 0;
}

/*
 * put() of a device array: device to device, on the stream put() asked
 * the producer to order its writes before (td_gpu_put_stream()), then a
 * wait for that stream.
 */
int td_gpu_copy_in(struct td_mapping *m, const void *src, uint64_t n)
{
	static const char what[] = "copying device memory into the tensor";
	struct td_gpu_map *p = m->priv;
	struct td_gpu_scope s;
	int err, r;

	if (!p)
		return td_set_error(-EINVAL, "tensor '%s' is not mapped", m->name);
	err = p->gc->enter(p, &s, what);
	if (err < 0)
		return err;
	r = p->gc->copy(p, m->data, src, (size_t)n, td_gpu_put_stream(p->gc->device_type));
	p->gc->leave(p, &s);
	return r ? td_gpu_fail(p->gc, p->api, r, what) : 0;
}
