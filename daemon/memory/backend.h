/*
 * Memory backends. Each device family (host, each GPU vendor) is one
 * struct backend_ops; the registry and the protocol only ever talk
 * to this table, so adding a device touches neither. Which backends exist is
 * decided at link time (backends[] in backend.c, from common/vendor.h), never by #ifdef
 * elsewhere.
 *
 * All functions run on the daemon's loop thread, except alloc() of a
 * backend with alloc_blocks, which the registry's caller runs on the GPU
 * worker (gpu_worker.h). The host backend never blocks; the GPU backends
 * allocate and zero on the worker and hand their frees to it too, so the
 * loop thread makes only driver calls that do not wait for the device
 * (docs/gpu.md lists them).
 */
#ifndef TENSORD_BACKEND_H
#define TENSORD_BACKEND_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tensord/dlpack.h>

#include "common/vendor.h"
#include "proto/tensord.pb-c.h" /* Tensord__HandleKind: how a handle travels */

#define BACKEND_IPC_HANDLE_MAX 64

/* One allocation. Filled by ops->alloc(); owned by the tensor that holds it. */
struct backend_alloc {
	const struct backend_ops *ops;
	int device_id; /* the daemon's ordinal */
	uint64_t size; /* bytes actually allocated (>= what was asked); what a lease maps */
	/*
	 * Bytes of memory it takes (>= size): what the device's capacity and its
	 * owner's byte share count. A slab slot takes SLAB_ALIGN-rounded bytes,
	 * a memfd whole pages, GPU memory its rounded size.
	 */
	uint64_t footprint;
	Tensord__HandleKind handle_kind;
	int fd; /* owned; -1 when none; closed by ops->release() */
	uint8_t ipc_handle[BACKEND_IPC_HANDLE_MAX]; /* legacy IPC handle bytes */
	size_t ipc_handle_len;
	uint64_t ipc_offset;
	uint64_t share_id; /* nonzero: lives at ipc_offset in memory shared under this id */
	/*
	 * A ring buffer (docs/recycle.md): its writer keeps a writable shared
	 * mapping from version to version, so freeze() seals it
	 * F_SEAL_FUTURE_WRITE, once, instead of F_SEAL_WRITE.
	 */
	bool recycled;
	void *priv; /* the backend's own state; NULL when none */
};

struct backend_ops {
	const char *name; /* "host", "cuda", "hip" */
	int device_type;  /* DLDeviceType: kDLCPU, kDLCUDA, kDLROCM */

	/*
	 * Called once at start-up. 0 when the backend can serve, else -errno
	 * with the reason written to why ("libcuda.so.1: cannot open shared
	 * object file"). A backend that fails init is kept, and answers every
	 * request for its devices with -ENODEV and that reason.
	 */
	int (*init)(char *why, size_t why_len);

	/* Undoes init() at exit, after every allocation was released. May be NULL. */
	void (*fini)(void);

	/* Devices this backend serves (after a successful init). */
	int (*device_count)(void);

	/* The device's 16-byte UUID; host memory has none (returns -ENOENT). */
	int (*device_uuid)(int device_id, uint8_t uuid[16]);

	/* Bytes this device may hand out when --capacity does not say. */
	uint64_t (*default_capacity)(int device_id);

	/* How this backend shares memory, for stats: "memfd", "cuda-vmm", ... */
	const char *(*path)(int device_id);

	/*
	 * For stats: the GPU memory the daemon costs this device, its context
	 * included: the context as the driver counted it when it was made
	 * (also while it is held after the device's last tensor went, see
	 * backend_gpu_set_context_hold()), plus the live allocations; 0 when
	 * the daemon holds nothing there or the driver cannot say. NULL for
	 * backends that cannot tell at all.
	 */
	uint64_t (*gpu_bytes)(int device_id);

	/*
	 * Allocates size bytes (size may be 0) on device_id, populated, so
	 * that nobody faults later for lack of memory. 0, -ENOSPC, -ENOMEM or
	 * -ENODEV. May leave *a half-built on failure; release() copes.
	 * name is for the allocation's label only.
	 */
	int (*alloc)(struct backend_alloc *a, uint64_t size, int device_id, const char *name);

	/*
	 * alloc() may block (a context to create, memory to zero): for sizes
	 * above 0 the registry hands it to the GPU worker, and the create is
	 * answered when it completes (registry_create()'s -EINPROGRESS). Such
	 * an alloc() runs on the worker, one job at a time with the frees
	 * release() queued there, and must not touch what the loop thread's
	 * calls use without its own lock.
	 */
	bool alloc_blocks;

