/* Frame codec: header round trip, partial input, limits, version. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/frame.h"

static void test_round_trip(void **state)
{
	uint8_t buf[64];
	struct td_frame f;

	td_frame_header(buf, 5, 1);
	memcpy(buf + 8, "hello", 5);
	assert_int_equal(td_frame_parse(buf, 13, 1024, &f), 13);
	assert_int_equal(f.len, 5);
	assert_int_equal(f.flags, 1);
	assert_int_equal(f.version, 1);
	assert_memory_equal(f.payload, "hello", 5);
}

static void test_needs_more(void **state)
{
	uint8_t buf[64];

	td_frame_header(buf, 5, 0);
	for (size_t n = 0; n < 13; n++)
		assert_int_equal(td_frame_parse(buf, n, 1024, NULL), 0);
}

static void test_oversize_decided_from_header(void **state)
{
	uint8_t buf[8] = { 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0 };

	/* 4 GiB announced: refused before any payload arrives. */
	assert_int_equal(td_frame_parse(buf, 8, TD_FRAME_MAX_REQUEST, NULL), -EMSGSIZE);
	td_frame_header(buf, TD_FRAME_MAX_REQUEST, 0);
	assert_int_equal(td_frame_parse(buf, 8, TD_FRAME_MAX_REQUEST, NULL), 0);
	td_frame_header(buf, TD_FRAME_MAX_REQUEST + 1, 0);
	assert_int_equal(td_frame_parse(buf, 8, TD_FRAME_MAX_REQUEST, NULL), -EMSGSIZE);
}

static void test_bad_version(void **state)
{
	uint8_t buf[8];

	td_frame_header(buf, 0, 0);
	buf[4] = 2;
	assert_int_equal(td_frame_parse(buf, 8, 1024, NULL), -EPROTO);
}

static void test_two_frames_back_to_back(void **state)
{
	uint8_t buf[32];
	struct td_frame f;
	long n;

	td_frame_header(buf, 2, 0);
	memcpy(buf + 8, "ab", 2);
	td_frame_header(buf + 10, 0, 0);
	n = td_frame_parse(buf, 18, 1024, &f);
	assert_int_equal(n, 10);
	assert_int_equal(td_frame_parse(buf + n, 18 - (size_t)n, 1024, &f), 8);
	assert_int_equal(f.len, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_needs_more),
		cmocka_unit_test(test_oversize_decided_from_header),
		cmocka_unit_test(test_bad_version),
		cmocka_unit_test(test_two_frames_back_to_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
