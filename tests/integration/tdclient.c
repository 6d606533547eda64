/*
 * tdclient: a real libtensord client process that integration tests drive
 * one command per line on stdin. Each command prints one line: "ok ..." or
 * "err NAME message". Tensors it holds are kept by name until released.
 *
 *   connect [SOCK]            create NAME DTYPE N [mutable] [connection] [replace] [mode=OCT]
 *   publish NAME              attach NAME TIMEOUT_MS
 *   legacy NAME TIMEOUT_MS    fill NAME BYTE
 *   (attach and legacy take an optional ALIAS to hold a second lease)
 *   read NAME INDEX           write NAME INDEX BYTE
 *   sum NAME                  release NAME
 *   unlink NAME               stat NAME
 *   stats                     close
 *   fork-hold NAME            (forks a child that keeps the mapping, for EBUSY)
 *   exit
 *
 * Versions, sets and watches (each tensor of a set holds one int64 value in
 * every element, and commands that read a set check that):
 *   putmany PREFIX COUNT ELEMS VALUE [replace]   one commit: COUNT tensors
 *   tx begin | tx put NAME ELEMS VALUE [replace] | tx unlink NAME | tx commit | tx abort
 *   many PREFIX AFTER TIMEOUT_MS  attach_many of a prefix: "ok n=N commit=C value=V"
 *   after NAME AFTER TIMEOUT_MS   attach_after: "ok generation=G value=V"
 *   async NAME AFTER TIMEOUT_MS [cancel]  the same through tensord_attach_start and
 *                                 tensord_poll (cancel: cancelled after 50 ms)
 *   watch PREFIX N TIMEOUT_MS     N events of a new watch: "ok kind:name:gen ..."
 *
 * Checkpoint files (issue 34):
 *   putfile PREFIX PATH [replace]     tensord_put_file(): "ok commit=C n=N first=NAME"
 *   getfd PREFIX PATH npy|safetensors tensord_get_file_fd() into PATH, opened here
 *                                     (a descriptor, as a pipe would be): "ok commit=C n=N"
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

/* The result of a call that prints nothing else. */
static void done(int r)
{
	r < 0 ? fail(r) : (void)printf("ok\n");
}

/* The held slot of name, or -1 after printing why not. */
static int held_slot(const char *name)
{
	int s = slot_of(name, false);

	if (s < 0)
		printf("err ENOENT not held\n");
	return s;
}

/* The held slot of name with byte index arg in range, or -1 after printing why not. */
static int held_byte(const char *name, const char *arg, uint64_t *ret_i)
{
	int s = slot_of(name, false);

	*ret_i = strtoull(arg, NULL, 10);
	if (s < 0 || *ret_i >= held[s].nbytes) {
		printf("err EINVAL not held or out of range\n");
		return -1;
	}
	return s;
}

static void do_connect(int argc, char **argv)
{
	done(tensord_connect(argc > 1 ? argv[1] : NULL, &client));
}

