/*
 * libtensord: the per-client mapping cache. Mappings are keyed by tensor id
 * and found by name while any lease uses them; the importer that made one
 * unmaps it when its last lease ends. Unmapping happens outside the lock.
 */
#include <assert.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mapcache.h"

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void td_mapcache_init(struct td_mapcache *mc, pthread_mutex_t *lock)
{
	memset(mc, 0, sizeof(*mc));
	mc->lock = lock;
	LIST_INIT(&mc->maps);
	TAILQ_INIT(&mc->parked);
}

#define NAME_BUCKETS_MIN 256

static uint64_t name_hash(const char *name)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return h ^ (h >> 32);
}

/*
 * Lock held. Grows the index by name when it holds more mappings than
 * lists, and builds it anew from maps; keeps the old one (or none) when
 * memory is short.
 */
static void name_grow(struct td_mapcache *mc)
{
	size_t n = mc->n_buckets ? mc->n_buckets * 2 : NAME_BUCKETS_MIN;
	struct td_mapping_list *t;
	struct td_mapping *m;

	if (mc->n_buckets && mc->n_maps <= mc->n_buckets)
		return;
	t = malloc(n * sizeof(*t));
	if (!t)
		return;
	for (size_t i = 0; i < n; i++)
		LIST_INIT(&t[i]);
	LIST_FOREACH(m, &mc->maps, link)
	LIST_INSERT_HEAD(&t[m->name_hash & (n - 1)], m, name_link);
	free(mc->by_name);
	mc->by_name = t;
	mc->n_buckets = n;
}

/* Lock held. Puts m on maps and in the index. */
static void maps_add(struct td_mapcache *mc, struct td_mapping *m)
{
	LIST_INSERT_HEAD(&mc->maps, m, link);
	mc->n_maps++;
	m->name_hash = name_hash(m->name);
	if (mc->by_name)
		LIST_INSERT_HEAD(&mc->by_name[m->name_hash & (mc->n_buckets - 1)], m, name_link);
	name_grow(mc);
}

/* Lock held. Takes m off maps and out of the index. */
static void maps_del(struct td_mapcache *mc, struct td_mapping *m)
{
	LIST_REMOVE(m, link);
	if (mc->by_name)
		LIST_REMOVE(m, name_link);
	mc->n_maps--;
}

/*
 * Lock held. The first mapping that may be of name (h: its name_hash()),
 * then name_next() of it; both NULL at the end. The caller compares names.
 */
static struct td_mapping *name_skip(const struct td_mapcache *mc, struct td_mapping *m, uint64_t h)
{
	while (m && mc->by_name && m->name_hash != h)
		m = LIST_NEXT(m, name_link);
	return m;
}

static struct td_mapping *name_first(const struct td_mapcache *mc, uint64_t h)
{
	if (!mc->by_name)
		return LIST_FIRST(&mc->maps);
	return name_skip(mc, LIST_FIRST(&mc->by_name[h & (mc->n_buckets - 1)]), h);
}

static struct td_mapping *name_next(const struct td_mapcache *mc, struct td_mapping *m, uint64_t h)
{
	return mc->by_name ? name_skip(mc, LIST_NEXT(m, name_link), h) : LIST_NEXT(m, link);
}

/* Lock held. Takes m off the parked list; it is in use again, or going. */
static void unpark(struct td_mapcache *mc, struct td_mapping *m)
{
	assert(m->parked_ns && m->refs == 0 && mc->n_parked > 0);
	TAILQ_REMOVE(&mc->parked, m, park_link);
	m->parked_ns = 0;
	mc->n_parked--;
	mc->parked_bytes -= m->size;
}

static void unmap_free(struct td_mapping *m)
{
	const struct td_importer *imp = td_importer_for(m->handle_kind);

	if (imp && !m->revoked) /* a revoked one was unmapped by td_mapcache_revoke() */
		imp->unmap(m);
	free(m);
}

/*
 * Lock held. Moves the parked mappings that are older than TD_PARK_NS at
 * now, or that do not fit the bounds once extra more bytes are parked, to
 * gone, for unmap_free() outside the lock.
 */
static void expire(struct td_mapcache *mc, uint64_t now, uint64_t extra,
		   struct td_mapping_list *gone)
{
	struct td_mapping *m;

