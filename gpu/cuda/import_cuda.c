/*
 * Importers for CUDA memory: td_importer_cuda for HANDLE_CUDA_VMM_FD (a
 * POSIX fd exported by cuMemExportToShareableHandle) and
 * td_importer_cuda_ipc for HANDLE_CUDA_IPC (legacy cuIpcMemHandle bytes).
 *
 * libcuda is loaded on the first GPU import (td_cuda_api_get(), once per
 * process), so programs that only use host tensors never load it.
 *
 * The daemon names the device by UUID; we map it on whichever local
 * ordinal has that UUID, because CUDA_VISIBLE_DEVICES may renumber GPUs
 * differently in each process.
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

#include "client/lib/client.h"
#include "gpu/cuda/cuda_api.h"
#include "gpu/gpu_util.h"

/* The importer's state for one mapping; m->priv. */
struct td_cuda_map {
	const struct td_cuda_api *cu;
	CUdevice dev;
	int ordinal;     /* this process's number for dev */
	CUdeviceptr ptr; /* VMM: the reserved range; legacy: the opened pointer */
	size_t size;     /* VMM: bytes reserved and mapped */
	bool vmm;
	bool ro_enforced; /* VMM read-only mapping honoured by the driver */
};

/* Loads libcuda (once) and says why not in the thread's error. */
static int td_cuda_load(const struct td_cuda_api **ret_cu)
{
	const char *why = NULL;
	int err;

	if (td_gpu_forked_from)
		return td_set_error(
			-ENODEV,
			"cannot use CUDA memory in this process: it was forked from "
			"process %d after tensord initialised CUDA there, and CUDA does "
			"not survive fork(); start it with the 'spawn' or 'forkserver' "
			"method instead",
			td_gpu_forked_from);
	err = td_cuda_api_get(ret_cu, &why);

	if (err < 0)
		return td_set_error(err, "cannot use CUDA memory: %s", why);
	return 0;
}

/* Fills uuids[i] for each of this process's n devices (at most TD_GPU_MAX_DEVICES). */
static int td_cuda_uuids(const struct td_cuda_api *cu, uint8_t (*uuids)[TD_GPU_UUID_LEN],
			 int *ret_n)
{
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
	return 0;
}

int td_cuda_ordinal_of_uuid(const uint8_t *uuid, size_t uuid_len, int daemon_id, int *ret_ordinal)
{
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	const struct td_cuda_api *cu;
	char ustr[48];
	int n = 0, ord, err;

	err = td_cuda_load(&cu);
	if (err == 0)
		err = td_cuda_uuids(cu, uuids, &n);
	if (err < 0)
		return err;
	ord = td_gpu_uuid_find(uuid, uuid_len, (const uint8_t(*)[TD_GPU_UUID_LEN])uuids, n);
	if (ord < 0)
		return td_set_error(-ENODEV,
				    "the daemon's cuda:%d is %s, which this process does not see "
				    "(%d CUDA devices here; check CUDA_VISIBLE_DEVICES)",
				    daemon_id,
				    td_gpu_uuid_format(uuid, uuid_len, ustr, sizeof(ustr)), n);
	*ret_ordinal = ord;
	return 0;
}

int td_cuda_uuid_of_ordinal(int ordinal, uint8_t uuid[TD_GPU_UUID_LEN])
{
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	const struct td_cuda_api *cu;
	int n = 0, err;

	err = td_cuda_load(&cu);
	if (err == 0)
		err = td_cuda_uuids(cu, uuids, &n);
	if (err < 0)
		return err;
	if (ordinal < 0 || ordinal >= n)
		return td_set_error(-ENODEV,
				    "cuda:%d: this process sees %d CUDA devices "
				    "(check CUDA_VISIBLE_DEVICES)",
				    ordinal, n);
	memcpy(uuid, uuids[ordinal], TD_GPU_UUID_LEN);
	return 0;
}

/*
 * The local ordinal of the daemon's device d->uuid, and its CUdevice.
 * 0 or -ENODEV (error set).
 */
static int td_cuda_find_device(const struct td_cuda_api *cu, const struct td_import_desc *d,
			       CUdevice *ret_dev, int *ret_ordinal)
{
	char err[128];
	int ord, rc;
	CUresult r;

	rc = td_cuda_ordinal_of_uuid(d->uuid, d->uuid_len, d->device.device_id, &ord);
	if (rc < 0)
		return rc;
	r = cu->DeviceGet(ret_dev, ord);
	if (r != CUDA_SUCCESS)
		return td_set_error(-ENODEV, "cuDeviceGet(%d): %s", ord,
				    td_cuda_strerror(cu, r, err, sizeof(err)));
	*ret_ordinal = ord;
	return 0;
}

