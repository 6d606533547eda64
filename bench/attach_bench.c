/*
 * attach + release latency, cold and warm, for a 4 KiB and a 1 GiB tensor,
 * next to a bare Unix-socket round trip measured in the same run.
 *
 *   cold: this process holds no other lease on the tensor, so each attach
 *         receives a descriptor and maps it, and each release unmaps.
 *   warm: this process already holds one lease, so an attach reuses the
 *         mapping: one round trip, no descriptor, no mmap.
 *
 * Each twice: with attaches served from a binding after the first (no
 * round trip, docs/design.md "Attach without a round trip"), and with
 * TENSORD_BIND=0 (every attach a round trip), on two clients of one daemon.
 *
 * Starts its own daemon (build/tensord next to this binary's build tree,
 * or $TENSORD_BIN). Prints figures; asserts nothing about time.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tensord/tensord.h>

#define ITERS 20000

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n, double base_p50)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	double p50 = v[n / 2], p99 = v[n * 99 / 100];

	printf("%-34s p50 %8.2f us   p99 %8.2f us", what, p50, p99);
	if (base_p50 > 0)
		printf("   (%.1fx bare round trip)", p50 / base_p50);
	printf("\n");
}

/* A bare round trip: 16 bytes to an echo process over a Unix stream socket. */
static double bare_round_trip(double *v, int n)
{
	int sv[2];
	char buf[16] = { 0 };
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
		return 0;
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		while (read(sv[1], buf, sizeof(buf)) == (ssize_t)sizeof(buf))
			if (write(sv[1], buf, sizeof(buf)) != (ssize_t)sizeof(buf))
				break;
		_exit(0);
	}
	close(sv[1]);
	for (int i = 0; i < n; i++) {
		double t0 = now_us();

		if (write(sv[0], buf, sizeof(buf)) != (ssize_t)sizeof(buf) ||
		    read(sv[0], buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			break;
		v[i] = now_us() - t0;
	}
	close(sv[0]);
	waitpid(pid, NULL, 0);
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return v[n / 2];
}

static pid_t start_daemon(const char *bin, const char *sock)
{
	int p[2];
	char fdarg[16], c;
	pid_t pid;

	if (pipe(p) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		snprintf(fdarg, sizeof(fdarg), "%d", p[1]);
		execl(bin, bin, "--socket", sock, "--ready-fd", fdarg, "--log-level", "warn",
		      (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	if (read(p[0], &c, 1) != 1) {
		close(p[0]);
		return -1;
	}
	close(p[0]);
	return pid;
}

static int bench_tensor(tensord_client *c, const char *name, int64_t bytes, int iters, double *v,
			double base, const char *how)
{
	tensord_spec sp = {
		.dtype = { kDLUInt, 8, 1 }, .ndim = 1, .shape = &bytes, .device = { kDLCPU, 0 }
	};
	DLManagedTensorVersioned *t, *hold;
	char label[64];
	double t0;
	int r;

	t0 = now_us();
	r = tensord_create(c, name, &sp, &t);
	if (r < 0) {
		fprintf(stderr, "create %s: %s\n", name, tensord_last_error());
		return r;
	}
	printf("%-34s %8.1f ms (allocates and populates every page)\n",
	       bytes >= (1 << 30) ? "create 1 GiB" : "create 4 KiB", (now_us() - t0) / 1e3);
	r = tensord_publish(c, name);
	t->deleter(t);
	if (r < 0)
		return r;

	for (int i = 0; i < iters; i++) {
		t0 = now_us();
		r = tensord_attach(c, name, 0, &t);
		if (r < 0)
			return r;
		t->deleter(t);
		v[i] = now_us() - t0;
	}
	snprintf(label, sizeof(label), "attach+release %s cold %s",
		 bytes >= (1 << 30) ? "1 GiB" : "4 KiB", how);
	report(label, v, iters, base);

	r = tensord_attach(c, name, 0, &hold);
	if (r < 0)
		return r;
	for (int i = 0; i < iters; i++) {
		t0 = now_us();
		r = tensord_attach(c, name, 0, &t);
		if (r < 0)
			return r;
		t->deleter(t);
		v[i] = now_us() - t0;
	}
	hold->deleter(hold);
	snprintf(label, sizeof(label), "attach+release %s warm %s",
		 bytes >= (1 << 30) ? "1 GiB" : "4 KiB", how);
	report(label, v, iters, base);
	return tensord_unlink(c, name);
}

int main(int argc, char **argv)
{
	char sock[108], bin[4096];
	const char *env = getenv("TENSORD_BIN");
	double *v = malloc(ITERS * sizeof(double)), base;
	tensord_client *c, *rt;
	pid_t daemon;
	int r;

	if (env) {
		snprintf(bin, sizeof(bin), "%s", env);
	} else {
		/* build/bench/attach_bench -> build/tensord */
		ssize_t n = readlink("/proc/self/exe", bin, sizeof(bin) - 1);

		bin[n > 0 ? n : 0] = '\0';
		char *slash = strrchr(bin, '/');
		if (slash)
			*slash = '\0';
		slash = strrchr(bin, '/');
		if (slash)
			strcpy(slash, "/tensord");
	}
	snprintf(sock, sizeof(sock), "/tmp/tensord-bench-%d.sock", (int)getpid());
	daemon = start_daemon(bin, sock);
	if (daemon < 0) {
		fprintf(stderr, "could not start %s\n", bin);
		return 1;
	}
	r = tensord_connect(sock, &c);
	if (r == 0)
		r = tensord_connect(sock, &rt);
	if (r < 0) {
		fprintf(stderr, "connect: %s\n", tensord_last_error());
		kill(daemon, SIGTERM);
		return 1;
	}

	printf("tensord attach benchmark, %d iterations each\n", ITERS);
	base = bare_round_trip(v, ITERS);
	report("bare unix-socket round trip", v, ITERS, 0);
	/* Read by each client at its first attach. */
	setenv("TENSORD_BIND", "0", 1);
	r = bench_tensor(rt, "bench/4k", 4096, ITERS, v, base, "(round trip)");
	unsetenv("TENSORD_BIND");
	if (r == 0)
		r = bench_tensor(c, "bench/4k", 4096, ITERS, v, base, "(bound)");
	setenv("TENSORD_BIND", "0", 1);
	if (r == 0)
		r = bench_tensor(rt, "bench/1g", INT64_C(1) << 30, ITERS, v, base, "(round trip)");
	unsetenv("TENSORD_BIND");
	if (r == 0)
		r = bench_tensor(c, "bench/1g", INT64_C(1) << 30, ITERS, v, base, "(bound)");
	if (r < 0) {
		fprintf(stderr, "benchmark failed: %s\n", tensord_last_error());
		r = 1;
	}
	tensord_close(rt);
	tensord_close(c);
	kill(daemon, SIGTERM);
	waitpid(daemon, NULL, 0);
	free(v);
	return r < 0 ? 1 : r;
}
