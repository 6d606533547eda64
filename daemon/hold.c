/*
 * tensord --hold DIR: the descriptor store without systemd (docs/restart.md,
 * section 6). A small process that outlives daemons: it keeps what a
 * daemon started with --holder DIR stores (the FDSTORE=1 / FDSTOREREMOVE=1
 * datagrams of sd_notify, on DIR/notify), and hands all of it to the next
 * daemon that asks on DIR/take.
 *
 * An upgrade drains: the daemon the store was handed to before, once it
 * said READY=1, is asked to drain (SIGUSR2) and says when it has
 * (TENSORD_DRAINED=1): from then on it records nothing and stores nothing,
 * and serves reads only. The store goes to the new daemon, and the old one
 * is stopped (SIGTERM) only when the new one says READY=1. One that does
 * not drain in time (hung, or a tensord from before the drain, which
 * ignores SIGUSR2) is stopped first, as before: SIGTERM, then SIGKILL. Two
 * daemons never change one state at once.
 *
 * Where something else manages the daemons ($TENSORD_HOLD_STOP_DRAINED=0:
 * a Kubernetes DaemonSet's rolling update), the drained daemon is not
 * stopped but left to that manager: stopped here, its container would be
 * restarted, and its daemon would take the store back and drain the one
 * that serves. Told again (SIGUSR2) once that one serves, it lets its
 * clients and peers go to it, and waits until its manager stops it (the
 * old pod's deletion), which changes nothing in the store.
 *
 * A plain poll() loop over two sockets and a signalfd: the process does
 * nothing else, and the event loop library would be more code than the
 * loop. DIR is made 0700 by the holder, and only its own uid (or root) is
 * served on either socket, since whoever takes the store gets every
 * tensor's memory. Notify datagrams carry their sender's pid
 * (SO_PASSCRED), so READY=1 and TENSORD_DRAINED=1 count only from the
 * daemon they are expected of.
 */
#include "hold.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/log.h"

/* At most this many descriptors are kept; past it a store is refused (logged). */
#define HOLD_MAX (1u << 20)
/* Descriptors in one hand-over message (the kernel's SCM_MAX_FD is 253). */
#define HOLD_BATCH 200
/* How long the daemon handed the store to before may take to exit when asked. */
#define HOLD_STOP_MS 30000
/* How long it may take to drain ($TENSORD_HOLD_DRAIN_MS overrides it; 0: no drain). */
#define HOLD_DRAIN_MS 10000
/* The most $TENSORD_HOLD_DRAIN_MS may say: a day (the wait counts in an unsigned). */
#define HOLD_DRAIN_MS_MAX 86400000

struct held {
	int fd;
	char name[256];
};

struct holder {
	struct held *v;
	size_t n, cap;
	pid_t owner;      /* the daemon the store was last handed to; 0: none */
	bool owner_ready; /* it said READY=1: it serves, and drains when asked */
	/* A daemon that drained for owner: stopped when owner says READY=1. */
	pid_t retiring;
	/* Without stop_drained: the drained daemon left running for its
	 * manager once owner served (leave()); 0: none. */
	pid_t left;
	unsigned drain_ms;
	bool stop_drained; /* $TENSORD_HOLD_STOP_DRAINED; 1 unless set to 0 */
	int notify, take, sig;
};

/* What one notify datagram said that the holder acts on, and who sent it. */
struct notice {
	pid_t pid; /* 0: unknown */
	bool ready, drained;
};

