/*
 * The C GPU suite: a real daemon, real client processes, real CUDA memory.
 * Needs an NVIDIA GPU; built and run by tests/gpu/run.sh, which links it
 * with libcuda directly (this program is a user of tensord, not part of
 * it, so it checks the bytes with its own driver calls).
 *
 *   gpu_suite PATH/TO/tensord       run everything; exit 0 when all passed
 *
 * The same binary, re-executed with a role, plays the other processes:
 *   --reader SOCKET                 line commands on stdin (see reader())
 *   --hold SOCKET NAME N            attach NAME N times, say "held", sleep
 *   --churn SOCKET NAME             attach/release NAME forever
 *   --bench SOCKET NAME N           print median cold and warm attach in us
 *   --creator-writes SOCKET NAME    create, fill, publish, then write again
 *   --close-live SOCKET NAME SEED   attach, tensord_close() with the lease
 *                                   alive, then check what the handle is
 * Roles are started with posix_spawn (fork + exec), never plain fork:
 * CUDA does not survive fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include <tensord/tensord.h>

extern char **environ;

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("FAIL %s:%d: %s: ", __func__, __LINE__, #cond);                     \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			failures++;                                                                \
			return;                                                                    \
		}                                                                                  \
	} while (0)

#define CU(call)                                                                                   \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS) {                                                          \
			const char *s_ = "?";                                                      \
			cuGetErrorName(r_, &s_);                                                   \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_);         \
			exit(3);                                                                   \
		}                                                                                  \
	} while (0)

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void cuda_enter(int ordinal)
{
	CUdevice dev;
	CUcontext ctx;

	CU(cuInit(0));
	CU(cuDeviceGet(&dev, ordinal));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
}

static uint8_t pattern(size_t i, int seed)
{
	return (uint8_t)(i * 131u + (unsigned)seed * 7u);
}

static CUdeviceptr dptr_of(const DLManagedTensorVersioned *t)
{
	return (CUdeviceptr)(uintptr_t)t->dl_tensor.data + t->dl_tensor.byte_offset;
}

static void fill(const DLManagedTensorVersioned *t, size_t n, int seed)
{
	uint8_t *buf = malloc(n);

	for (size_t i = 0; i < n; i++)
		buf[i] = pattern(i, seed);
	CU(cuMemcpyHtoD(dptr_of(t), buf, n));
	/* The stream contract: work is complete before the tensor is published. */
	CU(cuCtxSynchronize());
	free(buf);
}

/* 0 when the n bytes at t are pattern(seed); else the first bad index + 1. */
static size_t verify(const DLManagedTensorVersioned *t, size_t n, int seed)
{
	uint8_t *buf = malloc(n);
	size_t bad = 0;

	CU(cuMemcpyDtoH(buf, dptr_of(t), n));
	for (size_t i = 0; i < n && !bad; i++)
		if (buf[i] != pattern(i, seed))
			bad = i + 1;
	free(buf);
	return bad;
}

static size_t nbytes_of(const DLManagedTensorVersioned *t)
{
	size_t n = (size_t)(t->dl_tensor.dtype.bits / 8) * t->dl_tensor.dtype.lanes;

	for (int i = 0; i < t->dl_tensor.ndim; i++)
		n *= (size_t)t->dl_tensor.shape[i];
	return n;
}

static tensord_client *connect_or_die(const char *sock)
{
	tensord_client *c;
	int r = tensord_connect(sock, &c);

	if (r < 0) {
		fprintf(stderr, "connect %s: %s\n", sock, tensord_last_error());
		exit(2);
	}
	return c;
}

/* ---- roles --------------------------------------------------------------- */

/* The UUID of this process's CUDA device ordinal, as 32 hex digits. */
static const char *uuid_hex(int ordinal)
{
	static char hex[33];
	CUdevice dev;
	CUuuid u;

	CU(cuDeviceGet(&dev, ordinal));
	CU(cuDeviceGetUuid(&u, dev));
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", (uint8_t)u.bytes[i]);
	return hex;
}

