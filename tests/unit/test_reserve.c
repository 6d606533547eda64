/*
 * Reserves (docs/design.md, "The reserve"): ready pool memory a connection
 * keeps for its next create, over the real host backend and its pool. What
 * it is charged, what a create that names it makes of it, what it costs
 * when it goes, and the bounds.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/base/log.h"
#include "daemon/memory/pool.h"
#include "daemon/base/quota.h"
#include "daemon/registry/registry.h"
#include "registry_fixture.h"

const struct backend_ops *const backends[] = { &backend_host, NULL };

#define MiB (1ull << 20)

static int setup(void **state)
{
	reg_fixture_setup(state, 64 * MiB);
	return 0;
}

static struct reg_device *host(struct registry *reg)
{
	return registry_device(reg, (DLDevice){ kDLCPU, 0 });
}

/* A reserve of size for rc: the pool hands out ready memory only, so the
 * first ask of a class wants it and a second one, once the worker made
 * it, gets it. */
static int reserve(struct registry *reg, struct reg_client *rc, uint64_t size,
		   struct reg_reserve **ret)
{
	int r = registry_reserve(reg, rc, size, ret, why, sizeof(why));

	if (r != -EAGAIN)
		return r;
	pool_settle(backend_host_pool());
	return registry_reserve(reg, rc, size, ret, why, sizeof(why));
}

static int create(struct registry *reg, struct reg_client *rc, const char *name, int64_t n,
		  uint64_t reserve_id, struct tensor **t, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCPU, 0 });

	a.reserve = reserve_id;
	return registry_create(reg, rc, &a, t, lease, why, sizeof(why));
}

static ino_t inode(int fd)
{
	struct stat st;

	assert_int_equal(fstat(fd, &st), 0);
	return st.st_ino;
}

/*
 * A reserve is charged like memory of the uid's (bytes, a descriptor,
 * capacity), zeroed, writable but not growable; the create that names it
 * takes its memfd, trimmed to the tensor and sealed, with whatever its
 * client wrote there, and the charges move to the tensor.
 */
static void test_reserve_is_charged_and_becomes_the_tensor(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct quota_limits lim = { 0 };
	struct reg_reserve *rs;
	struct reg_client a;
	struct quota q;
	struct tensor *t;
	uint64_t id, l, n = 4 * MiB - 4096 + 10;
	uint8_t buf[4096], zero[4096] = { 0 };
	ino_t ino;

	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&a, 1, 1000, 1000, 1);
	assert_int_equal(reserve(reg, &a, n, &rs), 0);
	id = rs->id;
	assert_true(id != 0);
	assert_int_equal(rs->alloc.size, 4 * MiB); /* its size class */
	assert_ptr_equal(registry_reserve_find(&a, id), rs);
	assert_int_equal(dev->used, 4 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 1);
	assert_int_equal(reg->n_reserves, 1);
	assert_int_equal(reg->reserve_bytes, 4 * MiB);
	/* Zeroed, sealed against growing only, private to the daemon's uid. */
	assert_int_equal(pread(rs->alloc.fd, buf, sizeof(buf), 4 * MiB - 4096), sizeof(buf));
	assert_memory_equal(buf, zero, sizeof(buf));
	assert_int_equal(fcntl(rs->alloc.fd, F_GET_SEALS), F_SEAL_GROW);
	assert_int_equal(ftruncate(rs->alloc.fd, 8 * MiB), -1);
	/* What its client writes there is its own, and the tensor's. */
	assert_int_equal(pwrite(rs->alloc.fd, "ABC", 3, 0), 3);
	ino = inode(rs->alloc.fd);

	assert_int_equal(create(reg, &a, "r", (int64_t)n, id, &t, &l), 0);
	assert_true(t->from_reserve);
	assert_null(registry_reserve_find(&a, id));
	assert_int_equal(reg->n_reserves, 0);
	assert_int_equal(reg->reserve_bytes, 0);
	assert_int_equal(inode(t->alloc.fd), ino);
	assert_int_equal(lseek(t->alloc.fd, 0, SEEK_END), (off_t)n);
	assert_int_equal(fcntl(t->alloc.fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW);
	assert_int_equal(pread(t->alloc.fd, buf, 3, 0), 3);
	assert_memory_equal(buf, "ABC", 3);
	assert_int_equal(t->alloc.footprint, 4 * MiB);
	assert_int_equal(dev->used, 4 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 1);
	assert_int_equal(registry_publish(reg, &a, "r", 1, NULL, why, sizeof(why)), 0);
	assert_true(fcntl(t->alloc.fd, F_GET_SEALS) & F_SEAL_WRITE);

	/* Named twice: the second create finds nothing and is a plain one. */
	assert_int_equal(create(reg, &a, "s", 2 * MiB, id, &t, &l), 0);
	assert_false(t->from_reserve);
	assert_int_equal(dev->used, 6 * MiB);

	/* "r" is published, so it outlives its creator's connection. */
	assert_int_equal(registry_unlink(reg, &a, "r", 1, why, sizeof(why)), 0);
	registry_client_gone(reg, &a);
	assert_int_equal(dev->used, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 0);
	reg->quota = NULL;
	quota_fini(&q);
}

