/*
 * libtensord: recycled memory, the writer's side (docs/recycle.md).
 *
 * A put that replaces its name asks the daemon to recycle (Create.recycle).
 * The Lease then names a ring buffer of this connection (Lease.ring): new
 * to this client (a descriptor, or the reserve the create named), which is
 * mapped shared and writable here once and kept, or one mapped already,
 * whose earlier version has no lease left. The put copies into that
 * mapping and publishes; nothing is unmapped. The daemon seals the buffer
 * F_SEAL_FUTURE_WRITE at its first publish: every later write and writable
 * mapping is refused to everyone, but this mapping, made before the seal,
 * still writes the next version once the daemon hands the buffer back.
 *
 * Between versions a put's mapping stays writable by default (security.md,
 * "Recycled memory"): nobody is handed a pointer into it, and an
 * mprotect() to read-only and back costs 2.4 ms per 64 MiB here, a quarter
 * of the copy. TENSORD_RECYCLE_PROTECT=1 pays that (td_ring_written()),
 * and a created tensor's view is always revoked at its publish
 * (td_ring_revoked()); the next version's target() makes it writable.
 *
 * A buffer no create named for TD_RING_IDLE_NS (5 s) is unmapped and given back
 * (Unreserve of its id): the daemon frees it now if free, else when its
 * version goes. The mappings are MADV_DONTFORK: a child never has them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"

/* A buffer no create named for this long is given back (TENSORD_RECYCLE_IDLE_MS: tests). */
#define TD_RING_IDLE_NS (5000ull * 1000000ull)
/* However slowly a size is put, its buffers are kept at most this long (or idle_ns). */
#define TD_RING_KEEP_MAX_NS (60000ull * 1000000ull)

/* A sweep a create in flight held back is tried again this much later. */
#define TD_RING_RETRY_NS (100ull * 1000000ull)
/* The most bytes mapped without TENSORD_RECYCLE_BYTES: a quarter of memory, at most this. */
#define TD_RING_BUDGET_MAX (64ull << 30)

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void td_ring_init(struct td_ring *r)
{
	const char *off = getenv("TENSORD_RECYCLE");
	const char *bytes = getenv("TENSORD_RECYCLE_BYTES");
	const char *idle = getenv("TENSORD_RECYCLE_IDLE_MS");
	const char *protect = getenv("TENSORD_RECYCLE_PROTECT");
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	char *end;

	memset(r, 0, sizeof(*r));
	r->off = off && strcmp(off, "0") == 0;
	r->protect = protect && strcmp(protect, "1") == 0;
	r->budget = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : (1ull << 30);
	if (r->budget > TD_RING_BUDGET_MAX)
		r->budget = TD_RING_BUDGET_MAX;
	if (bytes && *bytes) {
		unsigned long long v = strtoull(bytes, &end, 10);

		if (!*end)
			r->budget = v;
	}
	if (!r->budget)
		r->off = true;
	r->idle_ns = TD_RING_IDLE_NS;
	if (idle && *idle) {
		unsigned long long v = strtoull(idle, &end, 10);

		if (!*end && v)
			r->idle_ns = v * 1000000ull;
	}
}

/* Lock held. Notes a recycled create of size at now. */
static void size_used(struct td_ring *r, uint64_t size, uint64_t now)
{
	struct td_ring_size *s = &r->sizes[0];

	for (int i = 0; i < TD_RING_SIZES; i++) {
		if (r->sizes[i].size == size) {
			r->sizes[i].interval_ns = now - r->sizes[i].last_ns;
			r->sizes[i].last_ns = now;
			return;
		}
		if (r->sizes[i].last_ns < s->last_ns)
			s = &r->sizes[i];
	}
	*s = (struct td_ring_size){ .size = size, .last_ns = now };
}

/* Lock held. How long buffer b may stay unused: idle_ns, or four of its size's put intervals. */
static uint64_t keep_ns(const struct td_ring *r, const struct td_ring_buf *b)
{
	uint64_t most = r->idle_ns > TD_RING_KEEP_MAX_NS ? r->idle_ns : TD_RING_KEEP_MAX_NS;

	for (int i = 0; i < TD_RING_SIZES; i++)
		if (r->sizes[i].size == b->size && r->sizes[i].interval_ns) {
			uint64_t k = 4 * r->sizes[i].interval_ns;

			k = k < most ? k : most;
			return k > r->idle_ns ? k : r->idle_ns;
		}
	return r->idle_ns;
}

