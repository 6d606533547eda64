/*
 * Importers for CUDA memory: td_importer_cuda for HANDLE_CUDA_VMM_FD (a
 * POSIX fd exported by cuMemExportToShareableHandle) and
 * td_importer_cuda_ipc for HANDLE_CUDA_IPC (legacy cuIpcMemHandle bytes),
 * on what every vendor's importers share (client/lib/import_gpu.h:
 * loading libcuda on the first GPU import, the device by UUID, the legacy
 * IPC import, unmap after a wait, sync and copy_in). What is CUDA's own is
 * here: the VMM import, its access for this process's devices that can
 * reach the memory and its read-only protection, and the driver calls
 * td_cuda_client gives the shared code. A GPU ring buffer's import, kept
 * and parked between versions, is import_park.c.
 *
 * All driver calls run with the device's primary context pushed and popped
 * again, so the application's current context (torch, cupy and the CUDA
 * runtime all use the primary context too) is left as it was, on whatever
 * thread we run. Each mapping holds a reference on the primary context
 * until unmap().
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/lib/import_gpu.h"
#include "gpu/cuda/cuda_api.h"
#include "gpu/cuda/import_cuda_int.h"

static int td_cuda_get(const void **ret_api, const char **ret_why)
{
	const struct td_cuda_api *cu;
	int err = td_cuda_api_get(&cu, ret_why);

	if (err == 0)
		*ret_api = cu;
	return err;
}

static int td_cuda_errno_of(int r)
{
	return td_cuda_errno((CUresult)r);
}

static const char *td_cuda_strerror_of(const void *api, int r, char *buf, size_t len)
{
	return td_cuda_strerror(api, (CUresult)r, buf, len);
}

static int td_cuda_uuids(const void *api, uint8_t (*uuids)[TD_GPU_UUID_LEN], int *ret_n,
			 bool *ret_have)
{
	const struct td_cuda_api *cu = api;
	char err[128];
	int n = 0;
	CUresult r;

	r = cu->DeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return td_set_error(td_cuda_errno(r), "cuDeviceGetCount: %s",
				    td_cuda_strerror(cu, r, err, sizeof(err)));
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	for (int i = 0; i < n; i++) {
		CUdevice dev;
		CUuuid u;

		r = cu->DeviceGet(&dev, i);
		if (r == CUDA_SUCCESS)
			r = cu->DeviceGetUuid(&u, dev);
		if (r != CUDA_SUCCESS)
			return td_set_error(td_cuda_errno(r), "CUDA device %d: %s", i,
					    td_cuda_strerror(cu, r, err, sizeof(err)));
		memcpy(uuids[i], u.bytes, TD_GPU_UUID_LEN);
	}
	*ret_n = n;
	*ret_have = true;
	return 0;
}

static int td_cuda_not_seen(int daemon_id, const char *uuid, int n)
{
	return td_set_error(-ENODEV,
			    "the daemon's cuda:%d is %s, which this process does not see "
			    "(%d CUDA devices here; check CUDA_VISIBLE_DEVICES)",
			    daemon_id, uuid, n);
}

/* p's CUdevice, from its ordinal. 0 or -ENODEV (error set). */
static int td_cuda_device(struct td_cuda_map *p)
{
	const struct td_cuda_api *cu = p->g.api;
	char err[128];
	CUresult r;

	r = cu->DeviceGet(&p->dev, p->g.ordinal);
	if (r != CUDA_SUCCESS)
		return td_set_error(-ENODEV, "cuDeviceGet(%d): %s", p->g.ordinal,
				    td_cuda_strerror(cu, r, err, sizeof(err)));
	return 0;
}

/* Retains dev's primary context and pushes it. 0 or -errno (error set when report). */
int td_cuda_enter(const struct td_cuda_api *cu, CUdevice dev, bool report)
{
	CUcontext ctx;
	char err[128];
	CUresult r;

	r = cu->DevicePrimaryCtxRetain(&ctx, dev);
	if (r == CUDA_SUCCESS) {
		r = cu->CtxPushCurrent(ctx);
		if (r == CUDA_SUCCESS)
			return 0;
		cu->DevicePrimaryCtxRelease(dev);
	}
	if (!report)
		return td_cuda_errno(r);
	return td_set_error(td_cuda_errno(r), "CUDA context: %s",
			    td_cuda_strerror(cu, r, err, sizeof(err)));
}

