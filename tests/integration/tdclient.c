/*
 * tdclient: a real libtensord client process that integration tests drive
 * one command per line on stdin. Each command prints one line: "ok ..." or
 * "err NAME message". Tensors it holds are kept by name until released.
 *
 *   connect [SOCK]            create NAME DTYPE N [mutable] [connection] [mode=OCT]
 *   publish NAME              attach NAME TIMEOUT_MS
 *   legacy NAME TIMEOUT_MS    fill NAME BYTE
 *   (attach and legacy take an optional ALIAS to hold a second lease)
 *   read NAME INDEX           write NAME INDEX BYTE
 *   sum NAME                  release NAME
 *   unlink NAME               stat NAME
 *   stats                     close
 *   fork-hold NAME            (forks a child that keeps the mapping, for EBUSY)
 *   exit
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensord/tensord.h>

#define HELD_MAX 64

static struct {
	char name[TENSORD_NAME_MAX + 1];
	DLManagedTensorVersioned *t;
	DLManagedTensor *legacy;
	uint64_t nbytes;
} held[HELD_MAX];

static tensord_client *client;

static int slot_of(const char *name, bool create)
{
	for (int i = 0; i < HELD_MAX; i++)
		if ((held[i].t || held[i].legacy) && strcmp(held[i].name, name) == 0)
			return i;
	if (!create)
		return -1;
	for (int i = 0; i < HELD_MAX; i++) {
		if (!held[i].t && !held[i].legacy) {
			snprintf(held[i].name, sizeof(held[i].name), "%s", name);
			return i;
		}
	}
	return -1;
}

static uint8_t *data_of(int s)
{
	DLTensor *t = held[s].t ? &held[s].t->dl_tensor : &held[s].legacy->dl_tensor;

	return (uint8_t *)t->data + t->byte_offset;
}

static void fail(int r)
{
	printf("err %s %s\n", tensord_err_name(r), tensord_last_error());
}

static uint64_t bytes_of(const DLTensor *t)
{
	uint64_t n = (t->dtype.bits * t->dtype.lanes + 7) / 8;

	for (int i = 0; i < t->ndim; i++)
		n *= (uint64_t)t->shape[i];
	return n;
}

static void cmd(char *line)
{
	char *argv[8] = { 0 };
	int argc = 0, r, s;

	for (char *tok = strtok(line, " \t\n"); tok && argc < 8; tok = strtok(NULL, " \t\n"))
		argv[argc++] = tok;
	if (!argc)
		return;
	const char *c = argv[0], *name = argc > 1 ? argv[1] : "";

	if (!strcmp(c, "connect")) {
		r = tensord_connect(argc > 1 ? argv[1] : NULL, &client);
		r < 0 ? fail(r) : (void)printf("ok\n");
	} else if (!strcmp(c, "create") && argc >= 4) {
		tensord_spec sp = { .ndim = 1, .device = { kDLCPU, 0 } };
		int64_t n = atoll(argv[3]);

		sp.shape = &n;
		if (tensord_dtype_parse(argv[2], &sp.dtype) < 0) {
			printf("err EINVAL bad dtype\n");
			return;
		}
		for (int i = 4; i < argc; i++) {
			if (!strcmp(argv[i], "mutable"))
				sp.flags |= TENSORD_MUTABLE;
			else if (!strcmp(argv[i], "connection"))
				sp.flags |= TENSORD_LIFETIME_CONNECTION;
			else if (!strncmp(argv[i], "mode=", 5))
				sp.mode = (uint32_t)strtoul(argv[i] + 5, NULL, 8);
		}
		s = slot_of(name, true);
		r = tensord_create(client, name, &sp, &held[s].t);
		if (r < 0) {
			fail(r);
			return;
		}
		held[s].nbytes = bytes_of(&held[s].t->dl_tensor);
		printf("ok readonly=%d\n", (int)(held[s].t->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
	} else if (!strcmp(c, "publish")) {
		r = tensord_publish(client, name);
		r < 0 ? fail(r) : (void)printf("ok\n");
	} else if ((!strcmp(c, "attach") || !strcmp(c, "legacy")) && argc >= 3) {
		int timeout = atoi(argv[2]);
		const char *key = argc > 3 ? argv[3] : name;

		s = slot_of(key, false);
		if (s >= 0) {
			printf("err EEXIST already held here\n");
			return;
		}
		s = slot_of(key, true);
		if (c[0] == 'a') {
			r = tensord_attach(client, name, timeout, &held[s].t);
			if (r < 0) {
				fail(r);
				return;
			}
			held[s].nbytes = bytes_of(&held[s].t->dl_tensor);
			printf("ok readonly=%d\n",
			       (int)(held[s].t->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
		} else {
			r = tensord_attach_legacy(client, name, timeout, &held[s].legacy);
			if (r < 0) {
				fail(r);
				return;
			}
			held[s].nbytes = bytes_of(&held[s].legacy->dl_tensor);
			printf("ok\n");
		}
	} else if (!strcmp(c, "fill") && argc >= 3) {
		s = slot_of(name, false);
		if (s < 0) {
			printf("err ENOENT not held\n");
			return;
		}
		memset(data_of(s), atoi(argv[2]), held[s].nbytes);
		printf("ok\n");
	} else if (!strcmp(c, "read") && argc >= 3) {
		s = slot_of(name, false);
		uint64_t i = strtoull(argv[2], NULL, 10);

		if (s < 0 || i >= held[s].nbytes) {
			printf("err EINVAL not held or out of range\n");
			return;
		}
		printf("ok %u\n", data_of(s)[i]);
	} else if (!strcmp(c, "write") && argc >= 4) {
		s = slot_of(name, false);
		uint64_t i = strtoull(argv[2], NULL, 10);

		if (s < 0 || i >= held[s].nbytes) {
			printf("err EINVAL not held or out of range\n");
			return;
		}
		data_of(s)[i] = (uint8_t)atoi(argv[3]);
		printf("ok\n");
	} else if (!strcmp(c, "sum")) {
		uint64_t sum = 0;

		s = slot_of(name, false);
		if (s < 0) {
			printf("err ENOENT not held\n");
			return;
		}
		for (uint64_t i = 0; i < held[s].nbytes; i++)
			sum += data_of(s)[i];
		printf("ok %llu\n", (unsigned long long)sum);
	} else if (!strcmp(c, "release")) {
		s = slot_of(name, false);
		if (s < 0) {
			printf("err ENOENT not held\n");
			return;
		}
		if (held[s].t)
			held[s].t->deleter(held[s].t);
		else
			held[s].legacy->deleter(held[s].legacy);
		held[s].t = NULL;
		held[s].legacy = NULL;
		printf("ok\n");
	} else if (!strcmp(c, "unlink")) {
		r = tensord_unlink(client, name);
		r < 0 ? fail(r) : (void)printf("ok\n");
	} else if (!strcmp(c, "stat")) {
		tensord_info in;

		r = tensord_stat(client, name, &in);
		if (r < 0) {
			fail(r);
			return;
		}
		printf("ok refcount=%u state=%d nbytes=%llu mode=%o owner=%u flags=%u\n", in.refcount,
		       in.state, (unsigned long long)in.nbytes, in.mode, in.owner_uid, in.flags);
	} else if (!strcmp(c, "stats")) {
		tensord_daemon_stats st;

		r = tensord_stats(client, &st, sizeof(st));
		if (r < 0) {
			fail(r);
			return;
		}
		printf("ok tensors=%llu clients=%llu leases=%llu used=%llu capacity=%llu\n",
		       (unsigned long long)st.tensors, (unsigned long long)st.clients,
		       (unsigned long long)st.leases, (unsigned long long)st.devices[0].bytes_used,
		       (unsigned long long)st.devices[0].bytes_capacity);
	} else if (!strcmp(c, "fork-hold")) {
		pid_t pid = fork();

		if (pid == 0) {
			/* The child inherits every mapping; it only sleeps. */
			sleep(30);
			_exit(0);
		}
		printf("ok %d\n", (int)pid);
	} else if (!strcmp(c, "close")) {
		client = tensord_close(client);
		printf("ok\n");
	} else if (!strcmp(c, "exit")) {
		printf("ok\n");
		fflush(stdout);
		exit(0);
	} else {
		printf("err EINVAL unknown command %s\n", c);
	}
}

int main(void)
{
	char line[1024];

	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin))
		cmd(line);
	return 0;
}
