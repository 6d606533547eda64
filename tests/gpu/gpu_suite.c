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
 *
 * Every process the suite starts (roles and the daemon) goes through
 *   --bounded SECONDS PPID PROGRAM ARGS...
 * which asks for SIGKILL when its parent dies (PR_SET_PDEATHSIG, then
 * getppid() against PPID for the race), sets alarm(SECONDS) and execs
 * PROGRAM, which keeps both: no child outlives the orchestrator however it
 * ends (kill -9 included), and a hung child ends on its own. A failed CHECK
 * kills the test's children and releases its tensors before returning
 * (test_cleanup()); an exit() stops the daemon (atexit). Knobs:
 * GPU_SUITE_CHILD_TIMEOUT (s, default 120), GPU_SUITE_TIMEOUT (s, the whole
 * run, default 480).
 *
 *   gpu_suite --selftest MODE PATH/TO/tensord
 * checks that machinery without a GPU (host tensors only, no CUDA call; run
 * by tests/gpu/run.sh selftest): MODE "check" fails a CHECK on purpose
 * with a holder child and leases alive, "hang" lets a child's alarm end
 * it, "exit" calls exit() mid-test, "orphan" waits to be killed with -9.
 * It prints "info pid N" for each process it starts, for the caller to
 * check that none is left.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include <tensord/tensord.h>

extern char **environ;

static int failures;
static bool no_cuda; /* --selftest and its children: no CUDA call at all */

static void test_cleanup(void);

/* A failed check ends the test: its children are killed and its tensors released first. */
#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("FAIL %s:%d: %s: ", __func__, __LINE__, #cond);                     \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			failures++;                                                                \
			test_cleanup();                                                            \
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

	if (no_cuda)
		return;
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
 * Defect 2 of issue 21, as a consumer meets it: a read queued on a stream,
 * then the only lease dropped before the stream ran (torch and cupy call
 * the deleter as soon as the array dies). The library must wait for the
 * device before it unmaps; otherwise the queued read faults. Answers "ok"
 * or "bad ...".
 */
static void queued_read(tensord_client *c, const char *name, int seed)
{
	DLManagedTensorVersioned *t;
	const char *err = "?";
	CUstream s;
	CUresult r;
	size_t n, bad = 0;
	uint8_t *buf;

	if (tensord_attach(c, name, 5000, &t) < 0) {
		printf("bad attach: %s\n", tensord_last_error());
		return;
	}
	n = nbytes_of(t);
	buf = calloc(1, n);
	CU(cuStreamCreate(&s, 0));
	r = cuMemcpyDtoHAsync(buf, dptr_of(t), n, s);
	t->deleter(t); /* the last lease in this process: the mapping goes */
	if (r == CUDA_SUCCESS)
		r = cuStreamSynchronize(s);
	for (size_t i = 0; i < n && !bad && r == CUDA_SUCCESS; i++)
		if (buf[i] != pattern(i, seed))
			bad = i + 1;
	free(buf);
	if (r != CUDA_SUCCESS) {
		cuGetErrorName(r, &err);
		printf("bad the queued read failed: %s\n", err);
	} else if (bad) {
		printf("bad byte %zu\n", bad - 1);
	} else {
		cuStreamDestroy(s);
		printf("ok\n");
	}
}

/*
 * Commands: "attach NAME" (answers the read-only flag, the device as this
 * process numbers it, that device's UUID and whether read-only is enforced), "check NAME SEED" (whole
 * tensor against the pattern), "create NAME BYTES SEED" (create on this
 * process's cuda:0, fill, publish), "write NAME" (try to overwrite it),
 * "queued NAME SEED" (attach NAME again, queue a read of it on a stream of
 * its own, drop that lease at once as torch drops a temporary, then wait
 * for the stream and check what it read), "quit". Answers "ok ..." or "bad ...".
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
			printf("ok ro=%d dev=%d:%d uuid=%s enf=%d\n",
			       !!(held[n]->flags & DLPACK_FLAG_BITMASK_READ_ONLY),
			       held[n]->dl_tensor.device.device_type,
			       held[n]->dl_tensor.device.device_id,
			       uuid_hex(held[n]->dl_tensor.device.device_id),
			       tensord_tensor_read_only_enforced(held[n]) == 1);
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
		} else if (sscanf(line, "queued %255s %d", name, &seed) == 2) {
			queued_read(c, name, seed);
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
 * ERROR enf=E" or "ok wrote enf=E" (E: read-only enforced, 0 or 1), then
 * waits for a line on stdin and exits.
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
	printf("%s enf=%d\n", out, tensord_tensor_read_only_enforced(t) == 1);
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
static char sock_dir[64];
static pid_t daemon_pid;

struct child {
	pid_t pid;
	FILE *in, *out;
	int slot; /* in kids[] */
};

