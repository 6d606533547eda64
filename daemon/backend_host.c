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
 *   may not write get a fresh O_RDONLY descriptor instead.
 * - No descriptor is cached beyond the memfd itself: the daemon's fd count
 *   is one per live host tensor.
 * The daemon itself never maps the memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"


static int host_init(char *why, size_t why_len)
{
	return 0;
}

static int host_device_count(void)
{
	return 1;
}

static int host_device_uuid(int device_id, uint8_t uuid[16])
{
	return -ENOENT;
}

static uint64_t host_default_capacity(int device_id)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || psize <= 0)
		return 1ull << 30;
	return (uint64_t)pages * (uint64_t)psize / 2;
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
	if (size == 0) {
		a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_NONE;
		return 0;
	}
	a->handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;

	/* The label shows in /proc/PID/maps of every client: handy in gdb. */
	snprintf(label, sizeof(label), "tensord:%s", name);
	fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	a->fd = fd;
	if (ftruncate(fd, (off_t)size) < 0)
		return errno == EFBIG || errno == EINVAL ? -ENOSPC : -errno;
	/* Allocate every page now; tmpfs answers ENOSPC when it is full. */
	do
		r = fallocate(fd, 0, 0, (off_t)size);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return errno == ENOSPC || errno == ENOMEM ? -ENOSPC : -errno;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		return -errno;
	return 0;
}

static int host_export_fd(struct backend_alloc *a, bool writable, int *ret_fd)
{
	int fd, seals;

	if (a->handle_kind == TENSORD__HANDLE_KIND__HANDLE_NONE) {
		*ret_fd = -1;
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

static int host_freeze(struct backend_alloc *a)
{
	if (a->handle_kind == TENSORD__HANDLE_KIND__HANDLE_NONE)
		return 0;
	if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) < 0)
		return -errno;
	return 0;
}

static void host_release(struct backend_alloc *a)
{
	if (a->fd >= 0)
		close(a->fd);
	a->fd = -1;
}

const struct backend_ops backend_host = {
	.name = "host",
	.device_type = kDLCPU,
	.init = host_init,
	.device_count = host_device_count,
	.device_uuid = host_device_uuid,
	.default_capacity = host_default_capacity,
	.path = host_path,
	.alloc = host_alloc,
	.export_fd = host_export_fd,
	.freeze = host_freeze,
	.release = host_release,
};
