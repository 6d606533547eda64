/*
 * libamdhip64.so.6 of the driver double (double.h): the HIP runtime calls
 * gpu/hip/hip_api.c resolves, so the daemon's hip backend and the client's
 * HIP importer run over real memory shared between processes. Declarations
 * come from gpu/hip/hip_api.h without TENSORD_HAVE_HIP_H (never ROCm's
 * headers), so the double builds on any machine.
 *
 * As the runtime does, it initializes itself on the first call, keeps the
 * current device per thread (0 until hipSetDevice), and answers a ROCm 6
 * version, whose hipIpcOpenMemHandle takes only hipIpcMemLazyEnablePeerAccess
 * (1): a caller passing HIP 5's 0 gets hipErrorInvalidValue, as on ROCm 6.
 * hipMemset is a kernel on the null stream (queued until a synchronize; a
 * bad write faults and poisons the process), hipMemcpy is synchronous, and
 * hipFree waits for the null stream first, as ROCm's does. The runtime's own
 * per-device state (a context, charged to the device's memory) lasts until
 * the process exits and is no leak; what the leak report lists is memory,
 * mappings and queued work still held then.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "double.h"
#include "gpu/hip/hip_api.h"

#define API __attribute__((visibility("default")))

/* hip_runtime_api.h values that hip_api.h does not declare. */
#define ERR_INVALID_MEMCPY_DIRECTION 21
#define ERR_MAP_FAILED 205
#define ERR_ALREADY_MAPPED 208
#define ERR_PEER_ACCESS_UNSUPPORTED 217
#define ERR_INVALID_HANDLE 400
#define ERR_ILLEGAL_ADDRESS 700
#define ERR_UNKNOWN 999
#define IPC_LAZY_ENABLE_PEER_ACCESS 1 /* ROCm 6; 0 up to HIP 5.7 */
#define RUNTIME_VERSION 60200000      /* ROCm 6.2 */

enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, DEFAULT = 4 };

static const struct {
	hipError_t code;
	const char *name, *text;
} errors[] = {
	{ hipSuccess, "hipSuccess", "no error" },
	{ hipErrorInvalidValue, "hipErrorInvalidValue", "invalid argument" },
	{ hipErrorOutOfMemory, "hipErrorOutOfMemory", "out of memory" },
	{ hipErrorNotInitialized, "hipErrorNotInitialized", "initialization error" },
	{ ERR_INVALID_MEMCPY_DIRECTION, "hipErrorInvalidMemcpyDirection",
	  "invalid copy direction for memcpy" },
	{ hipErrorNoDevice, "hipErrorNoDevice", "no ROCm-capable device is detected" },
	{ hipErrorInvalidDevice, "hipErrorInvalidDevice", "invalid device ordinal" },
	{ hipErrorInvalidContext, "hipErrorInvalidContext", "invalid device context" },
	{ ERR_MAP_FAILED, "hipErrorMapFailed", "mapping of buffer object failed" },
	{ ERR_ALREADY_MAPPED, "hipErrorAlreadyMapped", "resource already mapped" },
	{ ERR_PEER_ACCESS_UNSUPPORTED, "hipErrorPeerAccessUnsupported",
	  "peer access is not supported between these two devices" },
	{ ERR_INVALID_HANDLE, "hipErrorInvalidHandle", "invalid resource handle" },
	{ ERR_ILLEGAL_ADDRESS, "hipErrorIllegalAddress",
	  "an illegal memory access was encountered" },
	{ hipErrorNotSupported, "hipErrorNotSupported", "operation not supported" },
	{ ERR_UNKNOWN, "hipErrorUnknown", "unknown error" },
};

static const hipError_t codes[] = {
	[DBL_OK] = hipSuccess,
	[DBL_INVALID_VALUE] = hipErrorInvalidValue,
	[DBL_OUT_OF_MEMORY] = hipErrorOutOfMemory,
	[DBL_NOT_INITIALIZED] = hipErrorNotInitialized,
	[DBL_NO_DEVICE] = hipErrorNoDevice,
	[DBL_INVALID_DEVICE] = hipErrorInvalidDevice,
	[DBL_INVALID_CONTEXT] = hipErrorInvalidContext,
	[DBL_MAP_FAILED] = ERR_MAP_FAILED,
	[DBL_ALREADY_MAPPED] = ERR_ALREADY_MAPPED,
	[DBL_INVALID_HANDLE] = ERR_INVALID_HANDLE,
	[DBL_NOT_SUPPORTED] = hipErrorNotSupported,
	[DBL_ILLEGAL_ADDRESS] = ERR_ILLEGAL_ADDRESS,
	[DBL_PEER_ACCESS_UNSUPPORTED] = ERR_PEER_ACCESS_UNSUPPORTED,
};

