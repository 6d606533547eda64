/*
 * Keeping the state while the daemon runs (state.h, docs/restart.md
 * sections 2 and 3): which memory is in the service manager's store, the
 * name each published tensor has there, and the log every commit step is
 * appended to. The log's file (appending, growing, the spare) is
 * state_log.c; restoring at start is state_restore.c.
 *
 * The order that makes it crash-consistent, in every step: memory a
 * record names is stored before the record is written, the record is
 * written (one copy into the mapped log) before anyone hears of the step, and memory no name
 * is in any more is removed after it. A kill -9 between any two of them
 * leaves memory in the store that no record names (removed at the next
 * start), never a record whose memory is missing.
 */
#include "state_int.h"

#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/base/log.h"
#include "daemon/memory/backend.h"
#include "daemon/memory/backend_gpu.h"
#include "daemon/memory/slab.h"
#include "daemon/base/sdnotify.h"

static int cmp_mems(const struct st_mem *a, const struct st_mem *b)
{
	if (a->dev != b->dev)
		return a->dev < b->dev ? -1 : 1;
	return a->ino < b->ino ? -1 : a->ino > b->ino;
}

static int cmp_names(const struct st_name *a, const struct st_name *b)
{
	return strcmp(a->name, b->name);
}

RB_GENERATE(st_mems, st_mem, link, cmp_mems)
RB_GENERATE(st_names, st_name, link, cmp_names)

void st_mem_name(uint64_t dev, uint64_t ino, char *buf, size_t len)
{
	snprintf(buf, len, "tm.%" PRIx64 ".%" PRIx64, dev, ino);
}

struct st_mem *st_mem_add(struct state *st, uint64_t dev, uint64_t ino)
{
	struct st_mem *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->dev = dev;
	m->ino = ino;
	st_mem_name(dev, ino, m->name, sizeof(m->name));
	RB_INSERT(st_mems, &st->mems, m);
	st->fig.stored++;
	return m;
}

static struct st_fd_cache *fd_cached(struct state *st, int fd)
{
	return &st->fd_cache[(unsigned)fd % (sizeof(st->fd_cache) / sizeof(st->fd_cache[0]))];
}

/* m, freed: out of the store (after the record of the step that freed it). */
static void mem_remove(struct state *st, struct st_mem *m)
{
	for (size_t i = 0; i < sizeof(st->fd_cache) / sizeof(st->fd_cache[0]); i++)
		if (st->fd_cache[i].m == m)
			st->fd_cache[i] = (struct st_fd_cache){ .fd = -1 };
	int r = sdnotify_fdstore_remove(m->name);

	if (r < 0)
		log_warn("state: removing %s from the descriptor store: %s", m->name, strerror(-r));
	RB_REMOVE(st_mems, &st->mems, m);
	st->fig.stored--;
	free(m);
}

/*
 * The descriptor of t's memory when a restart can bring t back: a host
 * tensor of persistent lifetime with bytes, not another node's replica.
 * Borrowed; -1: t would not survive.
 */
static int memory_fd(const struct tensor *t)
{
	if (!t->alloc.ops || !t->nbytes || (t->flags & TENSORD_LIFETIME_CONNECTION) ||
	    t->name[0] == '@')
		return -1;
	/* A CUDA VMM allocation: its kept export (backend_gpu.h) keeps it alive. */
	if (t->device.device_type == kDLCUDA)
		return t->alloc.handle_kind == TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD &&
				       t->alloc.priv
			       ? ((const struct gpu_mem *)t->alloc.priv)->fd
			       : -1;
	if (t->device.device_type != kDLCPU)
		return -1;
	/* The host backend's private state is a slab (backend_host.c). */
	return t->alloc.priv ? slab_fd(t->alloc.priv) : t->alloc.fd;
}

/*
 * t's memory in the store: found, or stored now (new: it gets stored
 * before the record). NULL when t would not survive a restart: not
 * restorable, the store full, or storing failed (logged).
 */
