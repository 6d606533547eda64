/*
 * The ROCm HIP runtime API as tensord uses it: a table of function pointers
 * filled from libamdhip64 at run time, so the daemon and the client library
 * start without ROCm and build without its headers (the types we need are
 * declared here when <hip/hip_runtime_api.h> is absent, i.e. when
 * TENSORD_HAVE_HIP_H is unset; hip_api.c checks them against the header
 * when it is present).
 *
 * Only legacy IPC (hipIpcGetMemHandle / hipIpcOpenMemHandle) is used:
 * hipMemExportToShareableHandle returns hipErrorNotSupported before ROCm
 * 6.2, which includes Debian 12's HIP 5.2.
 */
#ifndef TENSORD_HIP_API_H
#define TENSORD_HIP_API_H

#include <stdbool.h>
#include <stddef.h>

#ifdef TENSORD_HAVE_HIP_H
#include <hip/hip_runtime_api.h>
#else
typedef int hipError_t;
typedef int hipDevice_t;
typedef struct ihipStream_t *hipStream_t;
typedef int hipMemcpyKind;

typedef struct hipUUID_t {
	char bytes[16];
} hipUUID;

typedef struct hipIpcMemHandle_st {
	char reserved[64];
} hipIpcMemHandle_t;

#define hipSuccess 0
#define hipErrorInvalidValue 1
#define hipErrorOutOfMemory 2
#define hipErrorNotInitialized 3
#define hipErrorInsufficientDriver 35
#define hipErrorNoDevice 100
#define hipErrorInvalidDevice 101
#define hipErrorInvalidContext 201
#define hipErrorNotSupported 801
#define hipMemcpyDefault 4
#endif /* TENSORD_HAVE_HIP_H */

/* Entry points, named after the runtime's function without "hip". */
struct td_hip_api {
	void *lib;           /* dlopen handle; never closed once loaded */
	const char *libname; /* the name that loaded: "libamdhip64.so.5" */
	int runtime_version; /* 50221153 for HIP 5.2.21153; from the soname if the runtime says 0 */

	hipError_t (*RuntimeGetVersion)(int *version);
	const char *(*GetErrorName)(hipError_t err);
	const char *(*GetErrorString)(hipError_t err);
	hipError_t (*GetDeviceCount)(int *count);
	hipError_t (*DeviceGet)(hipDevice_t *dev, int ordinal);
	hipError_t (*DeviceGetUuid)(hipUUID *uuid, hipDevice_t dev); /* may be NULL */
	hipError_t (*DeviceTotalMem)(size_t *bytes, hipDevice_t dev);
	hipError_t (*SetDevice)(int ordinal);
	hipError_t (*GetDevice)(int *ordinal);
	hipError_t (*Malloc)(void **ptr, size_t size);
	hipError_t (*Free)(void *ptr);
	hipError_t (*Memset)(void *dst, int value, size_t size);
	hipError_t (*DeviceSynchronize)(void);
	hipError_t (*Memcpy)(void *dst, const void *src, size_t size, hipMemcpyKind kind);
	hipError_t (*MemcpyAsync)(void *dst, const void *src, size_t size, hipMemcpyKind kind,
				  hipStream_t stream);
	hipError_t (*StreamSynchronize)(hipStream_t stream);
	hipError_t (*IpcGetMemHandle)(hipIpcMemHandle_t *handle, void *ptr);
	hipError_t (*IpcOpenMemHandle)(void **ptr, hipIpcMemHandle_t handle, unsigned int flags);
	hipError_t (*IpcCloseMemHandle)(void *ptr);
};

/* The device node of the amdgpu compute driver; without it HIP has no GPU. */
#define TD_HIP_KFD "/dev/kfd"

/*
 * The node td_hip_api_get() checks: $TENSORD_HIP_KFD when set and not
 * empty (so a test can run the HIP path over the driver double, which
 * needs no amdgpu driver), else TD_HIP_KFD. Borrowed from the environment.
 */
const char *td_hip_kfd_path(void);

/*
 * Loads libamdhip64 once per process (thread-safe). Loading the runtime
 * is heavy (it pulls in HSA), so it is skipped when td_hip_kfd_path() is
 * missing. 0 and the table, valid for the life of the process; or -ENODEV
 * and *ret_why (mentions libamdhip64 or that node). ret_why may be NULL.
 */
int td_hip_api_get(const struct td_hip_api **ret_api, const char **ret_why);

/*
 * Fills api from the first of the NULL-terminated sonames that loads
 * (dlopen + dlsym only). 0, or -ENODEV with why filled. For
 * td_hip_api_get() and for tests; api->lib is then the caller's.
 */
int td_hip_api_open(struct td_hip_api *api, const char *const *sonames, char *why, size_t why_len);

/* As td_cuda_api_use(): later td_hip_api_get() calls return api (NULL: load). For tests. */
void td_hip_api_use(const struct td_hip_api *api);

/* As td_cuda_api_in_use(), for the HIP runtime. Loads nothing. */
bool td_hip_api_in_use(void);

/* Closes what td_hip_api_open() opened. */
void td_hip_api_close(struct td_hip_api *api);

/*
 * The flags value of hipIpcMemLazyEnablePeerAccess as the loaded runtime
 * understands it: 0 up to HIP 5.7, 1 from ROCm 6.0 (an ABI break), so it
 * is chosen from hipRuntimeGetVersion(), never from the header we built
 * against.
 */
int td_hip_ipc_flag(int runtime_version);

/* The negative errno for a hipError_t, as td_cuda_errno() does for CUDA. */
int td_hip_errno(hipError_t e);

/* Writes "hipErrorX (description)" into buf. Returns buf. api may be NULL. */
const char *td_hip_strerror(const struct td_hip_api *api, hipError_t e, char *buf, size_t len);

#endif /* TENSORD_HIP_API_H */
