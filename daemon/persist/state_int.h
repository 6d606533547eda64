/*
 * What state.c (keeping the state), state_log.c (the log's file) and
 * state_restore.c (restoring it at start) share; private to daemon/persist/.
 */
#ifndef TENSORD_STATE_INT_H
#define TENSORD_STATE_INT_H

#include <sys/stat.h>

#include <uv/tree.h>

#include "record.h"
#include "seqs.h"
#include "state.h"

/*
 * One piece of memory in the store: a memfd, a slab, a ring buffer, a set
 * allocation. Stored when a tensor in it is first published, it stays
 * stored while the daemon keeps the memory (a ring buffer between its
 * versions too, so a writer's next version costs no store), and leaves the
 * store when the daemon frees it (the release hook), after the step that
 * freed it is recorded.
 */
struct st_mem {
	RB_ENTRY(st_mem) link;
	uint64_t dev, ino; /* its identity (fstat) */
	uint32_t refs;     /* names whose published tensor lives in it */
	bool freed;        /* the daemon let go of it: out of the store at the flush */
	char name[48];     /* its name in the store: st_mem_name() */
};

/* One published name, and the memory its tensor lives in. */
struct st_name {
	RB_ENTRY(st_name) link;
	struct st_mem *mem; /* NULL: it would not survive a restart */
	bool unprotected;   /* counted in fig.unprotected */
	const char *name;   /* in buf[] (a lookup's key points elsewhere) */
	char buf[];
};

RB_HEAD(st_mems, st_mem);
RB_HEAD(st_names, st_name);
RB_PROTOTYPE(st_mems, st_mem, link, cmp_mems)
RB_PROTOTYPE(st_names, st_name, link, cmp_names)

/*
 * A state log: a memfd, mapped shared, grown by fallocate() in steps of
 * LOG_CHUNK (allocated, so writing it never faults for memory) past what
 * it holds; the bytes after the last record are zeros, which read as its end.
 */
struct st_log {
	int fd; /* -1: none */
	uint8_t *map;
	uint64_t off, cap; /* bytes of records, bytes mapped and allocated */
};
#define LOG_CHUNK (1u << 20)

struct state {
	struct registry *reg;
	uint64_t lineage;
	uint64_t max_fds, log_max;
	struct st_log log; /* the log appended to */
	/*
	 * The log before it, out of the store, kept to write the next one
	 * into: its pages are warm, where a new memfd's would each cost a
	 * fault and a clear under a later step (fd -1: none yet).
	 */
	struct st_log spare;
	uint64_t log_base; /* bytes of the whole state the log began with */
	uint64_t log_serial, seq;
	char log_name[64];
	struct st_mems mems;
	struct st_names names;
	struct rec_buf buf; /* the record being built */
	/*
	 * The memory behind recently published descriptors, by fd number, so
	 * that a slab's next tensor costs no fstat(): an entry goes when its
	 * memory is freed (the release hook runs before every such close).
	 */
	struct st_fd_cache {
		int fd;
		struct st_mem *m;
		uint64_t size;
	} fd_cache[64];
	struct st_mem **gone; /* freed memory, out of the store at the next flush */
	size_t n_gone, cap_gone;
	bool stopped, full_warned, broken_warned;
	struct state_figures fig;
	/* What clients' requests did (seqs.h): borrowed, the server's; logged with each step. */
	struct seqs *seqs;
	/* TENSORD_TEST_KILL_AFTER_REQUEST=N: SIGKILL right after the Nth request's step is recorded. */
	unsigned long kill_after;
};

/* The store's name of the memory of identity (dev, ino): "tm.<dev>.<ino>" in hex. */
void st_mem_name(uint64_t dev, uint64_t ino, char *buf, size_t len);

/* A new entry for memory in the store (counted); NULL out of memory. */
struct st_mem *st_mem_add(struct state *st, uint64_t dev, uint64_t ino);

/* Appends t's entry to b; m and mst: its memory, for ENTRY_PUBLISHED. */
void st_put_entry(struct rec_buf *b, const struct tensor *t, enum rec_entry_kind kind,
		  uint64_t generation, uint64_t commit, const struct st_mem *m,
		  const struct stat *mst);
void st_put_unlinked(struct rec_buf *b, const struct reg_change *c);
/* Appends an ENTRY_SEQ: what a client's request did (seqs.h). */
void st_put_seq(struct rec_buf *b, const struct rec_seq *q);

/* state_log.c: one log's file, and the spare (their contracts are at the definitions). */
int st_log_write(struct st_log *l, const uint8_t *p, size_t len);
void st_log_close(struct st_log *l);
int st_log_fresh(struct state *st, struct st_log *l);
void st_log_retire(struct state *st, struct st_log *l);
int st_log_append(struct state *st);

/*
 * Writes the whole state into a new log numbered serial, stores it, and
 * removes the one before (if any). count: at start, the names and memory
 * references are made from the table as it is. 0 or -errno (the old log
 * stays).
 */
int st_log_start(struct state *st, bool count, uint64_t serial);

/* The same past a full log, or a step it could not take. */
int st_log_rewrite(struct state *st);

/* From now on memory the daemon frees leaves the store (the host backend's release hook). */
void st_hook(struct state *st);

/* state_restore.c: what the store passed back, restored; its lineage and serial. */
int st_restore(struct state *st, uint64_t *ret_serial, char *why, size_t why_len);

#endif
