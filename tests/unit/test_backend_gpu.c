/*
 * Unit tests for the daemon's GPU backends (gpu/cuda/backend_cuda.c,
 * gpu/hip/backend_hip.c) on a machine without a GPU: init says -ENODEV and why,
 * every other call on a backend without devices fails cleanly or does
 * nothing, and every ops table is complete. Where a driver is present the
 * driver-free cases are skipped through cmocka with the reason; the GPU
 * behaviour itself is covered by tests/gpu/run.sh. Then, against fake
 * driver tables (fake_gpu.h), the call sequences: allocation, zeroing,
 * export, free (on the GPU worker's thread), the primary context dropped
 * with the last tensor (hold 0) or kept for --gpu-context-hold after it and
 * released at the stop, and the daemon's ordinal found from a client's UUID.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/cuda/cuda_api.h"
#include "gpu/hip/hip_api.h"
#include "daemon/memory/backend.h"
#include "daemon/memory/gpu_worker.h"
#include "gpu/cuda/nvml.h" /* before fake_gpu.h: its NVML fake too */
#include "fake_gpu.h"

#define MiB (1ull << 20)

static bool have_libcuda(void)
{
	void *h = dlopen(TD_CUDA_LIBNAME, RTLD_NOW | RTLD_LOCAL);

	if (h)
		dlclose(h);
	return h != NULL;
}

/* Checks what every backend must do whether or not init succeeded. */
static void check_backend_without_devices(const struct backend_ops *ops)
{
	struct backend_alloc a;
	uint8_t uuid[16];
	int fd = 123;

	assert_int_equal(ops->device_count(), 0);
	assert_int_equal(ops->device_uuid(0, uuid), -ENODEV);
	assert_string_equal(ops->path(0), "none");
	assert_int_equal(ops->default_capacity(0), 0);
	memset(&a, 0, sizeof(a));
	a.ops = ops;
	assert_int_equal(ops->alloc(&a, 4096, 0, "t"), -ENODEV);
	assert_int_equal(a.fd, -1);
	/* export_fd and freeze on a half-built allocation, then release. */
	assert_int_equal(ops->export_fd(&a, false, &fd), 0);
	assert_int_equal(fd, -1);
	assert_int_equal(ops->freeze(&a), 0);
	ops->release(&a);
	assert_null(a.priv);
}

static void test_cuda_init_without_driver(void **state)
{
	char why[160] = "";
	int rc;

	rc = backend_cuda.init(why, sizeof(why));
	if (have_libcuda()) {
		print_message("      skipped: %s loads here; init returned %d (%s); "
			      "tests/gpu/run.sh covers the driver\n",
			      TD_CUDA_LIBNAME, rc, why);
		assert_true(rc == 0 || rc == -ENODEV);
		backend_cuda.fini();
		skip();
	}
	assert_int_equal(rc, -ENODEV);
	assert_non_null(strstr(why, "libcuda"));
	check_backend_without_devices(&backend_cuda);
}

static void test_hip_init_without_device(void **state)
{
	char why[160] = "";
	int rc;

	rc = backend_hip.init(why, sizeof(why));
	if (access(td_hip_kfd_path(), F_OK) == 0) {
		print_message("      skipped: %s exists here; init returned %d (%s)\n",
			      td_hip_kfd_path(), rc, why);
		assert_true(rc == 0 || rc == -ENODEV);
		backend_hip.fini();
		skip();
	}
	assert_int_equal(rc, -ENODEV);
	assert_non_null(strstr(why, td_hip_kfd_path()));
	assert_non_null(strstr(why, "libamdhip64"));
	check_backend_without_devices(&backend_hip);
}