static struct st_mem *mem_of(struct state *st, const struct tensor *t, struct stat *ret_st)
{
	int fd = memory_fd(t), r;
	struct st_mem key, *m;
	struct st_fd_cache *fc;

	if (fd < 0)
		return NULL;
	fc = fd_cached(st, fd);
	if (fc->fd == fd && fc->m && !fc->m->freed) {
		ret_st->st_size = (off_t)fc->size;
		return fc->m;
	}
	/* Memory is known by its file's identity: a file of its own. */
	if (fstat(fd, ret_st) < 0 || !S_ISREG(ret_st->st_mode))
		return NULL;
	key.dev = (uint64_t)ret_st->st_dev;
	key.ino = (uint64_t)ret_st->st_ino;
	m = RB_FIND(st_mems, &st->mems, &key);
	if (m && !m->freed)
		goto found;
	/* One descriptor stays free: a log's successor is stored before it goes. */
	if (st->fig.stored + 1 >= st->max_fds) {
		if (!st->full_warned)
			log_warn("state: the descriptor store is full (%" PRIu64
				 " descriptors): tensor '%s' and later ones will not "
				 "survive a restart until memory is freed",
				 st->max_fds, t->name);
		st->full_warned = true;
		return NULL;
	}
	m = st_mem_add(st, key.dev, key.ino);
	if (!m)
		return NULL;
	r = sdnotify_fdstore(fd, m->name);
	if (r < 0) {
		log_warn("state: storing the memory of tensor '%s' (%s): %s; it will not "
			 "survive a restart",
			 t->name, m->name, strerror(-r));
		RB_REMOVE(st_mems, &st->mems, m);
		st->fig.stored--;
		free(m);
		return NULL;
	}
found:
	*fc = (struct st_fd_cache){ .fd = fd, .m = m, .size = (uint64_t)ret_st->st_size };
	return m;
}

static struct st_name *name_find(struct state *st, const char *name)
{
	struct st_name key = { .name = name };

	return RB_FIND(st_names, &st->names, &key);
}

/* name's entry, made when it has none; NULL out of memory. */
static struct st_name *name_get(struct state *st, const char *name, size_t len)
{
	struct st_name *n = name_find(st, name);

	if (n)
		return n;
	n = calloc(1, sizeof(*n) + len + 1);
	if (!n)
		return NULL;
	memcpy(n->buf, name, len);
	n->name = n->buf;
	RB_INSERT(st_names, &st->names, n);
	return n;
}

/* n's name is no longer in m; m stays stored while the daemon keeps it. */
static void mem_unref(struct st_mem *m)
{
	if (m)
		m->refs--;
}

/*
 * The release hook (backend_set_release_hook()): the daemon is about
 * to close memory fd. If it is stored, it leaves the store at the next
 * flush, after the record of the step that freed it: removed before, a
 * crash would restore that step's predecessor without its memory.
 */
static struct state *hooked;

static void on_release(int fd)
{
	struct state *st = hooked;
	struct st_mem key, *m;
	struct stat sb;

	if (!st || st->stopped)
		return;
	if (fd_cached(st, fd)->fd == fd)
		*fd_cached(st, fd) = (struct st_fd_cache){ .fd = -1 };
	if (fstat(fd, &sb) < 0)
		return;
	key.dev = (uint64_t)sb.st_dev;
	key.ino = (uint64_t)sb.st_ino;
	m = RB_FIND(st_mems, &st->mems, &key);
	if (!m || m->freed)
		return;
	m->freed = true;
	if (st->n_gone == st->cap_gone) {
		size_t cap = st->cap_gone ? 2 * st->cap_gone : 64;
		struct st_mem **v = realloc(st->gone, cap * sizeof(*v));

		if (!v) {
			/* Out of memory: now, and a crash before the record may
			 * lose the version this step replaced. */
			mem_remove(st, m);
			return;
		}
		st->gone = v;
		st->cap_gone = cap;
	}
	st->gone[st->n_gone++] = m;
}