	while ((m = TAILQ_FIRST(&mc->parked)) &&
	       (now - m->parked_ns >= TD_PARK_NS || mc->n_parked + (extra > 0) > TD_PARK_MAX ||
		mc->parked_bytes + extra > TD_PARK_BYTES)) {
		unpark(mc, m);
		maps_del(mc, m);
		LIST_INSERT_HEAD(gone, m, link);
	}
}

/* Unmaps and frees every mapping on gone. */
static void free_list(struct td_mapping_list *gone)
{
	struct td_mapping *m;

	while ((m = LIST_FIRST(gone))) {
		LIST_REMOVE(m, link);
		unmap_free(m);
	}
}

/* A share entry taken off the table, closed and unmapped outside the lock. */
struct share_gone {
	int fd;
	struct td_slabmap *map;
};

static bool is_ring(uint64_t id)
{
	return (id & TD_RING_SHARE) != 0;
}

/* Lock held. Whether entry i's memory is in use: a mapping points into it. */
static bool share_busy(const struct td_mapcache *mc, int i)
{
	const struct td_slabmap *s = mc->shares[i].map;

	return s && atomic_load_explicit(&s->refs, memory_order_acquire) > 1;
}

/* Lock held. Takes entry i off the table into *g. */
static void share_remove(struct td_mapcache *mc, int i, struct share_gone *g)
{
	g->fd = mc->shares[i].fd;
	g->map = mc->shares[i].map;
	if (is_ring(mc->shares[i].id))
		mc->n_ring_shares--;
	mc->shares[i] = mc->shares[--mc->n_shares];
}

/*
 * Lock held. Moves to gone the ring buffers' entries unused since
 * TD_PARK_NS before now (every idle one with all) that no mapping points
 * into; *next gets when the next one would go (0: none left). Their number.
 */
static int ring_shares_expire(struct td_mapcache *mc, uint64_t now, bool all,
			      struct share_gone *gone, uint64_t *next)
{
	int n = 0;

	*next = 0;
	for (int i = mc->n_shares; i-- > 0;) {
		uint64_t at = mc->shares[i].used_ns + TD_PARK_NS;

		if (!is_ring(mc->shares[i].id))
			continue;
		if (!share_busy(mc, i) && (all || now >= at)) {
			share_remove(mc, i, &gone[n++]);
			continue;
		}
		/* In use: looked at again a park time later. */
		if (share_busy(mc, i) || at <= now)
			at = now + TD_PARK_NS;
		if (!*next || at < *next)
			*next = at;
	}
	return n;
}

static void shares_close(struct share_gone *g, int n)
{
	for (int i = 0; i < n; i++) {
		close(g[i].fd);
		if (g[i].map)
			td_slabmap_unref(g[i].map);
	}
}

uint64_t td_mapcache_sweep(struct td_mapcache *mc)
{
	struct td_mapping_list gone = LIST_HEAD_INITIALIZER(gone);
	struct td_mapping *first;
	uint64_t due;

	struct share_gone sg[TD_RING_SHARES_MAX];
	uint64_t now = mono_ns(), next;
	int n;

	pthread_mutex_lock(mc->lock);
	expire(mc, now, 0, &gone);
	first = TAILQ_FIRST(&mc->parked);
	due = first ? first->parked_ns + TD_PARK_NS : 0;
	n = ring_shares_expire(mc, now, false, sg, &next);
	if (next && (!due || next < due))
		due = next;
	pthread_mutex_unlock(mc->lock);
	free_list(&gone);
	shares_close(sg, n);
	return due;
}

void td_mapcache_fini(struct td_mapcache *mc)
{
	struct td_mapping_list gone = LIST_HEAD_INITIALIZER(gone);

	for (int i = 0; i < mc->n_shares; i++) {
		close(mc->shares[i].fd);
		/* Unmapped here unless leases (a forked child's) point into it. */
		if (mc->shares[i].map)
			td_slabmap_unref(mc->shares[i].map);
		mc->shares[i].map = NULL;
	}
	mc->n_shares = 0;
	mc->n_ring_shares = 0;
	/* No lease is left, so only parked mappings are (in a forked child,
	 * also those its inherited leases use, which stay). */
	expire(mc, UINT64_MAX / 2 + mono_ns(), 0, &gone);
	free_list(&gone);
	if (LIST_EMPTY(&mc->maps)) {
		free(mc->by_name);
		mc->by_name = NULL;
		mc->n_buckets = 0;
	}
}