static void check_ops_complete(const struct backend_ops *ops, const char *name, int device_type)
{
	assert_string_equal(ops->name, name);
	assert_int_equal(ops->device_type, device_type);
	assert_non_null(ops->init);
	assert_non_null(ops->device_count);
	assert_non_null(ops->device_uuid);
	assert_non_null(ops->default_capacity);
	assert_non_null(ops->path);
	assert_non_null(ops->alloc);
	assert_non_null(ops->export_fd);
	assert_non_null(ops->freeze);
	assert_non_null(ops->release);
}

static void test_backend_tables_complete(void **state)
{
	check_ops_complete(&backend_cuda, "cuda", kDLCUDA);
	check_ops_complete(&backend_hip, "hip", kDLROCM);
}

static int fake_setup(void **state)
{
	char why[160] = "";

	/* Contexts go with the last tensor unless a test holds them (--gpu-context-hold). */
	backend_gpu_set_context_hold(0);
	fake_gpu_install(2);
	unsetenv("TENSORD_CUDA_PATH");
	assert_int_equal(backend_cuda.init(why, sizeof(why)), 0);
	assert_int_equal(backend_hip.init(why, sizeof(why)), 0);
	fake_n = 0;
	return 0;
}

static int fake_teardown(void **state)
{
	gpu_worker_set_clock(NULL);
	backend_cuda.fini();
	backend_hip.fini();
	fake_gpu_remove();
	unsetenv("TENSORD_CUDA_PATH");
	return 0;
}

