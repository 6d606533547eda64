/*
 * What the parts of remote attach (remote.h; docs/remote.md) share, and
 * nothing outside daemon/remote/ includes: remote.c (start and stop, peers
 * up and down, their frames dispatched, the data path's callbacks, the GPU
 * worker's jobs, populating mappings ahead of UCX, the replica keep timer,
 * a client's close and cancel), on node A: remote_serve.c (a pull served),
 * remote_serve_set.c (set pulls served) and remote_watch.c (the names a
 * peer holds replicas of, and PeerChanged), and on node B: remote_attach.c (a
 * client's attach of an "@" name, and the syncs that keep replicas
 * fresh), remote_pull.c (pulls: asked, answered, received, published, or
 * failed), remote_wait.c (pulls that wait for A to publish),
 * remote_pull_gpu.c (GPU replicas), remote_replica.c (the replicas kept,
 * and their peer's share), remote_set.c (pulling a set, published in one
 * commit) and remote_list.c (listing what a peer exports).
 */
#ifndef TENSORD_REMOTE_INT_H
#define TENSORD_REMOTE_INT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <uv.h>

#include "peer.h"
#include "proto/tensord.pb-c.h"
#include "daemon/registry/registry.h"
#include "remote.h"
#include "xport.h"

struct client;

#define ATTACH TENSORD__REQUEST__BODY_ATTACH
/* A pull's deadline: 5 s and the size at 100 MB/s. */
#define PULL_BASE_MS 5000u
#define PULL_BYTES_PER_MS 100000u

struct rpeer;
struct gjob;

/* A: one pull of a peer's being served. */
struct serve {
	struct rpeer *rp;
	uint64_t id; /* the peer's pull id */
	uint64_t epoch;
	uint64_t lease;   /* in rp->rc, while epoch is current */
	struct tensor *t; /* borrowed: valid while that lease lives */
	uint64_t fd_off, len;
	void *map; /* owned; NULL until mapped (a GPU tensor's: its copy in host memory) */
	size_t map_len;
	size_t pop_off; /* populated ahead of UCX up to here (populate_step) */
	/*
	 * A GPU tensor's (docs/remote.md, "GPU tensors across nodes"): waiting
	 * for room to copy it out, then being copied by the GPU worker; the
	 * reply goes once its bytes are in host memory.
	 */
	enum { SV_STAGE_WAIT, SV_STAGING, SV_LEASED, SV_QUEUED, SV_SENDING } st;
	struct gjob *job; /* the copy under way; NULL: none */
	uint64_t staged;  /* bytes of host memory it counts in rp->staged */
	char *member;     /* a set's member: its name, for the reply (owned); NULL: a single pull */
	TAILQ_ENTRY(serve) link;
};

/* One peer as remote attach sees it (peer->data). */
struct rpeer {
	struct remote *rm;
	struct peer *p;
	struct xport_ep *ep; /* to its worker, made when its address comes; NULL: none */
	void *addr;          /* its worker's address (owned); NULL until it came */
	size_t addr_len;
	uint64_t epoch; /* connections up so far */
	bool up;
	struct reg_client rc; /* A: owns the pull leases of this connection */
	bool rc_live;
	uint64_t inflight; /* bytes being sent to it */
	uint64_t staged;   /* host memory holding copies of GPU tensors being served to it */
	unsigned n_serves;
	TAILQ_HEAD(, serve) serves;
	void *watched; /* A: tsearch tree of names it holds replicas of (owned strings) */
	unsigned n_watched;
	/* B: PeerSyncs sent and answered (their seq), and the attaches waiting on one. */
	uint64_t sync_sent, sync_heard;
	LIST_HEAD(, pwait) syncs;
};

/*
 * B: a client's attach of an '@' name, waiting on a pull, or on a sync
 * (rpeer.syncs: served from the replica once B has heard from A after it
 * began; docs/remote.md, "Freshness").
 */
struct pwait {
	struct client *cl;
	uint64_t id, have_id;
	char name[TENSORD_NAME_MAX + 1]; /* "@a/m/w" */
	uint64_t after;
	int64_t timeout_ms;
	uint64_t arrived;     /* rm->tick when it came: pulls asked before are too old for it */
	uint64_t sync_seq;    /* in rpeer.syncs: the PeerSync whose reply it waits for */
	bool late;            /* joined a pull asked before it came: synced again at its end */
	uint64_t deadline_ns; /* a wait's end, each attach its own; 0: none (forever) */
	size_t n_have_shares;
	uint64_t *have_shares; /* owned: slabs whose descriptor the client holds */
	LIST_ENTRY(pwait) link;
};