/* ---- children and tensors a failed test must not leave behind ------------ */

#define MAX_KIDS 64
#define MAX_OWNED 64

/* The live children (pid 0: a free slot) and the orchestrator's live tensors. */
static struct child kids[MAX_KIDS];
static DLManagedTensorVersioned *owned[MAX_OWNED];
static bool tracking; /* the orchestrator: create() records what it made */

static unsigned env_seconds(const char *var, unsigned dflt)
{
	const char *v = getenv(var);

	return v && atoi(v) > 0 ? (unsigned)atoi(v) : dflt;
}

static unsigned child_timeout(void)
{
	return env_seconds("GPU_SUITE_CHILD_TIMEOUT", 120);
}

static unsigned suite_timeout(void)
{
	return env_seconds("GPU_SUITE_TIMEOUT", 480);
}

static void own(DLManagedTensorVersioned *t)
{
	for (int i = 0; tracking && i < MAX_OWNED; i++)
		if (!owned[i]) {
			owned[i] = t;
			return;
		}
}

/* Runs t's deleter, and forgets it. */
static void drop_t(DLManagedTensorVersioned *t)
{
	for (int i = 0; i < MAX_OWNED; i++)
		if (owned[i] == t)
			owned[i] = NULL;
	t->deleter(t);
}

static int attach_t(tensord_client *c, const char *name, DLManagedTensorVersioned **t)
{
	int r = tensord_attach(c, name, 5000, t);

	if (r == 0)
		own(*t);
	return r;
}

/* SIGKILLs and reaps every live child. */
static void kill_kids(void)
{
	for (int i = 0; i < MAX_KIDS; i++) {
		if (kids[i].pid <= 0)
			continue;
		kill(kids[i].pid, SIGKILL);
		fclose(kids[i].in);
		fclose(kids[i].out);
		waitpid(kids[i].pid, NULL, 0);
		kids[i].pid = 0;
	}
}

static int live_kids(void)
{
	int n = 0;

	for (int i = 0; i < MAX_KIDS; i++)
		n += kids[i].pid > 0;
	return n;
}

/* What a failed CHECK does before its return: no child, no lease left of the test. */
static void test_cleanup(void)
{
	if (!tracking)
		return;
	kill_kids();
	for (int i = 0; i < MAX_OWNED; i++)
		if (owned[i])
			drop_t(owned[i]);
}

/* Stops the daemon: SIGTERM, then SIGKILL after 5 s. Its exit status, or -1. */
static int stop_daemon(void)
{
	int st = -1;

	if (daemon_pid <= 0)
		return -1;
	kill(daemon_pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid)
			break;
		if (i == 499) {
			printf("FAIL daemon ignored SIGTERM for 5 s: killed\n");
			kill(daemon_pid, SIGKILL);
			waitpid(daemon_pid, &st, 0);
		}
		usleep(10000);
	}
	daemon_pid = 0;
	return st;
}

/* atexit: every exit() of the orchestrator (CU() failures included) stops all it started. */
static void stop_everything(void)
{
	kill_kids();
	stop_daemon();
	if (sock_dir[0]) {
		unlink(sock_path);
		rmdir(sock_dir);
		sock_dir[0] = '\0';
	}
	fflush(stdout);
}

