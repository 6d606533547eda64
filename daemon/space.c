/*
 * What holds a full device's space (space.h): one walk over the live
 * connections' lease slots, as inspect.c's LeaseList does, bounded by
 * SPACE_SCAN_MAX slots, counting the unlinked tensors on the device that
 * are still leased (each once) and, per connection, the bytes of them it
 * holds. Only on the error path of a create, put or reserve.
 */
#include "space.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

struct holder {
	const struct client *cl;
	uint64_t bytes;
	uint32_t tensors;
};

static int cmp_ptr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t) * (const void *const *)a;
	uintptr_t y = (uintptr_t) * (const void *const *)b;

	return x < y ? -1 : x > y;
}

static bool on_device(const struct tensor *t, DLDevice d)
{
	return t->state == TENSORD_STATE_UNLINKED && t->device.device_type == d.device_type &&
	       t->device.device_id == d.device_id;
}

/* Keeps h among the top n (by bytes) of top[]; n grows up to SPACE_TOP_HOLDERS. */
static void keep_top(struct holder *top, size_t *n, const struct holder *h)
{
	size_t i = *n < SPACE_TOP_HOLDERS ? (*n)++ : SPACE_TOP_HOLDERS;

	if (i == SPACE_TOP_HOLDERS) {
		if (h->bytes <= top[SPACE_TOP_HOLDERS - 1].bytes)
			return;
		i = SPACE_TOP_HOLDERS - 1;
	}
	for (; i > 0 && top[i - 1].bytes < h->bytes; i--)
		top[i] = top[i - 1];
	top[i] = *h;
}

void space_explain(const struct client *me, DLDevice device, char *why, size_t why_len)
{
	struct holder top[SPACE_TOP_HOLDERS];
	const struct tensor **seen = NULL;
	size_t n_top = 0, n_seen = 0, cap = 0, budget = SPACE_SCAN_MAX, len = strlen(why);
	size_t n_holders = 0, tensors = 0;
	uint64_t total = 0;
	bool partial = false;
	struct conn *c;

	if (!strstr(why, " are free on "))
		return;
	LIST_FOREACH(c, &me->srv->conns.list, link)
	{
		const struct client *cl = conn_data(c);
		struct holder h = { .cl = cl };

		for (uint32_t s = 0; s < cl->rc.n_slots && !partial; s++) {
			const struct tensor *t = cl->rc.leases[s].t;

			partial = budget-- == 0;
			if (!t || !on_device(t, device))
				continue;
			h.bytes += t->alloc.footprint;
			h.tensors++;
			if (n_seen == cap) {
				size_t ncap = cap ? 2 * cap : 64;
				const struct tensor **ns = realloc(seen, ncap * sizeof(*ns));

				if (!ns) {
					partial = true;
					break;
				}
				seen = ns;
				cap = ncap;
			}
			seen[n_seen++] = t;
		}
		if (h.tensors) {
			keep_top(top, &n_top, &h);
			n_holders++;
		}
		if (partial)
			break;
	}
	/* A tensor leased several times, or by several connections, counts once. */
	if (n_seen > 1)
		qsort(seen, n_seen, sizeof(*seen), cmp_ptr);
	for (size_t i = 0; i < n_seen; i++)
		if (i == 0 || seen[i] != seen[i - 1]) {
			total += seen[i]->alloc.footprint;
			tensors++;
		}
	free(seen);
	if (!tensors)
		return;
	len += (size_t)snprintf(
		why + len, len < why_len ? why_len - len : 0,
		"; %s%llu bytes of the device are held by %zu unlinked tensor%s still leased:",
		partial ? "at least " : "", (unsigned long long)total, tensors,
		tensors == 1 ? "" : "s");
	for (size_t i = 0; i < n_top && len < why_len; i++) {
		const struct client *cl = top[i].cl;
		bool shown = me->rc.uid == 0 || cl->rc.uid == me->rc.uid;

		if (shown)
			len += (size_t)snprintf(why + len, why_len - len,
						"%s pid %u (%s%s%s) %llu bytes", i ? "," : "",
						cl->rc.pid, *cl->comm ? cl->comm : "?",
						*cl->label ? ", " : "", cl->label,
						(unsigned long long)top[i].bytes);
		else
			len += (size_t)snprintf(why + len, why_len - len,
						"%s another user's process %llu bytes",
						i ? "," : "", (unsigned long long)top[i].bytes);
	}
	if (len < why_len && n_holders > n_top)
		len += (size_t)snprintf(why + len, why_len - len, " and %zu other%s",
					n_holders - n_top, n_holders - n_top == 1 ? "" : "s");
	if (len < why_len)
		snprintf(why + len, why_len - len, "; see tensorctl leases --group prefix");
}
