/*
 * The data path over UCX (daemon/remote/xport.h): one context and one worker per
 * daemon with UCP_FEATURE_AM only, the worker's event descriptor polled on
 * the loop (uv_poll_t), and while anything is in flight an idle handle
 * that keeps progressing (over TCP the sender's worker writes the bytes
 * only as it progresses: docs/remote.md, fact 1).
 *
 * A tensor goes as one active message whose header is the 8-byte tag;
 * UCX picks eager or rendezvous by size. Completions seen inside
 * ucp_worker_progress() are queued and delivered after it returns.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include <ucp/api/ucp.h>

#include "daemon/base/log.h"
#include "daemon/remote/xport.h"

#define AM_TENSOR 1

enum ev_kind { EV_RECV, EV_SEND, EV_EP };

struct xport_ev {
	enum ev_kind kind;
	uint64_t tag;
	void *arg;
	int status;
	STAILQ_ENTRY(xport_ev) link;
};

/*
 * An endpoint's life: open (on x->eps), then closed by xport_ep_close()
 * (closed set, once): parked while sends are in flight (x->parked), then
 * closing (x->closing_eps) until UCX completes the close (close_done),
 * freed with its last send. No send starts once closed.
 */
struct xport_ep {
	struct xport *x;
	ucp_ep_h ep;
	void *ctx;
	bool failed;
	bool closed;    /* xport_ep_close() was called: UCX's later words about it are ignored */
	unsigned sends; /* sends on it in flight */
	uint64_t parked_ns; /* closed with sends in flight: when (CLOCK_MONOTONIC); 0: not */
	bool close_done;    /* UCX completed its close: it goes with its last send */
	LIST_ENTRY(xport_ep) link;
};

/* One send in flight: the header must live until it completes. */
struct xport_send {
	struct xport *x;
	struct xport_ep *ep;
	uint64_t tag;
	void *arg;
};

/*
 * An endpoint closed with sends in flight is parked, not closed: UCX 1.13
 * (Debian 12's) crashed the daemon when an endpoint was force-closed
 * while a large send on it was stuck (its peer stopped) and the peer's
 * traffic came back later (tests/integration/test_remote.py::
 * test_b_stops_receiving_mid_pull: a use of a freed TCP endpoint inside
 * uct_tcp_iface_progress, 3 runs in 6 here). Parked, it closes once its
 * sends end (the peer takes the bytes, or its connection breaks), or after
 * XPORT_PARK_MAX_NS at the latest.
 */
#define XPORT_PARK_MAX_NS (10ull * 1000000000u)

/* One rendezvous receive in flight. */
struct xport_recv {
	struct xport *x;
	uint64_t tag;
	size_t len;
};

struct xport {
	uv_loop_t *loop;
	struct xport_cbs cbs;
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_address_t *addr;
	size_t addr_len;
	uv_poll_t poll;
	uv_idle_t idle;
	int open_handles;
	unsigned in_flight; /* sends and receives not yet complete */
	bool busy;          /* the last progress stopped at its budget, not idle */
	bool closing;
	uint64_t sent, received;
	char describe[64];
	LIST_HEAD(, xport_ep) eps;
	LIST_HEAD(, xport_ep) parked;      /* closed with sends in flight (XPORT_PARK_MAX_NS) */
	LIST_HEAD(, xport_ep) closing_eps; /* closed, their close not complete yet */
	STAILQ_HEAD(, xport_ev) evs;
};

static int uerr(ucs_status_t st)
{
	switch (st) {
	case UCS_OK:
		return 0;
	case UCS_ERR_NO_MEMORY:
		return -ENOMEM;
	case UCS_ERR_CANCELED:
		return -ECANCELED;
	case UCS_ERR_TIMED_OUT:
		return -ETIMEDOUT;
	case UCS_ERR_CONNECTION_RESET:
	case UCS_ERR_ENDPOINT_TIMEOUT:
		return -ECONNRESET;
	case UCS_ERR_UNREACHABLE:
		return -EHOSTUNREACH;
	case UCS_ERR_MESSAGE_TRUNCATED:
		return -EMSGSIZE;
	default:
		return -EIO;
	}
}

