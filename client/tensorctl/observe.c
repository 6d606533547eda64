/*
 * tensorctl's inspection commands: leases (who holds which tensor, since
 * when), clients (who is connected) and stats --prometheus (the metrics
 * text). Their formats are described in docs/tensorctl.md.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorctl.h"

/* "3d04h", "2h05m", "4m07s", "12.3s": two units are enough to read at a glance. */
const char *duration(uint64_t ns, char *buf, size_t len)
{
	uint64_t s = ns / 1000000000u;

	if (s >= 86400)
		snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
	else if (s >= 3600)
		snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
	else if (s >= 60)
		snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else
		snprintf(buf, len, "%.1fs", (double)ns / 1e9);
	return buf;
}

/* ns since the epoch to the second, "2024-05-01T12:34:56Z": tables are for people. */
static const char *iso_secs(uint64_t ns, char *buf, size_t len)
{
	size_t n;

	iso_time(ns, buf, len);
	n = strcspn(buf, ".");
	snprintf(buf + n, len - n, "Z");
	return buf;
}

static const char *u64(uint64_t v, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/* --- leases -------------------------------------------------------------------- */

enum { LC_NAME, LC_STATE, LC_PID, LC_USER, LC_COMM, LC_LABEL, LC_LEASES, LC_SINCE, LC_HELD, LC_N };

static const char *const lease_titles[LC_N] = { "NAME",  "STATE",  "PID",   "USER", "COMM",
						"LABEL", "LEASES", "SINCE", "HELD" };

static const char *lease_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const tensord_lease_holder *h = (const tensord_lease_holder *)rows + i;

	switch (col) {
	case LC_NAME:
		return h->name;
	case LC_STATE:
		return state_name(h->state);
	case LC_PID:
		return u64(h->pid, buf, len);
	case LC_USER:
		return owner_name(h->uid, buf, len);
	case LC_COMM:
		return *h->comm ? h->comm : "-";
	case LC_LABEL:
		return *h->label ? h->label : "-";
	case LC_LEASES:
		return u64(h->count, buf, len);
	case LC_SINCE:
		return iso_secs(h->since_ns, buf, len);
	default:
		return duration(h->held_ns, buf, len);
	}
}

/* By name, then the order the daemon gave (tensor, then connection). */
static int cmp_holder(const void *a, const void *b)
{
	const tensord_lease_holder *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	if (x->tensor_id != y->tensor_id)
		return x->tensor_id < y->tensor_id ? -1 : 1;
	return x->conn_id < y->conn_id ? -1 : x->conn_id > y->conn_id;
}

static void json_holder(const tensord_lease_holder *h, const char *end)
{
	char t[48];

	putchar('{');
	json_field("name", h->name, true);
	printf(", \"tensor_id\": %" PRIu64 ", \"state\": \"%s\", \"conn_id\": %" PRIu64
	       ", \"pid\": %" PRIu32 ", \"uid\": %" PRIu32 ", \"gid\": %" PRIu32,
	       h->tensor_id, state_name(h->state), h->conn_id, h->pid, h->uid, h->gid);
	json_field("comm", h->comm, false);
	json_field("label", h->label, false);
	printf(", \"count\": %" PRIu32 ", \"since_ns\": %" PRIu64 ", \"since\": \"%s\""
	       ", \"held_ns\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"commit\": %" PRIu64 "}%s",
	       h->count, h->since_ns, iso_time(h->since_ns, t, sizeof(t)), h->held_ns, h->bytes,
	       h->commit, end);
}

int cmd_leases(tensord_client *c, const struct args *a)
{
	const char *name = a->npos ? a->pos[0] : NULL;
	tensord_lease_holder *v = NULL;
	tensord_info info;
	size_t n = 0;
	int rc;

	rc = tensord_leases(c, name, &v, &n);
	if (rc < 0)
		return op_error(rc, name);
	/* Nobody holds it: say so if it does not exist at all (a typo). */
	if (!n && name && (rc = tensord_stat(c, name, &info)) < 0) {
		free(v);
		return op_error(rc, name);
	}
	if (a->group) {
		rc = print_lease_groups(v, n, a->group, a->seen & OPT_JSON);
		free(v);
		return rc ? rc : finish_output();
	}
	if (n > 1) /* v may be NULL when n is 0 */
		qsort(v, n, sizeof(*v), cmp_holder);
	if (a->seen & OPT_JSON) {
		putchar('[');
		for (size_t i = 0; i < n; i++)
			json_holder(&v[i], i + 1 < n ? ",\n " : "");
		puts("]");
	} else {
		print_table(lease_titles, LC_N, 1u << LC_PID | 1u << LC_LEASES | 1u << LC_HELD, v,
			    n, lease_cell);
	}
	free(v);
	return finish_output();
}

/* --- clients ------------------------------------------------------------------- */

