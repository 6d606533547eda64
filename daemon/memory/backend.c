#include "backend.h"

/* Which backends exist is decided here and only here: the host's, then one
 * per GPU vendor (common/vendor.h), each backend_<id> of gpu/<id>/. The GPU
 * backends are always linked: they load their driver at run time, and
 * without one their init() says why and the daemon serves host memory
 * alone. */
#define BACKEND_GPU(id, ...) &backend_##id,
const struct backend_ops *const backends[] = {
	&backend_host,
	TD_GPU_VENDORS(BACKEND_GPU) /* backend_<id>, one per vendor */
	NULL,
};
#undef BACKEND_GPU
