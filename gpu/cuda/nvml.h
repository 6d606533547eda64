/*
 * How much GPU memory the driver counts for this process on one device,
 * its primary context included: NVIDIA's management library (NVML,
 * libnvidia-ml.so.1, shipped with the driver), loaded at run time like
 * libcuda (gpu/cuda/cuda_api.h), so the daemon neither links it nor needs
 * its header. CUDA itself cannot say: cuMemGetInfo needs a context, so it
 * never sees the memory that creating the context took.
 *
 * Called from the GPU worker only (backend_cuda.c), once each time the
 * daemon makes a device's primary context: what the daemon has on the
 * device then is the context (DeviceStats.gpu_bytes adds the tensors).
 */
#ifndef TENSORD_NVML_H
#define TENSORD_NVML_H

#include <stddef.h>
#include <stdint.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

/* nvmlProcessInfo_t of the _v2 and _v3 calls (nvml.h, API 11 and 12). */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory; /* NVML_VALUE_NOT_AVAILABLE: not known */
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} td_nvml_process_info;

#define TD_NVML_SUCCESS 0
#define TD_NVML_ERROR_INSUFFICIENT_SIZE 7
#define TD_NVML_VALUE_NOT_AVAILABLE (~0ull)

struct td_nvml_api {
	nvmlReturn_t (*Init)(void);
	nvmlReturn_t (*DeviceGetHandleByUUID)(const char *uuid, nvmlDevice_t *device);
	nvmlReturn_t (*DeviceGetComputeRunningProcesses)(nvmlDevice_t device, unsigned int *count,
							 td_nvml_process_info *infos);
};

/*
 * Bytes the driver counts for pid on the GPU whose 16-byte UUID is uuid:
 * 0 with *ret_bytes (0 when pid holds nothing there), or -errno with the
 * reason in why: -ENOENT without NVML, -ENODEV when NVML does not know the
 * GPU, -EIO for any other NVML error, -ENODATA when the driver does not
 * report per-process memory (e.g. a GPU in WDDM or a vGPU). The first call
 * loads the library; a failure to load is remembered.
 */
int td_nvml_process_bytes(const uint8_t uuid[16], unsigned pid, uint64_t *ret_bytes, char *why,
			  size_t why_len);

/* Tests: use api instead of libnvidia-ml.so.1 (NULL: the library again). */
void td_nvml_api_use(const struct td_nvml_api *api);

#endif /* TENSORD_NVML_H */
