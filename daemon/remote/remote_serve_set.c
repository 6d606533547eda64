/*
 * Remote attach, node A: set pulls (docs/remote.md, "What is built": "Sets").
 * A set's members resolved as a local AttachMany by the peer's uid
 * (REMOTE_PEER_UID), each checked as a single pull's and leased in one
 * step, so all of one commit; then the SetPullReply and one PullReply per
 * member, each member served as a single pull (remote_serve.c). Or the
 * whole set refused, naming why.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/desc.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

static void set_pull_refuse(struct rpeer *rp, uint64_t id, int status, const char *why)
{
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSetPullReply m = TENSORD__PEER_SET_PULL_REPLY__INIT;

	m.id = id;
	m.status = status;
	m.error = (char *)why;
	f.body_case = TENSORD__PEER_FRAME__BODY_SET_PULL_REPLY;
	f.set_pull_reply = &m;
	rm_send_frame(rp, &f);
}

/*
 * The members of set pull m as rp may pull them (*ret_v, n; the caller
 * frees the array): resolved in one step as a local AttachMany by uid
 * REMOTE_PEER_UID, a listed name not exported told apart from one not
 * published to nobody, the names under a prefix that are not exported to
 * rp left out (as those it may not read are). 0 or -errno with the reason.
 */
static int set_members(struct rpeer *rp, const Tensord__PeerSetPull *m, struct tensor ***ret_v,
		       size_t *ret_n, uint64_t *ret_commit, char *why, size_t why_len)
{
	struct remote_env *env = rp->rm->env;
	Tensord__AttachMany am = TENSORD__ATTACH_MANY__INIT;
	const char *self = env->peers->self, *peer = rp->p->name;
	struct tensor **v;
	char reason[400];
	size_t n, k = 0;
	int r;

	if (m->n_names > REMOTE_SET_MAX) {
		snprintf(why, why_len, "node %s: a set of %zu names; at most %u", self, m->n_names,
			 REMOTE_SET_MAX);
		return -E2BIG;
	}
	for (size_t i = 0; i < m->n_names; i++) {
		size_t len = strlen(m->names[i]);

		if (td_name_check(m->names[i], len, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "node %s: %s", self, reason);
			return -EINVAL;
		}
		/* As a single pull's: not exported and not published told apart to nobody. */
		if (!remote_exported(env->cfg, peer, m->names[i], len) ||
		    !registry_published(env->reg, m->names[i], len)) {
			snprintf(why, why_len,
				 "tensor '%s' is not published on node %s, or not exported to "
				 "node %s",
				 m->names[i], self, peer);
			return -ENOENT;
		}
		r = rm_pull_may_read(rp, m->names[i], len, why, why_len);
		if (r < 0)
			return r;
	}
	am.n_names = m->n_names;
	am.names = m->names;
	am.prefix = m->prefix;
	r = env->hooks.set_members(env->reg, &rp->rc, &am, &v, &n, ret_commit, reason,
				   sizeof(reason));
	if (r == -ENOENT)
		snprintf(why, why_len, "node %s: %s (not published, or not exported to node %s)",
			 self, reason, peer);
	else if (r < 0)
		snprintf(why, why_len, "node %s, acting as uid %u for peers: %s", self,
			 REMOTE_PEER_UID, reason);
	if (r < 0)
		return r;
	/* The set's commit is its members' newest: those left out do not count. */
	*ret_commit = 0;
	for (size_t i = 0; i < n; i++) {
		if (!remote_exported(env->cfg, peer, v[i]->name, v[i]->name_len))
			continue;
		v[k++] = v[i];
		if (v[i]->commit > *ret_commit)
			*ret_commit = v[i]->commit;
	}
	if (k > REMOTE_SET_MAX) {
		free(v);
		snprintf(why, why_len, "node %s: prefix '%s' has %zu members; a set has at most %u",
			 self, m->prefix, k, REMOTE_SET_MAX);
		return -E2BIG;
	}
	*ret_v = v;
	*ret_n = k;
	return 0;
}

/*
 * A set pull: every member resolved, checked and leased in this one step
 * (so all of one commit: nothing else runs on the loop meanwhile), or the
 * whole set refused naming the member; then the SetPullReply and one
 * PullReply per member.
 */
void rm_on_set_pull(struct rpeer *rp, const Tensord__PeerSetPull *m)
{
	struct remote_env *env = rp->rm->env;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSetPullReply rep = TENSORD__PEER_SET_PULL_REPLY__INIT;
	struct tensor **v = NULL, *t;
	uint64_t *lease, commit = 0;
	char why[800];
	size_t n = 0, i;
	bool writable;
	int r = set_members(rp, m, &v, &n, &commit, why, sizeof(why));

	for (i = 0; r == 0 && i < n; i++)
		r = rm_serve_check(env, v[i], why, sizeof(why));
	if (r == 0 && rp->n_serves + n > REMOTE_SERVES_MAX) {
		snprintf(why, sizeof(why),
			 "node %s: node %s holds %u pull leases already; a set of %zu more "
			 "passes the most, %d",
			 env->peers->self, rp->p->name, rp->n_serves, n, REMOTE_SERVES_MAX);
		r = -EAGAIN;
	}
	lease = r == 0 ? calloc(n ? n : 1, sizeof(*lease)) : NULL;
	if (r == 0 && !lease) {
		snprintf(why, sizeof(why), "node %s: out of memory", env->peers->self);
		r = -ENOMEM;
	}
	for (i = 0; r == 0 && i < n; i++)
		r = registry_attach(env->reg, &rp->rc, v[i]->name, v[i]->name_len, &t, &lease[i],
				    &writable, why, sizeof(why));
	if (r < 0) {
		for (size_t j = 0; j + 1 < i; j++)
			registry_release(env->reg, &rp->rc, lease[j]);
		set_pull_refuse(rp, m->id, r, why);
		free(lease);
		free(v);
		return;
	}
	rep.id = m->id;
	rep.commit = commit;
	rep.count = (uint32_t)n;
	f.body_case = TENSORD__PEER_FRAME__BODY_SET_PULL_REPLY;
	f.set_pull_reply = &rep;
	rm_send_frame(rp, &f);
	log_debug("peer %s: set pull %" PRIu64 ": %zu members of commit %" PRIu64 " leased",
		  rp->p->name, m->id, n, commit);
	for (i = 0; i < n; i++)
		rm_serve_reply(rp, m->id + 1 + i, v[i], lease[i], v[i]->name);
	free(lease);
	free(v);
}
