/*
 * libcuda.so.1 of the driver double (double.h): the driver API that
 * tensord, tests/gpu/gpu_suite.c and the Python tests' ctypes consumer
 * call, with the versioned names <cuda.h> maps them to. Declarations come
 * from gpu/cuda/cuda_api.h (ABI-compatible with cuda.h), so the double
 * builds without the toolkit.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "double.h"
#include "gpu/cuda/cuda_api.h"

#define API __attribute__((visibility("default")))
#define ERR_ILLEGAL_ADDRESS 700
#define ERR_PEER_ACCESS_UNSUPPORTED 217

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed" },
	{ CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped" },
	{ ERR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	  "peer access is not supported between these two devices" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ ERR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
	  "an illegal memory access was encountered" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
};

static const CUresult codes[] = {
	[DBL_OK] = CUDA_SUCCESS,
	[DBL_INVALID_VALUE] = CUDA_ERROR_INVALID_VALUE,
	[DBL_OUT_OF_MEMORY] = CUDA_ERROR_OUT_OF_MEMORY,
	[DBL_NOT_INITIALIZED] = CUDA_ERROR_NOT_INITIALIZED,
	[DBL_NO_DEVICE] = CUDA_ERROR_NO_DEVICE,
	[DBL_INVALID_DEVICE] = CUDA_ERROR_INVALID_DEVICE,
	[DBL_INVALID_CONTEXT] = CUDA_ERROR_INVALID_CONTEXT,
	[DBL_MAP_FAILED] = CUDA_ERROR_MAP_FAILED,
	[DBL_ALREADY_MAPPED] = CUDA_ERROR_ALREADY_MAPPED,
	[DBL_INVALID_HANDLE] = CUDA_ERROR_INVALID_HANDLE,
	[DBL_NOT_SUPPORTED] = CUDA_ERROR_NOT_SUPPORTED,
	[DBL_ILLEGAL_ADDRESS] = ERR_ILLEGAL_ADDRESS,
	[DBL_PEER_ACCESS_UNSUPPORTED] = ERR_PEER_ACCESS_UNSUPPORTED,
};

/* A primary context per physical device; CUcontext points at one. */
struct CUctx_st {
	int phys;
};
static struct CUctx_st primary[DBL_MAX_DEV];

/* The calling thread's context stack (cuCtxSetCurrent replaces its top). */
#define STACK_MAX 16
static __thread struct CUctx_st *stack[STACK_MAX];
static __thread int depth;
static int held[DBL_MAX_DEV]; /* this process's retains of each primary context */

static struct CUctx_st *current(void)
{
	return depth ? stack[depth - 1] : NULL;
}

/*
 * The calls this process made, by entry point (each counted as it enters,
 * refused or not), for tests that assert how many a path costs: how many
 * imports a set of tensors takes, say (tdDoubleCalls()). Calls refused
 * before the lock (not initialized, after fork) are not counted. Under the lock.
 */
#define CALLS_MAX 128
static struct {
	const char *fn; /* the entry point's __func__ */
	unsigned long n;
} calls[CALLS_MAX];
static int n_calls;

static void count_call(const char *fn)
{
	int i;

	for (i = 0; i < n_calls && calls[i].fn != fn; i++)
		;
	if (i == n_calls && n_calls < CALLS_MAX)
		calls[n_calls++].fn = fn;
	if (i < n_calls)
		calls[i].n++;
}

/*
 * The double's own entry point (no driver has it): how many calls of fn
 * ("cuMemImportFromShareableHandle") this process made so far. Python
 * tests reach it through ctypes (tests/python/cudrv.py, calls()).
 */
API unsigned long tdDoubleCalls(const char *fn)
{
	unsigned long n = 0;

	dbl_lock();
	for (int i = 0; i < n_calls; i++)
		if (strcmp(calls[i].fn, fn) == 0)
			n += calls[i].n;
	dbl_unlock();
	return n;
}

/*
 * Starts a call: checks the driver's state and takes the lock; with
 * need_ctx, the device of the current context goes to *dev. Returns with
 * the lock held only on success.
 */
