/*
 * The configuration file. Hand-written rather than a library's: the
 * format is the command line's long options, one per line, which no
 * config library parses more simply than the lines below, and the keys
 * stay exactly the flags documented in tensord(8).
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/paths.h"

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

static const struct option *find_key(const struct option *opts, const char *key)
{
	for (; opts->name; opts++)
		if (opts->has_arg == required_argument && strcmp(opts->name, key) == 0)
			return opts;
	return NULL;
}

/* One non-comment line. 0, or 2 with the complaint printed. */
static int config_line(const char *path, unsigned lineno, char *line, const struct option *opts,
		       config_apply_fn apply, void *ctx)
{
	char *eq = strchr(line, '='), *key, *value;
	const struct option *o;
	int r;

	if (!eq) {
		fprintf(stderr, "tensord: %s:%u: expected 'key = value', got '%s'\n", path, lineno,
			line);
		return 2;
	}
	*eq = '\0';
	key = trim(line);
	value = trim(eq + 1);
	o = find_key(opts, key);
	r = o && *value ? apply(o, value, ctx) : -ENOENT;
	if (r == -ENOENT && o && *value)
		fprintf(stderr, "tensord: %s:%u: '%s' can only be given on the command line\n",
			path, lineno, key);
	else if (r == -ENOENT && o)
		fprintf(stderr, "tensord: %s:%u: '%s' has no value\n", path, lineno, key);
	else if (r == -ENOENT)
		fprintf(stderr,
			"tensord: %s:%u: unknown key '%s' (keys are the long options, "
			"see tensord --help)\n",
			path, lineno, key);
	else if (r)
		fprintf(stderr, "tensord: %s:%u: bad value for '%s'\n", path, lineno, key);
	return r ? 2 : 0;
}

/*
 * The file's bytes, NUL-terminated, into *ret (malloc'ed). Only a regular
 * file is read (not /dev/zero, a FIFO or a directory), at most
 * CONFIG_MAX_BYTES of it, and a NUL byte is refused with its line: the
 * lines are C strings, so the rest of that line would be dropped unseen.
 * 0, -ENOENT when missing (nothing printed), or 2 with the reason printed.
 */
static int read_file(const char *path, char **ret, size_t *ret_len)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	struct stat st;
	char *buf = NULL, *nul;
	size_t len = 0;
	ssize_t n;

	if (fd < 0) {
		if (errno == ENOENT)
			return -ENOENT;
		fprintf(stderr, "tensord: config file %s: %s\n", path, strerror(errno));
		return 2;
	}
	if (fstat(fd, &st) < 0) {
		fprintf(stderr, "tensord: config file %s: %s\n", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		fprintf(stderr, "tensord: config file %s: is a %s, not a regular file\n", path,
			td_file_type(st.st_mode));
		goto fail;
	}
	if (st.st_size > CONFIG_MAX_BYTES)
		goto too_big;
	/* One byte more than the limit: a file that grew since fstat is seen. */
	buf = malloc(CONFIG_MAX_BYTES + 2);
	if (!buf) {
		fprintf(stderr, "tensord: config file %s: out of memory\n", path);
		goto fail;
	}
	while (len <= CONFIG_MAX_BYTES &&
	       (n = read(fd, buf + len, CONFIG_MAX_BYTES + 1 - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fprintf(stderr, "tensord: config file %s: read error: %s\n", path,
				strerror(errno));
			goto fail;
		}
		len += (size_t)n;
	}
	if (len > CONFIG_MAX_BYTES)
		goto too_big;
	buf[len] = '\0';
	nul = memchr(buf, '\0', len);
	if (nul) {
		unsigned line = 1;

		for (const char *p = buf; p < nul; p++)
			line += *p == '\n';
		fprintf(stderr, "tensord: %s:%u: contains a NUL byte\n", path, line);
		goto fail;
	}
	close(fd);
	*ret = buf;
	*ret_len = len;
	return 0;

too_big:
	fprintf(stderr, "tensord: config file %s: larger than the limit of %d bytes (1 MiB)\n",
		path, CONFIG_MAX_BYTES);
fail:
	free(buf);
	close(fd);
	return 2;
}

int config_load(const char *path, bool required, const struct option *opts, config_apply_fn apply,
		void *ctx)
{
	char *buf, *line, *next;
	size_t len;
	unsigned lineno = 0;
	int r = read_file(path, &buf, &len);

	if (r == -ENOENT && !required)
		return 0;
	if (r == -ENOENT) {
		fprintf(stderr, "tensord: config file %s: %s\n", path, strerror(ENOENT));
		return 2;
	}
	if (r)
		return r;
	for (line = buf; r == 0 && line < buf + len; line = next) {
		char *eol = strchr(line, '\n'), *s;

		next = eol ? eol + 1 : line + strlen(line);
		if (eol)
			*eol = '\0';
		s = trim(line);
		lineno++;
		if (*s && *s != '#')
			r = config_line(path, lineno, s, opts, apply, ctx);
	}
	free(buf);
	return r;
}
