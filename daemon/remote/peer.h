/*
 * Peering (docs/remote.md, "Peering" and "Authentication"): the TCP
 * control connections between this daemon and the other nodes' daemons,
 * on the loop. A listener (--peer-listen), a dialler per configured peer
 * (--peer NAME=HOST[:PORT], its name resolved again at each dial) that
 * redials after 1 s, doubling to 30 s; the challenge-response of
 * peer_auth.h on every connection before anything else; heartbeats once
 * a connection is up; one connection per pair of nodes (the one dialled by
 * the node with the smaller name survives). Each peer's state is kept for
 * operators (PeerList, `tensorctl peers`, the figures).
 *
 * Nothing a connection says before it has authenticated changes the peer
 * table: a refused handshake is logged (rate-limited) and counted, and
 * shows on a peer only where this node dialled it. This layer knows
 * frames and the handshake, nothing of the registry.
 */
#ifndef TENSORD_PEER_H
#define TENSORD_PEER_H

#include <sys/queue.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "peer_auth.h"
#include "proto/peer.pb-c.h"

#define PEER_DEFAULT_PORT 7439
/* Peers named with --peer, at most. */
#define PEER_CONFIG_MAX 64
/* Peers known at once: configured ones and those that dialled in. */
#define PEER_KNOWN_MAX 256
/* Connections not yet authenticated, at most; more are closed at accept. */
#define PEER_UNAUTH_MAX 64
/*
 * The largest frame payload a peer may send (a Hello is ~120 bytes; a UCX
 * worker address a few hundred, more with many interfaces).
 */
#define PEER_FRAME_MAX 16384u
/* A connection that has not authenticated by then is closed. */
#define PEER_HANDSHAKE_MS 5000
#define PEER_HEARTBEAT_MS 1000
/* A peer silent for this many heartbeats is down. */
#define PEER_HEARTBEAT_MISSES 3
#define PEER_REDIAL_MIN_MS 1000
#define PEER_REDIAL_MAX_MS 30000
/*
 * A peer's output queue is capped as a client's is (conn.h, CONN_OUT_HIGH
 * and CONN_OUT_MAX: the same numbers, 4 MiB and 16 MiB): past the first
 * this side stops reading the peer's requests until the queue drains; past
 * the second, or with nothing taken from the queue for this long while
 * reading is stopped (its heartbeats then go unread, so silence says
 * nothing), the connection is closed as lost.
 */
#define PEER_STALL_MS (PEER_HEARTBEAT_MISSES * PEER_HEARTBEAT_MS)
/* "HOST:PORT" as shown, HOST at most 253 bytes (a DNS name) or an IPv6 address. */
#define PEER_ADDR_MAX 264
#define PEER_ERROR_MAX 320
/* Names given with --peers-dns, at most. */
#define PEER_DNS_MAX 8
/* Addresses they resolve to, all names together, at most; more are not dialled. */
#define PEER_TARGET_MAX 256
/* Each --peers-dns name is resolved again this often. */
#define PEER_DNS_INTERVAL_MS 10000

/* One --peer. */
struct peer_config_entry {
	char name[PEER_NAME_MAX + 1];
	char host[256];
	uint16_t port;
};

/* One --peers-dns HOST[:PORT]. */
struct peer_dns_entry {
	char host[256];
	uint16_t port;
};

/* The options of peering; all empty when it is off. */
struct peer_config {
	char node_name[PEER_NAME_MAX + 1]; /* --node-name; "" until options_parse() fills it */
	char *listen;                      /* --peer-listen as given; NULL: no listener */
	char listen_host[64];              /* its address: "" for every one, else numeric */
	uint16_t listen_port;
	char *secret_file; /* --peer-secret-file; NULL: none */
	struct peer_config_entry peers[PEER_CONFIG_MAX];
	unsigned n_peers;
	struct peer_dns_entry dns[PEER_DNS_MAX]; /* --peers-dns */
	unsigned n_dns;
};

/* Whether the options turn peering on (a listener, a peer or a DNS name of peers). */
static inline bool peer_config_on(const struct peer_config *pc)
{
	return pc->listen || pc->n_peers || pc->n_dns;
}