/* Writes 0xff over t on the device and waits: "ok wrote" or "denied ERROR". */
static void try_write(const DLManagedTensorVersioned *t, size_t n, char *out, size_t len)
{
	const char *name = "?";
	CUresult r;

	r = cuMemsetD8(dptr_of(t), 0xff, n);
	if (r == CUDA_SUCCESS)
		r = cuCtxSynchronize();
	if (r == CUDA_SUCCESS) {
		snprintf(out, len, "ok wrote");
		return;
	}
	cuGetErrorName(r, &name);
	snprintf(out, len, "denied %s", name);
}

static int create(tensord_client *c, const char *name, DLDevice dev, int64_t n, uint32_t flags,
		  DLManagedTensorVersioned **t);

/*
 * Commands: "attach NAME" (answers the read-only flag, the device as this
 * process numbers it and that device's UUID), "check NAME SEED" (whole
 * tensor against the pattern), "create NAME BYTES SEED" (create on this
 * process's cuda:0, fill, publish), "write NAME" (try to overwrite it),
 * "quit". Answers "ok ..." or "bad ...".
 */
static int reader(const char *sock)
{
	DLManagedTensorVersioned *held[16] = { 0 };
	char names[16][256], line[512], name[256];
	tensord_client *c = connect_or_die(sock);
	int n = 0, seed, bytes;

	cuda_enter(0);
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		if (sscanf(line, "attach %255s", name) == 1 && n < 16) {
			int r = tensord_attach(c, name, 5000, &held[n]);

			if (r < 0) {
				printf("bad attach: %s\n", tensord_last_error());
				continue;
			}
			snprintf(names[n], sizeof(names[n]), "%s", name);
			printf("ok ro=%d dev=%d:%d uuid=%s\n",
			       !!(held[n]->flags & DLPACK_FLAG_BITMASK_READ_ONLY),
			       held[n]->dl_tensor.device.device_type,
			       held[n]->dl_tensor.device.device_id,
			       uuid_hex(held[n]->dl_tensor.device.device_id));
			n++;
		} else if (sscanf(line, "create %255s %d %d", name, &bytes, &seed) == 3 && n < 16) {
			if (create(c, name, (DLDevice){ kDLCUDA, 0 }, bytes, 0, &held[n]) < 0) {
				printf("bad create: %s\n", tensord_last_error());
				continue;
			}
			fill(held[n], (size_t)bytes, seed);
			if (tensord_publish(c, name) < 0) {
				printf("bad publish: %s\n", tensord_last_error());
				continue;
			}
			snprintf(names[n++], sizeof(names[0]), "%s", name);
			printf("ok created\n");
		} else if (sscanf(line, "write %255s", name) == 1) {
			char out[128];
			int i;

			for (i = 0; i < n && strcmp(names[i], name); i++)
				;
			if (i == n) {
				printf("bad not attached\n");
				continue;
			}
			try_write(held[i], nbytes_of(held[i]), out, sizeof(out));
			printf("%s\n", out);
		} else if (sscanf(line, "check %255s %d", name, &seed) == 2) {
			int i;

			for (i = 0; i < n && strcmp(names[i], name); i++)
				;
			if (i == n) {
				printf("bad not attached\n");
				continue;
			}
			size_t bad = verify(held[i], nbytes_of(held[i]), seed);

			if (bad)
				printf("bad byte %zu\n", bad - 1);
			else
				printf("ok\n");
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		}
	}
	for (int i = 0; i < n; i++)
		held[i]->deleter(held[i]);
	tensord_close(c);
	return 0;
}

static int hold(const char *sock, const char *name, int count)
{
	tensord_client *c = connect_or_die(sock);
	DLManagedTensorVersioned *t;

	cuda_enter(0);
	for (int i = 0; i < count; i++)
		if (tensord_attach(c, name, 5000, &t) < 0)
			return 1;
	printf("held\n");
	fflush(stdout);
	pause();
	return 0;
}

static int churn(const char *sock, const char *name)
{
	tensord_client *c = connect_or_die(sock);
	DLManagedTensorVersioned *t;

	cuda_enter(0);
	printf("churning\n");
	fflush(stdout);
	/* Runs until the orchestrator kills it. */
	for (;;) {
		if (tensord_attach(c, name, 5000, &t) == 0)
			t->deleter(t);
	}
	return 0;
}

