/* Small system helpers shared by the daemon and the client library (sys.h). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
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