static CUresult enter(const char *fn, bool need_ctx, int *dev)
{
	enum dbl_err e = dbl_check(fn);
	struct CUctx_st *c;

	if (e != DBL_OK)
		return codes[e];
	dbl_lock();
	count_call(fn);
	if (!need_ctx)
		return CUDA_SUCCESS;
	c = current();
	if (!c || held[c->phys] == 0) {
		dbl_unlock();
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	*dev = c->phys;
	return CUDA_SUCCESS;
}

static CUresult leave(enum dbl_err e)
{
	dbl_unlock();
	return codes[e];
}

#define ENTER(need_ctx)                                                                            \
	int dev_ = -1;                                                                             \
	CUresult r_ = enter(__func__, need_ctx, &dev_);                                            \
	if (r_ != CUDA_SUCCESS)                                                                    \
		return r_;

/* ---- driver, devices ---------------------------------------------------------- */

API CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return codes[dbl_init("CUDA_VISIBLE_DEVICES")];
}

API CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 13000;
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult err, const char **s)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == err) {
			*s = errors[i].name;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult err, const char **s)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == err) {
			*s = errors[i].text;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuDeviceGetCount(int *n)
{
	ENTER(false);
	*n = dbl_device_count();
	return leave(DBL_OK);
}

/* A CUdevice is the ordinal, as the real driver has it. */
static int phys_of(CUdevice d)
{
	return dbl_physical((int)d);
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	ENTER(false);
	if (phys_of(ordinal) < 0)
		return leave(DBL_INVALID_DEVICE);
	*d = ordinal;
	return leave(DBL_OK);
}

API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d)
{
	ENTER(false);
	if (phys_of(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*v = dbl_vmm();
		break;
	case 75: /* compute capability major */
		*v = 9;
		break;
	case 41: /* unified addressing */
		*v = 1;
		break;
	default:
		*v = 0;
	}
	return leave(DBL_OK);
}

API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	ENTER(false);
	if (phys_of(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	dbl_uuid(phys_of(d), (uint8_t *)u->bytes);
	return leave(DBL_OK);
}

API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
	return cuDeviceGetUuid_v2(u, d);
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	ENTER(false);
	if (phys_of(d) < 0 || len <= 0)
		return leave(DBL_INVALID_DEVICE);
	snprintf(name, (size_t)len, "tensord GPU double %d", phys_of(d));
	return leave(DBL_OK);
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
	ENTER(false);
	if (phys_of(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	*bytes = dbl_total_bytes();
	return leave(DBL_OK);
}

API CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer)
{
	ENTER(false);
	if (phys_of(d) < 0 || phys_of(peer) < 0)
		return leave(DBL_INVALID_DEVICE);
	*can = d != peer && dbl_peer(phys_of(d), phys_of(peer));
	return leave(DBL_OK);
}

/* ---- contexts ---------------------------------------------------------------------- */

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d)
{
	ENTER(false);
	if (phys_of(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	primary[phys_of(d)].phys = phys_of(d);
	held[phys_of(d)]++;
	dbl_ctx_charge(phys_of(d), true);
	*ctx = &primary[phys_of(d)];
	return leave(DBL_OK);
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	ENTER(false);
	if (phys_of(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	if (held[phys_of(d)] == 0)
		return leave(DBL_INVALID_CONTEXT);
	held[phys_of(d)]--;
	dbl_ctx_charge(phys_of(d), false);
	return leave(DBL_OK);
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
	return cuDevicePrimaryCtxRelease_v2(d);
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	ENTER(false);
	if (!ctx) {
		depth = depth ? depth - 1 : 0;
	} else if (depth) {
		stack[depth - 1] = ctx;
	} else {
		stack[depth++] = ctx;
	}
	return leave(DBL_OK);
}

API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
	ENTER(false);
	*ctx = current();
	return leave(DBL_OK);
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	ENTER(false);
	if (!ctx || depth == STACK_MAX)
		return leave(DBL_INVALID_VALUE);
	stack[depth++] = ctx;
	return leave(DBL_OK);
}

API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
	ENTER(false);
	if (!depth)
		return leave(DBL_INVALID_CONTEXT);
	if (ctx)
		*ctx = stack[depth - 1];
	depth--;
	return leave(DBL_OK);
}

API CUresult cuCtxGetDevice(CUdevice *d)
{
	ENTER(true);
	*d = dbl_ordinal(dev_);
	return leave(DBL_OK);
}

API CUresult cuCtxSynchronize(void)
{
	ENTER(true);
	return leave(dbl_sync(0, true));
}

/* ---- streams ------------------------------------------------------------------------- */

API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	(void)flags;
	ENTER(true);
	*s = malloc(1); /* a unique address names it */
	return leave(*s ? DBL_OK : DBL_OUT_OF_MEMORY);
}

API CUresult cuStreamDestroy_v2(CUstream s)
{
	ENTER(false);
	dbl_sync((uintptr_t)s, false); /* its work still completes */
	free(s);
	return leave(DBL_OK);
}

API CUresult cuStreamSynchronize(CUstream s)
{
	ENTER(true);
	/* The legacy default stream waits for every blocking stream. */
	return leave(dbl_sync((uintptr_t)s, s == NULL || s == CU_STREAM_LEGACY));
}

static uintptr_t stream_id(CUstream s)
{
	return s == CU_STREAM_LEGACY ? 0 : (uintptr_t)s;
}

/* ---- legacy memory and IPC --------------------------------------------------------- */

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes)
{
	struct dbl_alloc *a;
	struct dbl_map *m;
	enum dbl_err e;

	ENTER(true);
	e = dbl_alloc_new(dev_, bytes, &a);
	if (e == DBL_OK) {
		e = dbl_map_own(a, dev_, &m);
		if (e == DBL_OK)
			*p = m->addr;
		else
			dbl_alloc_unref(a);
	}
	return leave(e);
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	ENTER(true);
	return leave(dbl_free_own(p, "cuMemFree"));
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	struct dbl_map *m;

	ENTER(true);
	m = dbl_map_find(p, 1);
	if (!m)
		return leave(DBL_INVALID_VALUE);
	if (base)
		*base = m->addr;
	if (size)
		*size = m->size;
	return leave(DBL_OK);
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
	uint64_t used, total = dbl_total_bytes();

	ENTER(true);
	used = dbl_used_bytes(dev_);
	*free_bytes = used < total ? total - used : 0;
	*total_bytes = total;
	return leave(DBL_OK);
}

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	ENTER(true);
	return leave(dbl_ipc_get(p, (struct dbl_ipc_handle *)h));
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	uintptr_t addr;
	enum dbl_err e;

	(void)flags;
	ENTER(true);
	e = dbl_ipc_open((const struct dbl_ipc_handle *)&h, &addr);
	if (e == DBL_OK)
		*p = addr;
	return leave(e);
}

