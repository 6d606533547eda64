/*
 * The collector (daemon/figures.c): every row of the table read once, in
 * table order, with the labels its scope says; per-uid rows shown by one
 * rule (root and FIGURES_VIEW_ALL see every uid, a uid its own row, the
 * HTTP endpoint without --metrics-per-uid none at all); counters kept for
 * the figure itself.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/figures.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "proto/tensord.pb-c.h"

static const char *fake_path(int device_id)
{
	return "fake-path";
}

static const struct backend_ops fake_ops = { .name = "fake", .path = fake_path };

static struct server srv;

static int setup(void **state)
{
	struct quota_limits lim = { 0 };
	char why[200];

	memset(&srv, 0, sizeof(srv));
	quota_default_limits(&lim, 1024, 4096);
	quota_init(&srv.quota, &lim);
	assert_int_equal(quota_charge(&srv.quota, 0, QUOTA_CLIENTS, 1, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&srv.quota, 1000, QUOTA_CLIENTS, 2, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&srv.quota, 1000, QUOTA_BYTES, 4096, why, sizeof(why)), 0);
	assert_int_equal(quota_charge(&srv.quota, 1001, QUOTA_TENSORS, 5, why, sizeof(why)), 0);
	srv.reg.n_devices = 2;
	srv.reg.devices[0] = (struct reg_device){
		.ops = &fake_ops, .device = { kDLCPU, 0 }, .capacity = 10, .used = 5
	};
	/* A backend whose init failed is not shown. */
	srv.reg.devices[1] = (struct reg_device){ .ops = &fake_ops,
						  .device = { kDLCUDA, 0 },
						  .init_rc = -ENODEV };
	srv.conns.n = 3;
	return 0;
}

static int teardown(void **state)
{
	quota_fini(&srv.quota);
	return 0;
}

/* The samples of figure id, and how many. */
static size_t samples(const struct figure_set *set, enum figure_id id,
		      const struct figure_sample **first)
{
	size_t n = 0;

	*first = NULL;
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i].id == id) {
			*first = *first ? *first : &set->v[i];
			n++;
		}
	return n;
}

/* The uids that have a row of figure id, as a bit mask of 0, 1000, 1001. */
static unsigned uid_rows(const struct figure_set *set, enum figure_id id)
{
	unsigned mask = 0;

	for (size_t i = 0; i < set->n; i++) {
		if (set->v[i].id != id)
			continue;
		if (strcmp(set->v[i].values[0], "0") == 0)
			mask |= 1;
		else if (strcmp(set->v[i].values[0], "1000") == 0)
			mask |= 2;
		else if (strcmp(set->v[i].values[0], "1001") == 0)
			mask |= 4;
		else
			fail_msg("a row of uid %s", set->v[i].values[0]);
	}
	return mask;
}

static void test_the_table_is_whole(void **state)
{
	for (unsigned i = 0; i < FIG_COUNT; i++) {
		const struct figure *f = &figures[i];

		assert_int_equal(f->id, i);
		assert_non_null(f->name);
		assert_non_null(f->read);
		assert_true(strlen(f->help) > 10);
		assert_true(f->n_labels < FIGURE_LABELS_MAX);
		assert_null(f->labels[f->n_labels]);
		if (f->scope == FIGURE_DEVICE) {
			assert_true(f->n_labels >= 3);
			assert_string_equal(f->labels[0], "device");
			assert_string_equal(f->labels[2], "path");
		}
		if (f->scope == FIGURE_UID)
			assert_string_equal(f->labels[0], "uid");
		/* Prometheus' conventions: counters end in _total. */
		if (f->type == FIGURE_COUNTER)
			assert_non_null(strstr(f->name, "_total"));
		for (unsigned j = 0; j < i; j++)
			assert_string_not_equal(figures[j].name, f->name);
	}
}