enum {
	CC_CONN,
	CC_PID,
	CC_USER,
	CC_COMM,
	CC_LABEL,
	CC_CLIENT,
	CC_LEASES,
	CC_CREATED,
	CC_WAITING,
	CC_QUEUED,
	CC_REQUESTS,
	CC_CONNECTED,
	CC_N
};

static const char *const client_titles[CC_N] = { "CONN",    "PID",    "USER",     "COMM",
						 "LABEL",   "CLIENT", "LEASES",   "CREATED",
						 "WAITING", "QUEUED", "REQUESTS", "CONNECTED" };

static const char *client_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const tensord_client_info *ci = (const tensord_client_info *)rows + i;

	switch (col) {
	case CC_CONN:
		return u64(ci->conn_id, buf, len);
	case CC_PID:
		return u64(ci->pid, buf, len);
	case CC_USER:
		return owner_name(ci->uid, buf, len);
	case CC_COMM:
		return *ci->comm ? ci->comm : "-";
	case CC_LABEL:
		return *ci->label ? ci->label : "-";
	case CC_CLIENT:
		return *ci->client ? ci->client : "-";
	case CC_LEASES:
		return u64(ci->leases, buf, len);
	case CC_CREATED:
		return u64(ci->tensors_created, buf, len);
	case CC_WAITING:
		return u64(ci->waiters, buf, len);
	case CC_QUEUED:
		return u64(ci->bytes_queued, buf, len);
	case CC_REQUESTS:
		return u64(ci->requests, buf, len);
	default:
		return iso_secs(ci->connected_ns, buf, len);
	}
}

static void json_client(const tensord_client_info *ci, const char *end)
{
	char t[48];

	printf("{\"conn_id\": %" PRIu64 ", \"pid\": %" PRIu32 ", \"uid\": %" PRIu32
	       ", \"gid\": %" PRIu32,
	       ci->conn_id, ci->pid, ci->uid, ci->gid);
	json_field("comm", ci->comm, false);
	json_field("label", ci->label, false);
	json_field("client", ci->client, false);
	printf(", \"connected_ns\": %" PRIu64 ", \"connected\": \"%s\", \"leases\": %" PRIu32
	       ", \"tensors_created\": %" PRIu64 ", \"waiters\": %" PRIu32
	       ", \"bytes_queued\": %" PRIu64 ", \"requests\": %" PRIu64 "}%s",
	       ci->connected_ns, iso_time(ci->connected_ns, t, sizeof(t)), ci->leases,
	       ci->tensors_created, ci->waiters, ci->bytes_queued, ci->requests, end);
}

int cmd_clients(tensord_client *c, const struct args *a)
{
	tensord_client_info *v = NULL;
	size_t n = 0;
	int rc;

	rc = tensord_clients(c, &v, &n);
	if (rc < 0)
		return op_error(rc, NULL);
	if (a->seen & OPT_JSON) {
		putchar('[');
		for (size_t i = 0; i < n; i++)
			json_client(&v[i], i + 1 < n ? ",\n " : "");
		puts("]");
	} else {
		print_table(client_titles, CC_N,
			    ~(1u << CC_USER | 1u << CC_COMM | 1u << CC_CLIENT | 1u << CC_CONNECTED),
			    v, n, client_cell);
	}
	free(v);
	return finish_output();
}

/* --- peers --------------------------------------------------------------------- */

enum {
	PC_PEER,
	PC_STATE,
	PC_ADDRESS,
	PC_SINCE,
	PC_CONNECTS,
	PC_FAILURES,
	PC_IN,
	PC_OUT,
	PC_PULLED,
	PC_SERVED,
	PC_REPLICAS,
	PC_PULL_ERRORS,
	PC_ERROR,
	PC_N
};

static const char *const peer_titles[PC_N] = { "PEER",      "STATE",    "ADDRESS",  "SINCE",
					       "CONNECTS",  "FAILURES", "BYTES-IN", "BYTES-OUT",
					       "PULLED-B",  "SERVED-B", "REPLICAS", "PULL-ERRORS",
					       "LAST ERROR" };

static const char *peer_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const tensord_peer_info *p = (const tensord_peer_info *)rows + i;

	switch (col) {
	case PC_PEER:
		return p->name;
	case PC_STATE:
		return p->state;
	case PC_ADDRESS:
		return *p->address ? p->address : "-";
	case PC_SINCE:
		return iso_secs(p->since_ns, buf, len);
	case PC_CONNECTS:
		return u64(p->connects, buf, len);
	case PC_FAILURES:
		return u64(p->failures, buf, len);
	case PC_IN:
		return u64(p->bytes_in, buf, len);
	case PC_OUT:
		return u64(p->bytes_out, buf, len);
	case PC_PULLED:
		return u64(p->pulled_bytes, buf, len);
	case PC_SERVED:
		return u64(p->served_bytes, buf, len);
	case PC_REPLICAS:
		return u64(p->replicas, buf, len);
	case PC_PULL_ERRORS:
		return u64(p->pull_errors, buf, len);
	default:
		return *p->error ? p->error : "-";
	}
}

