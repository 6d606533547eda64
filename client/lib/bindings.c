/*
 * libtensord: attach without a round trip (docs/design.md, "Attach without
 * a round trip").
 *
 * An attach asks the daemon to bind its lease (Attach.bind). The daemon
 * answers with a slot of this connection's binding page and a generation
 * it wrote there; the lease becomes a binding's (struct td_binding), kept
 * while the name means that tensor. A later attach of the name in this
 * process reads the slot: while it still holds the generation, the name
 * still means the tensor the binding leases, and a local lease on it
 * (lease.c, td_lease_local()) is all the attach needs: no request, no
 * descriptor, no mmap. The daemon clears the slot before it answers
 * whoever unlinked or replaced the name, so an attach that starts after
 * that finds it cleared and asks the daemon, as it always did.
 *
 * A binding is held by the table while listed, and by each local lease.
 * It leaves the table when its slot is found cleared (by the watcher
 * thread, woken by the daemon through the page's futex, or by the next
 * attach), when a newer binding of the name comes, or at close; its last
 * reference sends the Release of the daemon's lease. So the memory of an
 * unlinked or replaced tensor is let go when its last local lease ends,
 * or at once when none is left.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bindings.h"
#include "client.h"
#include "common/hash.h"

struct td_binding {
	struct td_binding *hnext; /* bucket chain while listed; the list of those going */
	uint64_t hash;
	atomic_uint refs;  /* the table's while listed, and one per local lease */
	tensord_client *c; /* borrowed: the table is c's, and local leases hold c */
	uint64_t lease_id; /* the daemon's lease, ended by the last reference */
	uint32_t slot;
	uint64_t gen;
	_Atomic uint64_t *count; /* the page's count of local leases, read by the daemon */
	unsigned forks;          /* td_forks when made: in a child the page is not mapped */
	struct td_mapping *map;  /* one reference; NULL for zero-size */
	bool writable;
	bool listed;         /* in the table (guarded by the client's lock, as idle) */
	uint64_t idle_since; /* CLOCK_MONOTONIC; 0: some local lease uses it */
	TAILQ_ENTRY(td_binding) idle_link;
	tensord_info info;
};

static void binding_free(struct td_binding *b);
static void drop_list(struct td_binding *gone);

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* b is used again, or leaves the table. Lock held. */
static void idle_end(struct td_bindings *bs, struct td_binding *b)
{
	if (!b->idle_since)
		return;
	TAILQ_REMOVE(&bs->idle, b, idle_link);
	bs->n_idle--;
	b->idle_since = 0;
}

/* Takes b, just out of its bucket, out of the table onto *gone. Lock held. */
static void unlist(struct td_bindings *bs, struct td_binding *b, struct td_binding **gone)
{
	idle_end(bs, b);
	b->listed = false;
	b->hnext = *gone;
	*gone = b;
	bs->n--;
}

static struct td_binding **bucket(struct td_bindings *bs, uint64_t hash)
{
	return &bs->tab[hash & (bs->cap - 1)];
}

/* Takes b (listed) out of its bucket and the table, onto *gone. Lock held. */
static void unlist_one(struct td_bindings *bs, struct td_binding *b, struct td_binding **gone)
{
	struct td_binding **pp = bucket(bs, b->hash);

	while (*pp != b)
		pp = &(*pp)->hnext;
	*pp = b->hnext;
	unlist(bs, b, gone);
}

/* Idle bindings past their time, or past the most kept, leave the table. Lock held. */
static void idle_expire(struct td_bindings *bs, uint64_t now, struct td_binding **gone)
{
	struct td_binding *b;

	while ((b = TAILQ_FIRST(&bs->idle)) &&
	       (bs->n_idle > TD_BIND_IDLE_MAX || now - b->idle_since >= TD_BIND_IDLE_NS))
		unlist_one(bs, b, gone);
}

/* The count of slots the daemon cleared: word 0's low half, a futex. */
static const _Atomic uint32_t *clears_word(const struct td_bindings *bs)
{
	return (const _Atomic uint32_t *)(const void *)bs->words;
}