static int bench(const char *sock, const char *name, int n)
{
	tensord_client *c = connect_or_die(sock);
	DLManagedTensorVersioned *t, *pin;
	double cold[256], warm[256], t0;

	if (n > 256)
		n = 256;
	cuda_enter(0);
	/* Cold: nothing of this tensor is mapped here, so each attach imports. */
	for (int i = 0; i < n; i++) {
		t0 = now_us();
		if (tensord_attach(c, name, 5000, &t) < 0)
			return 1;
		cold[i] = now_us() - t0;
		t->deleter(t);
	}
	/* Warm: a lease keeps the mapping, so the library reuses it. */
	if (tensord_attach(c, name, 5000, &pin) < 0)
		return 1;
	for (int i = 0; i < n; i++) {
		t0 = now_us();
		if (tensord_attach(c, name, 5000, &t) < 0)
			return 1;
		warm[i] = now_us() - t0;
		t->deleter(t);
	}
	pin->deleter(pin);
	qsort(cold, (size_t)n, sizeof(double), cmp_double);
	qsort(warm, (size_t)n, sizeof(double), cmp_double);
	printf("%.1f %.1f\n", cold[n / 2], warm[n / 2]);
	tensord_close(c);
	return 0;
}

/*
 * The creator of an immutable tensor writes through its own view after
 * publish: on the VMM path the view is read-only by then. Prints "denied
 * ERROR" or "ok wrote", then waits for a line on stdin and exits.
 */
static int creator_writes(const char *sock, const char *name)
{
	tensord_client *c = connect_or_die(sock);
	DLManagedTensorVersioned *t;
	char out[128], line[16];
	const size_t n = 1 << 20;

	cuda_enter(0);
	if (create(c, name, (DLDevice){ kDLCUDA, 0 }, (int64_t)n, 0, &t) < 0) {
		printf("bad create: %s\n", tensord_last_error());
		return 1;
	}
	fill(t, n, 9);
	if (tensord_publish(c, name) < 0) {
		printf("bad publish: %s\n", tensord_last_error());
		return 1;
	}
	try_write(t, n, out, sizeof(out));
	printf("%s\n", out);
	fflush(stdout);
	/* The tensor must outlive the check: hold the lease until told. */
	if (!fgets(line, sizeof(line), stdin))
		return 0;
	return 0;
}

/*
 * tensord_close() while a lease (and so a GPU mapping) is alive. Says
 * "closed", waits for a line (the orchestrator has made the daemon free the
 * memory meanwhile), then reports what the handle is now: on legacy IPC the
 * library must have closed the IPC handle before the socket ("ok
 * ipc-unmapped"); on VMM the mapping stays valid ("ok vmm-mapped" after
 * checking the bytes). Then runs the deleter, which must not crash.
 */
static int close_live(const char *sock, const char *name, int seed)
{
	tensord_client *c = connect_or_die(sock);
	DLManagedTensorVersioned *t;
	CUdeviceptr base = 0;
	size_t size = 0;
	char line[16];
	CUresult r;

	cuda_enter(0);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (tensord_attach(c, name, 5000, &t) < 0) {
		printf("bad attach: %s\n", tensord_last_error());
		return 1;
	}
	if (verify(t, nbytes_of(t), seed)) {
		printf("bad bytes before close\n");
		return 1;
	}
	tensord_close(c);
	printf("closed\n");
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	r = cuMemGetAddressRange(&base, &size, dptr_of(t));
	if (r != CUDA_SUCCESS)
		printf("ok ipc-unmapped\n");
	else if (verify(t, nbytes_of(t), seed) == 0)
		printf("ok vmm-mapped\n");
	else
		printf("bad still mapped but the bytes changed\n");
	t->deleter(t);
	return 0;
}

/* ---- the orchestrator ----------------------------------------------------- */

static char self_exe[4096];
static char sock_path[256];

struct child {
	pid_t pid;
	FILE *in, *out;
};

/*
 * environ with CUDA_VISIBLE_DEVICES set to visible (NULL: unset). Static
 * storage: valid until the next call.
 */
static char **env_with_visible(const char *visible)
{
	static char *env[512];
	static char var[128];
	int n = 0;

	for (char **e = environ; *e && n < 510; e++)
		if (strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0)
			env[n++] = *e;
	if (visible) {
		snprintf(var, sizeof(var), "CUDA_VISIBLE_DEVICES=%s", visible);
		env[n++] = var;
	}
	env[n] = NULL;
	return env;
}