/* Checks that the calls named in want happened in this order (others between them allowed). */
/* Open descriptors of this process. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	assert_non_null(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static void assert_calls_in_order(const char *const *want)
{
	int at = 0;

	for (int i = 0; want[i]; i++) {
		int k = fake_find(want[i], at);

		if (k < 0)
			fail_msg("no %s after call %d", want[i], at);
		at = k + 1;
	}
}

static void test_uuid_to_daemon_ordinal(void **state)
{
	uint8_t u[16], other[16];

	assert_int_equal(backend_cuda.device_count(), 2);
	assert_int_equal(backend_cuda.device_uuid(1, u), 0);
	assert_memory_equal(u, fake_uuid[1], 16);
	assert_int_equal(backend_ordinal_of_uuid(&backend_cuda, fake_uuid[1], 16), 1);
	assert_int_equal(backend_ordinal_of_uuid(&backend_cuda, fake_uuid[0], 16), 0);
	memset(other, 0xEE, sizeof(other));
	assert_int_equal(backend_ordinal_of_uuid(&backend_cuda, other, 16), -ENODEV);
	assert_int_equal(backend_ordinal_of_uuid(&backend_cuda, fake_uuid[1], 15), -ENODEV);
	assert_int_equal(backend_ordinal_of_uuid(&backend_hip, fake_uuid[1], 16), 1);
	assert_string_equal(backend_cuda.path(1), "cuda-vmm");
}

static void test_cuda_vmm_alloc_and_context(void **state)
{
	static const char *const alloc_calls[] = {
		"cuDevicePrimaryCtxRetain",
		"cuCtxSetCurrent",
		"cuMemCreate",
		"cuMemAddressReserve",
		"cuMemMap",
		"cuMemSetAccess",
		"cuMemsetD8",
		"cuCtxSynchronize",
		"cuMemUnmap",
		"cuMemAddressFree",
		"cuMemExportToShareableHandle",
		NULL,
	};
	struct backend_alloc a = { .ops = &backend_cuda }, b = { .ops = &backend_cuda };
	int fd = -1, fd2 = -1, k, fds = count_fds();
	struct stat st1, st2;

	assert_int_equal(backend_cuda.alloc(&a, 1, 1, "t"), 0);
	assert_calls_in_order(alloc_calls);
	assert_int_equal(a.handle_kind, TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD);
	assert_int_equal(a.size, 2 * MiB);
	k = fake_find("cuMemCreate", 0);
	assert_int_equal(fake_log[k].a[0], 2 * MiB);
	assert_int_equal(fake_log[k].a[1], FAKE_DEV0 + 1);
	assert_int_equal(fake_log[fake_find("cuDevicePrimaryCtxRetain", 0)].a[0], FAKE_DEV0 + 1);
	/* The whole allocation is zeroed, and waited for. */
	assert_int_equal(fake_log[fake_find("cuMemsetD8", 0)].a[2], 2 * MiB);
	/* Exported once, with the memory; each lease gets a copy, no driver call. */
	assert_int_equal(fake_count("cuMemExportToShareableHandle"), 1);
	fake_n = 0;
	assert_int_equal(backend_cuda.export_fd(&a, false, &fd), 0);
	assert_int_equal(backend_cuda.export_fd(&a, true, &fd2), 0);
	assert_int_equal(fake_n, 0);
	assert_true(fd >= 0 && fd2 >= 0 && fd != fd2);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	assert_int_equal(fstat(fd, &st1), 0);
	assert_int_equal(fstat(fd2, &st2), 0);
	assert_true(st1.st_dev == st2.st_dev && st1.st_ino == st2.st_ino);
	close(fd);
	close(fd2);

	/* A second tensor on the same device shares the retained context. */
	assert_int_equal(backend_cuda.alloc(&b, 3 * MiB, 1, "u"), 0);
	assert_int_equal(b.size, 4 * MiB);
	assert_int_equal(fake_count("cuMemCreate"), 1);
	assert_int_equal(fake_count("cuDevicePrimaryCtxRetain"), 0);
	backend_cuda.release(&a);
	gpu_worker_drain();
	assert_int_equal(fake_count("cuMemRelease"), 1);
	assert_int_equal(fake_count("cuDevicePrimaryCtxRelease"), 0);
	/* The last one gives the context (and its GPU memory) back. */
	fake_n = 0;
	backend_cuda.release(&b);
	gpu_worker_drain();
	assert_calls_in_order((const char *const[]){ "cuCtxSetCurrent", "cuMemRelease",
						     "cuDevicePrimaryCtxRelease", NULL });
	k = fake_find("cuDevicePrimaryCtxRelease", 0);
	assert_int_equal(fake_log[k].a[0], FAKE_DEV0 + 1);
	/* Both on the GPU worker: the loop thread never waits for a free. */
	assert_false(pthread_equal(fake_log[k].tid, pthread_self()));
	assert_false(pthread_equal(fake_log[fake_find("cuMemRelease", 0)].tid, pthread_self()));
	/* And the next allocation retains it again. */
	fake_n = 0;
	assert_int_equal(backend_cuda.alloc(&a, 1, 1, "t"), 0);
	assert_int_equal(fake_count("cuDevicePrimaryCtxRetain"), 1);
	backend_cuda.release(&a);
	gpu_worker_drain();
	assert_int_equal(fake_count("cuDevicePrimaryCtxRelease"), 1);
	/* The kept exports went with their memory. */
	assert_int_equal(count_fds(), fds);
}

static void test_cuda_ipc_alloc(void **state)
{
	static const char *const alloc_calls[] = {
		"cuDevicePrimaryCtxRetain", "cuMemAlloc",        "cuMemsetD8",
		"cuCtxSynchronize",         "cuIpcGetMemHandle", NULL,
	};
	struct backend_alloc a = { .ops = &backend_cuda };
	char why[160];
	int fd = 5;

	backend_cuda.fini();
	setenv("TENSORD_CUDA_PATH", "ipc", 1);
	assert_int_equal(backend_cuda.init(why, sizeof(why)), 0);
	assert_string_equal(backend_cuda.path(0), "cuda-ipc");
	fake_n = 0;
	assert_int_equal(backend_cuda.alloc(&a, 100, 0, "t"), 0);
	assert_calls_in_order(alloc_calls);
	assert_int_equal(a.handle_kind, TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC);
	assert_int_equal(a.ipc_handle_len, 64);
	assert_int_equal(a.ipc_handle[0], 0x5a);
	assert_int_equal(backend_cuda.export_fd(&a, false, &fd), 0);
	assert_int_equal(fd, -1);
	fake_n = 0;
	backend_cuda.release(&a);
	gpu_worker_drain();
	assert_calls_in_order(
		(const char *const[]){ "cuMemFree", "cuDevicePrimaryCtxRelease", NULL });
	assert_false(pthread_equal(fake_log[fake_find("cuMemFree", 0)].tid, pthread_self()));
}

