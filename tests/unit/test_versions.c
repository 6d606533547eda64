/*
 * Versions and transactions in the registry (daemon/registry/commit.c, daemon/registry/txn.c):
 * generations per name that never repeat (across replace, unlink and
 * re-create, and past the tombstones' bound), one commit id per step,
 * transactions that publish and unlink in one step or leave no trace
 * (abort, a failed member, the client gone), and on_commit hearing of each
 * step once, whole.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/registry/registry.h"
#include "daemon/registry/registry_int.h"
#include "registry_fixture.h"

extern const struct backend_ops backend_host;
const struct backend_ops *const backends[] = { &backend_host, NULL };

/* What on_commit heard: the steps, and the changes of the last one. */
static struct {
	int steps;
	size_t n;
	struct reg_change v[16];
} heard;

static void on_commit(void *ctx, const struct reg_change *v, size_t n, bool lost)
{
	heard.steps++;
	heard.n = n;
	memcpy(heard.v, v, (n < 16 ? n : 16) * sizeof(*v));
	assert_false(lost);
}

static int setup(void **state)
{
	reg_fixture_setup(state, 1 << 24)->on_commit = on_commit;
	memset(&heard, 0, sizeof(heard));
	return 0;
}

static int create(struct registry *reg, struct reg_client *rc, const char *name, uint32_t tx,
		  bool replace, struct tensor **t, uint64_t *lease)
{
	int64_t n = 8192;
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCPU, 0 });

	a.replace = replace;
	a.tx = tx;
	return registry_create(reg, rc, &a, t, lease, why, sizeof(why));
}

/* Creates and publishes name for rc (replacing its version when there is one). */
static struct tensor *put(struct registry *reg, struct reg_client *rc, const char *name)
{
	struct tensor *t, *p;
	uint64_t lease;

	assert_int_equal(
		create(reg, rc, name, 0, registry_published(reg, name, strlen(name)), &t, &lease),
		0);
	assert_int_equal(registry_publish(reg, rc, name, strlen(name), &p, why, sizeof(why)), 0);
	assert_ptr_equal(p, t);
	assert_int_equal(registry_release(reg, rc, lease), 0);
	return t;
}

static void test_generations_never_repeat(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	struct tensor *t;
	struct reg_client b, root;
	uint64_t gen, commit;

	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 2000, 2000, 2);
	registry_client_init(&root, 3, 0, 0, 3);
	t = put(reg, &a, "w");
	assert_int_equal(t->generation, 1);
	assert_int_equal(t->commit, 1);
	assert_int_equal(heard.steps, 1);
	assert_int_equal(heard.v[0].kind, REG_PUBLISHED);
	t = put(reg, &a, "w"); /* a replace */
	assert_int_equal(t->generation, 2);
	assert_int_equal(t->commit, 2);
	assert_int_equal(put(reg, &a, "other")->generation, 1);
	/* Unlink: a step of its own; the tombstone keeps generation 2. */
	assert_int_equal(registry_unlink(reg, &a, "w", 1, why, sizeof(why)), 0);
	assert_int_equal(heard.steps, 4);
	assert_int_equal(heard.v[0].kind, REG_UNLINKED);
	assert_int_equal(heard.v[0].generation, 2);
	assert_int_equal(heard.v[0].commit, 4);
	assert_true(registry_tomb(reg, &a, "w", 1, &gen, &commit));
	assert_int_equal(gen, 2);
	assert_int_equal(commit, 4);
	assert_int_equal(registry_tombs_newest(reg, &a, "", 0), 4);
	/* w was 0600: another uid hears nothing of its unlink (issue 30 item 3). */
	assert_false(registry_tomb(reg, &b, "w", 1, &gen, &commit));
	assert_int_equal(registry_tombs_newest(reg, &b, "", 0), 0);
	assert_int_equal(registry_tombs_newest(reg, &root, "w", 1), 4);
	/* Created again: the next generation, and the tombstone is taken back. */
	t = put(reg, &a, "w");
	assert_int_equal(t->generation, 3);
	assert_int_equal(t->commit, 5);
	assert_false(registry_tomb(reg, &a, "w", 1, &gen, &commit));
	assert_int_equal(registry_generation(reg, "w", 1), 3);
	/* An unpublished tensor's unlink is no commit. */
	assert_int_equal(create(reg, &a, "draft", 0, false, &t, &gen), 0);
	assert_int_equal(registry_unlink(reg, &a, "draft", 5, why, sizeof(why)), 0);
	assert_int_equal(heard.steps, 5);
	registry_client_gone(reg, &a);
}

