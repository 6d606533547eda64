/*
 * libFuzzer target for the state log a restarted daemon reads
 * (daemon/persist/record.c, docs/restart.md section 3): the input is a
 * log, damaged in any way. Records are checked from the front as
 * state_restore.c does until the end or the first that is not whole, and
 * every STEP's entries are read; nothing may read outside the input, and
 * every entry handed on must lie inside its record (a request's entry,
 * ENTRY_SEQ, has no name and a rec_seq copied out whole).
 *
 * Checksums make most mutated inputs stop at their first record, so the
 * target also reads the first record's body as a step without its check:
 * the parser must hold whatever the body is.
 *
 * Build and run: make fuzz (with the frame target), make fuzz-smoke.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/persist/record.h"

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			abort();                                                                   \
	} while (0)

struct span {
	const uint8_t *lo, *hi;
};

static int entry(void *arg, const struct rec_parsed *p, const char **why)
{
	const struct span *s = arg;
	size_t dims = rec_entry_has_memory(p->e.kind) ? 2 * (size_t)p->e.ndim * sizeof(int64_t) : 0;

	(void)why;
	if (p->e.kind == ENTRY_SEQ) {
		/* A request's entry (what a client's put did): no name, its rec_seq whole. */
		CHECK(p->e.name_len == 0 && p->e.ndim == 0 && !p->name && !p->dims);
		return 0;
	}
	CHECK(p->e.name_len >= 1 && p->e.name_len <= REC_NAME_MAX);
	CHECK(p->e.ndim <= REC_NDIM_MAX);
	CHECK((const uint8_t *)p->name >= s->lo &&
	      (const uint8_t *)p->name + p->e.name_len <= s->hi);
	CHECK(!memchr(p->name, '\0', p->e.name_len));
	if (rec_entry_has_memory(p->e.kind))
		CHECK(p->dims >= s->lo && p->dims + dims <= s->hi);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *why = NULL;
	size_t off = 0;
	struct rec_step sh;

	for (;;) {
		struct rec_head h;
		const uint8_t *body;
		int r = rec_check(data, size, off, &h, &body, &why);

		if (r != 0) {
			CHECK(r == 1 || why);
			break;
		}
		CHECK(body == data + off + sizeof(h) && h.len <= size - off - sizeof(h));
		if (h.kind == REC_STEP) {
			struct span s = { body, body + h.len };

			rec_step_parse(body, h.len, &sh, entry, &s, &why);
		}
		off += sizeof(h) + h.len;
	}
	/* The step parser on its own: any body at all. */
	if (size > sizeof(struct rec_head)) {
		struct span s = { data + sizeof(struct rec_head), data + size };

		rec_step_parse(s.lo, size - sizeof(struct rec_head), &sh, entry, &s, &why);
	}
	return 0;
}
