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
 * it. freeze() cannot protect GPU memory and does nothing; immutability
 * relies on clients honouring the DLPack read-only flag (HIP IPC has no
 * read-only mapping).
 *
 * The daemon must never fork() after init.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensord/dlpack.h>

#include "daemon/backend.h"
#include "gpu/gpu_util.h"
#include "gpu/hip/hip_api.h"
#include "daemon/gpu_worker.h"
#include "daemon/log.h"

#define HIP_GRANULARITY (2ull << 20)

struct hip_dev {
	hipDevice_t dev;
	uint8_t uuid[TD_GPU_UUID_LEN];
	bool has_uuid; /* unique and not blank; else clients match by ordinal */
	uint64_t total;
};

/* What one allocation holds; a->priv. */
struct hip_mem {
	int ordinal;
	void *ptr;
};

static const struct td_hip_api *hip_api;
static struct hip_dev *hip_devs;
static int hip_ndevs;

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
	hip_devs = calloc((size_t)n, sizeof(*hip_devs));
	if (!hip_devs) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		struct hip_dev *d = &hip_devs[i];
		size_t total = 0;
		hipUUID u;

		e = hip_api->DeviceGet(&d->dev, i);
		if (e == hipSuccess)
			e = hip_api->DeviceTotalMem(&total, d->dev);
		if (e != hipSuccess) {
			snprintf(why, why_len, "%s: device %d: %s", hip_api->libname, i,
				 td_hip_strerror(hip_api, e, err, sizeof(err)));
			free(hip_devs);
			hip_devs = NULL;
			return -ENODEV;
		}
		d->total = total;
		if (hip_api->DeviceGetUuid && hip_api->DeviceGetUuid(&u, d->dev) == hipSuccess) {
			memcpy(d->uuid, u.bytes, sizeof(d->uuid));
			d->has_uuid = !td_gpu_uuid_is_blank(d->uuid);
		}
	}
	/* A UUID shared by two devices identifies neither. */
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (hip_devs[i].has_uuid && hip_devs[j].has_uuid &&
			    memcmp(hip_devs[i].uuid, hip_devs[j].uuid, TD_GPU_UUID_LEN) == 0)
				hip_devs[i].has_uuid = hip_devs[j].has_uuid = false;
	for (int i = 0; i < n; i++)
		log_debug("hip: device %d, %llu bytes, %s, runtime %d", i,
			  (unsigned long long)hip_devs[i].total,
			  hip_devs[i].has_uuid ? "uuid"
					       : "no usable uuid (clients match by ordinal)",
			  hip_api->runtime_version);
	hip_ndevs = n;
	return 0;
}

static int hip_backend_device_count(void)
{
	return hip_ndevs;
}

static int hip_backend_device_uuid(int device_id, uint8_t uuid[16])
{
	if (device_id < 0 || device_id >= hip_ndevs)
		return -ENODEV;
	if (!hip_devs[device_id].has_uuid)
		return -ENOENT;
	memcpy(uuid, hip_devs[device_id].uuid, TD_GPU_UUID_LEN);
	return 0;
}

/* Half of the device's memory, as for CUDA and host memory. */
static uint64_t hip_backend_default_capacity(int device_id)
{
	if (device_id < 0 || device_id >= hip_ndevs)
		return 0;
	return hip_devs[device_id].total / 2;
}

static const char *hip_backend_path(int device_id)
{
	return device_id >= 0 && device_id < hip_ndevs ? "hip-ipc" : "none";
}

/* Out of device memory is "no space" to the user. */
static int hip_alloc_errno(hipError_t e)
{
	int err = td_hip_errno(e);

	return err == -ENOMEM ? -ENOSPC : err;
}

static int hip_backend_alloc(struct backend_alloc *a, uint64_t size, int device_id,
			     const char *name)
{
	hipIpcMemHandle_t h;
	struct hip_mem *m;
	uint64_t rounded;
	hipError_t e;

	a->fd = -1;
	a->priv = NULL;
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_NONE;
	a->ipc_handle_len = 0;
	a->ipc_offset = 0;
	a->size = 0;
	a->footprint = 0;
	if (device_id < 0 || device_id >= hip_ndevs)
		return -ENODEV;
	a->device_id = device_id;
	if (size == 0)
		return 0;
	if (td_gpu_round_up(size, HIP_GRANULARITY, &rounded) < 0)
		return -ENOSPC;
	e = hip_api->SetDevice(device_id);
	if (e != hipSuccess)
		return td_hip_errno(e);
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->ordinal = device_id;
	a->priv = m;
	a->size = rounded;
	a->footprint = rounded;
	e = hip_api->Malloc(&m->ptr, rounded);
	if (e != hipSuccess) {
		m->ptr = NULL;
		return hip_alloc_errno(e);
	}
	/* hipMemset may return before the zeroes land; wait for them. */
	e = hip_api->Memset(m->ptr, 0, rounded);
	if (e == hipSuccess)
		e = hip_api->DeviceSynchronize();
	/* The handle names the start of our own allocation: offset 0. */
	if (e == hipSuccess)
		e = hip_api->IpcGetMemHandle(&h, m->ptr);
	if (e != hipSuccess)
		return hip_alloc_errno(e);
	_Static_assert(sizeof(h) <= BACKEND_IPC_HANDLE_MAX, "IPC handle size");
	memcpy(a->ipc_handle, &h, sizeof(h));
	a->ipc_handle_len = sizeof(h);
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC;
	return 0;
}

/* HIP IPC handles travel as bytes: no descriptor. */
static int hip_backend_export_fd(struct backend_alloc *a, bool writable, int *ret_fd)
{
	*ret_fd = -1;
	return 0;
}

static int hip_backend_freeze(struct backend_alloc *a)
{
	/* Not enforceable from here; see the comment at the top of the file. */
	return 0;
}

/* On the GPU worker's thread (gpu_worker.h): hipFree may wait for the device. */
static void hip_free_job(void *arg)
{
	struct hip_mem *m = arg;

	if (m->ptr && hip_api->SetDevice(m->ordinal) == hipSuccess)
		(void)hip_api->Free(m->ptr);
	free(m);
}

/* Runs only after the last lease ended (the daemon exports; see the top). */
static void hip_backend_release(struct backend_alloc *a)
{
	struct hip_mem *m = a->priv;

	if (a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
	}
	if (!m)
		return;
	gpu_worker_run(hip_free_job, m);
	a->priv = NULL;
}

/* At exit, after every allocation was released: forget the devices. */
static void hip_backend_fini(void)
{
	gpu_worker_stop();
	free(hip_devs);
	hip_devs = NULL;
	hip_ndevs = 0;
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
	.export_fd = hip_backend_export_fd,
	.freeze = hip_backend_freeze,
	.release = hip_backend_release,
};
