/*
 * The metrics endpoint's request parser: what it answers for complete,
 * incomplete, foreign and malformed request heads; and its slot policy:
 * which open connection a newcomer replaces (metrics_http_victim()).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

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

/* --- the slot policy --------------------------------------------------------------- */

static struct metrics_http_peer uid_peer(uint32_t uid)
{
	struct metrics_http_peer p = { .family = AF_UNIX };

	memcpy(p.addr, &uid, sizeof(uid));
	return p;
}

/* n open connections of uid, oldest first (seq 1..n), none answered. */
static size_t fill(struct metrics_http_slot *v, size_t n, uint32_t uid, uint64_t first_seq)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (struct metrics_http_slot){ uid_peer(uid), false, first_seq + i };
	return n;
}

static void test_room_below_the_bounds(void **state)
{
	struct metrics_http_slot v[METRICS_HTTP_CONNS_MAX] = { 0 };
	struct metrics_http_peer root = uid_peer(0);

	assert_int_equal(metrics_http_victim(v, 0, &root), -1);
	fill(v, METRICS_HTTP_CONNS_PER_PEER - 1, 65534, 1);
	assert_int_equal(metrics_http_victim(v, METRICS_HTTP_CONNS_PER_PEER - 1, &root), -1);
}

static void test_a_peer_past_its_share_gives_up_its_oldest_unfinished(void **state)
{
	struct metrics_http_slot v[METRICS_HTTP_CONNS_MAX] = { 0 };
	struct metrics_http_peer nobody = uid_peer(65534), root = uid_peer(0);
	size_t n = fill(v, METRICS_HTTP_CONNS_PER_PEER, 65534, 10);

	/* Shuffled, so the answer is by age, not by position. */
	v[0].seq = 50;
	assert_int_equal(metrics_http_victim(v, n, &nobody), 1);
	/* Its answered ones are never cut off. */
	v[1].answered = true;
	assert_int_equal(metrics_http_victim(v, n, &nobody), 2);
	for (size_t i = 0; i < n; i++)
		v[i].answered = true;
	assert_int_equal(metrics_http_victim(v, n, &nobody), -2);
	/* Another peer is not held back by it. */
	assert_int_equal(metrics_http_victim(v, n, &root), -1);
}

static void test_when_all_are_taken_the_oldest_unfinished_goes(void **state)
{
	struct metrics_http_slot v[METRICS_HTTP_CONNS_MAX] = { 0 };
	struct metrics_http_peer root = uid_peer(0);
	size_t n = 0;

	/* Four uids with a full share each: 16. */
	for (uint32_t u = 1; u <= METRICS_HTTP_CONNS_MAX / METRICS_HTTP_CONNS_PER_PEER; u++)
		n += fill(v + n, METRICS_HTTP_CONNS_PER_PEER, u, 100 * u);
	assert_int_equal(n, METRICS_HTTP_CONNS_MAX);
	assert_int_equal(metrics_http_victim(v, n, &root), 0);
	v[0].answered = true;
	assert_int_equal(metrics_http_victim(v, n, &root), 1);
	for (size_t i = 0; i < n; i++)
		v[i].answered = i != 9;
	assert_int_equal(metrics_http_victim(v, n, &root), 9);
	v[9].answered = true;
	assert_int_equal(metrics_http_victim(v, n, &root), -2);
}

static void test_tcp_peers_are_told_apart_by_address(void **state)
{
	struct metrics_http_slot v[METRICS_HTTP_CONNS_MAX] = { 0 };
	struct metrics_http_peer a = { .family = AF_INET, .addr = { 127, 0, 0, 1 } };
	struct metrics_http_peer b = { .family = AF_INET, .addr = { 127, 0, 0, 2 } };
	struct metrics_http_peer a6 = { .family = AF_INET6, .addr = { 127, 0, 0, 1 } };

	for (size_t i = 0; i < METRICS_HTTP_CONNS_PER_PEER; i++)
		v[i] = (struct metrics_http_slot){ a, false, i + 1 };
	assert_int_equal(metrics_http_victim(v, METRICS_HTTP_CONNS_PER_PEER, &a), 0);
	assert_int_equal(metrics_http_victim(v, METRICS_HTTP_CONNS_PER_PEER, &b), -1);
	assert_int_equal(metrics_http_victim(v, METRICS_HTTP_CONNS_PER_PEER, &a6), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_get_metrics),
		cmocka_unit_test(test_incomplete_head_waits),
		cmocka_unit_test(test_other_paths_and_methods),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_room_below_the_bounds),
		cmocka_unit_test(test_a_peer_past_its_share_gives_up_its_oldest_unfinished),
		cmocka_unit_test(test_when_all_are_taken_the_oldest_unfinished_goes),
		cmocka_unit_test(test_tcp_peers_are_told_apart_by_address),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
