/*
 * Waiters on a real libuv loop: woken by a publish of their name, timed out
 * by their timer, dropped with their owner without a call back, also while
 * a wake is answering others.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/waiters.h"

struct call {
	struct waiter_owner *o;
	uint64_t req_id;
	int status;
};

static struct call calls[64];
static int n_calls;
static struct waiter_owner *drop_on_call; /* on_done drops this owner */
/* Owners outlive their tests: teardown drops what is still parked. */
static struct waiter_owner a, b;

static void on_done(struct waiter_owner *o, const struct waiter_req *req, int status, void *ctx)
{
	assert_true(n_calls < 64);
	calls[n_calls++] = (struct call){ o, req->req_id, status };
	if (drop_on_call)
		waiters_drop_owner(ctx, drop_on_call);
}

static int setup(void **state)
{
	static uv_loop_t loop;
	static struct waiters ws;

	assert_int_equal(uv_loop_init(&loop), 0);
	waiters_init(&ws, &loop, on_done, &ws);
	n_calls = 0;
	drop_on_call = NULL;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	*state = &ws;
	return 0;
}

/* Every handle is closed and every waiter freed (ASan checks the latter). */
static int teardown(void **state)
{
	struct waiters *ws = *state;

	waiters_drop_all(ws);
	uv_run(ws->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(ws->loop), 0);
	return 0;
}

static void add(struct waiters *ws, struct waiter_owner *o, uint64_t id, const char *name,
		int64_t timeout_ms)
{
	struct waiter_req req = { .req_id = id, .name_len = strlen(name) };

	memcpy(req.name, name, req.name_len + 1);
	assert_int_equal(waiters_add(ws, o, &req, timeout_ms), 0);
}

static void test_wake_answers_oldest_first(void **state)
{
	struct waiters *ws = *state;

	add(ws, &a, 1, "x", 0);
	add(ws, &b, 2, "y", 0);
	add(ws, &a, 3, "x", 60000);
	assert_int_equal(a.n_waiters, 2);
	waiters_wake(ws, "xx", 2, 1);
	waiters_wake(ws, "", 0, 1);
	assert_int_equal(n_calls, 0);
	waiters_wake(ws, "x", 1, 1);
	assert_int_equal(n_calls, 2);
	assert_ptr_equal(calls[0].o, &a);
	assert_int_equal(calls[0].req_id, 1);
	assert_int_equal(calls[0].status, 0);
	assert_int_equal(calls[1].req_id, 3);
	assert_int_equal(a.n_waiters, 0);
	assert_int_equal(b.n_waiters, 1);
	/* Done means gone: a second publish finds nobody. */
	waiters_wake(ws, "x", 1, 1);
	assert_int_equal(n_calls, 2);
}

static void test_timeout(void **state)
{
	struct waiters *ws = *state;

	add(ws, &a, 7, "slow", 1);
	add(ws, &a, 8, "forever", -1);
	uv_run(ws->loop, UV_RUN_DEFAULT); /* returns once the timer is done */
	assert_int_equal(n_calls, 1);
	assert_int_equal(calls[0].req_id, 7);
	assert_int_equal(calls[0].status, -ETIMEDOUT);
	assert_int_equal(a.n_waiters, 1);
	waiters_wake(ws, "slow", 4, 1);
	assert_int_equal(n_calls, 1);
}

static void test_drop_owner(void **state)
{
	struct waiters *ws = *state;

	add(ws, &a, 1, "x", 1);
	add(ws, &b, 2, "x", 1);
	add(ws, &a, 3, "y", 0);
	waiters_drop_owner(ws, &a);
	assert_int_equal(a.n_waiters, 0);
	waiters_wake(ws, "y", 1, 1);
	assert_int_equal(n_calls, 0);
	uv_run(ws->loop, UV_RUN_DEFAULT);
	assert_int_equal(n_calls, 1);
	assert_ptr_equal(calls[0].o, &b);
	assert_int_equal(calls[0].status, -ETIMEDOUT);
}

/* Answering one waiter can close its connection: its owner's other woken
 * waiters must not be called back. */
static void test_drop_while_firing(void **state)
{
	struct waiters *ws = *state;

	add(ws, &a, 1, "x", 0);
	add(ws, &b, 2, "x", 60000);
	add(ws, &a, 3, "x", 60000);
	add(ws, &a, 4, "other", 60000);
	drop_on_call = &a;
	waiters_wake(ws, "x", 1, 1);
	assert_int_equal(n_calls, 2);
	assert_int_equal(calls[0].req_id, 1);
	assert_int_equal(calls[1].req_id, 2);
	assert_int_equal(a.n_waiters, 0);
	assert_int_equal(b.n_waiters, 0);
}

/* A publish visits the waiters of its own name only, however many wait
 * for other names; a close visits only its own waiters. */
static void test_work_is_linear_in_what_is_touched(void **state)
{
	struct waiters *ws = *state;
	char name[32];
	uint64_t before;

	for (int i = 0; i < 2000; i++) {
		snprintf(name, sizeof(name), "other/%d", i % 500);
		add(ws, &b, 100 + (uint64_t)i, name, i % 2 ? 60000 : 0);
	}
	add(ws, &a, 1, "x", 0);
	add(ws, &a, 2, "x", 60000);
	add(ws, &a, 3, "y", 0);
	before = ws->visits;
	waiters_wake(ws, "x", 1, 1);
	assert_int_equal(n_calls, 2);
	assert_int_equal(ws->visits - before, 2);
	before = ws->visits;
	waiters_wake(ws, "nobody", 6, 1);
	assert_int_equal(ws->visits - before, 0);
	before = ws->visits;
	waiters_drop_owner(ws, &a);
	assert_int_equal(ws->visits - before, 1);
	assert_int_equal(a.n_waiters, 0);
	/* b's waiters are all still there, four per name. */
	before = ws->visits;
	waiters_wake(ws, "other/7", 7, 1);
	assert_int_equal(n_calls, 6);
	assert_int_equal(ws->visits - before, 4);
	assert_int_equal(b.n_waiters, 1996);
	before = ws->visits;
	waiters_drop_owner(ws, &b);
	assert_int_equal(ws->visits - before, 1996);
	assert_int_equal(b.n_waiters, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_wake_answers_oldest_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drop_owner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drop_while_firing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_work_is_linear_in_what_is_touched, setup,
						teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
