/*
 * What clients' effecting requests did (daemon/persist/seqs.c,
 * docs/restart.md section 5): a result is found while remembered; "not
 * applied" only when the table can know it; what was evicted says so; a
 * token answers its own uid only; a rewritten log's entries restore the
 * same answers.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/persist/seqs.h"

#define UID 1000
#define OTHER 1001

/* Request seq of token took effect as a publish of generation gen. */
static void applied(struct seqs *s, uint64_t token, uint64_t seq, uint64_t gen)
{
	struct rec_seq res = { .generation = gen, .commit = 100 + gen, .published = 1 };

	seqs_arm(s, token, UID, seq, SEQ_PUBLISHED);
	assert_true(seqs_armed(s));
	seqs_step(s, &res);
	assert_false(seqs_armed(s));
}

/* Resolve as a daemon after a restart (another instance) would. */
static int ask(struct seqs *s, uint64_t token, uint64_t seq, struct rec_seq *ret)
{
	char why[300];

	return seqs_resolve(s, token, UID, seq, true, false, ret, why, sizeof(why));
}

static void test_a_result_is_found_and_others_are_not_applied(void **state)
{
	struct seqs *s = seqs_new(0);
	struct rec_seq got;
	const struct rec_seq *logged;

	applied(s, 7, 1, 1);
	logged = seqs_take_step(s);
	assert_non_null(logged);
	assert_int_equal(logged->token, 7);
	assert_int_equal(logged->seq, 1);
	assert_int_equal(logged->kind, SEQ_PUBLISHED);
	assert_null(seqs_take_step(s)); /* once */
	applied(s, 7, 3, 2);
	assert_int_equal(ask(s, 7, 3, &got), 1);
	assert_int_equal(got.generation, 2);
	assert_int_equal(got.commit, 102);
	assert_int_equal(ask(s, 7, 2, &got), 0); /* never applied, and known */
	assert_int_equal(ask(s, 7, 4, &got), 0);
	assert_int_equal(ask(s, 8, 1, &got), 0); /* a token with no results */
	/* A step with nothing armed is no request's. */
	seqs_step(s, &(struct rec_seq){ .generation = 9 });
	assert_null(seqs_take_step(s));
	seqs_free(s);
}

static void test_not_applied_only_when_no_connection_of_it_is_open(void **state)
{
	struct seqs *s = seqs_new(0);
	struct rec_seq got;
	char why[300];

	assert_int_equal(seqs_open(s, 7, UID), 0); /* the lost connection, not closed yet */
	assert_int_equal(seqs_open(s, 7, UID), 0); /* the asker's */
	/* The same instance: the request may still be under way on the first. */
	assert_int_equal(seqs_resolve(s, 7, UID, 1, false, true, &got, why, sizeof(why)), -ESTALE);
	assert_non_null(strstr(why, "still open"));
	/* Another instance: nothing of it can be under way here. */
	assert_int_equal(seqs_resolve(s, 7, UID, 1, true, true, &got, why, sizeof(why)), 0);
	seqs_close(s, 7);
	assert_int_equal(seqs_resolve(s, 7, UID, 1, false, true, &got, why, sizeof(why)), 0);
	seqs_free(s);
}

static void test_a_token_answers_its_own_uid_only(void **state)
{
	struct seqs *s = seqs_new(0);
	struct rec_seq got;
	char why[300];

	applied(s, 7, 1, 1);
	assert_int_equal(seqs_resolve(s, 7, OTHER, 1, true, false, &got, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "another user"));
	assert_int_equal(seqs_resolve(s, 7, OTHER, 2, true, false, &got, why, sizeof(why)), -EPERM);
	assert_int_equal(seqs_open(s, 7, OTHER), -EPERM);
	assert_int_equal(seqs_open(s, 7, UID), 0);
	seqs_free(s);
}

static void test_a_token_keeps_its_last_results_and_knows_what_it_forgot(void **state)
{
	struct seqs *s = seqs_new(0);
	struct rec_seq got;

	for (uint64_t q = 1; q <= SEQS_PER_TOKEN + 4; q++)
		applied(s, 7, q, q);
	assert_int_equal(seqs_results(s), SEQS_PER_TOKEN);
	for (uint64_t q = 1; q <= 4; q++)
		assert_int_equal(ask(s, 7, q, &got), -ESTALE); /* evicted: never "not applied" */
	for (uint64_t q = 5; q <= SEQS_PER_TOKEN + 4; q++) {
		assert_int_equal(ask(s, 7, q, &got), 1);
		assert_int_equal(got.generation, q);
	}
	assert_int_equal(ask(s, 7, SEQS_PER_TOKEN + 5, &got), 0);
	seqs_free(s);
}

