/*
 * Legacy IPC memory kept past its connection (issue 21): the registry's
 * holds (registry_client_hold(), registry_hold_end(): which leases they
 * take, what they keep charged, what their end frees) over a fake GPU
 * whose device 0 exports legacy IPC handles and device 1 VMM descriptors;
 * and the quarantine (quarantine.c), which ends a hold when the client's
 * process exits, watched through a pidfd or by its timer, over real child
 * processes and a loop of the test's own.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/base/log.h"
#include "daemon/quarantine.h"
#include "daemon/base/quota.h"
#include "daemon/registry/registry.h"
#include "registry_fixture.h"

/*
 * "cuda:0" hands out legacy IPC handles, "cuda:1" VMM descriptors; 2 MiB
 * granularity, no driver. It counts live allocations, so a test sees when
 * memory is really released.
 */
#define GRAN (2u << 20)
static int gpu_live;

static int gpu_init(char *err, size_t err_len)
{
	return 0;
}
static int gpu_count(void)
{
	return 2;
}
static int gpu_uuid(int dev, uint8_t uuid[16])
{
	memset(uuid, 0x20 + dev, 16);
	return 0;
}
static uint64_t gpu_capacity(int dev)
{
	return 64u << 20;
}
static const char *gpu_path(int dev)
{
	return dev == 0 ? "fake-ipc" : "fake-vmm";
}
static int gpu_alloc(struct backend_alloc *a, uint64_t size, int dev, const char *name)
{
	a->device_id = dev;
	a->fd = -1;
	a->size = (size + GRAN - 1) / GRAN * GRAN;
	a->footprint = a->size;
	a->handle_kind = dev == 0 ? TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC
				  : TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD;
	a->priv = malloc(1); /* ASan reports a lost one */
	gpu_live++;
	return 0;
}
static int gpu_export(struct backend_alloc *a, bool writable, int *fd)
{
	*fd = -1;
	return 0;
}
static int gpu_freeze(struct backend_alloc *a)
{
	return 0;
}
static void gpu_release(struct backend_alloc *a)
{
	if (!a->priv)
		return;
	free(a->priv);
	a->priv = NULL;
	gpu_live--;
}
static const struct backend_ops backend_fakegpu = {
	.name = "fakegpu",
	.device_type = kDLCUDA,
	.init = gpu_init,
	.device_count = gpu_count,
	.device_uuid = gpu_uuid,
	.default_capacity = gpu_capacity,
	.path = gpu_path,
	.alloc = gpu_alloc,
	.export_fd = gpu_export,
	.freeze = gpu_freeze,
	.release = gpu_release,
};

const struct backend_ops *const backends[] = { &backend_host, &backend_fakegpu, NULL };

static int setup(void **state)
{
	reg_fixture_setup(state, 1 << 20);
	gpu_live = 0;
	return 0;
}

static int teardown(void **state)
{
	reg_fixture_teardown(state);
	assert_int_equal(gpu_live, 0);
	return 0;
}

static struct reg_device *dev_of(struct registry *reg, int id)
{
	return registry_device(reg, (DLDevice){ kDLCUDA, id });
}

/* Creates name (n bytes) on cuda:dev for rc: its creator's lease in *lease. */
static struct tensor *create(struct registry *reg, struct reg_client *rc, const char *name, int dev,
			     int64_t n, uint64_t *lease)
{
	struct create_args a = reg_fixture_u8(name, &n, (DLDevice){ kDLCUDA, dev });
	struct tensor *t;

	a.mode = 0644;
	assert_int_equal(registry_create(reg, rc, &a, &t, lease, why, sizeof(why)), 0);
	return t;
}

static void publish(struct registry *reg, struct reg_client *rc, const char *name)
{
	assert_int_equal(registry_publish(reg, rc, name, strlen(name), NULL, why, sizeof(why)), 0);
}

static uint64_t attach(struct registry *reg, struct reg_client *rc, const char *name)
{
	struct tensor *t;
	uint64_t l;
	bool w;

	assert_int_equal(registry_attach(reg, rc, name, strlen(name), &t, &l, &w, why, sizeof(why)),
			 0);
	return l;
}

/* --- the registry's holds ---------------------------------------------------- */