static void on_idle(uv_idle_t *h);

/* Progress and delivery on the next loop turn. */
static void kick(struct xport *x)
{
	if (!x->closing && !uv_is_active((uv_handle_t *)&x->idle))
		uv_idle_start(&x->idle, on_idle);
}

/* Queued for after progress; out of memory loses the event, which the pull's timer then ends. */
static void queue_ev(struct xport *x, enum ev_kind kind, uint64_t tag, void *arg, int status)
{
	struct xport_ev *e = malloc(sizeof(*e));

	if (!e) {
		log_error("ucx: out of memory for a completion: a pull will end by its timer");
		return;
	}
	*e = (struct xport_ev){ .kind = kind, .tag = tag, .arg = arg, .status = status };
	STAILQ_INSERT_TAIL(&x->evs, e, link);
	kick(x);
}

static void in_flight(struct xport *x, int d)
{
	assert(d > 0 || x->in_flight >= (unsigned)-d);
	x->in_flight = (unsigned)((int)x->in_flight + d);
	if (x->in_flight)
		kick(x);
}

static void deliver(struct xport *x)
{
	struct xport_ev *e;

	while ((e = STAILQ_FIRST(&x->evs))) {
		STAILQ_REMOVE_HEAD(&x->evs, link);
		if (!x->closing) {
			if (e->kind == EV_RECV)
				x->cbs.recv_done(x->cbs.ctx, e->tag, e->status);
			else if (e->kind == EV_SEND)
				x->cbs.send_done(x->cbs.ctx, e->arg, e->status);
			else {
				/* xport_ep_close() took back its endpoint's failures. */
				assert(!((struct xport_ep *)e->arg)->closed);
				x->cbs.ep_failed(x->cbs.ctx, ((struct xport_ep *)e->arg)->ctx,
						 e->status);
			}
		}
		free(e);
	}
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ep_close_now(struct xport_ep *ep);
static void unpark(struct xport *x);

/*
 * Progresses until the worker is idle and armed, or for PROGRESS_BUDGET_NS,
 * then delivers what completed. Over TCP a large transfer keeps the worker
 * busy for its whole length: without the budget the loop would serve
 * nothing else meanwhile (clients, heartbeats: a peer called down after 3 s
 * of a gigabyte on the way). Stopped at the budget, the idle handle runs
 * the rest on the next turns, between the loop's other work.
 */
#define PROGRESS_BUDGET_NS 1000000u
static void progress(struct xport *x)
{
	uint64_t end = mono_ns() + PROGRESS_BUDGET_NS;
	unsigned n = 0;
	ucs_status_t st;

	x->busy = false;
	for (;;) {
		while (ucp_worker_progress(x->worker)) {
			if (++n % 16 == 0 && mono_ns() > end) {
				x->busy = true;
				break;
			}
		}
		if (x->busy)
			break;
		st = ucp_worker_arm(x->worker);
		if (st != UCS_ERR_BUSY)
			break;
	}
	if (x->busy)
		kick(x);
	deliver(x);
	unpark(x);
}

/* Closes the parked endpoints whose sends ended, or that waited too long. */
static void unpark(struct xport *x)
{
	struct xport_ep *ep, *next;
	uint64_t now;

	if (LIST_EMPTY(&x->parked) || x->closing)
		return;
	now = mono_ns();
	for (ep = LIST_FIRST(&x->parked); ep; ep = next) {
		next = LIST_NEXT(ep, link);
		assert(ep->closed && !ep->close_done && ep->parked_ns);
		if (ep->sends && now - ep->parked_ns < XPORT_PARK_MAX_NS)
			continue;
		if (ep->sends)
			log_info("ucx: an endpoint closed %llu s ago still has %u sends in flight: "
				 "closing it now, they end with an error",
				 (unsigned long long)((now - ep->parked_ns) / 1000000000u),
				 ep->sends);
		LIST_REMOVE(ep, link);
		ep_close_now(ep);
	}
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	progress(h->data);
}

static void on_idle(uv_idle_t *h)
{
	struct xport *x = h->data;

	progress(x);
	if (!x->busy && !x->in_flight && STAILQ_EMPTY(&x->evs))
		uv_idle_stop(&x->idle);
}

static void on_sent(void *request, ucs_status_t st, void *user_data)
{
	struct xport_send *s = user_data;
	struct xport_ep *ep = s->ep;

	assert(ep->sends > 0 && (!ep->close_done || ep->closed));
	if (--ep->sends == 0 && ep->close_done) {
		LIST_REMOVE(ep, link);
		free(ep);
	}
	queue_ev(s->x, EV_SEND, s->tag, s->arg, uerr(st));
	in_flight(s->x, -1);
	free(s);
	ucp_request_free(request);
}

static void on_received(void *request, ucs_status_t st, size_t length, void *user_data)
{
	struct xport_recv *r = user_data;

	if (st == UCS_OK && length != r->len)
		st = UCS_ERR_MESSAGE_TRUNCATED;
	if (st == UCS_OK)
		r->x->received += length;
	queue_ev(r->x, EV_RECV, r->tag, NULL, uerr(st));
	in_flight(r->x, -1);
	free(r);
	ucp_request_free(request);
}

/* A message arrived: the header names the pull; anything else is dropped. */
static ucs_status_t on_am(void *arg, const void *header, size_t header_len, void *data, size_t len,
			  const ucp_am_recv_param_t *param)
{
	struct xport *x = arg;
	ucp_request_param_t prm = { 0 };
	struct xport_recv *r;
	ucs_status_ptr_t req;
	uint64_t tag;
	void *dst;

	if (header_len != sizeof(tag) || x->closing)
		return UCS_OK;
	memcpy(&tag, header, sizeof(tag));
	dst = x->cbs.recv_dest(x->cbs.ctx, tag, len);
	if (!dst) {
		log_debug("ucx: a message of %zu bytes for no pull (tag %llu), dropping", len,
			  (unsigned long long)tag);
		return UCS_OK;
	}
	if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
		memcpy(dst, data, len);
		x->received += len;
		queue_ev(x, EV_RECV, tag, NULL, 0);
		return UCS_OK;
	}
	r = malloc(sizeof(*r));
	if (!r) {
		queue_ev(x, EV_RECV, tag, NULL, -ENOMEM);
		return UCS_OK;
	}
	*r = (struct xport_recv){ .x = x, .tag = tag, .len = len };
	prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	prm.cb.recv_am = on_received;
	prm.user_data = r;
	req = ucp_am_recv_data_nbx(x->worker, data, dst, len, &prm);
	if (req == NULL) {
		x->received += len;
		queue_ev(x, EV_RECV, tag, NULL, 0);
		free(r);
	} else if (UCS_PTR_IS_ERR(req)) {
		queue_ev(x, EV_RECV, tag, NULL, uerr(UCS_PTR_STATUS(req)));
		free(r);
	} else {
		in_flight(x, 1);
	}
	return UCS_INPROGRESS;
}

