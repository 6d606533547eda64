/*
 * Fake CUDA driver and HIP runtime tables for the GPU unit tests. Every
 * entry records its call (name and arguments) in fake_log, so a test can
 * check the order of driver calls that tensord makes, and fake_gpu_install()
 * makes td_cuda_api_get() / td_hip_api_get() return these tables
 * (td_cuda_api_use(), td_hip_api_use()). No driver, no GPU.
 *
 * Devices: fake_uuid[i] is the UUID of this process's ordinal i; a CUdevice
 * (or hipDevice_t) is FAKE_DEV0 + ordinal, so a test notices when a
 * CUdevice is used where an ordinal belongs. Included by one test file
 * each (static definitions).
 */
#ifndef TENSORD_FAKE_GPU_H
#define TENSORD_FAKE_GPU_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "gpu/cuda/cuda_api.h"
#include "gpu/gpu_util.h"
#include "gpu/hip/hip_api.h"

#define FAKE_DEV0 10
#define FAKE_MAX_CALLS 512
#define FAKE_GRAN (2ull << 20)

struct fake_call {
	const char *fn; /* the driver's name for it: "cuMemSetAccess" */
	uint64_t a[4];  /* its arguments, as integers (see each fake) */
	pthread_t tid;  /* the thread that made the call */
};

static struct fake_call fake_log[FAKE_MAX_CALLS];
static int fake_n;
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER; /* calls come from two threads */
static int fake_ndev = 2;
static uint8_t fake_uuid[4][16];
static CUresult fake_set_access_ro_rc;      /* what cuMemSetAccess(PROT_READ) answers */
static CUresult fake_set_access_peers_rc;   /* what cuMemSetAccess for several devices answers */
static unsigned fake_peer_ok;               /* bit i: ordinal i reaches the others' memory */
static int fake_hip_cur;                    /* the HIP thread's current device */
static void (*fake_on_close)(uint64_t ptr); /* called by the IPC close fakes */
/* Called by the fakes that free memory (cuMemFree, cuMemRelease, hipFree) with their name. */
static void (*fake_on_free)(const char *fn, uint64_t key);
static unsigned fake_alloc_delay_ms; /* cuMemCreate and cuMemAlloc take this long */

/*
 * What the fake driver counts as this process's GPU memory per device, for
 * the NVML fake: FAKE_CTX_BYTES per retained primary context, plus the
 * bytes of live allocations (by handle or pointer).
 */
#define FAKE_CTX_BYTES (300ull << 20)
#define FAKE_LIVE_MAX 64
static int fake_ctx_refs[4];
static struct {
	uint64_t key; /* VMM handle or device pointer; 0: free slot */
	int dev;
	uint64_t size;
} fake_live[FAKE_LIVE_MAX];
static uint64_t fake_next_handle = 0x77;

/* Lock held by the caller (fake_lock). */
static void fake_live_add(uint64_t key, int dev, uint64_t size)
{
	for (int i = 0; i < FAKE_LIVE_MAX; i++)
		if (!fake_live[i].key) {
			fake_live[i].key = key;
			fake_live[i].dev = dev;
			fake_live[i].size = size;
			return;
		}
}

static void fake_live_drop(uint64_t key)
{
	for (int i = 0; i < FAKE_LIVE_MAX; i++)
		if (fake_live[i].key == key) {
			fake_live[i].key = 0;
			return;
		}
}

/* This process's bytes on ordinal dev, as the fake driver counts them. */
__attribute__((unused)) static uint64_t fake_process_bytes(int dev)
{
	uint64_t n;

	pthread_mutex_lock(&fake_lock);
	n = (uint64_t)fake_ctx_refs[dev] * FAKE_CTX_BYTES;
	for (int i = 0; i < FAKE_LIVE_MAX; i++)
		if (fake_live[i].key && fake_live[i].dev == dev)
			n += fake_live[i].size;
	pthread_mutex_unlock(&fake_lock);
	return n;
}

static void fake_rec(const char *fn, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3)
{
	pthread_mutex_lock(&fake_lock);
	if (fake_n < FAKE_MAX_CALLS)
		fake_log[fake_n++] = (struct fake_call){ fn, { a0, a1, a2, a3 }, pthread_self() };
	pthread_mutex_unlock(&fake_lock);
}

