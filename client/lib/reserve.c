/*
 * libtensord: the reserve (docs/design.md, "The reserve"). A large host
 * create costs its caller the page tables of a fresh mapping (a fault per
 * 16 pages to fill them, a teardown before the seal) unless the memory was
 * mapped before it was asked for. So a thread per client asks the daemon
 * for ready memory of the sizes this process keeps creating (Reserve), maps
 * it shared and writable, fills its page tables, and keeps it ready; a
 * create of a size that fits names it (Create.reserve) and writes into it
 * at once. The daemon owns and charges every reserve; a Create that names
 * one consumes it, so a slot taken is never given back.
 *
 * What stays true: each reserve is fresh zeroed memory only this process
 * has, and becomes at most one tensor; its mapping is MADV_DONTFORK, so a
 * forked child never holds a writable mapping of it (which would make the
 * parent's publish fail); a slot nobody took for TD_RESERVE_IDLE_NS goes
 * back to the daemon (Unreserve), and every slot goes at tensord_close().
 *
 * Guarded by the client's lock, which the thread never holds across a
 * round trip, a populate or an unmap; it holds it across the mmap and the
 * MADV_DONTFORK, so that no fork() falls between them.
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

/* A class counts as in use after this many creates, each within the idle time of the last. */
#define TD_RESERVE_CREATES 2
/* A slot, or a wanted class, nobody took for this long goes. */
#define TD_RESERVE_IDLE_NS (5000ull * 1000000ull)
/* How long to wait after the daemon had nothing ready (doubling), or refused. */
#define TD_RESERVE_RETRY_MS 5u
#define TD_RESERVE_RETRY_MAX_MS 200u
#define TD_RESERVE_REFUSED_MS 1000u
#define TD_RESERVE_DEFAULT (2ull << 30)
/* What the daemon lets one connection hold in reserves (REGISTRY_RESERVE_BYTES_MAX). */
#define TD_RESERVE_CONN_MAX (2ull << 30)
/*
 * After a take, the next reserve waits until the copy into this one is
 * done (td_reserve_written()), at most this long: making it meanwhile (the
 * daemon zeroing memory, this thread populating) would take memory
 * bandwidth from that copy, which it measurably slows.
 */
#define TD_RESERVE_HOLD_NS (100ull * 1000000ull)
/*
 * A class that still has a reserve ready gets its next one only after
 * this long without a take or a copy into one: a producer that creates
 * two tensors back to back (a put, then a create) would otherwise find
 * the thread, and the daemon's pool behind it, zeroing and populating the
 * next reserve while it fills the second. A class with none ready gets
 * one as soon as the hold ends, unless the process runs on one CPU: there
 * the thread's work runs instead of the caller's, so it waits for the
 * same quiet, which the caller's next call (a create's release, the next
 * put) would otherwise pay for. Only takes that found a reserve count, so
 * a stream of creates that find none waits at most this long.
 */
#define TD_RESERVE_QUIET_NS (10ull * 1000000ull)
/*
 * Classes up to this size keep two reserves ready, so that a put right
 * after a put (or a create right after a put) of the same size finds one
 * while the thread makes the next; larger ones keep one.
 */
#define TD_RESERVE_TWO_MAX (128ull << 20)
/* Bytes populated per call (and per hold of the mmap lock). */
#define TD_RESERVE_POPULATE_STEP (4ull << 20)

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The daemon's size class of size (its pool's: eight steps per power of two, from 1 MiB). */
static uint64_t size_class(uint64_t size)
{
	uint64_t top, step;

	if (size <= TD_RESERVE_MIN)
		return TD_RESERVE_MIN;
	top = 1ull << (63 - __builtin_clzll(size));
	step = top / 8;
	return size > UINT64_MAX - step ? 0 : (size + step - 1) / step * step;
}

/* Whether a reserve of size bytes may hold a tensor of nbytes (the daemon's rule). */
static bool fits(uint64_t size, uint64_t nbytes)
{
	return nbytes <= size && nbytes > size - size / 9;
}

/*
 * TENSORD_RESERVE: bytes, with K, M, G (binary) suffixes; unset: the
 * default. At most what the daemon lets one connection hold.
 */
static uint64_t budget_asked(void);

static uint64_t budget_from_env(void)
{
	uint64_t v = budget_asked();

	return v < TD_RESERVE_CONN_MAX ? v : TD_RESERVE_CONN_MAX;
}