static __thread int current;      /* the thread's device (an ordinal) */
static bool charged[DBL_MAX_DEV]; /* the runtime's state on each physical device */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static enum dbl_err init_result;

static void init_once(void)
{
	init_result = dbl_init("HIP_VISIBLE_DEVICES");
}

/*
 * Starts a call: initializes on the first one (the runtime has no init
 * call), checks the runtime's state and takes the lock; with need_dev, the
 * physical device of the thread's current one goes to *dev, and the
 * runtime's state there is made (and charged) on first use. Returns with
 * the lock held only on success.
 */
static hipError_t enter(const char *fn, bool need_dev, int *dev)
{
	enum dbl_err e;

	pthread_once(&once, init_once);
	e = init_result == DBL_NOT_INITIALIZED ? init_result : dbl_check(fn);
	if (e != DBL_OK)
		return codes[e];
	dbl_lock();
	if (!need_dev)
		return hipSuccess;
	*dev = dbl_physical(current);
	if (*dev < 0) {
		dbl_unlock();
		return dbl_device_count() ? hipErrorInvalidDevice : hipErrorNoDevice;
	}
	if (!charged[*dev]) {
		charged[*dev] = true;
		dbl_ctx_charge(*dev, true);
	}
	return hipSuccess;
}

static hipError_t leave(enum dbl_err e)
{
	dbl_unlock();
	return codes[e];
}

#define ENTER(need_dev)                                                                            \
	int dev_ = -1;                                                                             \
	hipError_t r_ = enter(__func__, need_dev, &dev_);                                          \
	if (r_ != hipSuccess)                                                                      \
		return r_;

/* ---- runtime, errors, devices ----------------------------------------------------- */

API hipError_t hipRuntimeGetVersion(int *v)
{
	if (!v)
		return hipErrorInvalidValue;
	*v = RUNTIME_VERSION;
	return hipSuccess;
}

static size_t error_index(hipError_t err)
{
	size_t n = sizeof(errors) / sizeof(errors[0]);

	for (size_t i = 0; i < n; i++)
		if (errors[i].code == err)
			return i;
	return n - 1; /* hipErrorUnknown */
}

API const char *hipGetErrorName(hipError_t err)
{
	return errors[error_index(err)].name;
}

API const char *hipGetErrorString(hipError_t err)
{
	return errors[error_index(err)].text;
}

API hipError_t hipGetDeviceCount(int *n)
{
	int count;

	if (!n)
		return hipErrorInvalidValue;
	ENTER(false);
	count = dbl_device_count();
	*n = count;
	return leave(count ? DBL_OK : DBL_NO_DEVICE);
}

/* A hipDevice_t is the ordinal, as the runtime has it. */
API hipError_t hipDeviceGet(hipDevice_t *d, int ordinal)
{
	ENTER(false);
	if (!d)
		return leave(DBL_INVALID_VALUE);
	if (dbl_physical(ordinal) < 0)
		return leave(DBL_INVALID_DEVICE);
	*d = ordinal;
	return leave(DBL_OK);
}

