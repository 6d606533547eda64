/*
 * CUDA device memory, devices "cuda:N".
 *
 * Two ways to share, chosen per device at init:
 *  - "cuda-vmm" (preferred): cuMemCreate with a POSIX file descriptor as
 *    its shareable handle, exported once as the memory is made and kept;
 *    each client gets a copy of that fd over SCM_RIGHTS (see
 *    cuda_alloc_vmm() for why not a fresh export per client);
 *    the driver refcounts the physical memory across
 *    processes, so a client's mapping stays valid even if the daemon dies,
 *    and no pid is involved, so it works across pid namespaces.
 *  - "cuda-ipc" (fallback, where the device lacks VMM or POSIX-fd export,
 *    attributes 102 / 103): cuMemAlloc + cuIpcGetMemHandle (the legacy IPC
 *    export every vendor shares, daemon/memory/backend_gpu.h). The 64 handle
 *    bytes travel in the reply. The daemon is then the exporter: freeing
 *    while a client still has the handle open is undefined behaviour, so
 *    release() must only run after every lease (and so every client
 *    mapping) is gone, and a daemon crash takes clients' mappings with it.
 * TENSORD_CUDA_PATH=ipc forces the fallback (for tests on VMM hardware).
 *
 * One driver allocation per tensor, never a pool carved between tenants:
 * cuMemMap can only map an allocation from offset 0, and legacy IPC shares
 * the whole underlying block. Every allocation is zeroed before it is
 * handed out, so nobody reads what an earlier tenant left in recycled
 * device memory.
 *
 * Immutability: GPU memory cannot be write-protected from the daemon, so
 * freeze() does nothing (gpu_freeze()). The client library maps immutable VMM tensors with
 * cuMemSetAccess(PROT_READ) for readers, and re-protects the creator's own
 * mapping so at publish; legacy IPC has only the DLPack read-only flag. A
 * client that bypasses the library can write.
 *
 * Contexts: the daemon retains each device's primary context on the first
 * allocation on that device (not at start-up, so an idle daemon costs no
 * GPU memory on GPUs nobody uses), makes it current before every driver
 * call, and releases it once the device has had no allocation for the
 * hold (--gpu-context-hold, default 5 s; 0: with the last allocation),
 * which gives the context's own memory (hundreds of MiB) back to the GPU.
 * The hold is there for bursts (create, free, create, ...): making a
 * context costs hundreds of milliseconds on hardware, which a create
 * after each free would pay again. A timer on the worker
 * (gpu_worker_run_after()) ends the hold; the stop ends it at once.
 *
 * Threads: alloc() (alloc_blocks) and the frees run on the GPU worker
 * (gpu_worker.h), one job at a time; they alone touch a device's context
 * and its count of allocations, under cuda_lock so that a test calling
 * alloc() directly is safe too. The loop thread only copies the kept
 * descriptor and makes no driver call. docs/gpu.md lists which
 * call runs where. The daemon must never fork() after init, as CUDA does
 * not survive it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensord/dlpack.h>

#include "daemon/memory/backend_gpu.h"
#include "daemon/memory/gpu_worker.h"
#include "daemon/base/log.h"
#include "gpu/cuda/cuda_api.h"
#include "gpu/gpu_util.h"
#include "nvml.h"

/* Legacy allocations are rounded to 2 MiB, as NVIDIA advises for IPC. */
#define CUDA_IPC_GRANULARITY (2ull << 20)

/* What CUDA keeps of a device besides its UUID and size (cuda_gpu). */
struct cuda_dev {
	CUdevice dev;
	bool vmm;             /* share through VMM + POSIX fd; read with __atomic_load_n */
	uint64_t gran;        /* allocation granularity; 0 until the context exists */
	CUcontext ctx;        /* retained primary context; NULL until a tensor, and after a hold */
	uint32_t allocs;      /* live allocations on this device: the context's users */
	uint64_t ctx_bytes;   /* what the context took, measured as it was made; 0: unknown */
	uint64_t alloc_bytes; /* rounded sizes of the live allocations */
	uint64_t gpu_bytes;   /* for stats (cuda_publish()); read with __atomic_load_n */
	bool unmeasured;      /* why ctx_bytes is unknown was logged, once */
	uint64_t idle_since;  /* CLOCK_MONOTONIC ns when allocs last fell to 0 */
	bool hold_armed;      /* a cuda_hold_expired() timer waits on the worker */
};