/* Only legacy IPC leases are held; the rest end with the connection. */
static void test_hold_takes_legacy_ipc_leases_only(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	struct reg_hold *h;
	struct tensor *ipc, *vmm;
	uint64_t l;

	registry_client_init(&a, 7, 1000, 1000, 4242);
	/* Created and never published: they go with their creator's connection. */
	ipc = create(reg, &a, "ipc", 0, 3 << 20, &l);
	vmm = create(reg, &a, "vmm", 1, 1 << 20, &l);
	(void)vmm;
	assert_int_equal(gpu_live, 2);
	h = registry_client_hold(reg, &a);
	assert_non_null(h);
	assert_int_equal(h->n, 1);
	assert_ptr_equal(h->t[0], ipc);
	assert_int_equal(h->pid, 4242);
	assert_int_equal(h->uid, 1000);
	assert_int_equal(h->conn_id, 7);
	assert_int_equal(h->bytes, 4 << 20);
	assert_int_equal(a.n_leases, 1);
	assert_int_equal(reg->n_leases, 1);
	assert_int_equal(reg->n_holds, 1);
	assert_int_equal(dev_of(reg, 0)->quarantined, 4 << 20);
	registry_client_gone(reg, &a);
	/* The names went with the connection; the VMM memory too, the other kept. */
	assert_null(registry_lookup(reg, &a, "ipc", 3));
	assert_int_equal(gpu_live, 1);
	assert_int_equal(ipc->state, TENSORD_STATE_UNLINKED);
	assert_int_equal(ipc->refcount, 1);
	assert_int_equal(reg->n_tensors, 1);
	/* Still in use: charged to its device. */
	assert_int_equal(dev_of(reg, 0)->used, 4 << 20);
	assert_int_equal(dev_of(reg, 1)->used, 0);
	assert_int_equal(reg->n_leases, 0);
	/* Its process exited: freed. */
	registry_hold_end(reg, h);
	assert_int_equal(gpu_live, 0);
	assert_int_equal(reg->n_tensors, 0);
	assert_int_equal(reg->n_holds, 0);
	assert_int_equal(dev_of(reg, 0)->used, 0);
	assert_int_equal(dev_of(reg, 0)->quarantined, 0);

	/* A client with no legacy IPC lease holds nothing. */
	registry_client_init(&a, 8, 1000, 1000, 4243);
	create(reg, &a, "vmm", 1, 1, &l);
	assert_null(registry_client_hold(reg, &a));
	registry_client_gone(reg, &a);
	assert_int_equal(gpu_live, 0);
}

/* A tensor held twice, by a hold and by others: counted once, freed by the last. */
static void test_hold_among_other_references(void **state)
{
	struct registry *reg = *state;
	struct reg_client owner, reader, other;
	struct reg_hold *h, *h2;
	struct tensor *t;
	uint64_t lo, lr;

	registry_client_init(&owner, 1, 1000, 1000, 100);
	registry_client_init(&reader, 2, 1001, 1001, 200);
	registry_client_init(&other, 3, 1001, 1001, 300);
	t = create(reg, &owner, "w", 0, 1, &lo);
	publish(reg, &owner, "w");
	attach(reg, &reader, "w");
	attach(reg, &reader, "w");
	lr = attach(reg, &other, "w");
	h = registry_client_hold(reg, &reader);
	assert_int_equal(h->n, 2);
	assert_int_equal(t->holds, 2);
	assert_int_equal(dev_of(reg, 0)->quarantined, GRAN);
	registry_client_gone(reg, &reader);
	/* A second connection's hold on it adds no bytes to the quarantine. */
	h2 = registry_client_hold(reg, &owner);
	assert_int_equal(h2->n, 1);
	assert_int_equal(h2->bytes, 0);
	assert_int_equal(dev_of(reg, 0)->quarantined, GRAN);
	registry_client_gone(reg, &owner);
	/* Still named (published, not of connection lifetime). */
	assert_int_equal(t->state, TENSORD_STATE_PUBLISHED);
	registry_hold_end(reg, h);
	assert_int_equal(dev_of(reg, 0)->quarantined, GRAN);
	registry_hold_end(reg, h2);
	assert_int_equal(dev_of(reg, 0)->quarantined, 0);
	/* Unlinked with one lease left: that lease frees it. */
	assert_int_equal(registry_unlink(reg, &other, "w", 1, why, sizeof(why)), -EPERM);
	registry_client_init(&owner, 4, 1000, 1000, 100);
	assert_int_equal(registry_unlink(reg, &owner, "w", 1, why, sizeof(why)), 0);
	assert_int_equal(gpu_live, 1);
	assert_int_equal(registry_release(reg, &other, lr), 0);
	assert_int_equal(gpu_live, 0);
	registry_client_gone(reg, &other);
	registry_client_gone(reg, &owner);
}

