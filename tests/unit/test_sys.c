/*
 * Polling before sleeping (common/sys.c): the budget a waiter gets from its
 * CPUs, its outcomes and $TENSORD_SPIN_US. The clock is the test's (the
 * functions take it as an argument) and so is the CPU count (a stand-in
 * in count_cpus), so nothing here depends on the machine's timing; one
 * test confines this thread for real and checks td_usable_cpus(). And
 * td_span_readable() on mappings this test makes.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sys.h"

#define MS (1000 * 1000ull)
#define T0 (1000 * 1000 * MS) /* a monotonic clock well past 0 */

static unsigned fake_cpus = 2, fake_calls;

static unsigned count_fake(void)
{
	fake_calls++;
	return fake_cpus;
}

/* A fresh adaptive waiter over the fake CPU count. */
static void init(struct td_spin *s, unsigned cpus)
{
	unsetenv("TENSORD_SPIN_US");
	td_spin_init(s);
	s->count_cpus = count_fake;
	fake_cpus = cpus;
	fake_calls = 0;
}

static void test_default_budget(void **state)
{
	struct td_spin s;

	init(&s, 4);
	assert_int_equal(td_spin_budget_us(&s, T0), TD_SPIN_US_DEFAULT);
	assert_int_equal(td_spin_current_us(&s, T0), TD_SPIN_US_DEFAULT);
	/* Hits keep it. */
	for (int i = 0; i < 1000; i++) {
		td_spin_record(&s, TD_SPIN_HIT, T0 + (uint64_t)i * 1000);
		assert_int_equal(td_spin_budget_us(&s, T0 + (uint64_t)i * 1000),
				 TD_SPIN_US_DEFAULT);
	}
	assert_int_equal(s.hits, 1000);
	assert_int_equal(s.backoffs, 0);
}

/* One CPU: never poll. The count is looked at again, but not at every wait. */
static void test_one_cpu_gives_zero(void **state)
{
	struct td_spin s;
	uint64_t t = T0;

	init(&s, 1);
	assert_int_equal(td_spin_budget_us(&s, t), 0);
	assert_int_equal(td_spin_current_us(&s, t), 0);
	assert_int_equal(fake_calls, 1);

	/* Confined after start-up: 0 from the next look on, within TD_SPIN_RECHECK_NS. */
	init(&s, 2);
	assert_int_equal(td_spin_budget_us(&s, t), TD_SPIN_US_DEFAULT);
	fake_cpus = 1;
	for (int i = 0; i < 100; i++)
		td_spin_budget_us(&s, t + (uint64_t)i * 1000);
	assert_int_equal(fake_calls, 1); /* 100 waits within the interval: one look */
	assert_int_equal(td_spin_budget_us(&s, t + TD_SPIN_RECHECK_NS), 0);
	assert_int_equal(fake_calls, 2);
	/* Released again: polling comes back at the next look. */
	fake_cpus = 8;
	assert_int_equal(td_spin_budget_us(&s, t + TD_SPIN_RECHECK_NS + 1), 0);
	assert_int_equal(td_spin_budget_us(&s, t + 2 * TD_SPIN_RECHECK_NS), TD_SPIN_US_DEFAULT);
	assert_int_equal(s.backoffs, 0);
}

/* Polls until one is refused; returns the number of misses that took. */
static int misses_until_off(struct td_spin *s, uint64_t *t)
{
	int n = 0;

	while (td_spin_budget_us(s, *t)) {
		td_spin_record(s, TD_SPIN_MISS, *t);
		*t += 60 * 1000;
		n++;
		assert_true(n < 100);
	}
	return n;
}

