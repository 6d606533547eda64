/* Frame codec: header round trip, partial input, limits, version, descriptor counts. */
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
	assert_int_equal(td_frame_parse(buf, 13, 1024, 1, &f), 13);
	assert_int_equal(f.len, 5);
	assert_int_equal(f.flags, 1);
	assert_int_equal(f.n_fds, 1);
	assert_int_equal(f.version, 1);
	assert_memory_equal(f.payload, "hello", 5);
}

/* Every count a header can hold comes back, and has one encoding. */
static void test_fd_counts_round_trip(void **state)
{
	static const unsigned counts[] = { 0, 1, 2, 3, 28, 255, TD_FRAME_FDS_COUNTABLE };
	uint8_t buf[8];
	struct td_frame f;

	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		td_frame_header(buf, 0, counts[i]);
		assert_int_equal(td_frame_parse(buf, 8, 1024, TD_FRAME_FDS_COUNTABLE, &f), 8);
		assert_int_equal(f.n_fds, counts[i]);
	}
	for (unsigned flags = 0; flags <= 0xffff; flags++) {
		buf[6] = (uint8_t)flags;
		buf[7] = (uint8_t)(flags >> 8);
		if (td_frame_parse(buf, 8, 1024, TD_FRAME_FDS_COUNTABLE, &f) != 8)
			continue;
		/* Bits 1-7 are ignored; the rest is the count's one encoding. */
		td_frame_header(buf, 0, f.n_fds);
		assert_int_equal(buf[6] | buf[7] << 8, flags & ~0xfeu);
	}
}

/*
 * Zero and one descriptor are the bytes peers wrote before the count
 * (bit 0: "one descriptor"), in both directions.
 */
static void test_fd_count_wire_compatible(void **state)
{
	uint8_t old[8] = { 3, 0, 0, 0, 1, 0, 1, 0 }, buf[8];
	struct td_frame f;

	td_frame_header(buf, 3, 1);
	assert_memory_equal(buf, old, 8);
	assert_int_equal(td_frame_parse(old, 8, 1024, 1, &f), 0);
	assert_int_equal(f.n_fds, 1);
	old[6] = 0;
	td_frame_header(buf, 3, 0);
	assert_memory_equal(buf, old, 8);
	/* A frame of two has bit 0 too: a peer without counts sees "some". */
	td_frame_header(buf, 3, 2);
	assert_int_equal(buf[6], TD_FRAME_FLAG_FD);
	assert_int_equal(buf[7], 1);
}

/* Too many descriptors are refused from the header, before the payload. */
static void test_fd_count_limit(void **state)
{
	uint8_t buf[8];
	struct td_frame f;

	td_frame_header(buf, 100, 1);
	assert_int_equal(td_frame_parse(buf, 8, 1024, 0, &f), -ETOOMANYREFS);
	assert_int_equal(td_frame_parse(buf, 8, 1024, 1, &f), 0);
	td_frame_header(buf, 100, 2);
	assert_int_equal(td_frame_parse(buf, 8, 1024, 1, &f), -ETOOMANYREFS);
	assert_int_equal(td_frame_parse(buf, 8, 1024, 2, &f), 0);
	td_frame_header(buf, 100, TD_FRAME_FDS_COUNTABLE);
	assert_int_equal(td_frame_parse(buf, 8, 1024, TD_FRAME_FDS_COUNTABLE - 1, &f),
			 -ETOOMANYREFS);
	/* More beyond the first, with no first: no valid count. */
	td_frame_header(buf, 100, 0);
	buf[7] = 1;
	assert_int_equal(td_frame_parse(buf, 8, 1024, TD_FRAME_FDS_COUNTABLE, &f), -ETOOMANYREFS);
	/* The version and the length are still checked first. */
	td_frame_header(buf, 2000, 5);
	assert_int_equal(td_frame_parse(buf, 8, 1024, 0, &f), -EMSGSIZE);
	buf[4] = 2;
	assert_int_equal(td_frame_parse(buf, 8, 1024, 0, &f), -EPROTO);
}

static void test_needs_more(void **state)
{
	uint8_t buf[64];

	struct td_frame f;

	td_frame_header(buf, 5, 2);
	for (size_t n = 0; n < 13; n++) {
		assert_int_equal(td_frame_parse(buf, n, 1024, 2, NULL), 0);
		assert_int_equal(td_frame_parse(buf, n, 1024, 2, &f), 0);
		/* The header of a frame still arriving is known once it is all there. */
		assert_null(f.payload);
		assert_int_equal(f.n_fds, n < 8 ? 0 : 2);
		assert_int_equal(f.len, n < 8 ? 0 : 5);
	}
}

static void test_oversize_decided_from_header(void **state)
{
	uint8_t buf[8] = { 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0 };

	/* 4 GiB announced: refused before any payload arrives. */
	assert_int_equal(td_frame_parse(buf, 8, TD_FRAME_MAX_REQUEST, 0, NULL), -EMSGSIZE);
	td_frame_header(buf, TD_FRAME_MAX_REQUEST, 0);
	assert_int_equal(td_frame_parse(buf, 8, TD_FRAME_MAX_REQUEST, 0, NULL), 0);
	td_frame_header(buf, TD_FRAME_MAX_REQUEST + 1, 0);
	assert_int_equal(td_frame_parse(buf, 8, TD_FRAME_MAX_REQUEST, 0, NULL), -EMSGSIZE);
}

static void test_bad_version(void **state)
{
	uint8_t buf[8];

	td_frame_header(buf, 0, 0);
	buf[4] = 2;
	assert_int_equal(td_frame_parse(buf, 8, 1024, 0, NULL), -EPROTO);
}

static void test_two_frames_back_to_back(void **state)
{
	uint8_t buf[32];
	struct td_frame f;
	long n;

	td_frame_header(buf, 2, 0);
	memcpy(buf + 8, "ab", 2);
	td_frame_header(buf + 10, 0, 0);
	n = td_frame_parse(buf, 18, 1024, 0, &f);
	assert_int_equal(n, 10);
	assert_int_equal(td_frame_parse(buf + n, 18 - (size_t)n, 1024, 0, &f), 8);
	assert_int_equal(f.len, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_fd_counts_round_trip),
		cmocka_unit_test(test_fd_count_wire_compatible),
		cmocka_unit_test(test_fd_count_limit),
		cmocka_unit_test(test_needs_more),
		cmocka_unit_test(test_oversize_decided_from_header),
		cmocka_unit_test(test_bad_version),
		cmocka_unit_test(test_two_frames_back_to_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
