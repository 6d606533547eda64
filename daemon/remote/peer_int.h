/*
 * What peer.c (the connections, the handshake, heartbeats, the --peer
 * dials) and peer_dns.c (--peers-dns: names resolved to the peers'
 * addresses) share, and nothing else includes. A connection (struct
 * peer_conn) stays peer.c's own; peer_dns.c knows targets and names.
 */
#ifndef TENSORD_PEER_INT_H
#define TENSORD_PEER_INT_H

#include "peer.h"

/* peer.c */

/*
 * Dials t's address for it (t->dial is the connection). -ENOMEM when no
 * connection could be made (t->dial stays NULL), else 0: a connect that
 * fails at once closes the dial as any failed dial does, and the close
 * has t dialled again later.
 */
int peer_conn_dial_target(struct peer_target *t);

/* The dial pc serves no target any more (its address left the answer); it goes on, on its own. */
void peer_conn_forget_target(struct peer_conn *pc);

/*
 * sa as text, an IPv4-mapped IPv6 address as the IPv4 one: a listener on
 * [::] sees an IPv4 dialler as ::ffff:a.b.c.d, the dialler itself as
 * a.b.c.d.
 */
void peer_sockaddr_text_plain(const struct sockaddr *sa, char *out, size_t len);

/* peer_dns.c */

/* Starts resolving each --peers-dns name of cfg, at once and every PEER_DNS_INTERVAL_MS. */
void peer_dns_start(struct peer_set *set, const struct peer_config *cfg);

/* Stops resolving and dialling the names' addresses (the daemon stopping). */
void peer_dns_stop(struct peer_set *set);

/* t is dialled again after its back-off, which then doubles (as a --peer's). */
void peer_target_redial_later(struct peer_target *t);

/* Each --peers-dns address that led to p is dialled again (p went down). */
void peer_targets_redial(struct peer *p);

#endif /* TENSORD_PEER_INT_H */