/* A run of misses backs off to 0; later a probe polls again, and hits keep it. */
static void test_misses_back_off_then_probe(void **state)
{
	struct td_spin s;
	uint64_t t = T0, quiet;
	int n;

	init(&s, 2);
	n = misses_until_off(&s, &t);
	assert_true(n >= 3 && n <= 8); /* "most recent polls missed", not one */
	assert_int_equal(s.backoffs, 1);
	quiet = s.quiet_until_ns;
	assert_true(quiet > t);
	assert_int_equal(td_spin_budget_us(&s, quiet - 1), 0);
	assert_int_equal(td_spin_current_us(&s, quiet - 1), 0);
	/* The probe: polling again once the pause is over... */
	assert_int_equal(td_spin_budget_us(&s, quiet), TD_SPIN_US_DEFAULT);
	/* ...kept while it hits. */
	for (int i = 0; i < 50; i++)
		td_spin_record(&s, TD_SPIN_HIT, quiet + (uint64_t)i * 1000);
	assert_int_equal(td_spin_budget_us(&s, quiet + 50 * 1000), TD_SPIN_US_DEFAULT);
	assert_int_equal(s.backoffs, 1);
	/* A single miss among hits does not stop it. */
	td_spin_record(&s, TD_SPIN_MISS, quiet + 60 * 1000);
	assert_int_equal(td_spin_budget_us(&s, quiet + 61 * 1000), TD_SPIN_US_DEFAULT);
}

/* A probe that misses at once backs off again, for twice as long, up to a cap. */
static void test_failed_probes_double_the_pause(void **state)
{
	struct td_spin s;
	uint64_t t = T0, last = 0;

	init(&s, 2);
	misses_until_off(&s, &t);
	for (int i = 0; i < 40; i++) {
		uint64_t pause = s.backoff_ns;

		assert_true(pause >= last);
		assert_true(pause <= 1000 * MS);
		last = pause;
		t = s.quiet_until_ns; /* the probe */
		assert_int_equal(td_spin_budget_us(&s, t), TD_SPIN_US_DEFAULT);
		td_spin_record(&s, TD_SPIN_MISS, t + 50 * 1000); /* one miss ends it */
		assert_int_equal(td_spin_budget_us(&s, t + 50 * 1000 + 1), 0);
		if (pause < 1000 * MS)
			assert_true(s.backoff_ns == 2 * pause || s.backoff_ns == 1000 * MS);
	}
	assert_int_equal(s.backoff_ns, 1000 * MS);
	/* A second of polling without a back-off starts the pauses afresh. */
	t = s.quiet_until_ns;
	for (uint64_t k = 0; k < 1000; k++)
		td_spin_record(&s, TD_SPIN_HIT, t + k * MS);
	for (int i = 0; td_spin_budget_us(&s, t + 1000 * MS + (uint64_t)i); i++)
		td_spin_record(&s, TD_SPIN_MISS, t + 1000 * MS + (uint64_t)i);
	assert_int_equal(s.backoff_ns, 1 * MS);
}

/* Losing the CPU while polling backs off at once, hits or not before. */
static void test_lost_cpu_backs_off_at_once(void **state)
{
	struct td_spin s;

	init(&s, 2);
	for (int i = 0; i < 100; i++)
		td_spin_record(&s, TD_SPIN_HIT, T0);
	td_spin_record(&s, TD_SPIN_LOST, T0 + MS);
	assert_int_equal(s.lost, 1);
	assert_int_equal(s.backoffs, 1);
	assert_int_equal(td_spin_budget_us(&s, T0 + MS + 1), 0);
	assert_int_equal(td_spin_budget_us(&s, s.quiet_until_ns), TD_SPIN_US_DEFAULT);
}