static int bind_at(const char *dir, const char *leaf, int type, struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	socklen_t len;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (fd < 0 || snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/%s", dir, leaf) >=
			      (int)sizeof(sa->sun_path)) {
		if (fd >= 0)
			close(fd);
		errno = ENAMETOOLONG;
		return -1;
	}
	unlink(sa->sun_path); /* a holder before us: DIR is ours (0700) */
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(sa->sun_path) + 1);
	if (bind(fd, (struct sockaddr *)sa, len) < 0 ||
	    (type == SOCK_SEQPACKET && listen(fd, 8) < 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

static void drop(struct holder *h, const char *name)
{
	for (size_t i = 0; i < h->n;) {
		if (strcmp(h->v[i].name, name) == 0) {
			close(h->v[i].fd);
			h->v[i] = h->v[--h->n];
		} else {
			i++;
		}
	}
}

/*
 * One sd_notify datagram: FDSTORE=1 with its descriptors, FDSTOREREMOVE=1
 * are done; READY=1 and TENSORD_DRAINED=1 are returned with the sender;
 * the rest is ignored.
 */
static struct notice on_notify(struct holder *h)
{
	char buf[4096], name[256] = "stored";
	union {
		char b[CMSG_SPACE(16 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct notice nt = { 0 };
	struct iovec iov = { buf, sizeof(buf) - 1 };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)
	};
	int fds[16], n_fds = 0;
	bool store = false, remove = false;
	ssize_t n = recvmsg(h->notify, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

	if (n < 0)
		return nt;
	buf[n] = '\0';
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
		    cm->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
			struct ucred cr;

			memcpy(&cr, CMSG_DATA(cm), sizeof(cr));
			nt.pid = cr.pid;
		}
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0;
			     i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) && n_fds < 16; i++)
				memcpy(&fds[n_fds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		if (strcmp(line, "FDSTORE=1") == 0)
			store = true;
		else if (strcmp(line, "FDSTOREREMOVE=1") == 0)
			remove = true;
		else if (strncmp(line, "FDNAME=", 7) == 0)
			snprintf(name, sizeof(name), "%s", line + 7);
		else if (strcmp(line, "READY=1") == 0)
			nt.ready = true;
		else if (strcmp(line, "TENSORD_DRAINED=1") == 0)
			nt.drained = true;
	}
	if (remove)
		drop(h, name);
	for (int i = 0; i < n_fds; i++) {
		if (!store || h->n >= HOLD_MAX) {
			if (store)
				log_warn("hold: %s: the store holds %u descriptors already; not "
					 "kept",
					 name, HOLD_MAX);
			close(fds[i]);
			continue;
		}
		if (h->n == h->cap) {
			size_t cap = h->cap ? 2 * h->cap : 256;
			struct held *v = realloc(h->v, cap * sizeof(*v));

			if (!v) {
				log_warn("hold: %s: out of memory; not kept", name);
				close(fds[i]);
				continue;
			}
			h->v = v;
			h->cap = cap;
		}
		h->v[h->n].fd = fds[i];
		snprintf(h->v[h->n].name, sizeof(h->v[h->n].name), "%s", name);
		h->n++;
	}
	return nt;
}

/* Whether pid has exited (it is not our child: it may be anyone's). */
static bool gone(pid_t pid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	if (kill(pid, 0) < 0)
		return errno == ESRCH;
	/* An exited daemon its parent has not reaped yet (a zombie) is gone
	 * too: nothing of it runs, and its parent is not the holder. */
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'Z';
}

/* Stops daemon pid and waits for it: SIGTERM, then SIGKILL past HOLD_STOP_MS. */
static void stop_daemon(struct holder *h, pid_t pid)
{
	struct timespec t = { 0, 10 * 1000000L };
	unsigned waited = 0;

	kill(pid, SIGTERM);
	while (!gone(pid)) {
		/* Its last FDSTORE datagrams are kept as they come. */
		on_notify(h);
		nanosleep(&t, NULL);
		waited += 10;
		if (waited == HOLD_STOP_MS) {
			log_warn("hold: daemon %d did not stop in %u ms; killing it", (int)pid,
				 HOLD_STOP_MS);
			kill(pid, SIGKILL);
		}
	}
}

/*
 * Asks the daemon pid to drain (SIGUSR2) and waits until it says it has,
 * keeping what it stores meanwhile: true once it drained; false when it
 * exited, or did not drain within h->drain_ms (then the caller stops it).
 * Its datagrams come in the order it sent them, so every store it made
 * before TENSORD_DRAINED=1 is kept when this returns.
 */
static bool drain_daemon(struct holder *h, pid_t pid, pid_t next)
{
	unsigned waited = 0;

	log_info("hold: daemon %d takes over: asking daemon %d to drain", (int)next, (int)pid);
	if (kill(pid, SIGUSR2) < 0)
		return false;
	for (;;) {
		struct pollfd p = { h->notify, POLLIN, 0 };

		if (poll(&p, 1, 10) > 0) {
			struct notice nt = on_notify(h);

			if (nt.drained && nt.pid == pid) {
				log_info("hold: daemon %d drained: it serves reads until daemon %d "
					 "serves",
					 (int)pid, (int)next);
				return true;
			}
			continue;
		}
		if (gone(pid)) {
			log_warn("hold: daemon %d exited while draining", (int)pid);
			return false;
		}
		waited += 10;
		if (waited >= h->drain_ms) {
			log_warn("hold: daemon %d did not drain in %u ms (hung, or a tensord from "
				 "before the drain); stopping it first",
				 (int)pid, h->drain_ms);
			return false;
		}
	}
}

/*
 * Before the store goes to next: the daemon it was handed to before (still
 * running) drains, or stops. One that never said READY=1 is stopped: it
 * may not even catch SIGUSR2 yet, and it serves nobody. A daemon that
 * drained earlier for a successor that died before it served stays
 * draining for this one.
 */
static void make_way(struct holder *h, pid_t next)
{
	pid_t old = h->owner;

	if (h->retiring && gone(h->retiring))
		h->retiring = 0;
	if (!old || old == next || gone(old))
		return;
	if (h->owner_ready && !h->retiring && h->drain_ms && drain_daemon(h, old, next)) {
		h->retiring = old;
		return;
	}
	if (gone(old))
		return;
	log_info("hold: daemon %d takes over: stopping daemon %d first", (int)next, (int)old);
	stop_daemon(h, old);
}

/*
 * The owner serves, and the drained daemon old is left running for its
 * manager ($TENSORD_HOLD_STOP_DRAINED=0): it serves its readers until that
 * manager stops it. One daemon is left at a time: one left before that
 * still runs (a third daemon of one store, which a DaemonSet with maxSurge
 * 1 does not start) is stopped now, as without the option.
 */
static void leave(struct holder *h, pid_t old)
{
	if (h->left && h->left != old && !gone(h->left)) {
		log_info("hold: stopping drained daemon %d: daemon %d is left drained now",
			 (int)h->left, (int)old);
		stop_daemon(h, h->left);
	}
	h->left = old;
	/* A second SIGUSR2: its clients and peers go to the daemon that
	 * serves, rather than read its frozen state until it is stopped (a
	 * tensord from before stop 41 ignores it, and serves them on). */
	kill(old, SIGUSR2);
	log_info("hold: daemon %d serves; leaving drained daemon %d to its manager, its clients "
		 "let go",
		 (int)h->owner, (int)old);
}

/*
 * From the main loop, without stop_drained: a left daemon its manager
 * stopped is forgotten. If the daemon the store was handed to exits (its
 * pod deleted, a crash, before or after it served), a drained daemon
 * still running for it (retiring or left) would serve reads on with
 * nobody taking writes, and its manager would never start it again: it is
 * stopped, so that its manager does, and that daemon takes the store.
 */
static void check_managed(struct holder *h)
{
	pid_t drained[2] = { h->retiring, h->left };

	if (h->left && gone(h->left)) {
		log_info("hold: drained daemon %d exited (stopped by its manager)", (int)h->left);
		h->left = 0;
	}
	if (!h->owner || !gone(h->owner))
		return;
	for (int i = 0; i < 2; i++) {
		if (!drained[i] || gone(drained[i]))
			continue;
		log_warn(
			"hold: daemon %d exited%s: stopping drained daemon %d, so that its manager "
			"starts it again and it takes the store",
			(int)h->owner, h->owner_ready ? "" : " before it served", (int)drained[i]);
		stop_daemon(h, drained[i]);
		log_info("hold: drained daemon %d exited", (int)drained[i]);
	}
	h->owner = 0;
	h->retiring = h->left = 0;
}

/* A notice from the main loop: the owner serves, so a drained daemon goes (or is left). */
static void on_notice(struct holder *h, struct notice nt)
{
	pid_t old = h->retiring;

	if (!nt.ready || !nt.pid || nt.pid != h->owner)
		return;
	h->owner_ready = true;
	if (!old)
		return;
	h->retiring = 0;
	if (gone(old)) {
		log_info("hold: daemon %d serves; drained daemon %d had exited already",
			 (int)h->owner, (int)old);
		return;
	}
	if (!h->stop_drained) {
		leave(h, old);
		return;
	}
	log_info("hold: daemon %d serves: stopping drained daemon %d", (int)h->owner, (int)old);
	stop_daemon(h, old);
	log_info("hold: drained daemon %d exited", (int)old);
}

/* Every datagram queued on the notify socket, in order. */
static void read_notices(struct holder *h)
{
	for (int i = 0; i < 4096; i++) {
		struct pollfd p = { h->notify, POLLIN, 0 };

		if (poll(&p, 1, 0) <= 0)
			break;
		on_notice(h, on_notify(h));
	}
}

/* Hands every kept descriptor to the daemon on connection c, in batches, then END=1. */
static void hand_over(struct holder *h, int c)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 ||
	    (cr.uid != getuid() && cr.uid != 0)) {
		log_warn("hold: a take from uid %d refused: only uid %d's daemon gets the store",
			 (int)cr.uid, (int)getuid());
		return;
	}
	/* Whether the daemon before said READY=1 (it may have, just now). */
	read_notices(h);
	make_way(h, cr.pid);
	/* What the old daemon sent before it exited or drained, still queued. */
	read_notices(h);
	for (size_t at = 0; at < h->n; at += HOLD_BATCH) {
		size_t k = h->n - at < HOLD_BATCH ? h->n - at : HOLD_BATCH;
		union {
			char b[CMSG_SPACE(HOLD_BATCH * sizeof(int))];
			struct cmsghdr align;
		} u;
		char *names = malloc(k * 257 + 8);
		size_t off = 0;
		struct iovec iov;
		struct msghdr mh = { .msg_iov = &iov,
				     .msg_iovlen = 1,
				     .msg_control = u.b,
				     .msg_controllen = CMSG_SPACE(k * sizeof(int)) };
		struct cmsghdr *cm;

		if (!names)
			return;
		for (size_t i = 0; i < k; i++)
			off += (size_t)sprintf(names + off, "%s%s", i ? ":" : "",
					       h->v[at + i].name);
		iov = (struct iovec){ names, off + 1 };
		memset(&u, 0, sizeof(u));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(k * sizeof(int));
		for (size_t i = 0; i < k; i++)
			memcpy(CMSG_DATA(cm) + i * sizeof(int), &h->v[at + i].fd, sizeof(int));
		if (sendmsg(c, &mh, MSG_NOSIGNAL) < 0) {
			log_warn("hold: handing the store to daemon %d: %s", (int)cr.pid,
				 strerror(errno));
			free(names);
			return;
		}
		free(names);
	}
	if (send(c, "", 1, MSG_NOSIGNAL) == 1) { /* an empty name list: the end */
		h->owner = cr.pid;
		h->owner_ready = false;
		log_info("hold: handed %zu descriptors to daemon %d", h->n, (int)cr.pid);
	}
}

