/*
 * The importer table, and the host (memfd) importer. The GPU importers
 * are in their vendors' folders (gpu/<id>/import_<id>.c), on what they
 * share (import_gpu.c).
 *
 * Writable leases (the creator's, and attaches of mutable tensors by those
 * allowed to write) map the memfd MAP_SHARED. Everyone else maps it
 * MAP_PRIVATE with PROT_WRITE: a consumer that ignores the read-only flag
 * and writes gets its own copy-on-write pages, neither a crash nor a change
 * that others see. Each further lease of the same tensor in this process
 * gets a private view of its own (view()), from the descriptor the mapping
 * keeps, so such a write shows in no other lease either, and a repeat
 * attach needs no descriptor from the daemon. Mapping never touches the
 * pages, so an attach costs the same for 4 KiB and for 1 GiB.
 *
 * Unless the mapping is still clean: when no page of it was copied by a
 * stray write (memfd_clean(), from /proc/self/pagemap), a further lease
 * uses the same mapping. A process holding a million leases of a few
 * tensors then holds a few mappings, not a million (vm.max_map_count is
 * 65530 by default). The price: a stray write through one lease shows in
 * the other leases of the same tensor that this process holds at that
 * moment (never in another process, never in a later attach, which finds
 * the mapping no longer clean and gets a view of its own).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import.h"

/* Host memory, then each GPU handle kind's importer as common/vendor.h says. */
#define TD_IMPORTER(id, kind, fd, importer) &importer,
const struct td_importer *const td_importers[] = {
	&td_importer_memfd,
	TD_GPU_HANDLES(TD_IMPORTER) /* one per GPU handle kind */
	NULL,
};
#undef TD_IMPORTER

const struct td_importer *td_importer_for(Tensord__HandleKind kind)
{
	for (int i = 0; td_importers[i]; i++)
		if (td_importers[i]->handle_kind == kind)
			return td_importers[i];
	return NULL;
}

/*
 * The process's mappings against vm.max_map_count (issue 30). Past that
 * count every mmap() fails, and so does whatever else needs a mapping: a
 * thread's stack, glibc's thread-local data (which aborts the process), a
 * malloc arena. A process attaching many distinct tensors stopped at about
 * 50,000 leases with "cannot allocate memory for thread-local data:
 * ABORT". So this library counts the mappings it makes for leases (each
 * host tensor's mapping and view), and refuses a new one with EMFILE,
 * naming the limit, when the process's mappings would come within a
 * margin of the limit: the limit / 16, at least 64 and at most 1024, kept
 * for the rest of the process. The rest of the process is measured from
 * /proc/self/maps at the first mapping and again every limit / 16 of ours,
 * or every 64 near the limit; between, it is taken as unchanged.
 * vm.max_map_count is read once; TENSORD_MAX_MAP_COUNT, when set to a
 * smaller number, stands for it (tests reach the limit with it).
 */
static pthread_mutex_t td_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static long td_maps_limit;     /* 0: not read yet */
static long td_maps_held;      /* ours, now */
static long td_maps_rest = -1; /* the process's others, when last measured; -1: never */
static long td_maps_since;     /* ours made since that measurement */

/* Lines of /proc/self/maps (one per mapping), or -1 when unreadable. */
static long td_maps_count_process(void)
{
	char buf[65536];
	long n = 0;
	ssize_t k;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	while ((k = read(fd, buf, sizeof(buf))) > 0 || (k < 0 && errno == EINTR))
		for (ssize_t i = 0; i < k; i++)
			n += buf[i] == '\n';
	close(fd);
	return k < 0 ? -1 : n;
}

/* Lock held. vm.max_map_count, or the smaller TENSORD_MAX_MAP_COUNT. */
static long td_maps_read_limit(void)
{
	long lim = 65530; /* the kernel's default, when /proc/sys cannot be read */
	const char *env = getenv("TENSORD_MAX_MAP_COUNT");
	char buf[32];
	ssize_t k;
	int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		k = read(fd, buf, sizeof(buf) - 1);
		if (k > 0) {
			buf[k] = '\0';
			if (strtol(buf, NULL, 10) > 0)
				lim = strtol(buf, NULL, 10);
		}
		close(fd);
	}
	if (env && *env) {
		long e = strtol(env, NULL, 10);

		if (e > 0 && e < lim)
			lim = e;
	}
	return lim;
}

