/*
 * The daemon as one object: its configuration, the registry, the listening
 * socket, the client connections and the waiters. main.c builds it and
 * wires the layers together; everything runs on the one libuv loop thread.
 *
 * Layers, bottom up (each calls down by name, and up only through the
 * callbacks main.c sets):
 *   registry.c, backend_*.c   tensors, leases, memory; no sockets, no loop
 *   quarantine.c              ended connections' legacy IPC memory, until their
 *                             processes exit; the registry and the loop, no sockets
 *   conn.c, listen.c          sockets and frames; up through conn_handlers
 *   waiters.c                 parked attaches and their timers; up through on_done
 *   reply.c, dispatch.c       the protocol: requests in, replies out
 *   main.c                    arguments, signals, wiring, the loop
 */
#ifndef TENSORD_SERVER_H
#define TENSORD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <uv.h>

#include "common/sys.h"
#include "conn.h"
#include "daemon/remote/peer.h"
#include "quarantine.h"
#include "daemon/base/quota.h"
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
	/* Remote attach over the peers (remote.c); NULL while peering is off. */
	struct remote *remote;
	struct remote_figures remote_figs;
	int listen_fd;
	bool socket_inherited; /* passed by systemd: not ours to unlink */
	int reserve_fd;        /* spare descriptor for shedding clients at EMFILE */
	uv_poll_t listen_poll;
	uv_signal_t sigterm, sigint;
	uv_signal_t sighup, sigusr1, sigusr2; /* logged, never fatal */
	uint64_t start_ns;
	bool stopping;
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
	struct td_spin spin;
	uint64_t spin_until, spin_seen;
	bool spin_polled;
	/* The GPU worker finished a job: run completions (creates) on the loop. */
	uv_async_t gpu_done;
};

/* listen.c: binds, sets the mode and starts accepting into srv->conns. 0 or -errno. */
int server_listen(struct server *srv);
/* Stops accepting and removes the socket file. */
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

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * Polling after a frame (main.c, on_spin()): server_spin_seen() before a
 * frame of a client's or a peer's is served (a poll that saw it come is a
 * hit), server_spin_arm() after it (poll for the next, as long as
 * srv->spin allows).
 */
void server_spin_seen(struct server *srv);
void server_spin_arm(struct server *srv);

#endif
