/*
 * The daemon's options for peering (docs/remote.md): --node-name,
 * --peer-listen, --peer, --peers-dns, --peer-secret-file; remote attach's
 * --export rules; and the checks peering needs once every option is read
 * (a node name, a secret file, no peer of this node's own name).
 */
#include "options_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/desc.h"
#include "daemon/remote/peer.h"
#include "daemon/remote/peer_auth.h"

/*
 * "HOST[:PORT]": HOST a name, an IPv4 address or a bracketed IPv6 one
 * (empty only where empty_ok), PORT 1-65535, PEER_DEFAULT_PORT when none.
 * 0 or -EINVAL.
 */
static int parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port, bool empty_ok)
{
	const char *h = s, *colon, *end;
	size_t n;

	*port = PEER_DEFAULT_PORT;
	if (*s == '[') {
		end = strchr(s, ']');
		if (!end)
			return -EINVAL;
		h = s + 1;
		n = (size_t)(end - h);
		colon = end[1] == ':' ? end + 1 : NULL;
		if (end[1] && !colon)
			return -EINVAL;
	} else {
		colon = strchr(s, ':');
		if (colon && strchr(colon + 1, ':'))
			return -EINVAL; /* an IPv6 address goes in brackets */
		n = colon ? (size_t)(colon - s) : strlen(s);
	}
	if (n >= host_len || (n == 0 && !empty_ok))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!isgraph((unsigned char)h[i]) || h[i] == '/' || h[i] == '[' || h[i] == ']')
			return -EINVAL;
	memcpy(host, h, n);
	host[n] = '\0';
	if (colon) {
		uint64_t v;
		const char *e;

		if (opt_parse_digits(colon + 1, 10, &e, &v) < 0 || *e || v == 0 || v > 65535)
			return -EINVAL;
		*port = (uint16_t)v;
	}
	return 0;
}

/* --peers-dns HOST[:PORT] into pc. 0, or 2 with the complaint printed. */
int opt_parse_peers_dns(const char *arg, struct peer_config *pc)
{
	struct peer_dns_entry *e;
	char buf[160];

	if (pc->n_dns == PEER_DNS_MAX) {
		fprintf(stderr, "tensord: --peers-dns %s: at most %d names\n",
			opt_shown(arg, buf, sizeof(buf)), PEER_DNS_MAX);
		return 2;
	}
	e = &pc->dns[pc->n_dns];
	if (parse_hostport(arg, e->host, sizeof(e->host), &e->port, false) < 0) {
		fprintf(stderr,
			"tensord: --peers-dns %s: not HOST[:PORT] (a DNS name, an IPv4 address or "
			"[IPv6]; a port from 1 to 65535)\n",
			opt_shown(arg, buf, sizeof(buf)));
		return 2;
	}
	pc->n_dns++;
	return 0;
}

/* --node-name, --peer-listen, --peer, --peer-secret-file into pc. 0, or 2 with the complaint printed. */
int opt_parse_peer(int opt, const char *arg, struct peer_config *pc)
{
	char buf[160];
	const char *eq;
	struct peer_config_entry *e;

	switch (opt) {
	case OPT_NODE_NAME:
		if (!peer_name_valid(arg, strlen(arg))) {
			fprintf(stderr,
				"tensord: --node-name %s: not 1-%d bytes of [A-Za-z0-9._-]\n",
				opt_shown(arg, buf, sizeof(buf)), PEER_NAME_MAX);
			return 2;
		}
		snprintf(pc->node_name, sizeof(pc->node_name), "%s", arg);
		return 0;
	case OPT_PEER_LISTEN:
		if (parse_hostport(arg, pc->listen_host, sizeof(pc->listen_host), &pc->listen_port,
				   true) < 0) {
			fprintf(stderr,
				"tensord: --peer-listen %s: not ADDR:PORT (an IP address, [IPv6] "
				"or nothing for every address; a port from 1 to 65535)\n",
				opt_shown(arg, buf, sizeof(buf)));
			return 2;
		}
		free(pc->listen);
		pc->listen = strdup(arg);
		break;
	case OPT_PEER:
		eq = strchr(arg, '=');
		if (!eq || !peer_name_valid(arg, (size_t)(eq - arg))) {
			fprintf(stderr,
				"tensord: --peer %s: not NAME=HOST[:PORT] with NAME 1-%d bytes of "
				"[A-Za-z0-9._-]\n",
				opt_shown(arg, buf, sizeof(buf)), PEER_NAME_MAX);
			return 2;
		}
		for (unsigned i = 0; i < pc->n_peers; i++)
			if (strlen(pc->peers[i].name) == (size_t)(eq - arg) &&
			    memcmp(pc->peers[i].name, arg, (size_t)(eq - arg)) == 0) {
				fprintf(stderr, "tensord: --peer %s: peer %s is named twice\n",
					opt_shown(arg, buf, sizeof(buf)), pc->peers[i].name);
				return 2;
			}
		if (pc->n_peers == PEER_CONFIG_MAX) {
			fprintf(stderr, "tensord: --peer %s: at most %d peers\n",
				opt_shown(arg, buf, sizeof(buf)), PEER_CONFIG_MAX);
			return 2;
		}
		e = &pc->peers[pc->n_peers];
		if (parse_hostport(eq + 1, e->host, sizeof(e->host), &e->port, false) < 0) {
			fprintf(stderr,
				"tensord: --peer %s: '%s' is not HOST[:PORT] (a name, an IPv4 "
				"address or [IPv6]; a port from 1 to 65535)\n",
				opt_shown(arg, buf, sizeof(buf)), eq + 1);
			return 2;
		}
		memcpy(e->name, arg, (size_t)(eq - arg));
		e->name[eq - arg] = '\0';
		pc->n_peers++;
		return 0;
	default:
		free(pc->secret_file);
		pc->secret_file = strdup(arg);
		if (!pc->secret_file)
			break;
		return 0;
	}
	if (opt == OPT_PEER_LISTEN && pc->listen)
		return 0;
	fprintf(stderr, "tensord: --%s: out of memory\n", opt_name(opt));
	return 2;
}

