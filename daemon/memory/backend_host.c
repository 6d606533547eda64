/*
 * Host memory: one sealed memfd per tensor.
 *
 * - Size is fixed at creation (F_SEAL_SHRINK | F_SEAL_GROW), so no peer can
 *   truncate it under another's mapping and nobody ever gets SIGBUS.
 * - Pages are allocated at creation with fallocate(), so a full tmpfs fails
 *   the create with ENOSPC instead of a SIGBUS at first touch later.
 * - Publishing an immutable tensor adds F_SEAL_WRITE, which the kernel
 *   refuses (EBUSY) while any writable shared mapping exists: immutability
 *   is enforced by the kernel, not by trusting clients. After that every
 *   descriptor is harmless (no write(), no shared writable mmap, no hole
 *   punching), so readers get a plain dup. Readers of a mutable tensor who
 *   may not write get a fresh O_RDONLY descriptor instead, which they cannot
 *   reopen for writing through /proc: the memfd is mode 0600, the daemon's.
 * - Tensors of POOL_MIN_SIZE and up take a memfd that the pool's worker
 *   allocated ahead of time (pool.h), so the loop thread neither allocates
 *   their pages nor frees them: every host memfd is closed on the worker.
 * - A reserve (docs/design.md, "The reserve") is a ready pool memfd handed
 *   to one client before any create names it, sealed against growing; the
 *   create that names it adopts it as its tensor's memfd.
 * - Besides the pool's ready memfds, the daemon holds one descriptor per
 *   live host tensor and one per reserve.
 * The daemon itself never maps the memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "common/sys.h"
#include "daemon/base/log.h"
#include "memlimit.h"
#include "pool.h"
#include "slab.h"

/* Set by backend_host_set_pool() before init; UINT64_MAX: the default. */
static uint64_t pool_budget = UINT64_MAX;
static struct pool *pool;
static struct slabs slabs; /* small immutable tensors; a->priv is the slab */

void backend_host_set_pool(uint64_t budget)
{
	pool_budget = budget;
}

struct pool *backend_host_pool(void)
{
	return pool;
}

/* A sixteenth of the memory we may use (memlimit.c), at most 2 GiB: room for
 * one ready memfd of a 1 GiB tensor on a machine with 24 GiB. */
static uint64_t default_pool_budget(void)
{
	uint64_t b = memlimit_bytes() / 16;

	return b < (2ull << 30) ? b : 2ull << 30;
}

/* The page size: a memfd takes whole pages. */
static uint64_t host_page = 4096;

static int host_init(char *why, size_t why_len)
{
	uint64_t budget = pool_budget == UINT64_MAX ? default_pool_budget() : pool_budget;
	enum pool_pages pages = pool_pages_default();
	long page = sysconf(_SC_PAGESIZE);
	int r = pool_new(budget, pages, &pool);

	if (page > 0)
		host_page = (uint64_t)page;
	if (r < 0) {
		snprintf(why, why_len, "cannot start the memory pool's worker: %s", strerror(-r));
		return r;
	}
	slabs_init(&slabs);
	log_info("backend host: memory pool of up to %llu bytes in %s", (unsigned long long)budget,
		 pool_pages_name(pages));
	if (pages == POOL_PAGES_SMALL && budget)
		log_info("backend host: large puts run at about half of memcpy speed with 4 KiB "
			 "pages; shmem_enabled 'advise' lets the pool use huge pages "
			 "(docs/design.md, \"Huge pages\")");
	return 0;
}

static void host_fini(void)
{
	pool_free(pool);
	pool = NULL;
	slabs_fini(&slabs);
}

void backend_host_slab_stats(uint32_t *ret_slabs, uint64_t *ret_bytes)
{
	*ret_slabs = slabs.n_slabs;
	*ret_bytes = slabs.used;
}

static int host_device_count(void)
{
	return 1;
}

static int host_device_uuid(int device_id, uint8_t uuid[16])
{
	return -ENOENT;
}

/* Half of the memory we may use: physical memory, or a smaller cgroup limit. */
static uint64_t host_default_capacity(int device_id)
{
	return memlimit_bytes() / 2;
}

static const char *host_path(int device_id)
{
	return "memfd";
}

