/*
 * The daemon as one object: its configuration, the registry, the listening
 * socket, the client connections, the waiters and the peers. server.c
 * builds it and wires the layers together; main.c reads the options and
 * runs the loop; everything runs on the one libuv loop thread.
 *
 * Layers, bottom up (each calls down by name, and up only through the
 * callbacks server.c sets; docs/design.md, "The map", has the folders):
 *   base/                     logs, rate limits, per-uid shares, the clock
 *   memory/                   backends, the pool, slabs, the GPU worker
 *   registry/                 tensors, leases, versions, transactions; no
 *                             sockets, no loop; up through on_commit
 *   quarantine.c              ended connections' legacy IPC memory, until their
 *                             processes exit; the registry and the loop, no sockets
 *   conn.c, listen.c          sockets and frames; up through conn_handlers
 *   waiters.c                 parked attaches and their timers; up through on_done
 *   remote/peer*.c            the other nodes' daemons: links, handshake,
 *                             dialling; up through peer_set's on_up, on_down,
 *                             on_frame
 *   remote/remote*.c, xport/  remote attach over the peers; up through
 *                             struct remote_hooks (remote.h)
 *   figures.c, metrics*.c,    what the daemon counts and shows (figures.def);
 *   prometheus.c, inspect.c   read by dispatch and the metrics endpoint
 *   reply.c, dispatch*.c,     the protocol: requests in, replies out; "@"
 *   watch.c                   names routed down to remote attach
 *   server.c                  the object: init, wiring, stop, polling
 *   main.c                    arguments, signals, the loop
 */
#ifndef TENSORD_SERVER_H
#define TENSORD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <uv.h>

#include "common/sys.h"
#include "daemon/base/clock.h"
#include "conn.h"
#include "daemon/remote/peer.h"
#include "quarantine.h"
#include "daemon/base/quota.h"
#include "daemon/persist/seqs.h"
#include "daemon/persist/state.h"
#include "daemon/registry/registry.h"
#include "daemon/remote/remote.h"
#include "waiters.h"

struct server_config {
	char socket_path[108];
	uint64_t host_capacity;   /* 0: default */
	mode_t socket_mode;       /* default 0600 */
	const char *metrics_addr; /* --metrics HOST:PORT or unix:PATH; NULL: off */
	gid_t socket_gid;         /* (gid_t)-1: leave as is */
	unsigned max_clients;
	uint32_t max_watch_queue;    /* --max-watch-queue: events a watch may queue */
	struct quota_limits limits;  /* per-uid shares; 0: the default */
	bool show_all_metadata;      /* list/stat show every tensor to everyone */
	bool no_recycle;             /* --recycle off: every version in fresh memory */
	uint64_t fdstore_max;        /* --fdstore: descriptors the store may keep; 0: off */
	bool fdstore_set;            /* --fdstore given (else $FDSTORE says) */
	uint64_t state_log_size;     /* --state-log-size; 0: the default */
	uint32_t readopt_grace_ms;   /* --readopt-grace */
	bool readopt_grace_set;      /* given (else the default, 30 s) */
	char holder[100];            /* --holder DIR; "": systemd's store, if any */
	bool metrics_per_uid;        /* the HTTP metrics show every uid's usage */
	struct peer_config peer;     /* peering (peer.h); off unless --peer-listen or --peer */
	struct remote_config remote; /* --export, --replica-keep, --peer-max-inflight */
};