int xport_init(struct xport **ret, uv_loop_t *loop, const struct xport_cbs *cbs, char *why,
	       size_t why_len)
{
	ucp_params_t params = { 0 };
	ucp_worker_params_t wp = { 0 };
	ucp_am_handler_param_t hp = { 0 };
	ucp_config_t *config;
	unsigned maj, min, rel;
	struct xport *x;
	ucs_status_t st;
	int fd;

	*ret = NULL;
	x = calloc(1, sizeof(*x));
	if (!x) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	x->loop = loop;
	x->cbs = *cbs;
	LIST_INIT(&x->eps);
	LIST_INIT(&x->parked);
	LIST_INIT(&x->closing_eps);
	STAILQ_INIT(&x->evs);
	st = ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK) {
		snprintf(why, why_len, "UCX: reading its configuration: %s", ucs_status_string(st));
		free(x);
		return -EIO;
	}
	/*
	 * No UCX keepalive: the peer channel's heartbeats (peer.c) say when a
	 * peer is gone. With it, UCX 1.13 aborted the pulling daemon now and
	 * then when the sending one was killed mid-transfer (an assertion in
	 * ucp_request.c purging a wireup REP among keepalive EP_CHECKs; one
	 * run in 5-8 of test_remote.py, none in 8 without it). An operator's
	 * own UCX_KEEPALIVE_INTERVAL is left alone.
	 */
	if (!getenv("UCX_KEEPALIVE_INTERVAL"))
		ucp_config_modify(config, "KEEPALIVE_INTERVAL", "inf");
	params.field_mask = UCP_PARAM_FIELD_FEATURES;
	params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP; /* never RMA: see the head */
	st = ucp_init(&params, config, &x->ctx);
	ucp_config_release(config);
	if (st != UCS_OK) {
		snprintf(why, why_len, "UCX: ucp_init: %s", ucs_status_string(st));
		free(x);
		return -EIO;
	}
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	st = ucp_worker_create(x->ctx, &wp, &x->worker);
	if (st == UCS_OK) {
		hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
				UCP_AM_HANDLER_PARAM_FIELD_ARG;
		hp.id = AM_TENSOR;
		hp.cb = on_am;
		hp.arg = x;
		st = ucp_worker_set_am_recv_handler(x->worker, &hp);
		if (st == UCS_OK)
			st = ucp_worker_get_address(x->worker, &x->addr, &x->addr_len);
		if (st == UCS_OK)
			st = ucp_worker_get_efd(x->worker, &fd);
	}
	if (st != UCS_OK) {
		snprintf(why, why_len, "UCX: the worker: %s", ucs_status_string(st));
		if (x->addr)
			ucp_worker_release_address(x->worker, x->addr);
		if (x->worker)
			ucp_worker_destroy(x->worker);
		ucp_cleanup(x->ctx);
		free(x);
		return -EIO;
	}
	ucp_get_version(&maj, &min, &rel);
	snprintf(x->describe, sizeof(x->describe), "UCX %u.%u.%u, active messages", maj, min, rel);
	uv_poll_init(loop, &x->poll, fd);
	uv_idle_init(loop, &x->idle);
	x->poll.data = x->idle.data = x;
	x->open_handles = 2;
	uv_poll_start(&x->poll, UV_READABLE, on_poll);
	progress(x);
	*ret = x;
	return 0;
}

