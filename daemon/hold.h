/*
 * tensord --hold DIR (hold.c, docs/restart.md section 6): keeps the
 * descriptors a daemon started with --holder DIR stores, across that
 * daemon's crash, restart or upgrade, where there is no systemd.
 */
#ifndef TENSORD_HOLD_H
#define TENSORD_HOLD_H

/* Runs the holder until SIGTERM or SIGINT: the process's exit status. */
int hold_main(const char *dir);

#endif
