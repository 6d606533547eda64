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
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "tensorctl.h"

static const char *kind_name(tensord_event_kind k)
{
	return k == TENSORD_EVENT_PUBLISHED  ? "published"
	       : k == TENSORD_EVENT_UNLINKED ? "unlinked"
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
	} else if (ev->kind == TENSORD_EVENT_LAGGED) {
		puts("lagged");
	} else {
		printf("%s %s gen %" PRIu64 " commit %" PRIu64 "\n", kind_name(ev->kind),
		       quote(ev->name, QUOTE_TABLE, q, sizeof(q)), ev->generation, ev->commit);
	}
}

/* Prints every event queued now; 0 when none is left, else the exit status. */
static int drain(tensord_watch *w, bool json)
{
	tensord_event ev;
	int rc;

	while ((rc = tensord_watch_next(w, 0, &ev)) == 0) {
		print_event(&ev, json);
		/* A pipe sees each line as it comes. */
		if (finish_output())
			return EXIT_OP;
	}
	return rc == -EAGAIN ? 0 : op_error(rc, NULL);
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
	pfd[0] = (struct pollfd){ .fd = tensord_fd(c), .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = sfd, .events = POLLIN };
	for (;;) {
		/* First what is queued: the replay of --after may have come with the reply. */
		rc = drain(w, json);
		if (rc)
			break;
		if (poll(pfd, 2, -1) < 0 && errno != EINTR) {
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
