/*
 * Restart (docs/restart.md, section 4): what the service manager's store
 * passed back (LISTEN_FDS), replayed and put back in the table before the
 * daemon serves.
 *
 * The newest log whose BEGIN is whole is the state; its records are read
 * in order until the first that is not whole and checked, and each name
 * ends as its last entry says. A published name comes back when its
 * memory came back too, is what the record says it is (identity, size)
 * and its layout adds up; every other name is remembered as a tombstone,
 * so that its generations go on. Memory nothing restored lives in and
 * older logs are removed from the store. Nothing here trusts a log
 * further than its checksum: every length is checked before it is read.
 */
#include "state_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/base/sdnotify.h"
#include "daemon/memory/backend.h"

#define STATE_PREFIX "tensord-state"
#define MEMORY_PREFIX "tm."

/* A name as the log's last entry of it says; or a retired version (rp.retired). */
struct rp_name {
	RB_ENTRY(rp_name) link;
	struct rec_entry e;
	struct rec_memory m; /* ENTRY_PUBLISHED */
	const uint8_t *dims; /* shape then strides, in the mapped log */
	char name[];
};

/* A memory descriptor the store passed back. */
struct rp_mem {
	RB_ENTRY(rp_mem) link;
	uint64_t dev, ino, size;
	struct sd_passed_fd *p;
	struct reg_arena *arena; /* the tensors restored in it; NULL: none yet */
	uint32_t members;
	bool tried; /* registry_restore_memory() ran (and took its fd) */
};

static int cmp_rp_names(const struct rp_name *a, const struct rp_name *b)
{
	return strcmp(a->name, b->name);
}

/* Retired versions: by name, then generation. */
static int cmp_rp_retired(const struct rp_name *a, const struct rp_name *b)
{
	int c = strcmp(a->name, b->name);

	if (c)
		return c;
	return a->e.generation < b->e.generation ? -1 : a->e.generation > b->e.generation;
}

static int cmp_rp_mems(const struct rp_mem *a, const struct rp_mem *b)
{
	if (a->dev != b->dev)
		return a->dev < b->dev ? -1 : 1;
	return a->ino < b->ino ? -1 : a->ino > b->ino;
}

RB_HEAD(rp_names, rp_name);
RB_HEAD(rp_retired, rp_name);
RB_HEAD(rp_mems, rp_mem);
RB_GENERATE_STATIC(rp_names, rp_name, link, cmp_rp_names)
RB_GENERATE_STATIC(rp_retired, rp_name, link, cmp_rp_retired)
RB_GENERATE_STATIC(rp_mems, rp_mem, link, cmp_rp_mems)

struct replay {
	struct state *st;
	struct rp_names names;
	struct rp_retired retired; /* versions that lost their names while leased, alive */
	struct rp_mems mems;
	uint64_t next_commit, gen_floor;
	const uint8_t *map; /* the chosen log, mapped */
	size_t map_len;
};

/* The log in p: its BEGIN, or false (logged) when it has none that is whole. */
static bool log_begin(const struct sd_passed_fd *p, const uint8_t *map, size_t len,
		      struct rec_head *h, struct rec_begin *bg)
{
	const uint8_t *body;
	const char *why = "empty";
	int r = map ? rec_check(map, len, 0, h, &body, &why) : -1;

	if (r == 0 && (h->kind != REC_BEGIN || h->len < sizeof(*bg) || h->seq != 1)) {
		r = -1;
		why = "its first record is not a BEGIN";
	}
	if (r != 0) {
		log_warn("state: %s: not a state log (%s); ignoring it", p->name, why);
		return false;
	}
	memcpy(bg, body, sizeof(*bg));
	return true;
}

_Static_assert(REC_NAME_MAX == TENSORD_NAME_MAX && REC_NDIM_MAX == TENSORD_NDIM_MAX,
	       "the log's bounds are the API's");