/*
 * What one allocation holds; a->priv. g.fd is VMM's one export, kept; g.ptr
 * the legacy allocation.
 */
struct cuda_mem {
	struct gpu_mem g;
	CUcontext ctx; /* the device's primary context, held while this lives */
	bool vmm;
	CUmemGenericAllocationHandle handle; /* vmm */
	uint64_t counted;                    /* bytes in the device's alloc_bytes */
};

static const struct td_cuda_api *cuda_api;
static struct gpu_devs cuda_gpu;
static struct cuda_dev cuda_devs[TD_GPU_MAX_DEVICES];
/* Guards each device's ctx, allocs, gran and vmm against the loop's readers of vmm. */
static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;

static int cuda_backend_fail(char *why, size_t why_len, CUresult r, const char *what)
{
	char err[128];

	snprintf(why, why_len, "%s: %s: %s", TD_CUDA_LIBNAME, what,
		 td_cuda_strerror(cuda_api, r, err, sizeof(err)));
	return -ENODEV;
}

static int cuda_backend_init(char *why, size_t why_len)
{
	const char *path = getenv("TENSORD_CUDA_PATH");
	bool force_ipc = path && strcmp(path, "ipc") == 0;
	const char *reason = NULL;
	int rc, n = 0;
	CUresult r;

	rc = td_cuda_api_get(&cuda_api, &reason);
	if (rc < 0) {
		snprintf(why, why_len, "%s", reason);
		return rc;
	}
	r = cuda_api->DeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return cuda_backend_fail(why, why_len, r, "cuDeviceGetCount");
	if (n <= 0) {
		snprintf(why, why_len, "%s: no CUDA device", TD_CUDA_LIBNAME);
		return -ENODEV;
	}
	if (n > TD_GPU_MAX_DEVICES)
		n = TD_GPU_MAX_DEVICES;
	memset(&cuda_gpu, 0, sizeof(cuda_gpu));
	memset(cuda_devs, 0, sizeof(cuda_devs));
	for (int i = 0; i < n; i++) {
		struct cuda_dev *d = &cuda_devs[i];
		struct gpu_dev *g = &cuda_gpu.dev[i];
		int has_vmm = 0, has_fd = 0;
		size_t total = 0;
		CUuuid u;

		r = cuda_api->DeviceGet(&d->dev, i);
		if (r == CUDA_SUCCESS)
			r = cuda_api->DeviceGetUuid(&u, d->dev);
		if (r == CUDA_SUCCESS)
			r = cuda_api->DeviceTotalMem(&total, d->dev);
		if (r != CUDA_SUCCESS)
			return cuda_backend_fail(why, why_len, r, "device query");
		memcpy(g->uuid, u.bytes, sizeof(g->uuid));
		g->has_uuid = true;
		g->total = total;
		/* A failed attribute query reads as "unsupported": fall back, don't fail. */
		if (cuda_api->DeviceGetAttribute(
			    &has_vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
			    d->dev) != CUDA_SUCCESS)
			has_vmm = 0;
		if (cuda_api->DeviceGetAttribute(
			    &has_fd,
			    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
			    d->dev) != CUDA_SUCCESS)
			has_fd = 0;
		d->vmm = !force_ipc && has_vmm && has_fd && td_cuda_api_has_vmm(cuda_api);
		{
			char ustr[48];

			log_debug("cuda: device %d is %s, %llu bytes, vmm %d, posix fd %d%s", i,
				  td_gpu_uuid_format(g->uuid, sizeof(g->uuid), ustr, sizeof(ustr)),
				  (unsigned long long)g->total, has_vmm, has_fd,
				  force_ipc ? ", legacy IPC forced by TENSORD_CUDA_PATH" : "");
		}
	}
	cuda_gpu.n = n;
	return 0;
}

static int cuda_backend_device_count(void)
{
	return cuda_gpu.n;
}

