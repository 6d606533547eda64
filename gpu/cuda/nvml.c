/*
 * NVML, loaded at run time (nvml.h). Only three entry points, resolved by
 * their versioned names (as cuda_api.c does for libcuda): the versioned name
 * pins the layout of nvmlProcessInfo_t that our declaration matches.
 */
#include "nvml.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu_util.h"

#define NVML_LIBNAME "libnvidia-ml.so.1"
/* Processes listed per GPU at most: the daemon's own entry is what counts. */
#define NVML_PROCS_MAX 256

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static struct td_nvml_api nvml_loaded;
static int nvml_status; /* 0, or -errno from loading */
static char nvml_why[200];
static const struct td_nvml_api *_Atomic nvml_forced;

static void nvml_load(void)
{
	void *lib = dlopen(NVML_LIBNAME, RTLD_NOW | RTLD_LOCAL);
	nvmlReturn_t r;

	if (!lib) {
		snprintf(nvml_why, sizeof(nvml_why), "%s", dlerror());
		nvml_status = -ENOENT;
		return;
	}
	*(void **)&nvml_loaded.Init = dlsym(lib, "nvmlInit_v2");
	*(void **)&nvml_loaded.DeviceGetHandleByUUID = dlsym(lib, "nvmlDeviceGetHandleByUUID");
	*(void **)&nvml_loaded.DeviceGetComputeRunningProcesses =
		dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!nvml_loaded.DeviceGetComputeRunningProcesses)
		*(void **)&nvml_loaded.DeviceGetComputeRunningProcesses =
			dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
	if (!nvml_loaded.Init || !nvml_loaded.DeviceGetHandleByUUID ||
	    !nvml_loaded.DeviceGetComputeRunningProcesses) {
		snprintf(nvml_why, sizeof(nvml_why), "%s: a symbol is missing (driver too old)",
			 NVML_LIBNAME);
		nvml_status = -ENOENT;
		dlclose(lib);
		return;
	}
	r = nvml_loaded.Init();
	if (r != TD_NVML_SUCCESS) {
		snprintf(nvml_why, sizeof(nvml_why), "%s: nvmlInit_v2 failed with %d", NVML_LIBNAME,
			 r);
		nvml_status = -ENOENT;
		dlclose(lib);
		return;
	}
	/* Kept loaded and initialised until exit: nvmlShutdown buys nothing here. */
}

void td_nvml_api_use(const struct td_nvml_api *api)
{
	nvml_forced = api;
}

int td_nvml_process_bytes(const uint8_t uuid[16], unsigned pid, uint64_t *ret_bytes, char *why,
			  size_t why_len)
{
	const struct td_nvml_api *api = nvml_forced;
	td_nvml_process_info *infos;
	unsigned int n = NVML_PROCS_MAX;
	nvmlDevice_t dev;
	char ustr[48];
	nvmlReturn_t r;
	int err = 0;

	if (!api) {
		pthread_once(&nvml_once, nvml_load);
		if (nvml_status < 0) {
			snprintf(why, why_len, "%s", nvml_why);
			return nvml_status;
		}
		api = &nvml_loaded;
	}
	td_gpu_uuid_format(uuid, 16, ustr, sizeof(ustr));
	r = api->DeviceGetHandleByUUID(ustr, &dev);
	if (r != TD_NVML_SUCCESS) {
		snprintf(why, why_len, "NVML does not know %s (error %d)", ustr, r);
		return -ENODEV;
	}
	infos = calloc(n, sizeof(*infos));
	if (!infos) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	r = api->DeviceGetComputeRunningProcesses(dev, &n, infos);
	*ret_bytes = 0;
	if (r != TD_NVML_SUCCESS) {
		snprintf(why, why_len, "NVML: listing the processes on %s failed (error %d)", ustr,
			 r);
		err = -EIO;
	}
	for (unsigned i = 0; err == 0 && i < n && i < NVML_PROCS_MAX; i++) {
		if (infos[i].pid != pid)
			continue;
		if (infos[i].usedGpuMemory == TD_NVML_VALUE_NOT_AVAILABLE) {
			snprintf(why, why_len, "NVML: %s does not report per-process memory", ustr);
			err = -ENODATA;
		} else {
			*ret_bytes = infos[i].usedGpuMemory;
		}
	}
	free(infos);
	return err;
}
