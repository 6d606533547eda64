/*
 * The optional configuration file (/etc/tensord.conf, or --config FILE):
 * "key = value" lines whose keys are the daemon's long options, so the
 * file and the command line say the same things the same way.
 */
#ifndef TENSORD_CONFIG_H
#define TENSORD_CONFIG_H

#include <getopt.h>
#include <stdbool.h>

/* The largest config file read: far more than every option takes. */
#define CONFIG_MAX_BYTES (1 << 20)

/*
 * Applies one setting. opt is the matching entry of the option table.
 * Returns 0; 2 (an exit status) after printing why value is wrong; or
 * -ENOENT when opt may be given on the command line only.
 */
typedef int (*config_apply_fn)(const struct option *opt, const char *value, void *ctx);

/*
 * Reads path line by line: blank lines and lines starting with '#' are
 * skipped; every other line is "key = value", where key is the long name
 * of an option in opts that takes an argument, and value runs to the end
 * of the line, surrounding blanks trimmed. Each line is handed to apply in
 * file order. path must be a regular file of at most CONFIG_MAX_BYTES with
 * no NUL byte (anything else is refused, not read: /dev/zero is endless).
 * Returns 0 (also when path does not exist and !required), or 2 after
 * printing a message that names path (and the line, when there is one).
 */
int config_load(const char *path, bool required, const struct option *opts, config_apply_fn apply,
		void *ctx);

#endif
