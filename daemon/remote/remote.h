/*
 * Remote attach of host tensors (docs/remote.md, "Remote attach: the data
 * flow"): what a peer may pull from this node (export rules), serving
 * those pulls (a pull lease owned by the peer's connection, the bytes
 * sent by the data path of xport.h), and pulling on behalf of this node's
 * clients ("@PEER/NAME": a read-only local replica, kept while leased and
 * for --replica-keep after).
 *
 * It sits above peer.c (which hands it frames and up/down through the
 * hooks remote_start() sets) and the registry. Dispatch decides which
 * requests are remote ("@" names) and calls down into the functions
 * below; remote attach answers clients, and tells the loop to poll,
 * only through struct remote_hooks, which server.c fills. It runs on the
 * loop thread.
 */
#ifndef TENSORD_REMOTE_H
#define TENSORD_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "peer_auth.h"

/* --export rules at most. */
#define REMOTE_EXPORTS_MAX 64
/* Peers one rule may name. */
#define REMOTE_EXPORT_PEERS_MAX 16
#define REMOTE_REPLICA_KEEP_MS_DEFAULT 5000u
#define REMOTE_MAX_INFLIGHT_DEFAULT (256ull << 20)
/* Pull leases one peer may hold on this node at once; past it, EAGAIN. */
#define REMOTE_SERVES_MAX 1024
/* Names of this node one peer may watch (docs/remote.md, "Freshness"); past it, B asks. */
#define REMOTE_WATCH_MAX 65536u
/* Tensors this small go inline in the PullReply (a peer frame holds 16 KiB). */
#define REMOTE_INLINE_MAX 8192u
/* Members of one set pull at most (docs/remote.md, "Sets"); B keeps as many pull ids for them. */
#define REMOTE_SET_MAX 1024u
/* Set pulls one node runs at once (each a transaction of its pseudo-client's). */
#define REMOTE_SETS_MAX 16u
/* The uid a peer acts as in this node's mode checks (nobody). */
#define REMOTE_PEER_UID 65534u

/* One --export PREFIX[=PEER,...]. */
struct remote_export {
	char prefix[256]; /* "" exports every name */
	unsigned n_peers; /* 0: every peer */
	char peers[REMOTE_EXPORT_PEERS_MAX][PEER_NAME_MAX + 1];
};

struct remote_config {
	struct remote_export exports[REMOTE_EXPORTS_MAX];
	unsigned n_exports;
	uint32_t replica_keep_ms; /* --replica-keep */
	uint64_t max_inflight;    /* --peer-max-inflight: bytes being sent to one peer */
	/* --peer-max-replica-bytes: replicas of one peer on this node; 0: 1/4 of the capacity */
	uint64_t max_replica_bytes;
};

/* Whether the rules let peer pull name (len bytes). */
bool remote_exported(const struct remote_config *rc, const char *peer, const char *name,
		     size_t len);

/* The gauges (figures.def), in struct server, kept by remote.c. */
struct remote_figures {
	uint64_t replicas, replica_bytes;
	uint64_t pull_leases;    /* leases peers hold on this node's tensors */
	uint64_t inflight_bytes; /* being sent to peers */
	uint64_t staged_bytes;   /* host copies of GPU tensors being served */
	uint64_t watched;        /* names peers are told about when they change */
	uint64_t pulls;          /* pulls under way here, waiting ones included */
};

struct client;
struct remote;
struct peer_set;
struct registry;
struct reg_client;
struct tensor;
struct Tensord__AttachMany;
struct Tensord__List;
struct Tensord__Reply;

/*
 * How remote attach reaches the layers above it (server.c fills it with
 * dispatch's functions and the loop's): cl is a client as dispatch knows
 * it, opaque here; kind a Tensord__Request body case.
 */
