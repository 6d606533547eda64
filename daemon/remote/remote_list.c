/*
 * Remote attach: listing what a peer exports (docs/remote.md, "Naming";
 * issue 30 item 9). A client's List of "@PEER/PREFIX" on B asks A for a
 * page of its names under PREFIX (PeerNameList), as uid REMOTE_PEER_UID may see
 * them under A's export rules, and is answered with A's page (PeerListReply)
 * as "@PEER/NAME" entries (PeerNameListReply): what an attach of each would pull, not what B
 * holds. A List of "@" alone lists B's own replicas, as any local list.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "common/desc.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

#define LIST_KIND TENSORD__REQUEST__BODY_LIST
/* Entries of one page: a page stays under a peer frame (PEER_FRAME_MAX). */
#define LIST_PAGE_MAX 256u
#define LIST_PAGE_BYTES (PEER_FRAME_MAX - 1024u)
/* Registry pages of 64 names one question visits at most (those not exported skipped). */
#define LIST_SCAN_PAGES 64u
/* The answer's deadline. */
#define LIST_TIMEOUT_MS 5000u

/* --- A: a page of what a peer may pull ------------------------------------------------ */

static void list_reply_error(struct rpeer *rp, uint64_t id, int status, const char *why)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerNameListReply m = TENSORD__PEER_NAME_LIST_REPLY__INIT;

	m.id = id;
	m.status = status;
	m.error = (char *)why;
	f.body_case = TENSORD__PEER_FRAME__BODY_NAME_LIST_REPLY;
	f.name_list_reply = &m;
	rm_send_frame(rp, &f);
}

void rm_on_list(struct rpeer *rp, const Tensord__PeerNameList *m)
{
	struct remote_env *env = rp->rm->env;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerNameListReply rep = TENSORD__PEER_NAME_LIST_REPLY__INIT;
	Tensord__PeerNameListEntry *e = calloc(LIST_PAGE_MAX + 1, sizeof(*e));
	Tensord__PeerNameListEntry **pe = calloc(LIST_PAGE_MAX, sizeof(*pe));
	struct tensor *v[64];
	size_t plen = strlen(m->prefix), limit = m->limit, n, k = 0, bytes = 64;
	const char *after = m->after, *next = NULL;
	char why[400], reason[300];
	unsigned pages = 0;

	if (!e || !pe) {
		snprintf(why, sizeof(why), "node %s: out of memory", env->peers->self);
		list_reply_error(rp, m->id, -ENOMEM, why);
		goto out;
	}
	if (plen && td_name_check(m->prefix, plen, reason, sizeof(reason)) < 0) {
		snprintf(why, sizeof(why), "node %s: prefix: %s", env->peers->self, reason);
		list_reply_error(rp, m->id, -EINVAL, why);
		goto out;
	}
	if (!limit || limit > LIST_PAGE_MAX)
		limit = LIST_PAGE_MAX;
	/* Pages of the registry as uid REMOTE_PEER_UID sees it, those exported kept. */
	for (;;) {
		registry_list(env->reg, &rp->rc, m->prefix, plen, after, 64, v, &n, &next);
		for (size_t i = 0; i < n; i++) {
			struct tensor *t = v[i];
			Tensord__PeerNameListEntry *x = &e[k];

			if (t->state != TENSORD_STATE_PUBLISHED ||
			    !remote_exported(env->cfg, rp->p->name, t->name, t->name_len))
				continue;
			tensord__peer_name_list_entry__init(x);
			x->name = t->name;
			x->generation = t->generation;
			x->commit = t->commit;
			x->nbytes = t->nbytes;
			x->dtype_code = t->dtype.code;
			x->dtype_bits = t->dtype.bits;
			x->dtype_lanes = t->dtype.lanes;
			x->n_shape = x->n_strides = (size_t)t->ndim;
			x->shape = t->shape;
			x->strides = t->strides;
			x->mode = t->mode;
			x->created_ns = t->created_ns;
			x->device_type = (uint32_t)t->device.device_type;
			x->device_id = t->device.device_id;
			bytes += tensord__peer_name_list_entry__get_packed_size(x) + 8;
			if (k == limit ||
			    bytes > LIST_PAGE_BYTES) { /* the page is full: go on after */
				rep.more = true;
				rep.next = k ? e[k - 1].name : (char *)after;
				goto send;
			}
			pe[k] = x;
			k++;
		}
		if (!next)
			break;
		after = next;
		if (++pages == LIST_SCAN_PAGES) { /* bounded work per question: go on after */
			rep.more = true;
			rep.next = (char *)next;
			break;
		}
	}
send:
	rep.id = m->id;
	rep.n_entries = k;
	rep.entries = pe;
	if (!rep.next)
		rep.next = "";
	f.body_case = TENSORD__PEER_FRAME__BODY_NAME_LIST_REPLY;
	f.name_list_reply = &rep;
	rm_send_frame(rp, &f);
out:
	free(pe);
	free(e);
}