static uint32_t clears_now(const struct td_bindings *bs)
{
	return atomic_load_explicit(clears_word(bs), memory_order_acquire);
}

static bool holds(const struct td_bindings *bs, const struct td_binding *b)
{
	return atomic_load_explicit(&bs->words[b->slot], memory_order_acquire) == b->gen;
}

/* Forks this process made a child in (fork.c counts them in the child). */
atomic_uint td_forks;

void td_binding_local_end(struct td_binding *b)
{
	tensord_client *c = b->c;
	struct td_bindings *bs = &c->binds;
	struct td_binding *gone = NULL;
	unsigned left;
	bool wake = false;

	if (atomic_load_explicit(&td_forks, memory_order_relaxed) != b->forks) {
		td_binding_unref(b); /* a forked child's: no page, no table here */
		return;
	}
	atomic_fetch_sub_explicit(b->count, 1, memory_order_relaxed);
	pthread_mutex_lock(&c->lock);
	left = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) - 1;
	/* The table's reference alone is left: b waits idle for the next attach. */
	if (left == 1 && b->listed) {
		b->idle_since = mono_ns();
		TAILQ_INSERT_TAIL(&bs->idle, b, idle_link);
		bs->n_idle++;
		idle_expire(bs, b->idle_since, &gone);
		wake = bs->watcher_long && bs->thread_on;
		bs->watcher_long = false;
	}
	pthread_mutex_unlock(&c->lock);
	if (wake)
		syscall(SYS_futex, clears_word(bs), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	drop_list(gone);
	/* Out of the table already: this was the last reference. */
	if (left == 0)
		binding_free(b);
}

void td_binding_unref(struct td_binding *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		binding_free(b);
}

static void binding_free(struct td_binding *b)
{
	tensord_client *c = b->c;

	DLDevice dev = { kDLCPU, 0 };
	bool after_sync = td_release_needs_sync(b->map, &dev);
	bool revoked = b->map && b->map->revoked;

	/* The table's reference goes last: no local lease is left to count. */
	if (b->map)
		td_mapcache_unref(&c->maps, b->map);
	after_sync = after_sync && td_release_last_of_import(revoked);
	if (after_sync)
		td_release_after_sync(c, b->lease_id, dev);
	else
		td_release(c, b->lease_id);
	free(b);
}

/* Drops the table's reference on each of the list (linked by hnext). No lock held. */
static void drop_list(struct td_binding *gone)
{
	while (gone) {
		struct td_binding *next = gone->hnext;

		td_binding_unref(gone);
		gone = next;
	}
}

/* Unlists every binding for which drop(b) says so, onto *gone. Lock held. */
static void unlist_if(struct td_bindings *bs,
		      bool (*drop)(const struct td_bindings *, const struct td_binding *),
		      struct td_binding **gone)
{
	for (uint32_t i = 0; i < bs->cap; i++) {
		struct td_binding **pp = &bs->tab[i];

		while (*pp) {
			struct td_binding *b = *pp;

			if (!drop(bs, b)) {
				pp = &b->hnext;
				continue;
			}
			*pp = b->hnext;
			unlist(bs, b, gone);
		}
	}
}

static bool stale(const struct td_bindings *bs, const struct td_binding *b)
{
	return !holds(bs, b);
}

static bool any(const struct td_bindings *bs, const struct td_binding *b)
{
	(void)bs;
	(void)b;
	return true;
}

/* Lets go of what the daemon cleared since the last sweep. Lock held. */
static struct td_binding *sweep_locked(struct td_bindings *bs)
{
	struct td_binding *gone = NULL;
	uint32_t now = clears_now(bs);

	if (now == bs->seen)
		return NULL;
	bs->seen = now;
	unlist_if(bs, stale, &gone);
	return gone;
}

/*
 * Waits on the page's futex for the daemon to clear slots, and lets go of
 * their bindings: the memory of a tensor whose name moved on is released
 * as soon as no local lease uses it, also in a process that attaches
 * nothing more. The timeout is only a backstop for a missed stop.
 */
