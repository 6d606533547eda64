/*
 * Unit tests for the daemon's GPU backends (daemon/backend_cuda.c,
 * backend_hip.c) on a machine without a GPU: init says -ENODEV and why,
 * every other call on a backend without devices fails cleanly or does
 * nothing, and every ops table is complete. Where a driver is present the
 * driver-free cases are skipped through cmocka with the reason; the GPU
 * behaviour itself is covered by tests/gpu/run.sh.
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

#include "common/gpu/cuda_api.h"
#include "common/gpu/hip_api.h"
#include "daemon/backend.h"

static bool have_libcuda(void)
{
	void *h = dlopen(TD_CUDA_LIBNAME, RTLD_NOW | RTLD_LOCAL);

	if (h)
		dlclose(h);
	return h != NULL;
}

/* Checks what every backend must do whether or not init succeeded. */
static void check_backend_without_devices(const struct backend_ops *ops)
{
	struct backend_alloc a;
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

	rc = backend_cuda.init(why, sizeof(why));
	if (have_libcuda()) {
		print_message("      skipped: %s loads here; init returned %d (%s); "
			      "tests/gpu/run.sh covers the driver\n", TD_CUDA_LIBNAME, rc, why);
		assert_true(rc == 0 || rc == -ENODEV);
		skip();
	}
	assert_int_equal(rc, -ENODEV);
	assert_non_null(strstr(why, "libcuda"));
	check_backend_without_devices(&backend_cuda);
}

static void test_hip_init_without_device(void **state)
{
	char why[160] = "";
	int rc;

	rc = backend_hip.init(why, sizeof(why));
	if (access(TD_HIP_KFD, F_OK) == 0) {
		print_message("      skipped: %s exists here; init returned %d (%s)\n", TD_HIP_KFD,
			      rc, why);
		assert_true(rc == 0 || rc == -ENODEV);
		skip();
	}
	assert_int_equal(rc, -ENODEV);
	assert_non_null(strstr(why, TD_HIP_KFD));
	assert_non_null(strstr(why, "libamdhip64"));
	check_backend_without_devices(&backend_hip);
}

static void check_ops_complete(const struct backend_ops *ops, const char *name,
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

static void test_backend_tables_complete(void **state)
{
	check_ops_complete(&backend_cuda, "cuda", kDLCUDA);
	check_ops_complete(&backend_hip, "hip", kDLROCM);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cuda_init_without_driver),
		cmocka_unit_test(test_hip_init_without_device),
		cmocka_unit_test(test_backend_tables_complete),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
