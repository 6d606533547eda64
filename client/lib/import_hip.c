/*
 * Importer for ROCm HIP memory, HANDLE_HIP_IPC: 64 hipIpcMemHandle_t bytes
 * opened with hipIpcOpenMemHandle. libamdhip64 is loaded on the first HIP
 * import (td_hip_api_get(), once per process).
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
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "common/gpu/gpu_util.h"
#include "common/gpu/hip_api.h"

struct td_hip_map {
	const struct td_hip_api *hip;
	int ordinal;
	void *ptr;
};

static int td_hip_fail(const struct td_hip_api *hip, hipError_t e, const char *what)
{
	char err[128];

	return td_set_error(td_hip_errno(e), "%s: %s", what,
			    td_hip_strerror(hip, e, err, sizeof(err)));
}

/* The local ordinal for the daemon's device. 0 or -ENODEV (error set). */
static int td_hip_find_device(const struct td_hip_api *hip, const struct td_import_desc *d,
			      int *ret_ordinal)
{
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	char ustr[48];
	int n = 0, ord;
	hipError_t e;

	e = hip->GetDeviceCount(&n);
	if (e != hipSuccess)
		return td_hip_fail(hip, e, "hipGetDeviceCount");
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	ord = d->device.device_id;
	if (d->uuid && d->uuid_len == TD_GPU_UUID_LEN && hip->DeviceGetUuid) {
		for (int i = 0; i < n; i++) {
			hipDevice_t dev;
			hipUUID u;

			e = hip->DeviceGet(&dev, i);
			if (e == hipSuccess)
				e = hip->DeviceGetUuid(&u, dev);
			if (e != hipSuccess)
				return td_hip_fail(hip, e, "hipDeviceGetUuid");
			memcpy(uuids[i], u.bytes, TD_GPU_UUID_LEN);
		}
		ord = td_gpu_uuid_find(d->uuid, d->uuid_len,
				       (const uint8_t (*)[TD_GPU_UUID_LEN])uuids, n);
		if (ord < 0)
			return td_set_error(-ENODEV,
					    "the daemon's rocm:%d (uuid %s) is not visible here "
					    "(%d HIP devices; check HIP_VISIBLE_DEVICES)",
					    d->device.device_id,
					    td_gpu_uuid_format(d->uuid, d->uuid_len, ustr, sizeof(ustr)),
					    n);
	}
	if (ord < 0 || ord >= n)
		return td_set_error(-ENODEV, "rocm:%d: only %d HIP devices here", ord, n);
	*ret_ordinal = ord;
	return 0;
}

/* HANDLE_HIP_IPC. Takes ownership of fd (there should be none). */
static int td_hip_map(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	const struct td_hip_api *hip;
	const char *why = NULL;
	struct td_hip_map *p;
	hipIpcMemHandle_t h;
	int err, ordinal, prev = -1;
	hipError_t e;

	if (fd >= 0)
		close(fd);
	err = td_hip_api_get(&hip, &why);
	if (err < 0)
		return td_set_error(err, "cannot import HIP memory: %s", why);
	if (!d->ipc_handle || d->ipc_handle_len != sizeof(h))
		return td_set_error(-EPROTO, "HIP IPC handle of %zu bytes, expected %zu",
				    d->ipc_handle_len, sizeof(h));
	if (d->ipc_offset > d->map_size)
		return td_set_error(-EPROTO, "HIP IPC offset %llu beyond %llu bytes",
				    (unsigned long long)d->ipc_offset,
				    (unsigned long long)d->map_size);
	memcpy(&h, d->ipc_handle, sizeof(h));
	err = td_hip_find_device(hip, d, &ordinal);
	if (err < 0)
		return err;
	p = calloc(1, sizeof(*p));
	if (!p)
		return td_set_error(-ENOMEM, "out of memory");
	p->hip = hip;
	p->ordinal = ordinal;
	if (hip->GetDevice(&prev) != hipSuccess)
		prev = -1;
	e = hip->SetDevice(ordinal);
	if (e != hipSuccess) {
		err = td_hip_fail(hip, e, "hipSetDevice");
		goto out_free;
	}
	e = hip->IpcOpenMemHandle(&p->ptr, h, (unsigned int)td_hip_ipc_flag(hip->runtime_version));
	if (prev >= 0)
		(void)hip->SetDevice(prev);
	if (e != hipSuccess) {
		err = td_hip_fail(hip, e, "hipIpcOpenMemHandle");
		goto out_free;
	}
	m->base = p->ptr;
	m->data = (char *)p->ptr + d->ipc_offset;
	m->size = d->map_size;
	m->device = (DLDevice){ kDLROCM, ordinal };
	m->priv = p;
	return 0;

out_free:
	free(p);
	return err;
}

/* Never fails; may run on any thread. */
static void td_hip_unmap(struct td_mapping *m)
{
	struct td_hip_map *p = m->priv;
	int prev = -1;

	if (!p)
		return;
	if (p->hip->GetDevice(&prev) != hipSuccess)
		prev = -1;
	if (p->hip->SetDevice(p->ordinal) == hipSuccess)
		(void)p->hip->IpcCloseMemHandle(p->ptr);
	if (prev >= 0 && prev != p->ordinal)
		(void)p->hip->SetDevice(prev);
	free(p);
	m->priv = NULL;
	m->base = m->data = NULL;
}

const struct td_importer td_importer_hip = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC,
	.map = td_hip_map,
	.unmap = td_hip_unmap,
	.make_private = NULL,
};
