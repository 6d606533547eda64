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
#include <zlib.h>

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

/* A STEP body as state.c writes it: an unlinked name, a request's entry, another name. */
static void step_with_a_request(struct rec_buf *b, uint16_t seq_name_len)
{
	struct rec_step sh = { .commit = 5, .next_commit = 6, .n = 3 };
	struct rec_entry un = { .kind = ENTRY_UNLINKED, .name_len = 1, .generation = 4 };
	struct rec_entry se = { .kind = ENTRY_SEQ, .name_len = seq_name_len };
	struct rec_seq q = { .token = 0xabc,
			     .seq = 9,
			     .generation = 4,
			     .commit = 5,
			     .uid = 1000,
			     .kind = 3,
			     .unlinked = 1 };

	rec_put(b, &sh, sizeof(sh));
	rec_put(b, &un, sizeof(un));
	rec_put(b, "a\0\0\0\0\0\0\0", rec_entry_size(&un) - sizeof(un));
	rec_put(b, &se, sizeof(se));
	rec_put(b, &q, sizeof(q));
	rec_put(b, &un, sizeof(un));
	rec_put(b, "b\0\0\0\0\0\0\0", rec_entry_size(&un) - sizeof(un));
}

struct seen {
	unsigned n, seqs;
	struct rec_seq q;
	char names[4];
};

static int see(void *arg, const struct rec_parsed *p, const char **why)
{
	struct seen *s = arg;

	if (p->e.kind == ENTRY_SEQ) {
		s->q = p->s;
		s->seqs++;
		assert_null(p->name);
	} else {
		s->names[s->n - s->seqs] = p->name[0];
	}
	s->n++;
	return 0;
}

static void test_a_step_carries_the_request_that_made_it(void **state)
{
	struct rec_buf b = { 0 };
	struct rec_step sh;
	struct seen s = { 0 };
	const char *why = NULL;

	step_with_a_request(&b, 0);
	assert_int_equal(rec_step_parse(b.p, b.len, &sh, see, &s, &why), 0);
	assert_int_equal(s.n, 3);
	assert_int_equal(s.seqs, 1);
	assert_memory_equal(s.names, "ab", 2);
	assert_int_equal(s.q.token, 0xabc);
	assert_int_equal(s.q.seq, 9);
	assert_int_equal(s.q.uid, 1000);
	assert_int_equal(s.q.unlinked, 1);
	/* Cut inside the request's entry: refused, never read past. */
	for (size_t cut = sizeof(sh) + 56; cut < b.len - 56; cut += 8) {
		memset(&s, 0, sizeof(s));
		assert_int_equal(rec_step_parse(b.p, cut, &sh, see, &s, &why), -1);
	}
	/* A request's entry with a name is no entry of any daemon's. */
	b.len = 0;
	step_with_a_request(&b, 3);
	memset(&s, 0, sizeof(s));
	assert_int_equal(rec_step_parse(b.p, b.len, &sh, see, &s, &why), -1);
	assert_non_null(strstr(why, "request's entry"));
	free(b.p);
}

static void test_a_step_of_the_format_before_requests_still_reads(void **state)
{
	/* What main's daemon wrote before ENTRY_SEQ: names only (an upgrade restores it). */
	struct rec_buf b = { 0 };
	struct rec_step sh = { .commit = 2, .n = 2 };
	struct rec_entry un = { .kind = ENTRY_UNLINKED, .name_len = 1 };
	struct seen s = { 0 };
	const char *why = NULL;

	rec_put(&b, &sh, sizeof(sh));
	rec_put(&b, &un, sizeof(un));
	rec_put(&b, "a\0\0\0\0\0\0\0", rec_entry_size(&un) - sizeof(un));
	rec_put(&b, &un, sizeof(un));
	rec_put(&b, "b\0\0\0\0\0\0\0", rec_entry_size(&un) - sizeof(un));
	assert_int_equal(rec_step_parse(b.p, b.len, &sh, see, &s, &why), 0);
	assert_int_equal(s.n, 2);
	assert_int_equal(s.seqs, 0);
	free(b.p);
}

/* CRC-32C's check value (RFC 3720's polynomial), whole and in pieces of every split. */
static void test_crc32c_is_castagnolis(void **state)
{
	static const char digits[] = "123456789";
	uint8_t big[1000];

	(void)state;
	assert_int_equal(rec_crc32c(0, digits, 9), 0xE3069283u);
	for (size_t k = 0; k <= 9; k++)
		assert_int_equal(rec_crc32c(rec_crc32c(0, digits, k), digits + k, 9 - k),
				 0xE3069283u);
	/* 32 zero bytes: RFC 3720's example. */
	memset(big, 0, sizeof(big));
	assert_int_equal(rec_crc32c(0, big, 32), 0x8A9136AAu);
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7 + 3);
	assert_int_equal(rec_crc32c(rec_crc32c(0, big, 333), big + 333, sizeof(big) - 333),
			 rec_crc32c(0, big, sizeof(big)));
	/* The table's result is the instruction's, at every length and alignment. */
	assert_int_equal(rec_crc32c_portable(0, digits, 9), 0xE3069283u);
	for (size_t off = 0; off < 9; off++)
		for (size_t n = 0; off + n <= sizeof(big); n += 37)
			assert_int_equal(rec_crc32c_portable(5, big + off, n),
					 rec_crc32c(5, big + off, n));
}

/* A record written by a daemon before CRC-32C (version 1, zlib's CRC-32) still reads; damaged, not. */
static void test_a_record_of_version_1_still_reads(void **state)
{
	struct rec_buf b = { 0 };
	struct rec_head h;
	const uint8_t *body;
	const char *why = NULL;
	size_t first;
	uLong crc;

	(void)state;
	two_records(&b, &first);
	memcpy(&h, b.p, sizeof(h));
	assert_int_equal(h.version, REC_VERSION);
	h.version = REC_VERSION_ZLIB;
	h.crc = 0;
	crc = crc32(crc32(0L, (const Bytef *)&h, sizeof(h)), b.p + sizeof(h), (uInt)h.len);
	h.crc = (uint32_t)crc;
	memcpy(b.p, &h, sizeof(h));
	assert_int_equal(rec_check(b.p, b.len, 0, &h, &body, &why), 0);
	assert_int_equal(((const struct rec_begin *)body)->serial, 7);
	/* Its version-2 checksum would not do, nor a changed byte. */
	b.p[sizeof(h)] ^= 1;
	assert_int_equal(rec_check(b.p, b.len, 0, &h, &body, &why), -1);
	assert_string_equal(why, "a record whose checksum is wrong (damaged)");
	free(b.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_whole_records_read_back),
		cmocka_unit_test(test_crc32c_is_castagnolis),
		cmocka_unit_test(test_a_record_of_version_1_still_reads),
		cmocka_unit_test(test_every_damage_is_refused),
		cmocka_unit_test(test_a_record_without_its_magic_is_the_end_only_before_zeros),
		cmocka_unit_test(test_a_step_carries_the_request_that_made_it),
		cmocka_unit_test(test_a_step_of_the_format_before_requests_still_reads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