/* Points n at m (NULL: t does not survive), counting both. */
static void name_set(struct state *st, struct st_name *n, struct st_mem *m, bool persistent)
{
	if (m)
		m->refs++;
	mem_unref(n->mem);
	if (!n->mem && n->unprotected)
		st->fig.unprotected--;
	n->mem = m;
	n->unprotected = !m && persistent;
	if (n->unprotected)
		st->fig.unprotected++;
}

static void name_drop(struct state *st, struct st_name *n)
{
	name_set(st, n, NULL, false);
	RB_REMOVE(st_names, &st->names, n);
	free(n);
}

void st_put_entry(struct rec_buf *b, const struct tensor *t, enum rec_entry_kind kind,
		  uint64_t generation, uint64_t commit, const struct st_mem *m,
		  const struct stat *mst)
{
	struct rec_entry e = {
		.kind = (uint8_t)kind,
		.name_len = (uint16_t)t->name_len,
		.uid = t->owner_uid,
		.gid = t->owner_gid,
		.mode = t->mode,
		.flags = t->flags,
		.generation = generation,
		.commit = commit,
		.created_ns = t->created_ns,
	};
	size_t start = b->len;

	if (rec_entry_has_memory(kind)) {
		e.dtype_code = t->dtype.code;
		e.dtype_bits = t->dtype.bits;
		e.dtype_lanes = t->dtype.lanes;
		e.ndim = (uint8_t)t->ndim;
	}
	rec_put(b, &e, sizeof(e));
	if (rec_entry_has_memory(kind)) {
		struct rec_memory rm = {
			.nbytes = t->nbytes,
			.offset = t->alloc.ipc_offset,
			.dev = m->dev,
			.ino = m->ino,
			.size = t->device.device_type == kDLCPU ? (uint64_t)mst->st_size
								: t->alloc.size,
			.device_type = (uint32_t)t->device.device_type,
		};

		if (t->device.device_type != kDLCPU && t->dev && t->dev->ops->device_uuid)
			t->dev->ops->device_uuid(t->device.device_id, rm.uuid);

		rec_put(b, &rm, sizeof(rm));
		rec_put(b, t->shape, (size_t)t->ndim * sizeof(int64_t));
		rec_put(b, t->strides, (size_t)t->ndim * sizeof(int64_t));
	}
	rec_put(b, t->name, t->name_len);
	rec_put(b, NULL, rec_entry_size(&e) - (b->len - start));
}

/* An unlinked name's entry, from what a change or a tombstone says of it. */
void st_put_unlinked(struct rec_buf *b, const struct reg_change *c)
{
	struct rec_entry e = {
		.kind = ENTRY_UNLINKED,
		.name_len = (uint16_t)c->name_len,
		.uid = c->owner_uid,
		.gid = c->owner_gid,
		.mode = c->mode,
		.generation = c->generation,
		.commit = c->commit,
	};

	rec_put(b, &e, sizeof(e));
	rec_put(b, c->name, c->name_len);
	rec_put(b, NULL, rec_entry_size(&e) - sizeof(e) - c->name_len);
}

void st_put_seq(struct rec_buf *b, const struct rec_seq *q)
{
	struct rec_entry e = { .kind = ENTRY_SEQ };

	rec_put(b, &e, sizeof(e));
	rec_put(b, q, sizeof(*q));
}

void state_flush(struct state *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->n_gone; i++)
		mem_remove(st, st->gone[i]);
	st->n_gone = 0;
}

/*
 * What comes after a step's record was appended (r: 0, or why not): past
 * the log's limit, or when it could not take the step, a new log of the
 * whole state.
 */