/*
 * The number in $name, at most max; def when it is unset or empty; -1 when
 * it is anything else, with the reason on stderr: a holder that guessed
 * would drain or stop daemons other than its operator meant.
 */
static long env_number(const char *dir, const char *name, unsigned long def, unsigned long max,
		       const char *meaning)
{
	const char *v = getenv(name);
	unsigned long n;
	char *end;

	if (!v || !*v)
		return (long)def;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (v[0] < '0' || v[0] > '9' || *end || errno || n > max) {
		fprintf(stderr, "tensord --hold %s: $%s is '%s': it must be %s\n", dir, name, v,
			meaning);
		return -1;
	}
	return (long)n;
}

int hold_main(const char *dir)
{
	struct holder h = { 0 };
	struct sockaddr_un sa;
	struct stat st;
	sigset_t set;
	long drain_ms = env_number(dir, "TENSORD_HOLD_DRAIN_MS", HOLD_DRAIN_MS, HOLD_DRAIN_MS_MAX,
				   "a number of milliseconds up to 86400000 (0: no drain)");
	long stop_drained = env_number(dir, "TENSORD_HOLD_STOP_DRAINED", 1, 1,
				       "0 (leave a drained daemon to its manager) or 1 (stop it "
				       "once the new one serves, the default)");
	int on = 1;

	if (drain_ms < 0 || stop_drained < 0)
		return 1;
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "tensord --hold %s: %s\n", dir, strerror(errno));
		return 1;
	}
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
	    (st.st_mode & 077)) {
		fprintf(stderr,
			"tensord --hold %s: must be a directory of uid %d that only it can "
			"enter (mode 0700): whoever reaches it gets every tensor's memory\n",
			dir, (int)getuid());
		return 1;
	}
	h.notify = bind_at(dir, "notify", SOCK_DGRAM, &sa);
	h.take = h.notify < 0 ? -1 : bind_at(dir, "take", SOCK_SEQPACKET, &sa);
	if (h.take < 0 || setsockopt(h.notify, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) < 0) {
		fprintf(stderr, "tensord --hold %s: %s\n", dir, strerror(errno));
		return 1;
	}
	h.drain_ms = (unsigned)drain_ms;
	h.stop_drained = stop_drained == 1;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	h.sig = signalfd(-1, &set, SFD_CLOEXEC);
	log_info("hold: keeping tensord's descriptors in %s (daemons: --holder %s)%s", dir, dir,
		 h.stop_drained ? "" : "; a drained daemon is left to its manager");
	for (;;) {
		struct pollfd p[3] = { { h.notify, POLLIN, 0 },
				       { h.take, POLLIN, 0 },
				       { h.sig, POLLIN, 0 } };

		/* While a drained daemon waits for its successor to serve, whether
		 * that one died first is looked at every 100 ms; while one is left
		 * to its manager, whether it or the one that serves exited. */
		if (poll(p, 3, h.retiring || h.left ? 100 : -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents & POLLIN)
			read_notices(&h);
		if (h.stop_drained && h.retiring && h.owner && gone(h.owner)) {
			log_warn(
				"hold: daemon %d exited before it served; drained daemon %d serves "
				"reads on until the next daemon takes the store (start one: "
				"tensord "
				"--holder %s)",
				(int)h.owner, (int)h.retiring, dir);
			h.owner = 0;
		}
		if (p[1].revents & POLLIN) {
			int c = accept4(h.take, NULL, NULL, SOCK_CLOEXEC);

			if (c >= 0) {
				hand_over(&h, c);
				close(c);
			}
		}
		/* After a take: a daemon that takes the store meanwhile makes
		 * restarting a drained one needless. */
		if (!h.stop_drained)
			check_managed(&h);
		if (p[2].revents & POLLIN)
			break;
	}
	/* The store goes with the holder: every tensor it kept is freed. */
	log_info("hold: stopping: %zu descriptors let go", h.n);
	for (size_t i = 0; i < h.n; i++)
		close(h.v[i].fd);
	free(h.v);
	return 0;
}