static void *watcher(void *arg)
{
	tensord_client *c = arg;
	struct td_bindings *bs = &c->binds;
	uint32_t seen;

	/* What the bindings listed so far were made after: a clear since then
	 * (even before this thread ran) is one to sweep for. */
	pthread_mutex_lock(&c->lock);
	seen = bs->seen;
	pthread_mutex_unlock(&c->lock);
	while (!atomic_load(&bs->stop)) {
		struct timespec ts = { 10, 0 };
		struct td_binding *gone = NULL, *oldest;
		uint64_t t, now_ns;
		uint32_t now;

		pthread_mutex_lock(&c->lock);
		oldest = TAILQ_FIRST(&bs->idle);
		if (oldest) {
			now_ns = mono_ns();
			t = oldest->idle_since + TD_BIND_IDLE_NS;
			t = (t > now_ns ? t - now_ns : 0) + 1000000;
			ts.tv_sec = (time_t)(t / 1000000000ull);
			ts.tv_nsec = (long)(t % 1000000000ull);
		}
		bs->watcher_long = !oldest;
		pthread_mutex_unlock(&c->lock);
		syscall(SYS_futex, clears_word(bs), FUTEX_WAIT, seen, &ts, NULL, 0);
		/* Woken by a commit that also woke this process's reader (a
		 * watch event, a waiter's reply): letting go of memory can wait
		 * for it, so the reader runs first where the two share a CPU. */
		sched_yield();
		now = clears_now(bs);
		pthread_mutex_lock(&c->lock);
		if (bs->state == TD_BIND_ON) {
			if (now != seen)
				gone = sweep_locked(bs);
			idle_expire(bs, mono_ns(), &gone);
		}
		bs->watcher_long = false;
		pthread_mutex_unlock(&c->lock);
		seen = now;
		drop_list(gone);
	}
	return NULL;
}

