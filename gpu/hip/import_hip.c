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

#include "client/lib/client.h"
#include "gpu/gpu_util.h"
#include "gpu/hip/hip_api.h"

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

/* Loads libamdhip64 (once) and says why not in the thread's error. */
static int td_hip_load(const struct td_hip_api **ret_hip)
{
	const char *why = NULL;
	int err;

	if (td_gpu_forked_from)
		return td_set_error(
			-ENODEV,
			"cannot use HIP memory in this process: it was forked from "
			"process %d after tensord loaded the HIP runtime there, and HIP "
			"does not survive fork(); start it with the 'spawn' or "
			"'forkserver' method instead",
			td_gpu_forked_from);
	err = td_hip_api_get(ret_hip, &why);

	if (err < 0)
		return td_set_error(err, "cannot use HIP memory: %s", why);
	return 0;
}

/*
 * Fills uuids[i] for this process's devices; *ret_n is their number, and
 * *ret_have_uuids false when the runtime cannot report UUIDs.
 */
static int td_hip_uuids(const struct td_hip_api *hip, uint8_t (*uuids)[TD_GPU_UUID_LEN], int *ret_n,
			bool *ret_have_uuids)
{
	int n = 0;
	hipError_t e;

	e = hip->GetDeviceCount(&n);
	if (e != hipSuccess)
		return td_hip_fail(hip, e, "hipGetDeviceCount");
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	*ret_n = n;
	*ret_have_uuids = hip->DeviceGetUuid != NULL;
	for (int i = 0; i < n && *ret_have_uuids; i++) {
		hipDevice_t dev;
		hipUUID u;

		e = hip->DeviceGet(&dev, i);
		if (e == hipSuccess)
			e = hip->DeviceGetUuid(&u, dev);
		if (e != hipSuccess)
			return td_hip_fail(hip, e, "hipDeviceGetUuid");
		memcpy(uuids[i], u.bytes, TD_GPU_UUID_LEN);
	}
	return 0;
}

int td_hip_ordinal_of_uuid(const uint8_t *uuid, size_t uuid_len, int daemon_id, int *ret_ordinal)
{
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	const struct td_hip_api *hip;
	bool have = false;
	char ustr[48];
	int n = 0, ord = daemon_id, err;

	err = td_hip_load(&hip);
	if (err == 0)
		err = td_hip_uuids(hip, uuids, &n, &have);
	if (err < 0)
		return err;
	/* Without a UUID on either side the ordinals are all there is. */
	if (uuid && uuid_len == TD_GPU_UUID_LEN && have) {
		ord = td_gpu_uuid_find(uuid, uuid_len, (const uint8_t(*)[TD_GPU_UUID_LEN])uuids, n);
		if (ord < 0)
			return td_set_error(-ENODEV,
					    "the daemon's rocm:%d (uuid %s) is not visible here "
					    "(%d HIP devices; check HIP_VISIBLE_DEVICES)",
					    daemon_id,
					    td_gpu_uuid_format(uuid, uuid_len, ustr, sizeof(ustr)),
					    n);
	}
	if (ord < 0 || ord >= n)
		return td_set_error(-ENODEV, "rocm:%d: only %d HIP devices here", ord, n);
	*ret_ordinal = ord;
	return 0;
}

int td_hip_uuid_of_ordinal(int ordinal, uint8_t uuid[TD_GPU_UUID_LEN])
{
	uint8_t uuids[TD_GPU_MAX_DEVICES][TD_GPU_UUID_LEN];
	const struct td_hip_api *hip;
	bool have = false;
	int n = 0, err;

	err = td_hip_load(&hip);
	if (err == 0)
		err = td_hip_uuids(hip, uuids, &n, &have);
	if (err < 0)
		return err;
	if (ordinal < 0 || ordinal >= n)
		return td_set_error(-ENODEV,
				    "rocm:%d: this process sees %d HIP devices "
				    "(check HIP_VISIBLE_DEVICES)",
				    ordinal, n);
	/* No usable UUID: the daemon goes by the ordinal. */
	if (!have || td_gpu_uuid_is_blank(uuids[ordinal]))
		return -ENOENT;
	memcpy(uuid, uuids[ordinal], TD_GPU_UUID_LEN);
	return 0;
}

/*
 * Runs fn(p, ctx) with p's device current on this thread, and the thread's
 * previous device restored afterwards. Returns fn's hipError_t.
 */
static hipError_t td_hip_on_device(struct td_hip_map *p,
				   hipError_t (*fn)(struct td_hip_map *p, void *ctx), void *ctx)
{
	int prev = -1;
	hipError_t e;

	if (p->hip->GetDevice(&prev) != hipSuccess)
		prev = -1;
	e = p->hip->SetDevice(p->ordinal);
	if (e == hipSuccess)
		e = fn(p, ctx);
	if (prev >= 0 && prev != p->ordinal)
		(void)p->hip->SetDevice(prev);
	return e;
}