/* A create that does not fit its reserve is a plain create, and the reserve goes. */
static void test_reserve_that_does_not_fit_is_freed(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct reg_reserve *rs;
	struct reg_client a;
	struct tensor *t;
	uint64_t l;

	registry_client_init(&a, 1, 1000, 1000, 1);
	/* Too large for it. */
	assert_int_equal(reserve(reg, &a, 2 * MiB, &rs), 0);
	assert_int_equal(create(reg, &a, "big", 3 * MiB, rs->id, &t, &l), 0);
	assert_false(t->from_reserve);
	assert_int_equal(reg->n_reserves, 0);
	assert_int_equal(dev->used, 3 * MiB);
	/* So small that more than an eighth of it would be trimmed off. */
	assert_int_equal(reserve(reg, &a, 8 * MiB, &rs), 0);
	assert_int_equal(create(reg, &a, "small", 1 * MiB, rs->id, &t, &l), 0);
	assert_false(t->from_reserve);
	assert_int_equal(reg->n_reserves, 0);
	assert_int_equal(dev->used, 4 * MiB);
	/* Small enough for a slab (an immutable put): a slot, the reserve freed. */
	assert_int_equal(reserve(reg, &a, 1 * MiB, &rs), 0);
	{
		int64_t n = 100;
		struct create_args p = { .name = "tiny",
					 .name_len = 4,
					 .dtype = { kDLUInt, 8, 1 },
					 .ndim = 1,
					 .shape = &n,
					 .device = { kDLCPU, 0 },
					 .shared = true,
					 .reserve = rs->id };

		assert_int_equal(registry_create(reg, &a, &p, &t, &l, why, sizeof(why)), 0);
		assert_false(t->from_reserve);
		assert_int_equal(reg->n_reserves, 0);
	}
	registry_client_gone(reg, &a);
	assert_int_equal(dev->used, 0);
}

/* Bounds: sizes, reserves per connection, capacity, the uid's shares. */
static void test_reserve_bounds(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct quota_limits lim = { 0 };
	struct reg_reserve *rs;
	struct reg_client a, b;
	struct quota q;
	uint64_t ids[REGISTRY_RESERVES_MAX];

	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1001, 1001, 2);
	assert_int_equal(registry_reserve(reg, &a, MiB - 1, &rs, why, sizeof(why)), -EINVAL);
	assert_int_equal(
		registry_reserve(reg, &a, REGISTRY_RESERVE_BYTES_MAX + 1, &rs, why, sizeof(why)),
		-EINVAL);
	for (int i = 0; i < REGISTRY_RESERVES_MAX; i++) {
		assert_int_equal(reserve(reg, &a, MiB, &rs), 0);
		ids[i] = rs->id;
	}
	assert_int_equal(reserve(reg, &a, MiB, &rs), -EAGAIN);
	assert_non_null(strstr(why, "reserves"));
	assert_int_equal(registry_unreserve(reg, &a, ids[0]), 0);
	assert_int_equal(registry_unreserve(reg, &a, ids[0]), -ESRCH);
	assert_int_equal(registry_unreserve(reg, &b, ids[1]), -ESRCH); /* not b's */
	assert_int_equal(reg->n_reserves, REGISTRY_RESERVES_MAX - 1);
	assert_int_equal(dev->used, (REGISTRY_RESERVES_MAX - 1) * MiB);
	/* The host's capacity counts reserves. */
	dev->capacity = dev->used + MiB / 2;
	assert_int_equal(reserve(reg, &b, MiB, &rs), -ENOSPC);
	dev->capacity = 64 * MiB;
	/* So does the uid's byte share. */
	lim.per_uid[QUOTA_BYTES] = 3 * MiB;
	quota_init(&q, &lim);
	reg->quota = &q;
	assert_int_equal(reserve(reg, &b, 2 * MiB, &rs), 0);
	assert_int_equal(reserve(reg, &b, 2 * MiB, &rs), -EDQUOT);
	assert_non_null(strstr(why, "--max-bytes-per-uid"));
	registry_client_gone(reg, &b);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_FDS], 0);
	reg->quota = NULL;
	quota_fini(&q);
	/* A connection's close frees every reserve it held. */
	registry_client_gone(reg, &a);
	assert_int_equal(reg->n_reserves, 0);
	assert_int_equal(reg->reserve_bytes, 0);
	assert_int_equal(dev->used, 0);
}

/*
 * A create refused for lack of room (capacity or the uid's share) while
 * its connection holds reserves drops them and tries once more: a reserve
 * never costs its own client a create.
 */
static void test_refused_create_drops_own_reserves(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct quota_limits lim = { 0 };
	struct reg_reserve *rs;
	struct reg_client a;
	struct quota q;
	struct tensor *t;
	uint64_t l;

	registry_client_init(&a, 1, 1000, 1000, 1);
	dev->capacity = 8 * MiB;
	assert_int_equal(reserve(reg, &a, 4 * MiB, &rs), 0);
	assert_int_equal(create(reg, &a, "c", 6 * MiB, 0, &t, &l), 0);
	assert_int_equal(reg->n_reserves, 0);
	assert_int_equal(dev->used, 6 * MiB);
	registry_client_gone(reg, &a);
	dev->capacity = 64 * MiB;

	lim.per_uid[QUOTA_BYTES] = 8 * MiB;
	quota_init(&q, &lim);
	reg->quota = &q;
	assert_int_equal(reserve(reg, &a, 4 * MiB, &rs), 0);
	assert_int_equal(create(reg, &a, "d", 6 * MiB, 0, &t, &l), 0);
	assert_int_equal(reg->n_reserves, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 6 * MiB);
	/* Still refused when it does not fit even then. */
	assert_int_equal(create(reg, &a, "e", 4 * MiB, 0, &t, &l), -EDQUOT);
	registry_client_gone(reg, &a);
	reg->quota = NULL;
	quota_fini(&q);
}

int main(void)
{
	log_level = TD_LOG_ERROR;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_reserve_is_charged_and_becomes_the_tensor,
						setup, reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_reserve_that_does_not_fit_is_freed, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_reserve_bounds, setup, reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_refused_create_drops_own_reserves, setup,
						reg_fixture_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
