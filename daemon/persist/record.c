/* The state log's records (record.h): built, sealed and checked. */
#include "record.h"

#include <stdlib.h>
#include <string.h>

#include <zlib.h>

_Static_assert(sizeof(struct rec_head) == 32, "the record head is 32 bytes");
_Static_assert(sizeof(struct rec_begin) == 32, "BEGIN is 32 bytes");
_Static_assert(sizeof(struct rec_step) == 32, "a STEP's head is 32 bytes");
_Static_assert(sizeof(struct rec_entry) == 48, "an entry is 48 bytes");
_Static_assert(sizeof(struct rec_memory) == 64, "an entry's memory is 64 bytes");

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

static uint32_t rec_crc(const struct rec_head *h, const uint8_t *body)
{
	struct rec_head z = *h;
	uLong crc;

	z.crc = 0;
	crc = crc32(0L, (const Bytef *)&z, sizeof(z));
	return (uint32_t)crc32(crc, body, (uInt)h->len);
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
	if (h.version != REC_VERSION) {
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