enum { DC_NAME, DC_ADDRESSES, DC_SELF, DC_RESOLUTIONS, DC_FAILURES, DC_ERROR, DC_N };

static const char *const dns_titles[DC_N] = { "PEERS-DNS",   "ADDRESSES", "SELF",
					      "RESOLUTIONS", "FAILURES",  "LAST ERROR" };

static const char *dns_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const tensord_peer_dns_info *d = (const tensord_peer_dns_info *)rows + i;

	switch (col) {
	case DC_NAME:
		return d->host;
	case DC_ADDRESSES:
		return u64(d->addresses, buf, len);
	case DC_SELF:
		return u64(d->self, buf, len);
	case DC_RESOLUTIONS:
		return u64(d->resolutions, buf, len);
	case DC_FAILURES:
		return u64(d->failures, buf, len);
	default:
		return *d->error ? d->error : "-";
	}
}

/* After the peers' table, the --peers-dns names' (none: nothing printed). 0, or an exit status. */
static int print_peers_dns(tensord_client *c)
{
	tensord_peer_dns_info *v = NULL;
	size_t n = 0;
	int rc = tensord_peers_dns(c, &v, &n);

	if (rc < 0)
		return op_error(rc, NULL);
	if (n) {
		putchar('\n');
		print_table(dns_titles, DC_N,
			    1u << DC_ADDRESSES | 1u << DC_SELF | 1u << DC_RESOLUTIONS |
				    1u << DC_FAILURES,
			    v, n, dns_cell);
	}
	free(v);
	return 0;
}

static void json_peer(const tensord_peer_info *p, const char *end)
{
	char t[48];

	putchar('{');
	json_field("name", p->name, true);
	json_field("address", p->address, false);
	json_field("state", p->state, false);
	json_field("error", p->error, false);
	printf(", \"since_ns\": %" PRIu64 ", \"since\": \"%s\", \"instance\": \"%016" PRIx64
	       "\", \"bytes_in\": %" PRIu64 ", \"bytes_out\": %" PRIu64 ", \"connects\": %" PRIu64
	       ", \"failures\": %" PRIu64 ", \"configured\": %s, \"dialled\": %s",
	       p->since_ns, iso_time(p->since_ns, t, sizeof(t)), p->instance, p->bytes_in,
	       p->bytes_out, p->connects, p->failures, p->configured ? "true" : "false",
	       p->dialled ? "true" : "false");
	printf(", \"pulled\": %" PRIu64 ", \"pulled_bytes\": %" PRIu64 ", \"pull_errors\": %" PRIu64
	       ", \"served\": %" PRIu64 ", \"served_bytes\": %" PRIu64 ", \"replicas\": %" PRIu64
	       ", \"replica_bytes\": %" PRIu64 "}%s",
	       p->pulled, p->pulled_bytes, p->pull_errors, p->served, p->served_bytes, p->replicas,
	       p->replica_bytes, end);
}

int cmd_peers(tensord_client *c, const struct args *a)
{
	tensord_peer_info *v = NULL;
	char node[64];
	size_t n = 0;
	int rc;

	rc = tensord_peers(c, node, &v, &n);
	if (rc < 0)
		return op_error(rc, NULL);
	if (a->seen & OPT_JSON) {
		putchar('[');
		for (size_t i = 0; i < n; i++)
			json_peer(&v[i], i + 1 < n ? ",\n " : "");
		puts("]");
	} else if (!*node) {
		puts("peering is off (the daemon was started without --peer-listen, --peer or "
		     "--peers-dns)");
	} else {
		print_table(peer_titles, PC_N,
			    1u << PC_CONNECTS | 1u << PC_FAILURES | 1u << PC_IN | 1u << PC_OUT |
				    1u << PC_PULLED | 1u << PC_SERVED | 1u << PC_REPLICAS |
				    1u << PC_PULL_ERRORS,
			    v, n, peer_cell);
		rc = print_peers_dns(c);
	}
	free(v);
	return rc > 0 ? rc : finish_output();
}

/* --- stats --prometheus ---------------------------------------------------------- */

int print_prometheus(tensord_client *c)
{
	char *text;
	int rc = tensord_metrics(c, &text);

	char q[QUOTE_MAX], *line, *nl;

	if (rc < 0)
		return op_error(rc, NULL);
	/* Line by line: the text format has no byte a terminal acts on but the newline. */
	for (line = text; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		if (nl)
			*nl = '\0';
		fputs(quote(line, QUOTE_TEXT, q, sizeof(q)), stdout);
		if (!nl)
			break;
		putchar('\n');
	}
	free(text);
	return finish_output();
}
