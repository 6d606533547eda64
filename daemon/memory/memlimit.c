/*
 * The memory this daemon may use: physical memory, or less when a memory
 * cgroup (a container, a systemd unit with MemoryMax=) limits it. Host
 * tensors are charged to the daemon's cgroup, so a default capacity taken
 * from physical memory alone would let the kernel kill the daemon, and
 * every tensor with it, instead of answering ENOSPC.
 *
 * Reads /proc/self/cgroup and, for the cgroup v2 path or the v1 memory
 * controller's path, the limit of that cgroup and of each parent (the
 * smallest wins). Paths are taken under root so that tests can build a
 * fake tree.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memlimit.h"

/* The number in file, or UINT64_MAX for "max", a missing file or garbage. */
static uint64_t read_limit(const char *file)
{
	char buf[64];
	unsigned long long v;
	FILE *f = fopen(file, "re");

	if (!f)
		return UINT64_MAX;
	if (!fgets(buf, sizeof(buf), f) || strncmp(buf, "max", 3) == 0 ||
	    sscanf(buf, "%llu", &v) != 1)
		v = UINT64_MAX;
	fclose(f);
	return v;
}

/* The smallest limit named file in dir and every parent of it up to base. */
static uint64_t walk_up(const char *base, const char *cgpath, const char *file)
{
	char path[PATH_MAX], dir[PATH_MAX];
	uint64_t best = UINT64_MAX;

	snprintf(dir, sizeof(dir), "%s", cgpath);
	for (;;) {
		uint64_t v;
		char *slash;

		if (snprintf(path, sizeof(path), "%s%s/%s", base, strcmp(dir, "/") ? dir : "",
			     file) >= (int)sizeof(path))
			return best; /* too long to be a real cgroup path */
		v = read_limit(path);
		if (v < best)
			best = v;
		slash = strrchr(dir, '/');
		if (!slash || slash == dir) {
			if (strcmp(dir, "/") == 0)
				break;
			snprintf(dir, sizeof(dir), "/");
			continue;
		}
		*slash = '\0';
	}
	return best;
}

/* Whether a v1 controller list ("cpu,cpuacct", "memory") names memory. */
static int has_memory(const char *list)
{
	size_t n = strlen("memory");

	for (const char *p = list; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && strncmp(p, "memory", n) == 0)
			return 1;
		p += len + (end ? 1 : 0);
	}
	return 0;
}

/* A memory cgroup of this process: its hierarchy's mount and its path there. */
struct mem_cgroup {
	char base[PATH_MAX];
	char path[PATH_MAX];
	bool v2;
};

/*
 * The memory cgroups /proc/self/cgroup (under root) names: the v2 one
 * ("0::/path") and the v1 memory controller's, at most one of each, in
 * the file's order. Returns how many (0 to 2).
 */
static int memory_cgroups(const char *root, struct mem_cgroup out[2])
{
	char path[PATH_MAX], line[PATH_MAX];
	int n = 0;
	FILE *f;

	if (snprintf(path, sizeof(path), "%s/proc/self/cgroup", root) >= (int)sizeof(path))
		return 0;
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (n < 2 && fgets(line, sizeof(line), f)) {
		char *ctrl = strchr(line, ':'), *cg;
		struct mem_cgroup *m = &out[n];

		if (!ctrl || !(cg = strchr(ctrl + 1, ':')))
			continue;
		*cg++ = '\0';
		cg[strcspn(cg, "\n")] = '\0';
		ctrl++;
		if (*cg != '/' || (*ctrl && !has_memory(ctrl)) || (n && out[0].v2 == !*ctrl))
			continue;
		m->v2 = !*ctrl;
		if (snprintf(m->base, sizeof(m->base), "%s/sys/fs/cgroup%s", root,
			     m->v2 ? "" : "/memory") >= (int)sizeof(m->base) ||
		    snprintf(m->path, sizeof(m->path), "%s", cg) >= (int)sizeof(m->path))
			continue;
		n++;
	}
	fclose(f);
	return n;
}

uint64_t memlimit_cgroup(const char *root)
{
	struct mem_cgroup cg[2];
	uint64_t best = UINT64_MAX;
	int n = memory_cgroups(root, cg);

	for (int i = 0; i < n; i++) {
		uint64_t v = walk_up(cg[i].base, cg[i].path,
				     cg[i].v2 ? "memory.max" : "memory.limit_in_bytes");

		if (v < best)
			best = v;
	}
	return best;
}

/* The "shmem N" line of a memory.stat file, or UINT64_MAX. */
static uint64_t read_shmem(const char *file)
{
	unsigned long long v = UINT64_MAX;
	char line[128];
	FILE *f = fopen(file, "re");

	if (!f)
		return UINT64_MAX;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "shmem %llu", &v) == 1)
			break;
	fclose(f);
	return v;
}

uint64_t memlimit_shmem(const char *root)
{
	struct mem_cgroup cg[2];
	char path[2 * PATH_MAX + 16];
	uint64_t v = UINT64_MAX;
	int n = memory_cgroups(root, cg);

	for (int i = 0; i < n && v == UINT64_MAX; i++) {
		snprintf(path, sizeof(path), "%s%s/memory.stat", cg[i].base,
			 strcmp(cg[i].path, "/") ? cg[i].path : "");
		v = read_shmem(path);
	}
	return v;
}

uint64_t memlimit_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 2ull << 30;
	uint64_t cg = memlimit_cgroup("");

	return cg < phys ? cg : phys;
}