/* Held memory stays charged: the owner's bytes while named, then the holder's pin. */
static void test_hold_keeps_the_charges(void **state)
{
	struct registry *reg = *state;
	struct quota_limits lim = { 0 };
	struct reg_client owner, reader;
	struct reg_hold *h;
	struct quota q;
	uint64_t lo;

	quota_default_limits(&lim, 1024, 64);
	quota_init(&q, &lim);
	reg->quota = &q;
	registry_client_init(&owner, 1, 1000, 1000, 100);
	registry_client_init(&reader, 2, 1001, 1001, 200);
	create(reg, &owner, "w", 0, 1, &lo);
	publish(reg, &owner, "w");
	assert_int_equal(registry_release(reg, &owner, lo), 0);
	attach(reg, &reader, "w");
	h = registry_client_hold(reg, &reader);
	registry_client_gone(reg, &reader);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], GRAN);
	/* Unlinked while held: its bytes pin the holder's uid, as a lease's would. */
	assert_int_equal(registry_unlink(reg, &owner, "w", 1, why, sizeof(why)), 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_BYTES], 0);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_PINNED], GRAN);
	assert_int_equal(gpu_live, 1);
	registry_hold_end(reg, h);
	assert_int_equal(quota_get(&q, 1001)->n[QUOTA_PINNED], 0);
	assert_int_equal(quota_get(&q, 1000)->n[QUOTA_TENSORS], 0);
	assert_int_equal(gpu_live, 0);
	registry_client_gone(reg, &owner);
	reg->quota = NULL;
	quota_fini(&q);
}

/* The daemon stops with a hold left: registry_fini() ends it (teardown checks the memory). */
static void test_fini_ends_holds(void **state)
{
	struct registry *reg = *state;
	struct reg_client a;
	uint64_t l;

	registry_client_init(&a, 1, 1000, 1000, 100);
	create(reg, &a, "x", 0, 1, &l);
	assert_non_null(registry_client_hold(reg, &a));
	registry_client_gone(reg, &a);
	assert_int_equal(gpu_live, 1);
}

/* --- the quarantine: processes watched until they exit ----------------------- */

struct child {
	pid_t pid;
};

/* A child process that lives until child_end() (or this process's end). */
static void child_start(struct child *c)
{
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (;;)
			pause();
	}
}

/* Ends the child; it stays a zombie until child_reap(). */
static void child_end(struct child *c)
{
	siginfo_t si;

	assert_int_equal(kill(c->pid, SIGKILL), 0);
	assert_int_equal(waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOWAIT), 0);
}

static void child_reap(struct child *c)
{
	assert_int_equal(waitpid(c->pid, NULL, 0), c->pid);
}

/* A hold of a new client of pid on a legacy IPC tensor of its own. */
static struct reg_hold *held_by(struct registry *reg, uint32_t pid, const char *name)
{
	struct reg_client a;
	struct reg_hold *h;
	uint64_t l;

	registry_client_init(&a, pid, 1000, 1000, pid);
	create(reg, &a, name, 0, 1, &l);
	h = registry_client_hold(reg, &a);
	assert_non_null(h);
	registry_client_gone(reg, &a);
	return h;
}

/* Runs the loop until the quarantine watches n processes, for at most about 5 s. */
static void run_until(uv_loop_t *loop, struct quarantine *q, unsigned n)
{
	for (int i = 0; i < 500 && q->n_procs != n; i++) {
		uv_run(loop, UV_RUN_NOWAIT);
		usleep(10000);
	}
	assert_int_equal(q->n_procs, n);
}

static void loop_close(uv_loop_t *loop, struct quarantine *q)
{
	quarantine_fini(q);
	uv_run(loop, UV_RUN_DEFAULT); /* the handles' close callbacks */
	assert_int_equal(uv_loop_close(loop), 0);
}

static int pidfd_of(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Watched through a pidfd, the caller's or one pidfd_open() makes. */
static void test_memory_waits_for_the_process(void **state)
{
	struct registry *reg = *state;
	struct quarantine q;
	struct child c, d;
	uv_loop_t loop;

	assert_int_equal(uv_loop_init(&loop), 0);
	quarantine_init(&q, &loop, reg, NULL);
	child_start(&c);
	child_start(&d);
	/* c: the caller has none (as on a kernel without SO_PEERPIDFD); d: the caller's. */
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "c"), -ENOPROTOOPT);
	quarantine_add(&q, held_by(reg, (uint32_t)d.pid, "d"), pidfd_of(d.pid));
	assert_int_equal(q.n_procs, 2);
	assert_int_equal(q.n_polled, 0);
	for (int i = 0; i < 5; i++)
		uv_run(&loop, UV_RUN_NOWAIT);
	assert_int_equal(gpu_live, 2);
	assert_int_equal(dev_of(reg, 0)->quarantined, 2 * GRAN);
	/* An exited process (a zombie, not yet reaped): its memory goes. */
	child_end(&c);
	run_until(&loop, &q, 1);
	assert_int_equal(gpu_live, 1);
	assert_int_equal(dev_of(reg, 0)->quarantined, GRAN);
	child_end(&d);
	run_until(&loop, &q, 0);
	assert_int_equal(gpu_live, 0);
	assert_int_equal(reg->n_holds, 0);
	child_reap(&c);
	child_reap(&d);
	loop_close(&loop, &q);
}

