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
static int slow_allocs;   /* alloc() calls that allocated */
static bool slow_vmm;     /* its memory says HANDLE_CUDA_VMM_FD (GPU rings keep only that) */
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
	if (slow_vmm)
		a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD;
	slow_live++;
	slow_allocs++;
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
	.arenas = true, /* a set in one allocation (registry_arena.c) */
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

/* A GPU create of n bytes asking to recycle, of mode (0: the default). */
static int create_ring(struct registry *reg, struct reg_client *rc, const char *name, int64_t *n,
		       uint32_t mode, struct tensor **t, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, n, (DLDevice){ kDLCUDA, 0 });

	a.replace = true;
	a.recycle = true;
	a.mode = mode;
	*lease = 0;
	return registry_create(reg, rc, &a, t, lease, why, sizeof(why));
}

/*
 * GPU rings (docs/recycle.md, section 4): a GPU version that asks to
 * recycle and finds no free buffer is made on the worker and joins its
 * writer's ring; freed with its last lease it becomes a free buffer,
 * charged like a reserve, which the writer's next create of the same
 * bytes, group and mode takes at once (no allocation); one of another mode
 * does not; the writer's end frees the free ones and leaves its published
 * version a plain tensor.
 */
static void test_async_gpu_ring(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct quota_limits lim = { 0 };
	struct quota q;
	struct reg_client a, b;
	struct tensor *v1, *v2, *v3, *v4, *seen;
	uint64_t l1, l2, l3, l4, lb, share;
	int64_t n = 1 << 20;
	bool w;

	slow_live = slow_released = slow_allocs = 0;
	slow_vmm = true;
	reg->recycle = true;
	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1000, 1000, 2); /* a reader of a's uid */

	/* Version 1: new memory, made on the worker, in a's ring. */
	assert_int_equal(create_ring(reg, &a, "w", &n, 0, &v1, &l1), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, v1, &l1), 0);
	assert_ptr_equal(v1->ring_rc, &a);
	share = v1->alloc.share_id;
	assert_true(share & REG_RING_SHARE);
	assert_true(share & REG_GPU_RING_SHARE);
	assert_int_equal(registry_publish(reg, &a, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &a, l1), 0);
	assert_int_equal(registry_attach(reg, &b, "w", 1, &seen, &lb, &w, why, sizeof(why)), 0);

	/* Version 2: version 1 is published, then leased by b: new memory. */
	assert_int_equal(create_ring(reg, &a, "w", &n, 0, &v2, &l2), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, v2, &l2), 0);
	assert_int_equal(registry_publish(reg, &a, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &a, l2), 0);
	assert_int_equal(reg->n_gpu_ring_free, 0); /* b holds version 1 */
	assert_int_equal(registry_release(reg, &b, lb), 0);
	assert_int_equal(reg->n_gpu_ring_free, 1);
	assert_int_equal(reg->gpu_ring_free_bytes, 2 << 20);
	assert_int_equal(slow_live, 2);
	/* The free buffer is charged as a reserve: to a's uid and the device. */
	assert_int_equal(dev->used, 4 << 20);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 << 20);

	/* Version 3 takes it at once: a lease now, no allocation. */
	assert_int_equal(create_ring(reg, &a, "w", &n, 0, &v3, &l3), 0);
	assert_int_not_equal(l3, 0);
	assert_int_equal(slow_allocs, 2);
	assert_int_equal(v3->alloc.share_id, share);
	assert_ptr_equal(v3->ring_rc, &a);
	assert_int_equal(reg->gpu_ring_hits, 1);
	assert_int_equal(reg->n_gpu_ring_free, 0);
	assert_int_equal(reg->gpu_ring_free_bytes, 0);
	assert_int_equal(dev->used, 4 << 20);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 << 20);
	assert_int_equal(registry_publish(reg, &a, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &a, l3), 0);
	assert_int_equal(reg->n_gpu_ring_free, 1); /* version 2's now */

	/* Another mode never takes it. */
	assert_int_equal(create_ring(reg, &a, "w", &n, 0644, &v4, &l4), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, v4, &l4), 0);
	assert_int_equal(slow_allocs, 3);
	assert_int_equal(reg->gpu_ring_hits, 1);
	assert_int_equal(registry_publish(reg, &a, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &a, l4), 0);
	assert_int_equal(reg->n_gpu_ring_free, 2); /* versions 2's and 3's */

	/* The writer goes: its free buffers are freed, its version stays. */
	registry_client_gone(reg, &a);
	assert_int_equal(reg->n_gpu_ring_free, 0);
	assert_int_equal(reg->gpu_ring_free_bytes, 0);
	assert_int_equal(slow_live, 1);
	assert_ptr_equal(registry_lookup(reg, &b, "w", 1), v4);
	assert_null(v4->ring_rc); /* freed with its last lease, never recycled */
	registry_client_gone(reg, &b);
	registry_client_init(&a, 3, 1000, 1000, 3);
	assert_int_equal(registry_unlink(reg, &a, "w", 1, why, sizeof(why)), 0);
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 0);
	reg->quota = NULL;
	quota_fini(&q);
	slow_vmm = false;
}