/* Zero-size: no driver call, nothing to map, the daemon's ordinal kept. */
static void test_zero_size_allocs(void **state)
{
	struct backend_alloc a = { .ops = &backend_cuda }, h = { .ops = &backend_hip };

	assert_int_equal(backend_cuda.alloc(&a, 0, 1, "z"), 0);
	assert_int_equal(backend_hip.alloc(&h, 0, 1, "z"), 0);
	assert_int_equal(fake_n, 0);
	assert_int_equal(a.handle_kind, TENSORD__HANDLE_KIND__HANDLE_NONE);
	assert_int_equal(h.handle_kind, TENSORD__HANDLE_KIND__HANDLE_NONE);
	assert_int_equal(a.device_id, 1);
	backend_cuda.release(&a);
	backend_hip.release(&h);
	assert_int_equal(fake_n, 0);
}

static void test_hip_alloc(void **state)
{
	static const char *const alloc_calls[] = {
		"hipSetDevice",         "hipMalloc",          "hipMemset",
		"hipDeviceSynchronize", "hipIpcGetMemHandle", NULL,
	};
	struct backend_alloc a = { .ops = &backend_hip };
	int k;

	assert_int_equal(backend_hip.alloc(&a, 100, 1, "t"), 0);
	assert_calls_in_order(alloc_calls);
	assert_int_equal(fake_log[0].a[0], 1);
	assert_int_equal(fake_log[fake_find("hipMalloc", 0)].a[1], 2 * MiB);
	assert_int_equal(a.handle_kind, TENSORD__HANDLE_KIND__HANDLE_HIP_IPC);
	fake_n = 0;
	backend_hip.release(&a);
	gpu_worker_drain();
	k = fake_find("hipFree", 0);
	assert_true(k > 0);
	assert_int_equal(fake_log[k].a[1], 1); /* on its own device */
	assert_false(pthread_equal(fake_log[k].tid, pthread_self()));
}

/* What a worker timer saw: how often it ran, and on which thread. */
struct timer_probe {
	int runs;
	pthread_t tid;
};

static void timer_probe_run(void *arg)
{
	struct timer_probe *p = arg;

	p->tid = pthread_self();
	__atomic_add_fetch(&p->runs, 1, __ATOMIC_SEQ_CST);
}

/*
 * gpu_worker_run_after(): a timer runs once, on the worker, when it falls
 * due; gpu_worker_drain() does not wait for it; gpu_worker_stop() drops a
 * timer not yet due without running it.
 */
static void test_worker_timers(void **state)
{
	struct timer_probe soon = { 0 }, late = { 0 };

	assert_int_equal(gpu_worker_run_after(60000ull * 1000000, timer_probe_run, &late), 0);
	assert_int_equal(gpu_worker_run_after(20ull * 1000000, timer_probe_run, &soon), 0);
	gpu_worker_drain();
	for (int i = 0; i < 500 && !__atomic_load_n(&soon.runs, __ATOMIC_SEQ_CST); i++)
		usleep(10000);
	gpu_worker_stop();
	assert_int_equal(soon.runs, 1);
	assert_false(pthread_equal(soon.tid, pthread_self()));
	assert_int_equal(late.runs, 0);
}

/* What an asynchronous create does (dispatch.c): alloc() as a job on the worker. */
struct alloc_job {
	struct backend_alloc a;
	int rc;
	pthread_t done_on;
	int done;
};

