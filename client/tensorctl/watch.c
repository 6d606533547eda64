/*
 * tensorctl watch: prints the daemon's events under a prefix, one line
 * each, until SIGINT or SIGTERM (exit 0) or a failure (exit 1).
 *
 * One thread, no timeouts: the signals are blocked and read from a
 * signalfd, and one poll() waits for either them or the client's socket;
 * tensord_watch_next(w, 0, ...) reads what the socket holds and hands out
 * the queued events. So an event prints as soon as it arrives, and a
 * signal ends the loop between two lines, never in the middle of one.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "tensorctl.h"

static const char *kind_name(tensord_event_kind k)
{
	return k == TENSORD_EVENT_PUBLISHED   ? "published"
	       : k == TENSORD_EVENT_UNLINKED  ? "unlinked"
	       : k == TENSORD_EVENT_RESTARTED ? "restarted"
					      : "lagged";
}

/* One event as a line: text or a JSON object. */
static void print_event(const tensord_event *ev, bool json)
{
	char q[QUOTE_MAX];

	if (json) {
		printf("{\"kind\": \"%s\", \"name\": ", kind_name(ev->kind));
		json_str(ev->name);
		printf(", \"generation\": %" PRIu64 ", \"commit\": %" PRIu64 "}\n", ev->generation,
		       ev->commit);
	} else if (ev->kind == TENSORD_EVENT_LAGGED || ev->kind == TENSORD_EVENT_RESTARTED) {
		puts(kind_name(ev->kind));
	} else {
		printf("%s %s gen %" PRIu64 " commit %" PRIu64 "\n", kind_name(ev->kind),
		       quote(ev->name, QUOTE_TABLE, q, sizeof(q)), ev->generation, ev->commit);
	}
}

/*
 * --group: the events of one commit (and one prefix) folded into one line
 * as they come; printed when an event of another commit (or prefix, or
 * kind) comes, or when none follows (the daemon sends a commit's events
 * back to back: a short wait for the next one is enough).
 */
#define GROUP_WAIT_MS 50

struct pending {
	bool on;
	tensord_event_kind kind;
	uint64_t commit;
	size_t names;
	char prefix[TENSORD_NAME_MAX + 1]; /* the key (by prefix) or the names' common prefix */
	size_t prefix_len;
};

static void print_pending(struct pending *p, bool json)
{
	char q[QUOTE_MAX];

	if (!p->on)
		return;
	if (json) {
		printf("{\"kind\": \"%s\", \"commit\": %" PRIu64 ", \"names\": %zu, \"prefix\": ",
		       kind_name(p->kind), p->commit, p->names);
		json_str(p->prefix);
		puts("}");
	} else {
		printf("%s commit %" PRIu64 " names %zu prefix %s\n", kind_name(p->kind), p->commit,
		       p->names, *p->prefix ? quote(p->prefix, QUOTE_TABLE, q, sizeof(q)) : "-");
	}
	p->on = false;
}

/* Whether ev belongs to the pending line. */
static bool same_group(const struct pending *p, const tensord_event *ev, enum group_by by)
{
	size_t plen = group_prefix_len(ev->name);

	return p->on && p->kind == ev->kind && p->commit == ev->commit &&
	       (by == GROUP_COMMIT ||
		(p->prefix_len == plen && !memcmp(p->prefix, ev->name, plen)));
}

/* Takes ev into the pending line, printing the one before when ev starts a new one. */
static void group_event(struct pending *p, const tensord_event *ev, enum group_by by, bool json)
{
	if (ev->kind == TENSORD_EVENT_LAGGED || ev->kind == TENSORD_EVENT_RESTARTED) {
		print_pending(p, json);
		print_event(ev, json);
		return;
	}
	if (!same_group(p, ev, by)) {
		print_pending(p, json);
		*p = (struct pending){ .on = true, .kind = ev->kind, .commit = ev->commit };
		if (by == GROUP_PREFIX) {
			p->prefix_len = group_prefix_len(ev->name);
			memcpy(p->prefix, ev->name, p->prefix_len);
			p->prefix[p->prefix_len] = '\0';
		}
	}
	if (by == GROUP_COMMIT)
		group_common_prefix(p->prefix, &p->prefix_len, ev->name, p->names == 0);
	p->names++;
}

/* Prints every event queued now; 0 when none is left, else the exit status. */
static int drain(tensord_watch *w, bool json, enum group_by by, struct pending *p)
{
	tensord_event ev;
	int rc;

	for (;;) {
		rc = tensord_watch_next(w, p->on ? GROUP_WAIT_MS : 0, &ev);
		if (rc < 0)
			break;
		if (by)
			group_event(p, &ev, by, json);
		else
			print_event(&ev, json);
		/* A pipe sees each line as it comes. */
		if (!p->on && finish_output())
			return EXIT_OP;
	}
	if (rc == -EAGAIN || rc == -ETIMEDOUT) {
		print_pending(p, json);
		return finish_output() ? EXIT_OP : 0;
	}
	print_pending(p, json);
	return op_error(rc, NULL);
}

/*
 * SIGINT and SIGTERM, blocked in every thread (main() calls this before
 * libtensord starts any), are read from a signalfd.
 */
static sigset_t stop_signals(void)
{
	sigset_t sigs;

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	return sigs;
}

int watch_block_signals(void)
{
	sigset_t sigs = stop_signals();

	return pthread_sigmask(SIG_BLOCK, &sigs, NULL) == 0 ? 0 : -1;
}

int cmd_watch(tensord_client *c, const struct args *a)
{
	const char *prefix = a->npos ? a->pos[0] : "";
	bool json = a->seen & OPT_JSON;
	struct pending pending = { 0 };
	struct signalfd_siginfo si;
	struct pollfd pfd[2];
	tensord_watch *w;
	sigset_t sigs;
	int rc, sfd;

	sigs = stop_signals();
	if ((sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
		return report(-errno, strerror(errno), NULL);

	rc = tensord_watch_start(c, prefix, (a->seen & OPT_AFTER) != 0, a->after, a->queue, &w);
	if (rc < 0) {
		close(sfd);
		return op_error(rc, NULL);
	}
	pfd[1] = (struct pollfd){ .fd = sfd, .events = POLLIN };
	for (;;) {
		/* First what is queued: the replay of --after may have come with the reply. */
		rc = drain(w, json, a->group, &pending);
		if (rc)
			break;
		/* The watch's connection, or after the daemon restarted a new
		 * one, made here (the watch's calls without a wait make none);
		 * while no daemon answers, a try every 100 ms, until the watch
		 * says it has been too long. */
		pfd[0] = (struct pollfd){ .fd = tensord_watch_fd(w), .events = POLLIN };
		if (pfd[0].fd < 0 && tensord_fd(c) >= 0)
			continue;
		if (poll(pfd, 2, pfd[0].fd < 0 ? 100 : -1) < 0 && errno != EINTR) {
			rc = report(-errno, strerror(errno), NULL);
			break;
		}
		if (pfd[1].revents && read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
			break; /* interrupted: a clean end, rc 0 */
	}
	tensord_watch_close(w);
	close(sfd);
	return rc;
}