static void step_logged(struct state *st, int r)
{
	/* Rewritten past --state-log-size, or past twice the whole state it began
	 * with when that is larger: never a rewrite per step of a large state. */
	if (r == 0 && st->log.off > st->log_max && st->log.off > 2 * st->log_base)
		r = -EFBIG;
	if (r < 0) {
		/* The log cannot take the step (full, out of memory, a change
		 * the registry could not keep): a new log of the whole state. */
		if (r != -EFBIG)
			log_warn("state: appending a step to %s: %s; writing the whole state anew",
				 st->log_name, strerror(-r));
		r = st_log_rewrite(st);
		if (r < 0 && !st->broken_warned) {
			log_error("state: writing the state anew failed: %s; what changes from "
				  "now on may not survive a restart",
				  strerror(-r));
			st->broken_warned = true;
		}
	}
}

/*
 * t lost its name while leased: an ENTRY_RETIRED in the step being built
 * when a restart could bring it back (its memory stored), so that its
 * holders re-adopt it. True if it went in.
 */
static bool put_retired(struct state *st, struct tensor *t)
{
	struct stat mst;
	struct st_mem *m;

	if (t->retired_logged)
		return false;
	m = mem_of(st, t, &mst);
	if (!m)
		return false;
	st_put_entry(&st->buf, t, ENTRY_RETIRED, t->generation, t->commit, m, &mst);
	t->retired_logged = true;
	return true;
}

/* The count of entries of the step in st->buf, set to n. */
static void step_count(struct state *st, uint32_t n)
{
	if (!st->buf.failed)
		memcpy(st->buf.p + sizeof(struct rec_head) + offsetof(struct rec_step, n), &n,
		       sizeof(n));
}

void state_on_retired_gone(struct state *st, const struct tensor *t)
{
	struct rec_step sh = { .n = 1 };
	struct rec_entry e = {
		.kind = ENTRY_RETIRED_GONE,
		.name_len = (uint16_t)t->name_len,
		.uid = t->owner_uid,
		.gid = t->owner_gid,
		.mode = t->mode,
		.generation = t->generation,
		.commit = t->commit,
	};

	if (!st || st->stopped)
		return;
	rec_begin(&st->buf, REC_STEP);
	sh.next_commit = st->reg->next_commit;
	sh.gen_floor = st->reg->gen_floor;
	rec_put(&st->buf, &sh, sizeof(sh));
	rec_put(&st->buf, &e, sizeof(e));
	rec_put(&st->buf, t->name, t->name_len);
	rec_put(&st->buf, NULL, rec_entry_size(&e) - sizeof(e) - t->name_len);
	step_logged(st, st_log_append(st));
}

void state_on_commit(struct state *st, const struct reg_change *v, size_t n, bool lost)
{
	struct rec_step sh = { 0 };
	const struct rec_seq *q;
	struct stat mst;
	int r;

	if (!st || st->stopped)
		return;
	/* The client request that made the step, if one did: its result goes with it. */
	q = seqs_take_step(st->seqs);
	rec_begin(&st->buf, REC_STEP);
	sh.commit = n ? v[n - 1].commit : 0;
	sh.next_commit = st->reg->next_commit;
	sh.gen_floor = st->reg->gen_floor;
	sh.n = (uint32_t)n + (q ? 1 : 0);
	rec_put(&st->buf, &sh, sizeof(sh));
	if (q)
		st_put_seq(&st->buf, q);
	for (size_t i = 0; i < n; i++) {
		const struct reg_change *c = &v[i];
		struct st_name *nm = name_get(st, c->name, c->name_len);

		if (!nm) {
			lost = true;
			continue;
		}
		if (c->kind == REG_PUBLISHED) {
			const struct tensor *t = c->tensor;
			struct st_mem *m = mem_of(st, t, &mst);

			st_put_entry(&st->buf, t, m ? ENTRY_PUBLISHED : ENTRY_NAMED, c->generation,
				     c->commit, m, &mst);
			name_set(st, nm, m, !(t->flags & TENSORD_LIFETIME_CONNECTION));
		} else {
			st_put_unlinked(&st->buf, c);
			name_drop(st, nm);
		}
		/* The version that lost the name and lives on, leased. */
		if (c->retired && put_retired(st, c->retired))
			sh.n++;
	}
	step_count(st, sh.n);
	r = lost ? -ENOMEM : st_log_append(st);
	/* A test's crash between the record and the reply (tests/python/test_idempotent.py). */
	if (r == 0 && q && st->kill_after && --st->kill_after == 0)
		raise(SIGKILL);
	step_logged(st, r);
	state_flush(st);
}