void td_mapcache_after_fork(struct td_mapcache *mc)
{
	mc->on_park = NULL;
	mc->on_park_arg = NULL;
	td_mapcache_fini(mc);
}

void td_mapcache_share_add(struct td_mapcache *mc, uint64_t id, int fd)
{
	struct share_gone g[TD_RING_SHARES_MAX];
	uint64_t now = mono_ns(), next;
	bool ring = is_ring(id), kick = false;
	int n = 0;

	pthread_mutex_lock(mc->lock);
	for (int i = 0; i < mc->n_shares; i++) {
		if (mc->shares[i].id == id) {
			mc->shares[i].used_ns = now;
			pthread_mutex_unlock(mc->lock);
			close(fd);
			return;
		}
	}
	/* Full of ring buffers: those nobody uses now make room. */
	if (ring && mc->n_ring_shares == TD_RING_SHARES_MAX)
		n = ring_shares_expire(mc, now, true, g, &next);
	if (ring ? mc->n_ring_shares == TD_RING_SHARES_MAX
		 : mc->n_shares - mc->n_ring_shares == TD_SHARES_MAX) {
		pthread_mutex_unlock(mc->lock);
		shares_close(g, n);
		close(fd);
		return;
	}
	mc->shares[mc->n_shares].id = id;
	mc->shares[mc->n_shares].fd = fd;
	mc->shares[mc->n_shares].map = NULL;
	mc->shares[mc->n_shares].used_ns = now;
	mc->n_shares++;
	if (ring)
		kick = mc->n_ring_shares++ == 0;
	pthread_mutex_unlock(mc->lock);
	shares_close(g, n);
	/* The flusher lets it go once idle (td_mapcache_sweep()). */
	if (kick && mc->on_park)
		mc->on_park(mc->on_park_arg);
}

