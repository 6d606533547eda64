/*
 * The state log's format (docs/restart.md, section 3). A log is a memfd of
 * records, each written with one pwrite() before the reply that makes its
 * change visible:
 *
 *   record = head (32 bytes) | body (len bytes)
 *   head   = magic u32 | version u16 | kind u16 | len u32 | crc u32
 *            | seq u64 | lineage u64
 *   crc    = of the head with crc 0, then of the body: CRC-32C (Castagnoli:
 *            the SSE 4.2 instruction where the CPU has it) in version 2,
 *            which this daemon writes; zlib's CRC-32 in version 1, which
 *            it still reads (the log of a daemon before it, at an upgrade)
 *
 * The first record of a log is BEGIN; every later one is a STEP, the
 * changes of one commit step, applied whole or not at all. A record is
 * written head less its magic, then body, then the magic (one aligned
 * 4-byte store), into a log allocated ahead with zeros: a record without
 * its magic is the log's end (a crash cut its write, or nothing was
 * written there), and past it there are zeros only. A record with its
 * magic is whole: one that fails its checks, or bytes past the end, are
 * damage no crash makes, and the log is not trusted at all (state_restore.c). Reading stops
 * at the first record that is not whole and checked (a torn write, damage,
 * another lineage, a seq out of order): it and everything after it are
 * dropped. Numbers are in the host's byte order: the log never leaves the
 * host that wrote it, and a log of another order fails its magic.
 */
#ifndef TENSORD_STATE_RECORD_H
#define TENSORD_STATE_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REC_MAGIC 0x54445354u /* "TSDT" */
#define REC_VERSION 2         /* written: CRC-32C */
#define REC_VERSION_ZLIB 1    /* read too: zlib's CRC-32 */
#define REC_BEGIN 1
#define REC_STEP 2
/* A record's body is at most this long (a step of 65536 members fits). */
#define REC_BODY_MAX (256u << 20)
/* What an entry may name at most (TENSORD_NAME_MAX, TENSORD_NDIM_MAX). */
#define REC_NAME_MAX 255
#define REC_NDIM_MAX 32

/* CRC-32C of n bytes at p, continuing crc (0 to begin). */
uint32_t rec_crc32c(uint32_t crc, const void *p, size_t n);
/* The same without the CPU's instruction (what other CPUs run; tests compare the two). */
uint32_t rec_crc32c_portable(uint32_t crc, const void *p, size_t n);

struct rec_head {
	uint32_t magic;
	uint16_t version, kind;
	uint32_t len, crc;
	uint64_t seq, lineage;
};

struct rec_begin {
	uint64_t serial; /* the log's: the newest whole log is the state */
	uint64_t next_commit, gen_floor;
	uint64_t created_ns;
};

struct rec_step {
	uint64_t commit; /* the step's */
	uint64_t next_commit, gen_floor;
	uint32_t n, zero;
};

/* What a step did to one name. */
enum rec_entry_kind {
	ENTRY_PUBLISHED = 1, /* published, its memory stored: restorable */
	ENTRY_NAMED = 2,     /* published, not restorable: only its generation counts */
	ENTRY_UNLINKED = 3,
	/*
	 * Not a name: what a client's effecting request did (its token and
	 * seq, docs/restart.md section 5), so that a restarted daemon answers
	 * its Resolve. A rec_entry with no name and no dimensions, then a
	 * rec_seq. Logs of daemons before it have none (and those daemons
	 * refuse a log that has one: a downgrade restores nothing).
	 */
	ENTRY_SEQ = 4,
	/*
	 * Not the name's: a version that lost its name (replaced or unlinked)
	 * while leased, laid out as ENTRY_PUBLISHED, so that a restarted
	 * daemon holds it for its leases' re-adoption (docs/restart.md 0.3);
	 * and that version's end, ENTRY_RETIRED_GONE (laid out as
	 * ENTRY_UNLINKED), written when its last lease ends, before its
	 * memory is freed or reused. Format version 2 only.
	 */
	ENTRY_RETIRED = 5,
	ENTRY_RETIRED_GONE = 6,
};