static void alloc_job_run(void *arg)
{
	struct alloc_job *j = arg;

	j->rc = backend_cuda.alloc(&j->a, 5 * MiB, 0, "async");
}

static void alloc_job_done(void *arg)
{
	struct alloc_job *j = arg;

	j->done_on = pthread_self();
	j->done++;
}

/* The index of the last call named fn made by thread tid, or -1. */
static int last_call_by(const char *fn, pthread_t tid)
{
	for (int i = fake_n - 1; i >= 0; i--)
		if (strcmp(fake_log[i].fn, fn) == 0 && pthread_equal(fake_log[i].tid, tid))
			return i;
	return -1;
}

/*
 * The blocking calls of an allocation (the context, cuMemCreate, the
 * zeroing and its synchronize) run on the worker; its completion runs where
 * gpu_worker_complete() is called; the loop's export leaves no context
 * current behind, and neither does the worker.
 */
static void test_cuda_alloc_on_the_worker(void **state)
{
	static const char *const blocking[] = { "cuDevicePrimaryCtxRetain", "cuMemCreate",
						"cuMemsetD8", "cuCtxSynchronize", NULL };
	struct alloc_job j = { .a = { .ops = &backend_cuda } };
	int fd = -1, k;

	assert_int_equal(gpu_worker_submit(alloc_job_run, alloc_job_done, &j), 0);
	gpu_worker_drain();
	/* Finished, but its completion waits for the loop. */
	assert_int_equal(j.done, 0);
	assert_int_equal(gpu_worker_complete(), 1);
	assert_int_equal(j.done, 1);
	assert_true(pthread_equal(j.done_on, pthread_self()));
	assert_int_equal(j.rc, 0);
	assert_int_equal(j.a.size, 6 * MiB);
	for (int i = 0; blocking[i]; i++) {
		k = fake_find(blocking[i], 0);
		assert_true(k >= 0);
		assert_false(pthread_equal(fake_log[k].tid, pthread_self()));
	}
	k = last_call_by("cuCtxSetCurrent", fake_log[fake_find("cuMemCreate", 0)].tid);
	assert_int_equal(fake_log[k].a[0], 0);
	/* The export is made on the worker with the memory ... */
	k = fake_find("cuMemExportToShareableHandle", 0);
	assert_true(k >= 0);
	assert_false(pthread_equal(fake_log[k].tid, pthread_self()));
	/* ... so a lease's copy, on this ("loop") thread, makes no driver call. */
	fake_n = 0;
	assert_int_equal(backend_cuda.export_fd(&j.a, false, &fd), 0);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(fake_n, 0);
	backend_cuda.release(&j.a);
	gpu_worker_drain();
	assert_int_equal(fake_count("cuDevicePrimaryCtxRelease"), 1);
	assert_int_equal(gpu_worker_complete(), 0);
}

/* fake_count() while the worker may be recording calls. */
static int count_locked(const char *fn)
{
	int n;

	pthread_mutex_lock(&fake_lock);
	n = fake_count(fn);
	pthread_mutex_unlock(&fake_lock);
	return n;
}

/* The worker's clock in the hold tests: it moves only when advance_ms() says. */
static _Atomic uint64_t fake_ns = 1000000000ull;

static uint64_t fake_clock(void)
{
	return fake_ns;
}

/* The clock moves on ms; the timers due by then run before this returns. */
static void advance_ms(unsigned ms)
{
	fake_ns += ms * 1000000ull;
	gpu_worker_set_clock(fake_clock);
	gpu_worker_drain();
}

/*
 * With a hold, the device's context outlives its last tensor: a burst of
 * creates and frees retains it once and releases it never, stats count it
 * while it is held, and the stop releases it, on the worker.
 */