static int host_alloc(struct backend_alloc *a, uint64_t size, int device_id, const char *name)
{
	char label[64];
	int fd, r;

	a->fd = -1;
	a->size = size;
	/* tmpfs takes whole pages. */
	a->footprint = (size + host_page - 1) & ~(host_page - 1);
	if (size == 0) {
		a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_NONE;
		return 0;
	}
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;

	/* Large tensors come from the pool: allocated, zeroed, off the loop. */
	if (pool && size >= POOL_MIN_SIZE) {
		fd = pool_take(pool, size);
		if (fd >= 0) {
			a->fd = fd;
			goto seal;
		}
	}
	/* The label shows in /proc/PID/maps of every client: handy in gdb. */
	snprintf(label, sizeof(label), "tensord:%s", name);
	fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	a->fd = fd;
	if (ftruncate(fd, (off_t)size) < 0)
		return errno == EFBIG || errno == EINVAL ? -ENOSPC : -errno;
	/* Allocate every page now; tmpfs answers ENOSPC when it is full. The
	 * pool's ready memory goes first, before a create fails. */
	for (int tries = 0;; tries++) {
		do
			r = fallocate(fd, 0, 0, (off_t)size);
		while (r < 0 && errno == EINTR);
		if (r == 0)
			break;
		if ((errno != ENOSPC && errno != ENOMEM) || !pool || tries > 0 || !pool_trim(pool))
			return errno == ENOSPC || errno == ENOMEM ? -ENOSPC : -errno;
		log_info("host: trimmed the memory pool to allocate %llu bytes",
			 (unsigned long long)size);
		pool_settle(pool);
	}
seal:
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		return -errno;
	/* A memfd is born mode 0777, and anyone holding a descriptor can
	 * reopen it through /proc/PID/fd with those bits: a reader of a
	 * mutable tensor would turn its O_RDONLY descriptor into a writable
	 * one. Only the daemon's own user may reopen it now. */
	if (fchmod(fd, 0600) < 0)
		return -errno;
	return 0;
}

/* A ready pool memfd of size's class, for a reserve: the client writes it, never grows it. */
static int host_reserve(struct backend_alloc *a, uint64_t size)
{
	uint64_t c = pool_class_size(size);
	int fd;

	a->fd = -1;
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;
	if (!pool || !c)
		return -EAGAIN;
	fd = pool_take_reserve(pool, c);
	if (fd < 0)
		return fd == -ENOENT ? -EAGAIN : fd;
	a->fd = fd;
	a->size = c;
	a->footprint = c;
	/* Its client holds a writable descriptor: a larger file would be
	 * memory nobody charged. Shrinking it only costs the client. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW) < 0 || fchmod(fd, 0600) < 0)
		return -errno;
	return 0;
}

static int host_adopt(struct backend_alloc *a, struct backend_alloc *r, uint64_t size)
{
	a->fd = r->fd;
	r->fd = -1;
	a->size = size;
	a->footprint = (size + host_page - 1) & ~(host_page - 1);
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;
	/* The excess goes, at most an eighth: its pages leave the client's
	 * mapping too. A reserve its client shrank below size cannot grow back. */
	if (size < r->size && ftruncate(a->fd, (off_t)size) < 0)
		return -errno;
	if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		return -errno;
	if (lseek(a->fd, 0, SEEK_END) != (off_t)size)
		return -EPERM;
	return 0;
}

static void host_release(struct backend_alloc *a);

/* Small immutable tensors share a slab with others of their owner and mode. */
static int host_alloc_shared(struct backend_alloc *a, uint64_t size, uint32_t uid, uint32_t gid,
			     uint32_t mode)
{
	struct slab_class cls = { uid, gid, mode };
	struct slab *sl;
	uint64_t off;
	int r;

	a->fd = -1;
	a->size = size;
	/* Its slot: what it takes in the slab. */
	a->footprint = (size + SLAB_ALIGN - 1) & ~(uint64_t)(SLAB_ALIGN - 1);
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;
	r = slab_alloc(&slabs, &cls, size, &sl, &off);
	if (r < 0)
		return r == -ENOSPC || r == -ENOMEM ? -ENOSPC : r;
	a->priv = sl;
	a->ipc_offset = off;
	a->share_id = slab_id(sl);
	return 0;
}