struct td_hip_open {
	hipIpcMemHandle_t h;
	unsigned int flags;
};

static hipError_t td_hip_open(struct td_hip_map *p, void *ctx)
{
	const struct td_hip_open *o = ctx;

	return p->hip->IpcOpenMemHandle(&p->ptr, o->h, o->flags);
}

/*
 * Consumers (torch, cupy) call the DLPack deleter as soon as their array
 * object dies, with kernels that read it possibly still queued: wait for
 * the device before the memory goes from under them.
 */
static hipError_t td_hip_close(struct td_hip_map *p, void *ctx)
{
	(void)p->hip->DeviceSynchronize();
	return p->hip->IpcCloseMemHandle(p->ptr);
}

/* HANDLE_HIP_IPC. Takes ownership of fd (there should be none). */
static int td_hip_map(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	const struct td_hip_api *hip;
	struct td_hip_open o;
	struct td_hip_map *p;
	int err, ordinal;
	hipError_t e;

	if (fd >= 0)
		close(fd);
	err = td_hip_load(&hip);
	if (err < 0)
		return err;
	if (!d->ipc_handle || d->ipc_handle_len != sizeof(o.h))
		return td_set_error(-EPROTO, "HIP IPC handle of %zu bytes, expected %zu",
				    d->ipc_handle_len, sizeof(o.h));
	if (d->ipc_offset > d->map_size)
		return td_set_error(-EPROTO, "HIP IPC offset %llu beyond %llu bytes",
				    (unsigned long long)d->ipc_offset,
				    (unsigned long long)d->map_size);
	memcpy(&o.h, d->ipc_handle, sizeof(o.h));
	o.flags = (unsigned int)td_hip_ipc_flag(hip->runtime_version);
	err = td_hip_ordinal_of_uuid(d->uuid, d->uuid_len, d->device.device_id, &ordinal);
	if (err < 0)
		return err;
	p = calloc(1, sizeof(*p));
	if (!p)
		return td_set_error(-ENOMEM, "out of memory");
	p->hip = hip;
	p->ordinal = ordinal;
	e = td_hip_on_device(p, td_hip_open, &o);
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

	if (!p)
		return;
	/* Inherited across fork(): forget it without a runtime call. */
	if (!td_gpu_forked_from)
		(void)td_hip_on_device(p, td_hip_close, NULL);
	free(p);
	m->priv = NULL;
	m->base = m->data = NULL;
}

static hipError_t td_hip_device_sync(struct td_hip_map *p, void *ctx)
{
	return p->hip->DeviceSynchronize();
}

/*
 * Publish by the creator: every stream of the device, so writes queued
 * anywhere in this process land before readers can attach.
 */
static int td_hip_sync(struct td_mapping *m)
{
	struct td_hip_map *p = m->priv;
	hipError_t e;

	if (!p)
		return 0;
	e = td_hip_on_device(p, td_hip_device_sync, NULL);
	if (e != hipSuccess)
		return td_hip_fail(p->hip, e, "synchronizing the device before publish");
	return 0;
}

struct td_hip_copy {
	void *dst;
	const void *src;
	size_t n;
};

/* On the null stream, which put() asked the producer to order its writes before. */
static hipError_t td_hip_copy(struct td_hip_map *p, void *ctx)
{
	const struct td_hip_copy *c = ctx;
	hipError_t e;

	e = p->hip->MemcpyAsync(c->dst, c->src, c->n, hipMemcpyDefault, NULL);
	if (e == hipSuccess)
		e = p->hip->StreamSynchronize(NULL);
	return e;
}

/* put() of a ROCm array: device to device (td_gpu_put_stream() says which stream). */
static int td_hip_copy_in(struct td_mapping *m, const void *src, uint64_t n)
{
	struct td_hip_map *p = m->priv;
	struct td_hip_copy c = { m->data, src, (size_t)n };
	hipError_t e;

	if (!p)
		return td_set_error(-EINVAL, "tensor '%s' is not mapped", m->name);
	e = td_hip_on_device(p, td_hip_copy, &c);
	if (e != hipSuccess)
		return td_hip_fail(p->hip, e, "copying device memory into the tensor");
	return 0;
}

const struct td_importer td_importer_hip = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC,
	.unmap_before_close = true,
	.map = td_hip_map,
	.unmap = td_hip_unmap,
	/* HIP IPC has no read-only mapping: the DLPack flag is all there is. */
	.make_private = NULL,
	.sync = td_hip_sync,
	.copy_in = td_hip_copy_in,
};