static void test_forgotten_names_start_above_the_floor(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	char name[8];

	registry_client_init(&a, 1, 1000, 1000, 1);
	reg->tombs_max = 2;
	put(reg, &a, "a");
	put(reg, &a, "a");
	put(reg, &a, "a"); /* a at generation 3 */
	assert_int_equal(registry_unlink(reg, &a, "a", 1, why, sizeof(why)), 0);
	for (int i = 0; i < 2; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		put(reg, &a, name);
		assert_int_equal(registry_unlink(reg, &a, name, strlen(name), why, sizeof(why)), 0);
	}
	/* a's tombstone went first: the floor remembers its generation for every name. */
	assert_int_equal(reg->n_tombs, 2);
	assert_int_equal(reg->gen_floor, 3);
	assert_int_equal(put(reg, &a, "a")->generation, 4);
	assert_int_equal(put(reg, &a, "brand-new")->generation, 4);
	/* Remembered names go on from their own. */
	assert_int_equal(put(reg, &a, "n1")->generation, 2);
	registry_client_gone(reg, &a);
}

static void test_transaction_commits_in_one_step(void **state)
{
	struct registry *reg = *state;
	struct reg_client a, b;
	struct tensor *x1, *x2, *y, *t;
	uint64_t lx, ly, lb, commit;
	uint32_t published, unlinked;
	bool w;

	registry_client_init(&a, 1, 1000, 1000, 1);
	registry_client_init(&b, 2, 1000, 1000, 2);
	x1 = put(reg, &a, "set/x");
	put(reg, &a, "set/z");
	heard.steps = 0;
	/* Staged: a new x, a new y, z unlinked. */
	assert_int_equal(create(reg, &a, "set/x", 7, true, &x2, &lx), 0);
	assert_int_equal(create(reg, &a, "set/y", 7, false, &y, &ly), 0);
	assert_int_equal(registry_tx_unlink(reg, &a, 7, "set/z", 5, why, sizeof(why)), 0);
	/* Nobody sees any of it yet; the members cannot be published alone. */
	assert_int_equal(registry_attach(reg, &b, "set/x", 5, &t, &lb, &w, why, sizeof(why)), 0);
	assert_ptr_equal(t, x1);
	assert_int_equal(registry_release(reg, &b, lb), 0);
	assert_int_equal(registry_attach(reg, &b, "set/y", 5, &t, &lb, &w, why, sizeof(why)),
			 -ENOENT);
	assert_true(registry_published(reg, "set/z", 5));
	assert_int_equal(registry_publish(reg, &a, "set/y", 5, NULL, why, sizeof(why)), -EBUSY);
	assert_non_null(strstr(why, "transaction 7"));
	assert_int_equal(registry_unlink(reg, &a, "set/y", 5, why, sizeof(why)), -EBUSY);
	/* A second member of one name in the same transaction: refused. */
	assert_int_equal(create(reg, &a, "set/y", 7, true, &t, &lb), -EEXIST);
	assert_int_equal(heard.steps, 0);
	/* The commit: one step, one id, the members in order, then the unlink. */
	assert_int_equal(
		registry_tx_commit(reg, &a, 7, &commit, &published, &unlinked, why, sizeof(why)),
		0);
	assert_int_equal(published, 2);
	assert_int_equal(unlinked, 1);
	assert_int_equal(heard.steps, 1);
	assert_int_equal(heard.n, 3);
	assert_string_equal(heard.v[0].name, "set/x");
	assert_int_equal(heard.v[0].generation, 2);
	assert_string_equal(heard.v[1].name, "set/y");
	assert_int_equal(heard.v[1].generation, 1);
	assert_string_equal(heard.v[2].name, "set/z");
	assert_int_equal(heard.v[2].kind, REG_UNLINKED);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(heard.v[i].commit, commit);
	assert_int_equal(x2->commit, commit);
	assert_int_equal(y->commit, commit);
	assert_false(registry_published(reg, "set/z", 5));
	/* The transaction is over. */
	assert_int_equal(
		registry_tx_commit(reg, &a, 7, &commit, &published, &unlinked, why, sizeof(why)),
		-ENOENT);
	registry_client_gone(reg, &a);
	registry_client_gone(reg, &b);
}