API hipError_t hipDeviceGetUuid(hipUUID *u, hipDevice_t d)
{
	ENTER(false);
	if (!u)
		return leave(DBL_INVALID_VALUE);
	if (dbl_physical(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	dbl_uuid(dbl_physical(d), (uint8_t *)u->bytes);
	return leave(DBL_OK);
}

API hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t d)
{
	ENTER(false);
	if (!bytes)
		return leave(DBL_INVALID_VALUE);
	if (dbl_physical(d) < 0)
		return leave(DBL_INVALID_DEVICE);
	*bytes = dbl_total_bytes();
	return leave(DBL_OK);
}

API hipError_t hipSetDevice(int ordinal)
{
	ENTER(false);
	if (dbl_physical(ordinal) < 0)
		return leave(DBL_INVALID_DEVICE);
	current = ordinal;
	return leave(DBL_OK);
}

API hipError_t hipGetDevice(int *ordinal)
{
	ENTER(false);
	if (!ordinal)
		return leave(DBL_INVALID_VALUE);
	*ordinal = current;
	return leave(DBL_OK);
}

API hipError_t hipDeviceSynchronize(void)
{
	ENTER(true);
	return leave(dbl_sync(0, true));
}

API hipError_t hipStreamSynchronize(hipStream_t s)
{
	ENTER(true);
	/* The null stream waits for every blocking stream. */
	return leave(dbl_sync((uintptr_t)s, s == NULL));
}

/* ---- memory and IPC ----------------------------------------------------------------- */

API hipError_t hipMalloc(void **p, size_t bytes)
{
	struct dbl_alloc *a;
	struct dbl_map *m;
	enum dbl_err e;

	ENTER(true);
	if (!p)
		return leave(DBL_INVALID_VALUE);
	*p = NULL;
	if (bytes == 0) /* HIP answers success and NULL */
		return leave(DBL_OK);
	e = dbl_alloc_new(dev_, bytes, &a);
	if (e == DBL_OK) {
		e = dbl_map_own(a, dev_, &m);
		if (e == DBL_OK)
			*p = (void *)m->addr;
		else
			dbl_alloc_unref(a);
	}
	return leave(e);
}

API hipError_t hipFree(void *p)
{
	enum dbl_err e;

	ENTER(false);
	if (!p)
		return leave(DBL_OK);
	/* ROCm's hipFree finishes the null stream (which waits for the others) first. */
	e = dbl_sync(0, true);
	if (e == DBL_OK)
		e = dbl_free_own((uintptr_t)p, "hipFree");
	return leave(e);
}

API hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *h, void *p)
{
	_Static_assert(sizeof(hipIpcMemHandle_t) == sizeof(struct dbl_ipc_handle), "IPC handle");

	ENTER(false);
	if (!h)
		return leave(DBL_INVALID_VALUE);
	return leave(dbl_ipc_get((uintptr_t)p, (struct dbl_ipc_handle *)h));
}

API hipError_t hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t h, unsigned int flags)
{
	uintptr_t addr;
	enum dbl_err e;

	ENTER(true);
	if (!p || flags != IPC_LAZY_ENABLE_PEER_ACCESS)
		return leave(DBL_INVALID_VALUE);
	e = dbl_ipc_open((const struct dbl_ipc_handle *)&h, &addr);
	if (e == DBL_OK)
		*p = (void *)addr;
	return leave(e);
}

API hipError_t hipIpcCloseMemHandle(void *p)
{
	ENTER(false);
	return leave(dbl_ipc_close((uintptr_t)p, "hipIpcCloseMemHandle"));
}

/* ---- copies and memsets --------------------------------------------------------------- */

static bool is_device(const void *p, size_t n)
{
	return n == 0 || dbl_map_find((uintptr_t)p, n) != NULL;
}

/* Whether kind agrees with where dst and src are (hipMemcpyDefault: anything). */
static hipError_t check_kind(int kind, const void *dst, const void *src, size_t n)
{
	bool dd = is_device(dst, n), sd = is_device(src, n);

	switch (kind) {
	case H2H:
	case DEFAULT:
		return hipSuccess;
	case H2D:
		return dd ? hipSuccess : hipErrorInvalidValue;
	case D2H:
		return sd ? hipSuccess : hipErrorInvalidValue;
	case D2D:
		return dd && sd ? hipSuccess : hipErrorInvalidValue;
	default:
		return ERR_INVALID_MEMCPY_DIRECTION;
	}
}

API hipError_t hipMemcpy(void *dst, const void *src, size_t n, hipMemcpyKind kind)
{
	hipError_t r;

	ENTER(true);
	r = check_kind(kind, dst, src, n);
	if (r != hipSuccess) {
		dbl_unlock();
		return r;
	}
	return leave(dbl_copy(dev_, dst, src, n, false));
}

API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, hipMemcpyKind kind,
			      hipStream_t s)
{
	hipError_t r;

	ENTER(true);
	r = check_kind(kind, dst, src, n);
	if (r != hipSuccess) {
		dbl_unlock();
		return r;
	}
	return leave(dbl_enqueue(dev_, (uintptr_t)s, DBL_COPY, dst, src, 0, n));
}

/* A memset is a kernel on the null stream: asynchronous, and a bad write faults. */
API hipError_t hipMemset(void *dst, int value, size_t n)
{
	ENTER(true);
	return leave(dbl_enqueue(dev_, 0, DBL_SET, dst, NULL, value, n));
}

__attribute__((destructor)) static void at_exit(void)
{
	/* The runtime's per-device state goes with the process: not a leak. */
	for (int d = 0; d < DBL_MAX_DEV; d++)
		if (charged[d])
			dbl_ctx_charge(d, false);
	dbl_leak_report("libamdhip64.so.6");
}
