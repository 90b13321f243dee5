/* The plugin loader against a real backend and plugins broken on purpose: each failure must be
 * one message naming the file and the cause, and nothing may crash. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#define TEST_PLUGIN(name) RLX_TEST_PLUGIN_DIR "/rlx-test-" name ".so"

static void test_loads_good_plugin(void **state) {
    (void)state;
    rlx_plugin_handle *h = NULL;
    assert_ok(rlx_plugin_load(TEST_PLUGIN("add-only"), &h));
    const rlx_plugin *d = rlx_plugin_desc(h);
    assert_string_equal(d->name, "Add-Only");
    assert_string_equal(d->version, "1.2.3");
    assert_int_equal(d->kind, RLX_PLUGIN_BACKEND);
    assert_string_equal(rlx_plugin_path(h), TEST_PLUGIN("add-only"));
    rlx_plugin_unload(h);
}

static void expect_failure(const char *path, int status, const char *cause) {
    rlx_plugin_handle *h = (rlx_plugin_handle *)&h;
    assert_int_equal(rlx_plugin_load(path, &h), status);
    assert_null(h);
    assert_error_mentions(path);
    assert_error_mentions(cause);
}

static void test_rejects_wrong_abi(void **state) {
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "ABI major %d", RLX_ABI_MAJOR + 1);
    expect_failure(TEST_PLUGIN("wrong-abi"), RLX_E_ABI, want);
}

static void test_rejects_missing_entry(void **state) {
    (void)state;
    expect_failure(TEST_PLUGIN("no-entry"), RLX_E_PLUGIN, "rlx_plugin_entry");
}

static void test_rejects_half_a_lifecycle(void **state) {
    (void)state;
    expect_failure(TEST_PLUGIN("half-lifecycle"), RLX_E_ABI, "prepare_weight without release_weight");
}

static void test_rejects_short_table(void **state) {
    (void)state;
    expect_failure(TEST_PLUGIN("short-table"), RLX_E_ABI, "too short");
}

static void test_reports_refusal_reason(void **state) {
    (void)state;
    expect_failure(TEST_PLUGIN("refuse-init"), RLX_E_PLUGIN, "instruction set this CPU lacks");
}

static void test_rejects_unknown_kind(void **state) {
    (void)state;
    expect_failure(TEST_PLUGIN("wrong-kind"), RLX_E_UNSUPPORTED, "kind");
}

static void test_missing_file_and_bad_paths(void **state) {
    (void)state;
    expect_failure(RLX_TEST_PLUGIN_DIR "/rlx-absent.so", RLX_E_NOT_FOUND, "No such file");
    rlx_plugin_handle *h;
    assert_int_equal(rlx_plugin_load("rlx-test-add-only.so", &h), RLX_E_INVALID);
    assert_error_mentions("'/'");
    /* a file that exists but is not a shared object: dlopen's reason is passed on */
    char path[] = "/tmp/rlx-notso-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hello", 5), 5);
    close(fd);
    expect_failure(path, RLX_E_PLUGIN, "dlopen failed");
    unlink(path);
}

static void test_registry_finds_by_name_ignoring_case(void **state) {
    (void)state;
    rlx_registry *r;
    assert_ok(rlx_registry_create(RLX_TEST_PLUGIN_DIR, &r));
    assert_string_equal(rlx_registry_dir(r, 0), RLX_TEST_PLUGIN_DIR);
    rlx_plugin_handle *h;
    assert_ok(rlx_registry_load(r, RLX_PLUGIN_BACKEND, "add-ONLY", &h));
    assert_string_equal(rlx_plugin_desc(h)->name, "Add-Only");
    rlx_plugin_unload(h);
    /* the real backend is found in the build tree, after the explicit folder */
    assert_ok(rlx_registry_load(r, RLX_PLUGIN_BACKEND, "CPU-BLAS", &h));
    assert_string_equal(rlx_plugin_desc(h)->name, "cpu-blas");
    rlx_plugin_unload(h);
    assert_int_equal(rlx_registry_load(r, RLX_PLUGIN_BACKEND, "no-such-backend", &h), RLX_E_NOT_FOUND);
    assert_error_mentions("no-such-backend");
    assert_error_mentions(RLX_TEST_PLUGIN_DIR);
    rlx_registry_destroy(r);
}