/* Retains dev's primary context and pushes it. 0 or -errno (error set). */
static int td_cuda_enter(const struct td_cuda_api *cu, CUdevice dev)
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
	return td_set_error(td_cuda_errno(r), "CUDA context: %s",
			    td_cuda_strerror(cu, r, err, sizeof(err)));
}

/* Pops what td_cuda_enter() pushed; keeps the reference when keep_ref. */
static void td_cuda_leave(const struct td_cuda_api *cu, CUdevice dev, bool keep_ref)
{
	CUcontext popped;

	cu->CtxPopCurrent(&popped);
	if (!keep_ref)
		cu->DevicePrimaryCtxRelease(dev);
}

static int td_cuda_fail(const struct td_cuda_api *cu, CUresult r, const char *what)
{
	char err[128];

	return td_set_error(td_cuda_errno(r), "%s: %s", what,
			    td_cuda_strerror(cu, r, err, sizeof(err)));
}

/*
 * Grants this device read-only (writable false) or read-write access to
 * p's VMM range. A driver that cannot map device memory read-only gets a
 * read-write mapping instead: the DLPack read-only flag still tells
 * consumers not to write (docs/gpu.md); ro_enforced says which it was.
 */
static CUresult td_cuda_set_access(struct td_cuda_map *p, bool writable)
{
	CUmemAccessDesc acc;
	CUresult r;

	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = p->ordinal;
	acc.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
	r = p->cu->MemSetAccess(p->ptr, p->size, &acc, 1);
	p->ro_enforced = !writable && r == CUDA_SUCCESS;
	if (!writable && (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE)) {
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		r = p->cu->MemSetAccess(p->ptr, p->size, &acc, 1);
	}
	return r;
}

/*
 * Reserves an address range, maps the imported allocation into it and
 * grants this device access: read-only unless writable. Takes ownership
 * of h: on success the mapping holds the memory, on failure it is
 * released.
 */
static int td_cuda_vmm_map(struct td_cuda_map *p, CUmemGenericAllocationHandle h, uint64_t size,
			   bool writable)
{
	const struct td_cuda_api *cu = p->cu;
	CUmemAllocationProp prop;
	size_t gran = 0;
	CUresult r;
	int err;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = p->dev;
	r = cu->MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS) {
		err = td_cuda_fail(cu, r, "cuMemGetAllocationGranularity");
		goto out_release;
	}
	if (size == 0 || size > SIZE_MAX || gran == 0 || size % gran != 0) {
		err = td_set_error(-EINVAL,
				   "CUDA allocation of %llu bytes does not fit the "
				   "device's granularity of %zu bytes",
				   (unsigned long long)size, gran);
		goto out_release;
	}
	r = cu->MemAddressReserve(&p->ptr, size, gran, 0, 0);
	if (r != CUDA_SUCCESS) {
		err = td_cuda_fail(cu, r, "cuMemAddressReserve");
		goto out_release;
	}
	r = cu->MemMap(p->ptr, size, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		err = td_cuda_fail(cu, r, "cuMemMap");
		goto out_free;
	}
	/* The mapping keeps the memory alive; our handle is no longer needed. */
	cu->MemRelease(h);
	p->size = size;

	r = td_cuda_set_access(p, writable);
	if (r != CUDA_SUCCESS) {
		err = td_cuda_fail(cu, r, "cuMemSetAccess");
		cu->MemUnmap(p->ptr, size);
		cu->MemAddressFree(p->ptr, size);
		return err;
	}
	return 0;

out_free:
	cu->MemAddressFree(p->ptr, size);
out_release:
	cu->MemRelease(h);
	return err;
}