static int cuda_backend_device_uuid(int device_id, uint8_t uuid[16])
{
	return gpu_device_uuid(&cuda_gpu, device_id, uuid);
}

static uint64_t cuda_backend_default_capacity(int device_id)
{
	return gpu_default_capacity(&cuda_gpu, device_id);
}

static const char *cuda_backend_path(int device_id)
{
	if (device_id < 0 || device_id >= cuda_gpu.n)
		return "none";
	/* The worker may find out at the first allocation that VMM is missing. */
	return __atomic_load_n(&cuda_devs[device_id].vmm, __ATOMIC_RELAXED) ? "cuda-vmm"
									    : "cuda-ipc";
}

static void cuda_vmm_prop(int ordinal, CUmemAllocationProp *prop)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = cuda_devs[ordinal].dev;
}

/*
 * The memory the device's primary context took, just made: what the driver
 * counts for the daemon there before its first allocation (NVML;
 * cuMemGetInfo needs a context, so it cannot see what making one took).
 * One NVML call per context, not per allocation. 0 when NVML cannot tell,
 * logged once per device with the reason. cuda_lock held, on the worker.
 */
static void cuda_measure_context(int ordinal)
{
	struct cuda_dev *d = &cuda_devs[ordinal];
	unsigned pid = (unsigned)getpid();
	uint64_t bytes = 0;
	char why[200];
	int r = td_nvml_process_bytes(cuda_gpu.dev[ordinal].uuid, pid, &bytes, why, sizeof(why));

	if (r == 0 && bytes == 0) {
		snprintf(why, sizeof(why),
			 "NVML does not list pid %u (the daemon in a pid namespace of its own?)",
			 pid);
		r = -ESRCH;
	}
	if (r < 0 && !d->unmeasured) {
		log_info("cuda: device %d: the daemon's GPU memory, context included, is not "
			 "known: %s",
			 ordinal, why);
		d->unmeasured = true;
	}
	d->ctx_bytes = r == 0 ? bytes : 0;
	if (r == 0)
		log_debug("cuda: device %d: its primary context took %llu bytes", ordinal,
			  (unsigned long long)bytes);
}

/*
 * What stats show for the device: the context and the live allocations
 * while the context lives (held idle too: it is memory the daemon costs)
 * and its size is known, else 0. cuda_lock held.
 */
static void cuda_publish(int ordinal)
{
	const struct cuda_dev *d = &cuda_devs[ordinal];
	uint64_t v = d->ctx && d->ctx_bytes ? d->ctx_bytes + d->alloc_bytes : 0;

	__atomic_store_n(&cuda_devs[ordinal].gpu_bytes, v, __ATOMIC_RELAXED);
}

/*
 * Makes device ordinal's primary context current, retaining it the first
 * time. cuda_lock held; the worker (or a test) only.
 */
static int cuda_dev_enter(int ordinal)
{
	struct cuda_dev *d = &cuda_devs[ordinal];
	CUresult r;

	if (!d->ctx) {
		CUcontext ctx;
		size_t gran = 0;

		r = cuda_api->DevicePrimaryCtxRetain(&ctx, d->dev);
		if (r != CUDA_SUCCESS)
			return td_cuda_errno(r);
		r = cuda_api->CtxSetCurrent(ctx);
		if (r != CUDA_SUCCESS) {
			cuda_api->DevicePrimaryCtxRelease(d->dev);
			return td_cuda_errno(r);
		}
		if (d->vmm) {
			CUmemAllocationProp prop;

			cuda_vmm_prop(ordinal, &prop);
			r = cuda_api->MemGetAllocationGranularity(&gran, &prop,
								  CU_MEM_ALLOC_GRANULARITY_MINIMUM);
			/* No granularity means no VMM on this device after all. */
			if (r != CUDA_SUCCESS || gran == 0)
				__atomic_store_n(&d->vmm, false, __ATOMIC_RELAXED);
		}
		d->gran = d->vmm ? gran : CUDA_IPC_GRANULARITY;
		d->ctx = ctx;
		cuda_measure_context(ordinal);
		return 0;
	}
	return td_cuda_errno(cuda_api->CtxSetCurrent(d->ctx));
}

