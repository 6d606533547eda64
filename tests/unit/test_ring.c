/*
 * Recycled memory (docs/recycle.md): the rings of writers' connections,
 * over the real host backend and its pool. When a version's memory is
 * free (its name gone, its last lease ended), what may take it next (the
 * same writer, size, group and mode), what it is charged meanwhile, and
 * what never takes it again: a tainted buffer, one its writer gave back,
 * one whose writer is gone.
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/base/quota.h"
#include "daemon/memory/pool.h"
#include "daemon/registry/registry.h"
#include "registry_fixture.h"

const struct backend_ops *const backends[] = { &backend_host, NULL };

#define MiB (1ull << 20)

static int setup(void **state)
{
	struct registry *reg = reg_fixture_setup(state, 64 * MiB);

	reg->recycle = true;
	return 0;
}

static struct reg_device *host(struct registry *reg)
{
	return registry_device(reg, (DLDevice){ kDLCPU, 0 });
}

/* A recycled create of name (a new version with replace), n bytes, mode (0: 0600). */
static struct tensor *create(struct registry *reg, struct reg_client *rc, const char *name,
			     int64_t n, uint32_t mode, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCPU, 0 });
	struct tensor *t;

	a.recycle = true;
	a.replace = true;
	a.mode = mode;
	assert_int_equal(registry_create(reg, rc, &a, &t, lease, why, sizeof(why)), 0);
	return t;
}

/* create(), then published with the writer's lease ended: one version. */
static struct tensor *version(struct registry *reg, struct reg_client *rc, const char *name,
			      int64_t n, uint32_t mode)
{
	uint64_t lease;
	struct tensor *t = create(reg, rc, name, n, mode, &lease);

	assert_int_equal(registry_publish(reg, rc, name, strlen(name), NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, rc, lease), 0);
	return t;
}

static ino_t inode(int fd)
{
	struct stat st;

	assert_int_equal(fstat(fd, &st), 0);
	return st.st_ino;
}

static uint64_t attach(struct registry *reg, struct reg_client *rc, const char *name)
{
	struct tensor *t;
	uint64_t lease;
	bool writable;

	assert_int_equal(registry_attach(reg, rc, name, strlen(name), &t, &lease, &writable, why,
					 sizeof(why)),
			 0);
	return lease;
}

/*
 * The state table of docs/recycle.md: a version's buffer is free once it
 * is replaced and unleased, charged like a reserve while free, and the
 * next version of the same shape takes it, sealed F_SEAL_FUTURE_WRITE
 * (so its writer's mapping, made before, still writes it).
 */
static void test_ring_buffer_is_reused_after_its_last_lease(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct quota_limits lim = { 0 };
	struct reg_client w, r;
	struct tensor *g1, *g2, *g3;
	uint64_t lease, id1;
	struct quota q;
	ino_t ino1;
	void *map;

	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&w, 1, 1000, 1000, 1);
	registry_client_init(&r, 2, 1001, 1001, 2);
	g1 = create(reg, &w, "w", MiB, 0644, &lease);
	id1 = g1->ring_id;
	assert_true(id1 != 0);
	assert_ptr_equal(g1->ring_rc, &w);
	assert_false(g1->ring_hit);
	ino1 = inode(g1->alloc.fd);
	/* The writer maps it before the seal, as its library does. */
	map = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, g1->alloc.fd, 0);
	assert_true(map != MAP_FAILED);
	memset(map, 1, MiB);
	assert_int_equal(registry_publish(reg, &w, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &w, lease), 0);
	assert_int_equal(fcntl(g1->alloc.fd, F_GET_SEALS),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
	assert_int_equal(pwrite(g1->alloc.fd, "x", 1, 0), -1);

	/* A reader holds g1: g2 needs a buffer of its own. */
	lease = attach(reg, &r, "w");
	g2 = version(reg, &w, "w", MiB, 0644);
	assert_false(g2->ring_hit);
	assert_true(g2->ring_id != id1);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, 2 * MiB);

	/* Its last lease ends: g1's buffer is free, charged to the writer's uid. */
	assert_int_equal(registry_release(reg, &r, lease), 0);
	assert_int_equal(reg->n_ring_free, 1);
	assert_int_equal(reg->ring_free_bytes, MiB);
	assert_int_equal(w.n_ring_free, 1);
	assert_int_equal(dev->used, 2 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 2 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 2);

	/* g3 takes it, with what the writer's mapping wrote there. */
	g3 = create(reg, &w, "w", MiB, 0644, &lease);
	assert_true(g3->ring_hit);
	assert_int_equal(g3->ring_id, id1);
	assert_int_equal(inode(g3->alloc.fd), ino1);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(reg->ring_hits, 1);
	memset(map, 3, MiB); /* the next version, through the mapping made before the seal */
	assert_int_equal(registry_publish(reg, &w, "w", 1, NULL, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &w, lease), 0);
	{
		uint8_t b = 0;

		assert_int_equal(pread(g3->alloc.fd, &b, 1, MiB - 1), 1);
		assert_int_equal(b, 3);
	}
	/* g2 went free with g3's publish. */
	assert_int_equal(reg->n_ring_free, 1);
	assert_int_equal(dev->used, 2 * MiB);

	munmap(map, MiB);
	registry_client_gone(reg, &r);
	registry_client_gone(reg, &w);
	/* The free buffer went with its writer; g3 is published and stays. */
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, MiB);
	assert_null(g3->ring_rc);
	registry_client_init(&w, 3, 1000, 1000, 3);
	assert_int_equal(registry_unlink(reg, &w, "w", 1, why, sizeof(why)), 0);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 0);
	registry_client_gone(reg, &w);
	reg->quota = NULL;
	quota_fini(&q);
}

