/* The state log's records (record.h): built, sealed and checked. */
#include "record.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

_Static_assert(sizeof(struct rec_head) == 32, "the record head is 32 bytes");
_Static_assert(sizeof(struct rec_begin) == 32, "BEGIN is 32 bytes");
_Static_assert(sizeof(struct rec_step) == 32, "a STEP's head is 32 bytes");
_Static_assert(sizeof(struct rec_entry) == 48, "an entry is 48 bytes");
_Static_assert(sizeof(struct rec_memory) == 64, "an entry's memory is 64 bytes");
_Static_assert(sizeof(struct rec_seq) == 48, "a request's entry is 48 bytes");

void *rec_put(struct rec_buf *b, const void *src, size_t n)
{
	void *at;

	if (b->failed)
		return NULL;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *p;

		while (cap < b->len + n)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->failed = true;
			return NULL;
		}
		b->p = p;
		b->cap = cap;
	}
	at = b->p + b->len;
	if (src)
		memcpy(at, src, n);
	else
		memset(at, 0, n);
	b->len += n;
	return at;
}

void rec_begin(struct rec_buf *b, uint16_t kind)
{
	struct rec_head h = { .magic = REC_MAGIC, .version = REC_VERSION, .kind = kind };

	b->len = 0;
	b->failed = false;
	rec_put(b, &h, sizeof(h));
}

/*
 * CRC-32C, reflected polynomial 0x82F63B78: a byte at a time from a table
 * made once, or with the SSE 4.2 instruction eight bytes at a time, about
 * 0.2 instructions a byte against zlib's CRC-32's 4.7 (a 4 KiB put's record
 * of ~300 bytes: 1,400 instructions of the daemon's ~13,000). Written here:
 * Debian has no CRC-32C library to link (zlib has only CRC-32), and the
 * instruction needs no more than this.
 */
static uint32_t crc32c_table[256];

static void crc32c_table_make(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc32c_table[i] = c;
	}
}

static uint32_t crc32c_soft(uint32_t crc, const uint8_t *p, size_t n)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, crc32c_table_make);
	while (n--)
		crc = crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
							       size_t n)
{
	uint64_t c = crc;

	for (; n >= 8; n -= 8, p += 8) {
		uint64_t v;

		memcpy(&v, p, sizeof(v));
		c = __builtin_ia32_crc32di(c, v);
	}
	crc = (uint32_t)c;
	while (n--)
		crc = __builtin_ia32_crc32qi(crc, *p++);
	return crc;
}
#endif

uint32_t rec_crc32c(uint32_t crc, const void *p, size_t n)
{
	crc = ~crc;
#if defined(__x86_64__)
	if (__builtin_cpu_supports("sse4.2"))
		return ~crc32c_sse42(crc, p, n);
#endif
	return ~crc32c_soft(crc, p, n);
}

uint32_t rec_crc32c_portable(uint32_t crc, const void *p, size_t n)
{
	return ~crc32c_soft(~crc, p, n);
}

/* The checksum of a record of h's version: CRC-32C (2) or zlib's CRC-32 (1). */
static uint32_t rec_crc(const struct rec_head *h, const uint8_t *body)
{
	struct rec_head z = *h;

	z.crc = 0;
	if (h->version == REC_VERSION_ZLIB)
		return (uint32_t)crc32(crc32(0L, (const Bytef *)&z, sizeof(z)), body, (uInt)h->len);
	return rec_crc32c(rec_crc32c(0, &z, sizeof(z)), body, h->len);
}

void rec_seal(struct rec_buf *b, uint64_t seq, uint64_t lineage)
{
	struct rec_head h;

	if (b->failed || b->len < sizeof(h))
		return;
	memcpy(&h, b->p, sizeof(h));
	h.len = (uint32_t)(b->len - sizeof(h));
	h.seq = seq;
	h.lineage = lineage;
	h.crc = rec_crc(&h, b->p + sizeof(h));
	memcpy(b->p, &h, sizeof(h));
}

