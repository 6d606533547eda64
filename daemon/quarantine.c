/*
 * The quarantine: legacy IPC memory kept until the client process that may
 * still have it open has exited (quarantine.h says how it is watched).
 */
#include "quarantine.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/base/quota.h"

/* One client process whose exit ends the holds of its connections. */
struct qproc {
	struct quarantine *q;
	uint32_t pid;
	int pidfd;                /* owned; -1: none, the timer looks at the process */
	bool polled;              /* the timer looks at it (no pidfd, or its poll failed) */
	unsigned long long start; /* its start time in /proc/PID/stat; 0: unknown */
	uv_poll_t poll;           /* on pidfd, when it is one */
	struct reg_hold **holds;  /* owned array; the holds are the registry's */
	unsigned n_holds, cap_holds;
	LIST_ENTRY(qproc) link; /* quarantine.procs */
};

static int pidfd_open_(uint32_t pid)
{
#ifdef SYS_pidfd_open
	int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);

	return fd < 0 ? -errno : fd;
#else
	return -ENOSYS;
#endif
}

/* Whether the process of pidfd has exited: its pidfd is readable. */
static bool pidfd_exited(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

/*
 * What /proc/PID/stat says of pid: 1 when it runs (its start time, field
 * 22, in *ret_start), 0 when it has exited (a zombie), -errno when /proc
 * cannot say (no such entry: gone, or hidden from us by hidepid).
 */
static int proc_stat(uint32_t pid, unsigned long long *ret_start)
{
	char path[32], buf[1024], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n < 0)
		n = -errno;
	close(fd);
	if (n <= 0)
		return n < 0 ? (int)n : -EIO;
	buf[n] = '\0';
	/* The name may hold anything, parentheses too: read after its last ')'. */
	p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || !p[2])
		return -EINVAL;
	if (p[2] == 'Z' || p[2] == 'X' || p[2] == 'x')
		return 0;
	/* From the state (field 3) to the start time (field 22). */
	p += 2;
	for (int i = 0; i < 19 && p; i++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p)
		return -EINVAL;
	*ret_start = strtoull(p, NULL, 10);
	return 1;
}

/*
 * Whether a process watched without a pidfd still runs. Gone only when
 * the kernel says so: kill() finds no such process, /proc shows it a
 * zombie, or another process with another start time has its pid now.
 */
static bool polled_alive(const struct qproc *p)
{
	unsigned long long start = 0;
	int r;

	if (kill((pid_t)p->pid, 0) < 0 && errno == ESRCH)
		return false;
	r = proc_stat(p->pid, &start);
	if (r == 0)
		return false;
	return !(r == 1 && p->start && start != p->start);
}

static bool proc_alive(const struct qproc *p)
{
	return p->pidfd >= 0 ? !pidfd_exited(p->pidfd) : polled_alive(p);
}

static void on_closed(uv_handle_t *h)
{
	struct qproc *p = h->data;

	close(p->pidfd);
	free(p);
}

/* Ends every hold of p's connections, and p: its process exited, or the daemon stops. */
static void proc_end(struct qproc *p, bool exited)
{
	struct quarantine *q = p->q;
	unsigned leases = 0;
	uint64_t bytes = 0;

	for (unsigned i = 0; i < p->n_holds; i++) {
		leases += p->holds[i]->n;
		bytes += p->holds[i]->bytes;
		registry_hold_end(q->reg, p->holds[i]);
	}
	if (exited)
		log_info("pid %u exited: ended the %u legacy IPC lease%s of %u connection%s it "
			 "may have had open (%llu bytes kept since); what nothing else holds is "
			 "freed",
			 p->pid, leases, leases == 1 ? "" : "s", p->n_holds,
			 p->n_holds == 1 ? "" : "s", (unsigned long long)bytes);
	free(p->holds);
	LIST_REMOVE(p, link);
	q->n_procs--;
	if (p->polled && --q->n_polled == 0)
		uv_timer_stop(&q->timer);
	if (p->pidfd >= 0)
		uv_close((uv_handle_t *)&p->poll, on_closed);
	else
		free(p);
}

