/*
 * Per-uid accounting. The table is open addressing keyed by uid with
 * linear probing, grown at half full: a daemon sees a few dozen uids, and
 * a uid gets a slot only by connecting, which only a real local account
 * can do. Slots are never freed (a uid that held nothing costs 48 bytes).
 */
#include "quota.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
	const char *flag, *what;
	int err;
} kinds[QUOTA_KINDS] = {
#define QUOTA(kind, flag, arg, usage, figure, unit, what, err, help)                               \
	[QUOTA_##kind] = { "--" flag, what, -err },
#include "quota.def"
#undef QUOTA
};

void quota_default_limits(struct quota_limits *lim, unsigned fd_budget, unsigned max_clients)
{
	unsigned usable;

	lim->fd_budget = fd_budget;
	if (!lim->fd_reserve) {
		lim->fd_reserve = fd_budget / 16 > 32 ? fd_budget / 16 : 32;
		if (lim->fd_reserve > fd_budget / 2)
			lim->fd_reserve = fd_budget / 2;
	}
	usable = fd_budget - lim->fd_reserve;
	if (!lim->per_uid[QUOTA_CLIENTS])
		lim->per_uid[QUOTA_CLIENTS] = max_clients / 4 ? max_clients / 4 : 1;
	if (!lim->per_uid[QUOTA_TENSORS])
		lim->per_uid[QUOTA_TENSORS] = QUOTA_TENSORS_DEFAULT;
	/* Half the descriptors: one uid cannot take the table. Tensors in
	 * slabs and empty ones hold none. */
	if (!lim->per_uid[QUOTA_FDS])
		lim->per_uid[QUOTA_FDS] = usable / 2 ? usable / 2 : 1;
	/* The kernel's limit on descriptors in flight is per sending user,
	 * shared by every client of a daemon that is not root: a quarter each. */
	if (!lim->per_uid[QUOTA_FDS_IN_FLIGHT])
		lim->per_uid[QUOTA_FDS_IN_FLIGHT] = usable / 4 ? usable / 4 : 1;
	if (!lim->waiters_per_conn)
		lim->waiters_per_conn = 1024;
	/* A uid's connections may each wait, not each with every waiter it may have. */
	if (!lim->per_uid[QUOTA_WAITERS])
		lim->per_uid[QUOTA_WAITERS] = 16ull * lim->waiters_per_conn;
	if (!lim->fds_in_flight_per_conn)
		lim->fds_in_flight_per_conn = 64;
	if (!lim->per_uid[QUOTA_WATCHES])
		lim->per_uid[QUOTA_WATCHES] = 64;
	if (!lim->per_uid[QUOTA_WATCH_BYTES])
		lim->per_uid[QUOTA_WATCH_BYTES] = QUOTA_WATCH_BYTES_DEFAULT;
	/* What a uid's leases may keep alive of others' unlinked tensors: as
	 * much as it may own itself, when that is bounded. */
	if (!lim->per_uid[QUOTA_PINNED])
		lim->per_uid[QUOTA_PINNED] = lim->per_uid[QUOTA_BYTES];
}

void quota_init(struct quota *q, const struct quota_limits *lim)
{
	memset(q, 0, sizeof(*q));
	q->lim = *lim;
}

void quota_describe(const struct quota_limits *lim, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int k = 0; k < QUOTA_KINDS && n < len; k++) {
		if (lim->per_uid[k])
			n += (size_t)snprintf(buf + n, len - n, "%s%llu %s", k ? ", " : "",
					      (unsigned long long)lim->per_uid[k], kinds[k].what);
		else
			n += (size_t)snprintf(buf + n, len - n, "%sno limit on %s", k ? ", " : "",
					      kinds[k].what);
	}
}

void quota_fini(struct quota *q)
{
	free(q->slots);
	q->slots = NULL;
	q->n_slots = q->n_used = 0;
}

bool quota_exempt(const struct quota *q, uint32_t uid)
{
	for (unsigned i = 0; i < q->lim.n_exempt; i++)
		if (q->lim.exempt[i] == uid)
			return true;
	return false;
}

