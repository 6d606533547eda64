/*
 * The daemon's options: the command line and the config file
 * (/etc/tensord.conf, or --config FILE) under it; a flag overrides the
 * file's line. Every option is a long one (tensord --help lists them).
 */
#ifndef TENSORD_OPTIONS_H
#define TENSORD_OPTIONS_H

#include "server.h"

/*
 * Fills cfg (and *ready_fd, left as it is without --ready-fd) from argv
 * and the config file, with the defaults for what neither sets. -1 to go on; else the
 * status to exit with (0 after --help or --version, 2 on a usage or
 * config error, with the reason on stderr).
 */
int options_parse(int argc, char **argv, struct server_config *cfg, int *ready_fd);

#endif /* TENSORD_OPTIONS_H */