/* Everything a set of staged changes can end in, but a commit, leaves no trace. */
static void test_abort_failure_and_crash_leave_no_trace(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	struct tensor *x1, *t;
	uint64_t lease, commit, used;
	uint32_t published, unlinked;
	void *map;

	registry_client_init(&a, 1, 1000, 1000, 1);
	x1 = put(reg, &a, "x");
	used = reg->devices[0].used;
	heard.steps = 0;

	/* Abort. */
	assert_int_equal(create(reg, &a, "x", 1, true, &t, &lease), 0);
	assert_int_equal(create(reg, &a, "fresh", 1, false, &t, &lease), 0);
	assert_int_equal(registry_tx_abort(reg, &a, 1, why, sizeof(why)), 0);
	assert_int_equal(registry_tx_abort(reg, &a, 1, why, sizeof(why)), -ENOENT);

	/* A member that cannot be sealed (a writable mapping of it) fails the commit. */
	assert_int_equal(create(reg, &a, "x", 2, true, &t, &lease), 0);
	map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, t->alloc.fd, 0);
	assert_true(map != MAP_FAILED);
	assert_int_equal(registry_tx_unlink(reg, &a, 2, "x", 1, why, sizeof(why)), -EINVAL);
	assert_int_equal(
		registry_tx_commit(reg, &a, 2, &commit, &published, &unlinked, why, sizeof(why)),
		-EBUSY);
	assert_non_null(strstr(why, "transaction 2: tensor 'x'"));
	munmap(map, 4096);

	/* A staged unlink whose name is gone by the commit fails it. */
	put(reg, &a, "gone");
	assert_int_equal(create(reg, &a, "fresh", 3, false, &t, &lease), 0);
	assert_int_equal(registry_tx_unlink(reg, &a, 3, "gone", 4, why, sizeof(why)), 0);
	assert_int_equal(registry_unlink(reg, &a, "gone", 4, why, sizeof(why)), 0);
	heard.steps = 0;
	assert_int_equal(
		registry_tx_commit(reg, &a, 3, &commit, &published, &unlinked, why, sizeof(why)),
		-ENOENT);
	assert_int_equal(heard.steps, 0);

	/* The client gone with a transaction open. */
	assert_int_equal(create(reg, &a, "x", 4, true, &t, &lease), 0);
	assert_int_equal(create(reg, &a, "fresh", 4, false, &t, &lease), 0);
	assert_int_equal(a.n_txs, 1);

	/* Through all of it: x is the version it was, fresh never appeared. */
	assert_ptr_equal(registry_lookup(reg, &a, "x", 1), x1);
	assert_int_equal(x1->generation, 1);
	assert_false(registry_published(reg, "fresh", 5));
	registry_client_gone(reg, &a);
	assert_int_equal(a.n_txs, 0);
	assert_int_equal(heard.steps, 0);
	assert_int_equal(reg->devices[0].used, used);
	assert_int_equal(reg->n_tensors, 1); /* x alone */
}

static void test_transactions_are_bounded(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	struct tensor *t;
	uint64_t lease;
	char name[16];

	registry_client_init(&a, 1, 1000, 1000, 1);
	for (uint32_t i = 1; i <= REGISTRY_TX_PER_CLIENT; i++) {
		snprintf(name, sizeof(name), "m%u", i);
		assert_int_equal(create(reg, &a, name, i, false, &t, &lease), 0);
	}
	assert_int_equal(create(reg, &a, "one-more", 99, false, &t, &lease), -EAGAIN);
	assert_non_null(strstr(why, "transaction 99"));
	registry_client_gone(reg, &a);
	assert_int_equal(reg->n_tensors, 0);
}

/*
 * A transaction holds at most REGISTRY_TX_MEMBERS_MAX changes: one more is
 * refused naming the transaction and the limit, and a full one still
 * commits (issue 30 item 2: reg_tx_get returned -E2BIG without setting its
 * transaction and the commit used it, uninitialised: a crash any uid made).
 */
static void test_full_transaction_commits(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	struct reg_tx *tx = (struct reg_tx *)&a; /* anything but NULL */
	struct tensor *t;
	uint64_t lease, commit;
	uint32_t published, unlinked;
	char limit[16];

	registry_client_init(&a, 1, 1000, 1000, 1);
	put(reg, &a, "full");
	/* A name staged twice is unlinked once: the cheapest way to fill it. */
	for (uint32_t i = 0; i < REGISTRY_TX_MEMBERS_MAX; i++)
		assert_int_equal(registry_tx_unlink(reg, &a, 5, "full", 4, why, sizeof(why)), 0);
	snprintf(limit, sizeof(limit), "%u", REGISTRY_TX_MEMBERS_MAX);
	assert_int_equal(registry_tx_unlink(reg, &a, 5, "full", 4, why, sizeof(why)), -E2BIG);
	assert_non_null(strstr(why, "transaction 5"));
	assert_non_null(strstr(why, limit));
	assert_int_equal(create(reg, &a, "more", 5, false, &t, &lease), -E2BIG);
	assert_non_null(strstr(why, "transaction 5"));
	assert_false(registry_published(reg, "more", 4));
	/* The contract: staging refused leaves *ret_tx NULL; ending finds it. */
	assert_int_equal(reg_tx_get(&a, 5, true, &tx, why, sizeof(why)), -E2BIG);
	assert_null(tx);
	assert_int_equal(reg_tx_get(&a, 5, false, &tx, why, sizeof(why)), 0);
	assert_non_null(tx);
	assert_int_equal(reg_tx_id(tx), 5);
	tx = (struct reg_tx *)&a;
	assert_int_equal(reg_tx_get(&a, 6, false, &tx, why, sizeof(why)), -ENOENT);
	assert_null(tx);
	heard.steps = 0;
	assert_int_equal(
		registry_tx_commit(reg, &a, 5, &commit, &published, &unlinked, why, sizeof(why)),
		0);
	assert_int_equal(published, 0);
	assert_int_equal(unlinked, 1);
	assert_int_equal(heard.steps, 1);
	assert_false(registry_published(reg, "full", 4));
	assert_int_equal(a.n_txs, 0);
	registry_client_gone(reg, &a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_generations_never_repeat, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_forgotten_names_start_above_the_floor, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_transaction_commits_in_one_step, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_abort_failure_and_crash_leave_no_trace, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_transactions_are_bounded, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_full_transaction_commits, setup,
						reg_fixture_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
