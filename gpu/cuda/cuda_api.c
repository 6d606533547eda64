/*
 * Run-time loading of the CUDA driver API. See cuda_api.h; gpu/driver.h
 * does the loading that every vendor's shim shares.
 *
 * Symbols are looked up by their exported, versioned names (cuMemAlloc_v2,
 * cuIpcOpenMemHandle_v2, ...) with plain dlsym rather than through
 * cuGetProcAddress: the exported name pins the ABI our prototype was
 * written for, and dlsym needs no driver call, so a broken or stub driver
 * is reported by cuInit with its own error code instead of by the loader.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"
#include "gpu/driver.h"

#ifdef TENSORD_HAVE_CUDA_H
/*
 * The build without the toolkit uses our own declarations; prove here, in
 * the build with it, that they describe the same ABI.
 */
_Static_assert(sizeof(CUuuid) == 16, "CUuuid");
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr");
_Static_assert(sizeof(CUmemGenericAllocationHandle) == 8, "CUmemGenericAllocationHandle");
_Static_assert(sizeof(CUresult) == sizeof(int), "CUresult");
_Static_assert(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED == 102, "attr 102");
_Static_assert(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED == 103, "attr 103");
_Static_assert(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 1, "posix fd");
_Static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == 1, "pinned");
_Static_assert(CU_MEM_LOCATION_TYPE_DEVICE == 1, "device location");
_Static_assert(CU_MEM_ALLOC_GRANULARITY_MINIMUM == 0, "granularity");
_Static_assert(CU_MEM_ACCESS_FLAGS_PROT_READ == 1, "prot read");
_Static_assert(CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3, "prot rw");
_Static_assert(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == 1, "lazy peer");
_Static_assert(sizeof(CUstream) == sizeof(void *), "CUstream");
_Static_assert(CUDA_ERROR_STUB_LIBRARY == 34 && CUDA_ERROR_NO_DEVICE == 100, "errors");
_Static_assert(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER == 36, "errors");
_Static_assert(CUDA_ERROR_INVALID_VALUE == 1 && CUDA_ERROR_OUT_OF_MEMORY == 2, "errors");
_Static_assert(CUDA_ERROR_NOT_INITIALIZED == 3 && CUDA_ERROR_DEINITIALIZED == 4, "errors");
_Static_assert(CUDA_ERROR_DEVICE_UNAVAILABLE == 46 && CUDA_ERROR_INVALID_DEVICE == 101, "errors");
_Static_assert(CUDA_ERROR_INVALID_CONTEXT == 201 && CUDA_ERROR_MAP_FAILED == 205, "errors");
_Static_assert(CUDA_ERROR_ALREADY_MAPPED == 208 && CUDA_ERROR_OPERATING_SYSTEM == 304, "errors");
_Static_assert(CUDA_ERROR_INVALID_HANDLE == 400, "errors");
_Static_assert(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH == 803, "errors");
_Static_assert(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE == 804, "errors");
_Static_assert(CUDA_ERROR_NOT_SUPPORTED == 801 && CUDA_ERROR_NOT_PERMITTED == 800, "errors");
#endif

/* Groups of entry points: the VMM ones are there all together or not at all. */
enum { SYM_REQUIRED, SYM_VMM };

static const struct td_gpu_sym td_cuda_syms[] = {
#define SYM(field, name, alt, group)                                                               \
	{                                                                                          \
		name, alt, offsetof(struct td_cuda_api, field), group                              \
	}
	SYM(Init, "cuInit", NULL, SYM_REQUIRED),
	SYM(DriverGetVersion, "cuDriverGetVersion", NULL, SYM_REQUIRED),
	SYM(GetErrorName, "cuGetErrorName", NULL, SYM_REQUIRED),
	SYM(GetErrorString, "cuGetErrorString", NULL, SYM_REQUIRED),
	SYM(DeviceGetCount, "cuDeviceGetCount", NULL, SYM_REQUIRED),
	SYM(DeviceGet, "cuDeviceGet", NULL, SYM_REQUIRED),
	SYM(DeviceGetAttribute, "cuDeviceGetAttribute", NULL, SYM_REQUIRED),
	/* _v2 (CUDA 11.4) gives MIG instances their own UUID. */
	SYM(DeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid", SYM_REQUIRED),
	/* Which of this process's devices may be given access to a VMM mapping. */
	SYM(DeviceCanAccessPeer, "cuDeviceCanAccessPeer", NULL, SYM_REQUIRED),
	SYM(DeviceTotalMem, "cuDeviceTotalMem_v2", NULL, SYM_REQUIRED),
	SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL, SYM_REQUIRED),
	SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease",
	    SYM_REQUIRED),
	SYM(CtxSetCurrent, "cuCtxSetCurrent", NULL, SYM_REQUIRED),
	SYM(CtxPushCurrent, "cuCtxPushCurrent_v2", NULL, SYM_REQUIRED),
	SYM(CtxPopCurrent, "cuCtxPopCurrent_v2", NULL, SYM_REQUIRED),
	SYM(CtxSynchronize, "cuCtxSynchronize", NULL, SYM_REQUIRED),
	SYM(MemAlloc, "cuMemAlloc_v2", NULL, SYM_REQUIRED),
	SYM(MemFree, "cuMemFree_v2", NULL, SYM_REQUIRED),
	SYM(MemsetD8, "cuMemsetD8_v2", NULL, SYM_REQUIRED),
	SYM(Memcpy, "cuMemcpy", NULL, SYM_REQUIRED),
	/* The daemon's staging of remote attach (backend_ops.copy). */
	SYM(MemcpyDtoH, "cuMemcpyDtoH_v2", NULL, SYM_REQUIRED),
	SYM(MemcpyHtoD, "cuMemcpyHtoD_v2", NULL, SYM_REQUIRED),
	/* The plain names take the stream they are given (legacy or not). */
	SYM(MemcpyAsync, "cuMemcpyAsync", NULL, SYM_REQUIRED),
	SYM(StreamSynchronize, "cuStreamSynchronize", NULL, SYM_REQUIRED),
	SYM(MemGetAddressRange, "cuMemGetAddressRange_v2", NULL, SYM_REQUIRED),
	SYM(IpcGetMemHandle, "cuIpcGetMemHandle", NULL, SYM_REQUIRED),
	/*
	 * _v2 (CUDA 11.0) refcounts a second open of the same handle in one
	 * context instead of failing; the old symbol stays for old drivers.
	 */
	SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", SYM_REQUIRED),
	SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle", NULL, SYM_REQUIRED),
	SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL, SYM_VMM),
	SYM(MemCreate, "cuMemCreate", NULL, SYM_VMM),
	SYM(MemRelease, "cuMemRelease", NULL, SYM_VMM),
	SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle", NULL, SYM_VMM),
	SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle", NULL, SYM_VMM),
	SYM(MemAddressReserve, "cuMemAddressReserve", NULL, SYM_VMM),
	SYM(MemAddressFree, "cuMemAddressFree", NULL, SYM_VMM),
	SYM(MemMap, "cuMemMap", NULL, SYM_VMM),
	SYM(MemUnmap, "cuMemUnmap", NULL, SYM_VMM),
	SYM(MemSetAccess, "cuMemSetAccess", NULL, SYM_VMM),
