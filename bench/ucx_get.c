/*
 * The baseline that remote attach is measured against (issue 23,
 * docs/remote.md): one-sided UCX GETs between two processes on this
 * machine, by default over TCP loopback.
 *
 * The target (a forked child) plays the exporting daemon: it maps a memfd,
 * registers it once with ucp_mem_map(), packs its remote key and sends its
 * worker address, the buffer's address and the packed key over a
 * socketpair. Then it only progresses its worker until told to stop. That
 * matters: over TCP, UCX serves a GET in software (an active message that
 * the target's worker answers with the bytes), so a target that does not
 * progress never completes one.
 *
 * The initiator (the parent) plays the pulling daemon: it registers a
 * mapping of a memfd of its own as the destination (as a pulled replica
 * lands in pool memory) and times ucp_get_nbx() of 8 B and 4 KiB (one GET
 * at a time, many round trips: p50 and p99) and of 64 MiB and 1 GiB (one
 * GET per round: the median round's GB/s). After each size the
 * destination is cleared, fetched once more and compared with what the
 * target wrote, so a figure is never of bytes that did not arrive.
 *
 * Then the same sizes as active messages (bench_am(): the initiator asks,
 * the target answers with one ucp_am_send_nbx() of its registered buffer),
 * the path docs/remote.md chooses for the daemons instead of GET.
 *
 * Then two lines about the path itself: a GET while the target stops
 * progressing, and a GET of target memory outside the registered region
 * (TCP serves both ways: docs/remote.md says what follows from that).
 *
 * UCX_TLS defaults to tcp (the link the targets name); set it to
 * compare others (UCX_TLS=sm, UCX_TLS=rc, ...). The lanes UCX chose are
 * printed. Usage: ucx_get [--max SIZE_MIB] (the largest size, default
 * 1024). Prints figures; fails only when a GET fails or bytes differ.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define LAT_ITERS 20000
#define LAT_WARMUP 1000
#define BW_ROUNDS_64M 9
#define BW_ROUNDS_1G 5
#define BLOB_MAX (1u << 20)
#define STALL_MS 300

/* Memory of the target that no registration covers (see bench_outside()). */
static const char outside[32] = "not registered, never exported";
/* Everything must be over by then: a wedged peer ends the run, not the machine's day. */
#define DEADLINE_S 600

struct side {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_mem_h memh;
	void *buf;
	size_t size;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void on_alarm(int sig)
{
	static const char msg[] = "ucx_get: no result within the deadline, giving up\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(1);
	_exit(1);
}

/* The pattern the target writes: every 8-byte word differs from its neighbours. */
static uint64_t pattern(uint64_t i)
{
	return (i + 1) * 0x9e3779b97f4a7c15ull;
}

static int send_all(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n > 0) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static int recv_all(int fd, void *p, size_t n)
{
	char *c = p;

	while (n > 0) {
		ssize_t r = recv(fd, c, n, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

/* A blob is a u32 length and that many bytes. */
static int send_blob(int fd, const void *p, size_t n)
{
	uint32_t len = (uint32_t)n;

	return send_all(fd, &len, sizeof(len)) < 0 ? -1 : send_all(fd, p, n);
}

/* Returns a malloc'ed blob of at most BLOB_MAX bytes, or NULL. */
static void *recv_blob(int fd, size_t *ret_n)
{
	uint32_t len;
	void *p;

	if (recv_all(fd, &len, sizeof(len)) < 0 || len == 0 || len > BLOB_MAX)
		return NULL;
	p = malloc(len);
	if (!p)
		return NULL;
	if (recv_all(fd, p, len) < 0) {
		free(p);
		return NULL;
	}
	*ret_n = len;
	return p;
}

/* A shared mapping of a fresh memfd, pages allocated now, as a daemon's pool memory. */
static void *map_memfd(const char *what, size_t size)
{
	int fd = memfd_create(what, MFD_CLOEXEC);
	void *p;

	if (fd < 0) {
		fprintf(stderr, "ucx_get: memfd_create for the %s: %s\n", what, strerror(errno));
		return NULL;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		fprintf(stderr, "ucx_get: ftruncate of the %s to %zu bytes: %s\n", what, size,
			strerror(errno));
		close(fd);
		return NULL;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		fprintf(stderr, "ucx_get: mapping %zu bytes for the %s: %s\n", size, what,
			strerror(errno));
		return NULL;
	}
	return p;
}

/* Context, worker and one registered buffer of size bytes. 0 or -1 (said why). */
static int side_init(struct side *s, const char *who, size_t size)
{
	ucp_params_t params = { 0 };
	ucp_worker_params_t wparams = { 0 };
	ucp_mem_map_params_t mparams = { 0 };
	ucp_config_t *config;
	ucs_status_t st;

	memset(s, 0, sizeof(*s));
	st = ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: %s: reading the UCX configuration: %s\n", who,
			ucs_status_string(st));
		return -1;
	}
	params.field_mask = UCP_PARAM_FIELD_FEATURES;
	/* RMA for the GETs; AM for the same transfers as active messages. */
	params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
	st = ucp_init(&params, config, &s->ctx);
	ucp_config_release(config);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: %s: ucp_init: %s\n", who, ucs_status_string(st));
		return -1;
	}
	wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
	st = ucp_worker_create(s->ctx, &wparams, &s->worker);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: %s: ucp_worker_create: %s\n", who, ucs_status_string(st));
		return -1;
	}
	s->buf = map_memfd(who, size);
	if (!s->buf)
		return -1;
	s->size = size;
	/* Registered once for every GET, as a daemon registers a region once. */
	mparams.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	mparams.address = s->buf;
	mparams.length = size;
	st = ucp_mem_map(s->ctx, &mparams, &s->memh);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: %s: registering %zu bytes (ucp_mem_map): %s\n", who, size,
			ucs_status_string(st));
		return -1;
	}
	return 0;
}

