/*
 * libtensord: operations driven by an event loop (docs/design.md,
 * "Versions, sets and watches"). An operation is a request whose answer
 * tensord_poll() delivers; one abandoned before its answer is cancelled,
 * and what the answer brings is let go when it comes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

enum op_kind { OP_ATTACH, OP_ATTACH_MANY };

struct tensord_op {
	tensord_client *c; /* a reference of its own */
	enum op_kind kind;
	struct td_pending *p; /* heap: abandoned with the op when unanswered */
	struct td_mapping *pinned;
	char name[TENSORD_NAME_MAX + 1];
	bool cancelled;
};

int tensord_fd(tensord_client *c)
{
	int r = td_client_current(&c);

	return r < 0 ? r : c->conn.fd;
}

/*
 * Lets go of the abandoned requests that were answered: their leases end,
 * their descriptors close. Lock not held (ending a lease sends).
 */
static void sweep(tensord_client *c)
{
	struct td_pending *gone = NULL, **pp, *p;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->conn.pending; (p = *pp);) {
		if (p->abandoned && (p->done || c->conn.closed)) {
			*pp = p->next;
			p->next = gone;
			gone = p;
		} else {
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&c->lock);
	while ((p = gone)) {
		gone = p->next;
		if (p->reply && p->reply->body_case == TENSORD__REPLY__BODY_LEASE)
			td_lease_end(c, p->reply->lease->lease);
		td_set_let_go(c, p);
		free(p);
	}
}

int tensord_poll(tensord_client *c)
{
	int r = 0;

	/*
	 * The connection serving now, but never a new one for a lost one:
	 * connecting waits for the daemon's Hello (a socket a holder or
	 * systemd keeps accepts before any daemon serves it), and this never
	 * waits. The loss is its error; tensord_fd() connects anew. A forked
	 * child's first connection is made here as before.
	 */
	c = td_client_latest(c);
	if (c->inherited)
		r = td_client_current(&c);
	if (r < 0)
		return r;
	r = td_poll(c);
	sweep(c);
	if (r < 0)
		return td_set_error(r, "%s", c->conn.why[0] ? c->conn.why : tensord_strerror(r));
	return r;
}

static int op_new(tensord_client *c, enum op_kind kind, tensord_op **ret_op)
{
	tensord_op *op = calloc(1, sizeof(*op));

	if (op)
		op->p = calloc(1, sizeof(*op->p));
	if (!op || !op->p) {
		free(op);
		return td_set_error(-ENOMEM, "out of memory");
	}
	op->c = c;
	op->kind = kind;
	op->p->async = true;
	op->p->multi = kind == OP_ATTACH_MANY;
	*ret_op = op;
	return 0;
}

static void op_destroy(tensord_op *op)
{
	if (op->pinned)
		td_mapcache_unref(&op->c->maps, op->pinned);
	free(op->p);
	free(op);
}

int tensord_attach_start(tensord_client *c, const char *name, uint64_t after, int timeout_ms,
			 tensord_op **ret_op)
{
	struct td_attach_req am;
	tensord_op *op;
	int r = td_client_current(&c);

	if (r == 0 && !ret_op)
		r = td_set_error(-EINVAL, "attach: NULL output");
	if (r == 0)
		r = op_new(c, OP_ATTACH, &op);
	if (r < 0)
		return r;
	r = td_attach_msg(c, &am, name, after, timeout_ms);
	if (r == 0) {
		op->pinned = am.pinned;
		snprintf(op->name, sizeof(op->name), "%s", name);
		r = td_rpc_start(c, &am.req, op->p);
	}
	if (r < 0) {
		op_destroy(op);
		return r;
	}
	td_client_ref(c);
	*ret_op = op;
	return 0;
}

int tensord_attach_many_start(tensord_client *c, const char *const *names, size_t n_names,
			      const char *prefix, uint64_t after, int timeout_ms,
			      tensord_op **ret_op)
{
	struct td_set_req m;
	tensord_op *op;
	int r = td_client_current(&c);

	if (r == 0 && !ret_op)
		r = td_set_error(-EINVAL, "attach_many: NULL output");
	if (r == 0)
		r = td_set_msg(c, &m, names, n_names, prefix, after, timeout_ms);
	if (r == 0)
		r = op_new(c, OP_ATTACH_MANY, &op);
	if (r < 0)
		return r;
	r = td_rpc_start(c, &m.req, op->p);
	if (r < 0) {
		op_destroy(op);
		return r;
	}
	td_client_ref(c);
	*ret_op = op;
	return 0;
}