	/*
	 * A set in one allocation (registry_arena.c, docs/recycle.md section
	 * 5) on a backend with alloc_blocks: one alloc() may hold several
	 * tensors, each at its alloc.ipc_offset, and a lease hands over the
	 * whole allocation (alloc.size) with that offset: the client maps (or
	 * opens) it once per process and every member is a pointer into it.
	 * copy() takes offsets from the tensor's start. False: one allocation
	 * per tensor. (Host arenas are ring buffers, which need adopt.)
	 */
	bool arenas;

	/*
	 * Like alloc(), but in memory shared with other immutable tensors of
	 * the same owner and mode (a slab): sets share_id and ipc_offset, and
	 * the bytes are written with write() only. For sizes 1 .. shared_max.
	 * NULL when the backend has no such memory.
	 */
	int (*alloc_shared)(struct backend_alloc *a, uint64_t size, uint32_t uid, uint32_t gid,
			    uint32_t mode);
	uint64_t shared_max;

	/*
	 * Memory for a reserve (docs/design.md, "The reserve"): at least size
	 * bytes (a size class), all allocated and zeroed, never handed out
	 * before, which its client may write through its descriptor but not
	 * grow. Ready memory only, so that it never blocks: -EAGAIN when none
	 * is ready (a later call may find some). May leave *a half-built on
	 * failure; release() copes. NULL: the backend keeps no reserves (GPUs).
	 */
	int (*reserve)(struct backend_alloc *a, uint64_t size);

	/*
	 * Makes *a, the memory of a tensor of size bytes (0 < size <= r->size),
	 * out of reserve r, which it takes over whatever the result (r->fd is
	 * -1 afterwards): trimmed and sealed as alloc() leaves its memory. 0,
	 * or -errno with *a half-built (release() copes). NULL with reserve.
	 */
	int (*adopt)(struct backend_alloc *a, struct backend_alloc *r, uint64_t size);

	/*
	 * Moves a frozen allocation of 1 .. shared_max bytes into shared
	 * memory of that owner and mode, as alloc_shared() would have placed
	 * it: copies its bytes there and frees its own memory. 0, or -errno
	 * with *a unchanged. NULL when the backend has no shared memory.
	 */
	int (*share)(struct backend_alloc *a, uint32_t uid, uint32_t gid, uint32_t mode);

	/*
	 * A new descriptor for one client in *ret_fd, or -1 for handle kinds
	 * that travel as bytes. On success the caller owns *ret_fd (close it,
	 * or hand it to something that takes ownership). writable false: the
	 * client must not be able to change the shared bytes through it.
	 */
	int (*export_fd)(struct backend_alloc *a, bool writable, int *ret_fd);

	/*
	 * Writes n bytes at offset off of the allocation, through its handle
	 * (the daemon never maps tensor memory). 0 or -errno. NULL when the
	 * backend cannot (GPU memory): then put with inline bytes is refused.
	 */
	int (*write)(struct backend_alloc *a, uint64_t off, const void *data, size_t n);

	/*
	 * Makes the bytes immutable (publish of a non-mutable tensor). 0, or
	 * -EBUSY when a writable shared mapping still exists somewhere. A
	 * backend that cannot enforce it returns 0 and relies on clients
	 * honouring the read-only flag (documented per backend).
	 */
	int (*freeze)(struct backend_alloc *a);

	/*
	 * Frees everything behind a (GPU backends: queues the free for their
	 * worker). Never fails, never blocks; NULL-safe on a->priv.
	 */
	void (*release)(struct backend_alloc *a);

	/*
	 * Copies n bytes between host memory buf and the allocation at off:
	 * out of the allocation into buf when to_host, else from buf into it,
	 * and returns once they landed. Runs on the GPU worker (it waits for
	 * the device), while a lease keeps *a alive (its free, queued on the
	 * worker by release(), runs after). 0 or -errno. NULL for memory the
	 * daemon reaches through its descriptor (host). Remote attach stages
	 * GPU tensors through host memory with it (docs/remote.md, "GPU
	 * tensors across nodes").
	 */
	int (*copy)(struct backend_alloc *a, uint64_t off, void *buf, size_t n, bool to_host);

