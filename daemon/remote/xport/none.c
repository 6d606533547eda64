/*
 * The data path where the daemon was built without UCX (daemon/remote/xport.h):
 * peering still works, remote attach answers why it cannot.
 */
#include <errno.h>
#include <stdio.h>

#include "daemon/remote/xport.h"

int xport_init(struct xport **ret, uv_loop_t *loop, const struct xport_cbs *cbs, char *why,
	       size_t why_len)
{
	*ret = NULL;
	snprintf(why, why_len,
		 "this tensord was built without UCX (libucx-dev), which remote attach needs");
	return -ENOTSUP;
}

void xport_address(const struct xport *x, const void **ret_addr, size_t *ret_len)
{
	*ret_addr = NULL;
	*ret_len = 0;
}

const char *xport_describe(const struct xport *x)
{
	return "none";
}

int xport_connect(struct xport *x, const void *addr, size_t len, void *ep_ctx,
		  struct xport_ep **ret, char *why, size_t why_len)
{
	snprintf(why, why_len, "this tensord was built without UCX");
	return -ENOTSUP;
}

void xport_ep_close(struct xport_ep *ep)
{
}

int xport_send(struct xport_ep *ep, uint64_t tag, const void *buf, size_t len, void *arg)
{
	return -ENOTSUP;
}

void xport_counts(const struct xport *x, uint64_t *ret_sent, uint64_t *ret_received)
{
	*ret_sent = *ret_received = 0;
}

void xport_fini(struct xport *x)
{
}