/* Only a version of the same size, group and mode, of the same writer, takes a buffer. */
static void test_ring_keeps_to_its_class_and_writer(void **state)
{
	struct registry *reg = *state;
	struct reg_client w, v;
	struct tensor *t;
	uint64_t id;

	registry_client_init(&w, 1, 1000, 1000, 1);
	registry_client_init(&v, 2, 1000, 1000, 2);
	id = version(reg, &w, "a", MiB, 0644)->ring_id;
	assert_int_equal(registry_unlink(reg, &w, "a", 1, why, sizeof(why)), 0);
	assert_int_equal(reg->n_ring_free, 1);
	/* Another mode, another size, another connection of the same uid: new memory. */
	t = version(reg, &w, "b", MiB, 0600);
	assert_false(t->ring_hit);
	t = version(reg, &w, "c", 2 * MiB, 0644);
	assert_false(t->ring_hit);
	t = version(reg, &v, "d", MiB, 0644);
	assert_false(t->ring_hit);
	assert_int_equal(reg->n_ring_free, 1);
	/* Another name of the same class: the buffer's. */
	t = version(reg, &w, "e", MiB, 0644);
	assert_true(t->ring_hit);
	assert_int_equal(t->ring_id, id);
	registry_client_gone(reg, &v);
	registry_client_gone(reg, &w);
}

/*
 * A client that forked holding a lease (Release.forked): that buffer is
 * never recycled, since the child may still read it; the rest are.
 */
static void test_ring_forked_lease_taints(void **state)
{
	struct registry *reg = *state;
	struct reg_client w, r;
	uint64_t lease;

	registry_client_init(&w, 1, 1000, 1000, 1);
	registry_client_init(&r, 2, 1000, 1000, 2);
	version(reg, &w, "w", MiB, 0);
	lease = attach(reg, &r, "w");
	assert_int_equal(registry_forked(reg, &r), 1);
	assert_int_equal(registry_forked(reg, &r), 0); /* once */
	assert_int_equal(reg->ring_tainted, 1);
	version(reg, &w, "w", MiB, 0);
	assert_int_equal(registry_release(reg, &r, lease), 0);
	assert_int_equal(reg->n_ring_free, 0);
	/* Untainted versions cycle as before. */
	version(reg, &w, "w", MiB, 0);
	assert_int_equal(reg->n_ring_free, 1);
	registry_client_gone(reg, &r);
	registry_client_gone(reg, &w);
}

/*
 * Unreserve of a ring buffer's id (its writer unmapped it): a free one is
 * freed at once, one holding a version is freed with it, not recycled.
 */
static void test_ring_buffer_given_back(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct reg_client w;
	uint64_t a, b;

	registry_client_init(&w, 1, 1000, 1000, 1);
	a = version(reg, &w, "w", MiB, 0)->ring_id;
	b = version(reg, &w, "w", MiB, 0)->ring_id;
	assert_int_equal(reg->n_ring_free, 1);
	assert_int_equal(registry_unreserve(reg, &w, a), 0);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, MiB);
	assert_int_equal(registry_unreserve(reg, &w, b), 0);
	assert_int_equal(registry_unreserve(reg, &w, b), -ESRCH);
	version(reg, &w, "w", MiB, 0);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, MiB);
	registry_client_gone(reg, &w);
}