static uint64_t cuda_backend_gpu_bytes(int device_id)
{
	if (device_id < 0 || device_id >= cuda_gpu.n)
		return 0;
	return __atomic_load_n(&cuda_devs[device_id].gpu_bytes, __ATOMIC_RELAXED);
}

/* The hold's clock is the worker's, whose timers end it (a test's in tests). */
static uint64_t cuda_now_ns(void)
{
	return gpu_worker_now_ns();
}

/*
 * Releases device ordinal's primary context, which gives its memory back;
 * when says when, for the log. cuda_lock held; on the worker (the stop's
 * too).
 */
static void cuda_ctx_release(int ordinal, const char *when)
{
	struct cuda_dev *d = &cuda_devs[ordinal];

	cuda_api->CtxSetCurrent(NULL);
	cuda_api->DevicePrimaryCtxRelease(d->dev);
	d->ctx = NULL;
	cuda_publish(ordinal);
	log_debug("cuda: device %d: primary context released %s", ordinal, when);
}

static void cuda_hold_expired(void *arg);

/*
 * Device ordinal's last allocation went: keep its context for the hold,
 * ending it with a timer on the worker, or release it now when the hold is
 * 0 or no timer can be had. A timer already waiting finds the new
 * idle_since and waits on. cuda_lock held.
 */
static void cuda_dev_idle(int ordinal)
{
	struct cuda_dev *d = &cuda_devs[ordinal];
	uint64_t hold = gpu_context_hold_ns();

	d->idle_since = cuda_now_ns();
	if (d->hold_armed)
		return;
	if (hold == 0 || gpu_worker_run_after(hold, cuda_hold_expired, d) < 0) {
		cuda_ctx_release(ordinal, "with its last tensor");
		return;
	}
	d->hold_armed = true;
}

/*
 * The timer of cuda_dev_idle(), on the worker: releases the context if the
 * device has had no allocation for the whole hold since its last one
 * went, waits for the rest of it if a burst came meanwhile, and does
 * nothing if allocations live there again (their last free arms a new
 * one).
 */
static void cuda_hold_expired(void *arg)
{
	struct cuda_dev *d = arg;
	int ordinal = (int)(d - cuda_devs);
	uint64_t hold = gpu_context_hold_ns(), idle;

	pthread_mutex_lock(&cuda_lock);
	d->hold_armed = false;
	if (d->ctx && d->allocs == 0) {
		idle = cuda_now_ns() - d->idle_since;
		if (idle >= hold || gpu_worker_run_after(hold - idle, cuda_hold_expired, d) < 0)
			cuda_ctx_release(ordinal, "after the hold without a tensor");
		else
			d->hold_armed = true;
	}
	pthread_mutex_unlock(&cuda_lock);
}

/* Out of device memory is "no space" to the user, not a host malloc failure. */
static int cuda_alloc_errno(CUresult r)
{
	return gpu_alloc_errno(td_cuda_errno(r));
}

/*
 * Maps a VMM allocation of size bytes at a fresh address of the daemon's,
 * readable and writable by its device, for the duration of a call on it
 * (it has no address otherwise): 0 with *ret_va set, or -errno. Undo with
 * cuda_vmm_unmap().
 */
static int cuda_vmm_map(int ordinal, CUmemGenericAllocationHandle h, uint64_t size,
			CUdeviceptr *ret_va)
{
	const struct cuda_dev *d = &cuda_devs[ordinal];
	CUmemAccessDesc acc;
	CUdeviceptr va = 0;
	CUresult r;

	r = cuda_api->MemAddressReserve(&va, size, d->gran, 0, 0);
	if (r != CUDA_SUCCESS)
		return cuda_alloc_errno(r);
	r = cuda_api->MemMap(va, size, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		cuda_api->MemAddressFree(va, size);
		return cuda_alloc_errno(r);
	}
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = d->dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = cuda_api->MemSetAccess(va, size, &acc, 1);
	if (r != CUDA_SUCCESS) {
		cuda_api->MemUnmap(va, size);
		cuda_api->MemAddressFree(va, size);
		return cuda_alloc_errno(r);
	}
	*ret_va = va;
	return 0;
}