/* --- B: a client's list of a peer's names ---------------------------------------------- */

static void on_list_closed(uv_handle_t *h)
{
	free(h->data);
}

static void list_free(struct rlist *l)
{
	LIST_REMOVE(l, link);
	uv_timer_stop(&l->timer);
	uv_close((uv_handle_t *)&l->timer, on_list_closed);
}

static void list_fail(struct rlist *l, int status, const char *reason)
{
	char why[700];

	if (l->cl) {
		snprintf(why, sizeof(why), "peer %.*s: list of its names: %s",
			 (int)strlen(l->peer_prefix) - 2, l->peer_prefix + 1, reason);
		rm_reply_status(l->rm->env, l->cl, LIST_KIND, l->req_id, status, why);
	}
	list_free(l);
}

static void on_list_timeout(uv_timer_t *t)
{
	list_fail(t->data, -ETIMEDOUT, "no answer within 5 s");
}

bool remote_list(struct remote_env *env, struct client *cl, uint64_t id, const Tensord__List *m)
{
	struct remote *rm = env->rm;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerNameList pl = TENSORD__PEER_NAME_LIST__INIT;
	const char *slash = strchr(m->prefix, '/');
	char peer[PEER_NAME_MAX + 1], why[700];
	size_t peer_len = slash ? (size_t)(slash - m->prefix) - 1 : 0;
	struct rpeer *rp;
	struct rlist *l;
	struct peer *p;

	if (m->prefix[0] != '@' || !slash || !rm || !env->peers->on)
		return false;
	if (peer_len == 0 || peer_len > PEER_NAME_MAX) {
		Tensord__Reply rep = TENSORD__REPLY__INIT;
		Tensord__ListReply lr = TENSORD__LIST_REPLY__INIT;

		lr.next = ""; /* no peer has such a name: the empty list */
		rep.id = id;
		rep.body_case = TENSORD__REPLY__BODY_LIST;
		rep.list = &lr;
		env->hooks.reply(cl, &rep);
		return true;
	}
	memcpy(peer, m->prefix + 1, peer_len);
	peer[peer_len] = '\0';
	p = peer_lookup(env->peers, peer);
	rp = p ? p->data : NULL;
	if (!p) {
		snprintf(why, sizeof(why), "list '%s': no peer '%s'", m->prefix, peer);
		rm_reply_status(env, cl, LIST_KIND, id, -ENOENT, why);
		return true;
	}
	if (!rp || !rp->up) {
		snprintf(why, sizeof(why), "list '%s': peer %s is not connected (%s%s%s)",
			 m->prefix, peer, peer_state_name(p->state), p->error[0] ? ": " : "",
			 p->error);
		rm_reply_status(env, cl, LIST_KIND, id, -EHOSTUNREACH, why);
		return true;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		rm_reply_status(env, cl, LIST_KIND, id, -ENOMEM, "out of memory for a remote list");
		return true;
	}
	l->rm = rm;
	l->rp = rp;
	l->cl = cl;
	l->req_id = id;
	l->id = rm_pull_new_ids(rm, 1);
	snprintf(l->peer_prefix, sizeof(l->peer_prefix), "@%s/", peer);
	LIST_INSERT_HEAD(&rm->lists, l, link);
	uv_timer_init(env->loop, &l->timer);
	l->timer.data = l;
	uv_timer_start(&l->timer, on_list_timeout, LIST_TIMEOUT_MS, 0);
	pl.id = l->id;
	pl.prefix = (char *)slash + 1;
	/* The cursor is a name this node gave: "@PEER/NAME", or "" for the first page. */
	pl.after = strncmp(m->after, l->peer_prefix, strlen(l->peer_prefix)) == 0
			   ? (char *)m->after + strlen(l->peer_prefix)
			   : "";
	pl.limit = m->limit && m->limit < LIST_PAGE_MAX ? m->limit : LIST_PAGE_MAX;
	f.body_case = TENSORD__PEER_FRAME__BODY_NAME_LIST;
	f.name_list = &pl;
	if (peer_send(rp->p, &f) < 0)
		list_fail(l, -ECONNRESET, "the connection to it was lost");
	return true;
}

/* Whether entry x of A's page may be shown: its name and descriptor pass this node's checks. */
static bool entry_ok(const Tensord__PeerNameListEntry *x)
{
	char reason[300];
	int64_t strides[TENSORD_NDIM_MAX];
	uint64_t nbytes;
	DLDataType dt;

	if (td_name_check(x->name, strlen(x->name), reason, sizeof(reason)) < 0 ||
	    td_desc_from_wire(x->dtype_code, x->dtype_bits, x->dtype_lanes, x->n_shape,
			      x->n_strides, true, &dt, reason, sizeof(reason)) < 0)
		return false;
	return td_layout(dt, (int32_t)x->n_shape, x->shape, x->strides, strides, &nbytes, reason,
			 sizeof(reason)) == 0 &&
	       nbytes == x->nbytes;
}