static size_t slot_of(uint32_t uid, size_t n)
{
	return (size_t)(uid * 2654435761u) & (n - 1);
}

static struct uid_usage *find(const struct quota *q, uint32_t uid)
{
	if (!q->n_slots)
		return NULL;
	for (size_t i = slot_of(uid, q->n_slots);; i = (i + 1) & (q->n_slots - 1)) {
		struct uid_usage *u = &q->slots[i];

		if (!u->used)
			return NULL;
		if (u->uid == uid)
			return u;
	}
}

static int grow(struct quota *q)
{
	size_t n = q->n_slots ? q->n_slots * 2 : 16;
	struct uid_usage *ns = calloc(n, sizeof(*ns));

	if (!ns)
		return -ENOMEM;
	for (size_t i = 0; i < q->n_slots; i++) {
		size_t j;

		if (!q->slots[i].used)
			continue;
		for (j = slot_of(q->slots[i].uid, n); ns[j].used; j = (j + 1) & (n - 1))
			;
		ns[j] = q->slots[i];
	}
	free(q->slots);
	q->slots = ns;
	q->n_slots = n;
	return 0;
}

/* uid's slot, made if needed. NULL: out of memory. */
static struct uid_usage *get(struct quota *q, uint32_t uid)
{
	struct uid_usage *u = find(q, uid);
	size_t i;

	if (u)
		return u;
	if ((q->n_used + 1) * 2 > q->n_slots && grow(q) < 0)
		return NULL;
	for (i = slot_of(uid, q->n_slots); q->slots[i].used; i = (i + 1) & (q->n_slots - 1))
		;
	u = &q->slots[i];
	u->used = true;
	u->uid = uid;
	q->n_used++;
	return u;
}

const struct uid_usage *quota_get(const struct quota *q, uint32_t uid)
{
	return find(q, uid);
}

static bool fits(const struct quota *q, const struct uid_usage *u, uint32_t uid,
		 enum quota_kind kind, uint64_t n)
{
	uint64_t lim = q->lim.per_uid[kind], have = u ? u->n[kind] : 0;

	return !lim || quota_exempt(q, uid) || (n <= lim && have <= lim - n);
}

bool quota_room(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n)
{
	return fits(q, find(q, uid), uid, kind, n);
}

int quota_charge(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n, char *why,
		 size_t why_len)
{
	struct uid_usage *u = find(q, uid);

	if (!fits(q, u, uid, kind, n)) {
		snprintf(why, why_len, "uid %u holds %llu %s, the most one uid may hold (%s %llu)",
			 uid, (unsigned long long)(u ? u->n[kind] : 0), kinds[kind].what,
			 kinds[kind].flag, (unsigned long long)q->lim.per_uid[kind]);
		return kinds[kind].err;
	}
	u = u ? u : get(q, uid);
	if (!u) {
		snprintf(why, why_len, "out of memory counting uid %u", uid);
		return -ENOMEM;
	}
	u->n[kind] += n;
	return 0;
}

void quota_add(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n)
{
	struct uid_usage *u = get(q, uid);

	if (u)
		u->n[kind] += n;
}

void quota_uncharge(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n)
{
	struct uid_usage *u = find(q, uid);

	if (u)
		u->n[kind] -= n < u->n[kind] ? n : u->n[kind];
}

void quota_each(const struct quota *q, void (*fn)(const struct uid_usage *u, void *arg), void *arg)
{
	for (size_t i = 0; i < q->n_slots; i++)
		if (q->slots[i].used)
			fn(&q->slots[i], arg);
}

bool quota_fd_room(const struct quota *q, uint32_t uid)
{
	int fd;

	if (uid == 0 || quota_exempt(q, uid) || !q->lim.fd_budget)
		return true;
	fd = fcntl(0, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return false;
	close(fd);
	return (unsigned)fd < q->lim.fd_budget - q->lim.fd_reserve;
}