/* HANDLE_CUDA_VMM_FD. Takes ownership of fd. */
static int td_cuda_map_vmm(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	const struct td_cuda_api *cu;
	CUmemGenericAllocationHandle h;
	struct td_cuda_map *p;
	int err, ordinal;
	CUresult r;

	err = td_cuda_load(&cu);
	if (err < 0)
		goto out_close;
	if (fd < 0) {
		err = td_set_error(-EPROTO, "CUDA lease came without a descriptor");
		goto out_close;
	}
	if (!td_cuda_api_has_vmm(cu)) {
		err = td_set_error(-ENODEV,
				   "this CUDA driver has no cuMemImportFromShareableHandle");
		goto out_close;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		err = td_set_error(-ENOMEM, "out of memory");
		goto out_close;
	}
	p->cu = cu;
	p->vmm = true;
	err = td_cuda_find_device(cu, d, &p->dev, &ordinal);
	if (err < 0)
		goto out_free;
	err = td_cuda_enter(cu, p->dev);
	if (err < 0)
		goto out_free;
	r = cu->MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	/* The imported handle does not need the descriptor any more. */
	close(fd);
	fd = -1;
	if (r != CUDA_SUCCESS) {
		err = td_cuda_fail(cu, r, "cuMemImportFromShareableHandle");
		td_cuda_leave(cu, p->dev, false);
		goto out_free;
	}
	p->ordinal = ordinal;
	err = td_cuda_vmm_map(p, h, d->map_size, d->writable);
	td_cuda_leave(cu, p->dev, err == 0);
	if (err < 0)
		goto out_free;
	m->base = (void *)(uintptr_t)p->ptr;
	m->data = (char *)m->base + d->ipc_offset;
	m->size = d->map_size;
	m->device = (DLDevice){ kDLCUDA, ordinal };
	m->priv = p;
	return 0;

out_free:
	free(p);
out_close:
	if (fd >= 0)
		close(fd);
	return err;
}