static long td_maps_margin(long lim)
{
	long m = lim / 16;

	return m < 64 ? 64 : m > 1024 ? 1024 : m;
}

int td_maps_admit(const char *name)
{
	long lim, margin, total;
	int r = 0;

	pthread_mutex_lock(&td_maps_lock);
	if (!td_maps_limit)
		td_maps_limit = td_maps_read_limit();
	lim = td_maps_limit;
	margin = td_maps_margin(lim);
	total = td_maps_rest + td_maps_held;
	if (td_maps_rest < 0 || td_maps_since >= lim / 16 ||
	    (total + 1 + margin > lim && td_maps_since >= 64)) {
		long all = td_maps_count_process();

		if (all >= 0) {
			td_maps_rest = all > td_maps_held ? all - td_maps_held : 0;
			td_maps_since = 0;
		} else if (td_maps_rest < 0) {
			td_maps_rest = 0;
		}
		total = td_maps_rest + td_maps_held;
	}
	if (total + 1 + margin > lim) {
		r = td_set_error(-EMFILE,
				 "tensor '%s': this process has %ld memory mappings (%ld of them "
				 "for tensord leases) and vm.max_map_count is %ld: one more would "
				 "leave fewer than the %ld kept for the rest of the process "
				 "(threads, thread-local data); release tensors, or raise "
				 "vm.max_map_count",
				 name, total, td_maps_held, lim, margin);
	} else {
		td_maps_held++;
		td_maps_since++;
	}
	pthread_mutex_unlock(&td_maps_lock);
	return r;
}

void td_maps_gone(long n)
{
	pthread_mutex_lock(&td_maps_lock);
	td_maps_held = td_maps_held > n ? td_maps_held - n : 0;
	pthread_mutex_unlock(&td_maps_lock);
}

long td_maps_held_now(void)
{
	long n;

	pthread_mutex_lock(&td_maps_lock);
	n = td_maps_held;
	pthread_mutex_unlock(&td_maps_lock);
	return n;
}

void td_maps_adopted(void)
{
	pthread_mutex_lock(&td_maps_lock);
	td_maps_held++;
	pthread_mutex_unlock(&td_maps_lock);
}

/* The descriptor a mapping keeps for make_private() and view(), stored in priv. */
static int priv_fd(const struct td_mapping *m)
{
	return (int)(intptr_t)m->priv - 1;
}

/*
 * MADV_RANDOM on a creator's mapping, as on a reserve: unmapping a
 * mapping without it marks every page it maps accessed
 * (vma_has_recency() in the kernel's unmap). The creator's view after
 * publish is read-faulted back in when the creator reads its tensor, and
 * unmapped at its release: 64 MiB read 1 B per 4 KiB, then unmapped, took
 * 3.5-4.7 ms to unmap without it and 1.4-1.7 ms with it (a C loop on this
 * VM; the reads cost the same). Advice only: a failure changes nothing.
 */
static void no_recency(void *p, size_t len)
{
	(void)madvise(p, len, MADV_RANDOM);
}

static bool slab_point(struct td_mapping *m, const struct td_import_desc *d, uint64_t off,
		       uint64_t len);
static void slab_unpoint(struct td_mapping *m);

