/*
 * Small system helpers shared by the daemon and the client library (sys.h):
 * writes, readable memory (/proc/self/maps), polling before sleeping.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "sys.h"

int td_pwrite_all(int fd, const void *data, size_t n, uint64_t off)
{
	const uint8_t *p = data;

	while (n) {
		ssize_t k = pwrite(fd, p, n < (1u << 30) ? n : (1u << 30), (off_t)off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		p += k;
		off += (uint64_t)k;
		n -= (size_t)k;
	}
	return 0;
}

/*
 * The hit rate is an average in 1/1024 that weighs each outcome 1/8.
 * Below RATE_OFF (half) polling backs off; polling resumes as a probe at
 * RATE_PROBE, just above it, so that one miss ends the probe (576 * 7/8 =
 * 504) while hits lift it. A back-off lasts BACKOFF_MIN_NS, or twice the
 * last one (up to BACKOFF_MAX_NS) when polling had resumed less than
 * BACKOFF_MAX_NS before: under a lasting cause polling resumes about once
 * a second, and a second of polling without one starts afresh.
 */
#define RATE_ONE 1024u
#define RATE_OFF 512u
#define RATE_PROBE 576u
#define BACKOFF_MIN_NS (1000 * 1000ull)
#define BACKOFF_MAX_NS (1000 * 1000 * 1000ull)

unsigned td_usable_cpus(void)
{
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;
	unsigned n;

	/* EINVAL: more CPUs than a cpu_set_t holds; the online count then. */
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		n = (unsigned)CPU_COUNT(&set);
	else
		n = online > 0 ? (unsigned)online : 1;
	if (online > 0 && (unsigned long)online < n)
		n = (unsigned)online;
	return n ? n : 1;
}

void td_spin_init(struct td_spin *s)
{
	const char *e = getenv("TENSORD_SPIN_US");

	*s = (struct td_spin){
		.max_us = TD_SPIN_US_DEFAULT,
		.rate = RATE_ONE,
		.count_cpus = td_usable_cpus,
	};
	if (e && *e) {
		s->fixed = true;
		s->max_us = atoi(e) > 0 ? (unsigned)atoi(e) : 0;
	}
}

unsigned td_spin_budget_us(struct td_spin *s, uint64_t now_ns)
{
	if (!s->cpus || now_ns - s->checked_ns >= TD_SPIN_RECHECK_NS) {
		s->cpus = s->count_cpus();
		s->checked_ns = now_ns;
	}
	return td_spin_current_us(s, now_ns);
}

unsigned td_spin_current_us(const struct td_spin *s, uint64_t now_ns)
{
	if (s->fixed)
		return s->max_us;
	if (s->cpus == 1 || now_ns < s->quiet_until_ns) /* 0: not looked at yet */
		return 0;
	return s->max_us;
}

static void back_off(struct td_spin *s, uint64_t now_ns)
{
	if (!s->backoff_ns || now_ns >= s->quiet_until_ns + BACKOFF_MAX_NS)
		s->backoff_ns = BACKOFF_MIN_NS;
	else if (s->backoff_ns < BACKOFF_MAX_NS)
		s->backoff_ns *= 2;
	if (s->backoff_ns > BACKOFF_MAX_NS)
		s->backoff_ns = BACKOFF_MAX_NS;
	s->quiet_until_ns = now_ns + s->backoff_ns;
	s->rate = RATE_PROBE;
	s->backoffs++;
}

void td_spin_record(struct td_spin *s, enum td_spin_outcome how, uint64_t now_ns)
{
	switch (how) {
	case TD_SPIN_HIT:
		s->hits++;
		s->rate += (RATE_ONE - s->rate) / 8;
		return;
	case TD_SPIN_MISS:
		s->misses++;
		s->rate -= s->rate / 8;
		if (!s->fixed && s->rate < RATE_OFF)
			back_off(s, now_ns);
		return;
	case TD_SPIN_LOST:
		s->lost++;
		if (!s->fixed)
			back_off(s, now_ns);
		return;
	}
}

/* PROCMAP_QUERY (Linux 6.11, <linux/fs.h>): one mapping of this process, by address. */
struct td_procmap_query {
	uint64_t size;
	uint64_t query_flags;
	uint64_t query_addr;
	uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};
#define TD_PROCMAP_QUERY _IOWR('f', 17, struct td_procmap_query)
#define TD_PROCMAP_QUERY_VMA_READABLE 0x01

/*
 * td_span_readable() from the text of /proc/self/maps (fd), from address a
 * on, for kernels before 6.11 (no PROCMAP_QUERY): a read of every line, so
 * it costs about a microsecond per mapping of the process (a put into a
 * reserve asks once).
 */
static int span_readable_text(int fd, uintptr_t a, uintptr_t end)
{
	char buf[8192], *line, *nl;
	size_t have = 0;
	ssize_t k;

	while (a < end && (k = read(fd, buf + have, sizeof(buf) - 1 - have)) > 0) {
		have += (size_t)k;
		buf[have] = 0;
		for (line = buf; (nl = strchr(line, '\n')); line = nl + 1) {
			unsigned long lo, hi;
			char perm[5];

			*nl = 0;
			if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perm) != 3 || hi <= a)
				continue;
			if (lo > a || perm[0] != 'r')
				return 0;
			a = hi;
			if (a >= end)
				return 1;
		}
		have = strlen(line);
		if (have >= sizeof(buf) - 1)
			return 0; /* a line longer than any /proc/self/maps line: give up, say unreadable */
		memmove(buf, line, have);
	}
	return a >= end;
}

int td_span_readable(const void *p, uint64_t n)
{
	static bool no_query; /* this kernel has no PROCMAP_QUERY */
	uintptr_t a = (uintptr_t)p, end = a + n;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), r = 1;

	if (fd < 0)
		return -errno;
	while (!__atomic_load_n(&no_query, __ATOMIC_RELAXED) && a < end && r == 1) {
		struct td_procmap_query q = { .size = sizeof(q), .query_addr = a };

		int e = ioctl(fd, TD_PROCMAP_QUERY, &q) < 0 ? errno : 0;

		if (e == ENOTTY || e == EINVAL)
			__atomic_store_n(&no_query, true, __ATOMIC_RELAXED);
		else if (e)
			r = e == ENOENT ? 0 : -e;
		else if (!(q.vma_flags & TD_PROCMAP_QUERY_VMA_READABLE) || q.vma_end <= a)
			r = 0;
		else
			a = (uintptr_t)q.vma_end;
	}
	if (r == 1 && a < end)
		r = span_readable_text(fd, a, end);
	close(fd);
	return r;
}