int rm_on_list_reply(struct rpeer *rp, const Tensord__PeerNameListReply *m, char *why,
		     size_t why_len)
{
	struct remote *rm = rp->rm;
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ListReply lr = TENSORD__LIST_REPLY__INIT;
	Tensord__TensorInfo *ti = NULL, **pi = NULL;
	Tensord__DType *dt = NULL;
	Tensord__Device *dev = NULL;
	char **names = NULL, *next = NULL;
	struct rlist *l;
	size_t n = m->n_entries, k;
	int r = 0;

	LIST_FOREACH(l, &rm->lists, link)
	if (l->id == m->id && l->rp == rp)
		break;
	if (!l)
		return 0; /* given up (its client went, or its timer) */
	if (m->status < 0) {
		list_fail(l, m->status >= -4095 ? m->status : -EPROTO,
			  m->error && m->error[0] ? m->error : "refused");
		return 0;
	}
	for (k = 0; k < n && entry_ok(m->entries[k]); k++)
		;
	if (k < n || n > LIST_PAGE_MAX) {
		snprintf(why, why_len, "a list page whose entry %zu fails this node's checks", k);
		list_fail(l, -EPROTO, "its answer fails this node's checks");
		return -EPROTO;
	}
	ti = calloc(n ? n : 1, sizeof(*ti));
	pi = calloc(n ? n : 1, sizeof(*pi));
	dt = calloc(n ? n : 1, sizeof(*dt));
	dev = calloc(n ? n : 1, sizeof(*dev));
	names = calloc(n ? n : 1, sizeof(*names));
	if (m->more && m->next)
		r = asprintf(&next, "%s%s", l->peer_prefix, m->next) < 0 ? -1 : 0;
	if (!ti || !pi || !dt || !dev || !names || r < 0) {
		list_fail(l, -ENOMEM, "out of memory for its answer");
		next = NULL;
		goto out;
	}
	for (k = 0; k < n; k++) {
		const Tensord__PeerNameListEntry *x = m->entries[k];

		if (asprintf(&names[k], "%s%s", l->peer_prefix, x->name) < 0) {
			names[k] = NULL;
			list_fail(l, -ENOMEM, "out of memory for its answer");
			goto out;
		}
		tensord__tensor_info__init(&ti[k]);
		tensord__dtype__init(&dt[k]);
		tensord__device__init(&dev[k]);
		dt[k].code = x->dtype_code;
		dt[k].bits = x->dtype_bits;
		dt[k].lanes = x->dtype_lanes;
		dev[k].type = x->device_type ? x->device_type : kDLCPU;
		dev[k].id = x->device_id;
		ti[k].name = names[k];
		ti[k].dtype = &dt[k];
		ti[k].n_shape = ti[k].n_strides = x->n_shape;
		ti[k].shape = x->shape;
		ti[k].strides = x->strides;
		ti[k].device = &dev[k];
		ti[k].nbytes = x->nbytes;
		ti[k].state = TENSORD__STATE__STATE_PUBLISHED;
		/* Uids do not cross: what it would be here, a replica, read-only. */
		ti[k].owner_uid = ti[k].owner_gid = REMOTE_PEER_UID;
		ti[k].mode = x->mode & 0444;
		ti[k].created_ns = x->created_ns;
		ti[k].generation = x->generation;
		ti[k].commit = x->commit;
		pi[k] = &ti[k];
	}
	lr.n_tensors = n;
	lr.tensors = pi;
	lr.more = next != NULL;
	lr.next = next ? next : "";
	rep.id = l->req_id;
	rep.body_case = TENSORD__REPLY__BODY_LIST;
	rep.list = &lr;
	if (l->cl)
		l->rm->env->hooks.reply(l->cl, &rep);
	list_free(l);
out:
	for (k = 0; names && k < n; k++)
		free(names[k]);
	free(names);
	free(next);
	free(dev);
	free(dt);
	free(pi);
	free(ti);
	return 0;
}

void rm_lists_fail(struct remote *rm, struct rpeer *rp, int status, const char *reason)
{
	struct rlist *l, *next;

	for (l = LIST_FIRST(&rm->lists); l; l = next) {
		next = LIST_NEXT(l, link);
		if (!rp || l->rp == rp)
			list_fail(l, status, reason);
	}
}

void rm_lists_client_gone(struct remote *rm, struct client *cl)
{
	struct rlist *l, *next;

	for (l = LIST_FIRST(&rm->lists); l; l = next) {
		next = LIST_NEXT(l, link);
		if (l->cl == cl)
			list_free(l);
	}
}
