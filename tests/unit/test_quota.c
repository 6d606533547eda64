/*
 * Per-uid accounting: limits refuse with the right errno and a message
 * naming the flag, exempt uids are counted but never refused, uncharging
 * frees the share, the table grows past many uids, and the descriptor
 * reserve is kept for root.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/base/quota.h"

static struct quota q;

static int setup(void **state)
{
	struct quota_limits lim = { 0 };

	lim.per_uid[QUOTA_CLIENTS] = 2;
	lim.per_uid[QUOTA_TENSORS] = 3;
	lim.per_uid[QUOTA_BYTES] = 1000;
	lim.exempt[lim.n_exempt++] = 7;
	quota_default_limits(&lim, 1024, 4096);
	quota_init(&q, &lim);
	return 0;
}

static int teardown(void **state)
{
	quota_fini(&q);
	return 0;
}

static void test_defaults(void **state)
{
	struct quota_limits lim = { 0 };

	quota_default_limits(&lim, 1024, 4096);
	assert_int_equal(lim.per_uid[QUOTA_CLIENTS], 1024);
	assert_int_equal(lim.fd_reserve, 64);
	assert_int_equal(lim.per_uid[QUOTA_TENSORS], QUOTA_TENSORS_DEFAULT);
	assert_int_equal(lim.per_uid[QUOTA_FDS], (1024 - 64) / 2);
	assert_int_equal(lim.per_uid[QUOTA_BYTES], 0);
	assert_int_equal(lim.waiters_per_conn, 1024);
	assert_int_equal(lim.fds_in_flight_per_conn, 64);
	assert_int_equal(lim.per_uid[QUOTA_FDS_IN_FLIGHT], (1024 - 64) / 4);
	/* Flags given stay as given. */
	lim.per_uid[QUOTA_CLIENTS] = 3;
	quota_default_limits(&lim, 1024, 4096);
	assert_int_equal(lim.per_uid[QUOTA_CLIENTS], 3);
	/* A tiny budget still leaves a reserve and a share. */
	memset(&lim, 0, sizeof(lim));
	quota_default_limits(&lim, 40, 8);
	assert_int_equal(lim.per_uid[QUOTA_CLIENTS], 2);
	assert_true(lim.fd_reserve >= 1 && lim.fd_reserve < 40);
	assert_true(lim.per_uid[QUOTA_FDS] >= 1);
}

static void test_limit_refuses_with_flag(void **state)
{
	char why[200];

	assert_int_equal(quota_charge(&q, 1000, QUOTA_CLIENTS, 1, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&q, 1000, QUOTA_CLIENTS, 1, why, sizeof(why)), 0);
	why[0] = 0;
	assert_int_equal(quota_charge(&q, 1000, QUOTA_CLIENTS, 1, why, sizeof(why)), -EDQUOT);
	assert_non_null(strstr(why, "--max-clients-per-uid"));
	assert_non_null(strstr(why, "uid 1000"));
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_CLIENTS], 2);
	/* Another uid has its own share. */
	assert_int_equal(quota_charge(&q, 1001, QUOTA_CLIENTS, 1, why, sizeof(why)), 0);
	quota_uncharge(&q, 1000, QUOTA_CLIENTS, 1);
	assert_int_equal(quota_charge(&q, 1000, QUOTA_CLIENTS, 1, why, sizeof(why)), 0);
}

static void test_bytes_and_tensors(void **state)
{
	char why[200];

	assert_int_equal(quota_charge(&q, 5, QUOTA_BYTES, 600, why, sizeof(why)), 0);
	assert_false(quota_room(&q, 5, QUOTA_BYTES, 401));
	assert_true(quota_room(&q, 5, QUOTA_BYTES, 400));
	assert_int_equal(quota_charge(&q, 5, QUOTA_BYTES, 401, why, sizeof(why)), -EDQUOT);
	assert_non_null(strstr(why, "--max-bytes-per-uid"));
	/* Overflow of the sum is a refusal, not a wrap. */
	assert_int_equal(quota_charge(&q, 5, QUOTA_BYTES, UINT64_MAX, why, sizeof(why)), -EDQUOT);
	for (int i = 0; i < 3; i++)
		assert_int_equal(quota_charge(&q, 5, QUOTA_TENSORS, 1, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&q, 5, QUOTA_TENSORS, 1, why, sizeof(why)), -EDQUOT);
	assert_non_null(strstr(why, "--max-tensors-per-uid"));
	/* Uncharging more than held stops at 0. */
	quota_uncharge(&q, 5, QUOTA_TENSORS, 10);
	assert_int_equal(quota_get(&q, 5)->n[QUOTA_TENSORS], 0);
}