bool tensord_op_done(const tensord_op *op)
{
	bool done;

	if (!op)
		return true;
	pthread_mutex_lock(&op->c->lock);
	done = op->p->done || op->c->conn.closed;
	pthread_mutex_unlock(&op->c->lock);
	return done;
}

/* Asks the daemon to answer request id with ECANCELED; its own reply is let go. */
static int send_cancel(tensord_client *c, uint64_t id)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Cancel cn = TENSORD__CANCEL__INIT;
	struct td_pending *p = calloc(1, sizeof(*p));
	int r;

	if (!p)
		return td_set_error(-ENOMEM, "out of memory");
	p->abandoned = true;
	cn.id = id;
	req.body_case = TENSORD__REQUEST__BODY_CANCEL;
	req.cancel = &cn;
	r = td_rpc_start(c, &req, p);
	if (r < 0)
		free(p);
	return r;
}

int tensord_op_cancel(tensord_op *op)
{
	if (!op)
		return td_set_error(-EINVAL, "cancel: NULL op");
	if (op->cancelled || tensord_op_done(op))
		return 0;
	op->cancelled = true;
	return send_cancel(op->c, op->p->id);
}

/* The answer of a done op: 0, or its error (set). */
static int op_end(tensord_op *op)
{
	return td_rpc_end(op->c, op->p);
}

int tensord_attach_finish(tensord_op *op, DLManagedTensorVersioned **ret_tensor)
{
	tensord_client *c;
	struct td_lease *l;
	int r;

	if (!op || op->kind != OP_ATTACH || !ret_tensor)
		return td_set_error(-EINVAL, "attach_finish: not an attach operation");
	if (!tensord_op_done(op))
		return td_set_error(-EAGAIN, "attach_finish: not answered yet");
	c = op->c;
	r = op_end(op);
	if (r == 0) {
		r = td_attach_reply(c, op->name, op->p->reply, op->p->fd, op->pinned, &l);
		op->p->reply = NULL;
		op->p->fd = -1;
		op->pinned = NULL;
		if (r == 0)
			r = td_lease_handle(l, ret_tensor);
	}
	td_pending_clear(op->p);
	op_destroy(op);
	td_client_unref(c);
	return r;
}

int tensord_attach_many_finish(tensord_op *op, tensord_set **ret_set)
{
	tensord_client *c;
	int r;

	if (!op || op->kind != OP_ATTACH_MANY || !ret_set)
		return td_set_error(-EINVAL, "attach_many_finish: not an attach_many operation");
	if (!tensord_op_done(op))
		return td_set_error(-EAGAIN, "attach_many_finish: not answered yet");
	c = op->c;
	r = op_end(op);
	if (r == 0) {
		r = td_set_build(c, op->p, ret_set);
	} else {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		td_set_let_go(c, op->p);
		td_set_error(r, "%s", saved);
	}
	op_destroy(op);
	td_client_unref(c);
	return r;
}

tensord_op *tensord_op_free(tensord_op *op)
{
	tensord_client *c;
	bool done;

	if (!op)
		return NULL;
	c = op->c;
	pthread_mutex_lock(&c->lock);
	done = op->p->done || c->conn.closed;
	/* Unanswered: it stays registered, abandoned, until its answer comes. */
	if (!done)
		op->p->abandoned = true;
	pthread_mutex_unlock(&c->lock);
	if (!done) {
		if (!op->cancelled)
			send_cancel(c, op->p->id);
		op->p = NULL;
	} else {
		op_end(op);
		if (op->p->reply && op->p->reply->body_case == TENSORD__REPLY__BODY_LEASE)
			td_lease_end(c, op->p->reply->lease->lease);
		td_set_let_go(c, op->p);
	}
	op_destroy(op);
	td_client_unref(c);
	return NULL;
}