static void side_fini(struct side *s)
{
	if (s->memh)
		ucp_mem_unmap(s->ctx, s->memh);
	if (s->buf)
		munmap(s->buf, s->size);
	if (s->worker)
		ucp_worker_destroy(s->worker);
	if (s->ctx)
		ucp_cleanup(s->ctx);
}

/*
 * The active-message path tensord's daemons will take instead of GET
 * (docs/remote.md): the initiator asks for n bytes (AM_ASK, header: n),
 * the target answers with one ucp_am_send_nbx() of its registered buffer
 * (AM_DATA), which UCX sends eagerly when small and by rendezvous when
 * large, and the initiator receives it into its own registered memory.
 */
enum { AM_ASK = 1, AM_DATA = 2 };

struct target_am {
	ucp_ep_h reply_ep; /* borrowed from UCX: the asker's endpoint */
	uint64_t want;     /* bytes asked for and not sent yet; 0 when none */
};

static ucs_status_t on_ask(void *arg, const void *header, size_t header_len, void *data, size_t len,
			   const ucp_am_recv_param_t *param)
{
	struct target_am *t = arg;

	if (header_len != sizeof(uint64_t) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
		return UCS_OK;
	memcpy(&t->want, header, sizeof(t->want));
	t->reply_ep = param->reply_ep;
	return UCS_OK;
}

/* Sends what was asked for (called outside the callback); UCS_OK or the error. */
static ucs_status_t target_answer(struct side *s, struct target_am *t)
{
	ucp_request_param_t prm = { 0 };
	ucs_status_ptr_t req;
	ucs_status_t st = UCS_OK;
	size_t n = t->want <= s->size ? (size_t)t->want : s->size;

	t->want = 0;
	prm.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
	prm.memh = s->memh; /* the registration made once: UCX registers nothing more */
	req = ucp_am_send_nbx(t->reply_ep, AM_DATA, NULL, 0, s->buf, n, &prm);
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	if (req != NULL) {
		while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS)
			ucp_worker_progress(s->worker);
		ucp_request_free(req);
	}
	return st;
}

/*
 * The target: send the worker address, the buffer's address and the packed
 * remote key, then progress until the initiator goes away (EOF on fd). A
 * byte 'p' from it makes the target stop progressing for STALL_MS, as a
 * daemon whose loop is busy elsewhere would. Runs in the child; returns
 * its exit status.
 */