static uint64_t budget_asked(void)
{
	const char *e = getenv("TENSORD_RESERVE");
	char *end;
	unsigned long long v;

	if (!e || !*e)
		return TD_RESERVE_DEFAULT;
	errno = 0;
	v = strtoull(e, &end, 10);
	if (errno || end == e)
		return TD_RESERVE_DEFAULT;
	switch (*end) {
	case 'k':
	case 'K':
		v <<= 10;
		break;
	case 'm':
	case 'M':
		v <<= 20;
		break;
	case 'g':
	case 'G':
		v <<= 30;
		break;
	default:
		break;
	}
	return v;
}

/* Whether this thread may run on two CPUs or more (a copy may use both). */
static bool two_cpus(void)
{
	cpu_set_t set;

	return sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) >= 2;
}

void td_reserve_init(struct td_reserve *r)
{
	pthread_condattr_t attr;

	memset(r, 0, sizeof(*r));
	r->budget = budget_from_env();
	r->making.fd = -1;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cond, &attr);
	pthread_condattr_destroy(&attr);
}

void td_reserve_slot_free(struct td_reserve_slot *s)
{
	if (s->base)
		munmap(s->base, (size_t)s->size);
	if (s->fd >= 0)
		close(s->fd);
	s->base = NULL;
	s->fd = -1;
	s->id = 0;
}

/* Lock held. Moves slot i of the ready ones to *out. */
static void slot_remove(struct td_reserve *r, int i, struct td_reserve_slot *out)
{
	*out = r->ready[i];
	r->ready_bytes -= out->size;
	r->ready[i] = r->ready[--r->n_ready];
}

/* Lock held. The wanted class cls, made (replacing the one least recently wanted) if new. */
static struct td_reserve_want *want_of(struct td_reserve *r, uint64_t cls, uint64_t now)
{
	struct td_reserve_want *w = &r->want[0];

	for (int i = 0; i < TD_RESERVE_SLOTS; i++) {
		if (r->want[i].cls == cls)
			return &r->want[i];
		if (r->want[i].last_ns < w->last_ns)
			w = &r->want[i];
	}
	*w = (struct td_reserve_want){ .cls = cls, .last_ns = now };
	return w;
}

/* Lock held. The wanted class cls, or NULL. */
static struct td_reserve_want *want_find(struct td_reserve *r, uint64_t cls)
{
	for (int i = 0; i < TD_RESERVE_SLOTS; i++)
		if (r->want[i].cls == cls)
			return &r->want[i];
	return NULL;
}

/* Lock held. The ready slot that fits nbytes, or -1. */
static int ready_for(const struct td_reserve *r, uint64_t nbytes)
{
	for (int i = 0; i < r->n_ready; i++)
		if (fits(r->ready[i].size, nbytes))
			return i;
	return -1;
}

static void *reserver(void *arg);

bool td_reserve_take(tensord_client *c, uint64_t nbytes, struct td_reserve_slot *ret)
{
	struct td_reserve *r = &c->reserve;
	uint64_t now, cls = size_class(nbytes);
	struct td_reserve_want *w;
	bool got = false;
	int i;

	if (nbytes < TD_RESERVE_MIN || !cls)
		return false;
	pthread_mutex_lock(&c->lock);
	if (!r->budget || r->off || r->stop || c->inherited || c->conn.closed) {
		pthread_mutex_unlock(&c->lock);
		return false;
	}
	now = mono_ns();
	w = want_of(r, cls, now);
	w->creates = now - w->last_ns > TD_RESERVE_IDLE_NS ? 1 : w->creates + 1;
	w->last_ns = now;
	i = ready_for(r, nbytes);
	if (i >= 0) {
		slot_remove(r, i, ret);
		got = true;
		r->writing++;
		r->hold_until = now + TD_RESERVE_HOLD_NS;
		r->busy_ns = now;
	}
	/* Without a thread nothing is made: slower, never wrong. */
	if (!r->started && w->creates >= TD_RESERVE_CREATES) {
		r->started = pthread_create(&r->thread, NULL, reserver, c) == 0;
		r->off = !r->started;
	}
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&c->lock);
	return got;
}

