/*
 * What the GPU backends share (backend_gpu.c). A vendor's backend
 * (gpu/<id>/backend_<id>.c) knows its driver; this knows what is the same
 * for every vendor:
 *  - the devices found at init (UUID, memory) and what stats and
 *    capacities ask of them;
 *  - how an allocation starts (nothing held, the device checked, a
 *    zero-size tensor maps nothing) and what it holds (struct gpu_mem);
 *  - the legacy IPC export: allocate, zero, wait for the zeroes, take the
 *    handle of the allocation's start;
 *  - a lease's descriptor, a copy of the one export an allocation keeps;
 *  - freeze(), which GPU memory cannot honour from here;
 *  - the free, which always runs on the GPU worker (gpu_worker.h), so that
 *    the loop thread never waits for a device;
 *  - how long a device's context outlives its last tensor
 *    (backend_gpu_set_context_hold(), backend.h).
 */
#ifndef TENSORD_BACKEND_GPU_H
#define TENSORD_BACKEND_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "gpu/gpu_util.h"

/* One device as init() found it. */
struct gpu_dev {
	uint8_t uuid[TD_GPU_UUID_LEN];
	bool has_uuid;  /* unique and not blank; else clients match by ordinal */
	uint64_t total; /* bytes of device memory */
};

/* A backend's devices; n is 0 before init() and after fini(). */
struct gpu_devs {
	int n;
	struct gpu_dev dev[TD_GPU_MAX_DEVICES];
};

/* For backend_ops.device_uuid: -ENODEV for no such device, -ENOENT when it has no UUID. */
int gpu_device_uuid(const struct gpu_devs *g, int device_id, uint8_t uuid[16]);

/*
 * For backend_ops.default_capacity: half of the device's memory, as for
 * host memory: the GPU is shared with the processes that compute on it,
 * and the daemon's tensors should not starve them unless --capacity says
 * so. 0 for no such device.
 */
uint64_t gpu_default_capacity(const struct gpu_devs *g, int device_id);

/*
 * The start of every GPU allocation's a->priv; a vendor's own state
 * follows it (struct cuda_mem { struct gpu_mem g; ... }).
 */
struct gpu_mem {
	/*
	 * Frees the memory and whatever of the device it held, on the GPU
	 * worker, where the calls may wait for the device; never frees m.
	 */
	void (*free)(struct gpu_mem *m);
	int ordinal;  /* the daemon's number of the device */
	int fd;       /* an export kept for the leases' copies (CUDA VMM); -1 when none */
	uint64_t ptr; /* legacy IPC: the device address exported; 0 when none */
};

/*
 * Starts an allocation of g's device_id: *a holds nothing yet (no
 * descriptor, no handle, size 0), so release() copes whatever follows.
 * 0, or -ENODEV for no such device. Then a size of 0 is done: a zero-size
 * tensor maps nothing (HANDLE_NONE).
 */
int gpu_alloc_begin(struct backend_alloc *a, const struct gpu_devs *g, int device_id);

/*
 * A zeroed allocation's state of size bytes (>= sizeof(struct gpu_mem))
 * on ordinal, freed with free_fn() on the worker by gpu_release(); or NULL.
 */
void *gpu_mem_new(size_t size, int ordinal, void (*free_fn)(struct gpu_mem *m));

/* Out of device memory is "no space" to the user, not a host malloc failure. */
int gpu_alloc_errno(int err);

/*
 * A vendor's legacy IPC calls, each 0 or -errno, on the device the caller
 * made current: the driver's own allocation, its asynchronous zeroing,
 * the wait for it, and the IPC handle (handle_len bytes) of an address.
 */
struct gpu_ipc_ops {
	Tensord__HandleKind handle_kind;
	size_t handle_len; /* <= BACKEND_IPC_HANDLE_MAX */
	int (*alloc)(uint64_t *ret_ptr, uint64_t size);
	int (*zero)(uint64_t ptr, uint64_t size);
	int (*sync)(void);
	int (*handle)(uint8_t *handle, uint64_t ptr);
};

/*
 * Legacy IPC, for every vendor: allocates size bytes into m->ptr, zeroes
 * them and waits until the zeroes landed (nobody may read what an earlier
 * tenant left), and puts the handle of the allocation's start in a (offset
 * 0: the allocation is the tensor's alone). 0 or -errno (out of device
 * memory: -ENOSPC); m->ptr is 0 when nothing was allocated.
 */
int gpu_ipc_alloc(const struct gpu_ipc_ops *o, struct backend_alloc *a, struct gpu_mem *m,
		  uint64_t size);

/*
 * backend_ops.export_fd: a copy of the export the allocation keeps (m->fd),
 * or -1 for memory that travels as handle bytes. GPU memory cannot be
 * made read-only through the descriptor: writable is the importer's to
 * enforce (docs/gpu.md).
 */
int gpu_export_fd(struct backend_alloc *a, bool writable, int *ret_fd);

/*
 * backend_ops.freeze: GPU memory cannot be write-protected from the
 * daemon, so nothing happens here. The client library protects what the
 * driver lets it (CUDA VMM: cuMemSetAccess), the DLPack read-only flag the
 * rest, and a client that bypasses the library can write.
 */
int gpu_freeze(struct backend_alloc *a);

/* backend_gpu_set_context_hold()'s value in nanoseconds (default 5 s). Any thread. */
uint64_t gpu_context_hold_ns(void);

/*
 * backend_ops.release: hands a's memory to the GPU worker, which closes
 * the kept export (the last reference to an allocation's shareable file
 * is slow to drop), calls m->free and frees m. Never blocks; NULL-safe on
 * a->priv. The registry calls it only after the tensor's last lease ended,
 * so no client still has legacy IPC memory open.
 */
void gpu_release(struct backend_alloc *a);

#endif /* TENSORD_BACKEND_GPU_H */