static int run_target(int fd, size_t size)
{
	struct side s;
	ucp_address_t *addr = NULL;
	size_t addr_len, rkey_len;
	void *rkey = NULL;
	uint64_t raddr[2], *w;
	ucs_status_t st;
	int rc = 1;

	if (side_init(&s, "target", size) < 0)
		goto out;
	w = s.buf;
	for (uint64_t i = 0; i < size / sizeof(*w); i++)
		w[i] = pattern(i);
	st = ucp_worker_get_address(s.worker, &addr, &addr_len);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: target: ucp_worker_get_address: %s\n",
			ucs_status_string(st));
		goto out;
	}
	st = ucp_rkey_pack(s.ctx, s.memh, &rkey, &rkey_len);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: target: ucp_rkey_pack: %s\n", ucs_status_string(st));
		goto out;
	}
	raddr[0] = (uint64_t)(uintptr_t)s.buf;
	raddr[1] = (uint64_t)(uintptr_t)outside;
	if (send_blob(fd, addr, addr_len) < 0 || send_blob(fd, raddr, sizeof(raddr)) < 0 ||
	    send_blob(fd, rkey, rkey_len) < 0) {
		fprintf(stderr, "ucx_get: target: sending the address and key: %s\n",
			strerror(errno));
		goto out;
	}
	struct target_am am = { 0 };
	ucp_am_handler_param_t hp = { 0 };

	hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
			UCP_AM_HANDLER_PARAM_FIELD_ARG;
	hp.id = AM_ASK;
	hp.cb = on_ask;
	hp.arg = &am;
	st = ucp_worker_set_am_recv_handler(s.worker, &hp);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: target: setting the active-message handler: %s\n",
			ucs_status_string(st));
		goto out;
	}
	for (unsigned n = 0;; n++) {
		ucp_worker_progress(s.worker);
		if (am.want > 0 && (st = target_answer(&s, &am)) != UCS_OK) {
			fprintf(stderr, "ucx_get: target: sending the asked bytes: %s\n",
				ucs_status_string(st));
			goto out;
		}
		if ((n & 1023) == 0) {
			char c;
			ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);

			if (r == 1 && c == 'p') {
				usleep(STALL_MS * 1000);
				continue;
			}
			if (r >= 0)
				break;
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				break;
		}
	}
	rc = 0;
out:
	if (rkey)
		ucp_rkey_buffer_release(rkey);
	if (addr)
		ucp_worker_release_address(s.worker, addr);
	side_fini(&s);
	return rc;
}

struct initiator {
	struct side s;
	ucp_ep_h ep;
	ucp_rkey_h rkey;
	uint64_t raddr;
	uint64_t outside;      /* the address of the target's unregistered `outside` */
	ucs_status_t ep_error; /* set by the endpoint's error handler */
	/* The active-message path: the answer's receive, and whether it is over. */
	ucs_status_ptr_t am_req; /* a rendezvous receive in flight, or NULL */
	bool am_done;
	size_t am_len;
};

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct initiator *in = arg;

	(void)ep;
	in->ep_error = status;
}

/* One GET of n bytes from offset off of the target's buffer, waited for. UCS_OK or the error. */
static ucs_status_t get_wait(struct initiator *in, void *dst, size_t n, uint64_t off)
{
	ucp_request_param_t prm = { 0 };
	ucs_status_ptr_t req = ucp_get_nbx(in->ep, dst, n, in->raddr + off, in->rkey, &prm);
	ucs_status_t st;

	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS)
		ucp_worker_progress(in->s.worker);
	ucp_request_free(req);
	return st;
}

/*
 * The lanes UCX chose for the endpoint (from ucp_ep_print_info()), and
 * whether any has a GET protocol of its own. Over TCP none has: UCX
 * 1.13 emulates a GET with active messages, which the target's worker must
 * progress to serve.
 */
static void print_lanes(ucp_ep_h ep)
{
	char *text = NULL, *line, *save = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	int rma = 0;

	if (!f)
		return;
	ucp_ep_print_info(ep, f);
	fclose(f);
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		line += strspn(line, "# ");
		if (strncmp(line, "lane[", 5) == 0)
			printf("ucx_get: %s\n", line);
		else if (strncmp(line, "get[", 4) == 0)
			rma = 1; /* a lane with a GET protocol of its own */
	}
	printf("ucx_get: GET path: %s\n",
	       rma ? "an RMA lane of the transport"
		   : "no RMA lane: emulated over active messages, served by the target's progress");
	free(text);
}

