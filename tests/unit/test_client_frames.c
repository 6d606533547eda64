/*
 * Descriptors and frames in libtensord (client/lib/transport.c): each reply
 * frame takes the descriptors its header counts, from one queue in arrival
 * order. A socketpair stands in for the daemon; the test writes what it
 * would send, honest or not, before the call reads it.
 *
 * Honest: a descriptor reaches the call its frame answers, also when its
 * frame is split across reads, follows a frame without one in the same
 * read, or belongs to a reply nobody waits for. Hostile: a frame counting
 * a descriptor that did not come, one too many, descriptors no frame
 * counts, a count above what a reply carries or with no valid encoding,
 * and more at once than the control room holds (MSG_CTRUNC). Each fails
 * the call with -EPROTO and a reason, and every received descriptor is
 * closed at once, not when the client goes (/proc/self/fd is counted).
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/lib/client.h"
#include "proto/frame.h"

/* Descriptors this process holds. */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	assert_non_null(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own */
}

/* A Reply frame answering id, its header counting n_fds; message pads it. */
static size_t reply_frame(uint8_t *out, uint64_t id, unsigned n_fds, const char *message)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	size_t n;

	rep.id = id;
	rep.message = (char *)message;
	n = tensord__reply__pack(&rep, out + TD_FRAME_HEADER);
	td_frame_header(out, (uint32_t)n, n_fds);
	return TD_FRAME_HEADER + n;
}

/* One sendmsg of len bytes with nfds descriptors, as the daemon would. */
static void peer_send(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 253)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { (void *)buf, len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	assert_in_range(nfds, 0, 253);
	if (nfds) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	assert_int_equal(sendmsg(sock, &m, MSG_NOSIGNAL), (ssize_t)len);
}

/* A client on one end of a socketpair; the test is the daemon on the other. */
struct peer {
	tensord_client *c;
	int sock;
};

static void peer_open(struct peer *p)
{
	int sp[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	p->c = td_client_new(sp[0]);
	assert_non_null(p->c);
	p->sock = sp[1];
	td_clear_error();
}

static void peer_close(struct peer *p)
{
	tensord_close(p->c);
	close(p->sock);
}

/* A file to send, told apart from others by its size. */
static int file_of_size(off_t size)
{
	int fd = memfd_create("test_client_frames", MFD_CLOEXEC);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	return fd;
}

static off_t size_of(int fd)
{
	struct stat st;

	assert_int_equal(fstat(fd, &st), 0);
	return st.st_size;
}

/* The call the client makes (its first: id 1); *ret_fd gets its descriptor. */
static int call(tensord_client *c, int *ret_fd)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Stats stats = TENSORD__STATS__INIT;
	Tensord__Reply *rep;
	int r;

	req.body_case = TENSORD__REQUEST__BODY_STATS;
	req.stats = &stats;
	*ret_fd = -1;
	r = td_rpc(c, &req, &rep, ret_fd);
	if (r == 0)
		tensord__reply__free_unpacked(rep, NULL);
	return r;
}

/* The call gets the file of size want, and nothing else stays open. */
static void expect_fd(struct peer *p, off_t want)
{
	int base = open_fds(), fd;

	assert_int_equal(call(p->c, &fd), 0);
	assert_true(fd >= 0);
	assert_int_equal(size_of(fd), want);
	close(fd);
	assert_int_equal(open_fds(), base);
	peer_close(p);
	assert_int_equal(open_fds(), base - 2);
}

/*
 * The call fails with -EPROTO saying why, every descriptor that came is
 * closed before it returns, and nothing stays open after the close.
 */
static void expect_eproto(struct peer *p, const char *why)
{
	int base = open_fds(), fd;

	assert_int_equal(call(p->c, &fd), -EPROTO);
	assert_int_equal(fd, -1);
	if (!strstr(tensord_last_error(), why))
		fail_msg("error \"%s\", wanted \"%s\"", tensord_last_error(), why);
	assert_int_equal(open_fds(), base);
	peer_close(p);
	assert_int_equal(open_fds(), base - 2);
}

/* --- honest ---------------------------------------------------------------- */

static void test_reply_with_its_fd(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f = file_of_size(4096);

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 1, 1, ""), &f, 1);
	close(f);
	expect_fd(&p, 4096);
}

/* The frame's descriptor came with its first bytes; the rest comes later. */
static void test_fd_frame_split_across_reads(void **state)
{
	static const size_t cuts[] = { 1, 7, 8, 9, 40 };
	char pad[100];
	uint8_t buf[256];

	memset(pad, 'x', sizeof(pad) - 1);
	pad[sizeof(pad) - 1] = '\0';
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		struct peer p;
		int f = file_of_size(8192);
		size_t len = reply_frame(buf, 1, 1, pad);

		peer_open(&p);
		peer_send(p.sock, buf, cuts[i], &f, 1);
		close(f);
		/* The client reads the first part alone, then the rest. */
		assert_int_equal(send(p.sock, buf + cuts[i], len - cuts[i], MSG_NOSIGNAL),
				 (ssize_t)(len - cuts[i]));
		expect_fd(&p, 8192);
	}
}

