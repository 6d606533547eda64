/*
 * The state log's records (daemon/persist/record.c, docs/restart.md
 * section 3): a record is whole and checked, or refused with the reason,
 * whatever was done to its bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/persist/record.h"

/* Two records, BEGIN then a STEP of body bytes, in b. */
static void two_records(struct rec_buf *b, size_t *first_len)
{
	struct rec_buf r = { 0 };
	struct rec_begin bg = { .serial = 7, .next_commit = 3 };
	char body[100];

	memset(body, 'x', sizeof(body));
	rec_begin(&r, REC_BEGIN);
	rec_put(&r, &bg, sizeof(bg));
	rec_seal(&r, 1, 42);
	rec_put(b, r.p, r.len);
	*first_len = r.len;
	rec_begin(&r, REC_STEP);
	rec_put(&r, body, sizeof(body));
	rec_seal(&r, 2, 42);
	rec_put(b, r.p, r.len);
	free(r.p);
}

static void test_whole_records_read_back(void **state)
{
	struct rec_buf b = { 0 };
	struct rec_head h;
	const uint8_t *body;
	const char *why = NULL;
	size_t first;

	two_records(&b, &first);
	assert_int_equal(rec_check(b.p, b.len, 0, &h, &body, &why), 0);
	assert_int_equal(h.kind, REC_BEGIN);
	assert_int_equal(h.seq, 1);
	assert_int_equal(h.lineage, 42);
	assert_int_equal(((const struct rec_begin *)body)->serial, 7);
	assert_int_equal(rec_check(b.p, b.len, first, &h, &body, &why), 0);
	assert_int_equal(h.kind, REC_STEP);
	assert_int_equal(h.len, 100);
	assert_int_equal(rec_check(b.p, b.len, b.len, &h, &body, &why), 1);
	free(b.p);
}

static void test_every_damage_is_refused(void **state)
{
	struct rec_buf b = { 0 };
	struct rec_head h;
	const uint8_t *body;
	size_t first;

	two_records(&b, &first);
	/* Any one byte of the second record flipped: its head or its body. */
	for (size_t i = first; i < b.len; i++) {
		const char *why = NULL;

		b.p[i] ^= 0x01;
		assert_int_equal(rec_check(b.p, b.len, first, &h, &body, &why), -1);
		assert_non_null(why);
		b.p[i] ^= 0x01;
	}
	/* Cut short anywhere: a torn write. */
	for (size_t len = first + 1; len < b.len; len++) {
		const char *why = NULL;

		assert_int_equal(rec_check(b.p, len, first, &h, &body, &why), -1);
		assert_non_null(why);
	}
	/* A length past the end, with a checksum to match, is still refused. */
	{
		struct rec_head bad;
		const char *why = NULL;

		memcpy(&bad, b.p + first, sizeof(bad));
		bad.len = 1u << 30;
		memcpy(b.p + first, &bad, sizeof(bad));
		assert_int_equal(rec_check(b.p, b.len, first, &h, &body, &why), -1);
		assert_non_null(strstr(why, "longer"));
	}
	free(b.p);
}

/* A crash cuts a write before its magic: the end, when zeros follow its length. */
static void test_a_record_without_its_magic_is_the_end_only_before_zeros(void **state)
{
	struct rec_buf b = { 0 };
	struct rec_head h;
	const uint8_t *body;
	const char *why = NULL;
	size_t first, whole;

	two_records(&b, &first);
	whole = b.len;
	rec_put(&b, NULL, 4096);   /* the log's room, allocated ahead */
	memset(b.p + first, 0, 4); /* the second record's magic never written */
	assert_int_equal(rec_check(b.p, b.len, first, &h, &body, &why), 1);
	/* A byte past its length: not a crash's doing. */
	b.p[whole + 100] = 1;
	assert_int_equal(rec_check(b.p, b.len, first, &h, &body, &why), -1);
	assert_non_null(strstr(why, "past the log's end"));
	free(b.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_whole_records_read_back),
		cmocka_unit_test(test_every_damage_is_refused),
		cmocka_unit_test(test_a_record_without_its_magic_is_the_end_only_before_zeros),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