/* Without a pidfd, the timer looks at /proc and kill(): a zombie has exited. */
static void test_memory_waits_for_the_process_without_pidfd(void **state)
{
	struct registry *reg = *state;
	struct quarantine q;
	struct child c;
	uv_loop_t loop;

	assert_int_equal(uv_loop_init(&loop), 0);
	quarantine_init(&q, &loop, reg, NULL);
	q.no_pidfd = true;
	child_start(&c);
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "c"), pidfd_of(c.pid));
	assert_int_equal(q.n_procs, 1);
	assert_int_equal(q.n_polled, 1);
	uv_run(&loop, UV_RUN_NOWAIT);
	assert_int_equal(gpu_live, 1);
	child_end(&c);
	/* The next tick, within QUARANTINE_POLL_MS. */
	run_until(&loop, &q, 0);
	assert_int_equal(q.n_polled, 0);
	assert_int_equal(gpu_live, 0);
	child_reap(&c);
	loop_close(&loop, &q);
}

/* Two connections of one process: one watch, whose exit ends both holds. */
static void test_one_watch_per_process(void **state)
{
	struct registry *reg = *state;
	struct quarantine q;
	struct child c;
	uv_loop_t loop;

	assert_int_equal(uv_loop_init(&loop), 0);
	quarantine_init(&q, &loop, reg, NULL);
	child_start(&c);
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "a"), -ENOPROTOOPT);
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "b"), pidfd_of(c.pid));
	assert_int_equal(q.n_procs, 1);
	assert_int_equal(reg->n_holds, 2);
	assert_int_equal(gpu_live, 2);
	child_end(&c);
	run_until(&loop, &q, 0);
	assert_int_equal(reg->n_holds, 0);
	assert_int_equal(gpu_live, 0);
	child_reap(&c);
	loop_close(&loop, &q);
}

/* A process gone already, or one that cannot be watched: the memory goes at once. */
static void test_gone_already(void **state)
{
	struct registry *reg = *state;
	struct quarantine q;
	struct child c;
	uv_loop_t loop;
	int pidfd;

	assert_int_equal(uv_loop_init(&loop), 0);
	quarantine_init(&q, &loop, reg, NULL);
	/* Exited, not reaped: the socket's pidfd is readable at once. */
	child_start(&c);
	pidfd = pidfd_of(c.pid);
	child_end(&c);
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "z"), pidfd);
	assert_int_equal(q.n_procs, 0);
	assert_int_equal(gpu_live, 0);
	/* Reaped: no such process. */
	child_reap(&c);
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "r"), -ESRCH);
	assert_int_equal(q.n_procs, 0);
	assert_int_equal(gpu_live, 0);
	/* The same by the timer's way. */
	q.no_pidfd = true;
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "p"), -ENOPROTOOPT);
	assert_int_equal(q.n_procs, 0);
	assert_int_equal(q.n_polled, 0);
	assert_int_equal(gpu_live, 0);
	/* pid 0 (another pid namespace) and no pidfd: nothing to watch. */
	quarantine_add(&q, held_by(reg, 0, "ns"), -ENOPROTOOPT);
	assert_int_equal(q.n_procs, 0);
	assert_int_equal(gpu_live, 0);
	assert_int_equal(reg->n_holds, 0);
	loop_close(&loop, &q);
}

/* The daemon stops: every hold ends at once, live processes or not. */
static void test_fini_ends_every_quarantine(void **state)
{
	struct registry *reg = *state;
	struct quarantine q;
	struct child c, d;
	uv_loop_t loop;

	assert_int_equal(uv_loop_init(&loop), 0);
	quarantine_init(&q, &loop, reg, NULL);
	child_start(&c);
	child_start(&d);
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "c"), -ENOPROTOOPT);
	q.no_pidfd = true;
	quarantine_add(&q, held_by(reg, (uint32_t)d.pid, "d"), -ENOPROTOOPT);
	assert_int_equal(q.n_procs, 2);
	assert_int_equal(gpu_live, 2);
	quarantine_fini(&q);
	assert_int_equal(q.n_procs, 0);
	assert_int_equal(gpu_live, 0);
	/* Later adds end at once. */
	quarantine_add(&q, held_by(reg, (uint32_t)c.pid, "late"), -ENOPROTOOPT);
	assert_int_equal(gpu_live, 0);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
	child_end(&c);
	child_end(&d);
	child_reap(&c);
	child_reap(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hold_takes_legacy_ipc_leases_only, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_hold_among_other_references, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hold_keeps_the_charges, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fini_ends_holds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memory_waits_for_the_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memory_waits_for_the_process_without_pidfd,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_one_watch_per_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gone_already, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fini_ends_every_quarantine, setup, teardown),
	};

	log_level = TD_LOG_WARN;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