static void test_samples_come_in_table_order_with_their_labels(void **state)
{
	struct figure_set set;
	const struct figure_sample *p;

	figures_collect(&srv, 0, &set);
	assert_false(set.lost);
	for (size_t i = 1; i < set.n; i++)
		assert_true(set.v[i - 1].id <= set.v[i].id);
	for (size_t i = 0; i < set.n; i++)
		for (unsigned l = 0; l < figures[set.v[i].id].n_labels; l++)
			assert_true(set.v[i].values[l][0] != '\0');
	assert_int_equal(samples(&set, FIG_clients, &p), 1);
	assert_int_equal(p->value, 3);
	/* One row per device that serves, labelled device, backend, path. */
	assert_int_equal(samples(&set, FIG_device_used_bytes, &p), 1);
	assert_string_equal(p->values[0], "cpu");
	assert_string_equal(p->values[1], "fake");
	assert_string_equal(p->values[2], "fake-path");
	assert_int_equal(p->value, 5);
	assert_int_equal(samples(&set, FIG_device_capacity_bytes, &p), 1);
	assert_int_equal(p->value, 10);
	/* Three states per device, each its own sample. */
	assert_int_equal(samples(&set, FIG_device_tensors, &p), 3);
	assert_string_equal(p->values[3], "created");
	/* The histogram brings its buckets. */
	assert_int_equal(samples(&set, FIG_attach_duration_seconds, &p), 1);
	assert_int_equal(p->n_bounds, METRICS_ATTACH_BUCKETS);
	assert_non_null(p->counts);
	figures_release(&set);
	assert_int_equal(set.n, 0);
}

static void test_per_uid_rows_follow_one_rule(void **state)
{
	struct figure_set set;
	const struct figure_sample *p;

	/* Root and the endpoint with --metrics-per-uid: every uid. */
	figures_collect(&srv, 0, &set);
	assert_int_equal(uid_rows(&set, FIG_uid_clients), 7);
	figures_release(&set);
	figures_collect(&srv, FIGURES_VIEW_ALL, &set);
	assert_int_equal(uid_rows(&set, FIG_uid_bytes), 7);
	figures_release(&set);
	/* Anyone else: their own row, in every per-uid figure, and its values. */
	figures_collect(&srv, 1000, &set);
	for (unsigned i = 0; i < FIG_COUNT; i++)
		if (figures[i].scope == FIGURE_UID && i != FIG_uid_owned_bytes)
			assert_int_equal(uid_rows(&set, (enum figure_id)i), 2);
	samples(&set, FIG_uid_bytes, &p);
	assert_int_equal(p->value, 4096);
	samples(&set, FIG_uid_clients, &p);
	assert_int_equal(p->value, 2);
	assert_false(set.absent[FIG_uid_clients]);
	figures_release(&set);
	/* A uid the daemon never counted sees no row, and no one else's. */
	figures_collect(&srv, 4242, &set);
	assert_int_equal(uid_rows(&set, FIG_uid_clients), 0);
	assert_false(set.absent[FIG_uid_clients]);
	figures_release(&set);
	/* The endpoint without --metrics-per-uid: the figures are absent. */
	figures_collect(&srv, FIGURES_VIEW_NONE, &set);
	for (unsigned i = 0; i < FIG_COUNT; i++)
		assert_true(set.absent[i] == (figures[i].scope == FIGURE_UID));
	assert_int_equal(uid_rows(&set, FIG_uid_clients), 0);
	assert_int_equal(samples(&set, FIG_clients, &p), 1);
	figures_release(&set);
}

static void test_counted_figures_count(void **state)
{
	struct figure_set set;
	const struct figure_sample *p;
	double before;

	figures_collect(&srv, 0, &set);
	samples(&set, FIG_connections_total, &p);
	before = p->value;
	figures_release(&set);
	figure_count(FIG_connections_total, 2);
	figure_count(FIG_attach_waits_total, 1);
	figures_collect(&srv, 0, &set);
	samples(&set, FIG_connections_total, &p);
	assert_int_equal(p->value, before + 2);
	samples(&set, FIG_attach_waits_total, &p);
	assert_true(p->value >= 1);
	figures_release(&set);
}

/*
 * metrics.c counts requests by their Request.body field number in arrays of
 * METRICS_KINDS: a field numbered past them would be counted as "invalid"
 * without a word. Every field of the oneof, read from the generated
 * descriptor, is below METRICS_KINDS (a new field >= 32 fails here; grow
 * the arrays with it).
 */
static void test_every_request_kind_has_a_counter(void **state)
{
	const ProtobufCMessageDescriptor *d = &tensord__request__descriptor;
	unsigned in_oneof = 0;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];

		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		in_oneof++;
		if (f->id >= METRICS_KINDS)
			fail_msg("Request field %s is numbered %u: metrics.h counts kinds below "
				 "METRICS_KINDS (%d)",
				 f->name, f->id, METRICS_KINDS);
	}
	assert_true(in_oneof >= 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_the_table_is_whole),
		cmocka_unit_test(test_every_request_kind_has_a_counter),
		cmocka_unit_test_setup_teardown(test_samples_come_in_table_order_with_their_labels,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_per_uid_rows_follow_one_rule, setup, teardown),
		cmocka_unit_test_setup_teardown(test_counted_figures_count, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