/* B: one pull. */
struct pull {
	struct remote *rm;
	struct rpeer *rp;
	uint64_t id;
	char name[TENSORD_NAME_MAX + 1]; /* "@a/m/w" */
	size_t name_len, peer_len;
	enum { PL_ASKING, PL_RECEIVING, PL_WAITING } st; /* waiting: A said not yet */
	bool wait;      /* an attach with a timeout or after: not yet is not an error */
	uint64_t after; /* nonzero: only a generation newer */
	/*
	 * A waiting pull (PL_WAITING): A watches the name for this node
	 * (wait_watched: told of its next change; else asked again at
	 * reask_ns); told: A told of a change, ask again; linger_ns: when a
	 * pull nobody waits on any more ends (0: someone waits), so that the
	 * next wait of the same name and after (the Python client's next
	 * 100 ms slice) asks A nothing (issue 30 item 8).
	 */
	bool wait_watched, told;
	uint64_t reask_ns, linger_ns;
	bool dead;    /* failed with its receive posted: waits for that to end */
	bool posted;  /* UCX has the mapping */
	bool watched; /* A tells of the name's next change */
	bool stale;   /* A told of a change after its reply: not kept as watched */
	uint64_t lease, generation, nbytes;
	struct tensor *t; /* the replica being made: borrowed, valid while lease lives */
	bool gpu;         /* a GPU replica: received into host memory (map), then copied in */
	bool filled;      /* a GPU replica's bytes are on its device */
	bool in_host;     /* a GPU replica's bytes are all in map (inline, or received) */
	bool allocating;  /* a GPU replica's memory is being allocated (pl->job) */
	struct gjob *job; /* a GPU worker job of its under way; NULL: none */
	void *map;        /* owned */
	size_t map_len;
	size_t pop_off; /* populated ahead of UCX up to here (populate_step) */
	uint64_t started_ns;
	uint64_t asked; /* rm->tick when it last asked A */
	uv_timer_t timer;
	LIST_HEAD(, pwait) waits;
	LIST_ENTRY(pull) link;
	struct spull *set; /* a set's member; NULL: a pull of its own */
	bool done;         /* a set's member whose bytes are in: it waits for the others */
};

/* B: one set pull (docs/remote.md, "Sets"). */
struct spull {
	struct remote *rm;
	struct rpeer *rp;
	uint64_t id;           /* its members' pull ids follow: id+1 .. */
	struct client *cl;     /* NULL once its connection closed: the set is published anyway */
	uint64_t req_id;       /* cl's AttachMany */
	uint64_t *have_shares; /* cl's slabs, as its request said (owned) */
	size_t n_have_shares;
	char what[300]; /* "set '@a/m/' of node a", for errors and logs */
	char **names;   /* a list: the names asked for, on A (owned) */
	size_t n_names;
	char prefix[TENSORD_NAME_MAX + 1]; /* with no names: A's prefix */
	uint32_t tx;                       /* the transaction of rm->rc its replicas are made in */
	enum { SP_ASKING, SP_PULLING } st;
	uint32_t count, n_done; /* members, and those whose bytes are in */
	struct pull **members;  /* count of them (owned array) */
	uint64_t commit_a;      /* the set's commit on A */
	uint64_t started_ns;
	uv_timer_t timer; /* the answer's deadline */
	LIST_ENTRY(spull) link;
};

/* B: a replica this daemon published. */
struct replica {
	char name[TENSORD_NAME_MAX + 1];
	size_t name_len;
	struct rpeer *rp;
	uint64_t tensor_id, generation, nbytes;
	uint64_t idle_since_ns; /* 0 while leased */
	bool watched;           /* the peer tells of a change: served without asking */
	LIST_ENTRY(replica) link;
};

struct remote {
	struct remote_env *env; /* borrowed: outlives this */
	struct xport *x;
	char why[300];        /* why there is no data path */
	struct reg_client rc; /* B: creates the replicas */
	uint64_t next_id;     /* ids when the random source fails */
	uint64_t tick;        /* orders attaches' arrivals and pulls' questions */
	LIST_HEAD(, pull) pulls;
	LIST_HEAD(, replica) replicas;
	LIST_HEAD(, spull) sets;
	LIST_HEAD(, rlist) lists; /* B: clients' lists of a peer's names, asked of it */
	void *replica_index;      /* tsearch tree of the replicas, by name */
	unsigned n_sets;
	uint32_t next_tx;
	struct remote_figures *figs; /* the daemon's gauges (env->figs), kept here */
	uint64_t max_replica_bytes;  /* --peer-max-replica-bytes, or its default resolved */
	uv_timer_t keep;
	uv_idle_t populate; /* active while a mapping of a transfer is not populated yet */
	bool no_populate;   /* MADV_POPULATE_* unknown to this kernel (before 5.14) */
	bool stopping;
	LIST_HEAD(, gjob) jobs; /* on the GPU worker */
	int open_handles;
};