/* One entry of a step: the name's state is now what it says. */
static int apply_entry(void *arg, const struct rec_parsed *p, const char **why)
{
	struct replay *rp = arg;
	struct rp_name *n, *old;

	if (p->e.kind == ENTRY_SEQ) {
		/* What a client's request did (seqs.h): its Resolve is answered. */
		if (rp->st->seqs)
			seqs_restore(rp->st->seqs, &p->s);
		return 0;
	}
	n = calloc(1, sizeof(*n) + p->e.name_len + 1);
	if (!n) {
		*why = "out of memory";
		return -1;
	}
	n->e = p->e;
	n->m = p->m;
	n->dims = p->dims;
	memcpy(n->name, p->name, p->e.name_len);
	if (p->e.kind == ENTRY_RETIRED || p->e.kind == ENTRY_RETIRED_GONE) {
		/* A version held by leases, not by its name; then its end. */
		old = RB_FIND(rp_retired, &rp->retired, n);
		if (old) {
			RB_REMOVE(rp_retired, &rp->retired, old);
			free(old);
		}
		if (p->e.kind == ENTRY_RETIRED)
			RB_INSERT(rp_retired, &rp->retired, n);
		else
			free(n);
		return 0;
	}
	old = RB_INSERT(rp_names, &rp->names, n);
	if (old) {
		RB_REMOVE(rp_names, &rp->names, old);
		free(old);
		RB_INSERT(rp_names, &rp->names, n);
	}
	return 0;
}

/* Applies one STEP's entries (body of len bytes): false when one is malformed. */
static bool apply_step(struct replay *rp, const uint8_t *body, size_t len, const char **why)
{
	struct rec_step sh;

	if (rec_step_parse(body, len, &sh, apply_entry, rp, why) < 0)
		return false;
	if (sh.next_commit > rp->next_commit)
		rp->next_commit = sh.next_commit;
	if (sh.gen_floor > rp->gen_floor)
		rp->gen_floor = sh.gen_floor;
	return true;
}

/*
 * Replays the log mapped in rp, its records in order to its end: true, or
 * false (logged) when it is damaged. A crash leaves no damage (record.h),
 * so a damaged log was written by someone else, and what it said before
 * the damage is not trusted either: restored, it could serve memory that
 * later steps, the damaged ones, freed and reused.
 */
static bool replay_log(struct replay *rp, const struct sd_passed_fd *p, uint64_t lineage)
{
	size_t off = 0;
	uint64_t seq = 0;

	for (;;) {
		struct rec_head h;
		const uint8_t *body;
		const char *why = NULL;
		int r = rec_check(rp->map, rp->map_len, off, &h, &body, &why);

		if (r == 1)
			return true;
		if (r == 0 && (h.seq != seq + 1 || h.lineage != lineage))
			why = h.lineage != lineage ? "a record of another daemon's state"
						   : "a record out of order";
		else if (r == 0 && h.kind == REC_STEP && !apply_step(rp, body, h.len, &why))
			; /* why says it */
		else if (r == 0 && h.kind != REC_STEP && h.seq != 1)
			why = "a record of no known kind";
		if (why) {
			log_error("state: %s: at byte %zu of %zu: %s; a crash leaves no such "
				  "damage, so nothing of this log is restored (what it said "
				  "before the damage may name memory reused since)",
				  p->name, off, rp->map_len, why);
			rp->st->fig.dropped++;
			return false;
		}
		seq = h.seq;
		off += sizeof(h) + h.len;
	}
}