static void test_cuda_context_held_between_bursts(void **state)
{
	struct backend_alloc a = { .ops = &backend_cuda }, b = { .ops = &backend_cuda };
	int k;

	backend_gpu_set_context_hold(60000);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(backend_cuda.alloc(&a, 1, 1, "a"), 0);
		backend_cuda.release(&a);
		gpu_worker_drain();
	}
	assert_int_equal(backend_cuda.alloc(&b, 3 * MiB, 1, "b"), 0);
	assert_int_equal(fake_count("cuDevicePrimaryCtxRetain"), 1);
	assert_int_equal(fake_count("cuMemCreate"), 4);
	assert_int_equal(backend_cuda.gpu_bytes(1), FAKE_CTX_BYTES + 4 * MiB);
	backend_cuda.release(&b);
	gpu_worker_drain();
	assert_int_equal(fake_count("cuMemRelease"), 4);
	assert_int_equal(fake_count("cuDevicePrimaryCtxRelease"), 0);
	/* Held idle: still memory the daemon costs the GPU. */
	assert_int_equal(backend_cuda.gpu_bytes(1), FAKE_CTX_BYTES);
	assert_int_equal(fake_ctx_refs[1], 1);
	/* No context left current on the worker meanwhile. */
	k = last_call_by("cuCtxSetCurrent", fake_log[fake_find("cuMemRelease", 0)].tid);
	assert_int_equal(fake_log[k].a[0], 0);

	/* The stop does not wait for the hold: the context goes, on the worker. */
	backend_cuda.fini();
	assert_int_equal(fake_count("cuDevicePrimaryCtxRelease"), 1);
	k = fake_find("cuDevicePrimaryCtxRelease", 0);
	assert_int_equal(fake_log[k].a[0], FAKE_DEV0 + 1);
	assert_false(pthread_equal(fake_log[k].tid, pthread_self()));
	assert_int_equal(fake_ctx_refs[1], 0);
	assert_int_equal(fake_ctx_refs[0], 0);
}

/*
 * After the hold passes with no tensor on the device, exactly one release,
 * on the worker; a create and free in the meantime start the hold again.
 */
static void test_cuda_context_released_after_the_hold(void **state)
{
	struct backend_alloc a = { .ops = &backend_cuda };
	struct fake_call released;
	int k, refs;

	gpu_worker_set_clock(fake_clock);
	backend_gpu_set_context_hold(400);
	assert_int_equal(backend_cuda.alloc(&a, 1, 0, "a"), 0);
	backend_cuda.release(&a);
	gpu_worker_drain();
	advance_ms(250);
	/* A second burst within the hold: the same context, and the hold starts over. */
	assert_int_equal(backend_cuda.alloc(&a, 1, 0, "a"), 0);
	backend_cuda.release(&a);
	gpu_worker_drain();
	assert_int_equal(count_locked("cuDevicePrimaryCtxRetain"), 1);
	advance_ms(250);
	/* 500 ms after the first free (its timer ran), 250 after the last: still held. */
	assert_int_equal(count_locked("cuDevicePrimaryCtxRelease"), 0);
	assert_int_equal(backend_cuda.gpu_bytes(0), FAKE_CTX_BYTES);
	advance_ms(149);
	assert_int_equal(count_locked("cuDevicePrimaryCtxRelease"), 0);
	/* 400 ms after the last free: released. */
	advance_ms(1);
	assert_int_equal(count_locked("cuDevicePrimaryCtxRelease"), 1);
	/* Nothing more, however long it stays idle. */
	advance_ms(60000);
	pthread_mutex_lock(&fake_lock);
	k = fake_find("cuDevicePrimaryCtxRelease", 0);
	released = fake_log[k];
	refs = fake_ctx_refs[0];
	pthread_mutex_unlock(&fake_lock);
	assert_int_equal(count_locked("cuDevicePrimaryCtxRelease"), 1);
	assert_int_equal(released.a[0], FAKE_DEV0 + 0);
	assert_false(pthread_equal(released.tid, pthread_self()));
	assert_int_equal(refs, 0);
	assert_int_equal(backend_cuda.gpu_bytes(0), 0);
	/* The next create makes a new one. */
	assert_int_equal(backend_cuda.alloc(&a, 1, 0, "a"), 0);
	assert_int_equal(count_locked("cuDevicePrimaryCtxRetain"), 2);
	backend_cuda.release(&a);
	gpu_worker_drain();
	/* Hold 0: released with the last tensor, as without a hold. */
	backend_gpu_set_context_hold(0);
	assert_int_equal(backend_cuda.alloc(&a, 1, 0, "a"), 0);
	backend_cuda.release(&a);
	gpu_worker_drain();
	assert_int_equal(count_locked("cuDevicePrimaryCtxRetain"), 2);
	assert_int_equal(count_locked("cuDevicePrimaryCtxRelease"), 1);
}