/*
 * A GPU worker job of remote attach's (docs/remote.md, "GPU tensors across
 * nodes"): A copies a GPU tensor out to host memory before serving it
 * (GJ_STAGE); B allocates a GPU replica (GJ_ALLOC) and copies the bytes it
 * received into it (GJ_FILL). Whoever it works for may end first: it then
 * only frees. Done on the loop by gjob_done().
 */
struct gjob {
	struct remote *rm; /* NULL once remote attach stopped: then it only frees */
	struct registry *reg;
	enum { GJ_STAGE, GJ_ALLOC, GJ_FILL } kind;
	struct serve *s;            /* GJ_STAGE: NULL once the serve ended */
	struct pull *pl;            /* GJ_ALLOC, GJ_FILL: NULL once the pull ended */
	struct reg_alloc_job alloc; /* GJ_ALLOC */
	/*
	 * The copies': the tensor's allocation, by value: the tensor may go
	 * while the copy runs, its memory not (its free queues behind).
	 */
	struct backend_alloc a;
	void *buf; /* the host side of a copy (an anonymous mapping): the job's */
	size_t len;
	uint64_t staged; /* GJ_STAGE whose serve ended: bytes still in remote_staged_bytes */
	uint64_t queued_ns, ran_ns, done_ns; /* CLOCK_MONOTONIC: submitted, started, ended */
	int status;
	LIST_ENTRY(gjob) link; /* rm->jobs */
};

/* --- remote.c: what every part uses ------------------------------------------------- */

/* Answers request id (of kind) of cl with status and why, through dispatch (remote.h). */
static inline void rm_reply_status(const struct remote_env *env, struct client *cl, unsigned kind,
				   uint64_t id, int status, const char *why)
{
	env->hooks.reply_status(cl, kind, id, status, why);
}

/* Sends f to rp's peer; a connection that is down is logged, not an error. */
void rm_send_frame(struct rpeer *rp, Tensord__PeerFrame *f);

/* strcmp() for tsearch trees of names: a peer's watched names, the replicas by name. */
int rm_name_cmp(const void *a, const void *b);

/* Queues j for the GPU worker: 0, or -ENOMEM with nothing queued (j is the caller's). */
int rm_gjob_submit(struct remote *rm, struct gjob *j);

/* Host memory for a copy of a GPU tensor: an anonymous mapping, or NULL (errno). */
void *rm_stage_map(size_t len);

/* A mapping of a transfer waits to be populated: populate_step() runs on the loop. */
void rm_populate_kick(struct remote *rm);

/* --- remote_serve.c: A, a pull served ------------------------------------------------ */

/* Ends s: unmaps (never while UCX reads it) and ends its lease (if its connection lives). */
void rm_serve_end(struct serve *s);

/* Starts rp's queued sends, in order, within --peer-max-inflight. */
void rm_serve_start_queued(struct rpeer *rp);

/* The copy of j->s's GPU tensor ended (on the loop): the reply goes, or why not. */
void rm_serve_staged(struct gjob *j);

/* Whether rp's uid (REMOTE_PEER_UID) may read the published name: 0, or -EACCES and why. */
int rm_pull_may_read(struct rpeer *rp, const char *name, size_t len, char *why, size_t why_len);

/* Whether t may be served to a peer: 0, or -errno with the reason naming it. */
int rm_serve_check(const struct remote_env *env, const struct tensor *t, char *why, size_t why_len);

/*
 * Serves pull id of t, which rp->rc's lease holds (the serve's now; on
 * failure it is released and the pull refused); member: a set's member's
 * name, for its reply, or NULL.
 */
void rm_serve_reply(struct rpeer *rp, uint64_t id, struct tensor *t, uint64_t lease,
		    const char *member);

/* A's handlers of B's frames. m is borrowed for the call. */
void rm_on_pull(struct rpeer *rp, const Tensord__PeerPull *m);
void rm_on_pull_go(struct rpeer *rp, uint64_t id);
void rm_on_pull_done(struct rpeer *rp, uint64_t id);

/* --- remote_serve_set.c: A, a set pull served ---------------------------------------- */

void rm_on_set_pull(struct rpeer *rp, const Tensord__PeerSetPull *m);

/* --- remote_watch.c: A, the names a peer holds replicas of --------------------------- */

/* rp will be told of name's next change: true, or false when it watches too many. */
bool rm_watch_add(struct rpeer *rp, const char *name);