static int memfd_map(struct td_mapping *m, int fd, const struct td_import_desc *d)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t lead = d->ipc_offset % page, len = d->map_size + lead;
	void *p;
	int r;

	if (d->premapped && d->premapped_lent) {
		/* A ring buffer's mapping, its writer's for as long as this lives. */
		if (fd >= 0)
			close(fd);
		if (lead || d->premapped_len < d->map_size || !d->writable)
			return td_set_error(-EPROTO, "tensord put a tensor in a ring buffer that "
						     "cannot hold it");
		m->base = d->premapped;
		m->data = d->premapped;
		m->size = d->premapped_len;
		m->file_off = 0;
		m->device = (DLDevice){ kDLCPU, 0 };
		m->priv = NULL;
		m->lent = true;
		return 0;
	}
	if (fd < 0)
		return td_set_error(-EPROTO, "tensord sent no descriptor for host memory");
	if (d->map_size == 0 || len < d->map_size || len > SIZE_MAX) {
		close(fd);
		return td_set_error(-EPROTO, "tensord sent a bad mapping size");
	}
	if (d->premapped) {
		/* The reserve, its page tables filled: a fork() copies it from
		 * now on, as any creator's mapping (docs/design.md, "Fork"). */
		if (lead || d->premapped_len < d->map_size || !d->writable ||
		    madvise(d->premapped, (size_t)d->premapped_len, MADV_DOFORK) < 0) {
			close(fd);
			return td_set_error(-EPROTO,
					    "tensord put a tensor in a reserve that cannot "
					    "hold it");
		}
		/* The reserve's mapping is a lease's from here: counted as ours. */
		td_maps_adopted();
		m->base = d->premapped;
		m->data = d->premapped;
		m->size = d->premapped_len;
		m->file_off = 0;
		m->device = (DLDevice){ kDLCPU, 0 };
		m->priv = (void *)(intptr_t)(fd + 1);
		return 0;
	}
	if (slab_point(m, d, d->ipc_offset - lead, len)) {
		close(fd); /* the client keeps the slab's descriptor */
		return 0;
	}
	/* A creator's mapping is about to be filled: populating it in one call
	 * costs a fraction of one page fault per 4 KiB during the copy. An
	 * attach is left to fault, so attaching stays O(1) in size. A tensor
	 * in a slab gets the pages under it only. */
	r = td_maps_admit(d->name ? d->name : "");
	if (r < 0) {
		close(fd);
		return r;
	}
	p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
		 (d->writable ? MAP_SHARED : MAP_PRIVATE) | (d->populate ? MAP_POPULATE : 0), fd,
		 (off_t)(d->ipc_offset - lead));
	if (p == MAP_FAILED) {
		int e = errno;

		td_maps_gone(1);
		close(fd);
		return td_set_error(-e, "mmap of %llu bytes failed: %s", (unsigned long long)len,
				    strerror(e));
	}
	if (d->populate)
		no_recency(p, (size_t)len);
	m->base = p;
	m->data = (uint8_t *)p + lead;
	m->size = len;
	m->file_off = d->ipc_offset - lead;
	m->device = (DLDevice){ kDLCPU, 0 };
	if (d->shared) {
		/* Never reused, so no view will need it; the client keeps the
		 * slab's descriptor once for all its tensors. */
		close(fd);
		m->priv = NULL;
	} else {
		m->priv = (void *)(intptr_t)(fd + 1);
	}
	return 0;
}

static void memfd_unmap(struct td_mapping *m)
{
	if (m->slab)
		slab_unpoint(m);
	if (m->base && !m->lent) { /* NULL once parked */
		munmap(m->base, (size_t)m->size);
		td_maps_gone(1);
	}
	if (m->priv)
		close(priv_fd(m));
	m->priv = NULL;
}

/* Same address, same bytes, but private from now on. */
static int memfd_remap(struct td_mapping *m, int flags)
{
	void *p;

	if (!m->writable || !m->priv)
		return td_set_error(-EINVAL, "mapping of '%s' is not writable", m->name);
	p = mmap(m->base, (size_t)m->size, PROT_READ | PROT_WRITE, flags | MAP_FIXED, priv_fd(m),
		 (off_t)m->file_off);
	if (p == MAP_FAILED)
		return td_set_error(-errno, "tensor '%s': remapping failed: %s", m->name,
				    strerror(errno));
	/* A new mapping: the advice of the one it replaced did not carry over. */
	no_recency(p, (size_t)m->size);
	return 0;
}

static int memfd_make_private(struct td_mapping *m)
{
	/* A ring buffer's view stays shared (the seal is F_SEAL_FUTURE_WRITE)
	 * but is revoked: read-only from the publish on, so a later write
	 * through it faults instead of changing what others read. Its ring
	 * makes it writable again for its next version (ring.c). */
	if (m->lent)
		return mprotect(m->base, (size_t)m->size, PROT_READ) < 0
			       ? td_set_error(-errno, "tensor '%s': mprotect failed: %s", m->name,
					      strerror(errno))
			       : 0;
	return memfd_remap(m, MAP_PRIVATE);
}

static int memfd_make_shared(struct td_mapping *m)
{
	if (m->lent)
		return mprotect(m->base, (size_t)m->size, PROT_READ | PROT_WRITE) < 0 ? -errno : 0;
	return memfd_remap(m, MAP_SHARED);
}

