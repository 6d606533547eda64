/*
 * libtensord: attach_many, a set of leases at one commit (docs/design.md,
 * "Versions, sets and watches"). Its reply comes in parts, each frame with
 * the descriptors of its leases; the set is built once all are in, by
 * tensord_attach_many() or, from an event loop, by ops.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"

int td_set_msg(tensord_client *c, struct td_set_req *m, const char *const *names, size_t n,
	       const char *prefix, uint64_t after, int timeout_ms)
{
	char why[300];
	size_t peer_len;

	tensord__request__init(&m->req);
	tensord__attach_many__init(&m->am);
	for (size_t i = 0; i < n; i++) {
		if (!names[i])
			return td_set_error(-EINVAL, "attach_many: name %zu is NULL", i);
		/* Another node's set names "@PEER/NAME" (docs/remote.md, "Sets"). */
		if (names[i][0] == '@'
			    ? td_remote_name_check(names[i], strlen(names[i]), &peer_len, why,
						   sizeof(why)) < 0
			    : td_name_check(names[i], strlen(names[i]), why, sizeof(why)) < 0)
			return td_set_error(-EINVAL, "%s", why);
	}
	prefix = prefix ? prefix : "";
	/* "@PEER/PREFIX", whose PEER/ alone is the whole export: tensord checks it. */
	if (!names && *prefix && *prefix != '@' &&
	    td_name_check(prefix, strlen(prefix), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "attach_many: prefix: %s", why);
	m->am.n_names = names ? n : 0;
	m->am.names = (char **)names;
	m->am.prefix = names ? "" : (char *)prefix;
	m->am.after = after;
	m->am.timeout_ms = timeout_ms;
	m->am.n_have_shares = td_mapcache_share_ids(&c->maps, m->have_shares, TD_SHARES_MAX);
	m->am.have_shares = m->have_shares;
	m->req.body_case = TENSORD__REQUEST__BODY_ATTACH_MANY;
	m->req.attach_many = &m->am;
	return 0;
}

void td_set_let_go(tensord_client *c, struct td_pending *p)
{
	for (struct td_part *part = p->parts; part; part = part->next)
		for (size_t i = 0; i < part->reply->attach_many->n_leases; i++)
			td_lease_end(c, part->reply->attach_many->leases[i]->lease);
	td_pending_clear(p);
}

int td_set_build(tensord_client *c, struct td_pending *p, tensord_set **ret_set)
{
	size_t n = 0, bytes = 0, k = 0;
	uint64_t commit = 0;
	tensord_set *s;
	char *names;
	int r = 0;

	for (struct td_part *part = p->parts; part; part = part->next) {
		Tensord__AttachManyReply *ar = part->reply->attach_many;

		commit = ar->commit;
		n += ar->n_leases;
		for (size_t i = 0; i < ar->n_leases; i++)
			bytes += ar->leases[i]->info ? strlen(ar->leases[i]->info->name) + 1 : 1;
	}
	s = calloc(1,
		   sizeof(*s) + n * (sizeof(char *) + sizeof(DLManagedTensorVersioned *)) + bytes);
	if (!s) {
		td_set_let_go(c, p);
		return td_set_error(-ENOMEM, "attach_many: out of memory for %zu tensors", n);
	}
	s->commit = commit;
	s->tensors = (DLManagedTensorVersioned **)(s + 1);
	s->names = (const char *const *)(s->tensors + n);
	names = (char *)(s->names + n);
	for (struct td_part *part = p->parts; part; part = part->next) {
		Tensord__AttachManyReply *ar = part->reply->attach_many;
		unsigned fd_at = 0;

		for (size_t i = 0; i < ar->n_leases; i++, k++) {
			Tensord__Lease *w = ar->leases[i];
			int fd = -1;
			struct td_lease *l;

			if (w->fd && fd_at < part->n_fds) {
				fd = part->fds[fd_at];
				part->fds[fd_at++] = -1; /* the lease's now */
			} else if (w->fd && r == 0) {
				r = td_set_error(-EPROTO, "attach_many: tensord sent fewer "
							  "descriptors than its leases say");
			}
			if (r < 0) {
				if (fd >= 0)
					close(fd);
				td_lease_end(c, w->lease);
				continue;
			}
			((const char **)s->names)[k] = names;
			snprintf(names, bytes, "%s", w->info ? w->info->name : "");
			bytes -= strlen(names) + 1;
			names += strlen(names) + 1;
			r = td_lease_from_reply(c, w, fd, NULL, false, &l);
			if (r == 0)
				r = td_lease_handle(l, &s->tensors[k]);
		}
	}
	s->n = k;
	td_pending_clear(p);
	if (r < 0) {
		tensord_set_free(s);
		return r;
	}
	*ret_set = s;
	return 0;
}

static int attach_many_once(tensord_client *c, const char *const *names, size_t n_names,
			    const char *prefix, uint64_t after, int timeout_ms,
			    const struct td_retry *rt, tensord_set **ret_set)
{
	struct td_pending p = { .multi = true };
	struct td_set_req m;
	int r = td_client_current(&c);

	if (r == 0 && !ret_set)
		r = td_set_error(-EINVAL, "attach_many: NULL output");
	if (r == 0)
		r = td_set_msg(c, &m, names, n_names, prefix, td_after_for(c, rt, after),
			       timeout_ms);
	if (r == 0)
		r = td_rpc_start(c, &m.req, &p);
	if (r < 0)
		return r;
	td_rpc_wait(c, &p);
	r = td_rpc_end(c, &p);
	if (r < 0) {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		td_set_let_go(c, &p);
		return td_set_error(r, "%s", saved);
	}
	return td_set_build(c, &p, ret_set);
}

int tensord_attach_many(tensord_client *c, const char *const *names, size_t n_names,
			const char *prefix, uint64_t after, int timeout_ms, tensord_set **ret_set)
{
	struct td_retry rt;
	int r;

	/* Its wait goes on over a new connection when the daemon restarts. */
	td_retry_begin(&rt, c, timeout_ms);
	do
		r = attach_many_once(c, names, n_names, prefix, after, timeout_ms, &rt, ret_set);
	while (r < 0 && td_retry_again(&rt, r, &timeout_ms));
	return r;
}

tensord_set *tensord_set_free(tensord_set *s)
{
	if (!s)
		return NULL;
	for (size_t i = 0; i < s->n; i++)
		if (s->tensors[i])
			s->tensors[i]->deleter(s->tensors[i]);
	free(s);
	return NULL;
}