static void watcher_stop(tensord_client *c)
{
	struct td_bindings *bs = &c->binds;
	bool on;

	pthread_mutex_lock(&c->lock);
	on = bs->thread_on;
	bs->thread_on = false;
	pthread_mutex_unlock(&c->lock);
	if (!on)
		return;
	atomic_store(&bs->stop, true);
	/* A wake that comes before the watcher waits is lost: wake until it is gone. */
	for (;;) {
		struct timespec until;

		syscall(SYS_futex, clears_word(bs), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 2000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		if (pthread_timedjoin_np(bs->thread, NULL, &until) != ETIMEDOUT)
			break;
	}
}

/* Asks for the page and maps it: 0, or -errno (attaches take round trips). */
static int page_open(tensord_client *c, const _Atomic uint64_t **ret_words, uint32_t *ret_n)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__BindPage bp = TENSORD__BIND_PAGE__INIT;
	Tensord__Reply *rep;
	uint32_t n;
	void *p;
	int fd, r;

	req.body_case = TENSORD__REQUEST__BODY_BIND_PAGE;
	req.bind_page = &bp;
	r = td_rpc(c, &req, &rep, &fd);
	if (r < 0)
		return r;
	n = rep->body_case == TENSORD__REPLY__BODY_BIND_PAGE ? rep->bind_page->slots : 0;
	tensord__reply__free_unpacked(rep, NULL);
	if (fd < 0 || n < 2 || n > (1u << 20)) {
		if (fd >= 0)
			close(fd);
		return -EPROTO;
	}
	/*
	 * The daemon's half read-only, ours (the counts) writable. A forked
	 * child has no page (it makes its own connection, lifecycle.c): no fork
	 * between the mmap and MADV_DONTFORK, as fork takes the client's lock.
	 */
	pthread_mutex_lock(&c->lock);
	p = mmap(NULL, 2 * (size_t)n * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	r = p == MAP_FAILED ? -errno : 0;
	if (r == 0 && (madvise(p, 2 * (size_t)n * sizeof(uint64_t), MADV_DONTFORK) < 0 ||
		       mprotect(p, (size_t)n * sizeof(uint64_t), PROT_READ) < 0)) {
		r = -errno;
		munmap(p, 2 * (size_t)n * sizeof(uint64_t));
	}
	pthread_mutex_unlock(&c->lock);
	close(fd);
	if (r < 0)
		return r;
	*ret_words = p;
	*ret_n = n;
	return 0;
}

bool td_bindings_ready(tensord_client *c)
{
	struct td_bindings *bs = &c->binds;
	const _Atomic uint64_t *words = NULL;
	const char *env;
	uint32_t n = 0;
	int r;

	pthread_mutex_lock(&c->lock);
	/*
	 * A connection that attaches once (a command-line tool, a one-shot
	 * script) never pays for a page and a watcher thread: the page is
	 * asked for by the second attach that takes a round trip.
	 */
	if (bs->state != TD_BIND_UNTRIED || bs->round_trips++ == 0) {
		bool on = bs->state == TD_BIND_ON;

		pthread_mutex_unlock(&c->lock);
		return on;
	}
	bs->state = TD_BIND_SETTING;
	TAILQ_INIT(&bs->idle);
	pthread_mutex_unlock(&c->lock);

	env = getenv("TENSORD_BIND");
	r = env && strcmp(env, "0") == 0 ? -ENOTSUP : 0;
	/* Without a page (an older daemon, an old kernel) nothing is wrong. */
	if (r == 0)
		r = page_open(c, &words, &n);
	pthread_mutex_lock(&c->lock);
	if (r == 0 && !c->conn.closed) {
		bs->words = words;
		bs->n_words = n;
		bs->seen = clears_now(bs);
		bs->state = TD_BIND_ON;
		atomic_store(&bs->stop, false);
		bs->thread_on = pthread_create(&bs->thread, NULL, watcher, c) == 0;
	} else {
		if (r == 0)
			munmap((void *)words, 2 * (size_t)n * sizeof(uint64_t));
		bs->state = TD_BIND_OFF;
	}
	r = bs->state == TD_BIND_ON;
	pthread_mutex_unlock(&c->lock);
	return r;
}

static struct td_binding *find(struct td_bindings *bs, uint64_t hash, const char *name)
{
	struct td_binding *b;

	if (!bs->cap)
		return NULL;
	for (b = *bucket(bs, hash); b; b = b->hnext)
		if (b->hash == hash && strcmp(b->info.name, name) == 0)
			return b;
	return NULL;
}

/* Room for one more: false without memory (the binding is then not listed). Lock held. */
static bool room(struct td_bindings *bs)
{
	struct td_binding **tab, *b;
	uint32_t cap;

	if (bs->n < bs->cap)
		return true;
	cap = bs->cap ? bs->cap * 2 : 64;
	tab = calloc(cap, sizeof(*tab));
	if (!tab)
		return false;
	for (uint32_t i = 0; i < bs->cap; i++) {
		while ((b = bs->tab[i])) {
			bs->tab[i] = b->hnext;
			b->hnext = tab[b->hash & (cap - 1)];
			tab[b->hash & (cap - 1)] = b;
		}
	}
	free(bs->tab);
	bs->tab = tab;
	bs->cap = cap;
	return true;
}

int td_binding_attach(tensord_client *c, const char *name, struct td_lease **ret_lease)
{
	struct td_bindings *bs = &c->binds;
	struct td_binding *b, *gone = NULL;
	struct td_mapping *m = NULL;
	const struct td_importer *imp;
	uint64_t hash;
	bool need_view = false;
	int r;

	pthread_mutex_lock(&c->lock);
	if (bs->state != TD_BIND_ON || !bs->n) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	hash = td_hash_name(name, strlen(name));
	gone = sweep_locked(bs);
	b = find(bs, hash, name);
	/* Cleared since the sweep: the next one takes it. */
	if (b && !holds(bs, b))
		b = NULL;
	if (b) {
		idle_end(bs, b);
		atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(b->count, 1, memory_order_relaxed);
		m = b->map;
		if (m)
			m->refs++; /* the cache's count, guarded by this lock */
	}
	pthread_mutex_unlock(&c->lock);
	drop_list(gone);
	if (!b)
		return 0;
	/*
	 * A read-only mapping is shared while no stray write copied a page of
	 * it (import.c); else this lease gets a private view of its own, which
	 * a window of a slab cannot have: such an attach asks the daemon.
	 */
	if (m && !m->writable) {
		imp = td_importer_for(m->handle_kind);
		need_view = !(imp->clean && imp->clean(m));
		if (need_view && (m->in_slab || !imp->view)) {
			td_mapcache_unref(&c->maps, m);
			td_binding_local_end(b);
			return 0;
		}
	}
	r = td_lease_local(c, b, &b->info, m, !b->writable, need_view, ret_lease);
	return r < 0 ? r : 1;
}

void td_binding_adopt(tensord_client *c, struct td_lease *l, uint32_t slot, uint64_t gen)
{
	struct td_bindings *bs = &c->binds;
	struct td_binding *b = calloc(1, sizeof(*b)), *old, **pp, *gone = NULL;

	if (!b)
		return; /* l stays a lease of its own; its release clears the slot */
	pthread_mutex_lock(&c->lock);
	if (bs->state != TD_BIND_ON || slot == 0 || slot >= bs->n_words || !gen || !room(bs)) {
		pthread_mutex_unlock(&c->lock);
		free(b);
		return;
	}
	b->c = c;
	b->slot = slot;
	b->gen = gen;
	b->count = (_Atomic uint64_t *)&bs->words[bs->n_words + slot];
	b->forks = atomic_load_explicit(&td_forks, memory_order_relaxed);
	atomic_fetch_add_explicit(b->count, 1, memory_order_relaxed); /* l */
	b->lease_id = td_lease_bind(l, b, &b->info, &b->writable);
	b->map = td_lease_mapping(l);
	if (b->map)
		b->map->refs++;   /* the cache's count, guarded by this lock */
	atomic_init(&b->refs, 2); /* the table's and l's */
	b->hash = td_hash_name(b->info.name, strlen(b->info.name));
	/* A newer binding of the name replaces the one listed. */
	for (pp = bucket(bs, b->hash); (old = *pp); pp = &old->hnext) {
		if (old->hash == b->hash && strcmp(old->info.name, b->info.name) == 0) {
			*pp = old->hnext;
			unlist(bs, old, &gone);
			break;
		}
	}
	b->hnext = *bucket(bs, b->hash);
	*bucket(bs, b->hash) = b;
	b->listed = true;
	bs->n++;
	pthread_mutex_unlock(&c->lock);
	drop_list(gone);
}

void td_bindings_close(tensord_client *c)
{
	struct td_bindings *bs = &c->binds;
	struct td_binding *gone = NULL;

	watcher_stop(c);
	pthread_mutex_lock(&c->lock);
	if (bs->state == TD_BIND_ON || bs->state == TD_BIND_UNTRIED)
		bs->state = TD_BIND_OFF;
	unlist_if(bs, any, &gone);
	pthread_mutex_unlock(&c->lock);
	drop_list(gone);
}

void td_bindings_fini(tensord_client *c)
{
	struct td_bindings *bs = &c->binds;

	td_bindings_close(c);
	if (bs->words)
		munmap((void *)bs->words, 2 * (size_t)bs->n_words * sizeof(uint64_t));
	bs->words = NULL;
	free(bs->tab);
	bs->tab = NULL;
	bs->cap = 0;
}

void td_bindings_after_fork(tensord_client *c)
{
	struct td_bindings *bs = &c->binds;
	struct td_binding *gone = NULL;

	/* Neither the watcher nor the page (MADV_DONTFORK) came along. */
	bs->thread_on = false;
	bs->words = NULL;
	bs->n_words = 0;
	bs->state = TD_BIND_OFF;
	unlist_if(bs, any, &gone);
	/* Their leases are the parent's: the last references send nothing (inherited). */
	drop_list(gone);
}