int rec_check(const uint8_t *p, size_t size, size_t off, struct rec_head *ret_head,
	      const uint8_t **ret_body, const char **why)
{
	struct rec_head h;

	if (off == size)
		return 1;
	/*
	 * No magic: the log's end, where it was allocated ahead with zeros, or
	 * a record whose write a crash cut (its head less the magic, then its
	 * body, are written before the magic: record.h). Either way nothing
	 * but zeros lies past that record's length: anything else was written
	 * by someone else, and the log is damaged.
	 */
	if (size - off < sizeof(uint32_t) || !memcmp(p + off, &(uint32_t){ 0 }, sizeof(uint32_t))) {
		size_t from = off;

		if (size - off >= sizeof(h)) {
			memcpy(&h, p + off, sizeof(h));
			if (h.len <= size - off - sizeof(h))
				from = off + sizeof(h) + h.len;
		}
		for (size_t i = from; i < size; i++)
			if (p[i]) {
				*why = "bytes past the log's end (written by someone else)";
				return -1;
			}
		return 1;
	}
	if (size - off < sizeof(h)) {
		*why = "a record cut short (a write the daemon did not finish)";
		return -1;
	}
	memcpy(&h, p + off, sizeof(h));
	if (h.magic != REC_MAGIC) {
		*why = "not a record (its magic is wrong)";
		return -1;
	}
	if (h.version != REC_VERSION && h.version != REC_VERSION_ZLIB) {
		*why = "a record of another format version";
		return -1;
	}
	if (h.len > REC_BODY_MAX || h.len > size - off - sizeof(h)) {
		*why = "a record longer than what is left of the log (cut short)";
		return -1;
	}
	if (rec_crc(&h, p + off + sizeof(h)) != h.crc) {
		*why = "a record whose checksum is wrong (damaged)";
		return -1;
	}
	*ret_head = h;
	*ret_body = p + off + sizeof(h);
	return 0;
}

int rec_step_parse(const uint8_t *body, size_t len, struct rec_step *ret_head,
		   int (*fn)(void *arg, const struct rec_parsed *p, const char **why), void *arg,
		   const char **why)
{
	size_t off = sizeof(*ret_head);

	if (len < sizeof(*ret_head)) {
		*why = "a step shorter than its head";
		return -1;
	}
	memcpy(ret_head, body, sizeof(*ret_head));
	for (uint32_t i = 0; i < ret_head->n; i++) {
		struct rec_parsed p = { .dims = NULL };
		size_t size, fixed;
		int r;

		if (len - off < sizeof(p.e)) {
			*why = "an entry past the end of its step";
			return -1;
		}
		memcpy(&p.e, body + off, sizeof(p.e));
		if (p.e.kind == ENTRY_SEQ) {
			if (p.e.name_len || p.e.ndim) {
				*why = "a request's entry with a name or dimensions";
				return -1;
			}
			if (len - off < rec_entry_size(&p.e)) {
				*why = "an entry past the end of its step";
				return -1;
			}
			memcpy(&p.s, body + off + sizeof(p.e), sizeof(p.s));
			r = fn(arg, &p, why);
			if (r < 0)
				return r;
			off += rec_entry_size(&p.e);
			continue;
		}
		if (p.e.kind < ENTRY_PUBLISHED || p.e.kind > ENTRY_RETIRED_GONE ||
		    p.e.kind == ENTRY_SEQ || !p.e.name_len || p.e.name_len > REC_NAME_MAX ||
		    p.e.ndim > REC_NDIM_MAX) {
			*why = "an entry of no known kind, name length or dimensions";
			return -1;
		}
		size = rec_entry_size(&p.e);
		if (size > len - off) {
			*why = "an entry past the end of its step";
			return -1;
		}
		fixed = sizeof(p.e);
		if (rec_entry_has_memory(p.e.kind)) {
			memcpy(&p.m, body + off + fixed, sizeof(p.m));
			p.dims = body + off + fixed + sizeof(p.m);
			fixed += sizeof(p.m) + 2 * (size_t)p.e.ndim * sizeof(int64_t);
		}
		p.name = (const char *)body + off + fixed;
		if (memchr(p.name, '\0', p.e.name_len)) {
			*why = "an entry whose name has a NUL byte";
			return -1;
		}
		r = fn(arg, &p, why);
		if (r < 0)
			return r;
		off += size;
	}
	return 0;
}