/* Lock held. Moves the buffers idle at now to gone (allocated by the caller: r->n). */
static unsigned expire(struct td_ring *r, uint64_t now, struct td_ring_buf *gone)
{
	unsigned n = 0;

	r->sweep_due = 0;
	for (unsigned i = r->n; i-- > 0;) {
		struct td_ring_buf *b = &r->bufs[i];

		uint64_t keep = keep_ns(r, b);

		if (b->pins)
			continue; /* a created tensor's view: td_ring_unpin() times it again */
		if (now - b->used_ns >= keep) {
			gone[n++] = *b;
			r->bytes -= b->map_size;
			*b = r->bufs[--r->n];
		} else if (!r->sweep_due || b->used_ns + keep < r->sweep_due) {
			r->sweep_due = b->used_ns + keep;
		}
	}
	return n;
}

/* Unlocked: unmaps what expire() took and tells the daemon (one-way). */
static void give_back(tensord_client *c, struct td_ring_buf *gone, unsigned n)
{
	char saved[512];

	snprintf(saved, sizeof(saved), "%s", tensord_last_error());
	for (unsigned i = 0; i < n; i++) {
		Tensord__Request req = TENSORD__REQUEST__INIT;
		Tensord__Unreserve un = TENSORD__UNRESERVE__INIT;

		un.id = gone[i].id;
		req.body_case = TENSORD__REQUEST__BODY_UNRESERVE;
		req.unreserve = &un;
		td_send_oneway(c, &req);
		munmap(gone[i].base, (size_t)gone[i].map_size);
		td_maps_gone(1);
	}
	td_set_error(0, "%s", saved);
}

/*
 * Lock held, dropped and taken again when something expired. Gives back
 * the idle buffers, unless a recycled create is in flight: its reply may
 * name one of them, so nothing may go before the Unreserve is sent.
 */
static void sweep(tensord_client *c, uint64_t now)
{
	struct td_ring *r = &c->ring;
	struct td_ring_buf *gone;
	unsigned n;

	if (!r->sweep_due || now < r->sweep_due || r->creating || r->sweeping || !r->n)
		return;
	gone = malloc(r->n * sizeof(*gone));
	if (!gone)
		return;
	n = expire(r, now, gone);
	if (n) {
		r->sweeping = true;
		pthread_mutex_unlock(&c->lock);
		give_back(c, gone, n);
		pthread_mutex_lock(&c->lock);
		r->sweeping = false;
	}
	free(gone);
}

bool td_ring_begin(tensord_client *c, uint64_t nbytes, uint32_t flags, unsigned *ret_mapped)
{
	struct td_ring *r = &c->ring;
	unsigned mapped = 0;
	bool ask;

	if (ret_mapped)
		*ret_mapped = 0;
	if (r->off || (flags & (TENSORD_SEALED | TENSORD_MUTABLE)) || nbytes <= TD_PUT_INLINE_MAX)
		return false;
	pthread_mutex_lock(&c->lock);
	sweep(c, mono_ns());
	/* Over the budget only a buffer mapped already could serve, which
	 * the daemon cannot promise: the plain path then. */
	for (unsigned i = 0; i < r->n; i++)
		mapped += r->bufs[i].size == nbytes;
	ask = !c->inherited && !c->conn.closed && !r->sweeping &&
	      (mapped || r->bytes + nbytes <= r->budget);
	if (ask) {
		r->creating++;
		size_used(r, nbytes, mono_ns());
	}
	pthread_mutex_unlock(&c->lock);
	if (ret_mapped && ask)
		*ret_mapped = mapped;
	return ask;
}

bool td_ring_gpu(tensord_client *c, const tensord_spec *spec)
{
	bool ask;

	if (!spec || !(spec->flags & TENSORD_RECYCLE) ||
	    (spec->flags & (TENSORD_SEALED | TENSORD_MUTABLE)) ||
	    !td_device_is_gpu(spec->device.device_type))
		return false;
	pthread_mutex_lock(&c->lock);
	ask = !c->ring.off && !c->inherited && !c->conn.closed;
	pthread_mutex_unlock(&c->lock);
	return ask;
}

void td_ring_end(tensord_client *c)
{
	pthread_mutex_lock(&c->lock);
	c->ring.creating--;
	pthread_mutex_unlock(&c->lock);
}