typedef struct seen {
    int good, broken;
} seen;

static int count(void *ctx, const char *path, const rlx_plugin_handle *h, const char *error) {
    seen *s = ctx;
    if (strstr(path, RLX_TEST_PLUGIN_DIR) != path)
        return 0;
    if (h)
        s->good++;
    else
        s->broken += error && strstr(error, path) == error;
    return 0;
}

static void test_registry_lists_broken_plugins_with_reasons(void **state) {
    (void)state;
    rlx_registry *r;
    assert_ok(rlx_registry_create(RLX_TEST_PLUGIN_DIR, &r));
    seen s = {0};
    assert_ok(rlx_registry_each(r, count, &s));
    assert_int_equal(s.good, 3); /* add-only, abi10, span */
    assert_int_equal(s.broken, 6);
    rlx_registry_destroy(r);
}

static void test_env_path_is_searched(void **state) {
    (void)state;
    setenv("RLX_PLUGIN_PATH", "/nonexistent:" RLX_TEST_PLUGIN_DIR, 1);
    rlx_registry *r;
    assert_ok(rlx_registry_create(NULL, &r));
    assert_string_equal(rlx_registry_dir(r, 0), "/nonexistent");
    assert_string_equal(rlx_registry_dir(r, 1), RLX_TEST_PLUGIN_DIR);
    rlx_plugin_handle *h;
    assert_ok(rlx_registry_load(r, RLX_PLUGIN_BACKEND, "add-only", &h));
    rlx_plugin_unload(h);
    rlx_registry_destroy(r);
    unsetenv("RLX_PLUGIN_PATH");
}

static void test_backend_from_plugin_runs(void **state) {
    (void)state;
    rlx_plugin_handle *h;
    assert_ok(rlx_plugin_load(TEST_PLUGIN("add-only"), &h));
    rlx_backend *b;
    assert_ok(rlx_backend_create(h, NULL, &b));
    assert_string_equal(rlx_backend_name(b), "Add-Only");
    float a[3] = {1, 2, 3}, out[3];
    rlx_tensor in[2] = {{.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {3, 1, 1, 1}, .data = a},
                        {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {3, 1, 1, 1}, .data = a}};
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {3, 1, 1, 1}, .data = out};
    rlx_op_params p = {0};
    rlx_node_view v = {.op = RLX_OP_ADD, .n_inputs = 2, .inputs = in, .output = &o, .params = &p, .name = "x"};
    assert_true(rlx_backend_supports(b, &v));
    assert_ok(rlx_backend_compute(b, &v));
    assert_true(out[0] == 2 && out[1] == 4 && out[2] == 6);
    v.op = RLX_OP_SWIGLU;
    assert_false(rlx_backend_supports(b, &v));
    rlx_backend_destroy(b);
    rlx_plugin_unload(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_good_plugin),
        cmocka_unit_test(test_rejects_wrong_abi),
        cmocka_unit_test(test_rejects_missing_entry),
        cmocka_unit_test(test_rejects_short_table),
        cmocka_unit_test(test_rejects_half_a_lifecycle),
        cmocka_unit_test(test_reports_refusal_reason),
        cmocka_unit_test(test_rejects_unknown_kind),
        cmocka_unit_test(test_missing_file_and_bad_paths),
        cmocka_unit_test(test_registry_finds_by_name_ignoring_case),
        cmocka_unit_test(test_registry_lists_broken_plugins_with_reasons),
        cmocka_unit_test(test_env_path_is_searched),
        cmocka_unit_test(test_backend_from_plugin_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
