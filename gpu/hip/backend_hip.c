/*
 * ROCm HIP device memory, devices "rocm:N", path "hip-ipc".
 *
 * hipMalloc + hipIpcGetMemHandle; the 64 handle bytes travel in the reply
 * and the client opens them with hipIpcOpenMemHandle. As with legacy CUDA
 * IPC the daemon is the exporter: release() frees at once, so it must run
 * only after every client mapping is gone, and a daemon crash takes
 * clients' mappings with it. HIP handles embed the exporter's pid, so the
 * clients must share the daemon's pid namespace. HIP IPC events are never
 * used: opening one makes the opener create a POSIX shm object named by
 * the peer.
 *
 * One hipMalloc per tensor, rounded to 2 MiB and zeroed before anyone sees
 * it (the legacy IPC export every vendor shares, daemon/memory/backend_gpu.h).
 * freeze() cannot protect GPU memory and does nothing; immutability
 * relies on clients honouring the DLPack read-only flag (HIP IPC has no
 * read-only mapping). Frees run on the GPU worker, after the last lease
 * ended (the daemon exports).
 *
 * The daemon must never fork() after init.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "daemon/memory/backend_gpu.h"
#include "daemon/memory/gpu_worker.h"
#include "daemon/base/log.h"
#include "gpu/gpu_util.h"
#include "gpu/hip/hip_api.h"

#define HIP_GRANULARITY (2ull << 20)

static const struct td_hip_api *hip_api;
static struct gpu_devs hip_gpu;

static int hip_backend_init(char *why, size_t why_len)
{
	const char *reason = NULL;
	char err[128];
	int rc, n = 0;
	hipError_t e;

	rc = td_hip_api_get(&hip_api, &reason);
	if (rc < 0) {
		snprintf(why, why_len, "%s", reason);
		return rc;
	}
	e = hip_api->GetDeviceCount(&n);
	if (e != hipSuccess || n <= 0) {
		snprintf(why, why_len, "%s: hipGetDeviceCount: %s", hip_api->libname,
			 e != hipSuccess ? td_hip_strerror(hip_api, e, err, sizeof(err))
					 : "no device");
		return -ENODEV;
	}
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	memset(&hip_gpu, 0, sizeof(hip_gpu));
	for (int i = 0; i < n; i++) {
		struct gpu_dev *d = &hip_gpu.dev[i];
		hipDevice_t dev;
		size_t total = 0;
		hipUUID u;

		e = hip_api->DeviceGet(&dev, i);
		if (e == hipSuccess)
			e = hip_api->DeviceTotalMem(&total, dev);
		if (e != hipSuccess) {
			snprintf(why, why_len, "%s: device %d: %s", hip_api->libname, i,
				 td_hip_strerror(hip_api, e, err, sizeof(err)));
			return -ENODEV;
		}
		d->total = total;
		if (hip_api->DeviceGetUuid && hip_api->DeviceGetUuid(&u, dev) == hipSuccess) {
			memcpy(d->uuid, u.bytes, sizeof(d->uuid));
			d->has_uuid = !td_gpu_uuid_is_blank(d->uuid);
		}
	}
	/* A UUID shared by two devices identifies neither. */
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (hip_gpu.dev[i].has_uuid && hip_gpu.dev[j].has_uuid &&
			    memcmp(hip_gpu.dev[i].uuid, hip_gpu.dev[j].uuid, TD_GPU_UUID_LEN) == 0)
				hip_gpu.dev[i].has_uuid = hip_gpu.dev[j].has_uuid = false;
	for (int i = 0; i < n; i++)
		log_debug("hip: device %d, %llu bytes, %s, runtime %d", i,
			  (unsigned long long)hip_gpu.dev[i].total,
			  hip_gpu.dev[i].has_uuid ? "uuid"
						  : "no usable uuid (clients match by ordinal)",
			  hip_api->runtime_version);
	hip_gpu.n = n;
	return 0;
}

static int hip_backend_device_count(void)
{
	return hip_gpu.n;
}

static int hip_backend_device_uuid(int device_id, uint8_t uuid[16])
{
	return gpu_device_uuid(&hip_gpu, device_id, uuid);
}

static uint64_t hip_backend_default_capacity(int device_id)
{
	return gpu_default_capacity(&hip_gpu, device_id);
}

static const char *hip_backend_path(int device_id)
{
	return device_id >= 0 && device_id < hip_gpu.n ? "hip-ipc" : "none";
}