static void test_the_least_recently_used_idle_token_goes_first(void **state)
{
	struct seqs *s = seqs_new(2);
	struct rec_seq got;

	applied(s, 1, 1, 1);
	assert_int_equal(seqs_open(s, 2, UID), 0); /* open: never evicted */
	applied(s, 2, 1, 1);
	applied(s, 3, 1, 1); /* token 1 goes: idle and oldest */
	assert_int_equal(seqs_tokens(s), 2);
	assert_int_equal(ask(s, 1, 1, &got), -ESTALE);
	assert_int_equal(ask(s, 2, 1, &got), 1);
	assert_int_equal(ask(s, 3, 1, &got), 1);
	/* An unknown token may have been evicted now: cannot know. */
	assert_int_equal(ask(s, 99, 1, &got), -ESTALE);
	/* A token seen anew after evictions knows from its first result on. */
	seqs_close(s, 2);
	applied(s, 1, 5, 9); /* token 3 goes (2 was touched after it) */
	assert_int_equal(ask(s, 1, 5, &got), 1);
	assert_int_equal(ask(s, 1, 6, &got), 0);
	assert_int_equal(ask(s, 1, 4, &got), -ESTALE);
	seqs_free(s);
}

/* A rewritten log's entries, restored into t. */
static void copy_entry(void *arg, const struct rec_seq *e)
{
	seqs_restore(arg, e);
}

/* The same answers from a and b for every token and seq below the bounds. */
static void same_answers(struct seqs *a, struct seqs *b, uint64_t tokens, uint64_t seqs)
{
	for (uint64_t tk = 1; tk <= tokens; tk++)
		for (uint64_t q = 1; q <= seqs; q++) {
			struct rec_seq ga = { 0 }, gb = { 0 };
			int ra = ask(a, tk, q, &ga), rb = ask(b, tk, q, &gb);

			assert_int_equal(ra, rb);
			if (ra == 1)
				assert_memory_equal(&ga, &gb, sizeof(ga));
		}
}

static void test_a_rewrite_restores_the_same_answers(void **state)
{
	struct seqs *s = seqs_new(3), *t = seqs_new(3), *u = seqs_new(3);

	/* Without evictions, then with them. */
	applied(s, 1, 1, 1);
	applied(s, 2, 2, 5);
	seqs_each(s, copy_entry, t);
	same_answers(s, t, 6, SEQS_PER_TOKEN + 8);
	for (uint64_t q = 1; q <= SEQS_PER_TOKEN + 6; q++)
		applied(s, 3, q, q);
	applied(s, 4, 1, 1);
	applied(s, 5, 1, 1);
	seqs_each(s, copy_entry, u);
	assert_int_equal(seqs_tokens(u), seqs_tokens(s));
	assert_int_equal(seqs_results(u), seqs_results(s));
	same_answers(s, u, 6, SEQS_PER_TOKEN + 8);
	seqs_free(s);
	seqs_free(t);
	seqs_free(u);
}

static void test_replaying_the_steps_restores_the_same_answers(void **state)
{
	struct seqs *s = seqs_new(3), *t = seqs_new(3);

	/* What state_restore.c does with each step's ENTRY_SEQ, in order. */
	for (uint64_t tk = 1; tk <= 5; tk++)
		for (uint64_t q = 1; q <= tk * 5; q++) {
			const struct rec_seq *e;

			applied(s, tk, q * 2, q);
			e = seqs_take_step(s);
			assert_non_null(e);
			seqs_restore(t, e);
		}
	same_answers(s, t, 6, 60);
	seqs_free(s);
	seqs_free(t);
}

static void test_a_log_not_read_whole_knows_nothing(void **state)
{
	struct seqs *s = seqs_new(0);
	struct rec_seq got;

	applied(s, 7, 1, 1);
	seqs_forget_all(s);
	assert_int_equal(ask(s, 7, 1, &got), -ESTALE);
	assert_int_equal(ask(s, 8, 1, &got), -ESTALE);
	/* Entries of no known kind are not results. */
	seqs_restore(s, &(struct rec_seq){ .token = 9, .seq = 1, .kind = 77 });
	assert_int_equal(seqs_results(s), 0);
	seqs_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_result_is_found_and_others_are_not_applied),
		cmocka_unit_test(test_not_applied_only_when_no_connection_of_it_is_open),
		cmocka_unit_test(test_a_token_answers_its_own_uid_only),
		cmocka_unit_test(test_a_token_keeps_its_last_results_and_knows_what_it_forgot),
		cmocka_unit_test(test_the_least_recently_used_idle_token_goes_first),
		cmocka_unit_test(test_a_rewrite_restores_the_same_answers),
		cmocka_unit_test(test_replaying_the_steps_restores_the_same_answers),
		cmocka_unit_test(test_a_log_not_read_whole_knows_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