/* A member of a's transaction 7 of n bytes: opening its set's allocation of
 * arena bytes, or (arena 0) going into it. */
static int create_member(struct registry *reg, struct reg_client *rc, const char *name, int64_t n,
			 uint64_t arena, struct tensor **t, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCUDA, 0 });

	a.tx = 7;
	a.arena_size = arena;
	a.in_arena = arena == 0;
	*lease = 0;
	return registry_create(reg, rc, &a, t, lease, why, sizeof(why));
}

/*
 * A GPU set in one allocation: the first member's create makes it on the
 * worker, charged as asked, then at its rounded size; later members go
 * into it at once, at their offsets, each leased whole with the set's
 * share id; a member that comes while it is being made gets memory of its
 * own. It is freed with its last member, every charge given back.
 */
static void test_async_set_in_one_allocation(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct quota_limits lim = { 0 };
	struct quota q;
	struct reg_client a, b;
	struct tensor *t0, *t1, *t2, *seen;
	uint64_t l0, l1, l2, lb, commit;
	uint32_t npub, nun;
	bool w;

	slow_live = slow_released = 0;
	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1000, 1000, 2);
	assert_int_equal(create_member(reg, &a, "s/0", 1000, 3 << 20, &t0, &l0), -EINPROGRESS);
	/* Charged as asked while the worker makes it; t0 its first member. */
	assert_int_equal(reg->n_gpu_arenas, 1);
	assert_int_equal(reg->gpu_arena_bytes, 3 << 20);
	assert_int_equal(dev->used, 3 << 20);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 3 << 20);
	assert_non_null(t0->arena);
	/* Meanwhile another member cannot go in: memory of its own. */
	assert_int_equal(create_member(reg, &a, "s/1", 100, 0, &t1, &l1), -EINPROGRESS);
	assert_null(t1->arena);
	assert_int_equal(finish_slow(reg, t0, &l0), 0);
	assert_int_equal(finish_slow(reg, t1, &l1), 0);
	assert_int_equal(slow_live, 2);
	/* Rounded to the granularity: 4 MiB, the extra charged too. */
	assert_int_equal(t0->alloc.size, 4 << 20);
	assert_int_equal(t0->alloc.ipc_offset, 0);
	assert_int_equal(reg->gpu_arena_bytes, 4 << 20);
	assert_int_equal(dev->used, (4 << 20) + (2 << 20));
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], (4 << 20) + (2 << 20));
	assert_int_not_equal(t0->alloc.share_id, 0);
	/* Made: the next member goes in at once, past the first, page-aligned. */
	assert_int_equal(create_member(reg, &a, "s/2", 5000, 0, &t2, &l2), 0);
	assert_ptr_equal(t2->arena, t0->arena);
	assert_int_equal(t2->alloc.ipc_offset, 4096);
	assert_int_equal(t2->alloc.size, 4 << 20); /* a lease maps the whole */
	assert_int_equal(t2->alloc.share_id, t0->alloc.share_id);
	assert_ptr_equal(t2->alloc.priv, t0->alloc.priv);
	assert_int_equal(slow_live, 2);
	assert_int_equal(dev->used, (4 << 20) + (2 << 20));
	assert_int_equal(registry_tx_commit(reg, &a, 7, &commit, &npub, &nun, why, sizeof(why)), 0);
	assert_int_equal(npub, 3);
	/* b keeps one member, and with it the whole allocation. */
	assert_int_equal(registry_attach(reg, &b, "s/2", 3, &seen, &lb, &w, why, sizeof(why)), 0);
	assert_ptr_equal(seen, t2);
	for (int i = 0; i < 3; i++) {
		char n[4] = { 's', '/', (char)('0' + i), 0 };

		assert_int_equal(registry_unlink(reg, &a, n, 3, why, sizeof(why)), 0);
	}
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 1);
	assert_int_equal(reg->n_gpu_arenas, 1);
	registry_client_gone(reg, &b);
	assert_int_equal(slow_live, 0);
	assert_int_equal(reg->n_gpu_arenas, 0);
	assert_int_equal(reg->gpu_arena_bytes, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(reg->n_tensors, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_TENSORS], 0);
	reg->quota = NULL;
	quota_fini(&q);
}