static void do_create(int argc, char **argv)
{
	tensord_spec sp = { .ndim = 1, .device = { kDLCPU, 0 } };
	int64_t n = atoll(argv[3]);
	int r, s;

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
		else if (!strcmp(argv[i], "replace"))
			sp.flags |= TENSORD_REPLACE;
		else if (!strncmp(argv[i], "mode=", 5))
			sp.mode = (uint32_t)strtoul(argv[i] + 5, NULL, 8);
	}
	s = slot_of(argv[1], true);
	r = tensord_create(client, argv[1], &sp, &held[s].t);
	if (r < 0) {
		fail(r);
		return;
	}
	held[s].nbytes = bytes_of(&held[s].t->dl_tensor);
	printf("ok readonly=%d\n", (int)(held[s].t->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
}

static void do_publish(int argc, char **argv)
{
	done(tensord_publish(client, argc > 1 ? argv[1] : ""));
}

/* attach NAME TIMEOUT [ALIAS] and legacy NAME TIMEOUT [ALIAS]. */
static void do_attach(int argc, char **argv)
{
	const char *name = argv[1], *key = argc > 3 ? argv[3] : name;
	int timeout = atoi(argv[2]), r, s;

	if (slot_of(key, false) >= 0) {
		printf("err EEXIST already held here\n");
		return;
	}
	s = slot_of(key, true);
	if (argv[0][0] == 'a') {
		r = tensord_attach(client, name, timeout, &held[s].t);
		if (r < 0) {
			fail(r);
			return;
		}
		held[s].nbytes = bytes_of(&held[s].t->dl_tensor);
		printf("ok readonly=%d\n", (int)(held[s].t->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
		return;
	}
	r = tensord_attach_legacy(client, name, timeout, &held[s].legacy);
	if (r < 0) {
		fail(r);
		return;
	}
	held[s].nbytes = bytes_of(&held[s].legacy->dl_tensor);
	printf("ok\n");
}

static void do_fill(int argc, char **argv)
{
	int s = held_slot(argv[1]);

	if (s < 0)
		return;
	memset(data_of(s), atoi(argv[2]), held[s].nbytes);
	printf("ok\n");
}

static void do_read(int argc, char **argv)
{
	uint64_t i;
	int s = held_byte(argv[1], argv[2], &i);

	if (s >= 0)
		printf("ok %u\n", data_of(s)[i]);
}

static void do_write(int argc, char **argv)
{
	uint64_t i;
	int s = held_byte(argv[1], argv[2], &i);

	if (s < 0)
		return;
	data_of(s)[i] = (uint8_t)atoi(argv[3]);
	printf("ok\n");
}

static void do_sum(int argc, char **argv)
{
	uint64_t sum = 0;
	int s = held_slot(argc > 1 ? argv[1] : "");

	if (s < 0)
		return;
	for (uint64_t i = 0; i < held[s].nbytes; i++)
		sum += data_of(s)[i];
	printf("ok %llu\n", (unsigned long long)sum);
}

static void do_release(int argc, char **argv)
{
	int s = held_slot(argc > 1 ? argv[1] : "");

	if (s < 0)
		return;
	if (held[s].t)
		held[s].t->deleter(held[s].t);
	else
		held[s].legacy->deleter(held[s].legacy);
	held[s].t = NULL;
	held[s].legacy = NULL;
	printf("ok\n");
}

static void do_unlink(int argc, char **argv)
{
	done(tensord_unlink(client, argc > 1 ? argv[1] : ""));
}

static void do_stat(int argc, char **argv)
{
	tensord_info in;
	int r = tensord_stat(client, argc > 1 ? argv[1] : "", &in);

	if (r < 0) {
		fail(r);
		return;
	}
	printf("ok refcount=%u state=%d nbytes=%llu mode=%o owner=%u flags=%u\n", in.refcount,
	       in.state, (unsigned long long)in.nbytes, in.mode, in.owner_uid, in.flags);
}

static void do_stats(int argc, char **argv)
{
	tensord_daemon_stats st;
	int r = tensord_stats(client, &st, sizeof(st));

	if (r < 0) {
		fail(r);
		return;
	}
	printf("ok tensors=%llu clients=%llu leases=%llu used=%llu capacity=%llu pid=%u "
	       "dev_tensors=%u pool_budget=%llu\n",
	       (unsigned long long)st.tensors, (unsigned long long)st.clients,
	       (unsigned long long)st.leases, (unsigned long long)st.devices[0].bytes_used,
	       (unsigned long long)st.devices[0].bytes_capacity, st.daemon_pid,
	       st.devices[0].tensors, (unsigned long long)st.host_pool_budget);
}

static void do_fork_hold(int argc, char **argv)
{
	pid_t pid = fork();

	if (pid == 0) {
		/* The child inherits every mapping; it only sleeps. */
		sleep(30);
		_exit(0);
	}
	printf("ok %d\n", (int)pid);
}

static void do_close(int argc, char **argv)
{
	client = tensord_close(client);
	printf("ok\n");
}

/* An int64 array of elems values v, as a DLTensor over buf (the caller's). */
static DLTensor int64s(int64_t *buf, int64_t *shape, int64_t elems, int64_t v)
{
	for (int64_t i = 0; i < elems; i++)
		buf[i] = v;
	*shape = elems;
	return (DLTensor){ .data = buf,
			   .device = { kDLCPU, 0 },
			   .ndim = 1,
			   .dtype = { kDLInt, 64, 1 },
			   .shape = shape };
}

/* The value every element of t holds, or -1 when they differ. */
static int64_t value_of(const DLManagedTensorVersioned *t)
{
	const int64_t *p =
		(const int64_t *)((const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset);
	int64_t n = t->dl_tensor.ndim ? t->dl_tensor.shape[0] : 1;

	for (int64_t i = 1; i < n; i++)
		if (p[i] != p[0])
			return -1;
	return n ? p[0] : 0;
}

static void do_putmany(int argc, char **argv)
{
	int count = atoi(argv[2]);
	int64_t elems = atoll(argv[3]), v = atoll(argv[4]);
	bool replace = argc > 5 && !strcmp(argv[5], "replace");
	tensord_put_item *items = calloc((size_t)count, sizeof(*items));
	int64_t *bufs = calloc((size_t)(count * elems + 1), sizeof(int64_t));
	int64_t *shapes = calloc((size_t)count, sizeof(int64_t));
	DLTensor *src = calloc((size_t)count, sizeof(*src));
	char(*names)[64] = calloc((size_t)count, sizeof(*names));
	uint64_t commit = 0;
	int r;

	for (int i = 0; i < count; i++) {
		snprintf(names[i], sizeof(names[i]), "%s%d", argv[1], i);
		src[i] = int64s(bufs + i * elems, &shapes[i], elems, v);
		items[i] = (tensord_put_item){ names[i], &src[i] };
	}
	r = tensord_put_many(client, items, (size_t)count, replace ? TENSORD_REPLACE : 0, 0,
			     &commit);
	if (r < 0)
		fail(r);
	else
		printf("ok commit=%llu\n", (unsigned long long)commit);
	free(names);
	free(src);
	free(shapes);
	free(bufs);
	free(items);
}

static tensord_tx *tx;

static void do_tx(int argc, char **argv)
{
	uint64_t commit = 0;
	int r;

	if (!strcmp(argv[1], "begin")) {
		r = tensord_tx_begin(client, &tx);
	} else if (!strcmp(argv[1], "put") && argc >= 5) {
		int64_t elems = atoll(argv[3]), shape;
		int64_t *buf = calloc((size_t)elems + 1, sizeof(*buf));
		DLTensor src = int64s(buf, &shape, elems, atoll(argv[4]));

		r = tensord_tx_put(tx, argv[2], &src,
				   argc > 5 && !strcmp(argv[5], "replace") ? TENSORD_REPLACE : 0,
				   0);
		free(buf);
	} else if (!strcmp(argv[1], "unlink") && argc >= 3) {
		r = tensord_tx_unlink(tx, argv[2]);
	} else if (!strcmp(argv[1], "commit")) {
		r = tensord_tx_commit(tx, &commit);
		tx = tensord_tx_free(tx);
		if (r == 0) {
			printf("ok commit=%llu\n", (unsigned long long)commit);
			return;
		}
	} else if (!strcmp(argv[1], "abort")) {
		r = tensord_tx_abort(tx);
		tx = tensord_tx_free(tx);
	} else {
		printf("err EINVAL tx begin|put|unlink|commit|abort\n");
		return;
	}
	done(r);
}

static void do_many(int argc, char **argv)
{
	tensord_set *s;
	int64_t v = -2;
	int r = tensord_attach_many(client, NULL, 0, argv[1], strtoull(argv[2], NULL, 10),
				    atoi(argv[3]), &s);

	if (r < 0) {
		fail(r);
		return;
	}
	for (size_t i = 0; i < s->n; i++) {
		int64_t x = value_of(s->tensors[i]);

		v = i == 0 ? x : (x == v ? v : -1); /* -1: a mixed set */
	}
	printf("ok n=%zu commit=%llu value=%lld\n", s->n, (unsigned long long)s->commit,
	       (long long)v);
	tensord_set_free(s);
}

static void print_attached(DLManagedTensorVersioned *t)
{
	tensord_info info;

	tensord_tensor_info(t, &info);
	printf("ok generation=%llu value=%lld\n", (unsigned long long)info.generation,
	       (long long)value_of(t));
	t->deleter(t);
}

static void do_after(int argc, char **argv)
{
	DLManagedTensorVersioned *t;
	int r = tensord_attach_after(client, argv[1], strtoull(argv[2], NULL, 10), atoi(argv[3]),
				     &t);

	if (r < 0)
		fail(r);
	else
		print_attached(t);
}

static void do_async(int argc, char **argv)
{
	DLManagedTensorVersioned *t;
	bool cancel = argc > 4 && !strcmp(argv[4], "cancel");
	int polls = 0, r;
	tensord_op *op;
	struct pollfd pfd;

	r = tensord_attach_start(client, argv[1], strtoull(argv[2], NULL, 10), atoi(argv[3]), &op);
	if (r < 0) {
		fail(r);
		return;
	}
	pfd = (struct pollfd){ .fd = tensord_fd(client), .events = POLLIN };
	while (!tensord_op_done(op)) {
		int n = poll(&pfd, 1, 50);

		if (n == 0 && cancel && polls++ == 0)
			tensord_op_cancel(op);
		if (n > 0 && tensord_poll(client) < 0)
			break;
	}
	r = tensord_attach_finish(op, &t);
	if (r < 0)
		fail(r);
	else
		print_attached(t);
}

static void do_putfile(int argc, char **argv)
{
	tensord_file_options o = { .flags = argc > 3 && !strcmp(argv[3], "replace")
						    ? TENSORD_REPLACE
						    : 0 };
	uint64_t commit = 0;
	size_t n = 0;
	char **names = NULL;
	int r = tensord_put_file(client, argv[1], argv[2], &o, &commit, &names, &n);

	if (r < 0) {
		fail(r);
		return;
	}
	/* One block, one free(); NULL-terminated. */
	if (!names || names[n] != NULL)
		printf("err EINVAL names block\n");
	else
		printf("ok commit=%llu n=%zu first=%s\n", (unsigned long long)commit, n,
		       n ? names[0] : "-");
	free(names);
}

static void do_getfd(int argc, char **argv)
{
	tensord_file_options o = { .format = !strcmp(argv[3], "npy") ? TENSORD_FILE_NPY
								     : TENSORD_FILE_SAFETENSORS };
	uint64_t commit = 0;
	size_t n = 0;
	int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), r;

	if (fd < 0) {
		fail(-errno);
		return;
	}
	if (o.format == TENSORD_FILE_NPY)
		r = tensord_get_file_fd(client, (const char *const *)&argv[1], 1, NULL, fd, &o,
					&commit, &n);
	else
		r = tensord_get_file_fd(client, NULL, 0, argv[1], fd, &o, &commit, &n);
	close(fd);
	if (r < 0)
		fail(r);
	else
		printf("ok commit=%llu n=%zu\n", (unsigned long long)commit, n);
}

static void do_watch(int argc, char **argv)
{
	static const char *const kinds[] = { "published", "unlinked", "lagged" };
	int n = atoi(argv[2]), r = 0;
	tensord_watch *w;
	tensord_event ev;
	char line[4096] = "ok";
	size_t len = 2;

	r = tensord_watch_start(client, argv[1], false, 0, 0, &w);
	if (r < 0) {
		fail(r);
		return;
	}
	printf("ok watching\n"); /* the test commits after this line */
	for (int i = 0; i < n && r == 0; i++) {
		r = tensord_watch_next(w, atoi(argv[3]), &ev);
		if (r == 0 && len < sizeof(line) - 300)
			len += (size_t)snprintf(line + len, sizeof(line) - len, " %s:%s:%llu",
						kinds[ev.kind], ev.name,
						(unsigned long long)ev.generation);
	}
	tensord_watch_close(w);
	if (r < 0)
		fail(r);
	else
		printf("%s\n", line);
}

static void do_exit(int argc, char **argv)
{
	printf("ok\n");
	fflush(stdout);
	exit(0);
}

static const struct {
	const char *name;
	int min_argc; /* the command word included */
	void (*run)(int argc, char **argv);
} commands[] = {
	{ "connect", 1, do_connect }, { "create", 4, do_create },
	{ "publish", 1, do_publish }, { "attach", 3, do_attach },
	{ "legacy", 3, do_attach },   { "fill", 3, do_fill },
	{ "read", 3, do_read },       { "write", 4, do_write },
	{ "sum", 1, do_sum },         { "release", 1, do_release },
	{ "unlink", 1, do_unlink },   { "stat", 1, do_stat },
	{ "stats", 1, do_stats },     { "fork-hold", 1, do_fork_hold },
	{ "close", 1, do_close },     { "exit", 1, do_exit },
	{ "putmany", 5, do_putmany }, { "tx", 2, do_tx },
	{ "many", 4, do_many },       { "after", 4, do_after },
	{ "async", 4, do_async },     { "watch", 4, do_watch },
	{ "putfile", 3, do_putfile }, { "getfd", 4, do_getfd },
};

static void cmd(char *line)
{
	char *argv[8] = { 0 };
	int argc = 0;

	for (char *tok = strtok(line, " \t\n"); tok && argc < 8; tok = strtok(NULL, " \t\n"))
		argv[argc++] = tok;
	if (!argc)
		return;
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (!strcmp(argv[0], commands[i].name) && argc >= commands[i].min_argc) {
			commands[i].run(argc, argv);
			return;
		}
	}
	printf("err EINVAL unknown command %s\n", argv[0]);
}

int main(void)
{
	char line[1024];

	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin))
		cmd(line);
	return 0;
}