void td_reserve_written(tensord_client *c)
{
	struct td_reserve *r = &c->reserve;

	pthread_mutex_lock(&c->lock);
	if (r->writing && --r->writing == 0) {
		r->hold_until = 0;
		r->busy_ns = mono_ns();
		pthread_cond_signal(&r->cond);
	}
	pthread_mutex_unlock(&c->lock);
}

/*
 * Lock held. The class to make a reserve of now, or 0; *due (if not 0)
 * gets the earliest time something will be due: a retry, an expiry, the
 * end of a hold.
 */
static uint64_t next_class(struct td_reserve *r, uint64_t now, uint64_t *due)
{
	bool one_cpu = !two_cpus();

	if (now < r->hold_until) {
		*due = !*due || r->hold_until < *due ? r->hold_until : *due;
		return 0;
	}
	for (int i = 0; i < TD_RESERVE_SLOTS; i++) {
		struct td_reserve_want *w = &r->want[i];
		int have = 0;

		if (!w->cls || w->creates < TD_RESERVE_CREATES ||
		    now - w->last_ns >= TD_RESERVE_IDLE_NS)
			continue;
		for (int k = 0; k < r->n_ready; k++)
			have += fits(r->ready[k].size, w->cls);
		if (have >= (w->cls <= TD_RESERVE_TWO_MAX ? 2 : 1) ||
		    r->n_ready >= TD_RESERVE_SLOTS || r->ready_bytes + w->cls > r->budget)
			continue;
		uint64_t at = (have || one_cpu) && r->busy_ns + TD_RESERVE_QUIET_NS > w->retry_ns
				      ? r->busy_ns + TD_RESERVE_QUIET_NS
				      : w->retry_ns;

		if (now < at) {
			if (!*due || at < *due)
				*due = at;
			continue;
		}
		return w->cls;
	}
	return 0;
}

/*
 * Lock held. Moves to gone (room for TD_RESERVE_SLOTS) the ready slots
 * whose class nobody created for TD_RESERVE_IDLE_NS; returns how many.
 * *due gets when the next one would go.
 */
static int expire(struct td_reserve *r, uint64_t now, uint64_t *due, struct td_reserve_slot *gone)
{
	int n = 0;

	for (int i = r->n_ready; i-- > 0;) {
		uint64_t last = 0;

		for (int k = 0; k < TD_RESERVE_SLOTS; k++)
			if (r->want[k].cls && fits(r->ready[i].size, r->want[k].cls) &&
			    r->want[k].last_ns > last)
				last = r->want[k].last_ns;
		if (now - last >= TD_RESERVE_IDLE_NS) {
			slot_remove(r, i, &gone[n++]);
		} else if (!*due || last + TD_RESERVE_IDLE_NS < *due) {
			*due = last + TD_RESERVE_IDLE_NS;
		}
	}
	return n;
}

/* Gives a slot back: unmapped, closed, and freed by the daemon (one-way). */
static void give_back(tensord_client *c, struct td_reserve_slot *s)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Unreserve un = TENSORD__UNRESERVE__INIT;
	char saved[512];

	un.id = s->id;
	td_reserve_slot_free(s);
	req.body_case = TENSORD__REQUEST__BODY_UNRESERVE;
	req.unreserve = &un;
	snprintf(saved, sizeof(saved), "%s", tensord_last_error());
	td_send_oneway(c, &req);
	td_set_error(0, "%s", saved);
}

/*
 * Fills the page tables of n bytes at p. Every page is up to date (the
 * daemon wrote its zeroes), so a read fault maps 16 of them, writable: a
 * shared mapping of tmpfs needs no write notification. By reading a byte
 * of each page rather than with MADV_POPULATE_READ, which walks every page
 * through get_user_pages after each fault: 64 MiB took 2.2-2.8 ms so
 * against 3.7 ms (a C loop on this VM), CPU time that on one CPU is the
 * caller's. No read can fault where MADV_POPULATE_READ would have
 * failed: the memfd was checked to be as large as the mapping, and every
 * page of a pool memfd exists (written, populated or fallocated by the
 * daemon), so none is allocated here.
 */
static void populate(void *p, uint64_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	for (uint64_t off = 0; off < n; off += TD_RESERVE_POPULATE_STEP) {
		const volatile uint8_t *at = (const uint8_t *)p + off;
		size_t len =
			(size_t)(n - off < TD_RESERVE_POPULATE_STEP ? n - off
								    : TD_RESERVE_POPULATE_STEP);

		for (size_t o = 0; o < len; o += page)
			(void)at[o];
	}
}