/* A member of a's transaction tx of n bytes, replacing its name: opening its
 * set's allocation of arena bytes (asking to recycle when recycle), or
 * (arena 0) going into it. */
static int create_version_member(struct registry *reg, struct reg_client *rc, uint32_t tx,
				 const char *name, int64_t n, uint64_t arena, bool recycle,
				 struct tensor **t, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCUDA, 0 });

	a.tx = tx;
	a.replace = true;
	a.recycle = recycle && arena;
	a.arena_size = arena;
	a.in_arena = arena == 0;
	*lease = 0;
	return registry_create(reg, rc, &a, t, lease, why, sizeof(why));
}

/* Version tx of the set s/0, s/1 by a (recycling when recycle), committed,
 * its writer's leases ended; *ret_t0 its first member. 0: made at once
 * (a free ring buffer), 1: made on the worker. */
static int put_set_version(struct registry *reg, struct reg_client *a, uint32_t tx, bool recycle,
			   struct tensor **ret_t0)
{
	struct tensor *t0, *t1;
	uint64_t l0, l1, commit;
	uint32_t npub, nun;
	int r = create_version_member(reg, a, tx, "s/0", 1000, 1 << 20, recycle, &t0, &l0);

	if (r == -EINPROGRESS)
		assert_int_equal(finish_slow(reg, t0, &l0), 0);
	else
		assert_int_equal(r, 0);
	assert_int_equal(create_version_member(reg, a, tx, "s/1", 5000, 0, false, &t1, &l1), 0);
	assert_ptr_equal(t1->arena, t0->arena);
	assert_int_equal(t1->alloc.ipc_offset, 4096);
	assert_int_equal(t1->alloc.share_id, t0->alloc.share_id);
	assert_int_equal(registry_tx_commit(reg, a, tx, &commit, &npub, &nun, why, sizeof(why)), 0);
	assert_int_equal(npub, 2);
	assert_int_equal(registry_release(reg, a, l0), 0);
	assert_int_equal(registry_release(reg, a, l1), 0);
	*ret_t0 = t0;
	return r == 0 ? 0 : 1;
}

/*
 * GPU rings for sets (docs/recycle.md, section 0, "GPU rings"): a set's
 * allocation opened asking to recycle is a GPU ring buffer (its share id
 * says so); with its last member (named or leased) it goes back to its
 * writer's ring, charged like a reserve, and the next set of the same
 * size, group and mode takes it at once (no allocation, the same share
 * id), its members at their offsets. One not asking to recycle takes
 * fresh memory and is freed with its last member; the writer's end frees
 * the free ones.
 */
static void test_async_gpu_set_ring(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct quota_limits lim = { 0 };
	struct quota q;
	struct reg_client a, b;
	struct tensor *v1, *v2, *v3, *v4, *seen;
	uint64_t lb, share;
	bool w;

	slow_live = slow_released = slow_allocs = 0;
	slow_vmm = true;
	reg->recycle = true;
	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1000, 1000, 2); /* a reader of a's uid */

	/* Version 1: made on the worker, a GPU ring buffer by its share id. */
	assert_int_equal(put_set_version(reg, &a, 7, true, &v1), 1);
	share = v1->alloc.share_id;
	assert_true(share & REG_RING_SHARE);
	assert_true(share & REG_GPU_RING_SHARE);
	assert_true(v1->arena->recycle);
	/* b keeps one member of version 1, and with it its allocation. */
	assert_int_equal(registry_attach(reg, &b, "s/1", 3, &seen, &lb, &w, why, sizeof(why)), 0);

	/* Version 2: version 1's allocation is b's still: new memory. */
	assert_int_equal(put_set_version(reg, &a, 8, true, &v2), 1);
	assert_int_not_equal(v2->alloc.share_id, share);
	assert_int_equal(reg->n_gpu_ring_free, 0);
	assert_int_equal(reg->n_gpu_arenas, 2);
	assert_int_equal(registry_release(reg, &b, lb), 0);
	assert_int_equal(reg->n_gpu_ring_free, 1);
	assert_int_equal(reg->n_gpu_arenas, 1);
	assert_int_equal(reg->gpu_ring_free_bytes, 2 << 20);
	assert_int_equal(slow_live, 2);
	assert_int_equal(dev->used, 4 << 20);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 << 20);

	/* Version 3 takes it at once: no allocation, the same share id. */
	assert_int_equal(put_set_version(reg, &a, 9, true, &v3), 0);
	assert_int_equal(slow_allocs, 2);
	assert_int_equal(v3->alloc.share_id, share);
	assert_int_equal(v3->alloc.ipc_offset, 0);
	assert_int_equal(v3->alloc.size, 2 << 20);
	assert_int_equal(reg->gpu_ring_hits, 1);
	/* Version 2's went free with version 3's commit (no lease on it). */
	assert_int_equal(reg->n_gpu_ring_free, 1);
	assert_int_equal(reg->n_gpu_arenas, 1);
	assert_int_equal(dev->used, 4 << 20);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 << 20);

	/* Not asking to recycle: fresh memory, which is not kept. */
	assert_int_equal(put_set_version(reg, &a, 10, false, &v4), 1);
	assert_int_equal(slow_allocs, 3);
	assert_false(v4->alloc.share_id & REG_GPU_RING_SHARE);
	assert_int_equal(reg->n_gpu_ring_free, 2); /* versions 2's and 3's */

	/* The writer goes: its free buffers are freed, its version stays. */
	registry_client_gone(reg, &a);
	assert_int_equal(reg->n_gpu_ring_free, 0);
	assert_int_equal(reg->gpu_ring_free_bytes, 0);
	assert_int_equal(slow_live, 1);
	registry_client_gone(reg, &b);
	registry_client_init(&a, 3, 1000, 1000, 3);
	assert_int_equal(registry_unlink(reg, &a, "s/0", 3, why, sizeof(why)), 0);
	assert_int_equal(registry_unlink(reg, &a, "s/1", 3, why, sizeof(why)), 0);
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 0);
	assert_int_equal(reg->n_gpu_arenas, 0);
	assert_int_equal(reg->gpu_arena_bytes, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(reg->n_tensors, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 0);
	reg->quota = NULL;
	quota_fini(&q);
	slow_vmm = false;
}