/* The bytes of a small sealed memfd, copied into its owner's slab; the memfd goes. */
static int host_share(struct backend_alloc *a, uint32_t uid, uint32_t gid, uint32_t mode)
{
	static uint8_t buf[SLAB_MAX_ALLOC]; /* the loop thread's only */
	struct backend_alloc s = *a;
	ssize_t n;
	int r;

	if (a->priv || a->fd < 0 || !a->size || a->size > sizeof(buf))
		return -EINVAL;
	do
		n = pread(a->fd, buf, (size_t)a->size, 0);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)a->size)
		return n < 0 ? -errno : -EIO;
	r = host_alloc_shared(&s, a->size, uid, gid, mode);
	if (r < 0)
		return r;
	r = slab_write(s.priv, s.ipc_offset, buf, (size_t)a->size);
	if (r < 0) {
		host_release(&s);
		return r;
	}
	s.fd = -1;
	host_release(a);
	*a = s;
	return 0;
}

static int host_export_fd(struct backend_alloc *a, bool writable, int *ret_fd)
{
	int fd, seals;

	if (a->handle_kind == TENSORD__HANDLE_KIND__HANDLE_NONE) {
		*ret_fd = -1;
		return 0;
	}
	if (a->priv) {
		/* A slab is never writable by clients. */
		if (writable)
			return -EPERM;
		fd = slab_export(a->priv);
		if (fd < 0)
			return fd;
		*ret_fd = fd;
		return 0;
	}
	seals = fcntl(a->fd, F_GET_SEALS);
	if (seals < 0)
		return -errno;
	if (writable || (seals & F_SEAL_WRITE)) {
		fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 3);
	} else {
		char path[64];

		/* A new open file description with read-only access: mmap of it
		 * with PROT_WRITE and MAP_SHARED fails, and so do write() and
		 * fallocate(). */
		snprintf(path, sizeof(path), "/proc/self/fd/%d", a->fd);
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0)
		return -errno;
	*ret_fd = fd;
	return 0;
}

static int host_write(struct backend_alloc *a, uint64_t off, const void *data, size_t n)
{
	if (off > a->size || n > a->size - off)
		return -EINVAL;
	if (a->priv)
		return slab_write(a->priv, a->ipc_offset + off, data, n);
	return td_pwrite_all(a->fd, data, n, off);
}

void (*backend_host_seal_retry_hook)(int fd);

/*
 * F_SEAL_WRITE answers EBUSY in two cases. A writable shared mapping of
 * the memfd exists (the creator's own, or one a forked child kept): at
 * once, and again on every try, so the publish is refused. Or pages of
 * the memfd hold references besides the page cache's and the mappings':
 * the kernel waits for them (memfd_wait_for_pins(): rescans 10, 20, 40
 * and 80 ms apart) and gives up after about 150 ms. Those are I/O in
 * flight, or the kernel's own reclaim, compaction or migration, which on
 * a loaded machine can hold a page that long: a CI run on a busy 2-CPU VM
 * failed a put_many so, with no mapping of the member anywhere (issue 30:
 * neither the writer, which writes with pwrite(), nor the daemon, which
 * never maps, nor the reader, whose mappings are private, held one). A
 * transient reference is gone on a later try: up to HOST_SEAL_TRIES
 * (about 0.45 s of waiting on the loop, in that case only).
 */