/* Pops what td_cuda_enter() pushed; keeps the reference when keep_ref. */
void td_cuda_leave(const struct td_cuda_api *cu, CUdevice dev, bool keep_ref)
{
	CUcontext popped;

	cu->CtxPopCurrent(&popped);
	if (!keep_ref)
		cu->DevicePrimaryCtxRelease(dev);
}

/* For the shared code: the primary context pushed, and gone again with its reference. */
static int td_cuda_scope_enter(struct td_gpu_map *g, struct td_gpu_scope *s, const char *what)
{
	return td_cuda_enter(g->api, ((struct td_cuda_map *)g)->dev, what != NULL);
}

static void td_cuda_scope_leave(struct td_gpu_map *g, struct td_gpu_scope *s)
{
	td_cuda_leave(g->api, ((struct td_cuda_map *)g)->dev, false);
}

/* The runtime and the frameworks queue their work in the primary context. */
static int td_cuda_synchronize(struct td_gpu_map *g)
{
	const struct td_cuda_api *cu = g->api;

	return cu->CtxSynchronize();
}

/*
 * Unified addressing lets cuMemcpyAsync find both sides. DLPack numbers
 * CUDA's streams as the driver does: 1 is CU_STREAM_LEGACY.
 */
static int td_cuda_copy(struct td_gpu_map *g, void *dst, const void *src, size_t n, long stream)
{
	const struct td_cuda_api *cu = g->api;
	CUstream st = (CUstream)(uintptr_t)stream;
	CUresult r;

	r = cu->MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, st);
	if (r == CUDA_SUCCESS)
		r = cu->StreamSynchronize(st);
	return r;
}

/*
 * The owner's device and every other device of this process that can reach
 * its memory (cuDeviceCanAccessPeer), as bits of their ordinals. A peer copy
 * (torch's .to("cuda:1"), cudaMemcpyPeer) reads the range from the other
 * device, which faults unless that device was given access too. A failed
 * query leaves that device out.
 */
static uint64_t td_cuda_reach(struct td_cuda_map *p)
{
	const struct td_cuda_api *cu = p->g.api;
	uint64_t reach = 1ull << p->g.ordinal;
	int n = 0;

	if (cu->DeviceGetCount(&n) != CUDA_SUCCESS)
		return reach;
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	for (int i = 0; i < n; i++) {
		CUdevice peer;
		int can = 0;

		if (i == p->g.ordinal || cu->DeviceGet(&peer, i) != CUDA_SUCCESS)
			continue;
		if (cu->DeviceCanAccessPeer(&can, peer, p->dev) == CUDA_SUCCESS && can)
			reach |= 1ull << i;
	}
	return reach;
}

/* One cuMemSetAccess giving flags to the devices in set, the owner's first. */
static CUresult td_cuda_grant(struct td_cuda_map *p, uint64_t set, CUmemAccess_flags flags)
{
	const struct td_cuda_api *cu = p->g.api;
	CUmemAccessDesc acc[TD_GPU_MAX_DEVICES];
	size_t n = 0;

	memset(acc, 0, sizeof(acc));
	acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc[n].location.id = p->g.ordinal;
	acc[n++].flags = flags;
	for (int i = 0; i < TD_GPU_MAX_DEVICES; i++) {
		if (i == p->g.ordinal || !(set >> i & 1))
			continue;
		acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc[n].location.id = i;
		acc[n++].flags = flags;
	}
	return cu->MemSetAccess(p->g.ptr, p->size, acc, n);
}

/*
 * Grants read-only (writable false) or read-write access to p's VMM range
 * to the devices in p->access. Two fallbacks, tried in this order:
 *  - at the map (narrow), a driver that refuses the peers' access gets the
 *    owner's alone (peers_refused); a later re-protection never narrows,
 *    as a peer left out would keep the access it had;
 *  - a driver that cannot map device memory read-only gets a read-write
 *    mapping instead: the DLPack read-only flag still tells consumers not
 *    to write (docs/gpu.md); ro_enforced says which it was.
 * So read-only for the owner alone is preferred to read-write for all:
 * the promise to the tensor's other readers comes first.
 */
