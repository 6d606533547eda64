/*
 * The CUDA driver API as tensord uses it: a table of function pointers
 * filled from libcuda.so.1 at run time. Neither the daemon nor the client
 * library links libcuda, so both start on machines without an NVIDIA
 * driver, and both build without the CUDA toolkit: the few types and
 * constants we need are declared here when <cuda.h> is absent
 * (TENSORD_HAVE_CUDA_H unset). When it is present, cuda_api.c checks at
 * compile time that our declarations match the toolkit's.
 *
 * Shared by the daemon (gpu/cuda/backend_cuda.c) and the client library
 * (gpu/cuda/import_cuda.c); compiled into both.
 */
#ifndef TENSORD_CUDA_API_H
#define TENSORD_CUDA_API_H

#include <stdbool.h>
#include <stddef.h>

#ifdef TENSORD_HAVE_CUDA_H
#include <cuda.h>
#else
/* ABI-compatible subsets of the declarations in NVIDIA's cuda.h. */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUdevice_attribute;
typedef int CUmemAllocationHandleType;
typedef int CUmemAllocationGranularity_flags;
typedef int CUmemAccess_flags;

typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;

typedef struct CUipcMemHandle_st {
	char reserved[64];
} CUipcMemHandle;

typedef struct CUmemLocation_st {
	int type;
	int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	CUmemAccess_flags flags;
} CUmemAccessDesc;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_STUB_LIBRARY 34
#define CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER 36
#define CUDA_ERROR_DEVICE_UNAVAILABLE 46
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_MAP_FAILED 205
#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_OPERATING_SYSTEM 304
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803
#define CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE 804

#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READ 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_STREAM_LEGACY ((CUstream)0x1)
#endif /* TENSORD_HAVE_CUDA_H */

/*
 * Entry points, named after the driver's function without the "cu" prefix
 * (the toolkit header #defines many plain names to versioned ones, which
 * would rename struct members). Each is resolved by its exported, versioned
 * symbol name, so the ABI matches the prototype below. The VMM entries are
 * NULL on drivers older than CUDA 10.2; everything else is required.
 */
struct td_cuda_api {
	void *lib;          /* dlopen handle; never closed once loaded */
	int driver_version; /* 12040 for CUDA 12.4 */

	CUresult (*Init)(unsigned int flags);
	CUresult (*DriverGetVersion)(int *version);
	CUresult (*GetErrorName)(CUresult err, const char **str);
	CUresult (*GetErrorString)(CUresult err, const char **str);
	CUresult (*DeviceGetCount)(int *count);
	CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
	CUresult (*DeviceGetAttribute)(int *value, CUdevice_attribute attr, CUdevice dev);
	CUresult (*DeviceGetUuid)(CUuuid *uuid, CUdevice dev);
	CUresult (*DeviceCanAccessPeer)(int *can, CUdevice dev, CUdevice peer);
	CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice dev);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);
	CUresult (*CtxSetCurrent)(CUcontext ctx);
	CUresult (*CtxPushCurrent)(CUcontext ctx);
	CUresult (*CtxPopCurrent)(CUcontext *ctx);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemAlloc)(CUdeviceptr *dptr, size_t bytes);
	CUresult (*MemFree)(CUdeviceptr dptr);
	CUresult (*MemsetD8)(CUdeviceptr dptr, unsigned char value, size_t n);
	CUresult (*Memcpy)(CUdeviceptr dst, CUdeviceptr src, size_t n);
	CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);
	CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);
	CUresult (*MemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream);
	CUresult (*StreamSynchronize)(CUstream stream);
	CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *handle, CUdeviceptr dptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr dptr);

	/* Virtual memory management; all NULL or all set. */
	CUresult (*MemGetAllocationGranularity)(size_t *gran, const CUmemAllocationProp *prop,
						CUmemAllocationGranularity_flags option);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *h, size_t size,
			      const CUmemAllocationProp *prop, unsigned long long flags);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle h);
	CUresult (*MemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle h,
					       CUmemAllocationHandleType type,
					       unsigned long long flags);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *h, void *os_handle,
						 CUmemAllocationHandleType type);
	CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
				      unsigned long long flags);
	CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t size);
	CUresult (*MemMap)(CUdeviceptr ptr, size_t size, size_t offset,
			   CUmemGenericAllocationHandle h, unsigned long long flags);
	CUresult (*MemUnmap)(CUdeviceptr ptr, size_t size);
	CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				 size_t count);
};

/* The soname the driver installs; never "libcuda.so", the toolkit's stub. */
#define TD_CUDA_LIBNAME "libcuda.so.1"

/*
 * Loads libcuda once per process (thread-safe), runs cuInit(0), and
 * returns the table, valid for the life of the process. On failure returns
 * -ENODEV and *ret_why says why, starting with the library's name
 * ("libcuda.so.1: cannot open shared object file: ..."); the answer is the
 * same on every later call. ret_why may be NULL.
 */
int td_cuda_api_get(const struct td_cuda_api **ret_api, const char **ret_why);

/*
 * Fills api from the library soname (dlopen + dlsym only: no cuInit). For
 * td_cuda_api_get() and for tests. 0, or -ENODEV with why filled. On
 * success api->lib is owned by the caller (td_cuda_api_close()).
 */
int td_cuda_api_open(struct td_cuda_api *api, const char *soname, char *why, size_t why_len);

/*
 * Makes every later td_cuda_api_get() in this process return api instead of
 * loading libcuda (NULL: load it as usual). For unit tests, which install
 * a table of fakes that record their calls. Borrowed: api must outlive its
 * use.
 */
void td_cuda_api_use(const struct td_cuda_api *api);

/*
 * Whether this process initialised the driver through td_cuda_api_get()
 * (or uses a table given to td_cuda_api_use()): a child forked from it
 * must make no driver call. Loads nothing.
 */
bool td_cuda_api_in_use(void);

/* Closes what td_cuda_api_open() opened. NULL-safe on api->lib. */
void td_cuda_api_close(struct td_cuda_api *api);

/* True when the VMM entry points (cuMemCreate and friends) resolved. */
int td_cuda_api_has_vmm(const struct td_cuda_api *api);

/*
 * The negative errno for a CUresult: CUDA_SUCCESS 0, out of memory
 * -ENOMEM, invalid value -EINVAL, no device / stub library / no driver
 * -ENODEV (also "needs a newer driver"), not permitted -EPERM, not supported -EOPNOTSUPP, else -EIO.
 */
int td_cuda_errno(CUresult r);

/* Writes "CUDA_ERROR_X (description)" for r into buf. Returns buf. api may be NULL. */
const char *td_cuda_strerror(const struct td_cuda_api *api, CUresult r, char *buf, size_t len);

#endif /* TENSORD_CUDA_API_H */