/*
 * A set's allocation that fails, rounds past capacity, or whose creator
 * goes meanwhile: the member's create fails (or is cancelled), later
 * members get memory of their own, and nothing stays charged.
 */
static void test_async_set_allocation_fails(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = slow_dev(reg);
	struct reg_client a;
	struct tensor *t, *t1;
	uint64_t l, l1;

	slow_live = 0;
	registry_client_init(&a, 1, 1000, 1000, 1);
	assert_int_equal(create_member(reg, &a, "s/0", 100, 1 << 20, &t, &l), -EINPROGRESS);
	slow_fail = -ENOSPC;
	assert_int_equal(finish_slow(reg, t, &l), -ENOSPC);
	assert_non_null(strstr(why, "'s/0'"));
	assert_non_null(strstr(why, "its set's"));
	assert_int_equal(create_member(reg, &a, "s/1", 100, 0, &t1, &l1), -EINPROGRESS);
	assert_null(t1->arena);
	assert_int_equal(finish_slow(reg, t1, &l1), 0);
	assert_int_equal(registry_tx_abort(reg, &a, 7, why, sizeof(why)), 0);
	assert_int_equal(reg->n_gpu_arenas, 0);
	assert_int_equal(dev->used, 2 << 20); /* s/1, leased until a goes */
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 0);
	assert_int_equal(dev->used, 0);

	/* 4 MiB + 1 fits the 5 MiB left as asked, not once rounded up to 6. */
	registry_client_init(&a, 2, 1000, 1000, 2);
	assert_int_equal(create_slow(reg, &a, "other", 1 << 20, false, &t1), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, t1, &l1), 0);
	assert_int_equal(create_member(reg, &a, "s/0", 100, (4 << 20) + 1, &t, &l), -EINPROGRESS);
	assert_int_equal(finish_slow(reg, t, &l), -ENOSPC);
	assert_non_null(strstr(why, "after rounding"));
	assert_int_equal(slow_live, 1);
	registry_client_gone(reg, &a);
	assert_int_equal(slow_live, 0);
	assert_int_equal(reg->n_gpu_arenas, 0);
	assert_int_equal(dev->used, 0);

	/* Its creator goes while the worker makes it: made, then freed. */
	registry_client_init(&a, 3, 1000, 1000, 3);
	assert_int_equal(create_member(reg, &a, "s/0", 100, 1 << 20, &t, &l), -EINPROGRESS);
	registry_client_gone(reg, &a);
	assert_int_equal(reg->n_gpu_arenas, 1);
	assert_int_equal(finish_slow(reg, t, &l), -ECANCELED);
	assert_int_equal(slow_live, 0);
	assert_int_equal(reg->n_gpu_arenas, 0);
	assert_int_equal(reg->gpu_arena_bytes, 0);
	assert_int_equal(dev->used, 0);
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
		cmocka_unit_test_setup_teardown(test_async_gpu_ring, setup, reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_async_set_in_one_allocation, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_async_set_allocation_fails, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_async_gpu_set_ring, setup,
						reg_fixture_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