API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	return cuIpcOpenMemHandle_v2(p, h, flags);
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	ENTER(true);
	return leave(dbl_ipc_close(p, "cuIpcCloseMemHandle"));
}

/* ---- copies and memsets ---------------------------------------------------------------- */

static bool is_device(CUdeviceptr p, size_t n)
{
	return n == 0 || dbl_map_find(p, n) != NULL;
}

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	ENTER(true);
	return leave(dbl_copy(dev_, (void *)dst, (const void *)src, n, false));
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	ENTER(true);
	if (!is_device(dst, n))
		return leave(DBL_INVALID_VALUE);
	return leave(dbl_copy(dev_, (void *)dst, src, n, false));
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	ENTER(true);
	if (!is_device(src, n))
		return leave(DBL_INVALID_VALUE);
	return leave(dbl_copy(dev_, dst, (const void *)src, n, false));
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	ENTER(true);
	if (!is_device(dst, n) || !is_device(src, n))
		return leave(DBL_INVALID_VALUE);
	return leave(dbl_copy(dev_, (void *)dst, (const void *)src, n, false));
}

API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	ENTER(true);
	return leave(
		dbl_enqueue(dev_, stream_id(s), DBL_COPY, (void *)dst, (const void *)src, 0, n));
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	return cuMemcpyAsync(dst, (CUdeviceptr)(uintptr_t)src, n, s);
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	return cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, src, n, s);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	return cuMemcpyAsync(dst, src, n, s);
}

/*
 * A memset is asynchronous on its stream and a bad write faults, but a
 * read-only target is refused at once with CUDA_ERROR_INVALID_VALUE, the
 * context left usable (as on hardware: docs/gpu.md, 2026-11-26 run).
 */
API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	enum dbl_err e;

	ENTER(true);
	e = dbl_refuse_read_only(dev_, (void *)dst, n);
	if (e != DBL_OK)
		return leave(e);
	return leave(dbl_enqueue(dev_, stream_id(s), DBL_SET, (void *)dst, NULL, v, n));
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
	return cuMemsetD8Async(dst, v, n, CU_STREAM_LEGACY);
}

/* ---- virtual memory management ------------------------------------------------------- */

#define GRAN (2ull << 20)