/* The memory descriptors passed back, by identity; a name that is not its identity's is refused. */
static void collect_memory(struct replay *rp, struct sd_passed_fd *v, int n)
{
	for (int i = 0; i < n; i++) {
		struct sd_passed_fd *p = &v[i];
		struct rp_mem *m;
		struct stat sb;
		char want[48];

		if (p->fd < 0 || strncmp(p->name, MEMORY_PREFIX, strlen(MEMORY_PREFIX)) != 0)
			continue;
		if (fstat(p->fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
			log_warn("state: %s: not memory; removing it from the store", p->name);
			goto drop;
		}
		st_mem_name((uint64_t)sb.st_dev, (uint64_t)sb.st_ino, want, sizeof(want));
		if (strcmp(want, p->name) != 0) {
			log_warn("state: %s: the descriptor stored under this name is another "
				 "file (%s); removing it from the store",
				 p->name, want);
			goto drop;
		}
		m = calloc(1, sizeof(*m));
		if (!m)
			goto drop;
		m->dev = (uint64_t)sb.st_dev;
		m->ino = (uint64_t)sb.st_ino;
		m->size = (uint64_t)sb.st_size;
		m->p = p;
		if (RB_INSERT(rp_mems, &rp->mems, m)) {
			free(m); /* passed twice: the first is kept */
			goto drop_fd;
		}
		continue;
drop:
		sdnotify_fdstore_remove(p->name);
		rp->st->fig.dropped++;
drop_fd:
		close(p->fd);
		p->fd = -1;
	}
}

/* Puts one published name back; false (logged, counted) when it cannot be. */
static bool restore_one(struct replay *rp, struct rp_name *n)
{
	struct state *st = rp->st;
	struct rp_mem key = { .dev = n->m.dev, .ino = n->m.ino }, *m;
	int64_t shape[TENSORD_NDIM_MAX], strides[TENSORD_NDIM_MAX];
	struct reg_restore r = {
		.name = n->name,
		.name_len = n->e.name_len,
		.dtype = { n->e.dtype_code, n->e.dtype_bits, n->e.dtype_lanes },
		.ndim = n->e.ndim,
		.shape = shape,
		.strides = strides,
		.nbytes = n->m.nbytes,
		.offset = n->m.offset,
		.uid = n->e.uid,
		.gid = n->e.gid,
		.mode = n->e.mode,
		.flags = n->e.flags,
		.generation = n->e.generation,
		.commit = n->e.commit,
		.created_ns = n->e.created_ns,
		.retired = n->e.kind == ENTRY_RETIRED,
	};
	char why[256], mem_name[48];
	int rc;

	memcpy(shape, n->dims, (size_t)n->e.ndim * sizeof(int64_t));
	memcpy(strides, n->dims + (size_t)n->e.ndim * sizeof(int64_t),
	       (size_t)n->e.ndim * sizeof(int64_t));
	m = RB_FIND(rp_mems, &rp->mems, &key);
	if (!m || n->m.device_type != kDLCPU || m->size < n->m.size)
		st_mem_name(n->m.dev, n->m.ino, mem_name, sizeof(mem_name)); /* for why */
	if (!m) {
		snprintf(why, sizeof(why), "its memory (%s) did not come back from the store",
			 mem_name);
		rc = -ENOENT;
	} else if (n->m.device_type == kDLCPU && m->size < n->m.size) {
		snprintf(why, sizeof(why), "its memory (%s) is %" PRIu64 " bytes, not %" PRIu64,
			 mem_name, m->size, n->m.size);
		rc = -EINVAL;
	} else if (!m->arena && m->tried) {
		snprintf(why, sizeof(why), "its memory (%s) could not be restored (above)",
			 mem_name);
		rc = -ENODEV;
	} else {
		if (!m->arena) {
			/* The host's memfd, or a GPU allocation's export (its size is
			 * the record's: the file's may be the driver's own). */
			int fd = m->p->fd;

			m->p->fd = -1; /* taken over, whatever happens */
			m->tried = true;
			m->arena = registry_restore_memory(
				st->reg, (int)n->m.device_type, n->m.uuid, fd,
				n->m.device_type == kDLCPU ? m->size : n->m.size, r.uid, r.gid,
				r.mode, why, sizeof(why));
		}
		rc = m->arena ? registry_restore_tensor(st->reg, m->arena, &r, why, sizeof(why))
			      : -ENODEV;
	}
	if (rc < 0) {
		log_warn("state: tensor '%s' (generation %" PRIu64 "): not restored: %s", n->name,
			 r.generation, why);
		st->fig.dropped++;
		return false;
	}
	m->members++;
	st->fig.restored_tensors++;
	st->fig.restored_bytes += r.nbytes;
	return true;
}

/* The number at the end of a state log's name ("tensord-state.7"), or 0. */
static uint64_t log_number(const char *name)
{
	const char *dot = strrchr(name, '.');

	return dot ? strtoull(dot + 1, NULL, 10) : 0;
}

int st_restore(struct state *st, uint64_t *ret_serial, char *why, size_t why_len)
{
	struct replay rp = { .st = st };
	struct sd_passed_fd *v, *best = NULL;
	struct rec_begin best_bg = { 0 };
	uint64_t best_lineage = 0, top = 0;
	struct rp_name *n, *nn;
	struct rp_mem *m, *mn;
	const char *pwhy = "";
	struct timespec t0, t1;
	int nv = sdnotify_passed(&v, &pwhy);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	RB_INIT(&rp.names);
	RB_INIT(&rp.retired);
	RB_INIT(&rp.mems);
	if (nv < 0) {
		snprintf(why, why_len, "the descriptors passed at start: %s", pwhy);
		return nv;
	}
	/* A listening socket a daemon stored stays stored (sdnotify_listen_fd()
	 * and main.c take them; one not listened on again is unstored there). */
	for (int i = 0; i < nv; i++)
		if (v[i].fd >= 0 && (strcmp(v[i].name, STATE_LISTEN_NAME) == 0 ||
				     strncmp(v[i].name, STATE_PEER_LISTEN_PREFIX,
					     strlen(STATE_PEER_LISTEN_PREFIX)) == 0))
			st->fig.stored++;
	/* The newest log that begins whole is the state. */
	for (int i = 0; i < nv; i++) {
		struct rec_head h;
		struct rec_begin bg;
		struct stat sb;
		void *map;

		if (v[i].fd < 0 || strncmp(v[i].name, STATE_PREFIX, strlen(STATE_PREFIX)) != 0)
			continue;
		if (log_number(v[i].name) > top)
			top = log_number(v[i].name);
		if (fstat(v[i].fd, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0)
			map = MAP_FAILED;
		else
			map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, v[i].fd, 0);
		if (map != MAP_FAILED && log_begin(&v[i], map, (size_t)sb.st_size, &h, &bg) &&
		    (!best || bg.serial > best_bg.serial)) {
			if (best)
				munmap((void *)rp.map, rp.map_len);
			best = &v[i];
			best_bg = bg;
			best_lineage = h.lineage;
			rp.map = map;
			rp.map_len = (size_t)sb.st_size;
			continue;
		}
		if (map == MAP_FAILED)
			log_warn("state: %s: cannot be read; ignoring it", v[i].name);
		else
			munmap(map, (size_t)sb.st_size);
		st->fig.dropped++;
	}
	if (best) {
		rp.next_commit = best_bg.next_commit;
		rp.gen_floor = best_bg.gen_floor;
		st->lineage = best_lineage;
		if (!replay_log(&rp, best, best_lineage)) {
			/* Nothing of it, but its generations stay given out, and
			 * what clients' requests did is not known (Resolve says so). */
			if (st->seqs)
				seqs_forget_all(st->seqs);
			RB_FOREACH_SAFE(n, rp_names, &rp.names, nn)
			{
				if (n->e.generation > rp.gen_floor)
					rp.gen_floor = n->e.generation;
				RB_REMOVE(rp_names, &rp.names, n);
				free(n);
			}
			RB_FOREACH_SAFE(n, rp_retired, &rp.retired, nn)
			{
				RB_REMOVE(rp_retired, &rp.retired, n);
				free(n);
			}
		}
	}
	collect_memory(&rp, v, nv);
	RB_FOREACH(n, rp_names, &rp.names)
	{
		if (n->e.kind != ENTRY_PUBLISHED || !restore_one(&rp, n))
			registry_restore_tomb(st->reg, n->name, n->e.name_len, n->e.generation,
					      n->e.commit, n->e.uid, n->e.gid, n->e.mode);
	}
	/* Versions that had lost their names while leased: held, under no name,
	 * for their holders to re-adopt (restart.md 0.3). */
	RB_FOREACH_SAFE(n, rp_retired, &rp.retired, nn)
	{
		restore_one(&rp, n);
		RB_REMOVE(rp_retired, &rp.retired, n);
		free(n);
	}
	registry_restore_versions(st->reg, rp.next_commit, rp.gen_floor);
	/* Memory a tensor came back in stays stored; the rest goes. */
	RB_FOREACH_SAFE(m, rp_mems, &rp.mems, mn)
	{
		bool kept = m->arena && m->members;

		if (m->arena)
			registry_restore_memory_done(st->reg, m->arena);
		if (kept && !st_mem_add(st, m->dev, m->ino))
			kept = false; /* out of memory: its tensors live, unrecorded */
		if (!kept) {
			sdnotify_fdstore_remove(m->p->name);
			if (m->p->fd >= 0)
				close(m->p->fd);
		}
		m->p->fd = -1;
		RB_REMOVE(rp_mems, &rp.mems, m);
		free(m);
	}
	RB_FOREACH_SAFE(n, rp_names, &rp.names, nn)
	{
		RB_REMOVE(rp_names, &rp.names, n);
		free(n);
	}
	if (rp.map)
		munmap((void *)rp.map, rp.map_len);
	if (!st->lineage) {
		while (!st->lineage)
			if (getrandom(&st->lineage, sizeof(st->lineage), 0) != sizeof(st->lineage))
				st->lineage = (uint64_t)t0.tv_nsec ^ ((uint64_t)getpid() << 32);
	}
	*ret_serial = best_bg.serial > top ? best_bg.serial : top;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (best)
		log_info("state: restored %" PRIu64 " tensors (%" PRIu64 " bytes) from %s in "
			 "%.1f ms; %" PRIu64 " dropped (logged above)",
			 st->fig.restored_tensors, st->fig.restored_bytes, best->name,
			 (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
				 (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
			 st->fig.dropped);
	return 0;
}

/* After the new log is stored: the logs passed at start go. */
static void drop_old_logs(void)
{
	struct sd_passed_fd *v;
	const char *why = "";
	int n = sdnotify_passed(&v, &why);

	for (int i = 0; i < n; i++) {
		if (v[i].fd < 0 || strncmp(v[i].name, STATE_PREFIX, strlen(STATE_PREFIX)) != 0)
			continue;
		sdnotify_fdstore_remove(v[i].name);
		close(v[i].fd);
		v[i].fd = -1;
	}
}

/* Without a store: what was passed is not restored (said once), only closed. */
static void close_passed_state(void)
{
	struct sd_passed_fd *v;
	const char *why = "";
	int n = sdnotify_passed(&v, &why);
	unsigned closed = 0;

	for (int i = 0; i < n; i++) {
		if (v[i].fd < 0 || (strncmp(v[i].name, STATE_PREFIX, strlen(STATE_PREFIX)) != 0 &&
				    strncmp(v[i].name, MEMORY_PREFIX, strlen(MEMORY_PREFIX)) != 0))
			continue;
		if (sdnotify_can_store())
			sdnotify_fdstore_remove(v[i].name);
		close(v[i].fd);
		v[i].fd = -1;
		closed++;
	}
	if (closed)
		log_warn("state: %u stored descriptors passed at start are not restored: the "
			 "store is off (--fdstore=0, or no $NOTIFY_SOCKET); removed them",
			 closed);
}

int state_start(struct state **ret, struct registry *reg, uint64_t max_fds, uint64_t log_max,
		struct seqs *seqs, char *why, size_t why_len)
{
	struct state *st;
	uint64_t serial = 0;
	int r;

	*ret = NULL;
	if (max_fds == 1)
		log_warn("state: a store of one descriptor cannot hold the state log and "
			 "its successor; keeping nothing (--fdstore or FileDescriptorStoreMax= "
			 "of 2 or more)");
	if (max_fds < 2 || !sdnotify_can_store()) {
		close_passed_state();
		return 0;
	}
	st = calloc(1, sizeof(*st));
	if (!st) {
		snprintf(why, why_len, "state: out of memory");
		return -ENOMEM;
	}
	st->reg = reg;
	st->seqs = seqs;
	{
		const char *k = getenv("TENSORD_TEST_KILL_AFTER_REQUEST");

		st->kill_after = k && *k ? strtoul(k, NULL, 10) : 0;
	}
	st->max_fds = max_fds;
	st->log_max = log_max ? log_max : STATE_LOG_DEFAULT;
	st->log.fd = st->spare.fd = -1;
	for (size_t i = 0; i < sizeof(st->fd_cache) / sizeof(st->fd_cache[0]); i++)
		st->fd_cache[i].fd = -1;
	RB_INIT(&st->mems);
	RB_INIT(&st->names);
	r = st_restore(st, &serial, why, why_len);
	if (r == 0) {
		r = st_log_start(st, true, serial + 1);
		if (r < 0)
			snprintf(why, why_len, "state: writing and storing its log: %s",
				 strerror(-r));
	}
	if (r < 0) {
		state_stop(st);
		return r;
	}
	drop_old_logs();
	backend_host_defer_frees();
	st_hook(st);
	*ret = st;
	return 0;
}
