/*
 * Unit tests for the GPU backends and importers that need no GPU: the pure
 * helpers (granularity rounding, UUID -> local ordinal, error mapping, the
 * HIP IPC flag), the run-time loaders given a library that is not there,
 * the backends' behaviour without a driver (init says -ENODEV and why),
 * and that every ops table is complete. On a machine with a driver the
 * driver-free assertions are skipped with a printed reason; the GPU
 * behaviour itself is covered by tests/gpu/run.sh.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "client.h"
#include "cuda_api.h"
#include "gpu_util.h"
#include "hip_api.h"

extern const struct td_importer td_importer_cuda_ipc;

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
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t (*)[16])have, 3), 1);
	memcpy(want, have[2], sizeof(want));
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t (*)[16])have, 3), 2);
	/* A UUID that differs in the last byte only is a different GPU. */
	want[15] ^= 1;
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t (*)[16])have, 3),
			 -ENODEV);
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t (*)[16])have, 0),
			 -ENODEV);
	assert_int_equal(td_gpu_uuid_find(want, 15, (const uint8_t (*)[16])have, 3), -EINVAL);
	assert_int_equal(td_gpu_uuid_find(NULL, 16, (const uint8_t (*)[16])have, 3), -EINVAL);
	/* Two devices with one UUID (blank UUIDs): refuse to guess. */
	memcpy(have[2], have[0], TD_GPU_UUID_LEN);
	memcpy(want, have[0], sizeof(want));
	assert_int_equal(td_gpu_uuid_find(want, sizeof(want), (const uint8_t (*)[16])have, 3),
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

static bool have_libcuda(void)
{
	void *h = dlopen(TD_CUDA_LIBNAME, RTLD_NOW | RTLD_LOCAL);

	if (h)
		dlclose(h);
	return h != NULL;
}

/* Checks what every backend must do whether or not init succeeded. */
static void check_backend_without_devices(const struct tensord_backend_ops *ops)
{
	struct tensord_alloc a;
	uint8_t uuid[16];
	int fd = 123;

	assert_int_equal(ops->device_count(), 0);
	assert_int_equal(ops->device_uuid(0, uuid), -ENODEV);
	assert_string_equal(ops->path(0), "none");
	assert_int_equal(ops->default_capacity(0), 0);
	memset(&a, 0, sizeof(a));
	a.ops = ops;
	assert_int_equal(ops->alloc(&a, 4096, 0, "t"), -ENODEV);
	assert_int_equal(a.fd, -1);
	/* export_fd and freeze on a half-built allocation, then release. */
	assert_int_equal(ops->export_fd(&a, false, &fd), 0);
	assert_int_equal(fd, -1);
	assert_int_equal(ops->freeze(&a), 0);
	ops->release(&a);
	assert_null(a.priv);
}

static void test_cuda_init_without_driver(void **state)
{
	char why[160] = "";
	int rc;

	rc = tensord_backend_cuda.init(why, sizeof(why));
	if (have_libcuda()) {
		print_message("      skipped: %s loads here; init returned %d (%s); "
			      "tests/gpu/run.sh covers the driver\n", TD_CUDA_LIBNAME, rc, why);
		assert_true(rc == 0 || rc == -ENODEV);
		return;
	}
	assert_int_equal(rc, -ENODEV);
	assert_non_null(strstr(why, "libcuda"));
	check_backend_without_devices(&tensord_backend_cuda);
}

static void test_hip_init_without_device(void **state)
{
	char why[160] = "";
	int rc;

	rc = tensord_backend_hip.init(why, sizeof(why));
	if (access(TD_HIP_KFD, F_OK) == 0) {
		print_message("      skipped: %s exists here; init returned %d (%s)\n", TD_HIP_KFD,
			      rc, why);
		assert_true(rc == 0 || rc == -ENODEV);
		return;
	}
	assert_int_equal(rc, -ENODEV);
	assert_non_null(strstr(why, TD_HIP_KFD));
	assert_non_null(strstr(why, "libamdhip64"));
	check_backend_without_devices(&tensord_backend_hip);
}

static void check_ops_complete(const struct tensord_backend_ops *ops, const char *name,
			       int device_type)
{
	assert_string_equal(ops->name, name);
	assert_int_equal(ops->device_type, device_type);
	assert_non_null(ops->init);
	assert_non_null(ops->device_count);
	assert_non_null(ops->device_uuid);
	assert_non_null(ops->default_capacity);
	assert_non_null(ops->path);
	assert_non_null(ops->alloc);
	assert_non_null(ops->export_fd);
	assert_non_null(ops->freeze);
	assert_non_null(ops->release);
}

static void test_tables_complete(void **state)
{
	const struct td_importer *imp[] = { &td_importer_cuda, &td_importer_cuda_ipc,
					    &td_importer_hip };
	const int kinds[] = { TENSORD_HANDLE_CUDA_VMM_FD, TENSORD_HANDLE_CUDA_IPC,
			      TENSORD_HANDLE_HIP_IPC };

	check_ops_complete(&tensord_backend_cuda, "cuda", kDLCUDA);
	check_ops_complete(&tensord_backend_hip, "hip", kDLROCM);
	for (size_t i = 0; i < sizeof(imp) / sizeof(imp[0]); i++) {
		assert_int_equal(imp[i]->handle_kind, kinds[i]);
		assert_non_null(imp[i]->map);
		assert_non_null(imp[i]->unmap);
	}
	/* The wire enum and the backend constants must agree. */
	assert_int_equal(TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD, TENSORD_HANDLE_CUDA_VMM_FD);
	assert_int_equal(TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC, TENSORD_HANDLE_CUDA_IPC);
	assert_int_equal(TENSORD__HANDLE_KIND__HANDLE_HIP_IPC, TENSORD_HANDLE_HIP_IPC);
}

/* Without a driver, map() fails with the reason and still closes the fd it owns. */
static void test_import_without_driver(void **state)
{
	static const uint8_t uuid[16] = { 1, 2, 3 };
	uint8_t handle[64] = { 0 };
	struct td_import_desc d = {
		.handle_kind = TENSORD_HANDLE_CUDA_VMM_FD,
		.map_size = 2 * MiB,
		.device = { kDLCUDA, 0 },
		.uuid = uuid,
		.uuid_len = sizeof(uuid),
		.ipc_handle = handle,
		.ipc_handle_len = sizeof(handle),
	};
	struct td_mapping m;
	int p[2];

	if (have_libcuda()) {
		print_message("      skipped: %s loads here\n", TD_CUDA_LIBNAME);
		return;
	}
	assert_int_equal(pipe(p), 0);
	memset(&m, 0, sizeof(m));
	assert_int_equal(td_importer_cuda.map(&m, p[0], &d), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), "libcuda"));
	assert_int_equal(fcntl(p[0], F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	assert_null(m.priv);
	d.handle_kind = TENSORD_HANDLE_CUDA_IPC;
	assert_int_equal(td_importer_cuda_ipc.map(&m, p[1], &d), -ENODEV);
	assert_int_equal(fcntl(p[1], F_GETFD), -1);

	if (access(TD_HIP_KFD, F_OK) == 0)
		return;
	d.handle_kind = TENSORD_HANDLE_HIP_IPC;
	d.device.device_type = kDLROCM;
	assert_int_equal(td_importer_hip.map(&m, -1, &d), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), TD_HIP_KFD));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_up),
		cmocka_unit_test(test_uuid_find),
		cmocka_unit_test(test_uuid_format),
		cmocka_unit_test(test_error_mapping),
		cmocka_unit_test(test_hip_ipc_flag),
		cmocka_unit_test(test_loaders_missing_library),
		cmocka_unit_test(test_cuda_init_without_driver),
		cmocka_unit_test(test_hip_init_without_device),
		cmocka_unit_test(test_tables_complete),
		cmocka_unit_test(test_import_without_driver),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
