/* Names, dtypes, devices, shapes and strides, overflow included. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/desc.h"

static char why[512];

static int name_check(const char *s)
{
	return td_name_check(s, strlen(s), why, sizeof(why));
}

/* "@PEER/NAME" (docs/remote.md, "Naming"). */
static void test_remote_names(void **state)
{
	size_t n = 0;
	char longest[256];

	(void)state;
	assert_int_equal(td_remote_name_check("@node-a/m/w", 11, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 6);
	assert_int_equal(td_remote_name_check("@a/b", 4, &n, why, sizeof(why)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(td_remote_name_check("@/m", 3, &n, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_remote_name_check("@a", 2, &n, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_remote_name_check("@a/", 3, &n, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_remote_name_check("a/b", 3, &n, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_remote_name_check("@a:b/c", 6, &n, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "its peer has byte 0x3a"));
	assert_int_equal(td_remote_name_check("@a/b c", 6, &n, why, sizeof(why)), -EINVAL);
	/* A local name check of an '@' name says where such names go. */
	assert_int_equal(td_name_check("@a/b", 4, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "only attach and attach_many"));
	memset(longest, 'x', 255);
	longest[0] = '@';
	longest[2] = '/';
	assert_int_equal(td_remote_name_check(longest, 255, &n, why, sizeof(why)), 0);
	longest[255] = 'x';
	assert_int_equal(td_remote_name_check(longest, 256, &n, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "256 bytes"));
}

static void test_names(void **state)
{
	char longest[256], too_long[257];

	assert_int_equal(name_check("model/inputs/0"), 0);
	assert_int_equal(name_check("a.b_c:d-e/F9"), 0);
	assert_int_equal(name_check(""), -EINVAL);
	assert_non_null(strstr(why, "[A-Za-z0-9._:/-]"));
	assert_int_equal(name_check("has space"), -EINVAL);
	assert_non_null(strstr(why, "offset 3"));
	assert_int_equal(name_check("caf\xc3\xa9"), -EINVAL);
	assert_int_equal(td_name_check("a\0b", 3, why, sizeof(why)), -EINVAL);
	memset(longest, 'x', 255);
	longest[255] = '\0';
	assert_int_equal(name_check(longest), 0);
	memset(too_long, 'x', 256);
	too_long[256] = '\0';
	assert_int_equal(name_check(too_long), -EINVAL);
	assert_non_null(strstr(why, "256 bytes"));
}

static void test_dtype_names(void **state)
{
	static const char *names[] = { "bool",
				       "int8",
				       "int16",
				       "int32",
				       "int64",
				       "uint8",
				       "uint16",
				       "uint32",
				       "uint64",
				       "float16",
				       "bfloat16",
				       "float32",
				       "float64",
				       "complex64",
				       "complex128",
				       "float8_e3m4",
				       "float8_e4m3",
				       "float8_e4m3b11fnuz",
				       "float8_e4m3fn",
				       "float8_e4m3fnuz",
				       "float8_e5m2",
				       "float8_e5m2fnuz",
				       "float8_e8m0fnu",
				       "float6_e2m3fn",
				       "float6_e3m2fn",
				       "float4_e2m1fn",
				       "float4_e2m1fn_x2" };
	char buf[32];
	DLDataType dt;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		assert_int_equal(tensord_dtype_parse(names[i], &dt), 0);
		assert_string_equal(tensord_dtype_name(dt, buf, sizeof(buf)), names[i]);
	}
	assert_int_equal(tensord_dtype_parse("bfloat16", &dt), 0);
	assert_int_equal(dt.code, kDLBfloat);
	assert_int_equal(tensord_dtype_parse("float128", &dt), -EINVAL);
	/* The codes torch's float8 and float4 tensors export with. */
	assert_string_equal(
		tensord_dtype_name((DLDataType){ kDLFloat8_e4m3fn, 8, 1 }, buf, sizeof(buf)),
		"float8_e4m3fn");
	assert_string_equal(
		tensord_dtype_name((DLDataType){ kDLFloat8_e5m2, 8, 1 }, buf, sizeof(buf)),
		"float8_e5m2");
	assert_string_equal(
		tensord_dtype_name((DLDataType){ kDLFloat4_e2m1fn, 4, 2 }, buf, sizeof(buf)),
		"float4_e2m1fn_x2");
	assert_int_equal(tensord_dtype_parse("float8_e8m0fnu", &dt), 0);
	assert_true(dt.code == kDLFloat8_e8m0fnu && dt.bits == 8 && dt.lanes == 1);
	assert_int_equal(tensord_dtype_parse("float6_e3m2fn", &dt), 0);
	assert_true(dt.code == kDLFloat6_e3m2fn && dt.bits == 6 && dt.lanes == 1);
	assert_string_equal(
		tensord_dtype_name((DLDataType){ kDLFloat8_e4m3fn, 8, 2 }, buf, sizeof(buf)),
		"dtype(10,8,2)");
}

static void test_devices(void **state)
{
	DLDevice d;
	char buf[32];

	assert_int_equal(tensord_device_parse("cpu", &d), 0);
	assert_int_equal(d.device_type, kDLCPU);
	assert_int_equal(tensord_device_parse("cuda:3", &d), 0);
	assert_int_equal(d.device_type, kDLCUDA);
	assert_int_equal(d.device_id, 3);
	assert_string_equal(tensord_device_name(d, buf, sizeof(buf)), "cuda:3");
	assert_int_equal(tensord_device_parse("rocm:0", &d), 0);
	assert_int_equal(d.device_type, kDLROCM);
	assert_int_equal(tensord_device_parse("cuda:", &d), -EINVAL);
	assert_int_equal(tensord_device_parse("cuda:-1", &d), -EINVAL);
	assert_int_equal(tensord_device_parse("tpu:0", &d), -EINVAL);
}

static void test_layout_compact(void **state)
{
	int64_t shape[3] = { 2, 3, 4 }, strides[3];
	uint64_t nbytes;
	DLDataType f32 = { kDLFloat, 32, 1 };

	assert_int_equal(td_layout(f32, 3, shape, NULL, strides, &nbytes, why, sizeof(why)), 0);
	assert_int_equal(nbytes, 96);
	assert_int_equal(strides[0], 12);
	assert_int_equal(strides[1], 4);
	assert_int_equal(strides[2], 1);
	/* 0-d: one element. */
	assert_int_equal(td_layout(f32, 0, NULL, NULL, strides, &nbytes, why, sizeof(why)), 0);
	assert_int_equal(nbytes, 4);
	/* Zero-size. */
	shape[1] = 0;
	assert_int_equal(td_layout(f32, 3, shape, NULL, strides, &nbytes, why, sizeof(why)), 0);
	assert_int_equal(nbytes, 0);
	/* Packed sub-byte: 5 four-bit values need 3 bytes. */
	int64_t five = 5;
	assert_int_equal(td_layout((DLDataType){ kDLFloat4_e2m1fn, 4, 1 }, 1, &five, NULL, strides,
				   &nbytes, why, sizeof(why)),
			 0);
	assert_int_equal(nbytes, 3);
}

static void test_layout_strided(void **state)
{
	int64_t shape[2] = { 4, 3 }, given[2] = { 1, 4 }, strides[2];
	uint64_t nbytes;
	DLDataType f64 = { kDLFloat, 64, 1 };

	/* Column-major 4x3: last element at 3*1 + 2*4 = 11 -> 12 elements. */
	assert_int_equal(td_layout(f64, 2, shape, given, strides, &nbytes, why, sizeof(why)), 0);
	assert_int_equal(nbytes, 96);
	assert_int_equal(strides[1], 4);
	/* Broadcast (stride 0) is fine and small. */
	given[0] = 0;
	given[1] = 0;
	assert_int_equal(td_layout(f64, 2, shape, given, strides, &nbytes, why, sizeof(why)), 0);
	assert_int_equal(nbytes, 8);
	given[0] = -1;
	assert_int_equal(td_layout(f64, 2, shape, given, strides, &nbytes, why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "negative"));
}

static void test_layout_refusals(void **state)
{
	int64_t shape[33] = { 0 }, strides[33];
	uint64_t nbytes;
	DLDataType u8 = { kDLUInt, 8, 1 };

	assert_int_equal(td_layout(u8, 33, shape, NULL, strides, &nbytes, why, sizeof(why)),
			 -EINVAL);
	shape[0] = -1;
	assert_int_equal(td_layout(u8, 1, shape, NULL, strides, &nbytes, why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "shape[0]"));
	/* Element count overflows 64 bits. */
	shape[0] = INT64_MAX;
	shape[1] = 4;
	assert_int_equal(td_layout(u8, 2, shape, NULL, strides, &nbytes, why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "overflow"));
	/* Byte count overflows: 2^62 elements of 8 bytes. */
	shape[0] = INT64_C(1) << 62;
	assert_int_equal(td_layout((DLDataType){ kDLFloat, 64, 1 }, 1, shape, NULL, strides,
				   &nbytes, why, sizeof(why)),
			 -EFBIG);
	/* Strides that would reach past 2^64. */
	int64_t sh2[2] = { 3, 3 }, st2[2] = { INT64_MAX, 1 };
	assert_int_equal(td_layout(u8, 2, sh2, st2, strides, &nbytes, why, sizeof(why)), -EINVAL);
	/* dtype checks. */
	assert_int_equal(td_layout((DLDataType){ 99, 8, 1 }, 0, NULL, NULL, strides, &nbytes, why,
				   sizeof(why)),
			 -EINVAL);
	assert_int_equal(td_layout((DLDataType){ kDLFloat, 0, 1 }, 0, NULL, NULL, strides, &nbytes,
				   why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(td_layout((DLDataType){ kDLBool, 1, 1 }, 0, NULL, NULL, strides, &nbytes,
				   why, sizeof(why)),
			 -EINVAL);
}

static void test_strerror(void **state)
{
	assert_string_equal(tensord_err_name(-ENOENT), "ENOENT");
	assert_string_equal(tensord_err_name(EEXIST), "EEXIST");
	assert_string_equal(tensord_strerror(-ENOSPC), "over capacity");
	assert_string_equal(tensord_err_name(-12345), "EUNKNOWN");
}

/* The rank and the wire's dtype fields, checked once for every descriptor from outside. */
static void test_desc_from_wire(void **state)
{
	DLDataType dt = { 0 };

	(void)state;
	assert_int_equal(td_ndim_check(0, 0, false, why, sizeof(why)), 0);
	assert_int_equal(td_ndim_check(TENSORD_NDIM_MAX, 0, false, why, sizeof(why)), 0);
	assert_int_equal(td_ndim_check(-1, 0, false, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "-1 dimensions; tensors have 0 to 32"));
	assert_int_equal(td_ndim_check(TENSORD_NDIM_MAX + 1, 0, false, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "33 dimensions"));
	/* Strides: none, or one per dimension; a peer must send them. */
	assert_int_equal(td_ndim_check(2, 2, false, why, sizeof(why)), 0);
	assert_int_equal(td_ndim_check(2, 1, false, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "1 strides for 2 dimensions"));
	assert_int_equal(td_ndim_check(2, 0, true, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_ndim_check(0, 0, true, why, sizeof(why)), 0);

	assert_int_equal(td_desc_from_wire(2, 32, 1, 3, 0, false, &dt, why, sizeof(why)), 0);
	assert_int_equal(dt.code, 2);
	assert_int_equal(dt.bits, 32);
	assert_int_equal(dt.lanes, 1);
	assert_int_equal(td_desc_from_wire(255, 255, 65535, 0, 0, true, &dt, why, sizeof(why)), 0);
	assert_int_equal(dt.lanes, 65535);
	dt = (DLDataType){ 0 };
	assert_int_equal(td_desc_from_wire(256, 32, 1, 1, 0, false, &dt, why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "dtype(256,32,1) is out of range"));
	assert_int_equal(dt.code, 0); /* untouched on a refusal */
	assert_int_equal(td_desc_from_wire(2, 256, 1, 1, 0, false, &dt, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_desc_from_wire(2, 32, 65536, 1, 0, false, &dt, why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(td_desc_from_wire(2, 0, 1, 1, 0, false, &dt, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_desc_from_wire(2, 32, 0, 1, 0, false, &dt, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_desc_from_wire(2, 32, 1, 33, 0, false, &dt, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "33 dimensions"));
	assert_int_equal(td_desc_from_wire(2, 32, 1, SIZE_MAX, 0, false, &dt, why, sizeof(why)),
			 -EINVAL);
	assert_int_equal(td_desc_from_wire(2, 32, 1, 2, 3, false, &dt, why, sizeof(why)), -EINVAL);
	assert_int_equal(td_desc_from_wire(2, 32, 1, 2, 0, true, &dt, why, sizeof(why)), -EINVAL);
	assert_int_equal(dt.code, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),           cmocka_unit_test(test_remote_names),
		cmocka_unit_test(test_dtype_names),     cmocka_unit_test(test_devices),
		cmocka_unit_test(test_layout_compact),  cmocka_unit_test(test_layout_strided),
		cmocka_unit_test(test_layout_refusals), cmocka_unit_test(test_strerror),
		cmocka_unit_test(test_desc_from_wire),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