	/*
	 * Restart (docs/restart.md): makes *a the allocation of size bytes on
	 * device_id that fd, an export kept across the restart, refers to;
	 * takes fd over whatever the result. 0, or -errno with *a half-built
	 * (release() copes). NULL: the backend's memory cannot survive a
	 * restart that way (legacy IPC, HIP).
	 */
	int (*import_fd)(struct backend_alloc *a, int fd, uint64_t size, int device_id);
};

/*
 * The daemon's ordinal of the device of ops whose UUID is uuid (len 16), or
 * -ENODEV. Clients name GPUs by UUID because each process may number them
 * differently (CUDA_VISIBLE_DEVICES).
 */
static inline int backend_ordinal_of_uuid(const struct backend_ops *ops, const uint8_t *uuid,
					  size_t len)
{
	uint8_t have[16];

	if (len != sizeof(have))
		return -ENODEV;
	for (int i = 0; i < ops->device_count(); i++)
		if (ops->device_uuid(i, have) == 0 && memcmp(have, uuid, sizeof(have)) == 0)
			return i;
	return -ENODEV;
}

/* NULL-terminated; the first entry is the host backend, then one per GPU vendor. */
extern const struct backend_ops *const backends[];

extern const struct backend_ops backend_host;

/*
 * The host backend's freeze tries F_SEAL_WRITE up to this many times while
 * it answers EBUSY (backend_host.c, host_freeze()).
 */
#define HOST_SEAL_TRIES 3
/* Tests only: called with the memfd after each refused try but the last. NULL: none. */
extern void (*backend_host_seal_retry_hook)(int fd);

/* Each GPU vendor's, backend_<id> (gpu/<id>/backend_<id>.c), e.g. backend_cuda. */
#define BACKEND_GPU_DECLARE(id, ...) extern const struct backend_ops backend_##id;
TD_GPU_VENDORS(BACKEND_GPU_DECLARE)
#undef BACKEND_GPU_DECLARE

/*
 * The fields of a GPU vendor's backend_ops that its row in common/vendor.h
 * says: the name is the vendor's id, the device type its DLPack type.
 */
#define BACKEND_GPU_VENDOR(id) .name = #id, .device_type = TD_GPU_TYPE_##id

/*
 * The host backend's memory pool (pool.h): its budget in bytes, set before
 * the registry initialises the backends; without a call, a sixteenth of
 * physical memory, at most 2 GiB. 0 keeps no memory ready.
 */
void backend_host_set_pool(uint64_t budget);

/*
 * From now on (shutdown, docs/restart.md) freed host memory keeps its
 * bytes: slab slots are not zeroed, since the service manager's store
 * keeps the slab for the next daemon to restore from.
 */
void backend_host_keep_contents(void);

/*
 * With the descriptor store on (docs/restart.md): slab slots freed during a
 * commit step are zeroed and reused only at backend_host_flush_frees(),
 * which the loop calls after each step's record is written.
 */
void backend_host_defer_frees(void);
void backend_host_flush_frees(void);

/*
 * fn(fd) is called with each memory descriptor the daemon is about to
 * close for good, on the loop thread: a tensor's memfd, a ring buffer, a
 * set allocation, an empty slab, a CUDA VMM allocation's kept export. The
 * descriptor store lets go of it then (docs/restart.md). NULL: none.
 */
void backend_set_release_hook(void (*fn)(int fd));

/* Backends call it before closing such a descriptor (fd < 0: nothing). */
void backend_released(int fd);

/* The host backend's part of it: slabs call fn as they close. */
void backend_host_watch_slabs(void (*fn)(int fd));

/*
 * How long a GPU backend keeps a device's context after the device's last
 * tensor went (--gpu-context-hold), in milliseconds: a create within that
 * time finds the context still there instead of making a new one, which
 * on hardware costs hundreds of milliseconds. Without a call, 5000. 0
 * releases the context with the last tensor. Set before the registry
 * initialises the backends (a later call is safe, from any thread, and
 * applies to the holds that start or end after it).
 */
void backend_gpu_set_context_hold(uint64_t ms);

/* backend_host.c: whether the kernel enforces what recycled memory needs. 0 or -errno and why. */
int backend_host_probe_recycle(char *why, size_t why_len);

/* Borrowed: the host backend's pool, NULL before init and after fini. */
struct pool *backend_host_pool(void);

/* The host backend's slabs (slab.h): how many, and the bytes in their live slots. */
void backend_host_slab_stats(uint32_t *ret_slabs, uint64_t *ret_bytes);

#endif /* TENSORD_BACKEND_H */