/* --- a whole log: the state in one step ------------------------------------------ */

struct snap {
	struct state *st;
	bool count; /* the start's: names and memory references are made as they are found */
	uint32_t n;
};

static void snap_tensor(void *arg, struct tensor *t)
{
	struct snap *s = arg;
	struct state *st = s->st;
	struct st_name *nm = s->count ? name_get(st, t->name, t->name_len) : name_find(st, t->name);
	struct st_mem *m = NULL;
	struct stat mst;

	if (s->count && nm) {
		int fd = memory_fd(t);
		struct st_mem key;

		/* At start every restorable tensor's memory is one the store passed. */
		if (fd >= 0 && fstat(fd, &mst) == 0) {
			key.dev = (uint64_t)mst.st_dev;
			key.ino = (uint64_t)mst.st_ino;
			m = RB_FIND(st_mems, &st->mems, &key);
		}
		name_set(st, nm, m, !(t->flags & TENSORD_LIFETIME_CONNECTION));
	} else if (nm && nm->mem) {
		m = nm->mem;
		if (fstat(memory_fd(t), &mst) < 0)
			m = NULL;
	}
	st_put_entry(&st->buf, t, m ? ENTRY_PUBLISHED : ENTRY_NAMED, t->generation, t->commit, m,
		     &mst);
	s->n++;
}

/* A version that lost its name and lives on, leased: held for re-adoption after a restart. */
static void snap_retired(void *arg, struct tensor *t)
{
	struct snap *s = arg;
	struct stat mst;
	struct st_mem *m = mem_of(s->st, t, &mst);

	if (!m)
		return;
	st_put_entry(&s->st->buf, t, ENTRY_RETIRED, t->generation, t->commit, m, &mst);
	s->n++;
}

static void snap_tomb(void *arg, const struct reg_change *c)
{
	struct snap *s = arg;

	st_put_unlinked(&s->st->buf, c);
	s->n++;
}

static void snap_seq(void *arg, const struct rec_seq *q)
{
	struct snap *s = arg;

	st_put_seq(&s->st->buf, q);
	s->n++;
}

/* A new log in *l with the whole state in it, not yet stored: 0 or -errno. */
static int slog_write_whole(struct state *st, bool count, uint64_t serial, struct st_log *l)
{
	struct rec_begin bg = { .serial = serial };
	struct rec_step sh = { 0 };
	struct snap s = { .st = st, .count = count };
	struct timespec ts;
	int r;

	r = st_log_fresh(st, l);
	if (r < 0)
		return r;
	clock_gettime(CLOCK_REALTIME, &ts);
	bg.next_commit = sh.next_commit = st->reg->next_commit;
	bg.gen_floor = sh.gen_floor = st->reg->gen_floor;
	bg.created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	sh.commit = st->reg->next_commit - 1;
	st->seq = 0;
	rec_begin(&st->buf, REC_BEGIN);
	rec_put(&st->buf, &bg, sizeof(bg));
	rec_seal(&st->buf, ++st->seq, st->lineage);
	r = st->buf.failed ? -ENOMEM : st_log_write(l, st->buf.p, st->buf.len);
	/* Then every name as one step. */
	rec_begin(&st->buf, REC_STEP);
	rec_put(&st->buf, &sh, sizeof(sh));
	registry_each_published(st->reg, snap_tensor, &s);
	registry_each_retired(st->reg, snap_retired, &s);
	registry_tombs_each(st->reg, "", 0, snap_tomb, &s);
	if (st->seqs)
		seqs_each(st->seqs, snap_seq, &s);
	step_count(st, s.n);
	rec_seal(&st->buf, ++st->seq, st->lineage);
	if (r == 0)
		r = st->buf.failed ? -ENOMEM : st_log_write(l, st->buf.p, st->buf.len);
	if (r < 0)
		st_log_retire(st, l); /* never stored: its bytes are zeroed before a next use */
	return r;
}

