/*
 * Importer for ROCm HIP memory, HANDLE_HIP_IPC: 64 hipIpcMemHandle_t bytes
 * opened with hipIpcOpenMemHandle, on what every vendor's importers share
 * (client/lib/import_gpu.h: loading libamdhip64 on the first HIP import,
 * the device by UUID, the legacy IPC import, unmap after a wait, sync and
 * copy_in). What is HIP's own is here: the runtime calls td_hip_client
 * gives the shared code.
 *
 * The device is found by UUID when the daemon sent one and the runtime can
 * report them (HIP_VISIBLE_DEVICES may renumber GPUs per process), else by
 * the daemon's ordinal. Driver calls run with our device made current and
 * the thread's previous device restored afterwards, so the application's
 * choice of device is left alone on whatever thread we run.
 *
 * HIP IPC cannot map read-only: immutable tensors rely on the DLPack
 * read-only flag (docs/gpu.md).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "client/lib/import_gpu.h"
#include "gpu/hip/hip_api.h"

static int td_hip_get(const void **ret_api, const char **ret_why)
{
	const struct td_hip_api *hip;
	int err = td_hip_api_get(&hip, ret_why);

	if (err == 0)
		*ret_api = hip;
	return err;
}

static int td_hip_errno_of(int r)
{
	return td_hip_errno((hipError_t)r);
}

static const char *td_hip_strerror_of(const void *api, int r, char *buf, size_t len)
{
	return td_hip_strerror(api, (hipError_t)r, buf, len);
}

/* Without hipDeviceGetUuid (older runtimes) *ret_have is false: the daemon goes by ordinal. */
static int td_hip_uuids(const void *api, uint8_t (*uuids)[TD_GPU_UUID_LEN], int *ret_n,
			bool *ret_have)
{
	const struct td_hip_api *hip = api;
	int n = 0;
	hipError_t e;

	e = hip->GetDeviceCount(&n);
	if (e != hipSuccess)
		return td_gpu_fail(&td_hip_client, hip, e, "hipGetDeviceCount");
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	*ret_n = n;
	*ret_have = hip->DeviceGetUuid != NULL;
	for (int i = 0; i < n && *ret_have; i++) {
		hipDevice_t dev;
		hipUUID u;

		e = hip->DeviceGet(&dev, i);
		if (e == hipSuccess)
			e = hip->DeviceGetUuid(&u, dev);
		if (e != hipSuccess)
			return td_gpu_fail(&td_hip_client, hip, e, "hipDeviceGetUuid");
		memcpy(uuids[i], u.bytes, TD_GPU_UUID_LEN);
	}
	return 0;
}

static int td_hip_not_seen(int daemon_id, const char *uuid, int n)
{
	return td_set_error(-ENODEV,
			    "the daemon's rocm:%d (uuid %s) is not visible here "
			    "(%d HIP devices; check HIP_VISIBLE_DEVICES)",
			    daemon_id, uuid, n);
}

/* Gives the thread back the device it had before td_hip_enter(). */
static void td_hip_leave(struct td_gpu_map *p, struct td_gpu_scope *s)
{
	const struct td_hip_api *hip = p->api;

	if (s->prev_device >= 0 && s->prev_device != p->ordinal)
		(void)hip->SetDevice(s->prev_device);
}

/* Makes p's device current, remembering the thread's. */
static int td_hip_enter(struct td_gpu_map *p, struct td_gpu_scope *s, const char *what)
{
	const struct td_hip_api *hip = p->api;
	hipError_t e;

	if (hip->GetDevice(&s->prev_device) != hipSuccess)
		s->prev_device = -1;
	e = hip->SetDevice(p->ordinal);
	if (e == hipSuccess)
		return 0;
	td_hip_leave(p, s);
	return what ? td_gpu_fail(&td_hip_client, hip, e, what) : td_hip_errno(e);
}

/* Every stream of the device. */
static int td_hip_synchronize(struct td_gpu_map *p)
{
	const struct td_hip_api *hip = p->api;

	return hip->DeviceSynchronize();
}

/* DLPack numbers ROCm's streams as the runtime does: 0 is the null stream. */
static int td_hip_copy(struct td_gpu_map *p, void *dst, const void *src, size_t n, long stream)
{
	const struct td_hip_api *hip = p->api;
	hipStream_t st = (hipStream_t)(uintptr_t)stream;
	hipError_t e;

	e = hip->MemcpyAsync(dst, src, n, hipMemcpyDefault, st);
	if (e == hipSuccess)
		e = hip->StreamSynchronize(st);
	return e;
}

/* The open flag as the loaded runtime understands it (td_hip_ipc_flag()). */
static int td_hip_ipc_open(struct td_gpu_map *p, const uint8_t *handle, uint64_t map_size,
			   bool opened)
{
	const struct td_hip_api *hip = p->api;
	unsigned int flags = (unsigned int)td_hip_ipc_flag(hip->runtime_version);
	struct td_gpu_scope s;
	hipIpcMemHandle_t h;
	void *ptr = NULL;
	hipError_t e;
	int err;

	if (opened)
		return 0; /* a mapping holds nothing of the device */
	memcpy(&h, handle, sizeof(h));
	err = td_hip_enter(p, &s, "hipIpcOpenMemHandle");
	if (err < 0)
		return err;
	e = hip->IpcOpenMemHandle(&ptr, h, flags);
	td_hip_leave(p, &s);
	if (e != hipSuccess)
		return td_gpu_fail(&td_hip_client, hip, e, "hipIpcOpenMemHandle");
	p->ptr = (uint64_t)(uintptr_t)ptr;
	return 0;
}

static void td_hip_ipc_undo(struct td_gpu_map *p, uint64_t value)
{
	const struct td_hip_api *hip = p->api;

	(void)hip->IpcCloseMemHandle((void *)(uintptr_t)value);
}

/* The IPC handle closed with the process's last mapping of it (import_gpu.h). */
static void td_hip_release(struct td_gpu_map *p)
{
	if (p->shared)
		td_gpu_shared_drop(p, td_hip_ipc_undo);
	else
		td_hip_ipc_undo(p, p->ptr); /* opened, and never shared (out of memory) */
}

static int td_hip_map(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	return td_gpu_map_ipc(&td_hip_client, m, fd, d);
}

const struct td_gpu_client td_hip_client = {
	.device_type = TD_GPU_TYPE_hip,
	.visible_env = "HIP_VISIBLE_DEVICES",
	.loaded = "loaded the HIP runtime",
	.ordinal_fallback = true,
	.map_size = sizeof(struct td_gpu_map),
	.ipc_handle_len = sizeof(hipIpcMemHandle_t),
	.get = td_hip_get,
	.in_use = td_hip_api_in_use,
	.errno_of = td_hip_errno_of,
	.strerror = td_hip_strerror_of,
	.uuids = td_hip_uuids,
	.not_seen = td_hip_not_seen,
	.enter = td_hip_enter,
	.leave = td_hip_leave,
	.synchronize = td_hip_synchronize,
	.copy = td_hip_copy,
	.ipc_open = td_hip_ipc_open,
	.release = td_hip_release,
	.drop = NULL,
};

const struct td_importer td_importer_hip = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC,
	.unmap_before_close = true,
	.map = td_hip_map,
	.unmap = td_gpu_unmap,
	/* HIP IPC has no read-only mapping: the DLPack flag is all there is. */
	.make_private = NULL,
	.sync = td_gpu_sync,
	.copy_in = td_gpu_copy_in,
};