static void cuda_vmm_unmap(CUdeviceptr va, uint64_t size)
{
	cuda_api->MemUnmap(va, size);
	cuda_api->MemAddressFree(va, size);
}

/*
 * Zeroes a VMM allocation. cuMemsetD8 is asynchronous; the synchronize
 * makes sure the zeroes land before any client can see the memory.
 */
static int cuda_vmm_scrub(int ordinal, CUmemGenericAllocationHandle h, uint64_t size)
{
	CUdeviceptr va = 0;
	CUresult r;
	int err = cuda_vmm_map(ordinal, h, size, &va);

	if (err < 0)
		return err;
	r = cuda_api->MemsetD8(va, 0, size);
	if (r == CUDA_SUCCESS)
		r = cuda_api->CtxSynchronize();
	if (r != CUDA_SUCCESS)
		err = cuda_alloc_errno(r);
	cuda_vmm_unmap(va, size);
	return err;
}

/*
 * VMM: the memory, zeroed, and its one export, kept until the free: each
 * lease gets a copy of it (gpu_export_fd()). Exporting per client (as NCCL
 * does) would keep no descriptor per tensor in the daemon, but on hardware
 * the export that opens an allocation's shareable file and the close that
 * drops its last reference cost about 0.5 ms each (H100, driver 580:
 * tests/gpu/vmm_cost.c, docs/gpu.md), which made every cold attach cost
 * 1.4 ms. With one export kept, a copy costs a dup and the client's close
 * is not the last. The descriptor is counted against the owner's
 * --max-fds-per-uid like a host tensor's memfd. The fd cannot carry
 * "read-only": writable is enforced by the client library's
 * cuMemSetAccess.
 */
static int cuda_alloc_vmm(struct backend_alloc *a, struct cuda_mem *m, uint64_t size)
{
	CUmemAllocationProp prop;
	CUresult r;
	int err;

	cuda_vmm_prop(m->g.ordinal, &prop);
	r = cuda_api->MemCreate(&m->handle, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		return cuda_alloc_errno(r);
	m->vmm = true;
	err = cuda_vmm_scrub(m->g.ordinal, m->handle, size);
	if (err < 0)
		return err;
	r = cuda_api->MemExportToShareableHandle(&m->g.fd, m->handle,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		m->g.fd = -1;
		return cuda_alloc_errno(r);
	}
	/* The driver does not promise O_CLOEXEC; the daemon never execs, but be tidy. */
	(void)fcntl(m->g.fd, F_SETFD, FD_CLOEXEC);
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD;
	return 0;
}

/* Legacy IPC (gpu_ipc_alloc()), with the device's context current. */
static int cuda_ipc_alloc(uint64_t *ret_ptr, uint64_t size)
{
	CUdeviceptr p = 0;
	CUresult r = cuda_api->MemAlloc(&p, size);

	*ret_ptr = p;
	return td_cuda_errno(r);
}

static int cuda_ipc_zero(uint64_t ptr, uint64_t size)
{
	return td_cuda_errno(cuda_api->MemsetD8(ptr, 0, size));
}

static int cuda_ipc_sync(void)
{
	return td_cuda_errno(cuda_api->CtxSynchronize());
}

static int cuda_ipc_handle(uint8_t *handle, uint64_t ptr)
{
	CUipcMemHandle h;
	CUresult r = cuda_api->IpcGetMemHandle(&h, ptr);

	if (r == CUDA_SUCCESS)
		memcpy(handle, &h, sizeof(h));
	return td_cuda_errno(r);
}

_Static_assert(sizeof(CUipcMemHandle) <= BACKEND_IPC_HANDLE_MAX, "IPC handle size");

static const struct gpu_ipc_ops cuda_ipc = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC,
	.handle_len = sizeof(CUipcMemHandle),
	.alloc = cuda_ipc_alloc,
	.zero = cuda_ipc_zero,
	.sync = cuda_ipc_sync,
	.handle = cuda_ipc_handle,
};

