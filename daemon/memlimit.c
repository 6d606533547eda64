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

uint64_t memlimit_cgroup(const char *root)
{
	char path[PATH_MAX], base[PATH_MAX], line[PATH_MAX];
	uint64_t best = UINT64_MAX;
	FILE *f;

	if (snprintf(path, sizeof(path), "%s/proc/self/cgroup", root) >= (int)sizeof(path))
		return UINT64_MAX;
	f = fopen(path, "re");
	if (!f)
		return UINT64_MAX;
	while (fgets(line, sizeof(line), f)) {
		char *ctrl = strchr(line, ':'), *cg;
		uint64_t v;

		if (!ctrl || !(cg = strchr(ctrl + 1, ':')))
			continue;
		*cg++ = '\0';
		cg[strcspn(cg, "\n")] = '\0';
		ctrl++;
		if (*cg != '/')
			continue;
		if (*ctrl == '\0') { /* v2: "0::/path" */
			if (snprintf(base, sizeof(base), "%s/sys/fs/cgroup", root) >=
			    (int)sizeof(base))
				continue;
			v = walk_up(base, cg, "memory.max");
		} else if (has_memory(ctrl)) {
			if (snprintf(base, sizeof(base), "%s/sys/fs/cgroup/memory", root) >=
			    (int)sizeof(base))
				continue;
			v = walk_up(base, cg, "memory.limit_in_bytes");
		} else {
			continue;
		}
		if (v < best)
			best = v;
	}
	fclose(f);
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
	char path[PATH_MAX], line[PATH_MAX];
	uint64_t v = UINT64_MAX;
	FILE *f;

	if (snprintf(path, sizeof(path), "%s/proc/self/cgroup", root) >= (int)sizeof(path))
		return UINT64_MAX;
	f = fopen(path, "re");
	if (!f)
		return UINT64_MAX;
	while (v == UINT64_MAX && fgets(line, sizeof(line), f)) {
		char *ctrl = strchr(line, ':'), *cg;

		if (!ctrl || !(cg = strchr(ctrl + 1, ':')))
			continue;
		*cg++ = '\0';
		cg[strcspn(cg, "\n")] = '\0';
		ctrl++;
		if (*cg != '/' || (*ctrl && !has_memory(ctrl)))
			continue;
		if (snprintf(path, sizeof(path), "%s/sys/fs/cgroup%s%s/memory.stat", root,
			     *ctrl ? "/memory" : "", strcmp(cg, "/") ? cg : "") < (int)sizeof(path))
			v = read_shmem(path);
	}
	fclose(f);
	return v;
}

uint64_t memlimit_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 2ull << 30;
	uint64_t cg = memlimit_cgroup("");

	return cg < phys ? cg : phys;
}
