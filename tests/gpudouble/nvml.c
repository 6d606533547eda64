/*
 * libnvidia-ml.so.1 of the driver double (double.h): what tensord's
 * gpu/cuda/nvml.c asks, answered from the memory the double counts across
 * processes. NVML sees every device, whatever CUDA_VISIBLE_DEVICES says.
 */
#include <stdint.h>
#include <string.h>

#include "double.h"
#include "gpu/cuda/nvml.h"

#define API __attribute__((visibility("default")))
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6

static int inited;

API nvmlReturn_t nvmlInit_v2(void)
{
	dbl_init("CUDA_VISIBLE_DEVICES");
	inited = 1;
	return TD_NVML_SUCCESS;
}

API nvmlReturn_t nvmlShutdown(void)
{
	inited = 0;
	return TD_NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	if (!inited)
		return NVML_ERROR_UNINITIALIZED;
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < dbl_physical_count(); i++) {
		char s[41];

		dbl_uuid_string(i, s);
		if (strcmp(s, uuid) == 0) {
			*device = (nvmlDevice_t)(uintptr_t)(i + 1);
			return TD_NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
							 td_nvml_process_info *infos)
{
	int phys = (int)(uintptr_t)device - 1, n;
	uint32_t pids[256];

	if (!inited)
		return NVML_ERROR_UNINITIALIZED;
	if (phys < 0 || phys >= dbl_physical_count() || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	n = dbl_pids_on(phys, pids, 256);
	if (*count < (unsigned)n || (n && !infos)) {
		*count = (unsigned)n;
		return TD_NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int i = 0; i < n; i++) {
		uint64_t bytes;

		dbl_pid_bytes(phys, pids[i], &bytes);
		infos[i] = (td_nvml_process_info){ pids[i], bytes, ~0u, ~0u };
	}
	*count = (unsigned)n;
	return TD_NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
							 td_nvml_process_info *infos)
{
	return nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos);
}