uint64_t td_ring_sweep(tensord_client *c)
{
	struct td_ring *r = &c->ring;
	uint64_t now = mono_ns(), due;

	pthread_mutex_lock(&c->lock);
	sweep(c, now);
	due = r->sweep_due;
	/* A create in flight held it back: again soon. */
	if (due && due <= now)
		due = now + TD_RING_RETRY_NS;
	pthread_mutex_unlock(&c->lock);
	return due;
}

/* Lock held. Adds a mapping of buffer id; false when out of memory. */
static bool add(struct td_ring *r, uint64_t id, uint8_t *base, uint64_t map_size, uint64_t size,
		uint64_t now)
{
	if (r->n == r->cap) {
		unsigned cap = r->cap ? 2 * r->cap : 16;
		struct td_ring_buf *b = realloc(r->bufs, cap * sizeof(*b));

		if (!b)
			return false;
		r->bufs = b;
		r->cap = cap;
	}
	r->bufs[r->n++] = (struct td_ring_buf){ id, base, map_size, size, now, 0, false };
	r->bytes += map_size;
	if (!r->sweep_due)
		r->sweep_due = now + r->idle_ns;
	return true;
}

void td_ring_gpu_used(tensord_client *c, uint64_t id, uint64_t size)
{
	struct td_ring *r = &c->ring;
	uint64_t now = mono_ns();
	bool added = false;
	unsigned i;

	pthread_mutex_lock(&c->lock);
	size_used(r, size, now);
	for (i = 0; i < r->n && r->bufs[i].id != id; i++)
		;
	if (i < r->n)
		r->bufs[i].used_ns = now;
	else
		added = add(r, id, NULL, 0, size, now);
	pthread_mutex_unlock(&c->lock);
	/* An idle writer gives its GPU buffers back too: the flusher times it. */
	if (added)
		td_relq_ring_due(&c->conn, now + r->idle_ns);
}

/* Maps descriptor fd of ring buffer id (map_size bytes) shared and writable. */
static int map_new(int fd, uint64_t map_size, const char *name, uint8_t **ret)
{
	struct stat st;
	void *p;
	int e;

	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < map_size)
		return td_set_error(-EPROTO,
				    "tensor '%s': tensord sent a ring buffer smaller "
				    "than its size",
				    name);
	/* One mapping more of this process's (vm.max_map_count). */
	e = td_maps_admit(name);
	if (e < 0)
		return e;
	p = mmap(NULL, (size_t)map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		e = errno;
		td_maps_gone(1);
		return td_set_error(-e, "tensor '%s': mapping its memory failed: %s", name,
				    strerror(e));
	}
	/* A child must never hold a writable mapping of a version. */
	if (madvise(p, (size_t)map_size, MADV_DONTFORK) < 0) {
		e = errno;
		munmap(p, (size_t)map_size);
		td_maps_gone(1);
		return td_set_error(-e, "tensor '%s': MADV_DONTFORK failed: %s", name, strerror(e));
	}
	*ret = p;
	return 0;
}

/*
 * Where w's tensor lies in its buffer's mapping (base, len): at its
 * offset in a set allocation (Lease.arena_size), else at the start.
 */
static int at(const Tensord__Lease *w, uint8_t *base, uint64_t len, const char *name,
	      uint8_t **ret_base, uint64_t *ret_len)
{
	uint64_t off = w->arena_size ? w->ipc_offset : 0;

	if (off > len || w->map_size > len - off)
		return td_set_error(-EPROTO,
				    "tensor '%s': tensord placed it at %llu bytes in a ring "
				    "buffer of %llu",
				    name, (unsigned long long)off, (unsigned long long)len);
	*ret_base = base + off;
	*ret_len = len - off;
	return 0;
}