struct remote_hooks {
	/* A status reply to request id of cl (reply_status()). */
	void (*reply_status)(struct client *cl, unsigned kind, uint64_t id, int status,
			     const char *why);
	/* Any other reply, with no descriptor: rep is borrowed for the call. */
	void (*reply)(struct client *cl, const struct Tensord__Reply *rep);
	/* dispatch_attach_local(): an attach of a published local name (a replica). */
	void (*attach_local)(struct client *cl, uint64_t id, const char *name, size_t len,
			     uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares,
			     bool bind);
	/* dispatch_set_members(): the members of a set as a local AttachMany resolves them. */
	int (*set_members)(struct registry *reg, struct reg_client *rc,
			   const struct Tensord__AttachMany *m, struct tensor ***ret_v,
			   size_t *ret_n, uint64_t *ret_commit, char *why, size_t why_len);
	/* dispatch_set_answer(): an AttachMany answered with published names. */
	void (*set_answer)(struct client *cl, uint64_t id, const char *const *names, size_t n,
			   const uint64_t *have_shares, size_t n_have_shares);
	/* server_spin_seen() and server_spin_arm() (server.h): around a peer's frame. */
	void (*frame_seen)(void *ctx);
	void (*frame_done)(void *ctx);
	void *ctx; /* of frame_seen and frame_done */
};

/*
 * What remote attach works with, lent by the daemon (server.c fills it,
 * struct server holds it): it outlives remote_stop(). Set while
 * peering is off too: a remote request then answers why.
 */
struct remote_env {
	uv_loop_t *loop;
	struct registry *reg;
	struct peer_set *peers;
	const struct remote_config *cfg;
	struct remote_figures *figs;
	struct remote_hooks hooks;
	struct remote *rm; /* remote_start()'s; NULL while remote attach is off */
};

/*
 * Starts the data path (when peering is on) and hooks into env->peers.
 * Never fails the daemon: without a data path, remote attaches answer why.
 */
void remote_start(struct remote_env *env);

/* Ends every pull and replica; before peer_set_stop(). */
void remote_stop(struct remote_env *env);

/* cl cancels its waiting remote attach req_id: 0 (answered ECANCELED), or -ENOENT. */
int remote_cancel(struct remote_env *env, struct client *cl, uint64_t req_id);

/*
 * Attach of "@PEER/NAME" by cl, request id: answered now or when the pull
 * ends, with a lease on the local replica or an error naming the peer, the
 * name and the reason. timeout_ms (0: none, < 0: forever) and after (a
 * generation) wait as a local attach does, for A to publish the name (or
 * a newer generation).
 */
void remote_attach(struct remote_env *env, struct client *cl, uint64_t id, const char *name,
		   uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares, bool bind,
		   int64_t timeout_ms, uint64_t after);

/*
 * The end of a registry step that published or unlinked names (v[0..n);
 * lost: some changes could not be kept): every peer that holds a replica
 * of one of them (lost: of any name) is told (PeerChanged).
 */
struct reg_change;
void remote_on_commit(struct remote_env *env, const struct reg_change *v, size_t n, bool lost);

/* Whether AttachMany m names another node's set: a name or its prefix starts with '@'. */
bool remote_set_is_remote(const struct Tensord__AttachMany *m);

/*
 * AttachMany of "@PEER/..." names, or of prefix "@PEER/PREFIX", by cl,
 * request id: one set pull from PEER, all of one commit there, published
 * here in one commit; answered when it ends, with leases on every replica
 * or an error naming the peer, the member and the reason.
 */
void remote_attach_many(struct remote_env *env, struct client *cl, uint64_t id,
			const struct Tensord__AttachMany *m);

/*
 * List of prefix "@PEER/..." by cl, request id: what PEER exports to this
 * node under the rest of the prefix, asked of PEER and answered when it
 * answers (docs/remote.md, "Naming"): true. false: not such a list (the
 * prefix "@" alone, no '/', or peering off): the caller lists this node's
 * own names (its replicas).
 */
bool remote_list(struct remote_env *env, struct client *cl, uint64_t id,
		 const struct Tensord__List *m);

/* cl's connection is closing: its pending remote attaches are forgotten. */
void remote_client_gone(struct remote_env *env, struct client *cl);

#endif /* TENSORD_REMOTE_H */