enum peer_state {
	PEER_CONNECTING,     /* resolving or connecting */
	PEER_AUTHENTICATING, /* connected, handshake under way */
	PEER_UP,
	PEER_DOWN,    /* was up or could not connect; error says why */
	PEER_REFUSED, /* the handshake failed; error says why */
};

struct peer_set;
struct peer_conn;

/* A peer: configured, or known since it dialled in and authenticated. */
/*
 * Remote attach with one peer since the daemon started (remote.c keeps it;
 * tensorctl peers and the per-peer metrics read it).
 */
struct peer_remote_counts {
	uint64_t pulled, pulled_bytes;    /* replicas made of its tensors */
	uint64_t pull_errors;             /* pulls from it that failed */
	uint64_t served, served_bytes;    /* its pulls this node answered with bytes */
	uint64_t replicas, replica_bytes; /* its tensors' replicas here now */
};

struct peer {
	struct peer_set *set;
	char name[PEER_NAME_MAX + 1];
	char host[256]; /* configured peers: what to resolve; else "" */
	uint16_t port;
	bool configured;
	enum peer_state state;
	uint64_t since_ns;            /* CLOCK_REALTIME of the last change of state */
	char error[PEER_ERROR_MAX];   /* the last error; "" while none */
	char addr[PEER_ADDR_MAX];     /* the address of the last connection */
	uint64_t instance;            /* from its last authenticated Hello; 0: none yet */
	uint64_t bytes_in, bytes_out; /* over every connection to it, frames included */
	uint64_t connects;            /* connections that came up */
	uint64_t failures;            /* dials that failed, handshakes refused, connections lost */
	bool up_dialled;              /* the connection up is the one this node dialled */
	struct peer_conn *up;         /* the connection in use, while PEER_UP */
	struct peer_conn *dial;       /* this node's dial in progress */
	uv_timer_t redial;
	unsigned backoff_ms;
	uv_getaddrinfo_t gai;
	bool resolving;
	void *data; /* the layer above's (remote.c), owned by it; NULL until it sets it */
	struct peer_remote_counts remote;
};

/*
 * One --peers-dns name, resolved every PEER_DNS_INTERVAL_MS on libuv's
 * thread pool. Every address of its last good answer is a target.
 */
struct peer_dns {
	struct peer_set *set;
	char host[256];
	uint16_t port;
	uv_getaddrinfo_t gai;
	bool resolving;
	uv_timer_t timer;
	uint64_t resolutions;       /* answers that came, good or not */
	uint64_t failures;          /* of them, those that failed */
	unsigned n_addrs;           /* in the last good answer */
	char error[PEER_ERROR_MAX]; /* the last resolution's error; "" when it succeeded */
};

/*
 * One address a --peers-dns name resolved to: dialled until the node
 * there authenticates (its Hello gives its name), and again whenever that
 * node is down. An address that turns out to be this daemon itself is
 * never dialled again.
 */
struct peer_target {
	struct peer_dns *dns;
	struct sockaddr_storage sa;
	char addr[PEER_ADDR_MAX];
	bool self;              /* this daemon's own address */
	bool seen;              /* in the answer being applied */
	struct peer *peer;      /* the node found there; NULL until one authenticated */
	struct peer_conn *dial; /* the dial in progress */
	uv_timer_t redial;
	unsigned backoff_ms;
};