/* Whether entries of kind k carry a rec_memory, shape and strides. */
static inline bool rec_entry_has_memory(unsigned k)
{
	return k == ENTRY_PUBLISHED || k == ENTRY_RETIRED;
}

struct rec_entry {
	uint8_t kind, dtype_code, dtype_bits, ndim;
	uint16_t dtype_lanes, name_len;
	uint32_t uid, gid, mode, flags;
	uint64_t generation, commit, created_ns;
};

/* Of an ENTRY_PUBLISHED, after the entry: where its bytes are. */
struct rec_memory {
	uint64_t nbytes, offset; /* in its memory */
	uint64_t dev, ino, size; /* its memory's identity (fstat) and size */
	uint32_t device_type;    /* DLDeviceType: kDLCPU, or kDLCUDA (a VMM export) */
	uint32_t zero;
	uint8_t uuid[16]; /* a GPU's, which finds it again whatever its ordinal */
};

/* Of an ENTRY_SEQ, after the entry. */
struct rec_seq {
	uint64_t token, seq;
	uint64_t generation, commit;
	uint32_t uid;
	uint32_t kind; /* enum seq_kind (daemon/persist/seqs.h) */
	uint32_t published, unlinked;
};

/*
 * An entry's bytes: rec_entry, rec_memory (published only), shape and
 * strides (ndim int64 each, published only), the name, padding to 8.
 */
static inline size_t rec_entry_size(const struct rec_entry *e)
{
	size_t n = sizeof(*e) + e->name_len;

	if (e->kind == ENTRY_SEQ)
		return sizeof(*e) + sizeof(struct rec_seq);
	if (rec_entry_has_memory(e->kind))
		n += sizeof(struct rec_memory) + 2 * (size_t)e->ndim * sizeof(int64_t);
	return (n + 7) & ~(size_t)7;
}

/* A growing buffer a record is built in. */
struct rec_buf {
	uint8_t *p;
	size_t len, cap;
	bool failed; /* out of memory: the record is not whole */
};

/* Appends n bytes (src NULL: zeros) and returns where they went, or NULL (failed). */
void *rec_put(struct rec_buf *b, const void *src, size_t n);

/* Starts a record of kind in b (emptied first); rec_seal() ends it. */
void rec_begin(struct rec_buf *b, uint16_t kind);

/* Fills in the head of the record in b: its length, seq, lineage and CRC. */
void rec_seal(struct rec_buf *b, uint64_t seq, uint64_t lineage);

/* One entry of a step as rec_step_parse() read it: pointers into the step's body. */
struct rec_parsed {
	struct rec_entry e;
	struct rec_memory m; /* ENTRY_PUBLISHED and ENTRY_RETIRED only */
	struct rec_seq s;    /* ENTRY_SEQ only */
	const uint8_t *dims; /* those with memory: shape then strides, ndim int64 each */
	const char
		*name; /* e.name_len bytes, no NUL among them, not terminated; ENTRY_SEQ: NULL, 0 */
};

/*
 * Reads a STEP's body (len bytes): its head into *ret_head, then fn(arg,
 * entry) for each entry in order, every length checked against len first.
 * 0; -1 with why set when the body is malformed; or what fn returned when
 * it returned less than 0 (fn sets why too).
 */
int rec_step_parse(const uint8_t *body, size_t len, struct rec_step *ret_head,
		   int (*fn)(void *arg, const struct rec_parsed *p, const char **why), void *arg,
		   const char **why);

/*
 * Checks the record at off of a log of size bytes (p): 0 with *ret_head
 * and *ret_body set, 1 at the log's end (nothing left), or -1 with why set
 * (torn, damaged, not a record).
 */
int rec_check(const uint8_t *p, size_t size, size_t off, struct rec_head *ret_head,
	      const uint8_t **ret_body, const char **why);

#endif