static struct child spawn_role_env(char *const argv[], char *const envp[]);

/* Starts this binary with the given role arguments, stdin/stdout piped. */
static struct child spawn_role(char *const argv[])
{
	return spawn_role_env(argv, environ);
}

static struct child spawn_role_env(char *const argv[], char *const envp[])
{
	posix_spawn_file_actions_t fa;
	int to[2], from[2];
	struct child ch;

	if (pipe2(to, O_CLOEXEC) < 0 || pipe2(from, O_CLOEXEC) < 0)
		exit(2);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, to[0], 0);
	posix_spawn_file_actions_adddup2(&fa, from[1], 1);
	if (posix_spawn(&ch.pid, self_exe, &fa, NULL, argv, envp) != 0)
		exit(2);
	posix_spawn_file_actions_destroy(&fa);
	close(to[0]);
	close(from[1]);
	ch.in = fdopen(to[1], "w");
	ch.out = fdopen(from[0], "r");
	setvbuf(ch.in, NULL, _IOLBF, 0);
	return ch;
}

/* Sends one command line to a --reader child and returns its answer. */
static const char *ask(struct child *ch, const char *cmd)
{
	static char line[512];

	fprintf(ch->in, "%s\n", cmd);
	fflush(ch->in);
	if (!fgets(line, sizeof(line), ch->out))
		return "bad (child exited)";
	line[strcspn(line, "\n")] = '\0';
	return line;
}

