/*
 * The release hook (backend.h, docs/restart.md): backends tell whoever
 * keeps the descriptor store of each memory descriptor the daemon is about
 * to close for good. A file of its own so that every backend, and the
 * unit tests that link one, can call it without the others.
 */
#include "backend.h"

static void (*release_hook)(int fd);

void backend_set_release_hook(void (*fn)(int fd))
{
	release_hook = fn;
}

void backend_released(int fd)
{
	if (fd >= 0 && release_hook)
		release_hook(fd);
}