/*
 * With peering on: a node name ($NODE_NAME or the host name by default),
 * a secret file, and no peer of this node's own name. 0, or 2 with the
 * complaint printed. The secret file itself is read at start (peer.c).
 */
int opt_check_peering(struct peer_config *pc)
{
	const char *from = "--node-name";
	char host[256], buf[160];

	if (!peer_config_on(pc))
		return 0;
	if (!pc->node_name[0]) {
		const char *env = getenv("NODE_NAME");

		if (env && *env) {
			from = "$NODE_NAME";
			snprintf(host, sizeof(host), "%s", env);
		} else {
			from = "the host name";
			if (gethostname(host, sizeof(host)) < 0)
				host[0] = '\0';
			host[sizeof(host) - 1] = '\0';
		}
		if (!peer_name_valid(host, strlen(host))) {
			fprintf(stderr,
				"tensord: node name %s (%s) is not 1-%d bytes of [A-Za-z0-9._-]; "
				"give one with --node-name\n",
				opt_shown(host, buf, sizeof(buf)), from, PEER_NAME_MAX);
			return 2;
		}
		snprintf(pc->node_name, sizeof(pc->node_name), "%s", host);
	}
	if (!pc->secret_file) {
		fprintf(stderr, "tensord: --peer-listen, --peer and --peers-dns need "
				"--peer-secret-file PATH, the "
				"secret every peer shares (docs/remote.md, \"Authentication\")\n");
		return 2;
	}
	for (unsigned i = 0; i < pc->n_peers; i++)
		if (strcmp(pc->peers[i].name, pc->node_name) == 0) {
			fprintf(stderr,
				"tensord: --peer %s=%s: that is this node's own name (%s)\n",
				pc->peers[i].name, pc->peers[i].host, from);
			return 2;
		}
	return 0;
}

/* --export PREFIX[=PEER,...] into rc. 0, or 2 with the complaint printed. */
int opt_parse_export(const char *arg, struct remote_config *rc)
{
	const char *eq = strchr(arg, '=');
	size_t plen = eq ? (size_t)(eq - arg) : strlen(arg);
	struct remote_export *e;
	char why[300], buf[160];

	if (rc->n_exports == REMOTE_EXPORTS_MAX) {
		fprintf(stderr, "tensord: --export %s: at most %d rules\n",
			opt_shown(arg, buf, sizeof(buf)), REMOTE_EXPORTS_MAX);
		return 2;
	}
	e = &rc->exports[rc->n_exports];
	memset(e, 0, sizeof(*e));
	if (plen && td_name_check(arg, plen, why, sizeof(why)) < 0) {
		fprintf(stderr, "tensord: --export %s: the prefix: %s\n",
			opt_shown(arg, buf, sizeof(buf)), why);
		return 2;
	}
	memcpy(e->prefix, arg, plen);
	e->prefix[plen] = '\0';
	for (const char *p = eq ? eq + 1 : NULL; p;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);

		if (!peer_name_valid(p, n) || e->n_peers == REMOTE_EXPORT_PEERS_MAX) {
			fprintf(stderr,
				"tensord: --export %s: not PREFIX[=PEER,...] with each PEER 1-%d "
				"bytes of [A-Za-z0-9._-], at most %d of them\n",
				opt_shown(arg, buf, sizeof(buf)), PEER_NAME_MAX,
				REMOTE_EXPORT_PEERS_MAX);
			return 2;
		}
		memcpy(e->peers[e->n_peers], p, n);
		e->peers[e->n_peers++][n] = '\0';
		p = comma ? comma + 1 : NULL;
	}
	rc->n_exports++;
	return 0;
}