/* HANDLE_CUDA_IPC. Takes ownership of fd (there should be none). */
static int td_cuda_map_ipc(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	const struct td_cuda_api *cu;
	CUdeviceptr base = 0;
	struct td_cuda_map *p;
	CUipcMemHandle h;
	size_t range = 0;
	int err, ordinal;
	CUresult r;

	if (fd >= 0)
		close(fd);
	err = td_cuda_load(&cu);
	if (err < 0)
		return err;
	if (!d->ipc_handle || d->ipc_handle_len != sizeof(h))
		return td_set_error(-EPROTO, "CUDA IPC handle of %zu bytes, expected %zu",
				    d->ipc_handle_len, sizeof(h));
	if (d->ipc_offset > d->map_size)
		return td_set_error(-EPROTO, "CUDA IPC offset %llu beyond %llu bytes",
				    (unsigned long long)d->ipc_offset,
				    (unsigned long long)d->map_size);
	memcpy(&h, d->ipc_handle, sizeof(h));
	p = calloc(1, sizeof(*p));
	if (!p)
		return td_set_error(-ENOMEM, "out of memory");
	p->cu = cu;
	err = td_cuda_find_device(cu, d, &p->dev, &ordinal);
	if (err < 0)
		goto out_free;
	p->ordinal = ordinal;
	err = td_cuda_enter(cu, p->dev);
	if (err < 0)
		goto out_free;
	r = cu->IpcOpenMemHandle(&p->ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (r != CUDA_SUCCESS) {
		err = td_cuda_fail(cu, r, "cuIpcOpenMemHandle");
		td_cuda_leave(cu, p->dev, false);
		goto out_free;
	}
	/* Never trust the size we were told over what the driver mapped. */
	r = cu->MemGetAddressRange(&base, &range, p->ptr);
	if (r != CUDA_SUCCESS || range < d->map_size) {
		err = r != CUDA_SUCCESS ? td_cuda_fail(cu, r, "cuMemGetAddressRange")
					: td_set_error(-EPROTO,
						       "CUDA IPC mapping has %zu bytes, "
						       "the daemon said %llu",
						       range, (unsigned long long)d->map_size);
		cu->IpcCloseMemHandle(p->ptr);
		td_cuda_leave(cu, p->dev, false);
		goto out_free;
	}
	td_cuda_leave(cu, p->dev, true);
	m->base = (void *)(uintptr_t)p->ptr;
	m->data = (char *)m->base + d->ipc_offset;
	m->size = d->map_size;
	m->device = (DLDevice){ kDLCUDA, ordinal };
	m->priv = p;
	return 0;

out_free:
	free(p);
	return err;
}

/*
 * Undoes either map. Runs on any thread: pushes the primary context for
 * the calls (it is still retained by the mapping), then drops that
 * reference. Errors cannot be reported and leave nothing to retry.
 */
static void td_cuda_unmap(struct td_mapping *m)
{
	struct td_cuda_map *p = m->priv;
	const struct td_cuda_api *cu;
	CUcontext ctx;
	CUresult r;

	if (!p)
		return;
	/* Inherited across fork(): the mapping is not ours here, and the
	 * driver must not be called. Forget it. */
	if (td_gpu_forked_from)
		goto out;
	cu = p->cu;
	/* Retain once more to get the handle; the extra reference is dropped below. */
	r = cu->DevicePrimaryCtxRetain(&ctx, p->dev);
	if (r == CUDA_SUCCESS && cu->CtxPushCurrent(ctx) == CUDA_SUCCESS) {
		/*
		 * Consumers (torch, cupy) call the DLPack deleter as soon as
		 * their array object dies, with kernels that read it possibly
		 * still queued on any stream of the context: wait for them, as
		 * torch's own allocator does before cuMemUnmap, or they fault.
		 */
		cu->CtxSynchronize();
		if (p->vmm) {
			cu->MemUnmap(p->ptr, p->size);
			cu->MemAddressFree(p->ptr, p->size);
		} else {
			cu->IpcCloseMemHandle(p->ptr);
		}
		cu->CtxPopCurrent(&ctx);
	}
	if (r == CUDA_SUCCESS)
		cu->DevicePrimaryCtxRelease(p->dev);
	/* The reference map() kept. */
	cu->DevicePrimaryCtxRelease(p->dev);
out:
	free(p);
	m->priv = NULL;
	m->base = m->data = NULL;
}

/*
 * Publish by the creator: the runtime and frameworks write through the
 * device's primary context, so synchronizing it waits for every stream's
 * queued work on this tensor (and, conservatively, any other).
 */
static int td_cuda_sync(struct td_mapping *m)
{
	struct td_cuda_map *p = m->priv;
	CUresult r;
	int err;

	if (!p)
		return 0;
	err = td_cuda_enter(p->cu, p->dev);
	if (err < 0)
		return err;
	r = p->cu->CtxSynchronize();
	td_cuda_leave(p->cu, p->dev, false);
	if (r != CUDA_SUCCESS)
		return td_cuda_fail(p->cu, r, "synchronizing the device before publish");
	return 0;
}

/*
 * Unified addressing lets cuMemcpyAsync find both sides: device to device,
 * on the legacy default stream, which put() asked the producer to order its
 * writes before (td_gpu_put_stream()); then waits for that stream.
 */
static int td_cuda_copy_in(struct td_mapping *m, const void *src, uint64_t n)
{
	struct td_cuda_map *p = m->priv;
	CUresult r;
	int err;

	if (!p)
		return td_set_error(-EINVAL, "tensor '%s' is not mapped", m->name);
	err = td_cuda_enter(p->cu, p->dev);
	if (err < 0)
		return err;
	r = p->cu->MemcpyAsync((CUdeviceptr)(uintptr_t)m->data, (CUdeviceptr)(uintptr_t)src,
			       (size_t)n, CU_STREAM_LEGACY);
	if (r == CUDA_SUCCESS)
		r = p->cu->StreamSynchronize(CU_STREAM_LEGACY);
	td_cuda_leave(p->cu, p->dev, false);
	if (r != CUDA_SUCCESS)
		return td_cuda_fail(p->cu, r, "copying device memory into the tensor");
	return 0;
}

/*
 * Publish of an immutable tensor by its creator: GPU memory has no private
 * copy to fall back on, so the creator's own mapping becomes read-only
 * instead (a later write through it faults on the device; docs/gpu.md).
 * make_shared() undoes it when the publish failed.
 */
static int td_cuda_protect(struct td_mapping *m, bool writable)
{
	struct td_cuda_map *p = m->priv;
	CUresult r;
	int err;

	if (!p || !p->vmm)
		return 0;
	err = td_cuda_enter(p->cu, p->dev);
	if (err < 0)
		return err;
	r = td_cuda_set_access(p, writable);
	td_cuda_leave(p->cu, p->dev, false);
	if (r != CUDA_SUCCESS)
		return td_cuda_fail(p->cu, r,
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

const struct td_importer td_importer_cuda = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD,
	.map = td_cuda_map_vmm,
	.unmap = td_cuda_unmap,
	.make_private = td_cuda_make_private,
	.make_shared = td_cuda_make_shared,
	.sync = td_cuda_sync,
	.copy_in = td_cuda_copy_in,
};

const struct td_importer td_importer_cuda_ipc = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC,
	.unmap_before_close = true,
	.map = td_cuda_map_ipc,
	.unmap = td_cuda_unmap,
	/* Legacy IPC has no read-only mapping: the DLPack flag is all there is. */
	.make_private = NULL,
	.sync = td_cuda_sync,
	.copy_in = td_cuda_copy_in,
};
