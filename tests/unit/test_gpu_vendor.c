/*
 * The GPU vendor table (gpu/vendor.[ch]), the one place that says what a
 * vendor is: every row complete and unambiguous, each vendor's device
 * names parsed and formatted back the same, host-accessible and is-GPU
 * answered by the rows, DLPack's streams by the rows, and the handle kinds
 * that carry a descriptor. Checked for every row, so a new vendor is
 * checked by adding it.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/desc.h"
#include "common/vendor.h"
#include "proto/tensord.pb-c.h"

static size_t n_vendors(void)
{
	size_t n = 0;

	while (td_gpu_vendors[n].id)
		n++;
	return n;
}

static void test_rows_complete(void **state)
{
	size_t n = n_vendors();

	assert_true(n >= 1);
	for (size_t i = 0; i < n; i++) {
		const struct td_gpu_vendor *v = &td_gpu_vendors[i];
		size_t handles = 0;

		assert_non_null(v->name);
		assert_true(v->id[0] && v->name[0] && v->device[0]);
		assert_string_not_equal(v->device, "cpu");
		assert_int_not_equal(v->device_type, kDLCPU);
		assert_true(v->device_type > 0);
		/* Its own put stream is one a consumer may pass. */
		assert_true(td_gpu_stream_valid(v->device_type, v->put_stream));
		assert_true(v->streams != 0 && v->streams < TD_GPU_STREAM(3));
		for (size_t k = 0; k < sizeof(v->host_types) / sizeof(v->host_types[0]); k++) {
			if (!v->host_types[k])
				continue;
			assert_int_not_equal(v->host_types[k], kDLCPU);
			assert_null(td_gpu_vendor_of(v->host_types[k]));
		}
		for (const struct td_gpu_handle *h = td_gpu_handles; h->vendor; h++)
			handles += strcmp(h->vendor, v->id) == 0;
		assert_true(handles >= 1);
		/* No two vendors share an id, a device type or a device name, and no
		 * device name starts another (the parser takes the first that fits). */
		for (size_t j = 0; j < n; j++) {
			const struct td_gpu_vendor *w = &td_gpu_vendors[j];

			if (j == i)
				continue;
			assert_string_not_equal(v->id, w->id);
			assert_int_not_equal(v->device_type, w->device_type);
			assert_int_not_equal(strncmp(v->device, w->device, strlen(v->device)), 0);
		}
	}
}

static void test_handles(void **state)
{
	for (const struct td_gpu_handle *h = td_gpu_handles; h->vendor; h++) {
		bool known = false;

		for (size_t i = 0; td_gpu_vendors[i].id; i++)
			known = known || strcmp(td_gpu_vendors[i].id, h->vendor) == 0;
		assert_true(known);
		assert_int_not_equal(h->kind, TENSORD__HANDLE_KIND__HANDLE_NONE);
		assert_int_not_equal(h->kind, TENSORD__HANDLE_KIND__HANDLE_MEMFD);
		assert_int_equal(td_gpu_handle_fd(h->kind), h->fd);
		/* A GPU handle without a descriptor is a legacy IPC handle. */
		assert_int_equal(td_gpu_handle_ipc(h->kind), !h->fd);
		for (const struct td_gpu_handle *g = td_gpu_handles; g->vendor; g++)
			assert_true(g == h || g->kind != h->kind);
	}
	/* Host memory is not the table's; unknown kinds carry nothing. */
	assert_false(td_gpu_handle_fd(TENSORD__HANDLE_KIND__HANDLE_NONE));
	assert_false(td_gpu_handle_fd(TENSORD__HANDLE_KIND__HANDLE_MEMFD));
	assert_false(td_gpu_handle_fd(1000));
	/* Today's wire: only CUDA's VMM handle comes with a descriptor. */
	assert_true(td_gpu_handle_fd(TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD));
	assert_false(td_gpu_handle_fd(TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC));
	assert_false(td_gpu_handle_fd(TENSORD__HANDLE_KIND__HANDLE_HIP_IPC));
	/* Memory the daemon exports itself: legacy CUDA IPC and HIP IPC only. */
	assert_true(td_gpu_handle_ipc(TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC));
	assert_true(td_gpu_handle_ipc(TENSORD__HANDLE_KIND__HANDLE_HIP_IPC));
	assert_false(td_gpu_handle_ipc(TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD));
	assert_false(td_gpu_handle_ipc(TENSORD__HANDLE_KIND__HANDLE_MEMFD));
	assert_false(td_gpu_handle_ipc(TENSORD__HANDLE_KIND__HANDLE_NONE));
	assert_false(td_gpu_handle_ipc(1000));
}

