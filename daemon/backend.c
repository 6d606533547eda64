#include "backend.h"

/* Which backends exist is decided here and only here. The GPU backends are
 * always linked: they load their driver at run time, and without one their
 * init() says why and the daemon serves host memory alone. */
const struct tensord_backend_ops *const tensord_backends[] = {
	&tensord_backend_host,
	&tensord_backend_cuda,
	&tensord_backend_hip,
	NULL,
};