static void cuda_free(struct gpu_mem *g);

static int cuda_backend_alloc(struct backend_alloc *a, uint64_t size, int device_id,
			      const char *name)
{
	int err = gpu_alloc_begin(a, &cuda_gpu, device_id);
	struct cuda_mem *m;
	uint64_t rounded;

	if (err < 0 || size == 0)
		return err;
	m = gpu_mem_new(sizeof(*m), device_id, cuda_free);
	if (!m)
		return -ENOMEM;
	pthread_mutex_lock(&cuda_lock);
	err = cuda_dev_enter(device_id);
	if (err < 0) {
		pthread_mutex_unlock(&cuda_lock);
		free(m);
		return err;
	}
	/* From here release() undoes what is done, the context's reference included. */
	cuda_devs[device_id].allocs++;
	m->ctx = cuda_devs[device_id].ctx;
	a->priv = m;
	err = td_gpu_round_up(size, cuda_devs[device_id].gran, &rounded) < 0 ? -ENOSPC : 0;
	if (err == 0) {
		a->size = rounded;
		a->footprint = rounded;
		if (cuda_devs[device_id].vmm)
			err = cuda_alloc_vmm(a, m, rounded);
		else
			err = gpu_ipc_alloc(&cuda_ipc, a, &m->g, rounded);
	}
	if (err == 0) {
		m->counted = rounded;
		cuda_devs[device_id].alloc_bytes += rounded;
	}
	/* Nothing of ours stays current on a thread that may outlive the context. */
	cuda_api->CtxSetCurrent(NULL);
	cuda_publish(device_id);
	pthread_mutex_unlock(&cuda_lock);
	return err;
}

/*
 * backend_ops.import_fd (restart, docs/restart.md): the VMM allocation that
 * fd, an export a predecessor kept in the descriptor store, refers to,
 * imported again; fd becomes the kept export the leases get copies of.
 * Runs before the daemon serves, so the loop may wait for the driver.
 */
