/*
 * Inspection: who holds which leases (LeaseList) and which clients are
 * connected (ClientList), answered from the live connections and their
 * lease ledgers. Part of the protocol layer, beside dispatch.c: it decides
 * who may see what and sends the reply itself.
 *
 * Who sees what: a client sees the holders of tensors it may read
 * (registry_may_inspect(): owner and root see all); root sees every
 * connection, others only the connections of their own uid. A reply holds
 * at most INSPECT_PAGE_MAX entries and says whether more follow; a LeaseList
 * page visits at most INSPECT_SCAN_MAX lease slots (and the connections),
 * so one client's many leases cannot hold up the loop.
 */
#ifndef TENSORD_INSPECT_H
#define TENSORD_INSPECT_H

#include <stdint.h>

#include "dispatch.h"
#include "proto/tensord.pb-c.h"

#define INSPECT_PAGE_MAX 1024u
/* Lease slots one LeaseList page visits at most, leased or free, shown or not. */
#define INSPECT_SCAN_MAX 65536u

/* A client connected: notes when, and its command name from /proc (best effort). */
void inspect_client_opened(struct client *cl);

/* Keeps what the client said in Hello, made printable, for ClientList. */
void inspect_client_hello(struct client *cl, const char *text, const char *label);

/* Answers a LeaseList request. m is borrowed for the call. */
void inspect_leases(struct client *cl, uint64_t req_id, const Tensord__LeaseList *m);

/* Answers a ClientList request. m is borrowed for the call. */
void inspect_clients(struct client *cl, uint64_t req_id, const Tensord__ClientList *m);

/*
 * Answers a PeerList request: root and the daemon's own uid see every
 * peer's state; anyone else gets EPERM (peer addresses and their failures
 * describe the operator's network, not the caller's tensors).
 */
void inspect_peers(struct client *cl, uint64_t req_id);

#endif