/* The whole run took too long: say so and end; PR_SET_PDEATHSIG ends the children. */
static void on_suite_timeout(int sig)
{
	static const char msg[] = "FAIL the suite ran past GPU_SUITE_TIMEOUT: stopped\n";

	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0) {
		/* Nothing more to do: exiting anyway. */
	}
	if (daemon_pid > 0)
		kill(daemon_pid, SIGKILL);
	_exit(124);
}

/*
 * The child side of --bounded: argv is "--bounded SECONDS PPID PROGRAM
 * ARGS...". Returns only on failure.
 */
static int bounded_exec(int argc, char **argv)
{
	if (argc < 5)
		return 2;
	/* Killed when the parent dies; it may have died before this call. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != (pid_t)atol(argv[3]))
		return 2;
	/* Kept across execve: the program ends by SIGALRM when it overruns. */
	alarm((unsigned)atoi(argv[2]));
	execve(argv[4], argv + 4, environ);
	fprintf(stderr, "gpu_suite: exec %s: %s\n", argv[4], strerror(errno));
	return 127;
}

/* posix_spawn of prog (argv[0] ignored) through --bounded. */
static int spawn_bounded(pid_t *ret_pid, const char *prog, char *const argv[],
			 const posix_spawn_file_actions_t *fa, char *const envp[], unsigned seconds)
{
	char secs[16], ppid[24], *args[40];
	int n = 0, r;

	snprintf(secs, sizeof(secs), "%u", seconds);
	snprintf(ppid, sizeof(ppid), "%ld", (long)getpid());
	args[n++] = self_exe;
	args[n++] = "--bounded";
	args[n++] = secs;
	args[n++] = ppid;
	args[n++] = (char *)prog;
	for (int i = 1; argv[i] && n < 39; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	r = posix_spawn(ret_pid, self_exe, fa, NULL, args, envp);
	if (r == 0 && no_cuda)
		printf("info pid %ld %s\n", (long)*ret_pid, prog == self_exe ? argv[1] : prog);
	return r;
}

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
	if (spawn_bounded(&ch.pid, self_exe, argv, &fa, envp, child_timeout()) != 0)
		exit(2);
	posix_spawn_file_actions_destroy(&fa);
	close(to[0]);
	close(from[1]);
	ch.in = fdopen(to[1], "w");
	ch.out = fdopen(from[0], "r");
	setvbuf(ch.in, NULL, _IOLBF, 0);
	for (ch.slot = 0; ch.slot < MAX_KIDS && kids[ch.slot].pid > 0; ch.slot++)
		;
	if (ch.slot == MAX_KIDS) {
		printf("FAIL more than %d live children\n", MAX_KIDS);
		exit(2);
	}
	kids[ch.slot] = ch;
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

	if (kids[ch->slot].pid != ch->pid)
		return -1; /* already ended by test_cleanup() */
	if (kill9)
		kill(ch->pid, SIGKILL);
	fclose(ch->in);
	fclose(ch->out);
	waitpid(ch->pid, &st, 0);
	kids[ch->slot].pid = 0;
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
	int r = tensord_create(c, name, &spec, t);

	if (r == 0)
		own(*t);
	return r;
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
	drop_t(a);
	drop_t(m);
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS reader_exit_releases\n");
}

static void test_kill9_holder(tensord_client *c, uint64_t base)
{
	struct child h;
	char line[64] = "";
	tensord_info info;

	/* 40 leases the daemon counts: without bindings, each attach is one
	 * (a bound CUDA VMM attach is served locally, issue 32). */
	setenv("TENSORD_BIND", "0", 1);
	h = spawn_role((char *[]){ self_exe, "--hold", sock_path, "gpu/basic", "40", NULL });
	unsetenv("TENSORD_BIND");

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
	CHECK(attach_t(c, "gpu/theirs", &t) == 0, "%s", tensord_last_error());
	CHECK(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "not read-only");
	CHECK(verify(t, 1000003, 4) == 0, "bytes differ");
	drop_t(t);
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
	CHECK(strncmp(ans, want, strlen(want)) == 0, "want '%s', got '%s'", want, ans);
	ans = ask(&r, "check gpu/basic 1");
	CHECK(strcmp(ans, "ok") == 0, "%s", ans);
	fprintf(r.in, "quit\n");
	finish(&r, false);
	printf("PASS other_cuda_visible_devices\n");
}