/* A private mapping of its own: a stray write through it stays there. */
static int memfd_view(struct td_mapping *m, void **ret_base)
{
	void *p;
	int r;

	if (!m->priv)
		return td_set_error(-EINVAL, "mapping of '%s' keeps no descriptor", m->name);
	r = td_maps_admit(m->name);
	if (r < 0)
		return r;
	p = mmap(NULL, (size_t)m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, priv_fd(m),
		 (off_t)m->file_off);
	if (p == MAP_FAILED) {
		r = -errno;
		td_maps_gone(1);
		return td_set_error(r, "tensor '%s': mmap of %llu bytes failed: %s", m->name,
				    (unsigned long long)m->size, strerror(-r));
	}
	*ret_base = p;
	return 0;
}

/*
 * Above this, a lease gets a view without looking: reading the page map
 * costs 8 bytes a page, while a view costs one mmap whatever its size.
 */
#define CLEAN_CHECK_MAX (4ull << 20)

/* /proc/self/pagemap of this process, opened again after a fork; -1 when unreadable. */
static int pagemap_fd(void)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static pid_t owner;
	static int fd = -1;
	pid_t me = getpid();
	int r;

	pthread_mutex_lock(&lock);
	if (owner != me) {
		/* A child's copy names the parent's pages: never read through it. */
		if (fd >= 0 && owner)
			close(fd);
		fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		owner = me;
	}
	r = fd;
	pthread_mutex_unlock(&lock);
	return r;
}

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
#define PM_FILE (1ull << 61) /* a page of the file, or shared anonymous memory */

/*
 * Reads the page map entries of the pages of [p, p + len), at most max,
 * into e; returns how many, or -1 when not known.
 */
static long pagemap_read(const void *p, uint64_t len, uint64_t *e, uint64_t max)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), first = (uintptr_t)p / page, n;
	int fd;

	if (!p || !len)
		return -1;
	n = ((uintptr_t)p + len - 1) / page - first + 1;
	if (n > max)
		return -1;
	fd = pagemap_fd();
	if (fd < 0 || pread(fd, e, n * sizeof(e[0]), (off_t)(first * sizeof(e[0]))) !=
			      (ssize_t)(n * sizeof(e[0])))
		return -1;
	return (long)n;
}

/*
 * A private page that a write copied is anonymous: present without the
 * file bit, or swapped out. Pages never touched are absent, and clean.
 */
static bool pm_dirty(uint64_t e)
{
	return (e & PM_SWAPPED) || ((e & PM_PRESENT) && !(e & PM_FILE));
}

bool td_pages_clean(const void *p, uint64_t len)
{
	uint64_t e[CLEAN_CHECK_MAX / 4096];
	long n = len > CLEAN_CHECK_MAX ? -1 : pagemap_read(p, len, e, sizeof(e) / sizeof(e[0]));

	for (long i = 0; i < n; i++)
		if (pm_dirty(e[i]))
			return false;
	return n > 0;
}

/* Page map entries read at once: 4 KiB of them, for 2 MiB of mapping. */
#define PM_CHUNK 512

static bool memfd_clean(const struct td_mapping *m)
{
	return m->base && !m->writable && td_pages_clean(m->base, m->size);
}

struct td_slabmap *td_slabmap_new(int fd, const char *name, pthread_mutex_t *lock)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct td_slabmap *s;
	struct stat st;
	void *p;
	int r;

	/* Without the page map no page can be known clean: windows, as before. */
	if (pagemap_fd() < 0) {
		td_set_error(-ENOTSUP, "/proc/self/pagemap cannot be read");
		return NULL;
	}
	if (fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > SIZE_MAX) {
		td_set_error(-EPROTO, "tensor '%s': the slab's size cannot be read", name);
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (s)
		s->uses = calloc((size_t)(((uint64_t)st.st_size + page - 1) / page),
				 sizeof(*s->uses));
	if (!s || !s->uses) {
		free(s);
		td_set_error(-ENOMEM, "out of memory");
		return NULL;
	}
	r = td_maps_admit(name);
	if (r < 0) {
		free(s->uses);
		free(s);
		return NULL;
	}
	/* Lazily faulted: a lease touches the pages under its tensor only. */
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED) {
		td_set_error(-errno, "tensor '%s': mmap of a slab of %lld bytes failed: %s", name,
			     (long long)st.st_size, strerror(errno));
		td_maps_gone(1);
		free(s->uses);
		free(s);
		return NULL;
	}
	atomic_init(&s->refs, 1);
	s->base = p;
	s->size = (uint64_t)st.st_size;
	s->lock = lock;
	return s;
}

