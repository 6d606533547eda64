/*
 * The quarantine (docs/gpu.md, "When a connection ends with legacy IPC
 * leases"): memory that a connection's legacy IPC leases held when it
 * ended, kept (struct reg_hold, registry.h) until the client's process has
 * exited, since that process may still have it open. This module watches
 * those processes and ends their holds with registry_hold_end() when they
 * are gone.
 *
 * A process is watched through a pidfd, polled on the loop: it becomes
 * readable when the process exits (as a zombie: its descriptors, and with
 * them its GPU contexts, are closed by then), and no pid reused meanwhile
 * can be taken for it. The caller hands over the one the socket names
 * (SO_PEERPIDFD: the very process that connected); without it,
 * pidfd_open(pid). Where no pidfd can be had (Linux before 5.3, or no
 * descriptor to spare outside the root reserve) a timer looks every
 * QUARANTINE_POLL_MS at /proc/PID/stat, whose start time tells a reused
 * pid, or at kill(pid, 0) where there is no /proc. Every error leans to
 * keeping the memory: a process that cannot be told gone is waited for.
 * One watch per process, however many of its connections ended; each adds
 * its hold.
 *
 * Runs on the loop thread. Knows the registry and the loop, not sockets.
 */
#ifndef TENSORD_QUARANTINE_H
#define TENSORD_QUARANTINE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <uv.h>

#include "daemon/registry/registry.h"

/* How often processes watched without a pidfd are looked at. */
#define QUARANTINE_POLL_MS 1000

struct qproc;
struct quota;

struct quarantine {
	uv_loop_t *loop;
	struct registry *reg; /* borrowed: whose holds these are */
	/* Borrowed; NULL: not asked. A pidfd is opened only while the
	 * client's uid may have one more descriptor (the root reserve). */
	struct quota *quota;
	LIST_HEAD(, qproc) procs; /* owned: every process watched */
	unsigned n_procs;         /* the figure quarantined_processes */
	unsigned n_polled;        /* of those, watched by the timer */
	uv_timer_t timer;         /* looks at the polled ones */
	bool stopping;            /* quarantine_fini() ran: holds end at once */
	bool no_pidfd;            /* never open a pidfd (tests of the timer's way) */
};

void quarantine_init(struct quarantine *q, uv_loop_t *loop, struct registry *reg,
		     struct quota *quota);

/*
 * Keeps h (from registry_client_hold()) until its client's process,
 * h->pid, has exited, then ends it; at once when the process is gone
 * already, or cannot be watched at all (pid 0: a process in a pid
 * namespace the daemon does not see, which could not have opened a
 * legacy IPC handle of the daemon's either), or after quarantine_fini().
 * Takes ownership of pidfd, a pidfd of that process or -errno when the
 * caller has none: closed on every path.
 */
void quarantine_add(struct quarantine *q, struct reg_hold *h, int pidfd);

/*
 * The daemon stops: ends every hold now (its exit frees its GPU memory
 * anyway) and closes the handles, whose memory goes when the loop runs
 * their close callbacks.
 */
void quarantine_fini(struct quarantine *q);

#endif /* TENSORD_QUARANTINE_H */
