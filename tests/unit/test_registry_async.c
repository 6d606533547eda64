/*
 * The registry's asynchronous create (registry.h, struct reg_alloc_job):
 * everything but the memory at once, the lease when the allocation
 * completes, and what happens when the creator goes, unlinks, replaces or
 * the allocation fails meanwhile. Over a fake device whose alloc() blocks,
 * as the GPU backends' does, next to the real host backend.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/base/log.h"
#include "daemon/base/quota.h"
#include "daemon/registry/registry.h"
#include "registry_fixture.h"

/*
 * A device whose alloc() blocks, as the GPU backends' does (alloc_blocks):
 * "cuda:0" with 2 MiB granularity and 7 MiB of capacity, no driver. It
 * counts live allocations, so a test sees every one released.
 */
#define SLOW_GRAN (2u << 20)
static int slow_live;     /* allocations not yet released */
static int slow_fail;     /* what the next alloc() answers, then 0 */
static int slow_released; /* release() calls that freed something */

static int slow_init(char *err, size_t err_len)
{
	return 0;
}
static int slow_count(void)
{
	return 1;
}
static int slow_uuid(int dev, uint8_t uuid[16])
{
	memset(uuid, 0x11, 16);
	return 0;
}
static uint64_t slow_capacity(int dev)
{
	return 7u << 20;
}
static const char *slow_path(int dev)
{
	return "slow";
}
static int slow_alloc(struct backend_alloc *a, uint64_t size, int dev, const char *name)
{
	int r = slow_fail;

	slow_fail = 0;
	a->device_id = dev;
	if (r < 0)
		return r;
	a->size = (size + SLOW_GRAN - 1) / SLOW_GRAN * SLOW_GRAN;
	a->footprint = a->size;
	a->priv = malloc(1); /* ASan reports a lost one */
	slow_live++;
	return 0;
}
static int slow_export(struct backend_alloc *a, bool writable, int *fd)
{
	*fd = -1;
	return 0;
}
static int slow_freeze(struct backend_alloc *a)
{
	return 0;
}
static void slow_release(struct backend_alloc *a)
{
	if (!a->priv)
		return;
	free(a->priv);
	a->priv = NULL;
	slow_live--;
	slow_released++;
}
static const struct backend_ops backend_slow = {
	.name = "slow",
	.device_type = kDLCUDA,
	.init = slow_init,
	.device_count = slow_count,
	.device_uuid = slow_uuid,
	.default_capacity = slow_capacity,
	.path = slow_path,
	.alloc = slow_alloc,
	.alloc_blocks = true,
	.export_fd = slow_export,
	.freeze = slow_freeze,
	.release = slow_release,
};

/* The backends this test links: the host backend and the slow one above. */
const struct backend_ops *const backends[] = { &backend_host, &backend_slow, NULL };

static int published;

static void on_pub(void *ctx, const struct reg_change *v, size_t n, bool lost)
{
	for (size_t i = 0; i < n; i++)
		published += v[i].kind == REG_PUBLISHED;
}

static int setup(void **state)
{
	reg_fixture_setup(state, 1 << 20)->on_commit = on_pub;
	published = 0;
	return 0;
}

static struct reg_device *slow_dev(struct registry *reg)
{
	return registry_device(reg, (DLDevice){ kDLCUDA, 0 });
}

static int create_slow(struct registry *reg, struct reg_client *rc, const char *name, int64_t n,
		       bool replace, struct tensor **t)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCUDA, 0 });
	uint64_t lease = 0;
	int r;

	a.replace = replace;
	r = registry_create(reg, rc, &a, t, &lease, why, sizeof(why));

	/* In progress: no lease yet. */
	if (r == -EINPROGRESS)
		assert_int_equal(lease, 0);
	return r;
}

/* The worker's half, then the loop's; the finish's result. */
static int finish_slow(struct registry *reg, struct tensor *t, uint64_t *lease)
{
	struct reg_alloc_job j = { .t = t };

	registry_alloc_run(&j);
	return registry_create_finish(reg, &j, lease, why, sizeof(why));
}