static int host_freeze(struct backend_alloc *a)
{
	int r = 0;

	/* A slab's bytes can only be written by the daemon already. */
	if (a->handle_kind == TENSORD__HANDLE_KIND__HANDLE_NONE || a->priv)
		return 0;
	if (a->recycled) {
		/* A ring buffer: sealed once, at its first publish. The seal
		 * refuses every write and writable mapping from then on, but
		 * leaves its writer's mapping, made before, writable. */
		int seals = fcntl(a->fd, F_GET_SEALS);

		if (seals < 0)
			return -errno;
		if (seals & F_SEAL_FUTURE_WRITE)
			return 0;
		return fcntl(a->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0 ? -errno
											: 0;
	}
	for (int tries = 1; tries <= HOST_SEAL_TRIES; tries++) {
		r = fcntl(a->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) < 0 ? -errno : 0;
		if (r != -EBUSY)
			break;
		if (tries < HOST_SEAL_TRIES && backend_host_seal_retry_hook)
			backend_host_seal_retry_hook(a->fd);
	}
	return r;
}

/*
 * What recycled memory rests on (docs/recycle.md, section 2), checked on
 * the running kernel: after F_SEAL_FUTURE_WRITE, a write(), a new
 * writable shared mapping and an mprotect() to writable are refused, a
 * write through a private mapping stays private, and the mapping made
 * before the seal still writes. 0, or -errno and why.
 */
int backend_host_probe_recycle(char *why, size_t why_len)
{
	long page = sysconf(_SC_PAGESIZE);
	uint8_t *w = MAP_FAILED, *p = MAP_FAILED, *q = MAP_FAILED;
	const char *bad = NULL;
	int fd, e = 0;

	fd = memfd_create("tensord-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, 2 * page) < 0) {
		e = -errno;
		snprintf(why, why_len, "memfd: %s", strerror(errno));
		goto out;
	}
	w = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (w == MAP_FAILED || fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0) {
		e = -errno;
		snprintf(why, why_len, "F_SEAL_FUTURE_WRITE: %s", strerror(errno));
		goto out;
	}
	if (pwrite(fd, "x", 1, 0) >= 0)
		bad = "write() still succeeds";
	q = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (!bad && q != MAP_FAILED)
		bad = "a new writable shared mapping is allowed";
	if (q == MAP_FAILED)
		q = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
	if (!bad && (q == MAP_FAILED || mprotect(q, (size_t)page, PROT_READ | PROT_WRITE) == 0))
		bad = "a read-only shared mapping can be made writable";
	p = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (!bad && p != MAP_FAILED) {
		p[0] = 7;
		if (w[0] == 7)
			bad = "a write through a private mapping reached the memfd";
	}
	if (!bad) {
		w[page] = 9; /* a page the private mapping has not written */
		if (p != MAP_FAILED && p[page] != 9)
			bad = "a private mapping does not follow the memfd";
	}
	if (bad) {
		e = -ENOTSUP;
		snprintf(why, why_len, "after F_SEAL_FUTURE_WRITE %s", bad);
	}
out:
	if (w != MAP_FAILED)
		munmap(w, 2 * (size_t)page);
	if (p != MAP_FAILED)
		munmap(p, 2 * (size_t)page);
	if (q != MAP_FAILED)
		munmap(q, (size_t)page);
	if (fd >= 0)
		close(fd);
	return e;
}

static void host_release(struct backend_alloc *a)
{
	if (a->priv) {
		slab_free(&slabs, a->priv, a->ipc_offset, a->size);
		a->priv = NULL;
		return;
	}
	backend_released(a->fd);
	/* Closing the last descriptor frees the pages: on the worker. */
	if (a->fd >= 0 && pool)
		pool_discard(pool, a->fd, a->size);
	else if (a->fd >= 0)
		close(a->fd);
	a->fd = -1;
}

void backend_host_keep_contents(void)
{
	slabs.keep_contents = true;
}

void backend_host_watch_slabs(void (*fn)(int fd))
{
	slabs.on_close = fn;
}

void backend_host_defer_frees(void)
{
	slabs.defer_frees = true;
}

void backend_host_flush_frees(void)
{
	if (slabs.n_pending)
		slabs_flush(&slabs);
}

const struct backend_ops backend_host = {
	.name = "host",
	.device_type = kDLCPU,
	.init = host_init,
	.fini = host_fini,
	.device_count = host_device_count,
	.device_uuid = host_device_uuid,
	.default_capacity = host_default_capacity,
	.path = host_path,
	.alloc = host_alloc,
	.reserve = host_reserve,
	.adopt = host_adopt,
	.alloc_shared = host_alloc_shared,
	.shared_max = SLAB_MAX_ALLOC,
	.share = host_share,
	.export_fd = host_export_fd,
	.write = host_write,
	.freeze = host_freeze,
	.release = host_release,
};
