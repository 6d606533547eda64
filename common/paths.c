/* The socket path rule of CONTRACT §2, shared by the daemon and its clients
 * so that with no settings at all they find each other. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <tensord/tensord.h>

int tensord_default_socket_path(char *buf, size_t len)
{
	const char *env = getenv("TENSORD_SOCKET");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(buf, len, "%s/tensord.sock", env);
	else if (geteuid() == 0)
		n = snprintf(buf, len, "/run/tensord/tensord.sock");
	else
		n = snprintf(buf, len, "/tmp/tensord-%u.sock", (unsigned)geteuid());
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}
