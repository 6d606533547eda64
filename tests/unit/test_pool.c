/*
 * The host memory pool (daemon/memory/pool.c) on real memfds and its real worker
 * thread: size classes, refill of wanted classes within the budget, what a
 * taken memfd is (exact size, zeroed, allocated, sealable, never seen
 * before), trimming, closing discarded descriptors off the caller's thread,
 * and forgetting classes nobody wants any more.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/memory/pool.h"

#define MiB (1ull << 20)

static void test_class_sizes(void **state)
{
	assert_int_equal(pool_class_size(1), MiB);
	assert_int_equal(pool_class_size(MiB), MiB);
	/* Eight steps per power of two: at most 1/8 is trimmed off. */
	assert_int_equal(pool_class_size(MiB + 1), MiB + MiB / 8);
	assert_int_equal(pool_class_size(3 * MiB), 3 * MiB);
	assert_int_equal(pool_class_size(3 * MiB + 1), 3 * MiB + MiB / 4);
	assert_int_equal(pool_class_size(1ull << 30), 1ull << 30);
	assert_int_equal(pool_class_size((1ull << 30) + 4096), (1ull << 30) + (1ull << 27));
	for (uint64_t s = MiB; s < 64 * MiB; s = s * 9 / 7 + 4093) {
		uint64_t c = pool_class_size(s);

		assert_true(c >= s);
		assert_true(c - s <= c / 8);
	}
	assert_int_equal(pool_class_size(UINT64_MAX), 0);
}

/* The bracketed word of shmem_enabled picks how the worker allocates. */
static void test_pages_policy(void **state)
{
	assert_int_equal(pool_pages_parse("always within_size advise [never] deny force\n"),
			 POOL_PAGES_SMALL);
	assert_int_equal(pool_pages_parse("always within_size [advise] never deny force\n"),
			 POOL_PAGES_ADVISE);
	assert_int_equal(pool_pages_parse("[always] within_size advise never deny force"),
			 POOL_PAGES_HUGE);
	assert_int_equal(pool_pages_parse("always [within_size] advise never"), POOL_PAGES_HUGE);
	assert_int_equal(pool_pages_parse("always within_size advise never deny [force]"),
			 POOL_PAGES_HUGE);
	assert_int_equal(pool_pages_parse("always within_size advise never [deny] force"),
			 POOL_PAGES_SMALL);
	assert_int_equal(pool_pages_parse(""), POOL_PAGES_SMALL);
	assert_int_equal(pool_pages_parse("advise"), POOL_PAGES_SMALL); /* no choice marked */
	assert_string_equal(pool_pages_name(POOL_PAGES_ADVISE), "huge pages (madvise)");
}

static void check_fresh(int fd, uint64_t size)
{
	struct stat st;
	uint8_t buf[4096], zero[4096] = { 0 };

	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal((uint64_t)st.st_size, size);
	/* Allocated up front: the pages exist before anyone touches them. */
	assert_true((uint64_t)st.st_blocks * 512 >= size);
	for (uint64_t off = 0; off < size; off += size / 7 + 1) {
		assert_int_equal(pread(fd, buf, sizeof(buf), (off_t)off), (ssize_t)sizeof(buf));
		assert_memory_equal(buf, zero, sizeof(buf));
	}
	/* The caller seals it, as for any host tensor. */
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
}

static void test_take_refill_hit(void **state)
{
	struct pool *p;
	struct pool_stats st;
	uint64_t size = 5 * MiB + 123;
	int fd;

	assert_int_equal(pool_new(64 * MiB, *(enum pool_pages *)*state, &p), 0);
	/* Nothing is ready before a size was ever wanted. */
	assert_int_equal(pool_take(p, size), -ENOENT);
	assert_int_equal(pool_take(p, MiB - 1), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS);
	assert_int_equal(st.ready_bytes, POOL_READY_PER_CLASS * pool_class_size(size));

	fd = pool_take(p, size);
	assert_true(fd >= 0);
	check_fresh(fd, size);
	/* Writing it must not show in the next one: memfds are never recycled. */
	assert_int_equal(pwrite(fd, "dirty", 5, 0), 5);
	close(fd);
	fd = pool_take(p, size - 23); /* the same class */
	assert_true(fd >= 0);
	check_fresh(fd, size - 23);
	close(fd);
	pool_get_stats(p, &st);
	assert_int_equal(st.hits, 2);
	pool_free(p);
}