#undef SYM
};

int td_cuda_api_open(struct td_cuda_api *api, const char *soname, char *why, size_t why_len)
{
	const char *const sonames[] = { soname, NULL };

	memset(api, 0, sizeof(*api));
	api->lib = td_gpu_dlopen(sonames, NULL, why, why_len);
	if (!api->lib)
		return -ENODEV;
	if (td_gpu_dlsym(api->lib, soname, td_cuda_syms,
			 sizeof(td_cuda_syms) / sizeof(td_cuda_syms[0]), api, " (driver too old)",
			 why, why_len) < 0) {
		td_cuda_api_close(api);
		return -ENODEV;
	}
	return 0;
}

void td_cuda_api_close(struct td_cuda_api *api)
{
	if (api->lib)
		dlclose(api->lib);
	memset(api, 0, sizeof(*api));
}

int td_cuda_api_has_vmm(const struct td_cuda_api *api)
{
	return api->MemCreate != NULL;
}

int td_cuda_errno(CUresult r)
{
	switch ((int)r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_STUB_LIBRARY:
	case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
	case CUDA_ERROR_DEVICE_UNAVAILABLE:
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
	case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

const char *td_cuda_strerror(const struct td_cuda_api *api, CUresult r, char *buf, size_t len)
{
	const char *name = NULL, *desc = NULL;

	if (api && api->GetErrorName && api->GetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	if (api && api->GetErrorString && api->GetErrorString(r, &desc) != CUDA_SUCCESS)
		desc = NULL;
	if (name && desc)
		snprintf(buf, len, "%s (%s)", name, desc);
	else
		snprintf(buf, len, "CUresult %d", (int)r);
	return buf;
}

/* The process-wide table, loaded by the first td_cuda_api_get(). */
static struct td_cuda_api td_cuda_global;
static struct td_gpu_driver td_cuda_driver = { .once = PTHREAD_ONCE_INIT,
					       .table = &td_cuda_global };

/* Loaded means cuInit succeeded in this process. */
static void td_cuda_load(void)
{
	struct td_gpu_driver *d = &td_cuda_driver;
	struct td_cuda_api *api = &td_cuda_global;
	char err[128];
	CUresult r;

	d->status = td_cuda_api_open(api, TD_CUDA_LIBNAME, d->why, sizeof(d->why));
	if (d->status < 0)
		return;
	/*
	 * A stub libcuda (CUDA_ERROR_STUB_LIBRARY) or a driver with no GPU
	 * (CUDA_ERROR_NO_DEVICE) loads fine and fails here; both mean "no
	 * CUDA" to the caller. The library stays loaded: unloading a driver
	 * that may have started threads is not worth the risk.
	 */
	r = api->Init(0);
	if (r != CUDA_SUCCESS) {
		snprintf(d->why, sizeof(d->why), "%s: cuInit: %s", TD_CUDA_LIBNAME,
			 td_cuda_strerror(api, r, err, sizeof(err)));
		d->status = -ENODEV;
		return;
	}
	if (api->DriverGetVersion(&api->driver_version) != CUDA_SUCCESS)
		api->driver_version = 0;
	d->status = 0;
	d->loaded = true;
}

void td_cuda_api_use(const struct td_cuda_api *api)
{
	td_gpu_driver_use(&td_cuda_driver, api);
}

bool td_cuda_api_in_use(void)
{
	return td_gpu_driver_in_use(&td_cuda_driver);
}

int td_cuda_api_get(const struct td_cuda_api **ret_api, const char **ret_why)
{
	const void *table;
	int r = td_gpu_driver_get(&td_cuda_driver, td_cuda_load, &table, ret_why);

	if (r == 0)
		*ret_api = table;
	return r;
}