void xport_address(const struct xport *x, const void **ret_addr, size_t *ret_len)
{
	*ret_addr = x->addr;
	*ret_len = x->addr_len;
}

const char *xport_describe(const struct xport *x)
{
	return x->describe;
}

static void on_ep_error(void *arg, ucp_ep_h h, ucs_status_t st)
{
	struct xport_ep *ep = arg;

	if (ep->failed || ep->closed)
		return;
	ep->failed = true;
	queue_ev(ep->x, EV_EP, 0, ep, uerr(st));
}

int xport_connect(struct xport *x, const void *addr, size_t len, void *ep_ctx,
		  struct xport_ep **ret, char *why, size_t why_len)
{
	ucp_ep_params_t p = { 0 };
	struct xport_ep *ep;
	ucs_status_t st;

	ep = calloc(1, sizeof(*ep));
	if (!ep) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	ep->x = x;
	ep->ctx = ep_ctx;
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		       UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = on_ep_error;
	p.err_handler.arg = ep;
	st = ucp_ep_create(x->worker, &p, &ep->ep);
	if (st != UCS_OK) {
		snprintf(why, why_len, "UCX: an endpoint to its worker (%zu bytes of address): %s",
			 len, ucs_status_string(st));
		free(ep);
		return uerr(st);
	}
	LIST_INSERT_HEAD(&x->eps, ep, link);
	kick(x);
	*ret = ep;
	return 0;
}

/* ep's close completed: its struct goes once no send of it is left to complete. */
static void ep_closed(struct xport_ep *ep)
{
	assert(ep->closed && !ep->close_done);
	ep->close_done = true;
	if (ep->sends)
		return; /* on_sent() frees it */
	LIST_REMOVE(ep, link);
	free(ep);
}

static void on_closed(void *request, ucs_status_t st, void *user_data)
{
	ep_closed(user_data);
	ucp_request_free(request);
}