static void test_waiters_and_fds_are_eagain(void **state)
{
	struct quota_limits lim = { 0 };
	struct quota q2;
	char why[200];

	lim.per_uid[QUOTA_WAITERS] = 1;
	lim.per_uid[QUOTA_FDS_IN_FLIGHT] = 1;
	quota_init(&q2, &lim);
	assert_int_equal(quota_charge(&q2, 9, QUOTA_WAITERS, 1, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&q2, 9, QUOTA_WAITERS, 1, why, sizeof(why)), -EAGAIN);
	assert_int_equal(quota_charge(&q2, 9, QUOTA_FDS_IN_FLIGHT, 1, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&q2, 9, QUOTA_FDS_IN_FLIGHT, 1, why, sizeof(why)), -EAGAIN);
	quota_fini(&q2);
}

static void test_exempt_counted_not_refused(void **state)
{
	char why[200];

	for (int i = 0; i < 10; i++)
		assert_int_equal(quota_charge(&q, 7, QUOTA_CLIENTS, 1, why, sizeof(why)), 0);
	assert_int_equal(quota_get(&q, 7)->n[QUOTA_CLIENTS], 10);
	assert_true(quota_exempt(&q, 7));
	/* Root is not exempt unless named. */
	assert_false(quota_exempt(&q, 0));
	assert_int_equal(quota_charge(&q, 0, QUOTA_CLIENTS, 3, why, sizeof(why)), -EDQUOT);
}

static void count(const struct uid_usage *u, void *arg)
{
	(*(unsigned *)arg)++;
	assert_int_equal(u->n[QUOTA_TENSORS], u->uid % 3);
}

static void test_many_uids(void **state)
{
	char why[200];
	unsigned n = 0;

	for (uint32_t uid = 0; uid < 5000; uid++) {
		uint64_t k = uid % 3;

		if (k)
			assert_int_equal(quota_charge(&q, uid, QUOTA_TENSORS, k, why, sizeof(why)),
					 0);
		else
			assert_int_equal(quota_charge(&q, uid, QUOTA_CLIENTS, 1, why, sizeof(why)),
					 0);
	}
	for (uint32_t uid = 0; uid < 5000; uid++)
		assert_non_null(quota_get(&q, uid));
	assert_null(quota_get(&q, 5000));
	quota_each(&q, count, &n);
	assert_int_equal(n, 5000);
}

static void test_fd_reserve(void **state)
{
	struct quota_limits lim = { 0 };
	struct quota q2;
	int probe = fcntl(0, F_DUPFD_CLOEXEC, 0);

	assert_true(probe >= 0);
	close(probe);
	/* The next descriptor is probe: a budget that leaves it outside the
	 * reserve allows it; one that puts it inside refuses all but root. */
	lim.fd_budget = (unsigned)probe + 11;
	lim.fd_reserve = 10;
	quota_init(&q2, &lim);
	assert_true(quota_fd_room(&q2, 1000));
	q2.lim.fd_reserve = 11;
	assert_false(quota_fd_room(&q2, 1000));
	assert_true(quota_fd_room(&q2, 0));
	quota_fini(&q2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test_setup_teardown(test_limit_refuses_with_flag, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bytes_and_tensors, setup, teardown),
		cmocka_unit_test(test_waiters_and_fds_are_eagain),
		cmocka_unit_test_setup_teardown(test_exempt_counted_not_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_uids, setup, teardown),
		cmocka_unit_test(test_fd_reserve),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
