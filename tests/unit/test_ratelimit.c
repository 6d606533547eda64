/*
 * ratelimit.c: per connection and kind, the first RATELIMIT_CONN_BURST lines
 * a second go out; over all connections RATELIMIT_ALL_BURST; what is held
 * back is said in one summary line, at the next window, at close, or when
 * flushed. The log goes to a file (log_open) whose lines are counted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/base/ratelimit.h"

static char path[64];

/* Lines in the log file so far that contain needle (NULL: every line). */
static int lines(const char *needle)
{
	char buf[1024];
	int n = 0;
	FILE *f = fopen(path, "r");

	assert_non_null(f);
	while (fgets(buf, sizeof(buf), f))
		if (!needle || strstr(buf, needle))
			n++;
	fclose(f);
	return n;
}

/* Tries n lines of kind from per at now; returns how many were allowed. */
static int try_n(int n, enum log_kind kind, struct log_limits *per, const struct log_peer *peer,
		 uint64_t now)
{
	int ok = 0;

	for (int i = 0; i < n; i++)
		if (ratelimit_allow(kind, per, peer, now)) {
			log_write(TD_LOG_WARN, "line %d", i);
			ok++;
		}
	return ok;
}

static int fresh(void **state)
{
	snprintf(path, sizeof(path), "/tmp/tensord-ratelimit-%d.log", (int)getpid());
	unlink(path);
	assert_int_equal(log_open(path, NULL, 0), 0);
	ratelimit_flush_all();
	return 0;
}

static void test_per_connection_burst_then_summary_at_close(void **state)
{
	struct log_limits a = { 0 };
	struct log_peer pa = { .conn_id = 7, .pid = 70, .uid = 1000 };
	uint64_t t = 1000 * RATELIMIT_WINDOW_NS;

	assert_int_equal(try_n(10000, LOG_KIND_BAD_RELEASE, &a, &pa, t), RATELIMIT_CONN_BURST);
	/* Another kind from the same connection has its own budget. */
	assert_int_equal(try_n(3, LOG_KIND_BAD_FRAME, &a, &pa, t), 3);
	ratelimit_flush(&a, &pa, t);
	assert_int_equal(lines("conn 7: pid 70 uid 1000: suppressed 9995 lines of kind "
			       "'release of an unknown lease'"),
			 1);
	assert_int_equal(lines(NULL), RATELIMIT_CONN_BURST + 3 + 1);
}

static void test_next_window_reports_and_refills(void **state)
{
	struct log_limits a = { 0 };
	struct log_peer pa = { .conn_id = 8, .pid = 80, .uid = 1001 };
	uint64_t t = 2000 * RATELIMIT_WINDOW_NS;

	assert_int_equal(try_n(100, LOG_KIND_BAD_RELEASE, &a, &pa, t), RATELIMIT_CONN_BURST);
	assert_int_equal(try_n(100, LOG_KIND_BAD_RELEASE, &a, &pa, t + RATELIMIT_WINDOW_NS / 2), 0);
	assert_int_equal(lines("suppressed"), 0);
	assert_int_equal(try_n(100, LOG_KIND_BAD_RELEASE, &a, &pa, t + RATELIMIT_WINDOW_NS),
			 RATELIMIT_CONN_BURST);
	assert_int_equal(lines("conn 8: pid 80 uid 1001: suppressed 195 lines"), 1);
}

static void test_many_connections_share_one_limit(void **state)
{
	uint64_t t = 3000 * RATELIMIT_WINDOW_NS;
	int ok = 0;

	/* 1000 connections, each under its own limit, and refused accepts
	 * that have no connection at all: the limit over all still holds. */
	for (int i = 0; i < 1000; i++) {
		struct log_limits l = { 0 };
		struct log_peer p = { .conn_id = 100 + (uint64_t)i, .pid = 1, .uid = 2000 };

		ok += try_n(RATELIMIT_CONN_BURST + 1, LOG_KIND_BEFORE_HELLO, &l, &p, t);
		ratelimit_flush(&l, &p, t); /* its summaries count against the same limit */
	}
	/* Lines and the first connections' summaries share the budget. */
	assert_in_range(ok, 1, RATELIMIT_ALL_BURST - 1);
	assert_int_equal(lines(NULL), RATELIMIT_ALL_BURST);
	assert_int_equal(try_n(500, LOG_KIND_REFUSED_ACCEPT, NULL, NULL, t), RATELIMIT_ALL_BURST);
	ratelimit_flush_all();
	assert_int_equal(lines("suppressed 5950 lines of kind 'request before hello' from all "
			       "clients"),
			 1);
	assert_int_equal(lines("suppressed 450 lines of kind 'refused connection' from all "
			       "clients"),
			 1);
	assert_int_equal(lines(NULL), 2 * RATELIMIT_ALL_BURST + 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_per_connection_burst_then_summary_at_close, fresh),
		cmocka_unit_test_setup(test_next_window_reports_and_refills, fresh),
		cmocka_unit_test_setup(test_many_connections_share_one_limit, fresh),
	};
	int saved = dup(STDERR_FILENO), r;

	r = cmocka_run_group_tests(tests, NULL, NULL);
	dup2(saved, STDERR_FILENO);
	if (r)
		fprintf(stderr, "the log of the failed test is in %s\n", path);
	else
		unlink(path);
	return r;
}