/* NVML's fake lists no process: as for a daemon in a pid namespace of its own. */
static nvmlReturn_t no_processes(nvmlDevice_t dev, unsigned int *n, td_nvml_process_info *infos)
{
	*n = 0;
	return TD_NVML_SUCCESS;
}

/*
 * stats' per-device GPU memory: the context, as NVML counted the daemon
 * when it was made, plus the live allocations; 0 once the last tensor took
 * the context with it, and 0 (unknown) when NVML does not list the daemon
 * although it holds a context.
 */
static void test_cuda_gpu_bytes_include_the_context(void **state)
{
	struct backend_alloc a = { .ops = &backend_cuda }, b = { .ops = &backend_cuda };
	struct td_nvml_api blind = fake_nvml;

	assert_non_null(backend_cuda.gpu_bytes);
	assert_int_equal(backend_cuda.gpu_bytes(1), 0);
	assert_int_equal(backend_cuda.alloc(&a, 5 * MiB, 1, "a"), 0);
	assert_int_equal(backend_cuda.gpu_bytes(1), FAKE_CTX_BYTES + 6 * MiB);
	assert_int_equal(backend_cuda.gpu_bytes(0), 0);
	assert_int_equal(backend_cuda.alloc(&b, 1, 1, "b"), 0);
	assert_int_equal(backend_cuda.gpu_bytes(1), FAKE_CTX_BYTES + 8 * MiB);
	backend_cuda.release(&a);
	gpu_worker_drain();
	assert_int_equal(backend_cuda.gpu_bytes(1), FAKE_CTX_BYTES + 2 * MiB);
	backend_cuda.release(&b);
	gpu_worker_drain();
	assert_int_equal(fake_count("cuDevicePrimaryCtxRelease"), 1);
	assert_int_equal(backend_cuda.gpu_bytes(1), 0);
	/* NVML was asked once, as the context was made: not per allocation. */
	assert_int_equal(fake_count("nvmlDeviceGetComputeRunningProcesses"), 1);

	blind.DeviceGetComputeRunningProcesses = no_processes;
	td_nvml_api_use(&blind);
	assert_int_equal(backend_cuda.alloc(&a, 1, 1, "a"), 0);
	assert_int_equal(backend_cuda.gpu_bytes(1), 0);
	backend_cuda.release(&a);
	gpu_worker_drain();
	td_nvml_api_use(&fake_nvml);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cuda_init_without_driver),
		cmocka_unit_test(test_hip_init_without_device),
		cmocka_unit_test(test_backend_tables_complete),
		cmocka_unit_test(test_worker_timers),
		cmocka_unit_test_setup_teardown(test_uuid_to_daemon_ordinal, fake_setup,
						fake_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_vmm_alloc_and_context, fake_setup,
						fake_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_ipc_alloc, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_zero_size_allocs, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_hip_alloc, fake_setup, fake_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_alloc_on_the_worker, fake_setup,
						fake_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_gpu_bytes_include_the_context, fake_setup,
						fake_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_context_held_between_bursts, fake_setup,
						fake_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_context_released_after_the_hold,
						fake_setup, fake_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
