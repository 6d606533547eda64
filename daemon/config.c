/*
 * The configuration file. Hand-written rather than a library's: the
 * format is the command line's long options, one per line, which no
 * config library parses more simply than these forty lines, and the keys
 * stay exactly the flags documented in tensord(8).
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int config_load(const char *path, bool required, const struct option *opts, config_apply_fn apply,
		void *ctx)
{
	FILE *f = fopen(path, "re");
	char *line = NULL;
	size_t cap = 0;
	unsigned lineno = 0;
	int r = 0;

	if (!f) {
		if (errno == ENOENT && !required)
			return 0;
		fprintf(stderr, "tensord: config file %s: %s\n", path, strerror(errno));
		return 2;
	}
	while (r == 0 && getline(&line, &cap, f) >= 0) {
		char *s = trim(line);

		lineno++;
		if (*s && *s != '#')
			r = config_line(path, lineno, s, opts, apply, ctx);
	}
	if (r == 0 && ferror(f)) {
		fprintf(stderr, "tensord: config file %s: read error\n", path);
		r = 2;
	}
	free(line);
	fclose(f);
	return r;
}