static int cuda_backend_import_fd(struct backend_alloc *a, int fd, uint64_t size, int device_id)
{
	int err = gpu_alloc_begin(a, &cuda_gpu, device_id);
	struct cuda_mem *m =
		err < 0 || size == 0 ? NULL : gpu_mem_new(sizeof(*m), device_id, cuda_free);
	CUresult r;

	if (!m) {
		close(fd);
		return err < 0 ? err : size == 0 ? -EINVAL : -ENOMEM;
	}
	m->g.fd = fd;
	pthread_mutex_lock(&cuda_lock);
	err = cuda_dev_enter(device_id);
	if (err < 0) {
		pthread_mutex_unlock(&cuda_lock);
		close(fd);
		free(m);
		return err;
	}
	/* From here release() undoes what is done, as after cuda_backend_alloc(). */
	cuda_devs[device_id].allocs++;
	m->ctx = cuda_devs[device_id].ctx;
	a->priv = m;
	if (!cuda_devs[device_id].vmm) {
		err = -ENOTSUP;
	} else {
		r = cuda_api->MemImportFromShareableHandle(
			&m->handle, (void *)(uintptr_t)fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		err = r == CUDA_SUCCESS ? 0 : cuda_alloc_errno(r);
		m->vmm = err == 0;
	}
	if (err == 0) {
		a->size = size;
		a->footprint = size;
		a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD;
		m->counted = size;
		cuda_devs[device_id].alloc_bytes += size;
	}
	cuda_api->CtxSetCurrent(NULL);
	cuda_publish(device_id);
	pthread_mutex_unlock(&cuda_lock);
	return err;
}

/*
 * On the worker (gpu_release()), after the kept export was closed: VMM
 * drops the daemon's reference, and the memory lives on while any client
 * still maps it (the driver refcounts it); legacy IPC frees, which
 * synchronizes the device. Then gives back m's hold on the device's
 * context; with the device's last allocation the context's hold starts
 * (cuda_dev_idle()).
 */
static void cuda_free(struct gpu_mem *g)
{
	struct cuda_mem *m = (struct cuda_mem *)g;

	pthread_mutex_lock(&cuda_lock);
	if (cuda_api->CtxSetCurrent(m->ctx) == CUDA_SUCCESS) {
		if (m->vmm)
			cuda_api->MemRelease(m->handle);
		else if (g->ptr)
			cuda_api->MemFree(g->ptr);
	}
	cuda_devs[g->ordinal].alloc_bytes -= m->counted;
	/* Nothing of ours stays current on the worker, held context or not. */
	cuda_api->CtxSetCurrent(NULL);
	if (--cuda_devs[g->ordinal].allocs == 0 && cuda_devs[g->ordinal].ctx)
		cuda_dev_idle(g->ordinal);
	cuda_publish(g->ordinal);
	pthread_mutex_unlock(&cuda_lock);
}

/*
 * backend_ops.copy, on the worker: in the allocation's context, through a
 * mapping made for the call (VMM) or its own address (legacy IPC). A copy
 * from pageable host memory may return before the device has the bytes,
 * so the context is synchronized before the copy counts as done: a client
 * of another process reads them next.
 */
static int cuda_backend_copy(struct backend_alloc *a, uint64_t off, void *buf, size_t n,
			     bool to_host)
{
	struct cuda_mem *m = a->priv;
	CUdeviceptr va = 0;
	CUresult r;
	int err = 0;

	if (n == 0)
		return 0;
	/* A member of a set allocation starts at its offset in it (backend.h, arenas). */
	if (!m || a->ipc_offset > a->size || off > a->size - a->ipc_offset ||
	    n > a->size - a->ipc_offset - off)
		return -EINVAL;
	off += a->ipc_offset;
	r = cuda_api->CtxSetCurrent(m->ctx);
	if (r != CUDA_SUCCESS)
		return td_cuda_errno(r);
	if (m->vmm)
		err = cuda_vmm_map(m->g.ordinal, m->handle, a->size, &va);
	else
		va = m->g.ptr;
	if (err == 0) {
		r = to_host ? cuda_api->MemcpyDtoH(buf, va + off, n)
			    : cuda_api->MemcpyHtoD(va + off, buf, n);
		if (r == CUDA_SUCCESS)
			r = cuda_api->CtxSynchronize();
		err = td_cuda_errno(r);
		if (m->vmm)
			cuda_vmm_unmap(va, a->size);
	}
	cuda_api->CtxSetCurrent(NULL);
	return err;
}

/* On the worker, at the stop: the contexts held idle go now, their holds' timers with them. */
static void cuda_release_held(void *unused)
{
	pthread_mutex_lock(&cuda_lock);
	for (int i = 0; i < cuda_gpu.n; i++)
		if (cuda_devs[i].ctx && cuda_devs[i].allocs == 0)
			cuda_ctx_release(i, "at the stop");
	pthread_mutex_unlock(&cuda_lock);
}

/*
 * At exit, after every allocation was released (their frees queued on the
 * worker): release the contexts held idle on the worker, stop it (which
 * drops the holds' timers), forget the devices. A context whose
 * allocations were never released is released here.
 */
static void cuda_backend_fini(void)
{
	if (cuda_gpu.n)
		gpu_worker_run(cuda_release_held, NULL);
	gpu_worker_stop();
	for (int i = 0; i < cuda_gpu.n; i++)
		if (cuda_devs[i].ctx)
			cuda_api->DevicePrimaryCtxRelease(cuda_devs[i].dev);
	cuda_gpu.n = 0;
}

const struct backend_ops backend_cuda = {
	BACKEND_GPU_VENDOR(cuda),
	.init = cuda_backend_init,
	.fini = cuda_backend_fini,
	.device_count = cuda_backend_device_count,
	.device_uuid = cuda_backend_device_uuid,
	.default_capacity = cuda_backend_default_capacity,
	.path = cuda_backend_path,
	.gpu_bytes = cuda_backend_gpu_bytes,
	.alloc = cuda_backend_alloc,
	.alloc_blocks = true,
	.arenas = true,
	.export_fd = gpu_export_fd,
	.freeze = gpu_freeze,
	.release = gpu_release,
	.copy = cuda_backend_copy,
	.import_fd = cuda_backend_import_fd,
};
