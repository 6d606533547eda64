/*
 * Slabs (slab.h says what they promise). Each slab is a sparse memfd of
 * SLAB_SIZE bytes whose pages tmpfs allocates as the daemon writes them,
 * with a list of free extents kept sorted by offset: allocation is first
 * fit, freeing merges with the neighbours. Slabs of a class are tried in
 * the order they were made, so older slabs fill up and newer ones empty
 * out and get closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sys.h"
#include "slab.h"

#define PAGE 4096u

struct extent {
	uint64_t off, len;
};

struct slab {
	uint64_t id;
	struct slab_class cls;
	int fd;              /* owned, O_RDWR: the daemon writes through it */
	int ro_fd;           /* owned, O_RDONLY: readers get duplicates of it */
	uint64_t used;       /* bytes in live slots */
	struct extent *free; /* owned; sorted by offset, never adjacent */
	size_t n_free, cap_free;
	struct slab *next;
};

static uint64_t round_up(uint64_t n)
{
	return (n + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
}

void slabs_init(struct slabs *s)
{
	memset(s, 0, sizeof(*s));
	s->next_id = 1;
}

static void slab_close(struct slab *sl)
{
	close(sl->fd);
	close(sl->ro_fd);
	free(sl->free);
	free(sl);
}

void slabs_fini(struct slabs *s)
{
	slabs_flush(s);
	free(s->pending);
	s->pending = NULL;
	s->cap_pending = 0;
	while (s->list) {
		struct slab *sl = s->list;

		s->list = sl->next;
		slab_close(sl);
	}
	s->n_slabs = 0;
	s->used = 0;
}

/* A new empty slab of class cls, or NULL with errno set. */
static struct slab *slab_new(struct slabs *s, const struct slab_class *cls)
{
	struct slab *sl = calloc(1, sizeof(*sl));
	char path[64];
	int e;

	if (!sl)
		return NULL;
	sl->fd = sl->ro_fd = -1;
	sl->free = malloc(16 * sizeof(*sl->free));
	if (!sl->free)
		goto fail;
	sl->cap_free = 16;
	sl->free[0] = (struct extent){ 0, SLAB_SIZE };
	sl->n_free = 1;
	sl->fd = memfd_create("tensord:slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (sl->fd < 0 || ftruncate(sl->fd, SLAB_SIZE) < 0 ||
	    fcntl(sl->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		goto fail;
	/* A new open file description that can only read; then nobody but
	 * the daemon's user may open the memfd again, and it only to read. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", sl->fd);
	sl->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (sl->ro_fd < 0 || fchmod(sl->fd, 0400) < 0)
		goto fail;
	sl->id = s->next_id++;
	sl->cls = *cls;
	return sl;
fail:
	e = errno;
	if (sl->fd >= 0)
		close(sl->fd);
	if (sl->ro_fd >= 0)
		close(sl->ro_fd);
	free(sl->free);
	free(sl);
	errno = e;
	return NULL;
}

/* First fit in sl. 0, or -ENOSPC when no extent is large enough. */
static int take(struct slab *sl, uint64_t len, uint64_t *ret_off)
{
	for (size_t i = 0; i < sl->n_free; i++) {
		struct extent *e = &sl->free[i];

		if (e->len < len)
			continue;
		*ret_off = e->off;
		e->off += len;
		e->len -= len;
		if (e->len == 0) {
			memmove(e, e + 1, (sl->n_free - i - 1) * sizeof(*e));
			sl->n_free--;
		}
		sl->used += len;
		return 0;
	}
	return -ENOSPC;
}

int slab_alloc(struct slabs *s, const struct slab_class *cls, uint64_t size, struct slab **ret_slab,
	       uint64_t *ret_off)
{
	uint64_t len = round_up(size);
	struct slab *sl, **tail = &s->list;

	if (size == 0 || size > SLAB_MAX_ALLOC)
		return -EINVAL;
	for (sl = s->list; sl; tail = &sl->next, sl = sl->next) {
		if (memcmp(&sl->cls, cls, sizeof(*cls)) == 0 && take(sl, len, ret_off) == 0)
			goto found;
	}
	sl = slab_new(s, cls);
	if (!sl)
		return -errno;
	*tail = sl;
	s->n_slabs++;
	take(sl, len, ret_off);
found:
	s->used += len;
	*ret_slab = sl;
	return 0;
}

/* Zeroes [off, off + len): whole pages punched out, partial ones overwritten. */
static void zero_range(int fd, uint64_t off, uint64_t len)
{
	static const uint8_t zeros[PAGE];
	uint64_t end = off + len;
	uint64_t lo = (off + PAGE - 1) / PAGE * PAGE, hi = end / PAGE * PAGE;

	if (lo < hi) {
		if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo,
			      (off_t)(hi - lo)) < 0)
			lo = hi = end; /* cannot punch: overwrite it all below */
	} else {
		lo = hi = end;
	}
	for (uint64_t p = off; p < lo; p += PAGE - p % PAGE) {
		size_t n = (size_t)((lo - p) < PAGE - p % PAGE ? lo - p : PAGE - p % PAGE);

		if (pwrite(fd, zeros, n, (off_t)p) < 0)
			break;
	}
	for (uint64_t p = hi; p < end; p += PAGE - p % PAGE) {
		size_t n = (size_t)((end - p) < PAGE - p % PAGE ? end - p : PAGE - p % PAGE);

		if (pwrite(fd, zeros, n, (off_t)p) < 0)
			break;
	}
}

/* Puts [off, off + len) back on sl's free list, merged with its neighbours. */
static void give_back(struct slab *sl, uint64_t off, uint64_t len)
{
	size_t i = 0;

	while (i < sl->n_free && sl->free[i].off < off)
		i++;
	if (i > 0 && sl->free[i - 1].off + sl->free[i - 1].len == off) {
		sl->free[i - 1].len += len;
		if (i < sl->n_free && off + len == sl->free[i].off) {
			sl->free[i - 1].len += sl->free[i].len;
			memmove(sl->free + i, sl->free + i + 1,
				(sl->n_free - i - 1) * sizeof(*sl->free));
			sl->n_free--;
		}
		return;
	}
	if (i < sl->n_free && off + len == sl->free[i].off) {
		sl->free[i].off = off;
		sl->free[i].len += len;
		return;
	}
	if (sl->n_free == sl->cap_free) {
		struct extent *v = realloc(sl->free, sl->cap_free * 2 * sizeof(*v));

		if (!v)
			return; /* the slot is lost to this slab until it closes, nothing worse */
		sl->free = v;
		sl->cap_free *= 2;
	}
	memmove(sl->free + i + 1, sl->free + i, (sl->n_free - i) * sizeof(*sl->free));
	sl->free[i] = (struct extent){ off, len };
	sl->n_free++;
}

/* One slot freed and not yet zeroed (slabs.defer_frees). */
struct slab_pending {
	struct slab *sl;
	uint64_t off, len;
};

static void free_now(struct slabs *s, struct slab *sl, uint64_t off, uint64_t len);

void slab_free(struct slabs *s, struct slab *sl, uint64_t off, uint64_t size)
{
	uint64_t len = round_up(size);

	if (s->defer_frees && !s->keep_contents) {
		if (s->n_pending == s->cap_pending) {
			size_t cap = s->cap_pending ? 2 * s->cap_pending : 64;
			struct slab_pending *p = realloc(s->pending, cap * sizeof(*p));

			if (p) {
				s->pending = p;
				s->cap_pending = cap;
			}
		}
		if (s->n_pending < s->cap_pending) {
			s->pending[s->n_pending++] = (struct slab_pending){ sl, off, len };
			return;
		}
		/* Out of memory: now, as without the store. */
	}
	free_now(s, sl, off, len);
}

void slabs_flush(struct slabs *s)
{
	/* Each may close its slab: later entries never name a slab closed
	 * before them, since a slab with a pending slot is not empty. */
	for (size_t i = 0; i < s->n_pending; i++)
		free_now(s, s->pending[i].sl, s->pending[i].off, s->pending[i].len);
	s->n_pending = 0;
}

static void free_now(struct slabs *s, struct slab *sl, uint64_t off, uint64_t len)
{
	if (!s->keep_contents)
		zero_range(sl->fd, off, len);
	give_back(sl, off, len);
	sl->used -= len;
	s->used -= len;
	if (sl->used)
		return;
	for (struct slab **p = &s->list; *p; p = &(*p)->next) {
		if (*p == sl) {
			*p = sl->next;
			break;
		}
	}
	s->n_slabs--;
	if (s->on_close)
		s->on_close(sl->fd);
	slab_close(sl);
}

int slab_write(struct slab *sl, uint64_t off, const void *data, size_t n)
{
	return td_pwrite_all(sl->fd, data, n, off);
}

int slab_export(struct slab *sl)
{
	int fd = fcntl(sl->ro_fd, F_DUPFD_CLOEXEC, 3);

	return fd < 0 ? -errno : fd;
}

uint64_t slab_id(const struct slab *sl)
{
	return sl->id;
}

int slab_fd(const struct slab *sl)
{
	return sl->fd;
}