struct server {
	uv_loop_t *loop;
	struct server_config cfg;
	struct registry reg;
	struct conn_set conns;
	struct waiters waiters;
	struct quota quota; /* what each uid holds, and its limits */
	/* Legacy IPC memory of ended connections, kept until their processes exit. */
	struct quarantine quarantine;
	/* The other nodes' daemons (peer.c); set->on is false while peering is off. */
	struct peer_set peers;
	/* Remote attach over the peers (remote.c): what it is lent; remote.rm NULL while off. */
	struct remote_env remote;
	struct remote_figures remote_figs;
	/* Tensors kept across restarts (docs/restart.md); NULL: the store is off. */
	struct state *state;
	const struct state_figures *state_figures; /* its figures, for figures.c; NULL: off */
	/* What clients' effecting requests did (daemon/persist/seqs.h); NULL: out of memory at start. */
	struct seqs *seqs;
	int listen_fd;
	bool socket_inherited; /* passed by systemd: not ours to unlink */
	bool socket_stored;    /* in the descriptor store: the next daemon serves it */
	int reserve_fd;        /* spare descriptor for shedding clients at EMFILE */
	uv_poll_t listen_poll;
	uv_signal_t sigterm, sigint;
	uv_signal_t sighup, sigusr1, sigusr2; /* logged, never fatal */
	uint64_t start_ns;
	bool stopping;
	/* Draining (server_drain(): an upgrade through a holder): accepts
	 * nothing, records nothing, serves only reads; the next daemon owns the
	 * state. Never ends but with the process. */
	bool draining;
	bool let_go; /* drained, and its successor serves: no client, no peer left (server_drain()) */
	/* After a request, the loop polls instead of sleeping until
	 * spin_until, so the next request of a busy client needs no wake-up;
	 * spin says whether and how long (common/sys.h). spin_seen: when the
	 * poll was armed or the loop last came round while polling;
	 * spin_polled: it came round since the poll was armed, so a frame
	 * read now came while polling, not in the batch that armed it. */
	uv_idle_t spin_idle;
	/* Binding pages cleared: their client threads are woken 1 ms later. */
	uv_prepare_t bind_due;
	uv_timer_t bind_wake;
	uv_timer_t readopt_end; /* the restart's grace period for re-adoption */
	struct td_spin spin;
	uint64_t spin_until, spin_seen;
	bool spin_polled;
	/* The GPU worker finished a job: run completions (creates) on the loop. */
	uv_async_t gpu_done;
};

/* listen.c: binds, sets the mode and starts accepting into srv->conns. 0 or -errno. */
int server_listen(struct server *srv);
/* Stops accepting and removes the socket file (one it bound and did not
 * store). Once: a second call does nothing. */
void server_unlisten(struct server *srv);
/* Whether a daemon answers at the unix socket path (a stale file refuses). */
bool server_socket_is_live(const char *path);
/*
 * listen.c: a Unix socket bound at path with mode and group gid ((gid_t)-1:
 * left as is), not yet listening, in a directory checked by td_dir_rule()
 * and never changed by name (listen.c says why). A stale socket is
 * replaced, a live one or any other file is not. The fd, or -errno with
 * the reason, naming the path, in why (-EPERM: an unsafe directory).
 */
int server_socket_bind(const char *path, mode_t mode, gid_t gid, char *why, size_t len);
/* Removes the socket server_socket_bind() made at path, through its directory. */
void server_socket_remove(const char *path);

/* server.c: everything but the listening socket and the peers. 0 or -errno. */
int server_init(struct server *srv);

/*
 * After a restart restored tensors (registry_readopt_hold()): ends their
 * hold when the grace period (--readopt-grace, SERVER_READOPT_GRACE_MS by
 * default) is over, at once when it is 0.
 */
#define SERVER_READOPT_GRACE_MS 30000
void server_readopt_start(struct server *srv);
/* Stops accepting, closes every client, frees everything; the loop then ends. */
void server_stop(struct server *srv);
/*
 * The holder's SIGUSR2 (docs/restart.md, section 6): stops accepting,
 * freezes the state (no record, no FDSTOREREMOVE, freed memory keeps its
 * bytes), then serves only reads on the connections it has: a request that
 * would change anything closes its connection (dispatch.c), and the client
 * library takes that as a lost connection. Tells the holder it drained
 * (TENSORD_DRAINED=1 on the notify socket); SIGTERM then ends it. Asked
 * again once drained (a holder that leaves it to its manager, once the
 * next daemon serves), it closes every client connection and peer link
 * and waits to be stopped. Only under --holder: anywhere else SIGUSR2 is
 * logged and ignored.
 */
void server_drain(struct server *srv);
/* After the loop: the GPU worker's last creates completed, every tensor freed. */
void server_fini(struct server *srv);

/*
 * Polling after a frame (server.c, on_spin()): server_spin_seen() before a
 * frame of a client's or a peer's is served (a poll that saw it come is a
 * hit), server_spin_arm() after it (poll for the next, as long as
 * srv->spin allows).
 */
void server_spin_seen(struct server *srv);
void server_spin_arm(struct server *srv);

#endif