/* rp watches no name of this node's any more. */
void rm_watch_clear(struct rpeer *rp);

void rm_on_unwatch(struct rpeer *rp, const Tensord__PeerUnwatch *m);

/* --- remote_pull.c: B, pulling ------------------------------------------------------- */

void rm_pwait_free(struct pwait *w);

struct pull *rm_pull_by_id(struct remote *rm, uint64_t id);

/* The live pull of name, or NULL. */
struct pull *rm_pull_by_name(struct remote *rm, const char *name);

/*
 * A pull of name asking A or receiving (a replica of it may be on its way
 * out), or NULL; a wait A said "not yet" to is none: it changes nothing.
 */
struct pull *rm_pull_busy(struct remote *rm, const char *name);

/* A pull of name that an attach without a wait may join (one waits for none), or NULL. */
struct pull *rm_pull_joinable(struct remote *rm, const char *name);

/* The first of n pull ids free in a row, 64 random bits (a set takes its own and its members'). */
uint64_t rm_pull_new_ids(struct remote *rm, uint64_t n);
/* One pull id: rm_pull_new_ids(rm, 1). */
uint64_t rm_pull_new_id(struct remote *rm);

void rm_pull_free(struct pull *pl);

/*
 * Ends failed pull pl, its waiting attaches answered with status and why:
 * the replica being made is discarded (a set's member: by the abort of its
 * set's transaction, before this); A is told to end its lease. The mapping
 * stays while UCX may write it.
 */
void rm_pull_end_failed(struct pull *pl, int status, const char *why);

/*
 * pl failed: every attach waiting on it gets status and "peer P: tensor
 * 'N': <reason>"; a set's member fails its whole set with those words.
 */
void __attribute__((format(printf, 3, 4)))
rm_pull_fail(struct pull *pl, int status, const char *fmt, ...);

/*
 * Every attach waiting on pl gets a lease on its replica (never bound), but
 * one that came after pl asked A, which first hears from A (a sync).
 */
void rm_answer_local(struct pull *pl, bool watched);

/* Pull{id, name, have_generation} to A (pl->asked set): peer_send()'s 0 or -errno. */
int rm_pull_ask(struct pull *pl, uint64_t have_generation);

/* B has memory ready for pl's bytes: PullGo, and A sends them. */
void rm_pull_go(struct pull *pl);

/* The bytes are in place: the replica is sealed, published and handed out. */
void rm_pull_complete(struct pull *pl);

/* B's handler of A's PullReply: 0, or -errno with why (the peer's connection then closes). */
int rm_on_pull_reply(struct rpeer *rp, const Tensord__PeerPullReply *m, char *why, size_t why_len);

/* pl is making its replica: its bytes coming, or (a GPU replica) its memory or copy. */
static inline void rm_pull_assert_receiving(const struct pull *pl)
{
	assert(pl->st == PL_RECEIVING && !pl->dead);
	assert(pl->t && (!pl->posted || pl->map));
	assert(!pl->allocating || (pl->gpu && pl->job));
	(void)pl;
}

/* --- remote_pull_gpu.c: B, GPU replicas ---------------------------------------------- */

/*
 * pl's replica t is on a GPU: registry_create() left its memory to the GPU
 * worker; the bytes (nbytes) are received into host memory meanwhile (or
 * were inline in m), and copied in once both are there.
 */
void rm_pull_gpu_begin(struct pull *pl, const Tensord__PeerPullReply *m, struct tensor *t,
		       uint64_t nbytes);

/* pl's GPU replica's memory is allocated, or its bytes copied in (on the loop). */
void rm_pull_allocated(struct gjob *j);
void rm_pull_filled(struct gjob *j);

/* --- remote_wait.c: B, waiting pulls ------------------------------------------------- */

/* How long a waiting pull nobody waits on stays for the next wait (ms). */
#define REMOTE_WAIT_LINGER_MS 1000u

/*
 * A said not yet: wait for its PeerChanged of the name (watched), or ask
 * again in a second (not watched), each attach at most until its own deadline.
 */
void rm_pull_wait(struct pull *pl, bool watched);

/*
 * pl waits (PL_WAITING): its waits past their deadline end; with none
 * left it lingers, then ends; A is asked again when it told of a change,
 * or (A not watching) every second; the timer is set for the next of these.
 */
void rm_pull_wait_arm(struct pull *pl);

/*
 * A waiting pull that a new wait of the same name and after may join (A
 * watches the name for this node), or NULL.
 */
struct pull *rm_pull_wait_joinable(struct remote *rm, const char *name, uint64_t after);