static int check_bytes(const struct initiator *in, size_t n)
{
	const uint64_t *w = in->s.buf;
	const unsigned char *c = in->s.buf;

	for (uint64_t i = 0; i < n / sizeof(*w); i++) {
		if (w[i] != pattern(i)) {
			fprintf(stderr,
				"ucx_get: %zu-byte GET: word %llu differs from the target's\n", n,
				(unsigned long long)i);
			return -1;
		}
	}
	for (size_t i = n / sizeof(*w) * sizeof(*w); i < n; i++) {
		uint64_t want = pattern(i / sizeof(*w));

		if (c[i] != ((const unsigned char *)&want)[i % sizeof(*w)]) {
			fprintf(stderr, "ucx_get: %zu-byte GET: byte %zu differs\n", n, i);
			return -1;
		}
	}
	return 0;
}

static const char *size_name(size_t n, char *buf, size_t len)
{
	if (n >= (1u << 30))
		snprintf(buf, len, "%zu GiB", n >> 30);
	else if (n >= (1u << 20))
		snprintf(buf, len, "%zu MiB", n >> 20);
	else if (n >= 1024)
		snprintf(buf, len, "%zu KiB", n >> 10);
	else
		snprintf(buf, len, "%zu B", n);
	return buf;
}

static ucs_status_t on_data(void *arg, const void *header, size_t header_len, void *data,
			    size_t len, const ucp_am_recv_param_t *param)
{
	struct initiator *in = arg;
	ucp_request_param_t prm = { 0 };

	in->am_len = len;
	if (len > in->s.size) {
		in->am_done = true; /* more than asked for: counted as a failure below */
		return UCS_OK;
	}
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		/* Large: UCX fetches it into our memory (RDMA: a GET by our adapter). */
		prm.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
		prm.memh = in->s.memh;
		in->am_req = ucp_am_recv_data_nbx(in->s.worker, data, in->s.buf, len, &prm);
		if (in->am_req == NULL || UCS_PTR_IS_ERR(in->am_req))
			in->am_done = true;
		return UCS_INPROGRESS;
	}
	memcpy(in->s.buf, data, len); /* small: it came with the message */
	in->am_done = true;
	return UCS_OK;
}

/* Asks the target for n bytes by active message and waits for them. UCS_OK or the error. */
static ucs_status_t am_fetch(struct initiator *in, size_t n)
{
	ucp_request_param_t prm = { 0 };
	uint64_t want = n;
	ucs_status_ptr_t req;
	ucs_status_t st = UCS_OK;

	in->am_done = false;
	in->am_req = NULL;
	prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	prm.flags = UCP_AM_SEND_FLAG_REPLY;
	req = ucp_am_send_nbx(in->ep, AM_ASK, &want, sizeof(want), NULL, 0, &prm);
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	while (!in->am_done || (req != NULL && ucp_request_check_status(req) == UCS_INPROGRESS)) {
		ucp_worker_progress(in->s.worker);
		if (in->am_req != NULL && !UCS_PTR_IS_ERR(in->am_req) &&
		    ucp_request_check_status(in->am_req) != UCS_INPROGRESS) {
			st = ucp_request_check_status(in->am_req);
			ucp_request_free(in->am_req);
			in->am_req = NULL;
			in->am_done = true;
		}
		if (in->ep_error != UCS_OK)
			return in->ep_error;
	}
	if (req != NULL)
		ucp_request_free(req);
	if (UCS_PTR_IS_ERR(in->am_req))
		st = UCS_PTR_STATUS(in->am_req);
	if (st == UCS_OK && in->am_len != n)
		st = UCS_ERR_MESSAGE_TRUNCATED;
	return st;
}