static struct dbl_alloc *handle_alloc(CUmemGenericAllocationHandle h)
{
	return (struct dbl_alloc *)(uintptr_t)h;
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags opt)
{
	(void)opt;
	ENTER(false);
	if (!dbl_vmm() || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    dbl_physical(prop->location.id) < 0)
		return leave(dbl_vmm() ? DBL_INVALID_DEVICE : DBL_NOT_SUPPORTED);
	*g = GRAN;
	return leave(DBL_OK);
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	struct dbl_alloc *a;
	enum dbl_err e;

	ENTER(false);
	if (!dbl_vmm())
		return leave(DBL_NOT_SUPPORTED);
	if (flags || size % GRAN || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return leave(DBL_INVALID_VALUE);
	if (dbl_physical(prop->location.id) < 0)
		return leave(DBL_INVALID_DEVICE);
	e = dbl_alloc_new(dbl_physical(prop->location.id), size, &a);
	if (e == DBL_OK)
		*h = (CUmemGenericAllocationHandle)(uintptr_t)a;
	return leave(e);
}

/* The live handle h names, or NULL: a released or unknown one is invalid. */
static struct dbl_alloc *valid_handle(CUmemGenericAllocationHandle h)
{
	struct dbl_alloc *a = handle_alloc(h);

	return dbl_alloc_live(a) && !a->released ? a : NULL;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct dbl_alloc *a;

	ENTER(false);
	a = valid_handle(h);
	if (!a)
		return leave(DBL_INVALID_HANDLE);
	a->released = true;
	dbl_alloc_unref(a);
	return leave(DBL_OK);
}

API CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
					  CUmemAllocationHandleType type, unsigned long long flags)
{
	struct dbl_alloc *a;
	int fd;

	ENTER(false);
	a = valid_handle(h);
	if (!a)
		return leave(DBL_INVALID_HANDLE);
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags)
		return leave(DBL_INVALID_VALUE);
	fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return leave(DBL_OUT_OF_MEMORY);
	*(int *)shareable = fd;
	return leave(DBL_OK);
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
					    CUmemAllocationHandleType type)
{
	struct dbl_alloc *a;
	enum dbl_err e;

	ENTER(false);
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return leave(DBL_INVALID_VALUE);
	e = dbl_alloc_import((int)(intptr_t)os_handle, &a);
	if (e == DBL_OK)
		*h = (CUmemGenericAllocationHandle)(uintptr_t)a;
	return leave(e);
}

API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
				 unsigned long long flags)
{
	uintptr_t start;
	enum dbl_err e;

	(void)addr; /* a hint */
	ENTER(false);
	if (size % GRAN || flags)
		return leave(DBL_INVALID_VALUE);
	e = dbl_reserve(size, align, &start);
	if (e == DBL_OK)
		*p = start;
	return leave(e);
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	ENTER(false);
	return leave(dbl_reserve_free(p, size));
}

API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
		      unsigned long long flags)
{
	struct dbl_alloc *a;

	ENTER(false);
	a = valid_handle(h);
	if (!a)
		return leave(DBL_INVALID_HANDLE);
	if (flags)
		return leave(DBL_INVALID_VALUE);
	return leave(dbl_map_vmm(p, size, offset, a));
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	ENTER(false);
	return leave(dbl_unmap_vmm(p, size));
}

API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	enum dbl_err e = DBL_OK;

	ENTER(false);
	/* Checked first, so a refused call changes nothing. */
	for (size_t i = 0; i < count; i++) {
		int phys = dbl_physical(desc[i].location.id);
		struct dbl_map *m = dbl_map_find(p, size);
		int f = desc[i].flags;

		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || phys < 0)
			return leave(DBL_INVALID_DEVICE);
		if (f != 0 && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return leave(DBL_INVALID_VALUE);
		if (!m || m->kind != DBL_MAP_VMM)
			return leave(DBL_INVALID_VALUE);
		if (f == CU_MEM_ACCESS_FLAGS_PROT_READ && !dbl_prot_read())
			return leave(DBL_NOT_SUPPORTED);
		if (!dbl_peer(m->alloc->dev, phys))
			return leave(DBL_INVALID_DEVICE);
	}
	for (size_t i = 0; i < count && e == DBL_OK; i++)
		e = dbl_set_access(p, size, dbl_physical(desc[i].location.id),
				   (enum dbl_access)desc[i].flags);
	return leave(e);
}

__attribute__((destructor)) static void at_exit(void)
{
	dbl_leak_report("libcuda.so.1");
}