struct peer_set {
	uv_loop_t *loop;
	bool on;
	bool stopping;
	bool draining; /* peer_set_drain(): links stay, nothing new is made */
	char self[PEER_NAME_MAX + 1];
	uint64_t instance;
	uint8_t secret[PEER_SECRET_MAX]; /* proves with it */
	size_t secret_len;
	uint8_t also[PEER_SECRET_MAX]; /* accepts it too: a rotation under way; also_len 0: none */
	size_t also_len;
	char secret_file[PATH_MAX]; /* where they came from: SIGHUP reads it again */
	uv_tcp_t listener;
	bool listening;
	char listen_addr[PEER_ADDR_MAX];
	struct peer *peers[PEER_KNOWN_MAX]; /* owned; in the order they became known */
	unsigned n_peers;
	unsigned n_up;
	unsigned n_unauth; /* connections before their handshake ended */
	LIST_HEAD(, peer_conn) conns;
	/* Connections whose send failed, closed from reap in the loop's check
	 * phase, never under the sender (pc_fail() in peer_link.c); reap_idle keeps
	 * the loop from blocking meanwhile. */
	LIST_HEAD(, peer_conn) failed;
	uv_check_t reap;
	uv_idle_t reap_idle;
	uint64_t next_conn_id;
	uint64_t auth_failures; /* handshakes refused, both roles */
	struct peer_dns dns[PEER_DNS_MAX];
	unsigned n_dns;
	struct peer_target *targets[PEER_TARGET_MAX]; /* owned */
	unsigned n_targets;
	/*
	 * How the layer above (remote.c) hears of peers, set by remote_start()
	 * before peer_set_start(); each may be NULL. on_up: p's connection is up;
	 * on_down: it ended (reason: why); on_frame: a frame after the handshake
	 * other than a heartbeat, f borrowed for the call: 0, or -errno with the
	 * reason in why to close the connection (a peer that breaks the
	 * protocol is not trusted further).
	 */
	void (*on_up)(void *ctx, struct peer *p);
	void (*on_down)(void *ctx, struct peer *p, const char *reason);
	int (*on_frame)(void *ctx, struct peer *p, const Tensord__PeerFrame *f, char *why,
			size_t why_len);
	void *hooks_ctx;
};

/*
 * Loads the secret (peer_secret_load()) and knows the configured peers;
 * nothing listens or dials before peer_set_listen(). 0; or -errno with the
 * reason, naming the file, in why. Does nothing (0) when cfg turns peering
 * off.
 */
int peer_set_start(struct peer_set *set, uv_loop_t *loop, const struct peer_config *cfg, char *why,
		   size_t why_len);

/*
 * Listens at --peer-listen, on fd when it is not -1 (the listening socket a
 * predecessor kept in the descriptor store: its backlog, and the port, pass
 * from one daemon to the next, main.c), and starts dialling. The caller
 * checked that fd is bound where cfg listens (peer_listen_matches()). 0; or
 * -errno with the reason, naming the address, in why (fd is then closed).
 */
int peer_set_listen(struct peer_set *set, const struct peer_config *cfg, int fd, char *why,
		    size_t why_len);

/*
 * Whether fd is a listening TCP socket bound where cfg's --peer-listen
 * asks (its address, and its port unless that is 0).
 */
bool peer_listen_matches(const struct peer_config *cfg, int fd);

/* The listening socket's descriptor while listening, else -1 (to store it). */
int peer_set_listen_fd(const struct peer_set *set);

/*
 * Drains for the daemon that takes over (docs/restart.md section 6): stops
 * listening (a stored listening socket is the successor's) and dialling;
 * the links up stay, serving what peers read, until the daemon exits.
 */
void peer_set_drain(struct peer_set *set);

/* Drained, and the next daemon serves: every link is closed (its peers dial that one). */
void peer_set_let_go(struct peer_set *set);

/* Stops listening and dialling and closes every connection; the loop then ends. */
void peer_set_stop(struct peer_set *set);

/*
 * Reads the secret file again (SIGHUP): handshakes from now on use what it
 * holds; connections up stay up. 0; or -errno with why (the file and the
 * reason), and the secrets in use are kept. 0 with nothing done while
 * peering is off.
 */
int peer_set_reload_secret(struct peer_set *set, char *why, size_t why_len);

/* After the loop: frees the peers and wipes the secret. */
void peer_set_fini(struct peer_set *set);

/* Sends f on p's connection: 0, or -ENOTCONN when p is not up (or the send failed:
 * the connection is then closed later, never under the caller). */
int peer_send(struct peer *p, const Tensord__PeerFrame *f);

/* The peer of that name, or NULL. Borrowed: peers live until peer_set_fini(). */
struct peer *peer_lookup(struct peer_set *set, const char *name);

/* "connecting", "authenticating", "up", "down", "refused". */
const char *peer_state_name(enum peer_state s);

#endif /* TENSORD_PEER_H */