/* The same sizes by active message: latency, bandwidth, and the bytes checked. */
static int bench_am(struct initiator *in, size_t size)
{
	static const size_t lat[] = { 8, 4096 };
	static double v[LAT_ITERS];
	char name[32];

	for (size_t k = 0; k < sizeof(lat) / sizeof(lat[0]); k++) {
		size_t n = lat[k];

		for (int i = 0; i < LAT_WARMUP + LAT_ITERS; i++) {
			double t0 = now_s();
			ucs_status_t st = am_fetch(in, n);

			if (st != UCS_OK) {
				fprintf(stderr, "ucx_get: %zu-byte active message %d: %s\n", n, i,
					ucs_status_string(st));
				return -1;
			}
			if (i >= LAT_WARMUP)
				v[i - LAT_WARMUP] = now_s() - t0;
		}
		qsort(v, LAT_ITERS, sizeof(v[0]), cmp_d);
		printf("ucx_get: am %s p50 %.1f us p99 %.1f us (ask + answer, %d round trips)\n",
		       size_name(n, name, 32), v[LAT_ITERS / 2] * 1e6,
		       v[LAT_ITERS * 99 / 100] * 1e6, LAT_ITERS);
		memset(in->s.buf, 0, n);
		if (am_fetch(in, n) != UCS_OK || check_bytes(in, n) < 0)
			return -1;
	}
	for (size_t n = 64u << 20; n <= size && n <= (1u << 30); n <<= 4) {
		int rounds = n < (1u << 30) ? BW_ROUNDS_64M : BW_ROUNDS_1G;
		double bw[16];

		if (am_fetch(in, n) != UCS_OK) /* warm-up, not counted */
			return -1;
		for (int i = 0; i < rounds; i++) {
			double t0 = now_s();

			if (am_fetch(in, n) != UCS_OK) {
				fprintf(stderr, "ucx_get: %zu-byte active message failed\n", n);
				return -1;
			}
			bw[i] = (double)n / (now_s() - t0) / 1e9;
		}
		qsort(bw, (size_t)rounds, sizeof(bw[0]), cmp_d);
		printf("ucx_get: am %s %.2f GB/s (median of %d rounds; min %.2f, max %.2f)\n",
		       size_name(n, name, 32), bw[rounds / 2], rounds, bw[0], bw[rounds - 1]);
		memset(in->s.buf, 0, n);
		if (am_fetch(in, n) != UCS_OK || check_bytes(in, n) < 0)
			return -1;
	}
	return 0;
}

/* Clears the first n bytes, fetches them once more and compares: 0 or -1 (said why). */
static int verify(struct initiator *in, size_t n)
{
	ucs_status_t st;

	memset(in->s.buf, 0, n);
	st = get_wait(in, in->s.buf, n, 0);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: %zu-byte GET for the check: %s\n", n,
			ucs_status_string(st));
		return -1;
	}
	return check_bytes(in, n);
}

/* Round trips of one GET of n bytes: p50 and p99 latency. */
static int bench_latency(struct initiator *in, size_t n)
{
	static double v[LAT_ITERS];
	char name[32];

	for (int i = 0; i < LAT_WARMUP + LAT_ITERS; i++) {
		double t0 = now_s();
		ucs_status_t st = get_wait(in, in->s.buf, n, 0);

		if (st != UCS_OK) {
			fprintf(stderr, "ucx_get: %zu-byte GET %d: %s\n", n, i,
				ucs_status_string(st));
			return -1;
		}
		if (i >= LAT_WARMUP)
			v[i - LAT_WARMUP] = now_s() - t0;
	}
	qsort(v, LAT_ITERS, sizeof(v[0]), cmp_d);
	printf("ucx_get: %s p50 %.1f us p99 %.1f us (%d round trips)", size_name(n, name, 32),
	       v[LAT_ITERS / 2] * 1e6, v[LAT_ITERS * 99 / 100] * 1e6, LAT_ITERS);
	if (n >= 4096)
		printf(", %.3f GB/s at p50", (double)n / v[LAT_ITERS / 2] / 1e9);
	printf("\n");
	return verify(in, n);
}

/* Rounds of one GET of n bytes: the median round's bandwidth. */
static int bench_bandwidth(struct initiator *in, size_t n, int rounds)
{
	double v[16];
	char name[32];

	if (get_wait(in, in->s.buf, n, 0) != UCS_OK) /* warm-up, not counted */
		return -1;
	for (int i = 0; i < rounds; i++) {
		double t0 = now_s();
		ucs_status_t st = get_wait(in, in->s.buf, n, 0);

		if (st != UCS_OK) {
			fprintf(stderr, "ucx_get: %zu-byte GET, round %d: %s\n", n, i,
				ucs_status_string(st));
			return -1;
		}
		v[i] = (double)n / (now_s() - t0) / 1e9;
	}
	qsort(v, (size_t)rounds, sizeof(v[0]), cmp_d);
	printf("ucx_get: %s %.2f GB/s (median of %d rounds; min %.2f, max %.2f)\n",
	       size_name(n, name, 32), v[rounds / 2], rounds, v[0], v[rounds - 1]);
	return verify(in, n);
}