static int target(tensord_client *c, const Tensord__Lease *w, int *fd, struct td_reserve_slot *rs,
		  const char *name, bool pin, uint8_t **ret_base, uint64_t *ret_len)
{
	struct td_ring *r = &c->ring;
	uint64_t now = mono_ns();
	/* A member of a set allocation comes in the whole of it. */
	uint64_t size = w->arena_size ? w->arena_size : w->map_size;
	uint8_t *base = NULL;
	uint64_t map_size;
	int e;

	if (!w->ring)
		return 1;
	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < r->n; i++)
		if (r->bufs[i].id == w->ring) {
			struct td_ring_buf *b = &r->bufs[i];

			/* The view a create's publish revoked: the next version's. */
			if (b->revoked) {
				if (mprotect(b->base, (size_t)b->map_size, PROT_READ | PROT_WRITE) <
				    0) {
					e = errno;
					pthread_mutex_unlock(&c->lock);
					return td_set_error(-e, "tensor '%s': mprotect failed: %s",
							    name, strerror(e));
				}
				b->revoked = false;
			}
			e = at(w, b->base, b->map_size, name, ret_base, ret_len);
			if (e == 0) {
				b->used_ns = now;
				b->pins += pin;
			}
			pthread_mutex_unlock(&c->lock);
			return e;
		}
	pthread_mutex_unlock(&c->lock);
	if (rs && rs->base && w->reserve && w->reserve == rs->id) {
		/* The reserve's memfd became the buffer: keep its mapping. */
		base = rs->base;
		map_size = rs->size;
		td_maps_adopted(); /* a mapping of this process's from now on */
		if (rs->fd >= 0)
			close(rs->fd);
		*rs = (struct td_reserve_slot){ .fd = -1 };
		td_reserve_written(c);
	} else if (*fd >= 0) {
		map_size = size;
		e = map_new(*fd, map_size, name, &base);
		if (e < 0)
			return e;
		close(*fd);
		*fd = -1;
	} else {
		return td_set_error(-EPROTO,
				    "tensor '%s': tensord named ring buffer %llu, which this "
				    "client does not map",
				    name, (unsigned long long)w->ring);
	}
	pthread_mutex_lock(&c->lock);
	if (!add(r, w->ring, base, map_size, size, now)) {
		pthread_mutex_unlock(&c->lock);
		munmap(base, (size_t)map_size);
		td_maps_gone(1);
		return td_set_error(-ENOMEM, "tensor '%s': out of memory", name);
	}
	r->bufs[r->n - 1].pins = pin;
	pthread_mutex_unlock(&c->lock);
	/* An idle process lets its buffers go too: the flusher times it. */
	td_relq_ring_due(&c->conn, now + r->idle_ns);
	return at(w, base, map_size, name, ret_base, ret_len);
}

int td_ring_target(tensord_client *c, const Tensord__Lease *w, int *fd, struct td_reserve_slot *rs,
		   const char *name, uint8_t **ret_base)
{
	uint64_t len;

	return target(c, w, fd, rs, name, false, ret_base, &len);
}

int td_ring_lend(tensord_client *c, const Tensord__Lease *w, int *fd, struct td_reserve_slot *rs,
		 const char *name, uint8_t **ret_base, uint64_t *ret_len)
{
	return target(c, w, fd, rs, name, true, ret_base, ret_len);
}

void td_ring_written(tensord_client *c, uint64_t id)
{
	struct td_ring *r = &c->ring;

	if (!r->protect)
		return;
	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < r->n; i++)
		if (r->bufs[i].id == id && !r->bufs[i].pins &&
		    mprotect(r->bufs[i].base, (size_t)r->bufs[i].map_size, PROT_READ) == 0)
			r->bufs[i].revoked = true;
	pthread_mutex_unlock(&c->lock);
}

void td_ring_revoked(tensord_client *c, uint64_t id)
{
	struct td_ring *r = &c->ring;

	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < r->n; i++)
		if (r->bufs[i].id == id)
			r->bufs[i].revoked = true;
	pthread_mutex_unlock(&c->lock);
}

void td_ring_unpin(tensord_client *c, uint64_t id)
{
	struct td_ring *r = &c->ring;
	uint64_t now = mono_ns();
	bool found = false;

	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < r->n; i++)
		if (r->bufs[i].id == id && r->bufs[i].pins) {
			r->bufs[i].pins--;
			r->bufs[i].used_ns = now;
			found = true;
			if (!r->sweep_due || now + r->idle_ns < r->sweep_due)
				r->sweep_due = now + r->idle_ns;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	if (found)
		td_relq_ring_due(&c->conn, now + r->idle_ns);
}

void td_ring_close(tensord_client *c)
{
	struct td_ring *r = &c->ring;

	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < r->n; i++) {
		if (!r->bufs[i].base)
			continue; /* a GPU buffer */
		munmap(r->bufs[i].base, (size_t)r->bufs[i].map_size);
		td_maps_gone(1);
	}
	free(r->bufs);
	r->bufs = NULL;
	r->n = r->cap = 0;
	r->bytes = 0;
	r->off = true;
	pthread_mutex_unlock(&c->lock);
}

void td_ring_after_fork(struct td_ring *r)
{
	free(r->bufs);
	r->bufs = NULL;
	r->n = r->cap = 0;
	r->bytes = 0;
	r->creating = 0;
	r->sweeping = false;
	r->off = true; /* an inherited client puts nothing */
}
