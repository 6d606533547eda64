/*
 * The state log's file (docs/restart.md, sections 0.1 and 3): a memfd, mapped
 * shared, that records are appended to (state_int.h, struct st_log). A
 * record goes in with one copy and its magic last, so a crash leaves a
 * whole record or the log's end; the file grows a chunk at a time,
 * allocated and populated at once (MADV_POPULATE_WRITE), so that a step
 * never faults for the log's memory; a log out of the store is kept as the
 * spare and the next log is written into its warm pages.
 *
 * Apart from state.c because it is the mechanics of one file, knowing
 * nothing of names, memory or the store: state.c decides what goes into a
 * log and when one is stored, rewritten or retired.
 */
#include "state_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Room for n more bytes in l: allocated and mapped. 0 or -errno. */
static int slog_room(struct st_log *l, uint64_t n)
{
	uint64_t cap = l->cap;
	void *map;
	int r;

	if (l->off + n <= l->cap)
		return 0;
	while (cap < l->off + n)
		cap += LOG_CHUNK;
	r = fallocate(l->fd, 0, (off_t)l->cap, (off_t)(cap - l->cap));
	if (r < 0)
		return -errno;
	map = l->map ? mremap(l->map, l->cap, cap, MREMAP_MAYMOVE)
		     : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	/* The new chunk's page tables now, in one call, not a fault per page under later steps. */
	(void)madvise((uint8_t *)map + l->cap, cap - l->cap, MADV_POPULATE_WRITE);
	l->map = map;
	l->cap = cap;
	return 0;
}

/*
 * Appends one sealed record (len bytes at p) to l: its head less the
 * magic, its body, then the magic with one aligned store, so that a crash
 * at any instruction leaves either a whole record or one without its
 * magic (the log's end, record.h).
 */
int st_log_write(struct st_log *l, const uint8_t *p, size_t len)
{
	uint32_t magic;
	int r = slog_room(l, len);

	if (r < 0)
		return r;
	memcpy(&magic, p, sizeof(magic));
	memcpy(l->map + l->off + sizeof(magic), p + sizeof(magic), len - sizeof(magic));
	atomic_signal_fence(memory_order_seq_cst); /* the compiler keeps the order */
	__atomic_store_n((uint32_t *)(void *)(l->map + l->off), magic, __ATOMIC_RELEASE);
	l->off += len;
	return 0;
}

void st_log_close(struct st_log *l)
{
	if (l->map)
		munmap(l->map, l->cap);
	if (l->fd >= 0)
		close(l->fd);
	*l = (struct st_log){ .fd = -1 };
}

/*
 * An empty log in *l to write the whole state into: the spare, its
 * written bytes zeroed (so it reads as a new memfd does, and nothing of
 * the old log can be taken for a record), or a new memfd. 0 or -errno.
 */
int st_log_fresh(struct state *st, struct st_log *l)
{
	if (st->spare.fd >= 0) {
		*l = st->spare;
		st->spare = (struct st_log){ .fd = -1 };
		if (l->off)
			memset(l->map, 0, l->off);
		l->off = 0;
		return 0;
	}
	*l = (struct st_log){ .fd = memfd_create("tensord-state", MFD_CLOEXEC) };
	return l->fd < 0 ? -errno : 0;
}

/* l, out of the store now, becomes the spare (the one before it closed). */
void st_log_retire(struct state *st, struct st_log *l)
{
	st_log_close(&st->spare);
	st->spare = *l;
	*l = (struct st_log){ .fd = -1 };
}

/* Appends the record in st->buf to the log: 0 or -errno. */
int st_log_append(struct state *st)
{
	int r;

	if (st->buf.failed)
		return -ENOMEM;
	rec_seal(&st->buf, ++st->seq, st->lineage);
	r = st_log_write(&st->log, st->buf.p, st->buf.len);
	if (r < 0) {
		st->seq--;
		return r;
	}
	st->fig.log_bytes = st->log.off;
	return 0;
}