/* Index of the first call named fn at or after from, or -1. */
__attribute__((unused)) static int fake_find(const char *fn, int from)
{
	for (int i = from < 0 ? 0 : from; i < fake_n; i++)
		if (strcmp(fake_log[i].fn, fn) == 0)
			return i;
	return -1;
}

__attribute__((unused)) static int fake_count(const char *fn)
{
	int n = 0;

	for (int i = 0; i < fake_n; i++)
		n += strcmp(fake_log[i].fn, fn) == 0;
	return n;
}

/* --- CUDA driver ----------------------------------------------------------- */
#define REC(...) fake_rec(__VA_ARGS__)
#define U(x) ((uint64_t)(uintptr_t)(x))

static CUresult f_cuInit(unsigned int f)
{
	REC("cuInit", f, 0, 0, 0);
	return CUDA_SUCCESS;
}
static CUresult f_cuDriverGetVersion(int *v)
{
	*v = 13000;
	return CUDA_SUCCESS;
}
static CUresult f_cuGetErrorName(CUresult e, const char **s)
{
	*s = "CUDA_ERROR_FAKE";
	return CUDA_SUCCESS;
}
static CUresult f_cuGetErrorString(CUresult e, const char **s)
{
	*s = "fake";
	return CUDA_SUCCESS;
}
static CUresult f_cuDeviceGetCount(int *n)
{
	*n = fake_ndev;
	return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGet(CUdevice *d, int ord)
{
	if (ord < 0 || ord >= fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = FAKE_DEV0 + ord;
	return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
	*v = 1; /* VMM and POSIX-fd export */
	return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
	if (d < FAKE_DEV0 || d >= FAKE_DEV0 + fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	memcpy(u->bytes, fake_uuid[d - FAKE_DEV0], 16);
	return CUDA_SUCCESS;
}

/* Whether dev can reach peer's memory: bit (dev's ordinal) of fake_peer_ok. Records both. */
static CUresult f_cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	REC("cuDeviceCanAccessPeer", (uint64_t)dev, (uint64_t)peer, 0, 0);
	if (dev < FAKE_DEV0 || dev >= FAKE_DEV0 + fake_ndev || peer < FAKE_DEV0 ||
	    peer >= FAKE_DEV0 + fake_ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer && (fake_peer_ok >> (dev - FAKE_DEV0) & 1);
	return CUDA_SUCCESS;
}

static CUresult f_cuDeviceTotalMem(size_t *b, CUdevice d)
{
	*b = 16ull << 30;
	return CUDA_SUCCESS;
}

static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	REC("cuDevicePrimaryCtxRetain", (uint64_t)d, 0, 0, 0);
	pthread_mutex_lock(&fake_lock);
	fake_ctx_refs[d - FAKE_DEV0]++;
	pthread_mutex_unlock(&fake_lock);
	*c = (CUcontext)(uintptr_t)(0x1000 + d);
	return CUDA_SUCCESS;
}

static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d)
{
	REC("cuDevicePrimaryCtxRelease", (uint64_t)d, 0, 0, 0);
	pthread_mutex_lock(&fake_lock);
	fake_ctx_refs[d - FAKE_DEV0]--;
	pthread_mutex_unlock(&fake_lock);
	return CUDA_SUCCESS;
}

static __thread uintptr_t fake_cur_ctx; /* this thread's current context */

static CUresult f_cuCtxSetCurrent(CUcontext c)
{
	REC("cuCtxSetCurrent", U(c), 0, 0, 0);
	fake_cur_ctx = (uintptr_t)c;
	return CUDA_SUCCESS;
}

/* The ordinal of the current context's device; 0 when none is current. */
static int fake_cur_dev(void)
{
	return fake_cur_ctx ? (int)(fake_cur_ctx - 0x1000 - FAKE_DEV0) : 0;
}
static CUresult f_cuCtxPushCurrent(CUcontext c)
{
	REC("cuCtxPushCurrent", U(c), 0, 0, 0);
	return CUDA_SUCCESS;
}
static CUresult f_cuCtxPopCurrent(CUcontext *c)
{
	REC("cuCtxPopCurrent", 0, 0, 0, 0);
	*c = NULL;
	return CUDA_SUCCESS;
}
static CUresult f_cuCtxSynchronize(void)
{
	REC("cuCtxSynchronize", 0, 0, 0, 0);
	return CUDA_SUCCESS;
}

static CUdeviceptr fake_next_ptr = 0x10000000;

static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t n)
{
	if (fake_alloc_delay_ms)
		usleep(fake_alloc_delay_ms * 1000u);
	pthread_mutex_lock(&fake_lock);
	*p = fake_next_ptr;
	fake_next_ptr += n;
	fake_live_add(*p, fake_cur_dev(), n);
	pthread_mutex_unlock(&fake_lock);
	REC("cuMemAlloc", *p, n, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemFree(CUdeviceptr p)
{
	REC("cuMemFree", p, 0, 0, 0);
	pthread_mutex_lock(&fake_lock);
	fake_live_drop(p);
	pthread_mutex_unlock(&fake_lock);
	if (fake_on_free)
		fake_on_free("cuMemFree", p);
	return CUDA_SUCCESS;
}
static CUresult f_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n)
{
	REC("cuMemsetD8", p, v, n, 0);
	return CUDA_SUCCESS;
}
static CUresult f_cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n)
{
	REC("cuMemcpy", d, s, n, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n)
{
	REC("cuMemcpyDtoH", U(d), s, n, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n)
{
	REC("cuMemcpyHtoD", d, U(s), n, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
	REC("cuMemcpyAsync", d, s, n, U(st));
	return CUDA_SUCCESS;
}

static CUresult f_cuStreamSynchronize(CUstream st)
{
	REC("cuStreamSynchronize", U(st), 0, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemGetAddressRange(CUdeviceptr *b, size_t *n, CUdeviceptr p)
{
	*b = p;
	*n = 64ull << 20;
	return CUDA_SUCCESS;
}

static CUresult f_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	memset(h, 0x5a, sizeof(*h));
	REC("cuIpcGetMemHandle", p, 0, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int fl)
{
	*p = 0x20000000;
	REC("cuIpcOpenMemHandle", *p, fl, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuIpcCloseMemHandle(CUdeviceptr p)
{
	REC("cuIpcCloseMemHandle", p, 0, 0, 0);
	if (fake_on_close)
		fake_on_close(p);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p,
						CUmemAllocationGranularity_flags o)
{
	*g = FAKE_GRAN;
	return CUDA_SUCCESS;
}

static CUresult f_cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
			      const CUmemAllocationProp *p, unsigned long long f)
{
	if (fake_alloc_delay_ms)
		usleep(fake_alloc_delay_ms * 1000u);
	pthread_mutex_lock(&fake_lock);
	*h = fake_next_handle++;
	fake_live_add(*h, p->location.id - FAKE_DEV0, n);
	pthread_mutex_unlock(&fake_lock);
	REC("cuMemCreate", n, (uint64_t)p->location.id, (uint64_t)p->requestedHandleTypes, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemRelease(CUmemGenericAllocationHandle h)
{
	REC("cuMemRelease", h, 0, 0, 0);
	pthread_mutex_lock(&fake_lock);
	fake_live_drop(h);
	pthread_mutex_unlock(&fake_lock);
	if (fake_on_free)
		fake_on_free("cuMemRelease", h);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemExportToShareableHandle(void *sh, CUmemGenericAllocationHandle h,
					       CUmemAllocationHandleType t, unsigned long long f)
{
	*(int *)sh = dup(2);
	REC("cuMemExportToShareableHandle", h, (uint64_t)t, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
						 CUmemAllocationHandleType t)
{
	*h = 0x88;
	REC("cuMemImportFromShareableHandle", U(os), (uint64_t)t, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t al, CUdeviceptr a,
				      unsigned long long f)
{
	*p = 0x30000000;
	REC("cuMemAddressReserve", *p, n, al, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemAddressFree(CUdeviceptr p, size_t n)
{
	REC("cuMemAddressFree", p, n, 0, 0);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
			   unsigned long long f)
{
	REC("cuMemMap", p, n, off, h);
	return CUDA_SUCCESS;
}

static CUresult f_cuMemUnmap(CUdeviceptr p, size_t n)
{
	REC("cuMemUnmap", p, n, 0, 0);
	return CUDA_SUCCESS;
}

/*
 * Records ptr, size, the number of descriptors and what it answered, then
 * one "cuMemSetAccess.desc" entry per descriptor: its location's type, id
 * and flags, and its index. Several devices at once answer
 * fake_set_access_peers_rc; PROT_READ for any answers fake_set_access_ro_rc.
 */
static CUresult f_cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c)
{
	CUresult rc = CUDA_SUCCESS;

	for (size_t i = 0; i < c && rc == CUDA_SUCCESS; i++)
		if (d[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
			rc = fake_set_access_ro_rc;
	if (c > 1 && fake_set_access_peers_rc != CUDA_SUCCESS)
		rc = fake_set_access_peers_rc;
	REC("cuMemSetAccess", p, n, c, (uint64_t)rc);
	for (size_t i = 0; i < c; i++)
		REC("cuMemSetAccess.desc", (uint64_t)d[i].location.type, (uint64_t)d[i].location.id,
		    (uint64_t)d[i].flags, i);
	return rc;
}

static const struct td_cuda_api fake_cuda = {
	.driver_version = 13000,
	.Init = f_cuInit,
	.DriverGetVersion = f_cuDriverGetVersion,
	.GetErrorName = f_cuGetErrorName,
	.GetErrorString = f_cuGetErrorString,
	.DeviceGetCount = f_cuDeviceGetCount,
	.DeviceGet = f_cuDeviceGet,
	.DeviceGetAttribute = f_cuDeviceGetAttribute,
	.DeviceGetUuid = f_cuDeviceGetUuid,
	.DeviceCanAccessPeer = f_cuDeviceCanAccessPeer,
	.DeviceTotalMem = f_cuDeviceTotalMem,
	.DevicePrimaryCtxRetain = f_cuDevicePrimaryCtxRetain,
	.DevicePrimaryCtxRelease = f_cuDevicePrimaryCtxRelease,
	.CtxSetCurrent = f_cuCtxSetCurrent,
	.CtxPushCurrent = f_cuCtxPushCurrent,
	.CtxPopCurrent = f_cuCtxPopCurrent,
	.CtxSynchronize = f_cuCtxSynchronize,
	.MemAlloc = f_cuMemAlloc,
	.MemFree = f_cuMemFree,
	.MemsetD8 = f_cuMemsetD8,
	.Memcpy = f_cuMemcpy,
	.MemcpyDtoH = f_cuMemcpyDtoH,
	.MemcpyHtoD = f_cuMemcpyHtoD,
	.MemcpyAsync = f_cuMemcpyAsync,
	.StreamSynchronize = f_cuStreamSynchronize,
	.MemGetAddressRange = f_cuMemGetAddressRange,
	.IpcGetMemHandle = f_cuIpcGetMemHandle,
	.IpcOpenMemHandle = f_cuIpcOpenMemHandle,
	.IpcCloseMemHandle = f_cuIpcCloseMemHandle,
	.MemGetAllocationGranularity = f_cuMemGetAllocationGranularity,
	.MemCreate = f_cuMemCreate,
	.MemRelease = f_cuMemRelease,
	.MemExportToShareableHandle = f_cuMemExportToShareableHandle,
	.MemImportFromShareableHandle = f_cuMemImportFromShareableHandle,
	.MemAddressReserve = f_cuMemAddressReserve,
	.MemAddressFree = f_cuMemAddressFree,
	.MemMap = f_cuMemMap,
	.MemUnmap = f_cuMemUnmap,
	.MemSetAccess = f_cuMemSetAccess,
};

/* --- HIP runtime ------------------------------------------------------------ */
static hipError_t f_hipRuntimeGetVersion(int *v)
{
	*v = 60000000;
	return hipSuccess;
}
static const char *f_hipGetErrorName(hipError_t e)
{
	return "hipErrorFake";
}
static const char *f_hipGetErrorString(hipError_t e)
{
	return "fake";
}
static hipError_t f_hipGetDeviceCount(int *n)
{
	*n = fake_ndev;
	return hipSuccess;
}

static hipError_t f_hipDeviceGet(hipDevice_t *d, int ord)
{
	if (ord < 0 || ord >= fake_ndev)
		return hipErrorInvalidDevice;
	*d = FAKE_DEV0 + ord;
	return hipSuccess;
}

static hipError_t f_hipDeviceGetUuid(hipUUID *u, hipDevice_t d)
{
	if (d < FAKE_DEV0 || d >= FAKE_DEV0 + fake_ndev)
		return hipErrorInvalidDevice;
	memcpy(u->bytes, fake_uuid[d - FAKE_DEV0], 16);
	return hipSuccess;
}

static hipError_t f_hipDeviceTotalMem(size_t *b, hipDevice_t d)
{
	*b = 16ull << 30;
	return hipSuccess;
}

static hipError_t f_hipSetDevice(int ord)
{
	REC("hipSetDevice", (uint64_t)ord, 0, 0, 0);
	fake_hip_cur = ord;
	return hipSuccess;
}

static hipError_t f_hipGetDevice(int *ord)
{
	*ord = fake_hip_cur;
	return hipSuccess;
}

static hipError_t f_hipMalloc(void **p, size_t n)
{
	*p = (void *)(uintptr_t)0x40000000;
	REC("hipMalloc", U(*p), n, (uint64_t)fake_hip_cur, 0);
	return hipSuccess;
}

static hipError_t f_hipFree(void *p)
{
	REC("hipFree", U(p), (uint64_t)fake_hip_cur, 0, 0);
	if (fake_on_free)
		fake_on_free("hipFree", U(p));
	return hipSuccess;
}
static hipError_t f_hipMemset(void *p, int v, size_t n)
{
	REC("hipMemset", U(p), (uint64_t)v, n, 0);
	return hipSuccess;
}

/* Records the device current when it ran. */
static hipError_t f_hipDeviceSynchronize(void)
{
	REC("hipDeviceSynchronize", (uint64_t)fake_hip_cur, 0, 0, 0);
	return hipSuccess;
}

static hipError_t f_hipMemcpy(void *d, const void *s, size_t n, hipMemcpyKind k)
{
	REC("hipMemcpy", U(d), U(s), n, (uint64_t)k);
	return hipSuccess;
}

/* Records dst, src, n and the stream; the kind and device go in a second entry. */
static hipError_t f_hipMemcpyAsync(void *d, const void *s, size_t n, hipMemcpyKind k,
				   hipStream_t st)
{
	REC("hipMemcpyAsync", U(d), U(s), n, U(st));
	REC("hipMemcpyAsync.kind", (uint64_t)k, (uint64_t)fake_hip_cur, 0, 0);
	return hipSuccess;
}

static hipError_t f_hipStreamSynchronize(hipStream_t st)
{
	REC("hipStreamSynchronize", U(st), (uint64_t)fake_hip_cur, 0, 0);
	return hipSuccess;
}

static hipError_t f_hipIpcGetMemHandle(hipIpcMemHandle_t *h, void *p)
{
	memset(h, 0x6b, sizeof(*h));
	REC("hipIpcGetMemHandle", U(p), 0, 0, 0);
	return hipSuccess;
}

static hipError_t f_hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t h, unsigned int fl)
{
	*p = (void *)(uintptr_t)0x50000000;
	REC("hipIpcOpenMemHandle", U(*p), fl, (uint64_t)fake_hip_cur, 0);
	return hipSuccess;
}

static hipError_t f_hipIpcCloseMemHandle(void *p)
{
	REC("hipIpcCloseMemHandle", U(p), (uint64_t)fake_hip_cur, 0, 0);
	if (fake_on_close)
		fake_on_close(U(p));
	return hipSuccess;
}

static struct td_hip_api fake_hip = {
	.libname = "libamdhip64-fake",
	.runtime_version = 60000000,
	.RuntimeGetVersion = f_hipRuntimeGetVersion,
	.GetErrorName = f_hipGetErrorName,
	.GetErrorString = f_hipGetErrorString,
	.GetDeviceCount = f_hipGetDeviceCount,
	.DeviceGet = f_hipDeviceGet,
	.DeviceGetUuid = f_hipDeviceGetUuid,
	.DeviceTotalMem = f_hipDeviceTotalMem,
	.SetDevice = f_hipSetDevice,
	.GetDevice = f_hipGetDevice,
	.Malloc = f_hipMalloc,
	.Free = f_hipFree,
	.Memset = f_hipMemset,
	.DeviceSynchronize = f_hipDeviceSynchronize,
	.Memcpy = f_hipMemcpy,
	.MemcpyAsync = f_hipMemcpyAsync,
	.StreamSynchronize = f_hipStreamSynchronize,
	.IpcGetMemHandle = f_hipIpcGetMemHandle,
	.IpcOpenMemHandle = f_hipIpcOpenMemHandle,
	.IpcCloseMemHandle = f_hipIpcCloseMemHandle,
};

#undef REC
#undef U

#ifdef TENSORD_NVML_H
/* --- NVML (gpu/cuda/nvml.h), for files that include it first ------------------ */
static nvmlReturn_t f_nvmlInit(void)
{
	return TD_NVML_SUCCESS;
}

/* A handle is 1 + the ordinal whose UUID formats as uuid. */
static nvmlReturn_t f_nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
	char have[48];

	for (int i = 0; i < fake_ndev; i++)
		if (strcmp(td_gpu_uuid_format(fake_uuid[i], 16, have, sizeof(have)), uuid) == 0) {
			*dev = (nvmlDevice_t)(uintptr_t)(i + 1);
			return TD_NVML_SUCCESS;
		}
	return 13; /* NVML_ERROR_NOT_FOUND */
}

/* This process, with what fake_process_bytes() counts, when that is not 0. */
static nvmlReturn_t f_nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned int *n,
							   td_nvml_process_info *infos)
{
	uint64_t bytes = fake_process_bytes((int)(uintptr_t)dev - 1);

	fake_rec("nvmlDeviceGetComputeRunningProcesses", (uint64_t)(uintptr_t)dev, 0, 0, 0);
	if (!bytes) {
		*n = 0;
		return TD_NVML_SUCCESS;
	}
	if (*n < 1) {
		*n = 1;
		return TD_NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*n = 1;
	infos[0] = (td_nvml_process_info){ (unsigned)getpid(), bytes, 0, 0 };
	return TD_NVML_SUCCESS;
}

static const struct td_nvml_api fake_nvml = {
	.Init = f_nvmlInit,
	.DeviceGetHandleByUUID = f_nvmlDeviceGetHandleByUUID,
	.DeviceGetComputeRunningProcesses = f_nvmlDeviceGetComputeRunningProcesses,
};
#endif

/*
 * Installs both fakes with ndev devices whose UUIDs are all different
 * (byte 0 is 0xA0 + ordinal), each reaching the others' memory
 * (cuDeviceCanAccessPeer), and empties the log.
 */
__attribute__((unused)) static void fake_gpu_install(int ndev)
{
	fake_ndev = ndev;
	for (int i = 0; i < 4; i++)
		memset(fake_uuid[i], 0xA0 + i, sizeof(fake_uuid[i]));
	fake_n = 0;
	fake_set_access_ro_rc = CUDA_SUCCESS;
	fake_set_access_peers_rc = CUDA_SUCCESS;
	fake_peer_ok = ~0u;
	fake_hip_cur = 0;
	fake_on_close = NULL;
	fake_on_free = NULL;
	memset(fake_ctx_refs, 0, sizeof(fake_ctx_refs));
	memset(fake_live, 0, sizeof(fake_live));
	fake_hip.DeviceGetUuid = f_hipDeviceGetUuid;
	td_cuda_api_use(&fake_cuda);
	td_hip_api_use(&fake_hip);
#ifdef TENSORD_NVML_H
	td_nvml_api_use(&fake_nvml);
#endif
}

/* Back to the real loaders. */
__attribute__((unused)) static void fake_gpu_remove(void)
{
	td_cuda_api_use(NULL);
	td_hip_api_use(NULL);
#ifdef TENSORD_NVML_H
	td_nvml_api_use(NULL);
#endif
}

#endif /* TENSORD_FAKE_GPU_H */