/*
 * A reply nobody waits for takes its own descriptor (closed with it), and
 * a frame without one before a frame with one, in the same read, takes
 * none: the count decides, not where the read began.
 */
static void test_fds_taken_in_arrival_order(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f1 = file_of_size(1000), f2 = file_of_size(2000);
	size_t n;

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 9, 1, ""), &f1, 1);
	n = reply_frame(buf, 8, 0, "");
	n += reply_frame(buf + n, 7, 0, "");
	peer_send(p.sock, buf, n, NULL, 0);
	peer_send(p.sock, buf, reply_frame(buf, 1, 1, ""), &f2, 1);
	close(f1);
	close(f2);
	expect_fd(&p, 2000);
}

/* --- hostile --------------------------------------------------------------- */

/* (a) A frame counting one descriptor, none attached. */
static void test_counted_fd_missing(void **state)
{
	uint8_t buf[256];
	struct peer p;

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 1, 1, ""), NULL, 0);
	expect_eproto(&p, "sent 0 descriptors with frames that count 1");
}

/* Its header is all there, its descriptor is not: they ride with byte one. */
static void test_counted_fd_missing_from_arriving_frame(void **state)
{
	uint8_t buf[256];
	struct peer p;

	peer_open(&p);
	reply_frame(buf, 1, 1, "");
	peer_send(p.sock, buf, TD_FRAME_HEADER, NULL, 0);
	expect_eproto(&p, "sent 0 descriptors with frames that count 1");
}

/* (b) Two descriptors with a frame that counts one, in one message... */
static void test_fd_beyond_count(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f[2] = { file_of_size(1), file_of_size(2) };

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 1, 1, ""), f, 2);
	close(f[0]);
	close(f[1]);
	expect_eproto(&p, "sent 2 descriptors with frames that count 1");
}

/* ...or the second with the next frame, which counts none. */
static void test_fd_with_frame_counting_none(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f[2] = { file_of_size(1), file_of_size(2) };

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 5, 1, ""), &f[0], 1);
	peer_send(p.sock, buf, reply_frame(buf, 1, 0, ""), &f[1], 1);
	close(f[0]);
	close(f[1]);
	expect_eproto(&p, "sent 1 descriptor with frames that count 0");
}

/* (c) More at once than the client's control room: MSG_CTRUNC. */
static void test_fds_truncated(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f[250], one = file_of_size(1);

	/* More than one frame may carry, so more than the client's control room. */
	for (int i = 0; i < 250; i++)
		f[i] = one;
	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 1, 1, ""), f, 250);
	close(one);
	expect_eproto(&p, "MSG_CTRUNC");
}

/* A count above what a reply carries, attached or not, decided from the header. */
static void test_count_above_reply_max(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f[2] = { file_of_size(1), file_of_size(2) };

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 1, 2, ""), f, 2);
	close(f[0]);
	close(f[1]);
	/* Two for a reply of a kind that carries one (only a set's parts carry more). */
	expect_eproto(&p, "2 descriptors with a reply that carries one");

	peer_open(&p);
	peer_send(p.sock, buf, reply_frame(buf, 1, TD_FRAME_FDS_COUNTABLE, ""), NULL, 0);
	expect_eproto(&p, "more descriptors than the 240 a reply carries");
}

/* Bits for descriptors beyond the first, and no first. */
static void test_count_without_first(void **state)
{
	uint8_t buf[256];
	struct peer p;
	int f = file_of_size(1);
	size_t n = reply_frame(buf, 1, 0, "");

	buf[7] = 1;
	peer_open(&p);
	peer_send(p.sock, buf, n, &f, 1);
	close(f);
	expect_eproto(&p, "more descriptors than the 240 a reply carries");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reply_with_its_fd),
		cmocka_unit_test(test_fd_frame_split_across_reads),
		cmocka_unit_test(test_fds_taken_in_arrival_order),
		cmocka_unit_test(test_counted_fd_missing),
		cmocka_unit_test(test_counted_fd_missing_from_arriving_frame),
		cmocka_unit_test(test_fd_beyond_count),
		cmocka_unit_test(test_fd_with_frame_counting_none),
		cmocka_unit_test(test_fds_truncated),
		cmocka_unit_test(test_count_above_reply_max),
		cmocka_unit_test(test_count_without_first),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
