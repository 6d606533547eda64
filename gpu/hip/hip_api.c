/*
 * Run-time loading of the HIP runtime. See hip_api.h; gpu/driver.h does
 * the loading that every vendor's shim shares.
 *
 * HIP symbols carry ELF versions (hipIpcGetMemHandle@@hip_4.2); plain
 * dlsym resolves the default version, which is the ABI our prototypes
 * describe.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/driver.h"
#include "hip_api.h"

#ifdef TENSORD_HAVE_HIP_H
_Static_assert(sizeof(hipUUID) == 16, "hipUUID");
_Static_assert(sizeof(hipIpcMemHandle_t) == 64, "hipIpcMemHandle_t");
_Static_assert(sizeof(hipError_t) == sizeof(int), "hipError_t");
_Static_assert(sizeof(hipDevice_t) == sizeof(int), "hipDevice_t");
_Static_assert(hipErrorInvalidValue == 1 && hipErrorOutOfMemory == 2, "errors");
_Static_assert(hipErrorNotInitialized == 3 && hipErrorInsufficientDriver == 35, "errors");
_Static_assert(hipErrorNoDevice == 100 && hipErrorInvalidDevice == 101, "errors");
_Static_assert(hipErrorInvalidContext == 201 && hipErrorNotSupported == 801, "errors");
_Static_assert(hipMemcpyDefault == 4 && sizeof(hipMemcpyKind) == sizeof(int), "memcpy kind");
#endif

/* Newest first: a machine with several ROCm versions gets the newest. */
static const char *const td_hip_libnames[] = {
	"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so", NULL,
};

/* opt 1: an optional entry point (its own group: NULL when missing). */
static const struct td_gpu_sym td_hip_syms[] = {
#define SYM(field, opt)                                                                            \
	{                                                                                          \
		"hip" #field, NULL, offsetof(struct td_hip_api, field), opt                        \
	}
	SYM(RuntimeGetVersion, 0),
	SYM(GetErrorName, 0),
	SYM(GetErrorString, 0),
	SYM(GetDeviceCount, 0),
	SYM(DeviceGet, 0),
	SYM(DeviceGetUuid, 1),
	SYM(DeviceTotalMem, 0),
	SYM(SetDevice, 0),
	SYM(GetDevice, 0),
	SYM(Malloc, 0),
	SYM(Free, 0),
	SYM(Memset, 0),
	SYM(DeviceSynchronize, 0),
	SYM(Memcpy, 0),
	SYM(MemcpyAsync, 0),
	SYM(StreamSynchronize, 0),
	SYM(IpcGetMemHandle, 0),
	SYM(IpcOpenMemHandle, 0),
	SYM(IpcCloseMemHandle, 0),
#undef SYM
};

int td_hip_api_open(struct td_hip_api *api, const char *const *sonames, char *why, size_t why_len)
{
	memset(api, 0, sizeof(*api));
	api->lib = td_gpu_dlopen(sonames, &api->libname, why, why_len);
	if (!api->lib)
		return -ENODEV;
	if (td_gpu_dlsym(api->lib, api->libname, td_hip_syms,
			 sizeof(td_hip_syms) / sizeof(td_hip_syms[0]), api, "", why, why_len) < 0) {
		td_hip_api_close(api);
		return -ENODEV;
	}
	return 0;
}

void td_hip_api_close(struct td_hip_api *api)
{
	if (api->lib)
		dlclose(api->lib);
	memset(api, 0, sizeof(*api));
}

int td_hip_ipc_flag(int runtime_version)
{
	return runtime_version / 10000000 >= 6 ? 1 : 0;
}

int td_hip_errno(hipError_t e)
{
	switch ((int)e) {
	case hipSuccess:
		return 0;
	case hipErrorOutOfMemory:
		return -ENOMEM;
	case hipErrorInvalidValue:
		return -EINVAL;
	case hipErrorNotInitialized:
	case hipErrorInsufficientDriver:
	case hipErrorNoDevice:
	case hipErrorInvalidDevice:
		return -ENODEV;
	case hipErrorNotSupported:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

const char *td_hip_strerror(const struct td_hip_api *api, hipError_t e, char *buf, size_t len)
{
	const char *name = api && api->GetErrorName ? api->GetErrorName(e) : NULL;
	const char *desc = api && api->GetErrorString ? api->GetErrorString(e) : NULL;

	if (name && desc)
		snprintf(buf, len, "%s (%s)", name, desc);
	else
		snprintf(buf, len, "hipError_t %d", (int)e);
	return buf;
}

const char *td_hip_kfd_path(void)
{
	const char *p = getenv("TENSORD_HIP_KFD");

	return p && *p ? p : TD_HIP_KFD;
}

/* The process-wide table, loaded by the first td_hip_api_get(). */
static struct td_hip_api td_hip_global;
static struct td_gpu_driver td_hip_driver = { .once = PTHREAD_ONCE_INIT, .table = &td_hip_global };

/* Loaded means the runtime is loaded in this process. */
static void td_hip_load(void)
{
	struct td_gpu_driver *d = &td_hip_driver;
	struct td_hip_api *api = &td_hip_global;
	const char *kfd = td_hip_kfd_path();

	if (access(kfd, F_OK) != 0) {
		snprintf(d->why, sizeof(d->why),
			 "%s: %s (no amdgpu driver), libamdhip64 not loaded", kfd, strerror(errno));
		d->status = -ENODEV;
		return;
	}
	d->status = td_hip_api_open(api, td_hip_libnames, d->why, sizeof(d->why));
	if (d->status < 0)
		return;
	if (api->RuntimeGetVersion(&api->runtime_version) != hipSuccess)
		api->runtime_version = 0;
	/*
	 * HIP 5.2 answers 0 here on a machine without a device (seen on Debian
	 * 12); the soname's major is the ROCm major, which is all
	 * td_hip_ipc_flag() needs.
	 */
	if (api->runtime_version <= 0) {
		const char *dot = strrchr(api->libname, '.');
		int major = dot ? atoi(dot + 1) : 0;

		api->runtime_version = major > 0 ? major * 10000000 : 0;
	}
	d->loaded = true;
}

void td_hip_api_use(const struct td_hip_api *api)
{
	td_gpu_driver_use(&td_hip_driver, api);
}

bool td_hip_api_in_use(void)
{
	return td_gpu_driver_in_use(&td_hip_driver);
}

int td_hip_api_get(const struct td_hip_api **ret_api, const char **ret_why)
{
	const void *table;
	int r = td_gpu_driver_get(&td_hip_driver, td_hip_load, &table, ret_why);

	if (r == 0)
		*ret_api = table;
	return r;
}
