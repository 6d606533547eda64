/*
 * Small system helpers the daemon and the client library share: writing
 * through a descriptor, whether memory of this process can be read, and
 * whether and how long to poll before sleeping.
 */
#ifndef TENSORD_SYS_H
#define TENSORD_SYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Writes n bytes at offset off of fd with pwrite(), in pieces of at most
 * 1 GiB, retrying after EINTR. 0 or -errno (-EIO for a write of nothing).
 */
int td_pwrite_all(int fd, const void *data, size_t n, uint64_t off);

/*
 * 1 when every byte of [p, p + n) lies in readable mappings of this
 * process, 0 when some does not, -errno when it cannot tell. A copy by
 * memcpy() from such memory would crash the caller (SIGSEGV), where
 * pwrite() answers -EFAULT. Asks the kernel by address (PROCMAP_QUERY,
 * Linux 6.11), else reads /proc/self/maps.
 */
int td_span_readable(const void *p, uint64_t n);

/*
 * Polling for the peer before sleeping (docs/design.md, "Polling instead
 * of sleeping"). A waiter asks td_spin_budget_us() before each wait, polls
 * that long (0: not at all), and tells td_spin_record() how the poll
 * ended. The budget is TD_SPIN_US_DEFAULT, or 0:
 *
 *   - while the calling thread may run on fewer than 2 CPUs (its affinity,
 *     which a cgroup cpuset narrows too, and the CPUs online), looked at
 *     again at most every TD_SPIN_RECHECK_NS: polling there only keeps the
 *     peer from running;
 *   - while backing off, which starts when fewer than half of the recent
 *     polls hit (an average that weighs each outcome 1/8), or at once
 *     when a poll lost the CPU (TD_SPIN_LOST): polling stops for 1 ms,
 *     then resumes as a probe that one more miss ends again; the pause
 *     doubles, up to 1 s, while polling keeps ending within a second of
 *     resuming, and starts again at 1 ms after a second without a back-off.
 *
 * $TENSORD_SPIN_US, when set and not empty, fixes the budget instead: 0
 * never polls, N polls N microseconds whatever the CPUs and the outcomes
 * (which are still counted, and the CPUs still looked at, for figures).
 *
 * One struct per waiter that keeps its own statistics (a connection, the
 * daemon's loop); not thread-safe: one thread uses it at a time. Nothing
 * here sleeps, allocates or reads the clock: times are the caller's
 * CLOCK_MONOTONIC nanoseconds.
 */
#define TD_SPIN_US_DEFAULT 50
#define TD_SPIN_RECHECK_NS (10 * 1000 * 1000ull)
/* A gap this long between two looks at the clock while polling, each a
 * microsecond or so apart, means the thread lost its CPU meanwhile. */
#define TD_SPIN_LOST_NS (50 * 1000ull)

enum td_spin_outcome {
	TD_SPIN_HIT,  /* what was awaited came while polling */
	TD_SPIN_MISS, /* the budget ran out first */
	/* The thread was off its CPU for over TD_SPIN_LOST_NS while it polled:
	 * another thread wanted that CPU (a CPU hog, the peer itself), so
	 * polling burns time someone else needs, and the scheduler, counting
	 * it against this thread, will make it wait when it next wakes. */
	TD_SPIN_LOST,
};

struct td_spin {
	unsigned max_us; /* the budget when polling pays */
	bool fixed;      /* $TENSORD_SPIN_US set: max_us always, nothing adapts */
	unsigned cpus;   /* CPUs the thread could use at checked_ns; 0: not known yet */
	uint64_t checked_ns;
	unsigned rate;                         /* recent polls that hit, in 1/1024 */
	uint64_t quiet_until_ns;               /* no polling before this; polling resumed then */
	uint64_t backoff_ns;                   /* the last back-off's length; 0: none yet */
	unsigned (*count_cpus)(void);          /* td_usable_cpus(); tests put a stand-in here */
	uint64_t hits, misses, lost, backoffs; /* since td_spin_init() */
};

/* Starts the statistics afresh and reads $TENSORD_SPIN_US. */
void td_spin_init(struct td_spin *s);

/* Microseconds to poll before the wait that starts at now_ns; 0: sleep at once. */
unsigned td_spin_budget_us(struct td_spin *s, uint64_t now_ns);

/*
 * The budget as of the last look at the CPUs, looking at nothing: for
 * figures, which must not change what they show.
 */
unsigned td_spin_current_us(const struct td_spin *s, uint64_t now_ns);

/*
 * How a poll that td_spin_budget_us() allowed ended, at now_ns. A wait
 * that found what it awaited at the first look, before polling at all,
 * is none of these and is not recorded.
 */
void td_spin_record(struct td_spin *s, enum td_spin_outcome how, uint64_t now_ns);

/*
 * CPUs the calling thread may run on: its affinity mask (narrowed by any
 * cpuset) counted, and no more than the CPUs online. At least 1.
 */
unsigned td_usable_cpus(void);

#endif /* TENSORD_SYS_H */
