/*
 * What the option files share, and nothing else includes: options.c (the
 * option table, --help, argv and the config file applied in order),
 * options_value.c (a value parsed strictly: numbers, sizes, modes, ids,
 * groups, limits; and how a refused one is shown) and options_peer.c
 * (peering's and remote attach's options, and the checks once all are
 * read). Each parser returns 0, or 2 (the exit status) with the complaint
 * printed.
 */
#ifndef TENSORD_OPTIONS_INT_H
#define TENSORD_OPTIONS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"

/* Peering's options (docs/remote.md); the per-uid shares (quota.def) take values from OPT_QUOTA on. */
enum {
	OPT_NODE_NAME = 0x100,
	OPT_PEER_LISTEN,
	OPT_PEER,
	OPT_PEER_SECRET,
	OPT_EXPORT,
	OPT_REPLICA_KEEP,
	OPT_PEER_MAX_INFLIGHT,
	OPT_PEERS_DNS,
	OPT_PEER_MAX_REPLICA_BYTES,
	OPT_MAX_WATCH_QUEUE,
	OPT_RECYCLE,
	OPT_FDSTORE,
	OPT_STATE_LOG_SIZE,
	OPT_HOLDER,
	OPT_READOPT_GRACE,
	OPT_QUOTA = 0x200,
};

/* options.c */

/* The long name of option val, for messages. */
const char *opt_name(int val);

/* options_value.c */

struct number_opt;

/* Numeric option opt's range and kind, or NULL when opt takes no number. */
const struct number_opt *opt_number(int opt);

/* s, all digits of base, into *ret. 0, -EINVAL (not such digits) or -ERANGE. */
int opt_parse_digits(const char *s, int base, const char **ret_end, uint64_t *ret);

/*
 * arg for a message: as it is, or quoted and escaped (into buf) when
 * blanks, control bytes or an empty string would hide what it was.
 */
const char *opt_shown(const char *arg, char *buf, size_t len);

/* The value of numeric option opt, in its range. 0, or 2 with the complaint printed. */
int opt_parse_number(int opt, const char *arg, uint64_t *ret);

/* A per-uid or per-connection limit (or an exempt uid) into cfg. 0 or 2. */
int opt_parse_limit(int opt, uint64_t v, struct server_config *cfg);

/* --group: a group's name, else a gid. 0, or 2 with the complaint printed. */
int opt_parse_group(const char *arg, struct server_config *cfg);

/* options_peer.c */

/* --node-name, --peer-listen, --peer, --peer-secret-file into pc. 0 or 2. */
int opt_parse_peer(int opt, const char *arg, struct peer_config *pc);

/* --peers-dns HOST[:PORT] into pc. 0, or 2 with the complaint printed. */
int opt_parse_peers_dns(const char *arg, struct peer_config *pc);

/* --export PREFIX[=PEER,...] into rc. 0, or 2 with the complaint printed. */
int opt_parse_export(const char *arg, struct remote_config *rc);

/*
 * With peering on: a node name ($NODE_NAME or the host name by default),
 * a secret file, and no peer of this node's own name. 0, or 2 with the
 * complaint printed. The secret file itself is read at start (peer.c).
 */
int opt_check_peering(struct peer_config *pc);

#endif /* TENSORD_OPTIONS_INT_H */
