/*
 * Unit tests for the client library's GPU importers (gpu/cuda/
 * import_cuda.c, gpu/hip/import_hip.c) on a machine without a GPU: map() fails
 * with the reason and still closes the descriptor it owns, and the
 * importer tables are complete. Where libcuda is present the CUDA
 * driver-free case is skipped through cmocka with the reason; the HIP one
 * points TENSORD_HIP_KFD at a missing node, so it runs everywhere.
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

#include "client/lib/import.h"
#include "gpu/cuda/cuda_api.h"
#include "gpu/hip/hip_api.h"

#define MiB (1ull << 20)

static bool have_libcuda(void)
{
	void *h = dlopen(TD_CUDA_LIBNAME, RTLD_NOW | RTLD_LOCAL);

	if (h)
		dlclose(h);
	return h != NULL;
}

static void test_importer_tables_complete(void **state)
{
	const struct td_importer *imp[] = { &td_importer_cuda, &td_importer_cuda_ipc,
					    &td_importer_hip };
	const Tensord__HandleKind kinds[] = { TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD,
					      TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC,
					      TENSORD__HANDLE_KIND__HANDLE_HIP_IPC };

	for (size_t i = 0; i < sizeof(imp) / sizeof(imp[0]); i++) {
		assert_int_equal(imp[i]->handle_kind, kinds[i]);
		assert_non_null(imp[i]->map);
		assert_non_null(imp[i]->unmap);
	}
}

/* Without a driver, map() fails with the reason and still closes the fd it owns. */
static void test_import_without_driver(void **state)
{
	static const uint8_t uuid[16] = { 1, 2, 3 };
	uint8_t handle[64] = { 0 };
	struct td_import_desc d = {
		.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD,
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
		print_message("      skipped: %s loads here; tests/gpu/run.sh covers the driver\n",
			      TD_CUDA_LIBNAME);
		skip();
	}
	assert_int_equal(pipe(p), 0);
	memset(&m, 0, sizeof(m));
	assert_int_equal(td_importer_cuda.map(&m, p[0], &d), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), "libcuda"));
	assert_int_equal(fcntl(p[0], F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	assert_null(m.priv);
	d.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC;
	assert_int_equal(td_importer_cuda_ipc.map(&m, p[1], &d), -ENODEV);
	assert_int_equal(fcntl(p[1], F_GETFD), -1);
}

/* TENSORD_HIP_KFD names the node the HIP loader checks; unset or empty: /dev/kfd. */
static void test_hip_kfd_path(void **state)
{
	assert_int_equal(unsetenv("TENSORD_HIP_KFD"), 0);
	assert_string_equal(td_hip_kfd_path(), TD_HIP_KFD);
	assert_int_equal(setenv("TENSORD_HIP_KFD", "", 1), 0);
	assert_string_equal(td_hip_kfd_path(), TD_HIP_KFD);
	assert_int_equal(setenv("TENSORD_HIP_KFD", "/run/tensord-test/kfd", 1), 0);
	assert_string_equal(td_hip_kfd_path(), "/run/tensord-test/kfd");
	assert_int_equal(unsetenv("TENSORD_HIP_KFD"), 0);
}

/*
 * The loader checks the node TENSORD_HIP_KFD names, pointed here at one
 * that cannot exist, so this runs on AMD machines too: libamdhip64 is not
 * loaded, and the reason names that node.
 */
static void test_import_hip_without_device(void **state)
{
	static const char missing[] = "/nonexistent/tensord-test-kfd";
	struct td_import_desc d = {
		.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC,
		.map_size = 2 * MiB,
		.device = { kDLROCM, 0 },
	};
	struct td_mapping m;

	assert_int_equal(setenv("TENSORD_HIP_KFD", missing, 1), 0);
	memset(&m, 0, sizeof(m));
	d.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC;
	assert_int_equal(td_importer_hip.map(&m, -1, &d), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), missing));
	assert_non_null(strstr(tensord_last_error(), "libamdhip64 not loaded"));
	assert_int_equal(unsetenv("TENSORD_HIP_KFD"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_importer_tables_complete),
		cmocka_unit_test(test_import_without_driver),
		cmocka_unit_test(test_hip_kfd_path),
		cmocka_unit_test(test_import_hip_without_device),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