/* A reader drops its only lease of gpu/basic with a read still queued (queued_read()). */
static void test_release_with_work_queued(tensord_client *c, uint64_t base)
{
	struct child r = spawn_role((char *[]){ self_exe, "--reader", sock_path, NULL });
	const char *ans = ask(&r, "queued gpu/basic 1");

	fprintf(r.in, "quit\n");
	finish(&r, false);
	CHECK(strcmp(ans, "ok") == 0, "%s", ans);
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS release_with_work_queued\n");
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

/* Puts gpu/basic back as the tests after a landed write expect it. */
static void restore_basic(tensord_client *c)
{
	DLManagedTensorVersioned *t;

	tensord_unlink(c, "gpu/basic");
	CHECK(create(c, "gpu/basic", cuda0, (3 << 20) + 17, 0, &t) == 0, "%s",
	      tensord_last_error());
	fill(t, (3u << 20) + 17, 1);
	CHECK(tensord_publish(c, "gpu/basic") == 0, "%s", tensord_last_error());
	drop_t(t);
}

/*
 * A reader of an immutable tensor writes anyway, in a process of its own
 * (a denied write leaves that process's CUDA context unusable). Where the
 * reader's mapping enforces read-only (VMM, the driver granted PROT_READ:
 * "enf=1") the driver refuses it and the bytes stay; legacy IPC cannot map
 * read-only, and a driver may refuse PROT_READ (the importer then maps
 * read-write): there the write lands, the gap docs/gpu.md states.
 */
static void test_reader_cannot_write(tensord_client *c, uint64_t base)
{
	struct child r = spawn_role((char *[]){ self_exe, "--reader", sock_path, NULL });
	bool ipc = legacy_ipc(c), enf;
	DLManagedTensorVersioned *t;
	char attach_ans[512];
	const char *ans;

	ans = ask(&r, "attach gpu/basic");
	snprintf(attach_ans, sizeof(attach_ans), "%s", ans);
	CHECK(strncmp(ans, "ok ro=1", 7) == 0, "%s", ans);
	enf = strstr(attach_ans, " enf=1") != NULL;
	ans = ask(&r, "write gpu/basic");
	printf("info reader write on %s (read-only enforced: %d): %s\n",
	       ipc ? "cuda-ipc" : "cuda-vmm", enf, ans);
	fprintf(r.in, "quit\n");
	finish(&r, false);
	CHECK(!(ipc && enf), "legacy IPC claims enforced read-only: %s", attach_ans);
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	CHECK(attach_t(c, "gpu/basic", &t) == 0, "%s", tensord_last_error());
	if (!enf) {
		CHECK(!ipc || strcmp(ans, "ok wrote") == 0, "%s", ans);
		int before = failures;

		drop_t(t);
		restore_basic(c);
		if (failures != before)
			return;
		printf("PASS reader_write_not_refused_on_%s (read-only not enforced: documented "
		       "gap)\n",
		       ipc ? "legacy_ipc" : "vmm_without_prot_read");
		return;
	}
	CHECK(strncmp(ans, "denied ", 7) == 0, "the reader's write was not refused: %s", ans);
	CHECK(verify(t, nbytes_of(t), 1) == 0, "the bytes changed");
	drop_t(t);
	printf("PASS reader_cannot_write_immutable\n");
}

/*
 * Issue 30: the process that created a tensor attaches it, on its own
 * connection and on a second one, before and after its creator's lease
 * ends. Over the driver double a second import of the allocation failed
 * (cuMemMap: CUDA_ERROR_INVALID_HANDLE); the library imports each
 * allocation once per process now.
 */
static void test_attach_own_tensor(tensord_client *c, uint64_t base)
{
	const size_t n = 3u << 20;
	DLManagedTensorVersioned *w, *a, *b;
	tensord_client *c2 = connect_or_die(sock_path);

	CHECK(create(c, "gpu/own", cuda0, (int64_t)n, 0, &w) == 0, "%s", tensord_last_error());
	fill(w, n, 11);
	CHECK(tensord_publish(c, "gpu/own") == 0, "%s", tensord_last_error());
	CHECK(attach_t(c, "gpu/own", &a) == 0, "attach on the creator's connection: %s",
	      tensord_last_error());
	CHECK(attach_t(c2, "gpu/own", &b) == 0, "attach on a second connection: %s",
	      tensord_last_error());
	CHECK(verify(a, n, 11) == 0 && verify(b, n, 11) == 0, "bytes differ");
	drop_t(w);
	drop_t(a);
	CHECK(attach_t(c, "gpu/own", &a) == 0, "attach after the creator's release: %s",
	      tensord_last_error());
	CHECK(verify(a, n, 11) == 0 && verify(b, n, 11) == 0, "bytes differ after the release");
	drop_t(a);
	drop_t(b);
	tensord_close(c2);
	tensord_unlink(c, "gpu/own");
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS attach_own_tensor\n");
}

/*
 * What the driver does when a process imports one VMM allocation twice
 * (its documentation promises neither the same handle nor a new one): an
 * info line for the hardware notes, and for the double (docs/gpu.md,
 * "One import per process"), which returns the same handle and lets one
 * cuMemRelease end it for both imports.
 */
static void probe_double_import(void)
{
	CUmemGenericAllocationHandle h, h1, h2 = 0;
	CUmemAllocationProp prop;
	CUdeviceptr va = 0;
	size_t gran = 0;
	CUresult ri, r1, r2 = CUDA_ERROR_INVALID_HANDLE, r3;
	int fd = -1, fd2;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	if (cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
	    cuMemCreate(&h, gran, &prop, 0)) {
		printf("info driver_double_import: no VMM here\n");
		return;
	}
	CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	fd2 = dup(fd);
	CU(cuMemImportFromShareableHandle(&h1, (void *)(intptr_t)fd,
					  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	ri = cuMemImportFromShareableHandle(&h2, (void *)(intptr_t)fd2,
					    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(fd);
	close(fd2);
	CU(cuMemAddressReserve(&va, gran, gran, 0, 0));
	r1 = cuMemRelease(h1);
	if (ri == CUDA_SUCCESS)
		r2 = cuMemMap(va, gran, 0, h2, 0);
	/* The second import's reference, where it is still one (its result is reported). */
	r3 = ri == CUDA_SUCCESS ? cuMemRelease(h2) : CUDA_SUCCESS;
	printf("info driver_double_import: second_import=%d same_handle=%d release_first=%d "
	       "map_second=%d release_second=%d\n",
	       (int)ri, ri == CUDA_SUCCESS && h1 == h2, (int)r1, (int)r2, (int)r3);
	if (r2 == CUDA_SUCCESS)
		cuMemUnmap(va, gran);
	cuMemAddressFree(va, gran);
	cuMemRelease(h);
}

/* The creator's own view after publish (VMM: re-protected read-only where the driver can). */
static void test_creator_cannot_write(tensord_client *c, uint64_t base)
{
	struct child w =
		spawn_role((char *[]){ self_exe, "--creator-writes", sock_path, "gpu/own", NULL });
	bool ipc = legacy_ipc(c), enf;
	DLManagedTensorVersioned *t;
	char line[128] = "";

	CHECK(fgets(line, sizeof(line), w.out), "creator said nothing");
	line[strcspn(line, "\n")] = '\0';
	enf = strstr(line, " enf=1") != NULL;
	printf("info creator write after publish on %s: %s\n", ipc ? "cuda-ipc" : "cuda-vmm", line);
	CHECK(!(ipc && enf), "legacy IPC claims enforced read-only: %s", line);
	CHECK(attach_t(c, "gpu/own", &t) == 0, "%s", tensord_last_error());
	if (!enf) {
		CHECK(!ipc || strncmp(line, "ok wrote", 8) == 0, "%s", line);
	} else {
		CHECK(strncmp(line, "denied ", 7) == 0, "the creator's write was not refused: %s",
		      line);
		CHECK(verify(t, 1 << 20, 9) == 0, "the bytes changed");
	}
	drop_t(t);
	fprintf(w.in, "quit\n");
	finish(&w, false);
	tensord_unlink(c, "gpu/own");
	CHECK(leases_back(c, base), "leases %llu", (unsigned long long)leases(c));
	printf("PASS creator_view_after_publish (%s)\n",
	       enf ? "read-only" : "read-only not enforced: documented gap");
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
	drop_t(t);
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
		test_cleanup();
		return;
	}
	drop_t(t);
	b = spawn_role((char *[]){ self_exe, "--bench", sock_path, (char *)name, "50", NULL });
	if (!fgets(line, sizeof(line), b.out))
		snprintf(line, sizeof(line), "failed\n");
	finish(&b, false);
	printf("bench %-5s %8lld bytes  cold/warm median us: %s",
	       dev.device_type == kDLCPU ? "cpu" : "cuda:0", (long long)n, line);
	tensord_unlink(c, name);
}

/* Starts the daemon (bounded, killed with us), stopped at exit by stop_everything(). */
static int run_daemon(const char *tensord_bin)
{
	posix_spawn_file_actions_t fa;
	char dir[] = "/tmp/tensord-gpu-XXXXXX";
	int p[2], r;
	char ok = 0;

	if (!mkdtemp(dir) || pipe(p) < 0)
		return -1;
	snprintf(sock_dir, sizeof(sock_dir), "%s", dir);
	snprintf(sock_path, sizeof(sock_path), "%s/s", dir);
	posix_spawn_file_actions_init(&fa);
	/* Before the dup2: p[0] may be descriptor 3 itself. */
	posix_spawn_file_actions_addclose(&fa, p[0]);
	posix_spawn_file_actions_adddup2(&fa, p[1], 3);
	r = spawn_bounded(&daemon_pid, tensord_bin,
			  (char *[]){ (char *)tensord_bin, "--socket", sock_path, "--ready-fd", "3",
				      "--log-level", "info", NULL },
			  &fa, environ, suite_timeout() + 60);
	posix_spawn_file_actions_destroy(&fa);
	close(p[1]);
	if (r != 0) {
		daemon_pid = 0;
		close(p[0]);
		return -1;
	}
	r = read(p[0], &ok, 1) == 1 && ok == 'R' ? 0 : -1;
	close(p[0]);
	return r;
}

/* What every run does first: output as it happens, a deadline, cleanup on exit. */
static void orchestrator_setup(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	tracking = true;
	atexit(stop_everything);
	signal(SIGALRM, on_suite_timeout);
	alarm(suite_timeout());
}

static int orchestrate(const char *tensord_bin)
{
	DLManagedTensorVersioned *t;
	size_t free0, free1, total;
	tensord_client *c;
	uint64_t base;
	int st;

	orchestrator_setup();
	if (run_daemon(tensord_bin) < 0) {
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
	drop_t(t);
	tensord_unlink(c, "gpu/warmup");
	usleep(100000);
	CU(cuMemGetInfo(&free0, &total));
	base = leases(c);

	test_write_read(c, base);
	test_read_other_process_writes(c, base);
	test_other_visible_devices();
	test_release_with_work_queued(c, base);
	test_reader_cannot_write(c, base);
	test_creator_cannot_write(c, base);
	test_attach_own_tensor(c, base);
	if (!legacy_ipc(c))
		probe_double_import();
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
	if (live_kids()) {
		printf("FAIL %d children still running at the end\n", live_kids());
		failures++;
	}
	tensord_close(c);
	st = stop_daemon();
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		printf("FAIL daemon exit status %d\n", st);
		failures++;
	}
	printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
	return failures ? 1 : 0;
}

/* ---- --selftest: the cleanup machinery, no GPU needed --------------------- */

/* Fails a CHECK on purpose while a holder child and a lease of our own are alive. */
static void selftest_failing_check(tensord_client *c, uint64_t base)
{
	struct child h =
		spawn_role((char *[]){ self_exe, "--hold", sock_path, "self/t", "3", NULL });
	DLManagedTensorVersioned *t;
	char line[64] = "";

	CHECK(fgets(line, sizeof(line), h.out) && strncmp(line, "held", 4) == 0, "holder: %s",
	      line);
	CHECK(attach_t(c, "self/t", &t) == 0, "%s", tensord_last_error());
	/* The holder's 3 leases and ours are alive: this fails. */
	CHECK(leases(c) == base, "deliberate failure (self-test): leases %llu, base %llu",
	      (unsigned long long)leases(c), (unsigned long long)base);
	printf("FAIL self-test: the deliberate CHECK passed\n");
	failures++;
}

static int selftest(const char *mode, const char *tensord_bin)
{
	DLManagedTensorVersioned *t;
	tensord_client *c;
	uint64_t base;
	char line[64] = "";
	struct child h;
	double t0;
	int st;

	no_cuda = true;
	setenv("TENSORD_GPU_SUITE_NO_CUDA", "1", 1);
	orchestrator_setup();
	printf("info orchestrator %ld\n", (long)getpid());
	if (run_daemon(tensord_bin) < 0) {
		printf("FAIL daemon did not start\n");
		return 1;
	}

	c = connect_or_die(sock_path);
	if (create(c, "self/t", (DLDevice){ kDLCPU, 0 }, 4096, 0, &t) < 0 ||
	    tensord_publish(c, "self/t") < 0) {
		printf("FAIL host tensor: %s\n", tensord_last_error());
		return 1;
	}
	drop_t(t);
	base = leases(c);
	if (strcmp(mode, "check") == 0) {
		t0 = now_us();
		selftest_failing_check(c, base);
		if (failures == 1 && live_kids() == 0 && leases_back(c, base)) {
			printf("PASS selftest_failed_check_cleans_up (%.0f ms; children and leases "
			       "gone)\n",
			       (now_us() - t0) / 1e3);
			failures = 0;
		} else {
			printf("FAIL selftest: failures %d, live children %d, leases %llu, base "
			       "%llu\n",
			       failures, live_kids(), (unsigned long long)leases(c),
			       (unsigned long long)base);
			failures = 1;
		}
	} else if (strcmp(mode, "hang") == 0) {
		/* GPU_SUITE_CHILD_TIMEOUT (set short by the caller) ends a hung holder. */
		h = spawn_role((char *[]){ self_exe, "--hold", sock_path, "self/t", "1", NULL });
		t0 = now_us();
		if (!fgets(line, sizeof(line), h.out) || strncmp(line, "held", 4) != 0) {
			printf("FAIL holder: %s\n", line);
			failures++;
		}
		while (fgets(line, sizeof(line), h.out))
			;
		st = finish(&h, false);
		printf("info hung holder ended after %.1f s, status %d\n", (now_us() - t0) / 1e6,
		       st);
		if (st == 128 + SIGALRM && leases_back(c, base)) {
			printf("PASS selftest_hung_child_ends_on_its_alarm\n");
		} else {
			printf("FAIL selftest: hung holder status %d\n", st);
			failures++;
		}
	} else if (strcmp(mode, "exit") == 0 || strcmp(mode, "orphan") == 0) {
		h = spawn_role((char *[]){ self_exe, "--hold", sock_path, "self/t", "2", NULL });
		if (!fgets(line, sizeof(line), h.out) || strncmp(line, "held", 4) != 0)
			printf("FAIL holder: %s\n", line);
		if (strcmp(mode, "exit") == 0) {
			/* As CU() does on a driver error: atexit must stop everything. */
			printf("info exit() mid-test\n");
			exit(3);
		}
		printf("info waiting to be killed\n");
		for (;;)
			pause();
	} else {
		printf("FAIL unknown self-test mode %s\n", mode);
		return 2;
	}
	tensord_close(c);
	st = stop_daemon();
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
	if (argc >= 2 && strcmp(argv[1], "--bounded") == 0)
		return bounded_exec(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	no_cuda = getenv("TENSORD_GPU_SUITE_NO_CUDA") != NULL;
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
	if (argc == 4 && strcmp(argv[1], "--selftest") == 0)
		return selftest(argv[2], argv[3]);
	if (argc == 2)
		return orchestrate(argv[1]);
	fprintf(stderr, "usage: %s PATH/TO/tensord | --selftest MODE PATH/TO/tensord\n", argv[0]);
	return 2;
}