CUresult td_cuda_set_access(struct td_cuda_map *p, bool writable, bool narrow)
{
	const uint64_t owner = 1ull << p->g.ordinal;
	const uint64_t sets[2] = { p->access, owner };
	int nsets = narrow && p->access != owner ? 2 : 1;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	p->ro_enforced = false;
	for (int ro = !writable; ro >= 0; ro--) {
		for (int i = 0; i < nsets; i++) {
			r = td_cuda_grant(p, sets[i],
					  ro ? CU_MEM_ACCESS_FLAGS_PROT_READ
					     : CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
			if (r == CUDA_SUCCESS) {
				p->peers_refused = p->peers_refused || i > 0;
				p->access = sets[i];
				p->ro_enforced = ro;
				return r;
			}
		}
		if (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_INVALID_VALUE)
			break;
	}
	return r;
}

/*
 * Reserves an address range, maps the imported allocation h into it and
 * grants this device access: read-only unless writable. h stays the
 * process's import (p->g.shared), whose reference the caller drops on
 * failure.
 */
static int td_cuda_vmm_map(struct td_cuda_map *p, CUmemGenericAllocationHandle h, uint64_t size,
			   bool writable)
{
	const struct td_cuda_api *cu = p->g.api;
	CUmemAllocationProp prop;
	CUdeviceptr ptr = 0;
	size_t gran = 0;
	CUresult r;
	int err;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = p->dev;
	r = cu->MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return td_gpu_fail(&td_cuda_client, p->g.api, r, "cuMemGetAllocationGranularity");
	if (size == 0 || size > SIZE_MAX || gran == 0 || size % gran != 0)
		return td_set_error(-EINVAL,
				    "CUDA allocation of %llu bytes does not fit the "
				    "device's granularity of %zu bytes",
				    (unsigned long long)size, gran);
	r = cu->MemAddressReserve(&ptr, size, gran, 0, 0);
	p->g.ptr = ptr;
	if (r != CUDA_SUCCESS)
		return td_gpu_fail(&td_cuda_client, p->g.api, r, "cuMemAddressReserve");
	r = cu->MemMap(ptr, size, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		err = td_gpu_fail(&td_cuda_client, p->g.api, r, "cuMemMap");
		cu->MemAddressFree(ptr, size);
		return err;
	}
	p->size = size;

	p->access = td_cuda_reach(p);
	r = td_cuda_set_access(p, writable, true);
	if (r != CUDA_SUCCESS) {
		err = td_gpu_fail(&td_cuda_client, p->g.api, r, "cuMemSetAccess");
		cu->MemUnmap(ptr, size);
		cu->MemAddressFree(ptr, size);
		return err;
	}
	return 0;
}

/* The last mapping of an imported VMM allocation went: the process's handle on it goes too. */
static void td_cuda_vmm_undo(struct td_gpu_map *g, uint64_t value)
{
	const struct td_cuda_api *cu = g->api;

	cu->MemRelease((CUmemGenericAllocationHandle)value);
}

/*
 * The process's import of what fd exports (import_gpu.h): the one held
 * for d's allocation (a set's, by its share id), or a new one. Lock held,
 * the device's context current. 0 or -errno (error set); p->g.shared
 * holds a reference.
 */
static int td_cuda_vmm_import(struct td_cuda_map *p, int fd, const struct td_import_desc *d)
{
	const struct td_cuda_api *cu = p->g.api;
	CUmemGenericAllocationHandle h;
	uint64_t key[2] = { d->daemon_instance, d->share_id ? d->share_id : d->tensor_id };
	size_t key_len = d->daemon_instance ? sizeof(key) : 0;
	CUresult r;

	p->g.shared = td_gpu_shared_find(&td_cuda_client, p->g.ordinal, key, key_len);
	if (p->g.shared)
		return 0;
	r = cu->MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return td_gpu_fail(&td_cuda_client, p->g.api, r, "cuMemImportFromShareableHandle");
	p->g.shared = td_gpu_shared_add(&td_cuda_client, p->g.ordinal, key, key_len, h);
	if (!p->g.shared) {
		cu->MemRelease(h);
		return -ENOMEM;
	}
	if (key_len && (d->share_id & TD_GPU_RING_SHARE))
		td_cuda_keep(p);
	return 0;
}

/*
 * p, a mapping of a set's member (d->share_id), takes the view of its
 * import with its access, mapping it first when no other mapping of the
 * set has. Lock held, the device's context current. 0 or -errno (error
 * set).
 */
static int td_cuda_view_take(struct td_cuda_map *p, const struct td_import_desc *d)
{
	struct td_gpu_shared *s = p->g.shared;
	struct td_cuda_views *vs = s->vendor;
	struct td_cuda_view *v;
	int err;

	if (!vs) {
		vs = calloc(1, sizeof(*vs));
		if (!vs)
			return td_set_error(-ENOMEM, "out of memory");
		s->vendor = vs;
	}
	p->view = d->writable ? 1 : 0;
	v = &vs->v[p->view];
	if (!v->ptr && s->keep) {
		err = td_cuda_view_turn(p, vs, d->writable);
		if (err < 0)
			return err;
	}
	if (!v->ptr) {
		err = td_cuda_vmm_map(p, (CUmemGenericAllocationHandle)s->value, d->map_size,
				      d->writable);
		if (err < 0)
			return err;
		*v = (struct td_cuda_view){ .ptr = p->g.ptr,
					    .size = p->size,
					    .access = p->access,
					    .ro_enforced = p->ro_enforced,
					    .peers_refused = p->peers_refused };
	} else if (v->size != d->map_size) {
		return td_set_error(-EPROTO,
				    "CUDA set allocation %llu: a member says %llu bytes, "
				    "another said %zu",
				    (unsigned long long)d->share_id,
				    (unsigned long long)d->map_size, v->size);
	}
	v->refs++;
	p->g.ptr = v->ptr;
	p->size = v->size;
	p->access = v->access;
	p->ro_enforced = v->ro_enforced;
	p->peers_refused = v->peers_refused;
	p->borrowed = true;
	return 0;
}

/*
 * Lock held, the device's context current. p lets go of the view it took;
 * the last one waits for the device (kernels reading any member may still
 * be queued: docs/gpu.md, "Unmapping waits for the device"), then unmaps
 * it. Only the last waits, under the lock, so that no other mapping can
 * take the view meanwhile; a member released while the others are held
 * waits for nothing.
 */
static void td_cuda_view_put(struct td_cuda_map *p)
{
	const struct td_cuda_api *cu = p->g.api;
	struct td_cuda_views *vs = p->g.shared->vendor;
	struct td_cuda_view *v = &vs->v[p->view];

	p->borrowed = false;
	/* A kept import's view stays mapped for the next version (td_cuda_unpark()). */
	if (--v->refs > 0 || p->g.shared->keep)
		return;
	(void)cu->CtxSynchronize();
	cu->MemUnmap(v->ptr, v->size);
	cu->MemAddressFree(v->ptr, v->size);
	memset(v, 0, sizeof(*v));
}

/* HANDLE_CUDA_VMM_FD. Takes ownership of fd. */
static int td_cuda_map_vmm(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	const struct td_cuda_api *cu;
	struct td_cuda_map *p;
	const void *api;
	int err, ordinal;

	err = td_gpu_load(&td_cuda_client, &api);
	if (err < 0)
		goto out_close;
	cu = api;
	if (fd < 0) {
		err = td_set_error(-EPROTO, "CUDA lease came without a descriptor");
		goto out_close;
	}
	if (!td_cuda_api_has_vmm(cu)) {
		err = td_set_error(-ENODEV,
				   "this CUDA driver has no cuMemImportFromShareableHandle");
		goto out_close;
	}
	err = td_gpu_ordinal_of_uuid(&td_cuda_client, d->uuid, d->uuid_len, d->device.device_id,
				     &ordinal);
	if (err < 0)
		goto out_close;
	p = (struct td_cuda_map *)td_gpu_map_new(&td_cuda_client, api, ordinal);
	if (!p) {
		err = td_set_error(-ENOMEM, "out of memory");
		goto out_close;
	}
	p->vmm = true;
	err = td_cuda_device(p);
	if (err < 0)
		goto out_free;
	err = td_cuda_enter(cu, p->dev, true);
	if (err < 0)
		goto out_free;
	td_gpu_shared_lock();
	err = td_cuda_vmm_import(p, fd, d);
	/* A set's member: a pointer into the range its set's mappings share. */
	if (err == 0 && d->share_id) {
		err = td_cuda_view_take(p, d);
		if (err < 0 && td_gpu_shared_put(p->g.shared)) {
			td_cuda_vmm_undo(&p->g, p->g.shared->value);
			free(p->g.shared->vendor);
			free(p->g.shared);
		}
	}
	td_gpu_shared_unlock();
	/* The imported handle does not need the descriptor any more. */
	close(fd);
	fd = -1;
	if (err < 0) {
		td_cuda_leave(cu, p->dev, false);
		goto out_free;
	}
	if (!p->borrowed)
		err = td_cuda_vmm_map(p, (CUmemGenericAllocationHandle)p->g.shared->value,
				      d->map_size, d->writable);
	if (err < 0)
		td_gpu_shared_drop(&p->g, td_cuda_vmm_undo);
	td_cuda_leave(cu, p->dev, err == 0);
	if (err < 0)
		goto out_free;
	td_gpu_mapped(m, &p->g, d);
	m->ro_enforced = p->ro_enforced;
	m->peers = (unsigned)__builtin_popcountll(p->access) - 1;
	m->peers_refused = p->peers_refused;
	return 0;

out_free:
	free(p);
out_close:
	if (fd >= 0)
		close(fd);
	return err;
}

/* HANDLE_CUDA_IPC: opened on the device's primary context, which the mapping keeps. */
static int td_cuda_ipc_open(struct td_gpu_map *g, const uint8_t *handle, uint64_t map_size,
			    bool opened)
{
	struct td_cuda_map *p = (struct td_cuda_map *)g;
	const struct td_cuda_api *cu = g->api;
	CUdeviceptr base = 0, ptr = 0;
	CUipcMemHandle h;
	size_t range = 0;
	CUresult r;
	int err;

	memcpy(&h, handle, sizeof(h));
	err = td_cuda_device(p);
	if (err < 0)
		return err;
	err = td_cuda_enter(cu, p->dev, true);
	if (err < 0)
		return err;
	if (opened) {
		/* Checked when it was opened: this mapping only holds the context too. */
		td_cuda_leave(cu, p->dev, true);
		return 0;
	}
	r = cu->IpcOpenMemHandle(&ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (r != CUDA_SUCCESS) {
		err = td_gpu_fail(&td_cuda_client, g->api, r, "cuIpcOpenMemHandle");
		td_cuda_leave(cu, p->dev, false);
		return err;
	}
	/* Never trust the size we were told over what the driver mapped. */
	r = cu->MemGetAddressRange(&base, &range, ptr);
	if (r != CUDA_SUCCESS || range < map_size) {
		err = r != CUDA_SUCCESS
			      ? td_gpu_fail(&td_cuda_client, g->api, r, "cuMemGetAddressRange")
			      : td_set_error(-EPROTO,
					     "CUDA IPC mapping has %zu bytes, "
					     "the daemon said %llu",
					     range, (unsigned long long)map_size);
		cu->IpcCloseMemHandle(ptr);
		td_cuda_leave(cu, p->dev, false);
		return err;
	}
	td_cuda_leave(cu, p->dev, true);
	g->ptr = ptr;
	return 0;
}

static int td_cuda_map_ipc(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	return td_gpu_map_ipc(&td_cuda_client, m, fd, d);
}

static void td_cuda_ipc_undo(struct td_gpu_map *g, uint64_t value)
{
	const struct td_cuda_api *cu = g->api;

	cu->IpcCloseMemHandle((CUdeviceptr)value);
}

/*
 * VMM: the range unmapped and given back; legacy: nothing of its own. Then
 * the process's import, with its last mapping: VMM's handle released, the
 * IPC handle closed.
 */
static void td_cuda_release(struct td_gpu_map *g)
{
	struct td_cuda_map *p = (struct td_cuda_map *)g;
	const struct td_cuda_api *cu = g->api;

	if (p->vmm && p->borrowed) {
		td_gpu_shared_lock();
		td_cuda_view_put(p);
		td_gpu_shared_unlock();
		td_gpu_shared_drop(g, td_cuda_vmm_undo);
	} else if (p->vmm) {
		cu->MemUnmap(g->ptr, p->size);
		cu->MemAddressFree(g->ptr, p->size);
		td_gpu_shared_drop(g, td_cuda_vmm_undo);
	} else if (g->shared) {
		td_gpu_shared_drop(g, td_cuda_ipc_undo);
	} else {
		td_cuda_ipc_undo(g, g->ptr); /* opened, and never shared (out of memory) */
	}
}

/* A set's member: td_cuda_view_put() waits, and only when it unmaps. */
static bool td_cuda_waits_in_release(const struct td_gpu_map *g)
{
	return ((const struct td_cuda_map *)g)->borrowed;
}

/* The reference on the primary context that map() kept. */
static void td_cuda_drop(struct td_gpu_map *g)
{
	const struct td_cuda_api *cu = g->api;

	cu->DevicePrimaryCtxRelease(((struct td_cuda_map *)g)->dev);
}

/*
 * Publish of an immutable tensor by its creator: GPU memory has no private
 * copy to fall back on, so the creator's own mapping becomes read-only
 * instead (a later write through it faults on the device; docs/gpu.md),
 * for every device the map gave access. make_shared() undoes it when the
 * publish failed.
 */
static int td_cuda_protect(struct td_mapping *m, bool writable)
{
	struct td_cuda_map *p = m->priv;
	CUresult r;
	int err;

	if (!p || !p->vmm)
		return 0;
	if (p->borrowed) {
		/* A view other mappings share keeps its access; alone in it, p
		 * takes it over as a range of its own, or, in a kept import
		 * (a GPU ring buffer), turns it into the view of that access. */
		struct td_cuda_views *vs;
		unsigned refs;

		td_gpu_shared_lock();
		vs = p->g.shared->vendor;
		refs = vs->v[p->view].refs;
		if (refs == 1 && p->g.shared->keep && !vs->v[writable ? 1 : 0].ptr &&
		    p->view != (writable ? 1 : 0))
			return td_cuda_protect_kept(m, p, vs, writable);
		if (refs == 1) {
			memset(&vs->v[p->view], 0, sizeof(vs->v[p->view]));
			p->borrowed = false;
		}
		td_gpu_shared_unlock();
		if (refs > 1)
			return td_set_error(-EBUSY,
					    "tensor '%s': its mapping is shared by %u mappings "
					    "of its set; its access cannot change",
					    m->name, refs);
	}
	err = td_cuda_enter(p->g.api, p->dev, true);
	if (err < 0)
		return err;
	r = td_cuda_set_access(p, writable, false);
	td_cuda_leave(p->g.api, p->dev, false);
	m->ro_enforced = p->ro_enforced;
	if (r != CUDA_SUCCESS)
		return td_gpu_fail(&td_cuda_client, p->g.api, r,
				   writable ? "cuMemSetAccess (read-write again)"
					    : "cuMemSetAccess (read-only at publish)");
	return 0;
}

static int td_cuda_make_private(struct td_mapping *m)
{
	return td_cuda_protect(m, false);
}

static int td_cuda_make_shared(struct td_mapping *m)
{
	return td_cuda_protect(m, true);
}

static int td_cuda_sync_ordinal(const void *api, int ordinal)
{
	const struct td_cuda_api *cu = api;
	CUdevice dev;
	CUresult r;

	if (cu->DeviceGet(&dev, ordinal) != CUDA_SUCCESS || td_cuda_enter(cu, dev, false) < 0)
		return -ENODEV;
	r = cu->CtxSynchronize();
	td_cuda_leave(cu, dev, false);
	return td_cuda_errno(r);
}

const struct td_gpu_client td_cuda_client = {
	.device_type = TD_GPU_TYPE_cuda,
	.visible_env = "CUDA_VISIBLE_DEVICES",
	.loaded = "initialised CUDA",
	.ordinal_fallback = false,
	.map_size = sizeof(struct td_cuda_map),
	.ipc_handle_len = sizeof(CUipcMemHandle),
	.get = td_cuda_get,
	.in_use = td_cuda_api_in_use,
	.errno_of = td_cuda_errno_of,
	.strerror = td_cuda_strerror_of,
	.uuids = td_cuda_uuids,
	.not_seen = td_cuda_not_seen,
	.enter = td_cuda_scope_enter,
	.leave = td_cuda_scope_leave,
	.synchronize = td_cuda_synchronize,
	.copy = td_cuda_copy,
	.ipc_open = td_cuda_ipc_open,
	.release = td_cuda_release,
	.drop = td_cuda_drop,
	.waits_in_release = td_cuda_waits_in_release,
	.unpark = td_cuda_unpark,
	.sync_ordinal = td_cuda_sync_ordinal,
};

const struct td_importer td_importer_cuda = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD,
	.map = td_cuda_map_vmm,
	.unmap = td_gpu_unmap,
	.clean = td_gpu_shared_clean, /* bound attaches: no round trip */
	.make_private = td_cuda_make_private,
	.make_shared = td_cuda_make_shared,
	.sync = td_gpu_sync,
	.copy_in = td_gpu_copy_in,
};

const struct td_importer td_importer_cuda_ipc = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC,
	.unmap_before_close = true,
	.map = td_cuda_map_ipc,
	.unmap = td_gpu_unmap,
	/* Legacy IPC has no read-only mapping: the DLPack flag is all there is. */
	.make_private = NULL,
	.sync = td_gpu_sync,
	.copy_in = td_gpu_copy_in,
};
