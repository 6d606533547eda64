/*
 * The metrics endpoint's request parser: what it answers for complete,
 * incomplete, foreign and malformed request heads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/metrics_http.h"

static int parse(const char *s)
{
	return metrics_http_parse(s, strlen(s));
}

static void test_get_metrics(void **state)
{
	assert_int_equal(parse("GET /metrics HTTP/1.0\r\n\r\n"), 200);
	assert_int_equal(parse("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"), 200);
	assert_int_equal(parse("GET /metrics?name[]=x HTTP/1.1\r\n\r\n"), 200);
	assert_int_equal(parse("GET /metrics HTTP/1.0\n\n"), 200); /* bare LFs */
}

static void test_incomplete_head_waits(void **state)
{
	assert_int_equal(parse(""), 0);
	assert_int_equal(parse("GET /metrics HTTP/1.0\r\n"), 0);
	assert_int_equal(parse("GET /metr"), 0);
}

static void test_other_paths_and_methods(void **state)
{
	assert_int_equal(parse("GET / HTTP/1.0\r\n\r\n"), 404);
	assert_int_equal(parse("GET /metricsx HTTP/1.0\r\n\r\n"), 404);
	assert_int_equal(parse("GET /metric HTTP/1.0\r\n\r\n"), 404);
	assert_int_equal(parse("POST /metrics HTTP/1.0\r\n\r\n"), 405);
	assert_int_equal(parse("HEAD /metrics HTTP/1.0\r\n\r\n"), 405);
	assert_int_equal(parse("GETX /metrics HTTP/1.0\r\n\r\n"), 405);
}

static void test_malformed(void **state)
{
	assert_int_equal(parse("\r\n\r\n"), 400);
	assert_int_equal(parse("GET\r\n\r\n"), 400);
	assert_int_equal(parse("GET /metrics\r\n\r\n"), 400);
	assert_int_equal(parse("GET /metrics FTP/1.0\r\n\r\n"), 400);
	assert_int_equal(parse("GET /metrics H\r\n\r\n"), 400);
	/* A NUL inside is just a byte. */
	assert_int_equal(metrics_http_parse("GET /me\0rics HTTP/1.0\r\n\r\n", 26), 404);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_get_metrics),
		cmocka_unit_test(test_incomplete_head_waits),
		cmocka_unit_test(test_other_paths_and_methods),
		cmocka_unit_test(test_malformed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