static void test_reserve_take_refills_at_once(void **state)
{
	struct pool *p;
	struct pool_stats st;
	int fd;

	(void)state;
	assert_int_equal(pool_new(64 * MiB, POOL_PAGES_SMALL, &p), 0);
	/* Wanted by a reserve's take as by any other. */
	assert_int_equal(pool_take_reserve(p, 4 * MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS);
	/* No copy follows a reserve's take, so no take was ever "recent": the
	 * class, one short, is refilled now, not POOL_QUIET_NS later. */
	fd = pool_take_reserve(p, 4 * MiB);
	assert_true(fd >= 0);
	check_fresh(fd, 4 * MiB);
	close(fd);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS);
	assert_int_equal(st.hits, 1);
	pool_free(p);
}

static void test_budget_bounds_refill(void **state)
{
	struct pool *p;
	struct pool_stats st;

	/* Room for one 4 MiB memfd, not two; none of 8 MiB. */
	assert_int_equal(pool_new(6 * MiB, POOL_PAGES_SMALL, &p), 0);
	assert_int_equal(pool_take(p, 4 * MiB), -ENOENT);
	assert_int_equal(pool_take(p, 8 * MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 1);
	assert_int_equal(st.ready_bytes, 4 * MiB);
	assert_true(st.ready_bytes <= st.budget);
	pool_free(p);

	/* A zero budget keeps nothing. */
	assert_int_equal(pool_new(0, POOL_PAGES_SMALL, &p), 0);
	assert_int_equal(pool_take(p, 2 * MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 0);
	pool_free(p);
}

static void test_trim_and_discard(void **state)
{
	struct pool *p;
	struct pool_stats st;
	int fd = memfd_create("t", MFD_CLOEXEC);

	assert_int_equal(pool_new(64 * MiB, POOL_PAGES_SMALL, &p), 0);
	assert_int_equal(pool_take(p, 2 * MiB), -ENOENT);
	pool_settle(p);
	assert_int_equal(pool_trim(p), POOL_READY_PER_CLASS * 2 * MiB);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 0);
	assert_int_equal(st.ready_bytes, 0);
	assert_int_equal(st.trims, POOL_READY_PER_CLASS);
	/* After a trim it waits for the next take before it refills. */
	assert_int_equal(pool_take(p, 2 * MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS);

	/* A discarded descriptor is closed by the worker. */
	assert_true(fd >= 0);
	pool_discard(p, fd, 0);
	pool_settle(p);
	assert_int_equal(fcntl(fd, F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	pool_free(p);
}

/*
 * Freed memory waiting for the worker is bounded: past max(budget,
 * POOL_CLOSING_MIN) bytes the discard closes on the caller (the worker at
 * nice 19 fell behind a churn of 256 MiB tensors on a busy host, and the
 * daemon held several times its capacity in freed memfds: issue 30).
 */
static void test_discard_backlog_is_bounded(void **state)
{
	const uint64_t big = 100 * MiB; /* declared: the bound counts what callers say */
	struct pool *p;
	struct pool_stats st;
	int fd[3];

	assert_int_equal(pool_new(64 * MiB, POOL_PAGES_SMALL, &p), 0);
	pool_hold(p, true);
	for (int i = 0; i < 3; i++) {
		fd[i] = memfd_create("t", MFD_CLOEXEC);
		assert_true(fd[i] >= 0);
		pool_discard(p, fd[i], big);
	}
	pool_get_stats(p, &st);
	/* Two fit under 256 MiB and wait; the third was closed at once. */
	assert_int_equal(st.closing_fds, 2);
	assert_int_equal(st.closing_bytes, 2 * big);
	assert_int_equal(st.inline_closes, 1);
	assert_int_equal(fcntl(fd[2], F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	assert_true(fcntl(fd[0], F_GETFD) >= 0);
	pool_hold(p, false);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.closing_fds, 0);
	assert_int_equal(st.closing_bytes, 0);
	assert_int_equal(fcntl(fd[0], F_GETFD), -1);
	pool_free(p);
}

static void test_forgets_unwanted_classes(void **state)
{
	struct pool *p;
	struct pool_stats st;

	assert_int_equal(pool_new(1ull << 30, POOL_PAGES_SMALL, &p), 0);
	assert_int_equal(pool_take(p, MiB), -ENOENT);
	pool_settle(p);
	/* POOL_CLASSES other sizes push the first out of the wanted list. */
	for (int i = 0; i < POOL_CLASSES; i++)
		pool_take(p, (uint64_t)(2 + i) * MiB);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, POOL_CLASSES * POOL_READY_PER_CLASS);
	assert_int_equal(pool_take(p, MiB), -ENOENT);
	pool_free(p);
}

/* A class a writer's ring serves now (pool_unwant()): its ready memfds go, and no refill. */
static void test_unwanted_class_is_given_back(void **state)
{
	struct pool *p;
	struct pool_stats st;

	assert_int_equal(pool_new(1ull << 30, POOL_PAGES_SMALL, &p), 0);
	assert_int_equal(pool_take(p, 4 * MiB), -ENOENT);
	assert_int_equal(pool_take(p, MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 2 * POOL_READY_PER_CLASS);
	pool_unwant(p, 4 * MiB);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS); /* the 1 MiB class's */
	assert_int_equal(st.ready_bytes, POOL_READY_PER_CLASS * MiB);
	/* A later take wants it again. */
	assert_int_equal(pool_take(p, 4 * MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 2 * POOL_READY_PER_CLASS);
	pool_free(p);
}

/* The pool's idle clock in this test: it moves only when advance() says. */
static _Atomic uint64_t fake_ns = 1000000000ull;

static uint64_t fake_clock(void)
{
	return fake_ns;
}

static void advance(struct pool *p, uint64_t ms)
{
	fake_ns += ms * 1000000ull;
	pool_set_clock(p, fake_clock);
}

/* Memory ready for a size nobody takes any more is given back after a while. */
static void test_idle_classes_are_forgotten(void **state)
{
	struct pool *p;
	struct pool_stats st;

	assert_int_equal(pool_new(64 * MiB, POOL_PAGES_SMALL, &p), 0);
	pool_set_clock(p, fake_clock);
	pool_set_idle(p, 300ull * 1000000); /* 0.3 s */
	assert_int_equal(pool_take(p, 2 * MiB), -ENOENT);
	assert_int_equal(pool_take(p, 3 * MiB), -ENOENT);
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 2 * POOL_READY_PER_CLASS);
	/* Keep taking 3 MiB every 50 ms for 1 s: that class stays, the 2 MiB one goes. */
	for (int i = 0; i < 20; i++) {
		int fd = pool_take(p, 3 * MiB);

		if (fd >= 0)
			close(fd);
		advance(p, 50);
		pool_settle(p);
		pool_get_stats(p, &st);
		/* Forgotten once 0.3 s passed, not before. */
		assert_int_equal(st.expired, (i + 1) * 50 >= 300 ? POOL_READY_PER_CLASS : 0);
	}
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.expired, POOL_READY_PER_CLASS);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS);
	assert_int_equal(st.ready_bytes, POOL_READY_PER_CLASS * 3 * MiB);
	/* Then nothing is taken at all: everything goes, without a take. */
	advance(p, 200); /* 0.25 s after the last take: kept */
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, POOL_READY_PER_CLASS);
	advance(p, 50); /* 0.3 s: given back */
	pool_settle(p);
	pool_get_stats(p, &st);
	assert_int_equal(st.ready_fds, 0);
	assert_int_equal(st.ready_bytes, 0);
	pool_free(p);
}

static enum pool_pages pages_small = POOL_PAGES_SMALL, pages_advise = POOL_PAGES_ADVISE,
		       pages_huge = POOL_PAGES_HUGE;

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_class_sizes),
		cmocka_unit_test(test_pages_policy),
		/* Each way of allocating gives the same memfds, whatever the kernel's policy. */
		cmocka_unit_test_prestate(test_take_refill_hit, &pages_small),
		cmocka_unit_test_prestate(test_take_refill_hit, &pages_advise),
		cmocka_unit_test_prestate(test_take_refill_hit, &pages_huge),
		cmocka_unit_test(test_reserve_take_refills_at_once),
		cmocka_unit_test(test_budget_bounds_refill),
		cmocka_unit_test(test_trim_and_discard),
		cmocka_unit_test(test_discard_backlog_is_bounded),
		cmocka_unit_test(test_forgets_unwanted_classes),
		cmocka_unit_test(test_unwanted_class_is_given_back),
		cmocka_unit_test(test_idle_classes_are_forgotten),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