/* $TENSORD_SPIN_US fixes the budget: 0 never polls; N polls N, whatever happens. */
static void test_env_overrides(void **state)
{
	struct td_spin s;

	setenv("TENSORD_SPIN_US", "0", 1);
	td_spin_init(&s);
	s.count_cpus = count_fake;
	fake_cpus = 64;
	assert_int_equal(td_spin_budget_us(&s, T0), 0);
	assert_int_equal(td_spin_current_us(&s, T0), 0);

	setenv("TENSORD_SPIN_US", "-5", 1);
	td_spin_init(&s);
	assert_int_equal(td_spin_budget_us(&s, T0), 0);

	setenv("TENSORD_SPIN_US", "200", 1);
	td_spin_init(&s);
	s.count_cpus = count_fake;
	fake_cpus = 1;
	fake_calls = 0;
	assert_int_equal(td_spin_budget_us(&s, T0), 200); /* one CPU: still 200 */
	for (int i = 0; i < 100; i++)
		td_spin_record(&s, i % 2 ? TD_SPIN_LOST : TD_SPIN_MISS, T0 + (uint64_t)i);
	assert_int_equal(td_spin_budget_us(&s, T0 + 100), 200); /* misses: still 200 */
	assert_int_equal(s.misses, 50);
	assert_int_equal(s.lost, 50);
	assert_int_equal(s.backoffs, 0);
	assert_int_equal(fake_calls, 1); /* looked at, for figures, and ignored */
	assert_int_equal(s.cpus, 1);

	/* Empty is unset. */
	setenv("TENSORD_SPIN_US", "", 1);
	td_spin_init(&s);
	s.count_cpus = count_fake;
	fake_cpus = 2;
	assert_int_equal(td_spin_budget_us(&s, T0), TD_SPIN_US_DEFAULT);
	unsetenv("TENSORD_SPIN_US");
}

/* Figures read the state without looking at the CPUs (and a zeroed struct reads 0). */
static void test_current_looks_at_nothing(void **state)
{
	struct td_spin s = { 0 };

	assert_int_equal(td_spin_current_us(&s, T0), 0);
	init(&s, 1);
	assert_int_equal(td_spin_current_us(&s, T0), TD_SPIN_US_DEFAULT); /* not looked yet */
	assert_int_equal(fake_calls, 0);
}

/* The real count follows this thread's affinity, set after start-up. */
static void test_usable_cpus_follows_affinity(void **state)
{
	cpu_set_t old, one;
	struct td_spin s;
	int cpu = -1;

	assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
	if (CPU_COUNT(&old) < 2)
		skip(); /* one CPU already: nothing to narrow */
	for (int i = 0; i < CPU_SETSIZE && cpu < 0; i++)
		if (CPU_ISSET(i, &old))
			cpu = i;
	unsetenv("TENSORD_SPIN_US");
	td_spin_init(&s);
	assert_true(td_usable_cpus() >= 2);
	assert_int_equal(td_spin_budget_us(&s, T0), TD_SPIN_US_DEFAULT);
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	assert_int_equal(td_usable_cpus(), 1);
	assert_int_equal(td_spin_budget_us(&s, T0 + TD_SPIN_RECHECK_NS), 0);
	assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
	assert_int_equal(td_spin_budget_us(&s, T0 + 2 * TD_SPIN_RECHECK_NS), TD_SPIN_US_DEFAULT);
}

/* Readable memory: a mapping, its PROT_NONE neighbour, and a hole after it. */
static void test_span_readable(void **state)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *m =
		mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	static const char text[] = "readable";

	(void)state;
	assert_true(m != MAP_FAILED);
	assert_int_equal(td_span_readable(text, sizeof(text)), 1);
	assert_int_equal(td_span_readable(m, 2 * page), 1);
	assert_int_equal(mprotect(m + page, page, PROT_NONE), 0);
	assert_int_equal(td_span_readable(m, page), 1);
	assert_int_equal(td_span_readable(m, page + 1), 0);
	assert_int_equal(td_span_readable(m + page, 1), 0);
	assert_int_equal(munmap(m + 2 * page, page), 0);
	assert_int_equal(td_span_readable(m + 2 * page - 1, 2), 0);
	assert_int_equal(munmap(m, 2 * page), 0);
	assert_int_equal(td_span_readable(m, 1), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_default_budget),
		cmocka_unit_test(test_one_cpu_gives_zero),
		cmocka_unit_test(test_misses_back_off_then_probe),
		cmocka_unit_test(test_failed_probes_double_the_pause),
		cmocka_unit_test(test_lost_cpu_backs_off_at_once),
		cmocka_unit_test(test_env_overrides),
		cmocka_unit_test(test_current_looks_at_nothing),
		cmocka_unit_test(test_usable_cpus_follows_affinity),
		cmocka_unit_test(test_span_readable),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