/* --recycle off (or a failed probe): plain memory, F_SEAL_WRITE. */
static void test_ring_off(void **state)
{
	struct registry *reg = *state;
	struct reg_client w;
	struct tensor *t;

	reg->recycle = false;
	registry_client_init(&w, 1, 1000, 1000, 1);
	t = version(reg, &w, "w", MiB, 0);
	assert_int_equal(t->ring_id, 0);
	assert_true(fcntl(t->alloc.fd, F_GET_SEALS) & F_SEAL_WRITE);
	version(reg, &w, "w", MiB, 0);
	assert_int_equal(reg->n_ring_free, 0);
	registry_client_gone(reg, &w);
}

/* Room for a create: the uid's free ring buffers go first, then it is served. */
static void test_ring_free_buffers_make_room(void **state)
{
	struct registry *reg = *state;
	struct reg_client w;
	struct tensor *t;

	registry_client_init(&w, 1, 1000, 1000, 1);
	for (int i = 0; i < 8; i++)
		version(reg, &w, "w", 16 * MiB, 0); /* alternates two buffers */
	assert_int_equal(reg->n_ring_free, 1);
	/* 64 MiB: 16 published + 16 free leave 32; a 40 MiB create needs the free one. */
	t = version(reg, &w, "big", 40 * MiB, 0);
	assert_non_null(t);
	assert_int_equal(reg->n_ring_free, 0);
	registry_client_gone(reg, &w);
}

/* A member of set allocation tx (docs/recycle.md, section 5): opens it when arena is nonzero. */
static struct tensor *member(struct registry *reg, struct reg_client *rc, const char *name,
			     int64_t n, uint32_t tx, uint64_t arena, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCPU, 0 });
	struct tensor *t;

	a.recycle = true;
	a.replace = true;
	a.tx = tx;
	a.mode = 0644;
	a.arena_size = arena;
	a.in_arena = !arena;
	assert_int_equal(registry_create(reg, rc, &a, &t, lease, why, sizeof(why)), 0);
	return t;
}

/* One version of the set s/a, s/b, s/c (MiB, 2 MiB - 100, MiB) as transaction tx. */
static struct tensor *set_version(struct registry *reg, struct reg_client *rc, uint32_t tx,
				  struct tensor **ret_c)
{
	uint64_t l[3], commit;
	uint32_t pub, unl;
	struct tensor *a, *b;

	a = member(reg, rc, "s/a", MiB, tx, 4 * MiB, &l[0]);
	b = member(reg, rc, "s/b", 2 * MiB - 100, tx, 0, &l[1]);
	*ret_c = member(reg, rc, "s/c", MiB, tx, 0, &l[2]);
	assert_ptr_equal(b->arena, a->arena);
	assert_ptr_equal((*ret_c)->arena, a->arena);
	assert_int_equal(registry_tx_commit(reg, rc, tx, &commit, &pub, &unl, why, sizeof(why)), 0);
	assert_int_equal(pub, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(registry_release(reg, rc, l[i]), 0);
	return b;
}

/*
 * A set in one allocation: members at aligned offsets of one memfd, the
 * whole of it charged (members their bytes, the arena the rest), kept
 * while any member is leased, recycled whole when the last goes, and
 * every charge given back at the end.
 */
static void test_arena_holds_a_set_and_is_recycled_whole(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct quota_limits lim = { 0 };
	struct tensor *a, *b, *c, *b2, *c2, *c3;
	struct reg_client w, r;
	uint64_t lease, id1;
	struct quota q;
	ino_t ino1;

	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&w, 1, 1000, 1000, 1);
	registry_client_init(&r, 2, 1001, 1001, 2);
	b = set_version(reg, &w, 1, &c);
	a = registry_lookup(reg, &w, "s/a", 3);
	assert_non_null(a);
	id1 = b->arena->id;
	ino1 = inode(b->alloc.fd);
	assert_int_equal(inode(a->alloc.fd), ino1);
	assert_int_equal(a->alloc.ipc_offset, 0);
	assert_int_equal(b->alloc.ipc_offset, MiB);
	assert_int_equal(c->alloc.ipc_offset, 3 * MiB); /* page-aligned after b */
	assert_int_equal(reg->n_arenas, 1);
	assert_int_equal(reg->arena_bytes, 4 * MiB);
	/* Members their bytes, the arena the rest: 4 MiB in all, one descriptor each. */
	assert_int_equal(dev->used, 4 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 4 * MiB);
	assert_int_equal(fcntl(b->alloc.fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE,
			 F_SEAL_FUTURE_WRITE);

	/* A reader keeps s/b of version 1: its arena lives on; version 2 takes new memory. */
	lease = attach(reg, &r, "s/b");
	b2 = set_version(reg, &w, 2, &c2);
	assert_true(b2->arena->id != id1);
	assert_int_equal(reg->n_arenas, 2);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, 8 * MiB);
	/* s/b's bytes count against its reader now, the rest of its arena its writer's. */
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 6 * MiB + 100);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_PINNED], 2 * MiB - 100);

	/* Its last lease ends: the arena goes back to the ring whole, charged as a reserve. */
	assert_int_equal(registry_release(reg, &r, lease), 0);
	assert_int_equal(reg->n_arenas, 1);
	assert_int_equal(reg->n_ring_free, 1);
	assert_int_equal(reg->ring_free_bytes, 4 * MiB);
	assert_int_equal(dev->used, 8 * MiB);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 8 * MiB);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_PINNED], 0);

	/* Version 3 takes it: same memfd, same id, and no descriptor to send. */
	set_version(reg, &w, 3, &c3);
	assert_int_equal(c3->arena->id, id1);
	assert_int_equal(inode(c3->alloc.fd), ino1);
	assert_true(c3->ring_hit);
	assert_int_equal(reg->ring_hits, 1);

	/* Version 2's went free with that commit; an aborted set takes it and gives it back. */
	assert_int_equal(reg->n_ring_free, 1);
	member(reg, &w, "s/a", MiB, 4, 4 * MiB, &lease);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(registry_tx_abort(reg, &w, 4, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &w, lease), 0);
	assert_int_equal(reg->n_arenas, 1);
	assert_int_equal(reg->n_ring_free, 1);
	assert_int_equal(dev->used, 8 * MiB);

	registry_client_gone(reg, &r);
	registry_client_gone(reg, &w);
	registry_client_init(&w, 3, 1000, 1000, 3);
	for (const char *n = "abc"; *n; n++) {
		char name[4] = { 's', '/', *n, 0 };

		assert_int_equal(registry_unlink(reg, &w, name, 3, why, sizeof(why)), 0);
	}
	assert_int_equal(reg->n_arenas, 0);
	assert_int_equal(reg->n_ring_free, 0);
	assert_int_equal(dev->used, 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_FDS], 0);
	registry_client_gone(reg, &w);
	reg->quota = NULL;
	quota_fini(&q);
}

