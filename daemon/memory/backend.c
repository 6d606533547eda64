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

/* Told of each memory descriptor before it closes for good (docs/restart.md). */
static void (*release_hook)(int fd);

void backend_set_release_hook(void (*fn)(int fd))
{
	release_hook = fn;
	backend_host_watch_slabs(fn);
}

void backend_released(int fd)
{
	if (fd >= 0 && release_hook)
		release_hook(fd);
}