int td_mapcache_share_fd(struct td_mapcache *mc, uint64_t id)
{
	int fd = -1;

	pthread_mutex_lock(mc->lock);
	for (int i = 0; i < mc->n_shares; i++) {
		if (mc->shares[i].id == id) {
			fd = fcntl(mc->shares[i].fd, F_DUPFD_CLOEXEC, 3);
			mc->shares[i].used_ns = mono_ns();
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	return fd;
}

struct td_slabmap *td_mapcache_share_map(struct td_mapcache *mc, uint64_t id, const char *name)
{
	struct td_slabmap *s = NULL;

	pthread_mutex_lock(mc->lock);
	for (int i = 0; i < mc->n_shares; i++) {
		if (mc->shares[i].id != id)
			continue;
		mc->shares[i].used_ns = mono_ns();
		/* Once per slab and client: one mmap, nothing faulted. */
		if (!mc->shares[i].map)
			mc->shares[i].map = td_slabmap_new(mc->shares[i].fd, name, mc->lock);
		s = mc->shares[i].map;
		if (s)
			td_slabmap_ref(s);
		break;
	}
	pthread_mutex_unlock(mc->lock);
	return s;
}

size_t td_mapcache_share_ids(struct td_mapcache *mc, uint64_t *ids, size_t max)
{
	size_t n = 0;

	pthread_mutex_lock(mc->lock);
	/* Not ring buffers': their entries may go while a request waits. */
	for (int i = 0; i < mc->n_shares && n < max; i++)
		if (!is_ring(mc->shares[i].id))
			ids[n++] = mc->shares[i].id;
	pthread_mutex_unlock(mc->lock);
	return n;
}

void td_mapcache_insert(struct td_mapcache *mc, struct td_mapping *m)
{
	pthread_mutex_lock(mc->lock);
	m->refs = 1;
	maps_add(mc, m);
	pthread_mutex_unlock(mc->lock);
}

/*
 * A slab window has no descriptor of its own to make a view from, so it
 * is reused only while no stray write has touched it; a fresh window is
 * mapped otherwise. Lock held.
 */
static bool clean_enough(const struct td_mapping *m)
{
	const struct td_importer *imp;

	if (!m->in_slab)
		return true;
	imp = td_importer_for(m->handle_kind);
	return imp && imp->clean && imp->clean(m);
}

struct td_mapping *td_mapcache_find_reusable(struct td_mapcache *mc, const char *name)
{
	struct td_mapping *m;
	uint64_t h = name_hash(name);

	pthread_mutex_lock(mc->lock);
	for (m = name_first(mc, h); m; m = name_next(mc, m, h)) {
		if (m->reusable && strcmp(m->name, name) == 0 && clean_enough(m)) {
			if (m->parked_ns)
				unpark(mc, m);
			m->refs++;
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	return m;
}

struct td_mapping *td_mapcache_find_created(struct td_mapcache *mc, const char *name)
{
	struct td_mapping *m;
	uint64_t h = name_hash(name);

	pthread_mutex_lock(mc->lock);
	for (m = name_first(mc, h); m; m = name_next(mc, m, h)) {
		if (m->created_here && m->writable && strcmp(m->name, name) == 0) {
			m->refs++;
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	return m;
}

void td_mapcache_mark_published(struct td_mapcache *mc, struct td_mapping *m, bool private_view)
{
	pthread_mutex_lock(mc->lock);
	if (private_view)
		m->reusable = false;
	m->writable = false;
	pthread_mutex_unlock(mc->lock);
}

/* Lock held. Whether m, whose last lease just ended, may be parked. */
static bool parkable(const struct td_mapcache *mc, const struct td_mapping *m,
		     const struct td_importer *imp)
{
	return mc->on_park && imp && imp->park && m->reusable && !m->in_slab && !m->writable &&
	       !m->lent && !m->revoked && m->size <= TD_PARK_BYTES;
}

/* Needs unmapping before the daemon may free it, and is still mapped. Lock held. */
static bool must_revoke(const struct td_mapping *m)
{
	const struct td_importer *imp = td_importer_for(m->handle_kind);

	return imp && imp->unmap_before_close && !m->revoked;
}

int td_mapcache_revoke(struct td_mapcache *mc)
{
	struct td_mapping **v = NULL, *m;
	int n = 0, i = 0;

	pthread_mutex_lock(mc->lock);
	LIST_FOREACH(m, &mc->maps, link)
	n += must_revoke(m);
	v = n ? malloc((size_t)n * sizeof(*v)) : NULL;
	/* Without memory for the list, unmap under the lock: it must happen. */
	for (m = LIST_FIRST(&mc->maps); m && n; m = LIST_NEXT(m, link)) {
		if (!must_revoke(m))
			continue;
		m->revoked = true;
		if (v) {
			m->refs++;
			v[i++] = m;
		} else {
			td_importer_for(m->handle_kind)->unmap(m);
		}
	}
	pthread_mutex_unlock(mc->lock);
	for (int k = 0; k < i; k++) {
		td_importer_for(v[k]->handle_kind)->unmap(v[k]);
		td_mapcache_unref(mc, v[k]);
	}
	free(v);
	return n;
}

void td_mapcache_unref(struct td_mapcache *mc, struct td_mapping *m)
{
	const struct td_importer *imp = td_importer_for(m->handle_kind);
	struct td_mapping_list gone = LIST_HEAD_INITIALIZER(gone);
	struct td_mapping parked;
	void *base = NULL;
	bool first = false;

	pthread_mutex_lock(mc->lock);
	assert(m->refs > 0 && !m->parked_ns);
	if (--m->refs) {
		pthread_mutex_unlock(mc->lock);
		return;
	}
	if (parkable(mc, m, imp)) {
		uint64_t now = mono_ns();

		expire(mc, now, m->size, &gone);
		base = imp->park(m);
		parked = *m; /* for unview() after the unlock, when m may be gone */
		m->parked_ns = now;
		TAILQ_INSERT_TAIL(&mc->parked, m, park_link);
		first = mc->n_parked++ == 0;
		mc->parked_bytes += m->size;
		m = NULL;
	} else {
		maps_del(mc, m);
	}
	pthread_mutex_unlock(mc->lock);
	if (base)
		imp->unview(&parked, base);
	free_list(&gone);
	if (m) {
		uint64_t ring = m->lent ? m->ring_id : 0;

		unmap_free(m);
		if (ring && mc->on_lent_gone)
			mc->on_lent_gone(mc->on_lent_arg, ring);
	}
	if (first && mc->on_park)
		mc->on_park(mc->on_park_arg);
}