/*
 * A waiting pull nobody waits on any more lingers (REMOTE_WAIT_LINGER_MS)
 * for the next wait of its name, then ends (A holds nothing for it).
 */
void rm_pull_unwanted(struct pull *pl);

/* A pull's timer: a wait asks again, anything else has taken too long. */
void rm_on_pull_timeout(uv_timer_t *t);

/* --- remote_replica.c: B, the replicas ----------------------------------------------- */

/* Replicas by name, counted in the figures and their peer's; dropped: unlinked and forgotten. */
struct replica *rm_replica_find(struct remote *rm, const char *name);
void rm_noop_free(void *node);
void rm_replica_count(struct remote *rm, const struct replica *r, int n, int64_t delta);
bool rm_replica_link(struct remote *rm, struct replica *r);
void rm_replica_unlink(struct remote *rm, struct replica *r);
void rm_replica_drop(struct remote *rm, struct replica *r, const char *why);

/*
 * Room for a replica of nbytes from rp within its share
 * (--peer-max-replica-bytes), its unleased replicas unlinked oldest first:
 * 0, or -EDQUOT with the reason in why.
 */
int rm_replica_share_room(struct remote *rm, struct rpeer *rp, uint64_t nbytes, char *why,
			  size_t why_len);

/* B no longer holds r: A need not tell of its changes (unless a pull is on the way). */
void rm_unwatch_send(struct remote *rm, struct replica *r);

/* B's handler of A's PeerChanged: 0, or -errno with why (the connection then closes). */
int rm_on_changed(struct rpeer *rp, const Tensord__PeerChanged *m, char *why, size_t why_len);

/* --- remote_attach.c: B, a client's attach of "@PEER/NAME" --------------------------- */

/*
 * The connected peer named peer for a request (kind, id) of cl about
 * `what` ("tensor '@a/x'"), or NULL with the request answered: no such
 * peer, not connected, or no data path to it.
 */
struct rpeer *rm_rpeer_ready(struct remote_env *env, struct client *cl, unsigned kind, uint64_t id,
			     const char *what, const char *peer);

/* w hears from A first: a PeerSync goes, w waits in rp->syncs for its reply. */
void rm_sync_park(struct rpeer *rp, struct pwait *w);

/* A answered PeerSync seq: the attaches that waited for it go on. */
void rm_on_sync_reply(struct rpeer *rp, uint64_t seq);

/* A: B asks whether it has heard everything: the reply goes at once. */
void rm_on_sync(struct rpeer *rp, uint64_t seq);

/* rp's attaches waiting on a sync: failed (connection lost), or cl's / req_id's gone. */
void rm_syncs_fail(struct rpeer *rp, int status, const char *reason);
void rm_syncs_client_gone(struct rpeer *rp, struct client *cl);
int rm_syncs_cancel(struct rpeer *rp, struct client *cl, uint64_t req_id);

/* --- remote_list.c: listing what a peer exports --------------------------------------- */

/* B: one client's List of "@PEER/PREFIX", asked of the peer. */
struct rlist {
	struct remote *rm;
	struct rpeer *rp;
	struct client *cl;
	uint64_t req_id, id;
	char peer_prefix[PEER_NAME_MAX + 3]; /* "@a/" */
	uv_timer_t timer;                    /* the answer's deadline */
	LIST_ENTRY(rlist) link;
};

void rm_on_list(struct rpeer *rp, const Tensord__PeerNameList *m);
int rm_on_list_reply(struct rpeer *rp, const Tensord__PeerNameListReply *m, char *why,
		     size_t why_len);

/* rp's lists under way fail (its connection lost); cl's are forgotten (it closed). */
void rm_lists_fail(struct remote *rm, struct rpeer *rp, int status, const char *reason);
void rm_lists_client_gone(struct remote *rm, struct client *cl);

/* --- remote_set.c: B, pulling a set -------------------------------------------------- */

/*
 * sp failed (why names the peer, the member when one failed, and the
 * reason): cl's AttachMany gets it; the transaction holding the replicas
 * made so far is aborted, so that none is ever seen; every member's pull
 * ends as a failed pull does.
 */
void rm_set_fail(struct spull *sp, int status, const char *why);

/*
 * Names set member pl from its PullReply (A's name m->name): 0, or -errno
 * with pl failed.
 */
int rm_set_member_named(struct pull *pl, const Tensord__PeerPullReply *m);

/* Every member's bytes are in: the replicas published in one commit. */
void rm_set_publish(struct spull *sp);

int rm_on_set_pull_reply(struct rpeer *rp, const Tensord__PeerSetPullReply *m, char *why,
			 size_t why_len);

#endif
