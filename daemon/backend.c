#include "backend.h"

/* Which backends exist is decided here and only here. The GPU backends are
 * always linked: they load their driver at run time, and without one their
 * init() says why and the daemon serves host memory alone. */
const struct backend_ops *const backends[] = {
	&backend_host,
	&backend_cuda,
	&backend_hip,
	NULL,
};