/* A member that does not fit its arena, or another class, is created on its own. */
static void test_arena_refuses_what_does_not_fit(void **state)
{
	struct registry *reg = *state;
	struct reg_device *dev = host(reg);
	struct create_args x;
	struct reg_client w;
	struct tensor *a, *b, *c;
	uint64_t l[3], commit;
	uint32_t pub, unl;
	int64_t n = MiB;

	registry_client_init(&w, 1, 1000, 1000, 1);
	a = member(reg, &w, "f/a", MiB, 1, 2 * MiB, &l[0]);
	b = member(reg, &w, "f/b", 2 * MiB, 1, 0, &l[1]); /* no room left */
	assert_non_null(a->arena);
	assert_null(b->arena);
	assert_true(b->ring_id != 0); /* a ring buffer of its own */
	x = reg_fixture_u8("f/c", &n, (DLDevice){ kDLCPU, 0 });
	x.recycle = true;
	x.tx = 1;
	x.in_arena = true;
	x.mode = 0600; /* another class */
	assert_int_equal(registry_create(reg, &w, &x, &c, &l[2], why, sizeof(why)), 0);
	assert_null(c->arena);
	assert_int_equal(registry_tx_commit(reg, &w, 1, &commit, &pub, &unl, why, sizeof(why)), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(registry_release(reg, &w, l[i]), 0);
	/* An arena larger than the device, or smaller than its first member: none. */
	a = member(reg, &w, "g/a", MiB, 2, MiB / 2, &l[0]);
	assert_null(a->arena);
	assert_int_equal(registry_tx_abort(reg, &w, 2, why, sizeof(why)), 0);
	assert_int_equal(registry_release(reg, &w, l[0]), 0);
	registry_client_gone(reg, &w);
	registry_client_init(&w, 2, 1000, 1000, 2);
	assert_int_equal(registry_unlink(reg, &w, "f/a", 3, why, sizeof(why)), 0);
	assert_int_equal(registry_unlink(reg, &w, "f/b", 3, why, sizeof(why)), 0);
	assert_int_equal(registry_unlink(reg, &w, "f/c", 3, why, sizeof(why)), 0);
	assert_int_equal(reg->n_arenas, 0);
	assert_int_equal(dev->used, 0);
	registry_client_gone(reg, &w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ring_buffer_is_reused_after_its_last_lease,
						setup, reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_ring_keeps_to_its_class_and_writer, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_ring_forked_lease_taints, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_ring_buffer_given_back, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_ring_off, setup, reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_arena_holds_a_set_and_is_recycled_whole, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_arena_refuses_what_does_not_fit, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_ring_free_buffers_make_room, setup,
						reg_fixture_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