int st_log_start(struct state *st, bool count, uint64_t serial)
{
	char name[sizeof(st->log_name)];
	struct st_log l;
	int r = slog_write_whole(st, count, serial, &l);

	if (r < 0)
		return r;
	snprintf(name, sizeof(name), "tensord-state.%" PRIu64, serial);
	r = sdnotify_fdstore(l.fd, name);
	if (r < 0) {
		st_log_retire(st, &l);
		return r;
	}
	/* Stored: the new log is the state from now on; the old one leaves the store. */
	if (st->log.fd >= 0) {
		sdnotify_fdstore_remove(st->log_name);
		st_log_retire(st, &st->log);
	} else {
		st->fig.stored++;
	}
	st->log = l;
	st->log_serial = serial;
	snprintf(st->log_name, sizeof(st->log_name), "%s", name);
	st->fig.log_bytes = st->log_base = l.off;
	return 0;
}

int st_log_rewrite(struct state *st)
{
	int r = st_log_start(st, false, st->log_serial + 1);

	if (r == 0) {
		st->fig.compactions++;
		log_info("state: wrote the whole state anew in %s (%" PRIu64 " bytes)",
			 st->log_name, st->log.off);
	}
	return r;
}

void state_stop(struct state *st)
{
	struct st_mem *m, *mn;
	struct st_name *n, *nn;

	if (!st)
		return;
	if (hooked == st) {
		hooked = NULL;
		backend_set_release_hook(NULL);
		backend_host_watch_slabs(NULL);
	}
	/* The store keeps everything: the next start restores it. */
	RB_FOREACH_SAFE(n, st_names, &st->names, nn)
	{
		RB_REMOVE(st_names, &st->names, n);
		free(n);
	}
	RB_FOREACH_SAFE(m, st_mems, &st->mems, mn)
	{
		RB_REMOVE(st_mems, &st->mems, m);
		free(m);
	}
	st_log_close(&st->log);
	st_log_close(&st->spare);
	free(st->buf.p);
	free(st->gone);
	free(st);
}

void state_freeze(struct state *st)
{
	if (!st)
		return;
	st->stopped = true;
	backend_host_keep_contents();
}

int state_store_socket(struct state *st, int fd, const char *name)
{
	int r;

	if (st->fig.stored + 2 > st->max_fds)
		return -ENOSPC;
	r = sdnotify_fdstore(fd, name);
	if (r < 0) {
		log_warn(
			"state: storing the listening socket %s: %s; the next daemon binds its own",
			name, strerror(-r));
		return r;
	}
	st->fig.stored++;
	return 0;
}

void state_unstore_socket(struct state *st, const char *name)
{
	if (!st)
		return;
	if (sdnotify_fdstore_remove(name) == 0 && st->fig.stored > 0)
		st->fig.stored--;
}

void st_hook(struct state *st)
{
	hooked = st;
	backend_set_release_hook(on_release);
	backend_host_watch_slabs(on_release);
}

uint64_t state_lineage(const struct state *st)
{
	return st ? st->lineage : 0;
}

const struct state_figures *state_figures_live(const struct state *st)
{
	return st ? &st->fig : NULL;
}