/* A create on a device whose alloc() blocks: everything but the memory at
 * once, the lease when the allocation completes. */
static void test_async_create(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct reg_client a, b;
	struct tensor *t, *t2;
	uint64_t l, lb;
	bool w;

	slow_live = slow_released = 0;
	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1000, 1000, 2);
	assert_int_equal(create_slow(reg, &a, "g", 3 << 20, false, &t), -EINPROGRESS);
	/* Nothing allocated yet, but charged, named and pinned. */
	assert_int_equal(slow_live, 0);
	assert_true(t->allocating);
	assert_int_equal(t->refcount, 1);
	assert_int_equal(dev->used, 3 << 20);
	assert_int_equal(dev->tensors, 1);
	assert_ptr_equal(registry_lookup(reg, &a, "g", 1), t);
	assert_int_equal(create_slow(reg, &b, "g", 16, false, &t2), -EEXIST);
	assert_int_equal(registry_publish(reg, &a, "g", 1, NULL, why, sizeof(why)), -EBUSY);
	assert_non_null(strstr(why, "still being allocated"));
	assert_int_equal(registry_attach(reg, &b, "g", 1, &t2, &lb, &w, why, sizeof(why)), -ENOENT);
	/* Done: the lease, and the rounded size charged instead of the asked. */
	assert_int_equal(finish_slow(reg, t, &l), 0);
	assert_false(t->allocating);
	assert_int_equal(slow_live, 1);
	assert_int_equal(t->refcount, 1);
	assert_ptr_equal(registry_lease_tensor(&a, l), t);
	assert_int_equal(t->alloc.size, 4 << 20);
	assert_int_equal(dev->used, 4 << 20);
	assert_ptr_equal(t->alloc.ops, &backend_slow);
	assert_int_equal(registry_publish(reg, &a, "g", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_attach(reg, &b, "g", 1, &t2, &lb, &w, why, sizeof(why)), 0);
	assert_int_equal(registry_unlink(reg, &a, "g", 1, why, sizeof(why)), 0);
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 1); /* b's lease */
	registry_client_gone(reg, &b);
	assert_int_equal(slow_live, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(dev->tensors, 0);
	assert_int_equal(reg->n_tensors, 0);
}

/* The creator goes, or unlinks the name, while the memory is allocated:
 * the completion frees it all and gives back every share. */
static void test_async_create_abandoned(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct quota_limits lim = { 0 };
	struct quota q;
	struct reg_client a, b;
	struct tensor *t, *t2;
	uint64_t l;

	slow_live = slow_released = 0;
	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1001, 1001, 2);
	assert_int_equal(create_slow(reg, &a, "gone", 1 << 20, false, &t), -EINPROGRESS);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 1 << 20);
	registry_client_gone(reg, &a);
	/* The name is free at once; the tensor waits for its allocation. */
	assert_null(registry_lookup(reg, &b, "gone", 4));
	assert_int_equal(reg->n_tensors, 1);
	assert_int_equal(finish_slow(reg, t, &l), -ECANCELED);
	assert_non_null(strstr(why, "'gone'"));
	assert_non_null(strstr(why, "creator went away"));
	assert_int_equal(slow_live, 0);
	assert_int_equal(slow_released, 1);
	assert_int_equal(reg->n_tensors, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_TENSORS], 0);

	/* Unlinked by its creator meanwhile: the same, and no lease. */
	registry_client_init(&a, 3, 1000, 1000, 3);
	assert_int_equal(create_slow(reg, &a, "gone", 1 << 20, false, &t), -EINPROGRESS);
	assert_int_equal(registry_unlink(reg, &a, "gone", 4, why, sizeof(why)), 0);
	assert_int_equal(create_slow(reg, &b, "gone", 1 << 20, false, &t2), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, t, &l), -ECANCELED);
	assert_non_null(strstr(why, "unlinked"));
	assert_int_equal(a.n_leases, 0);
	/* b's create of the freed name goes on. */
	assert_int_equal(finish_slow(reg, t2, &l), 0);
	assert_int_equal(slow_live, 1);
	registry_client_gone(reg, &a);
	registry_client_gone(reg, &b);
	assert_int_equal(slow_live, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_TENSORS], 0);
	reg->quota = NULL;
	quota_fini(&q);
}