/* Ends a child (SIGKILL first when kill9); returns its exit status, 128 + signal if killed. */
static int finish(struct child *ch, bool kill9)
{
	int st;

	if (kill9)
		kill(ch->pid, SIGKILL);
	fclose(ch->in);
	fclose(ch->out);
	waitpid(ch->pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static uint64_t leases(tensord_client *c)
{
	tensord_daemon_stats s;

	if (tensord_stats(c, &s, sizeof(s)) < 0)
		return UINT64_MAX;
	return s.leases;
}

/* Waits up to 3 s for the daemon's lease count to come back to want. */
static bool leases_back(tensord_client *c, uint64_t want)
{
	for (int i = 0; i < 300; i++) {
		if (leases(c) == want)
			return true;
		usleep(10000);
	}
	return false;
}

static int create(tensord_client *c, const char *name, DLDevice dev, int64_t n, uint32_t flags,
		  DLManagedTensorVersioned **t)
{
	tensord_spec spec = {
		.dtype = { kDLUInt, 8, 1 },
		.ndim = 1,
		.shape = &n,
		.device = dev,
		.flags = flags,
	};

	return tensord_create(c, name, &spec, t);
}

static const DLDevice cuda0 = { kDLCUDA, 0 };

static void test_stats_path(tensord_client *c)
{
	const char *want = getenv("TENSORD_CUDA_PATH");
	tensord_daemon_stats s;
	int i;

	CHECK(tensord_stats(c, &s, sizeof(s)) == 0, "%s", tensord_last_error());
	for (i = 0; i < (int)s.n_devices; i++)
		if (s.devices[i].device.device_type == kDLCUDA &&
		    s.devices[i].device.device_id == 0)
			break;
	CHECK(i < (int)s.n_devices, "no cuda:0 in stats");
	printf("info cuda:0 path %s\n", s.devices[i].path);
	if (want && strcmp(want, "ipc") == 0)
		CHECK(strcmp(s.devices[i].path, "cuda-ipc") == 0, "path %s", s.devices[i].path);
	printf("PASS stats_path\n");
}

/* Writer here, reader in another process: bytes, read-only flag, device; then mutable. */
static void test_write_read(tensord_client *c, uint64_t base)
{
	const size_t n = (3u << 20) + 17; /* not a multiple of any granularity */
	DLManagedTensorVersioned *a, *m;
	struct child r = spawn_role((char *[]){ self_exe, "--reader", sock_path, NULL });
	const char *ans;

	CHECK(create(c, "gpu/basic", cuda0, (int64_t)n, 0, &a) == 0, "%s", tensord_last_error());
	CHECK(a->dl_tensor.device.device_type == kDLCUDA, "device %d",
	      a->dl_tensor.device.device_type);
	fill(a, n, 1);
	CHECK(tensord_publish(c, "gpu/basic") == 0, "%s", tensord_last_error());
	ans = ask(&r, "attach gpu/basic");
	CHECK(strncmp(ans, "ok ro=1 dev=2:0 ", 16) == 0, "%s", ans);
	ans = ask(&r, "check gpu/basic 1");
	CHECK(strcmp(ans, "ok") == 0, "%s", ans);
	printf("PASS write_then_read_other_process\n");

	CHECK(create(c, "gpu/mut", cuda0, 1 << 20, TENSORD_MUTABLE, &m) == 0, "%s",
	      tensord_last_error());
	fill(m, 1 << 20, 2);
	CHECK(tensord_publish(c, "gpu/mut") == 0, "%s", tensord_last_error());
	ans = ask(&r, "attach gpu/mut");
	CHECK(strncmp(ans, "ok ro=0", 7) == 0, "%s", ans);
	ans = ask(&r, "check gpu/mut 2");
	CHECK(strcmp(ans, "ok") == 0, "%s", ans);
	fill(m, 1 << 20, 3);
	ans = ask(&r, "check gpu/mut 3");
	CHECK(strcmp(ans, "ok") == 0, "reader missed the later write: %s", ans);
	printf("PASS mutable_change_seen_by_reader\n");

	fprintf(r.in, "quit\n");
	finish(&r, false);
	CHECK(leases_back(c, base + 2), "leases %llu, want %llu", (unsigned long long)leases(c),
	      (unsigned long long)base + 2);
	a->deleter(a);
	m->deleter(m);
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS reader_exit_releases\n");
}

static void test_kill9_holder(tensord_client *c, uint64_t base)
{
	struct child h =
		spawn_role((char *[]){ self_exe, "--hold", sock_path, "gpu/basic", "40", NULL });
	char line[64] = "";
	tensord_info info;

	CHECK(fgets(line, sizeof(line), h.out) && strncmp(line, "held", 4) == 0, "holder: %s",
	      line);
	CHECK(leases(c) == base + 40, "leases %llu", (unsigned long long)leases(c));
	CHECK(tensord_stat(c, "gpu/basic", &info) == 0 && info.refcount == 40, "refcount %u",
	      info.refcount);
	finish(&h, true);
	CHECK(leases_back(c, base), "leases %llu after kill -9", (unsigned long long)leases(c));
	CHECK(tensord_stat(c, "gpu/basic", &info) == 0 && info.refcount == 0, "refcount %u",
	      info.refcount);
	printf("PASS kill9_releases_leases\n");
}

/* Kill clients at random moments of attach (import, map) and release. */
static void test_death_mid_import(tensord_client *c, uint64_t base)
{
	srand(12345);
	for (int i = 0; i < 25; i++) {
		struct child ch =
			spawn_role((char *[]){ self_exe, "--churn", sock_path, "gpu/basic", NULL });
		char line[64];

		CHECK(fgets(line, sizeof(line), ch.out), "churn child did not start");
		usleep((useconds_t)(rand() % 30000));
		finish(&ch, true);
	}
	CHECK(leases(c) != UINT64_MAX, "daemon does not answer: %s", tensord_last_error());
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS daemon_survives_death_mid_import\n");
}

/* The other direction: another process creates on cuda:0, this one reads. */
static void test_read_other_process_writes(tensord_client *c, uint64_t base)
{
	struct child w = spawn_role((char *[]){ self_exe, "--reader", sock_path, NULL });
	DLManagedTensorVersioned *t;
	const char *ans;

	ans = ask(&w, "create gpu/theirs 1000003 4");
	CHECK(strcmp(ans, "ok created") == 0, "%s", ans);
	CHECK(tensord_attach(c, "gpu/theirs", 5000, &t) == 0, "%s", tensord_last_error());
	CHECK(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "not read-only");
	CHECK(verify(t, 1000003, 4) == 0, "bytes differ");
	t->deleter(t);
	fprintf(w.in, "quit\n");
	finish(&w, false);
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	tensord_unlink(c, "gpu/theirs");
	printf("PASS other_process_writes_this_reads\n");
}

/*
 * Another CUDA_VISIBLE_DEVICES in the reader: the device travels by UUID, so
 * the reader maps the daemon's cuda:0 on whatever its own number for that
 * GPU is. With one GPU, "0" against unset exercises the translation; with
 * two or more, the reversed order makes our cuda:0 the reader's cuda:(n-1).
 */
static void test_other_visible_devices(void)
{
	char mine[33], want[96], order[128] = "";
	const char *ans, *visible = "0";
	struct child r;
	int n = 0;

	CU(cuDeviceGetCount(&n));
	snprintf(mine, sizeof(mine), "%s", uuid_hex(0));
	if (!getenv("CUDA_VISIBLE_DEVICES") && n >= 2) {
		for (int i = n - 1; i >= 0; i--)
			snprintf(order + strlen(order), sizeof(order) - strlen(order), "%s%d",
				 i == n - 1 ? "" : ",", i);
		visible = order;
	}
	r = spawn_role_env((char *[]){ self_exe, "--reader", sock_path, NULL },
			   env_with_visible(visible));
	ans = ask(&r, "attach gpu/basic");
	snprintf(want, sizeof(want), "ok ro=1 dev=2:%d uuid=%s", visible == order ? n - 1 : 0,
		 mine);
	printf("info reader with CUDA_VISIBLE_DEVICES=%s: %s\n", visible, ans);
	CHECK(strcmp(ans, want) == 0, "want '%s', got '%s'", want, ans);
	ans = ask(&r, "check gpu/basic 1");
	CHECK(strcmp(ans, "ok") == 0, "%s", ans);
	fprintf(r.in, "quit\n");
	finish(&r, false);
	printf("PASS other_cuda_visible_devices\n");
}

/* Whether the daemon shares cuda:0 through legacy IPC (no read-only mappings). */
static bool legacy_ipc(tensord_client *c)
{
	tensord_daemon_stats s;

	if (tensord_stats(c, &s, sizeof(s)) < 0)
		return false;
	for (int i = 0; i < (int)s.n_devices; i++)
		if (s.devices[i].device.device_type == kDLCUDA &&
		    s.devices[i].device.device_id == 0)
			return strcmp(s.devices[i].path, "cuda-ipc") == 0;
	return false;
}

/*
 * A reader of an immutable tensor writes anyway, in a process of its own
 * (a denied write leaves that process's CUDA context unusable). On the VMM
 * path the driver refuses it and the bytes stay; legacy IPC cannot map
 * read-only, so there the write lands: the gap docs/gpu.md states.
 */
static void test_reader_cannot_write(tensord_client *c, uint64_t base)
{
	struct child r = spawn_role((char *[]){ self_exe, "--reader", sock_path, NULL });
	bool ipc = legacy_ipc(c);
	DLManagedTensorVersioned *t;
	const char *ans;

	ans = ask(&r, "attach gpu/basic");
	CHECK(strncmp(ans, "ok ro=1", 7) == 0, "%s", ans);
	ans = ask(&r, "write gpu/basic");
	printf("info reader write on %s: %s\n", ipc ? "cuda-ipc" : "cuda-vmm", ans);
	fprintf(r.in, "quit\n");
	finish(&r, false);
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	CHECK(tensord_attach(c, "gpu/basic", 5000, &t) == 0, "%s", tensord_last_error());
	if (ipc) {
		CHECK(strcmp(ans, "ok wrote") == 0, "%s", ans);
		t->deleter(t);
		/* Put the pattern back for the tests after this one. */
		tensord_unlink(c, "gpu/basic");
		CHECK(create(c, "gpu/basic", cuda0, (3 << 20) + 17, 0, &t) == 0, "%s",
		      tensord_last_error());
		fill(t, (3u << 20) + 17, 1);
		CHECK(tensord_publish(c, "gpu/basic") == 0, "%s", tensord_last_error());
		t->deleter(t);
		printf("PASS reader_write_lands_on_legacy_ipc (documented gap)\n");
		return;
	}
	CHECK(strncmp(ans, "denied ", 7) == 0, "the reader's write was not refused: %s", ans);
	CHECK(verify(t, nbytes_of(t), 1) == 0, "the bytes changed");
	t->deleter(t);
	printf("PASS reader_cannot_write_immutable\n");
}

/* The creator's own view after publish (VMM: re-protected read-only). */
static void test_creator_cannot_write(tensord_client *c, uint64_t base)
{
	struct child w =
		spawn_role((char *[]){ self_exe, "--creator-writes", sock_path, "gpu/own", NULL });
	bool ipc = legacy_ipc(c);
	DLManagedTensorVersioned *t;
	char line[128] = "";

	CHECK(fgets(line, sizeof(line), w.out), "creator said nothing");
	line[strcspn(line, "\n")] = '\0';
	printf("info creator write after publish on %s: %s\n", ipc ? "cuda-ipc" : "cuda-vmm", line);
	CHECK(tensord_attach(c, "gpu/own", 5000, &t) == 0, "%s", tensord_last_error());
	if (ipc) {
		CHECK(strcmp(line, "ok wrote") == 0, "%s", line);
	} else {
		CHECK(strncmp(line, "denied ", 7) == 0, "the creator's write was not refused: %s",
		      line);
		CHECK(verify(t, 1 << 20, 9) == 0, "the bytes changed");
	}
	t->deleter(t);
	fprintf(w.in, "quit\n");
	finish(&w, false);
	tensord_unlink(c, "gpu/own");
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS creator_view_after_publish (%s)\n", ipc ? "documented gap" : "read-only");
}

/*
 * tensord_close() with a live import while the daemon frees the memory:
 * the client must have closed a legacy IPC handle first (no undefined
 * behaviour), and exits cleanly either way.
 */
static void test_close_with_live_import(tensord_client *c, uint64_t base)
{
	DLManagedTensorVersioned *t;
	struct child ch;
	char line[128] = "";
	bool ipc = legacy_ipc(c);
	int st;

	CHECK(create(c, "gpu/closing", cuda0, 5 << 20, 0, &t) == 0, "%s", tensord_last_error());
	fill(t, 5 << 20, 6);
	CHECK(tensord_publish(c, "gpu/closing") == 0, "%s", tensord_last_error());
	t->deleter(t);
	ch = spawn_role(
		(char *[]){ self_exe, "--close-live", sock_path, "gpu/closing", "6", NULL });
	CHECK(fgets(line, sizeof(line), ch.out) && strncmp(line, "closed", 6) == 0, "child: %s",
	      line);
	/* The child's lease ended with its connection; unlinking frees the memory now. */
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	CHECK(tensord_unlink(c, "gpu/closing") == 0, "%s", tensord_last_error());
	usleep(100000);
	fprintf(ch.in, "go\n");
	fflush(ch.in);
	line[0] = '\0';
	CHECK(fgets(line, sizeof(line), ch.out), "child said nothing after the free");
	line[strcspn(line, "\n")] = '\0';
	st = finish(&ch, false);
	CHECK(st == 0, "child exit status %d", st);
	CHECK(strcmp(line, ipc ? "ok ipc-unmapped" : "ok vmm-mapped") == 0, "%s", line);
	CHECK(leases(c) != UINT64_MAX, "daemon does not answer");
	printf("PASS close_with_live_import (%s)\n", line + 3);
}

static void bench_one(tensord_client *c, const char *name, DLDevice dev, int64_t n)
{
	DLManagedTensorVersioned *t;
	struct child b;
	char line[128] = "";

	if (create(c, name, dev, n, 0, &t) < 0 || tensord_publish(c, name) < 0) {
		printf("FAIL bench %s: %s\n", name, tensord_last_error());
		failures++;
		return;
	}
	t->deleter(t);
	b = spawn_role((char *[]){ self_exe, "--bench", sock_path, (char *)name, "50", NULL });
	if (!fgets(line, sizeof(line), b.out))
		snprintf(line, sizeof(line), "failed\n");
	finish(&b, false);
	printf("bench %-5s %8lld bytes  cold/warm median us: %s",
	       dev.device_type == kDLCPU ? "cpu" : "cuda:0", (long long)n, line);
	tensord_unlink(c, name);
}

static int run_daemon(const char *tensord_bin, pid_t *ret_pid)
{
	posix_spawn_file_actions_t fa;
	char dir[] = "/tmp/tensord-gpu-XXXXXX";
	int p[2];
	char ok = 0;

	if (!mkdtemp(dir) || pipe(p) < 0)
		return -1;
	snprintf(sock_path, sizeof(sock_path), "%s/s", dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 3);
	if (posix_spawn(ret_pid, tensord_bin, &fa, NULL,
			(char *[]){ (char *)tensord_bin, "--socket", sock_path, "--ready-fd", "3",
				    "--log-level", "info", NULL },
			environ) != 0)
		return -1;
	close(p[1]);
	if (read(p[0], &ok, 1) != 1 || ok != 'R')
		return -1;
	close(p[0]);
	return 0;
}

static int orchestrate(const char *tensord_bin)
{
	DLManagedTensorVersioned *t;
	size_t free0, free1, total;
	tensord_client *c;
	uint64_t base;
	pid_t daemon;
	int st;

	if (run_daemon(tensord_bin, &daemon) < 0) {
		printf("FAIL daemon did not start\n");
		return 1;
	}
	cuda_enter(0);
	c = connect_or_die(sock_path);
	test_stats_path(c);

	/* Warm up: the daemon makes its CUDA context on the first allocation. */
	if (create(c, "gpu/warmup", cuda0, 1 << 20, 0, &t) < 0) {
		printf("FAIL create on cuda:0: %s\n", tensord_last_error());
		return 1;
	}
	t->deleter(t);
	tensord_unlink(c, "gpu/warmup");
	usleep(100000);
	CU(cuMemGetInfo(&free0, &total));
	base = leases(c);

	test_write_read(c, base);
	test_read_other_process_writes(c, base);
	test_other_visible_devices();
	test_reader_cannot_write(c, base);
	test_creator_cannot_write(c, base);
	test_close_with_live_import(c, base);
	test_kill9_holder(c, base);
	test_death_mid_import(c, base);
	bench_one(c, "bench/cpu-1M", (DLDevice){ kDLCPU, 0 }, 1 << 20);
	bench_one(c, "bench/cpu-256M", (DLDevice){ kDLCPU, 0 }, 256 << 20);
	bench_one(c, "bench/cuda-1M", cuda0, 1 << 20);
	bench_one(c, "bench/cuda-256M", cuda0, 256 << 20);

	tensord_unlink(c, "gpu/basic");
	tensord_unlink(c, "gpu/mut");
	/* Freed device memory shows up in cuMemGetInfo shortly after. */
	for (int i = 0; i < 100; i++) {
		CU(cuMemGetInfo(&free1, &total));
		if (free1 + (4u << 20) >= free0)
			break;
		usleep(20000);
	}
	if (free1 + (4u << 20) >= free0) {
		printf("PASS gpu_memory_back_to_baseline (free %zu -> %zu)\n", free0, free1);
	} else {
		printf("FAIL gpu memory not back: free %zu before, %zu after\n", free0, free1);
		failures++;
	}
	tensord_close(c);
	kill(daemon, SIGTERM);
	waitpid(daemon, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		printf("FAIL daemon exit status %d\n", st);
		failures++;
	}
	printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);

	if (n <= 0)
		return 2;
	self_exe[n] = '\0';
	signal(SIGPIPE, SIG_IGN);
	if (argc == 3 && strcmp(argv[1], "--reader") == 0)
		return reader(argv[2]);
	if (argc == 5 && strcmp(argv[1], "--hold") == 0)
		return hold(argv[2], argv[3], atoi(argv[4]));
	if (argc == 4 && strcmp(argv[1], "--churn") == 0)
		return churn(argv[2], argv[3]);
	if (argc == 5 && strcmp(argv[1], "--bench") == 0)
		return bench(argv[2], argv[3], atoi(argv[4]));
	if (argc == 4 && strcmp(argv[1], "--creator-writes") == 0)
		return creator_writes(argv[2], argv[3]);
	if (argc == 5 && strcmp(argv[1], "--close-live") == 0)
		return close_live(argv[2], argv[3], atoi(argv[4]));
	if (argc == 2)
		return orchestrate(argv[1]);
	fprintf(stderr, "usage: %s PATH/TO/tensord\n", argv[0]);
	return 2;
}