/* Legacy IPC (gpu_ipc_alloc()), on the device made current. */
static int hip_ipc_alloc(uint64_t *ret_ptr, uint64_t size)
{
	void *p = NULL;
	hipError_t e = hip_api->Malloc(&p, size);

	*ret_ptr = (uint64_t)(uintptr_t)p;
	return td_hip_errno(e);
}

static int hip_ipc_zero(uint64_t ptr, uint64_t size)
{
	return td_hip_errno(hip_api->Memset((void *)(uintptr_t)ptr, 0, size));
}

static int hip_ipc_sync(void)
{
	return td_hip_errno(hip_api->DeviceSynchronize());
}

static int hip_ipc_handle(uint8_t *handle, uint64_t ptr)
{
	hipIpcMemHandle_t h;
	hipError_t e = hip_api->IpcGetMemHandle(&h, (void *)(uintptr_t)ptr);

	if (e == hipSuccess)
		memcpy(handle, &h, sizeof(h));
	return td_hip_errno(e);
}

_Static_assert(sizeof(hipIpcMemHandle_t) <= BACKEND_IPC_HANDLE_MAX, "IPC handle size");

static const struct gpu_ipc_ops hip_ipc = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC,
	.handle_len = sizeof(hipIpcMemHandle_t),
	.alloc = hip_ipc_alloc,
	.zero = hip_ipc_zero,
	.sync = hip_ipc_sync,
	.handle = hip_ipc_handle,
};

/* On the GPU worker (gpu_release()): hipFree may wait for the device. */
static void hip_free(struct gpu_mem *m)
{
	if (m->ptr && hip_api->SetDevice(m->ordinal) == hipSuccess)
		(void)hip_api->Free((void *)(uintptr_t)m->ptr);
}

static int hip_backend_alloc(struct backend_alloc *a, uint64_t size, int device_id,
			     const char *name)
{
	int err = gpu_alloc_begin(a, &hip_gpu, device_id);
	struct gpu_mem *m;
	uint64_t rounded;
	hipError_t e;

	if (err < 0 || size == 0)
		return err;
	if (td_gpu_round_up(size, HIP_GRANULARITY, &rounded) < 0)
		return -ENOSPC;
	e = hip_api->SetDevice(device_id);
	if (e != hipSuccess)
		return td_hip_errno(e);
	m = gpu_mem_new(sizeof(*m), device_id, hip_free);
	if (!m)
		return -ENOMEM;
	a->priv = m;
	a->size = rounded;
	a->footprint = rounded;
	return gpu_ipc_alloc(&hip_ipc, a, m, rounded);
}

/* backend_ops.copy, on the worker: a synchronous copy, then the device synchronized. */
static int hip_backend_copy(struct backend_alloc *a, uint64_t off, void *buf, size_t n,
			    bool to_host)
{
	struct gpu_mem *m = a->priv;
	void *dev;
	hipError_t e;

	if (n == 0)
		return 0;
	/* A member of a set allocation starts at its offset in it (backend.h, arenas). */
	if (!m || !m->ptr || a->ipc_offset > a->size || off > a->size - a->ipc_offset ||
	    n > a->size - a->ipc_offset - off)
		return -EINVAL;
	off += a->ipc_offset;
	e = hip_api->SetDevice(m->ordinal);
	if (e != hipSuccess)
		return td_hip_errno(e);
	dev = (void *)(uintptr_t)(m->ptr + off);
	e = to_host ? hip_api->Memcpy(buf, dev, n, hipMemcpyDefault)
		    : hip_api->Memcpy(dev, buf, n, hipMemcpyDefault);
	if (e == hipSuccess)
		e = hip_api->DeviceSynchronize();
	return td_hip_errno(e);
}

/* At exit, after every allocation was released: forget the devices. */
static void hip_backend_fini(void)
{
	gpu_worker_stop();
	hip_gpu.n = 0;
}

const struct backend_ops backend_hip = {
	BACKEND_GPU_VENDOR(hip),
	.init = hip_backend_init,
	.fini = hip_backend_fini,
	.device_count = hip_backend_device_count,
	.device_uuid = hip_backend_device_uuid,
	.default_capacity = hip_backend_default_capacity,
	.path = hip_backend_path,
	.alloc = hip_backend_alloc,
	.alloc_blocks = true,
	/* A set is one hipMalloc, its IPC handle opened once per process. */
	.arenas = true,
	.export_fd = gpu_export_fd,
	.freeze = gpu_freeze,
	.release = gpu_release,
	.copy = hip_backend_copy,
};