/* The reserve being made is no longer the fork's to close: its caller closes or keeps it. */
static void unmake(tensord_client *c)
{
	pthread_mutex_lock(&c->lock);
	c->reserve.making = (struct td_reserve_slot){ .fd = -1 };
	pthread_mutex_unlock(&c->lock);
}

/*
 * Unlocked: asks the daemon for a reserve of class cls and maps it, its
 * page tables filled. 0 and the slot ready, or the daemon's -errno.
 */
static int make_one(tensord_client *c, uint64_t cls)
{
	struct td_reserve *r = &c->reserve;
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Reserve rq = TENSORD__RESERVE__INIT;
	struct td_reserve_slot s = { .fd = -1 };
	Tensord__Reply *rep;
	struct stat st;
	void *p;
	int e;

	rq.size = cls;
	req.body_case = TENSORD__REQUEST__BODY_RESERVE;
	req.reserve = &rq;
	e = td_rpc(c, &req, &rep, &s.fd);
	if (e < 0)
		return e;
	/* From now on a fork finds the descriptor (td_reserve_after_fork()):
	 * a child must never have it, even before it is mapped. */
	pthread_mutex_lock(&c->lock);
	r->making.fd = s.fd;
	pthread_mutex_unlock(&c->lock);
	if (rep->body_case != TENSORD__REPLY__BODY_RESERVE || s.fd < 0 || !rep->reserve->id ||
	    rep->reserve->size < TD_RESERVE_MIN || rep->reserve->size > SIZE_MAX) {
		tensord__reply__free_unpacked(rep, NULL);
		unmake(c);
		if (s.fd >= 0)
			close(s.fd);
		return -EPROTO;
	}
	s.id = rep->reserve->id;
	s.size = rep->reserve->size;
	tensord__reply__free_unpacked(rep, NULL);
	/* populate() reads every page: one past the memfd's end would be SIGBUS. */
	if (fstat(s.fd, &st) < 0 || st.st_size < 0 || (uint64_t)st.st_size < s.size) {
		unmake(c);
		give_back(c, &s);
		return -EPROTO;
	}
	/* No fork between the mapping and MADV_DONTFORK: fork takes this lock. */
	pthread_mutex_lock(&c->lock);
	r->making = s;
	p = mmap(NULL, (size_t)s.size, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
	if (p != MAP_FAILED && madvise(p, (size_t)s.size, MADV_DONTFORK) < 0) {
		munmap(p, (size_t)s.size);
		p = MAP_FAILED;
	}
	e = p == MAP_FAILED ? -errno : 0;
	r->making.base = p == MAP_FAILED ? NULL : p;
	s = r->making;
	pthread_mutex_unlock(&c->lock);
	if (e == 0) {
		populate(p, s.size);
		(void)madvise(p, (size_t)s.size, MADV_RANDOM);
	}
	pthread_mutex_lock(&c->lock);
	r->making = (struct td_reserve_slot){ .fd = -1 };
	if (e == 0 && !r->stop && r->n_ready < TD_RESERVE_SLOTS) {
		r->ready[r->n_ready++] = s;
		r->ready_bytes += s.size;
		s.id = 0;
	}
	pthread_mutex_unlock(&c->lock);
	if (s.id)
		give_back(c, &s);
	return e;
}

/*
 * On one CPU the thread's work (a Reserve round trip, populating) runs
 * instead of the caller's, and a thread that wakes preempts the one
 * running: signalled by a put's unmap or a create's publish, it took the
 * CPU before that call returned (a pinned put or publish of 64 MiB paid
 * 3-5 ms for it). SCHED_BATCH keeps the same share of the CPU but never
 * preempts on waking; with two CPUs or more it goes back to SCHED_OTHER,
 * so that it is not held back behind other work. Only a thread that started SCHED_OTHER is touched
 * (a real-time caller's policy is inherited and kept); both switches are
 * allowed without privilege.
 */
static void background(int *policy)
{
	struct sched_param sp = { 0 };
	int want = two_cpus() ? SCHED_OTHER : SCHED_BATCH;

	if ((*policy == SCHED_OTHER || *policy == SCHED_BATCH) && *policy != want &&
	    pthread_setschedparam(pthread_self(), want, &sp) == 0)
		*policy = want;
}

static void wait_until(struct td_reserve *r, pthread_mutex_t *lock, uint64_t due)
{
	struct timespec ts = { .tv_sec = (time_t)(due / 1000000000ull),
			       .tv_nsec = (long)(due % 1000000000ull) };

	if (due)
		pthread_cond_timedwait(&r->cond, lock, &ts);
	else
		pthread_cond_wait(&r->cond, lock);
}

static void *reserver(void *arg)
{
	tensord_client *c = arg;
	struct td_reserve *r = &c->reserve;
	struct td_reserve_slot gone[TD_RESERVE_SLOTS];
	struct sched_param sp;
	int policy;

	if (pthread_getschedparam(pthread_self(), &policy, &sp) != 0)
		policy = -1;
	pthread_mutex_lock(&c->lock);
	while (!r->stop && !c->conn.closed) {
		uint64_t now = mono_ns(), due = 0, cls;
		int n;

		n = expire(r, now, &due, gone);
		struct td_reserve_want *w;
		int e;

		cls = n ? 0 : next_class(r, now, &due);
		if (!n && !cls) {
			wait_until(r, &c->lock, due);
			continue;
		}
		pthread_mutex_unlock(&c->lock);
		background(&policy);
		for (int i = 0; i < n; i++)
			give_back(c, &gone[i]);
		e = cls ? make_one(c, cls) : 0;
		pthread_mutex_lock(&c->lock);
		w = cls ? want_find(r, cls) : NULL;
		if (!w || e == 0) {
			if (w)
				w->backoff_ms = 0;
			continue;
		}
		if (e == -EAGAIN) {
			/* Nothing ready yet: the daemon's pool wants the class now. */
			w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : TD_RESERVE_RETRY_MS;
			if (w->backoff_ms > TD_RESERVE_RETRY_MAX_MS)
				w->backoff_ms = TD_RESERVE_RETRY_MAX_MS;
		} else if (e == -EBADMSG || e == -ENODEV || e == -EPROTO) {
			/* A daemon that keeps no reserves (or not for us): stop asking. */
			r->off = true;
			break;
		} else {
			w->backoff_ms = TD_RESERVE_REFUSED_MS;
		}
		w->retry_ns = mono_ns() + (uint64_t)w->backoff_ms * 1000000ull;
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

void td_reserve_stop(tensord_client *c)
{
	struct td_reserve *r = &c->reserve;
	struct td_reserve_slot gone[TD_RESERVE_SLOTS];
	bool join;
	int n = 0;

	pthread_mutex_lock(&c->lock);
	r->stop = true;
	join = r->started;
	r->started = false;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&c->lock);
	if (join)
		pthread_join(r->thread, NULL);
	pthread_mutex_lock(&c->lock);
	while (r->n_ready)
		slot_remove(r, r->n_ready - 1, &gone[n++]);
	pthread_mutex_unlock(&c->lock);
	/* The daemon frees them when the connection ends, or at once: */
	for (int i = 0; i < n; i++)
		give_back(c, &gone[i]);
}

void td_reserve_after_fork(struct td_reserve *r)
{
	/* The mappings are not here (MADV_DONTFORK); the descriptors are. */
	for (int i = 0; i < r->n_ready; i++)
		if (r->ready[i].fd >= 0)
			close(r->ready[i].fd);
	if (r->making.fd >= 0)
		close(r->making.fd);
	r->n_ready = 0;
	r->ready_bytes = 0;
	r->making = (struct td_reserve_slot){ .fd = -1 };
	/* The thread was not copied; an inherited client makes no reserves. */
	r->started = false;
	r->stop = true;
	pthread_cond_init(&r->cond, NULL);
}

void td_reserve_untake(tensord_client *c, struct td_reserve_slot *s)
{
	struct td_reserve *r = &c->reserve;
	bool kept = false;

	if (!s->base)
		return;
	pthread_mutex_lock(&c->lock);
	if (!r->stop && r->n_ready < TD_RESERVE_SLOTS) {
		r->ready[r->n_ready++] = *s;
		r->ready_bytes += s->size;
		kept = true;
	}
	pthread_mutex_unlock(&c->lock);
	if (kept)
		*s = (struct td_reserve_slot){ .fd = -1 };
	else
		give_back(c, s);
	td_reserve_written(c);
}