/* "<device>:N" both ways for every vendor, and "<device>" alone is N = 0. */
static void test_names_round_trip(void **state)
{
	static const int ids[] = { 0, 1, 7, 1023 };

	for (size_t i = 0; td_gpu_vendors[i].id; i++) {
		const struct td_gpu_vendor *v = &td_gpu_vendors[i];
		char buf[64], want[64];
		DLDevice d;

		for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
			snprintf(want, sizeof(want), "%s:%d", v->device, ids[k]);
			assert_string_equal(
				tensord_device_name((DLDevice){ v->device_type, ids[k] }, buf,
						    sizeof(buf)),
				want);
			assert_int_equal(tensord_device_parse(want, &d), 0);
			assert_int_equal(d.device_type, v->device_type);
			assert_int_equal(d.device_id, ids[k]);
		}
		assert_int_equal(tensord_device_parse(v->device, &d), 0);
		assert_int_equal(d.device_type, v->device_type);
		assert_int_equal(d.device_id, 0);
		snprintf(buf, sizeof(buf), "%s:", v->device);
		assert_int_equal(tensord_device_parse(buf, &d), -EINVAL);
		snprintf(buf, sizeof(buf), "%s:1024", v->device);
		assert_int_equal(tensord_device_parse(buf, &d), -EINVAL);
		snprintf(buf, sizeof(buf), "%sx:0", v->device);
		assert_int_equal(tensord_device_parse(buf, &d), -EINVAL);
		assert_ptr_equal(td_gpu_vendor_of(v->device_type), v);
	}
	assert_string_equal(tensord_device_name((DLDevice){ kDLOpenCL, 2 }, (char[32]){ 0 }, 32),
			    "device(4,2)");
	assert_int_equal(tensord_device_parse("opencl:0", &(DLDevice){ 0 }), -EINVAL);
}

/* Which device types are GPUs and which the CPU reads: the rows, and the host. */
static void test_host_accessible_and_gpu(void **state)
{
	for (size_t i = 0; td_gpu_vendors[i].id; i++) {
		const struct td_gpu_vendor *v = &td_gpu_vendors[i];

		assert_true(td_device_is_gpu(v->device_type));
		assert_true(tensord_device_is_gpu(v->device_type));
		assert_false(td_device_host_accessible(v->device_type));
		for (size_t k = 0; k < sizeof(v->host_types) / sizeof(v->host_types[0]); k++) {
			if (!v->host_types[k])
				continue;
			assert_true(td_device_host_accessible(v->host_types[k]));
			assert_true(tensord_device_host_accessible(v->host_types[k]));
			assert_false(td_device_is_gpu(v->host_types[k]));
		}
	}
	assert_true(td_device_host_accessible(kDLCPU));
	assert_false(td_device_is_gpu(kDLCPU));
	assert_false(td_device_host_accessible(kDLOpenCL));
	assert_false(td_device_is_gpu(kDLOpenCL));
	/* What desc.c said before the table, for today's rows. */
	assert_true(td_device_host_accessible(kDLCUDAHost));
	assert_true(td_device_host_accessible(kDLROCMHost));
	assert_true(td_device_host_accessible(kDLCUDAManaged));
	assert_true(td_device_is_gpu(kDLCUDA) && td_device_is_gpu(kDLROCM));
}

/* The stream put() copies on, and the streams a consumer may pass, per row. */
static void test_streams(void **state)
{
	for (size_t i = 0; td_gpu_vendors[i].id; i++) {
		const struct td_gpu_vendor *v = &td_gpu_vendors[i];

		assert_int_equal(td_gpu_put_stream(v->device_type), v->put_stream);
		assert_int_equal(tensord_put_stream(v->device_type), v->put_stream);
		for (long s = 0; s <= 2; s++)
			assert_int_equal(tensord_stream_valid(v->device_type, s),
					 (v->streams & TD_GPU_STREAM(s)) != 0);
		assert_true(tensord_stream_valid(v->device_type, -1));
		assert_true(tensord_stream_valid(v->device_type, 3));
		assert_true(tensord_stream_valid(v->device_type, LONG_MAX));
		assert_false(tensord_stream_valid(v->device_type, -2));
	}
	/* The host takes no stream: -1 only. */
	assert_int_equal(tensord_put_stream(kDLCPU), TD_GPU_NO_STREAM);
	assert_true(tensord_stream_valid(kDLCPU, -1));
	assert_false(tensord_stream_valid(kDLCPU, 0));
	assert_false(tensord_stream_valid(kDLCPU, 1));
	assert_false(tensord_stream_valid(kDLCUDAHost, 5));
	/* The rule Python applied before the table: CUDA s >= 1, ROCm s == 0 or s > 2. */
	for (long s = -3; s <= 5; s++) {
		assert_int_equal(tensord_stream_valid(kDLCUDA, s), s == -1 || s >= 1);
		assert_int_equal(tensord_stream_valid(kDLROCM, s), s == -1 || s == 0 || s > 2);
	}
	assert_int_equal(tensord_put_stream(kDLCUDA), 1);
	assert_int_equal(tensord_put_stream(kDLROCM), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rows_complete),
		cmocka_unit_test(test_handles),
		cmocka_unit_test(test_names_round_trip),
		cmocka_unit_test(test_host_accessible_and_gpu),
		cmocka_unit_test(test_streams),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