/*
 * One 8-byte GET while the target does not progress: over TCP it completes
 * only once the target's worker runs again, so a pulling daemon must bound
 * every GET with a timer of its own (docs/remote.md).
 */
static int bench_stall(struct initiator *in, int fd)
{
	double t0;
	ucs_status_t st;

	if (send_all(fd, "p", 1) < 0)
		return -1;
	usleep(20 * 1000); /* the target looks at its socket every 1024 progress calls */
	t0 = now_s();
	st = get_wait(in, in->s.buf, 8, 0);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: 8-byte GET during the stall: %s\n",
			ucs_status_string(st));
		return -1;
	}
	printf("ucx_get: 8 B GET while the target stops progressing for %d ms: done after %.1f "
	       "ms\n",
	       STALL_MS, (now_s() - t0) * 1e3);
	return 0;
}

/*
 * A GET, with the buffer's key, of target memory that no registration
 * covers. Over TCP UCX 1.13 serves it: its software GET reads the address
 * the request names and checks no key. That is why tensord's daemons never
 * enable UCP_FEATURE_RMA (docs/remote.md). On RDMA the adapter refuses it.
 */
static void bench_outside(struct initiator *in)
{
	char got[sizeof(outside)] = { 0 };
	ucp_request_param_t prm = { 0 };
	ucs_status_ptr_t req = ucp_get_nbx(in->ep, got, sizeof(got), in->outside, in->rkey, &prm);
	ucs_status_t st = UCS_OK;
	double t0 = now_s();

	if (UCS_PTR_IS_ERR(req)) {
		st = UCS_PTR_STATUS(req);
	} else if (req != NULL) {
		while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && now_s() - t0 < 2)
			ucp_worker_progress(in->s.worker);
		if (st == UCS_INPROGRESS) {
			ucp_request_cancel(in->s.worker, req);
			while (ucp_request_check_status(req) == UCS_INPROGRESS)
				ucp_worker_progress(in->s.worker);
		}
		ucp_request_free(req);
	}
	if (st == UCS_OK && memcmp(got, outside, sizeof(got)) == 0)
		printf("ucx_get: GET outside the registered region with its key: served "
		       "(\"%.*s\"): this path checks no key\n",
		       (int)sizeof(got) - 1, got);
	else
		printf("ucx_get: GET outside the registered region with its key: refused (%s)\n",
		       st == UCS_OK ? "other bytes" : ucs_status_string(st));
}