/* Adds h to p's holds. 0 or -ENOMEM. */
static int proc_hold(struct qproc *p, struct reg_hold *h)
{
	if (p->n_holds == p->cap_holds) {
		unsigned cap = p->cap_holds ? 2 * p->cap_holds : 2;
		struct reg_hold **nv = realloc(p->holds, cap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		p->holds = nv;
		p->cap_holds = cap;
	}
	p->holds[p->n_holds++] = h;
	return 0;
}

static void on_timer(uv_timer_t *t)
{
	struct quarantine *q = t->data;
	struct qproc *p, *next;

	for (p = LIST_FIRST(&q->procs); p; p = next) {
		next = LIST_NEXT(p, link);
		if (p->polled && !proc_alive(p))
			proc_end(p, true);
	}
}

/* From now on the timer looks at p. */
static void proc_poll_by_timer(struct qproc *p)
{
	struct quarantine *q = p->q;

	p->polled = true;
	if (q->n_polled++ == 0)
		uv_timer_start(&q->timer, on_timer, QUARANTINE_POLL_MS, QUARANTINE_POLL_MS);
}

static void on_pidfd(uv_poll_t *h, int status, int events)
{
	struct qproc *p = h->data;

	if (pidfd_exited(p->pidfd)) {
		proc_end(p, true);
		return;
	}
	if (status < 0) {
		/* Never seen: keep the memory, and ask the timer instead. */
		log_warn("pid %u: watching its pidfd failed: %s; polling it instead", p->pid,
			 uv_strerror(status));
		uv_poll_stop(h);
		proc_poll_by_timer(p);
	}
}

/* The watch of pid's process, if there is one and the process has not exited. */
static struct qproc *proc_find(struct quarantine *q, uint32_t pid)
{
	struct qproc *p;

	LIST_FOREACH(p, &q->procs, link)
	if (p->pid == pid)
		break;
	/* A pid is one live process at a time; an exited one's holds end now. */
	if (p && !proc_alive(p)) {
		proc_end(p, true);
		p = NULL;
	}
	return p;
}

/* Ends h at once: its process is gone, or cannot be watched. */
static void end_now(struct quarantine *q, struct reg_hold *h, const char *why)
{
	log_debug("pid %u: %s: its %u legacy IPC lease%s end now", h->pid, why, h->n,
		  h->n == 1 ? "" : "s");
	registry_hold_end(q->reg, h);
}

void quarantine_add(struct quarantine *q, struct reg_hold *h, int pidfd)
{
	struct qproc *p = NULL;

	if (q->stopping) {
		if (pidfd >= 0)
			close(pidfd);
		end_now(q, h, "the daemon stops");
		return;
	}
	/* pid 0: the process is in a pid namespace we cannot see into. */
	if (h->pid && (p = proc_find(q, h->pid)) && proc_hold(p, h) == 0) {
		if (pidfd >= 0)
			close(pidfd);
		return;
	}
	if (pidfd >= 0 && q->no_pidfd) {
		close(pidfd);
		pidfd = -ENOSYS;
	}
	if (pidfd < 0 && h->pid && !q->no_pidfd && (!q->quota || quota_fd_room(q->quota, h->uid)))
		pidfd = pidfd_open_(h->pid);
	if (pidfd == -ESRCH) {
		end_now(q, h, "exited already");
		return;
	}
	if (pidfd >= 0 && pidfd_exited(pidfd)) {
		close(pidfd);
		end_now(q, h, "exited already");
		return;
	}
	if (pidfd < 0 && !h->pid) {
		log_warn("conn %llu: its client's process is in another pid namespace and cannot "
			 "be watched: the memory of its %u legacy IPC lease%s is freed now (such "
			 "a process cannot open the daemon's IPC handles)",
			 (unsigned long long)h->conn_id, h->n, h->n == 1 ? "" : "s");
		registry_hold_end(q->reg, h);
		return;
	}
	p = calloc(1, sizeof(*p));
	if (!p || proc_hold(p, h) < 0) {
		free(p);
		if (pidfd >= 0)
			close(pidfd);
		log_error("pid %u: out of memory to watch the process: the memory of its %u legacy "
			  "IPC lease%s is freed now, while it may still have it open",
			  h->pid, h->n, h->n == 1 ? "" : "s");
		registry_hold_end(q->reg, h);
		return;
	}
	p->q = q;
	p->pid = h->pid;
	p->pidfd = -1;
	if (pidfd >= 0) {
		p->poll.data = p;
		if (uv_poll_init(q->loop, &p->poll, pidfd) == 0) {
			p->pidfd = pidfd;
			uv_poll_start(&p->poll, UV_READABLE, on_pidfd);
		} else {
			close(pidfd);
		}
	}
	LIST_INSERT_HEAD(&q->procs, p, link);
	q->n_procs++;
	if (p->pidfd < 0) {
		/* Its start time now tells a process that takes the pid later. */
		if (proc_stat(p->pid, &p->start) != 1)
			p->start = 0;
		proc_poll_by_timer(p);
		if (!polled_alive(p))
			proc_end(p, true);
	}
}

void quarantine_init(struct quarantine *q, uv_loop_t *loop, struct registry *reg,
		     struct quota *quota)
{
	memset(q, 0, sizeof(*q));
	q->loop = loop;
	q->reg = reg;
	q->quota = quota;
	LIST_INIT(&q->procs);
	uv_timer_init(loop, &q->timer);
	q->timer.data = q;
}

void quarantine_fini(struct quarantine *q)
{
	unsigned n = q->n_procs;

	if (q->stopping)
		return;
	q->stopping = true;
	while (!LIST_EMPTY(&q->procs))
		proc_end(LIST_FIRST(&q->procs), false);
	if (n)
		log_info("stopping: ended the quarantine of %u client process%s", n,
			 n == 1 ? "" : "es");
	uv_close((uv_handle_t *)&q->timer, NULL);
}