void td_slabmap_ref(struct td_slabmap *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void td_slabmap_unref(struct td_slabmap *s)
{
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
		return;
	munmap(s->base, (size_t)s->size);
	td_maps_gone(1);
	free(s->uses);
	free(s);
}

/*
 * A read-only lease of a tensor in a slab points into the slab's whole
 * mapping when every page under the tensor shows the slab as it is now.
 * A page a stray write of this process copied does not (it may hold an
 * older tensor's bytes): it is dropped first (MADV_DONTNEED: the next
 * access maps the slab's page again) when no mapping points into it, so
 * that nobody's private copy goes; otherwise the tensor gets a window of
 * its own (memfd_map()). Never faults a page.
 */
static bool slab_point(struct td_mapping *m, const struct td_import_desc *d, uint64_t off,
		       uint64_t len)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), first, n;
	struct td_slabmap *s = d->slab;
	uint64_t e[PM_CHUNK];
	bool ok = true;
	uint8_t *p;

	if (!s || !d->shared || d->writable || d->populate || d->premapped || off > s->size ||
	    len > s->size - off || off % page)
		return false;
	p = (uint8_t *)s->base + off;
	first = off / page;
	n = (len + page - 1) / page;
	pthread_mutex_lock(s->lock);
	/* A ring buffer (docs/recycle.md) may span many chunks of entries. A
	 * dirty page nobody uses is dropped even when a later one fails the
	 * check: it holds nobody's bytes. */
	for (uint64_t c = 0; ok && c < n; c += PM_CHUNK) {
		uint64_t k = n - c < PM_CHUNK ? n - c : PM_CHUNK;

		if (pagemap_read(p + c * page, k * page, e, k) != (long)k) {
			ok = false;
			break;
		}
		for (uint64_t i = 0; ok && i < k; i++) {
			if (!pm_dirty(e[i]))
				continue;
			if (s->uses[first + c + i])
				ok = false; /* someone's private copy: a window */
			else if (madvise(p + (c + i) * page, (size_t)page, MADV_DONTNEED) < 0)
				ok = false;
		}
	}
	for (uint64_t i = 0; ok && i < n; i++)
		s->uses[first + i]++;
	pthread_mutex_unlock(s->lock);
	if (!ok)
		return false;
	td_slabmap_ref(s);
	m->slab = s;
	m->base = p;
	m->data = p + (d->ipc_offset - off);
	m->size = len;
	m->file_off = off;
	m->device = (DLDevice){ kDLCPU, 0 };
	m->priv = NULL;
	return true;
}

/* Undoes slab_point(). */
static void slab_unpoint(struct td_mapping *m)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	struct td_slabmap *s = m->slab;

	pthread_mutex_lock(s->lock);
	for (uint64_t i = 0; i < (m->size + page - 1) / page; i++)
		s->uses[m->file_off / page + i]--;
	pthread_mutex_unlock(s->lock);
	td_slabmap_unref(s);
	m->slab = NULL;
	m->base = NULL;
}

static void memfd_unview(struct td_mapping *m, void *base)
{
	munmap(base, (size_t)m->size);
	td_maps_gone(1);
}

/* Keeps the descriptor, lets the first lease's mapping go (it may hold stray writes). */
static void *memfd_park(struct td_mapping *m)
{
	void *base = m->base;

	if (!base || !m->priv)
		return NULL;
	m->data = (void *)((uintptr_t)m->data - (uintptr_t)base);
	m->base = NULL;
	return base;
}

const struct td_importer td_importer_memfd = {
	.handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD,
	.map = memfd_map,
	.unmap = memfd_unmap,
	.make_private = memfd_make_private,
	.make_shared = memfd_make_shared,
	.view = memfd_view,
	.clean = memfd_clean,
	.unview = memfd_unview,
	.park = memfd_park,
};