static int run_initiator(int fd, size_t size)
{
	struct initiator in = { 0 };
	ucp_ep_params_t ep_params = { 0 };
	void *addr = NULL, *raddr = NULL, *rkey = NULL;
	size_t addr_len, raddr_len, rkey_len;
	ucs_status_t st;
	int rc = 1;

	ucp_am_handler_param_t hp = { 0 };

	if (side_init(&in.s, "initiator", size) < 0)
		goto out;
	hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
			UCP_AM_HANDLER_PARAM_FIELD_ARG;
	hp.id = AM_DATA;
	hp.cb = on_data;
	hp.arg = &in;
	st = ucp_worker_set_am_recv_handler(in.s.worker, &hp);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: initiator: setting the active-message handler: %s\n",
			ucs_status_string(st));
		goto out;
	}
	addr = recv_blob(fd, &addr_len);
	raddr = addr ? recv_blob(fd, &raddr_len) : NULL;
	rkey = raddr ? recv_blob(fd, &rkey_len) : NULL;
	if (!rkey || raddr_len != 2 * sizeof(uint64_t)) {
		fprintf(stderr, "ucx_get: initiator: no address and key from the target (it said "
				"why above, or died)\n");
		goto out;
	}
	memcpy(&in.raddr, raddr, sizeof(in.raddr));
	memcpy(&in.outside, (char *)raddr + sizeof(in.raddr), sizeof(in.outside));
	ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
			       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
			       UCP_EP_PARAM_FIELD_ERR_HANDLER;
	ep_params.address = addr;
	/* A target that dies fails the GET in flight instead of hanging it. */
	ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	ep_params.err_handler.cb = on_ep_error;
	ep_params.err_handler.arg = &in;
	st = ucp_ep_create(in.s.worker, &ep_params, &in.ep);
	if (st == UCS_ERR_UNREACHABLE) {
		/* Shared memory in UCX 1.13 cannot report a dead peer; a daemon
		 * would refuse such a transport, a measurement may use it. */
		printf("ucx_get: no transport in UCX_TLS=%s reports peer failure; measuring "
		       "without it\n",
		       getenv("UCX_TLS"));
		ep_params.field_mask &= ~(uint64_t)(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
						    UCP_EP_PARAM_FIELD_ERR_HANDLER);
		st = ucp_ep_create(in.s.worker, &ep_params, &in.ep);
	}
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: initiator: ucp_ep_create to the target: %s\n",
			ucs_status_string(st));
		goto out;
	}
	st = ucp_ep_rkey_unpack(in.ep, rkey, &in.rkey);
	if (st != UCS_OK) {
		fprintf(stderr, "ucx_get: initiator: unpacking the target's remote key: %s\n",
			ucs_status_string(st));
		goto out;
	}
	if (get_wait(&in, in.s.buf, 8, 0) != UCS_OK) { /* the first GET completes the wire-up */
		fprintf(stderr, "ucx_get: initiator: the first GET failed\n");
		goto out;
	}
	printf("ucx_get: UCX %s, UCX_TLS=%s, %ld CPUs online\n", ucp_get_version_string(),
	       getenv("UCX_TLS"), sysconf(_SC_NPROCESSORS_ONLN));
	print_lanes(in.ep);
	if (bench_latency(&in, 8) < 0 || bench_latency(&in, 4096) < 0)
		goto out;
	if (size >= (64u << 20) && bench_bandwidth(&in, 64u << 20, BW_ROUNDS_64M) < 0)
		goto out;
	if (size >= (1u << 30) && bench_bandwidth(&in, 1u << 30, BW_ROUNDS_1G) < 0)
		goto out;
	if (bench_am(&in, size) < 0)
		goto out;
	if (bench_stall(&in, fd) < 0)
		goto out;
	bench_outside(&in); /* last: on RDMA a refused GET fails the endpoint */
	rc = 0;
out:
	if (in.ep_error != UCS_OK)
		fprintf(stderr, "ucx_get: initiator: the endpoint to the target failed: %s\n",
			ucs_status_string(in.ep_error));
	if (in.rkey)
		ucp_rkey_destroy(in.rkey);
	if (in.ep) {
		/* Flush while the target still progresses, then let it go. */
		ucp_request_param_t prm = { 0 };
		ucs_status_ptr_t req = ucp_ep_close_nbx(in.ep, &prm);

		if (UCS_PTR_IS_PTR(req)) {
			while (ucp_request_check_status(req) == UCS_INPROGRESS)
				ucp_worker_progress(in.s.worker);
			ucp_request_free(req);
		}
	}
	free(addr);
	free(raddr);
	free(rkey);
	side_fini(&in.s);
	return rc;
}

int main(int argc, char **argv)
{
	size_t size = 1u << 30;
	int sv[2], status, rc;
	pid_t pid;

	if (argc == 3 && strcmp(argv[1], "--max") == 0 && atol(argv[2]) > 0) {
		size = (size_t)atol(argv[2]) << 20;
	} else if (argc != 1) {
		fprintf(stderr, "usage: ucx_get [--max SIZE_MIB]\n");
		return 2;
	}
	if (size < 4096)
		size = 4096;
	/* The link the targets name; the caller's choice wins. */
	setenv("UCX_TLS", "tcp", 0);
	signal(SIGALRM, on_alarm);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		fprintf(stderr, "ucx_get: socketpair: %s\n", strerror(errno));
		return 1;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "ucx_get: fork: %s\n", strerror(errno));
		return 1;
	}
	alarm(DEADLINE_S);
	if (pid == 0) {
		close(sv[0]);
		_exit(run_target(sv[1], size));
	}
	close(sv[1]);
	rc = run_initiator(sv[0], size);
	close(sv[0]); /* EOF: the target stops progressing and exits */
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "ucx_get: the target process failed (status 0x%x)\n", status);
		rc = 1;
	}
	return rc;
}