/* A failed allocation, or one that rounds past capacity, is the create's error. */
static void test_async_create_fails(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct reg_client a;
	struct tensor *t;
	uint64_t l;

	slow_live = 0;
	registry_client_init(&a, 1, 1000, 1000, 1);
	assert_int_equal(create_slow(reg, &a, "nospace", 4096, false, &t), -EINPROGRESS);
	slow_fail = -ENOSPC;
	assert_int_equal(finish_slow(reg, t, &l), -ENOSPC);
	assert_non_null(strstr(why, "'nospace'"));
	assert_null(registry_lookup(reg, &a, "nospace", 7));
	/* 5 MiB fits the 5 MiB left as asked, not once rounded up to 6. */
	assert_int_equal(create_slow(reg, &a, "small", 1, false, &t), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, t, &l), 0);
	assert_int_equal(create_slow(reg, &a, "big", 5 << 20, false, &t), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, t, &l), -ENOSPC);
	assert_non_null(strstr(why, "after rounding"));
	assert_int_equal(slow_live, 1);
	assert_int_equal(dev->used, 2 << 20);
	assert_int_equal(reg->n_named, 1);
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 0);
	assert_int_equal(dev->used, 0);
}

/* Replace: the old tensor keeps its name and serves until the new one is
 * published, as with a create that allocates at once. */
static void test_async_replace(void **state)
{
	struct registry *reg = *state;
	struct reg_client a, b;
	struct tensor *old, *t, *seen;
	uint64_t l, lb;
	bool w;

	slow_live = 0;
	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1000, 1000, 2);
	assert_int_equal(create_slow(reg, &a, "w", 16, false, &old), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, old, &l), 0);
	assert_int_equal(registry_publish(reg, &a, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(create_slow(reg, &a, "w", 32, true, &t), -EINPROGRESS);
	assert_int_equal(registry_attach(reg, &b, "w", 1, &seen, &lb, &w, why, sizeof(why)), 0);
	assert_ptr_equal(seen, old);
	assert_int_equal(reg->n_named, 1);
	/* A failed replacement leaves the old one named. */
	slow_fail = -ENOMEM;
	assert_int_equal(finish_slow(reg, t, &l), -ENOMEM);
	assert_ptr_equal(registry_lookup(reg, &b, "w", 1), old);
	assert_int_equal(old->state, TENSORD_STATE_PUBLISHED);
	assert_null(old->draft);
	/* A finished one is still a draft: the old one serves until the publish. */
	assert_int_equal(create_slow(reg, &a, "w", 32, true, &t), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, t, &l), 0);
	assert_ptr_equal(registry_lookup(reg, &b, "w", 1), old);
	assert_ptr_equal(old->draft, t);
	assert_int_equal(registry_publish(reg, &a, "w", 1, NULL, why, sizeof(why)), 0);
	assert_ptr_equal(registry_lookup(reg, &b, "w", 1), t);
	assert_int_equal(old->state, TENSORD_STATE_UNLINKED);
	assert_int_equal(reg->n_named, 1);
	assert_int_equal(registry_unlink(reg, &a, "w", 1, why, sizeof(why)), 0);
	registry_client_gone(reg, &a);
	registry_client_gone(reg, &b);
	assert_int_equal(slow_live, 0);
	assert_int_equal(reg->n_tensors, 0);
}

int main(void)
{
	log_level = TD_LOG_ERROR;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_async_create, setup, reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_async_create_abandoned, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_async_create_fails, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_async_replace, setup, reg_fixture_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
