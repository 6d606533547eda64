/*
 * What the GPU backends share. See backend_gpu.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_gpu.h"
#include "gpu_worker.h"

/* --gpu-context-hold in milliseconds; set from the options, read on the worker. */
static uint64_t gpu_context_hold_ms = 5000;

void backend_gpu_set_context_hold(uint64_t ms)
{
	__atomic_store_n(&gpu_context_hold_ms, ms, __ATOMIC_RELAXED);
}

uint64_t gpu_context_hold_ns(void)
{
	uint64_t ms = __atomic_load_n(&gpu_context_hold_ms, __ATOMIC_RELAXED);

	return ms > UINT64_MAX / 1000000ull ? UINT64_MAX : ms * 1000000ull;
}

int gpu_device_uuid(const struct gpu_devs *g, int device_id, uint8_t uuid[16])
{
	if (device_id < 0 || device_id >= g->n)
		return -ENODEV;
	if (!g->dev[device_id].has_uuid)
		return -ENOENT;
	memcpy(uuid, g->dev[device_id].uuid, TD_GPU_UUID_LEN);
	return 0;
}

uint64_t gpu_default_capacity(const struct gpu_devs *g, int device_id)
{
	if (device_id < 0 || device_id >= g->n)
		return 0;
	return g->dev[device_id].total / 2;
}

int gpu_alloc_begin(struct backend_alloc *a, const struct gpu_devs *g, int device_id)
{
	a->fd = -1;
	a->priv = NULL;
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_NONE;
	a->ipc_handle_len = 0;
	a->ipc_offset = 0;
	a->size = 0;
	a->footprint = 0;
	if (device_id < 0 || device_id >= g->n)
		return -ENODEV;
	a->device_id = device_id;
	return 0;
}

void *gpu_mem_new(size_t size, int ordinal, void (*free_fn)(struct gpu_mem *m))
{
	struct gpu_mem *m = calloc(1, size);

	if (!m)
		return NULL;
	m->free = free_fn;
	m->ordinal = ordinal;
	m->fd = -1;
	return m;
}

int gpu_alloc_errno(int err)
{
	return err == -ENOMEM ? -ENOSPC : err;
}

int gpu_ipc_alloc(const struct gpu_ipc_ops *o, struct backend_alloc *a, struct gpu_mem *m,
		  uint64_t size)
{
	uint8_t h[BACKEND_IPC_HANDLE_MAX];
	int err;

	err = o->alloc(&m->ptr, size);
	if (err < 0) {
		m->ptr = 0;
		return gpu_alloc_errno(err);
	}
	/* The zeroing may return before the zeroes land; wait for them. */
	err = o->zero(m->ptr, size);
	if (err == 0)
		err = o->sync();
	/* The handle names the start of our own allocation: offset 0. */
	if (err == 0)
		err = o->handle(h, m->ptr);
	if (err < 0)
		return gpu_alloc_errno(err);
	memcpy(a->ipc_handle, h, o->handle_len);
	a->ipc_handle_len = o->handle_len;
	a->ipc_offset = 0;
	a->handle_kind = o->handle_kind;
	return 0;
}

int gpu_export_fd(struct backend_alloc *a, bool writable, int *ret_fd)
{
	struct gpu_mem *m = a->priv;
	int fd;

	(void)writable;
	if (!m || m->fd < 0) {
		*ret_fd = -1;
		return 0;
	}
	fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return -errno;
	*ret_fd = fd;
	return 0;
}

int gpu_freeze(struct backend_alloc *a)
{
	return 0;
}

/* On the GPU worker: the calls may wait for the device. */
static void gpu_free_job(void *arg)
{
	struct gpu_mem *m = arg;

	/* The last reference to the shareable file: slow to drop, so here. */
	if (m->fd >= 0)
		close(m->fd);
	m->free(m);
	free(m);
}

void gpu_release(struct backend_alloc *a)
{
	struct gpu_mem *m = a->priv;

	/* The kept export closes on the worker: the store lets go of it first. */
	if (m)
		backend_released(m->fd);
	if (a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
	}
	if (!m)
		return;
	/* gpu_worker_run() runs the job here if it cannot queue it: never lost. */
	gpu_worker_run(gpu_free_job, m);
	a->priv = NULL;
}
