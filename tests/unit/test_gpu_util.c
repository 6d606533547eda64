/*
 * Unit tests for the GPU driver shims (gpu/<vendor>/): the pure helpers
 * (granularity rounding, UUID -> local ordinal, error mapping, the HIP IPC
 * flag) and the run-time loaders given a library that is not there. None
 * of this needs a GPU or a driver.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/cuda/cuda_api.h"
#include "gpu/gpu_util.h"
#include "gpu/hip/hip_api.h"

#define MiB (1ull << 20)

static void test_round_up(void **state)
{
	uint64_t out = 12345;

	assert_int_equal(td_gpu_round_up(0, 2 * MiB, &out), 0);
	assert_int_equal(out, 0);
	assert_int_equal(td_gpu_round_up(1, 2 * MiB, &out), 0);
	assert_int_equal(out, 2 * MiB);
	assert_int_equal(td_gpu_round_up(2 * MiB, 2 * MiB, &out), 0);
	assert_int_equal(out, 2 * MiB);
	assert_int_equal(td_gpu_round_up(2 * MiB + 1, 2 * MiB, &out), 0);
	assert_int_equal(out, 4 * MiB);
	/* Granularities are the driver's business: not only powers of two. */
	assert_int_equal(td_gpu_round_up(7, 3, &out), 0);
	assert_int_equal(out, 9);
	assert_int_equal(td_gpu_round_up(5, 0, &out), -EINVAL);
	assert_int_equal(td_gpu_round_up(UINT64_MAX, 2 * MiB, &out), -EOVERFLOW);
	assert_int_equal(td_gpu_round_up(UINT64_MAX - 2 * MiB + 1, 2 * MiB, &out), 0);
	assert_true(out == UINT64_MAX - 2 * MiB + 1);
}

static void test_uuid_find(void **state)
{
	uint8_t have[3][TD_GPU_UUID_LEN];
	uint8_t want[TD_GPU_UUID_LEN];

	for (int i = 0; i < 3; i++)
		memset(have[i], 0x10 * (i + 1), TD_GPU_UUID_LEN);
	/* CUDA_VISIBLE_DEVICES=2,0,1 here: the daemon's GPU 1 is our ordinal 1 only by UUID. */
	memcpy(want, have[1], sizeof(want));
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t(*)[16])have, 3), 1);
	memcpy(want, have[2], sizeof(want));
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t(*)[16])have, 3), 2);
	/* A UUID that differs in the last byte only is a different GPU. */
	want[15] ^= 1;
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t(*)[16])have, 3),
			 -ENODEV);
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t(*)[16])have, 0),
			 -ENODEV);
	assert_int_equal(td_gpu_uuid_find(want, 15, (const uint8_t(*)[16])have, 3), -EINVAL);
	assert_int_equal(td_gpu_uuid_find(NULL, 16, (const uint8_t(*)[16])have, 3), -EINVAL);
	/* Two devices with one UUID (blank UUIDs): refuse to guess. */
	memcpy(have[2], have[0], TD_GPU_UUID_LEN);
	memcpy(want, have[0], sizeof(want));
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t(*)[16])have, 3),
			 -ENOTUNIQ);
}

static void test_uuid_format(void **state)
{
	uint8_t u[16];
	char buf[48];

	for (int i = 0; i < 16; i++)
		u[i] = (uint8_t)(i * 17);
	assert_string_equal(td_gpu_uuid_format(u, 16, buf, sizeof(buf)),
			    "GPU-00112233-4455-6677-8899-aabbccddeeff");
	assert_string_equal(td_gpu_uuid_format(u, 3, buf, sizeof(buf)), "GPU-(no uuid)");
	assert_true(td_gpu_uuid_is_blank((const uint8_t[16]){ 0 }));
	assert_false(td_gpu_uuid_is_blank(u)); /* u[0] is 0, the rest is not */
}

static void test_error_mapping(void **state)
{
	char buf[64];

	assert_int_equal(td_cuda_errno(CUDA_SUCCESS), 0);
	assert_int_equal(td_cuda_errno(CUDA_ERROR_OUT_OF_MEMORY), -ENOMEM);
	assert_int_equal(td_cuda_errno(CUDA_ERROR_INVALID_VALUE), -EINVAL);
	assert_int_equal(td_cuda_errno(CUDA_ERROR_STUB_LIBRARY), -ENODEV);
	assert_int_equal(td_cuda_errno(CUDA_ERROR_NO_DEVICE), -ENODEV);
	assert_int_equal(td_cuda_errno(CUDA_ERROR_NOT_PERMITTED), -EPERM);
	assert_int_equal(td_cuda_errno(CUDA_ERROR_NOT_SUPPORTED), -EOPNOTSUPP);
	assert_int_equal(td_cuda_errno((CUresult)999), -EIO);
	/* Without a loaded driver the number is all we can print. */
	assert_string_equal(td_cuda_strerror(NULL, CUDA_ERROR_NO_DEVICE, buf, sizeof(buf)),
			    "CUresult 100");

	assert_int_equal(td_hip_errno(hipSuccess), 0);
	assert_int_equal(td_hip_errno(hipErrorOutOfMemory), -ENOMEM);
	assert_int_equal(td_hip_errno(hipErrorNoDevice), -ENODEV);
	assert_int_equal(td_hip_errno(hipErrorNotSupported), -EOPNOTSUPP);
	assert_int_equal(td_hip_errno((hipError_t)999), -EIO);
}

static void test_hip_ipc_flag(void **state)
{
	/* hipIpcMemLazyEnablePeerAccess was 0 through HIP 5.7 and 1 from ROCm 6.0. */
	assert_int_equal(td_hip_ipc_flag(50221153), 0); /* Debian 12: 5.2.21153 */
	assert_int_equal(td_hip_ipc_flag(50731921), 0);
	assert_int_equal(td_hip_ipc_flag(60032830), 1);
	assert_int_equal(td_hip_ipc_flag(70000000), 1);
	assert_int_equal(td_hip_ipc_flag(0), 0);
}

static void test_loaders_missing_library(void **state)
{
	static const char *const hip_names[] = { "libamdhip64-tensord-test.so.99", NULL };
	struct td_cuda_api cu;
	struct td_hip_api hip;
	char why[256];

	assert_int_equal(td_cuda_api_open(&cu, "libcuda-tensord-test.so.99", why, sizeof(why)),
			 -ENODEV);
	assert_non_null(strstr(why, "libcuda-tensord-test.so.99"));
	assert_null(cu.lib);
	assert_int_equal(td_hip_api_open(&hip, hip_names, why, sizeof(why)), -ENODEV);
	assert_non_null(strstr(why, "libamdhip64-tensord-test.so.99"));
	assert_null(hip.lib);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_up),     cmocka_unit_test(test_uuid_find),
		cmocka_unit_test(test_uuid_format),  cmocka_unit_test(test_error_mapping),
		cmocka_unit_test(test_hip_ipc_flag), cmocka_unit_test(test_loaders_missing_library),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