/* Asks UCX to close ep, by force: its sends in flight end with an error. */
static void ep_close_now(struct xport_ep *ep)
{
	struct xport *x = ep->x;
	ucp_request_param_t prm = { 0 };
	ucs_status_ptr_t req;

	assert(ep->closed && !ep->close_done);
	/*
	 * A forced close may still call the error handler, and complete the
	 * sends it cancels, while it runs, so the struct lives, marked closed,
	 * until the close and those sends have completed.
	 */
	prm.op_attr_mask =
		UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
	prm.cb.send = on_closed;
	prm.user_data = ep;
	LIST_INSERT_HEAD(&x->closing_eps, ep, link);
	req = ucp_ep_close_nbx(ep->ep, &prm);
	if (!UCS_PTR_IS_PTR(req)) /* closed at once (or failed) */
		ep_closed(ep);
	kick(x);
}

void xport_ep_close(struct xport_ep *ep)
{
	struct xport_ev *e, *next;
	struct xport *x;

	if (!ep)
		return;
	x = ep->x;
	assert(!ep->closed); /* once: the caller forgets ep */
	LIST_REMOVE(ep, link);
	/* A failure of it not yet delivered is no one's news now. */
	for (e = STAILQ_FIRST(&x->evs); e; e = next) {
		next = STAILQ_NEXT(e, link);
		if (e->kind == EV_EP && e->arg == ep) {
			STAILQ_REMOVE(&x->evs, e, xport_ev, link);
			free(e);
		}
	}
	ep->closed = true;
	if (ep->sends) { /* parked: see XPORT_PARK_MAX_NS */
		ep->parked_ns = mono_ns();
		LIST_INSERT_HEAD(&x->parked, ep, link);
		kick(x);
		return;
	}
	ep_close_now(ep);
}

int xport_send(struct xport_ep *ep, uint64_t tag, const void *buf, size_t len, void *arg)
{
	struct xport *x = ep->x;
	ucp_request_param_t prm = { 0 };
	struct xport_send *s;
	ucs_status_ptr_t req;

	assert(!ep->closed);
	if (ep->failed)
		return -ECONNRESET;
	s = malloc(sizeof(*s));
	if (!s)
		return -ENOMEM;
	*s = (struct xport_send){ .x = x, .ep = ep, .tag = tag, .arg = arg };
	prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	prm.cb.send = on_sent;
	prm.user_data = s;
	req = ucp_am_send_nbx(ep->ep, AM_TENSOR, &s->tag, sizeof(s->tag), buf, len, &prm);
	if (UCS_PTR_IS_ERR(req)) {
		free(s);
		return uerr(UCS_PTR_STATUS(req));
	}
	x->sent += len;
	if (req == NULL) {
		queue_ev(x, EV_SEND, tag, arg, 0);
		free(s);
	} else {
		ep->sends++;
		in_flight(x, 1);
	}
	return 0;
}

void xport_counts(const struct xport *x, uint64_t *ret_sent, uint64_t *ret_received)
{
	*ret_sent = x ? x->sent : 0;
	*ret_received = x ? x->received : 0;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct xport *x = h->data;

	if (--x->open_handles == 0)
		free(x);
}

void xport_fini(struct xport *x)
{
	struct xport_ep *ep;
	struct xport_ev *e;

	if (!x)
		return;
	while ((ep = LIST_FIRST(&x->eps)))
		xport_ep_close(ep);
	while ((ep = LIST_FIRST(&x->parked))) {
		LIST_REMOVE(ep, link);
		ep_close_now(ep);
	}
	x->closing = true;
	while ((e = STAILQ_FIRST(&x->evs))) {
		STAILQ_REMOVE_HEAD(&x->evs, link);
		free(e);
	}
	ucp_worker_release_address(x->worker, x->addr);
	ucp_worker_destroy(x->worker);
	ucp_cleanup(x->ctx);
	/* Closes UCX never completed: with the worker gone, nothing refers to them. */
	while ((ep = LIST_FIRST(&x->closing_eps))) {
		LIST_REMOVE(ep, link);
		free(ep);
	}
	uv_close((uv_handle_t *)&x->poll, on_handle_closed);
	uv_close((uv_handle_t *)&x->idle, on_handle_closed);
}
