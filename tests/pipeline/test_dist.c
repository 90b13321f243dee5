/* The network-free parts of pipelines: layer splits, range checks, deployment files (with
 * their line-numbered errors) and model identities. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rlx/deploy.h"
#include "rlx/dist.h"

/* A configuration that gives the layer count alone: no sizes, so every layer weighs the same. */
static const rlx_model_config *layers_only(int64_t n_layers) {
    static rlx_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_hidden_layers = n_layers;
    return &cfg;
}

/* Qwen3-0.6B's shape (the benchmarks' model): its tied LM head reads 155.6M weights, a layer
 * 15.7M, so the last stage gets fewer layers; Brown's (the shipped model) head is half a layer
 * and its even split stays. Each split is the lightest heaviest stage, nearest to even. */
static void test_split_balanced_weighs_the_lm_head(void **state) {
    (void)state;
    rlx_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_hidden_layers = 28;
    cfg.hidden_size = 1024;
    cfg.num_attention_heads = 16;
    cfg.num_key_value_heads = 8;
    cfg.head_dim = 128;
    cfg.intermediate_size = 3072;
    cfg.vocab_size = 151936;
    rlx_layer_range r[4];
    assert_int_equal(rlx_dist_split_balanced(&cfg, 2, r), RLX_OK);
    assert_int_equal(r[0].start, 0);
    assert_int_equal(r[0].end, 19);
    assert_int_equal(r[1].end, 28);
    /* 13 layers is the least the heaviest stage can weigh; of those splits, the nearest to even */
    assert_int_equal(rlx_dist_split_balanced(&cfg, 3, r), RLX_OK);
    assert_int_equal(r[0].end, 12);
    assert_int_equal(r[1].end, 25);
    assert_int_equal(r[2].end, 28);
    assert_int_equal(rlx_dist_check_ranges(28, r, 3), RLX_OK);
    assert_int_equal(rlx_dist_split_balanced(&cfg, 1, r), RLX_OK);
    assert_int_equal(r[0].end, 28);
    cfg.num_hidden_layers = 8; /* Brown: hidden 512, 8 heads and 4 KV heads of 64, MLP 2048, vocab 4096 */
    cfg.hidden_size = 512;
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = 4;
    cfg.head_dim = 64;
    cfg.intermediate_size = 2048;
    cfg.vocab_size = 4096;
    assert_int_equal(rlx_dist_split_balanced(&cfg, 2, r), RLX_OK);
    assert_int_equal(r[0].end, 4);
    assert_int_equal(rlx_dist_split_balanced(&cfg, 3, r), RLX_OK);
    assert_int_equal(r[0].end, 3);
    assert_int_equal(r[1].end, 6);
    /* sparse layers weigh the experts a token uses: layers 0 and 1 of 4 are MoE here (2 and 3
     * are in mlp_only_layers), each far heavier than a dense one, so they go to different stages */
    cfg.num_hidden_layers = 4;
    cfg.vocab_size = 16;
    cfg.num_experts = 8;
    cfg.num_experts_per_tok = 2;
    cfg.moe_intermediate_size = 8192;
    cfg.decoder_sparse_step = 1;
    cfg.layer_dense_mlp[2] = cfg.layer_dense_mlp[3] = 1;
    assert_true(rlx_model_config_layer_is_moe(&cfg, 1) && !rlx_model_config_layer_is_moe(&cfg, 2));
    assert_int_equal(rlx_dist_split_balanced(&cfg, 2, r), RLX_OK);
    assert_int_equal(r[0].end, 1);
    /* no sizes: the even split; more stages than layers and no configuration are refused */
    assert_int_equal(rlx_dist_split_balanced(layers_only(10), 4, r), RLX_OK);
    assert_int_equal(r[0].end, 3);
    assert_int_equal(r[1].end, 6);
    assert_int_equal(rlx_dist_split_balanced(layers_only(3), 4, r), RLX_E_RANGE);
    assert_int_equal(rlx_dist_split_balanced(NULL, 2, r), RLX_E_INVALID);
}

static void test_split_even_gives_earlier_stages_the_extra_layers(void **state) {
    (void)state;
    rlx_layer_range r[4];
    assert_int_equal(rlx_dist_split_even(10, 4, r), RLX_OK);
    uint32_t want[4][2] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r[i].start, want[i][0]);
        assert_int_equal(r[i].end, want[i][1]);
    }
    assert_int_equal(rlx_dist_check_ranges(10, r, 4), RLX_OK);
    assert_int_equal(rlx_dist_split_even(28, 1, r), RLX_OK);
    assert_int_equal(r[0].end, 28);
    assert_int_equal(rlx_dist_split_even(3, 4, r), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "every stage needs a layer"));
    assert_int_equal(rlx_dist_split_even(3, 0, r), RLX_E_INVALID);
}

static void test_check_ranges_names_gaps_and_overlaps(void **state) {
    (void)state;
    rlx_layer_range gap[2] = {{0, 3}, {4, 8}}, overlap[2] = {{0, 4}, {3, 8}}, short_[2] = {{0, 4}, {4, 7}},
                    past[2] = {{0, 4}, {4, 9}}, late[1] = {{1, 8}}, empty[2] = {{0, 0}, {0, 8}};
    assert_int_equal(rlx_dist_check_ranges(8, gap, 2), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "layers 3-3 are run by no stage"));
    assert_int_equal(rlx_dist_check_ranges(8, overlap, 2), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "overlap"));
    assert_int_equal(rlx_dist_check_ranges(8, short_, 2), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "layers 7-7 are run by no stage"));
    assert_int_equal(rlx_dist_check_ranges(8, past, 2), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "past the model's 8 layers"));
    assert_int_equal(rlx_dist_check_ranges(8, late, 1), RLX_E_RANGE);
    assert_int_equal(rlx_dist_check_ranges(8, empty, 2), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "empty"));
}

static void test_parse_range(void **state) {
    (void)state;
    rlx_layer_range r;
    assert_int_equal(rlx_dist_parse_range("0-13", &r), RLX_OK);
    assert_int_equal(r.start, 0);
    assert_int_equal(r.end, 14);
    assert_int_equal(rlx_dist_parse_range("5", &r), RLX_OK);
    assert_int_equal(r.start, 5);
    assert_int_equal(r.end, 6);
    const char *bad[] = {"", "-", "3-", "-3", "a-b", "1-2-3", "1 - 2", "99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rlx_dist_parse_range(bad[i], &r), RLX_E_INVALID);
    assert_int_equal(rlx_dist_parse_range("5-2", &r), RLX_E_RANGE);
}

// ---- deployment files ----

static char tmpdir[256];

static int make_tmpdir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/rlx-test-dist-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *write_file(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_deploy_full_file(void **state) {
    (void)state;
    const char *path = write_file("full.yaml", "# a comment\n"
                                               "model: models/qwen3\n"
                                               "transport: grpc\n"
                                               "stages:\n"
                                               "  - address: 127.0.0.1:7101\n"
                                               "    backend: onednn\n"
                                               "    layers: 0-13\n"
                                               "    threads: 2\n"
                                               "    backend_options: 'isa=avx2,gemv_m=8'\n"
                                               "  - {address: '[::1]:7102', backend: cpu-blas, layers: 14-27,\n"
                                               "     listen: '0.0.0.0:7102'}\n"
                                               "speculator: {plugin: mtp, draft_tokens: 4}\n"
                                               "generation: {max_tokens: 64, temperature: 0.7, top_k: 20,\n"
                                               "             top_p: 0.8, seed: 18446744073709551615,\n"
                                               "             min_p: 0.05, repeat_penalty: 1.1, repeat_last_n: -1,\n"
                                               "             presence_penalty: -0.5, frequency_penalty: 0.25}\n"
                                               "timeouts: {connect_ms: 1000, control_ms: 2000, per_position_ms: 3,\n"
                                               "           recovery_ms: 4}\n");
    rlx_deploy *d = NULL;
    assert_int_equal(rlx_deploy_open(path, &d), RLX_OK);
    char model[600];
    snprintf(model, sizeof model, "%s/models/qwen3", tmpdir);
    assert_string_equal(rlx_deploy_model(d), model);
    assert_string_equal(rlx_deploy_transport(d), "grpc");
    assert_int_equal(rlx_deploy_n_stages(d), 2);
    const rlx_deploy_stage *s0 = rlx_deploy_stage_at(d, 0), *s1 = rlx_deploy_stage_at(d, 1);
    assert_string_equal(s0->address, "127.0.0.1:7101");
    assert_null(s0->listen);
    assert_string_equal(s0->backend, "onednn");
    assert_int_equal(s0->threads, 2);
    assert_string_equal(s0->backend_options, "isa=avx2,gemv_m=8");
    assert_int_equal(s0->line, 5);
    assert_string_equal(s1->address, "[::1]:7102");
    assert_string_equal(s1->listen, "0.0.0.0:7102");
    assert_null(s1->backend_options);
    assert_int_equal(s1->layers.start, 14);
    assert_int_equal(s1->layers.end, 28);
    assert_null(rlx_deploy_stage_at(d, 2));
    const rlx_deploy_speculator *sp = rlx_deploy_speculator_of(d);
    assert_non_null(sp);
    assert_string_equal(sp->plugin, "mtp");
    assert_int_equal(sp->draft_tokens, 4);
    const rlx_deploy_generation *g = rlx_deploy_generation_of(d);
    assert_true(g->has_max_tokens && g->has_temperature && g->has_top_k && g->has_top_p && g->has_seed);
    assert_int_equal(g->max_tokens, 64);
    assert_true(g->temperature > 0.69f && g->temperature < 0.71f);
    assert_int_equal(g->top_k, 20);
    assert_true(g->seed == UINT64_MAX);
    assert_true(g->has_min_p && g->has_repeat_penalty && g->has_repeat_last_n && g->has_presence_penalty &&
                g->has_frequency_penalty);
    assert_true(g->min_p == 0.05f && g->repeat_penalty == 1.1f && g->presence_penalty == -0.5f &&
                g->frequency_penalty == 0.25f);
    assert_int_equal(g->repeat_last_n, -1);
    const rlx_deploy_timeouts *t = rlx_deploy_timeouts_of(d);
    assert_int_equal(t->connect_ms, 1000);
    assert_int_equal(t->control_ms, 2000);
    assert_int_equal(t->per_position_ms, 3);
    assert_int_equal(t->recovery_ms, 4);
    assert_null(s0->standby);
    assert_int_equal(s0->n_standby, 0);
    rlx_layer_range r[2];
    assert_int_equal(rlx_deploy_layers(d, layers_only(28), r), RLX_OK);
    assert_int_equal(r[0].end, 14);
    assert_int_equal(rlx_deploy_layers(d, layers_only(30), r), RLX_E_RANGE); /* the model has more layers */
    assert_non_null(strstr(rlx_last_error(), "layers 28-29 are run by no stage"));
    assert_non_null(strstr(rlx_last_error(), ":10:"));
    assert_int_equal(rlx_deploy_layers(d, layers_only(20), r), RLX_E_RANGE);
    assert_non_null(strstr(rlx_last_error(), "past the model's 20 layers"));
    rlx_deploy_close(d);
}

static void test_deploy_defaults_and_even_split(void **state) {
    (void)state;
    const char *path = write_file("min.yaml", "stages:\n  - address: host-a:1\n  - address: host-b.example:2\n"
                                              "  - address: 10.0.0.3:3\n");
    rlx_deploy *d = NULL;
    assert_int_equal(rlx_deploy_open(path, &d), RLX_OK);
    assert_null(rlx_deploy_model(d));
    assert_string_equal(rlx_deploy_transport(d), "tcp");
    assert_null(rlx_deploy_speculator_of(d));
    const rlx_deploy_generation *g = rlx_deploy_generation_of(d);
    assert_false(g->has_max_tokens || g->has_temperature || g->has_min_p || g->has_repeat_penalty ||
                 g->has_repeat_last_n || g->has_presence_penalty || g->has_frequency_penalty);
    /* no timeouts: every one 0, so the driver's defaults apply */
    const rlx_deploy_timeouts *t = rlx_deploy_timeouts_of(d);
    assert_true(!t->connect_ms && !t->control_ms && !t->per_position_ms && !t->recovery_ms);
    rlx_layer_range r[3];
    assert_int_equal(rlx_deploy_layers(d, layers_only(7), r), RLX_OK);
    assert_int_equal(r[0].end, 3);
    assert_int_equal(r[1].end, 5);
    assert_int_equal(r[2].end, 7);
    assert_int_equal(rlx_deploy_layers(d, layers_only(2), r), RLX_E_RANGE);
    rlx_deploy_close(d);
    /* temperature 0 means greedy, as in rlx_sampler_params; 0 turns the penalties' window off */
    path = write_file("zero.yaml", "stages:\n  - address: a:1\ngeneration: {temperature: 0, repeat_last_n: 0}\n");
    assert_int_equal(rlx_deploy_open(path, &d), RLX_OK);
    g = rlx_deploy_generation_of(d);
    assert_true(g->has_temperature && g->temperature == 0 && g->has_repeat_last_n && g->repeat_last_n == 0);
    rlx_deploy_close(d);
}

static void test_deploy_standby(void **state) {
    (void)state;
    /* a block list, a flow list and a single address (a list of one) */
    const char *path = write_file("standby.yaml", "stages:\n"
                                                  "  - address: 127.0.0.1:7101\n"
                                                  "    standby:\n"
                                                  "      - 127.0.0.1:7111\n"
                                                  "      - '[::1]:7121'\n"
                                                  "      - backup.example:7131\n"
                                                  "  - {address: 127.0.0.1:7102, standby: [127.0.0.1:7112]}\n"
                                                  "  - address: 127.0.0.1:7103\n"
                                                  "  - address: 127.0.0.1:7104\n"
                                                  "    standby: 127.0.0.1:7114\n");
    rlx_deploy *d = NULL;
    assert_int_equal(rlx_deploy_open(path, &d), RLX_OK);
    const rlx_deploy_stage *s0 = rlx_deploy_stage_at(d, 0), *s1 = rlx_deploy_stage_at(d, 1),
                           *s2 = rlx_deploy_stage_at(d, 2), *s3 = rlx_deploy_stage_at(d, 3);
    assert_int_equal(s0->n_standby, 3);
    assert_string_equal(s0->standby[0], "127.0.0.1:7111"); /* the order the driver tries them in */
    assert_string_equal(s0->standby[1], "[::1]:7121");
    assert_string_equal(s0->standby[2], "backup.example:7131");
    assert_int_equal(s1->n_standby, 1);
    assert_string_equal(s1->standby[0], "127.0.0.1:7112");
    assert_null(s2->standby);
    assert_int_equal(s2->n_standby, 0);
    assert_int_equal(s3->n_standby, 1);
    assert_string_equal(s3->standby[0], "127.0.0.1:7114");
    /* the driver gets them with each stage */
    rlx_driver_stage ds[4];
    memset(ds, 0xff, sizeof ds);
    assert_int_equal(rlx_deploy_driver_stages(d, layers_only(8), ds), RLX_OK);
    for (uint32_t i = 0; i < 4; i++) {
        const rlx_deploy_stage *s = rlx_deploy_stage_at(d, i);
        assert_ptr_equal(ds[i].standby, s->standby);
        assert_int_equal(ds[i].n_standby, s->n_standby);
        assert_string_equal(ds[i].address, s->address);
        assert_int_equal(ds[i].layers.start, 2 * i);
    }
    rlx_deploy_close(d);
    /* RLX_DIST_MAX_STANDBY is allowed; the mpi transport's rank:K addresses are addresses too */
    char text[1024];
    int len = snprintf(text, sizeof text, "transport: mpi\nstages:\n  - address: rank:1\n    standby: [");
    for (int i = 0; i < RLX_DIST_MAX_STANDBY; i++)
        len += snprintf(text + len, sizeof text - (size_t)len, "%srank:%d", i ? ", " : "", i + 3);
    snprintf(text + len, sizeof text - (size_t)len, "]\n  - address: rank:2\n");
    assert_int_equal(rlx_deploy_open(write_file("mpi.yaml", text), &d), RLX_OK);
    assert_int_equal(rlx_deploy_stage_at(d, 0)->n_standby, RLX_DIST_MAX_STANDBY);
    assert_string_equal(rlx_deploy_stage_at(d, 0)->standby[RLX_DIST_MAX_STANDBY - 1], "rank:10");
    rlx_deploy_close(d);
}

/* Bad files, each refused with "FILE:LINE: " and a message containing `needle`. */
static const struct bad_deploy {
    const char *text;
    unsigned line;
    const char *needle;
} bad_deploys[] = {
    {"model: m\nstagez:\n  - address: a:1\n", 2, "unknown key 'stagez'"},
    {"model: m\n", 1, "no 'stages'"},
    {"stages: []\n", 1, "'stages' is empty"},
    {"stages: 3\n", 1, "must be a list"},
    {"stages:\n  - backend: ref\n", 2, "has no address"},
    {"stages:\n  - address: nohost\n", 2, "has no port (want host:port)"},
    {"stages:\n  - address: ':7101'\n", 2, "has no host"},
    {"stages:\n  - address: '[]:7101'\n", 2, "has no host"},
    {"stages:\n  - address: '[::g]:7101'\n", 2, "'g' cannot appear in an IPv6 address"},
    {"stages:\n  - address: a:70000\n", 2, "port must be"},
    {"stages:\n  - address: a:0\n", 2, "port must be"},
    {"stages:\n  - address: a b:1\n", 2, "cannot appear in a host name"},
    {"stages:\n  - address: a:1\n    colour: red\n", 3, "unknown key 'colour' in a stage"},
    {"stages:\n  - address: a:1\n    backend_options: {isa: c}\n", 3, "'backend_options' must be a non-empty string"},
    {"stages:\n  - address: a:1\n    backend_opts: isa=c\n", 3,
     "unknown key 'backend_opts' in a stage (known: address, backend, backend_options,"},
    {"stages:\n  - address: a:1\n    threads: many\n", 3, "'threads' must be a non-negative integer"},
    {"stages:\n  - address: a:1\n    threads: 0\n", 3, "at least 1"},
    {"stages:\n  - address: a:1\n    layers: [0, 3]\n", 3, "layers must look like 0-13"},
    {"stages:\n  - address: a:1\n    layers: 0-3\n  - address: b:1\n    layers: 5-7\n", 4,
     "gap: layers 4-4 are run by no stage"},
    {"stages:\n  - address: a:1\n    layers: 0-3\n  - address: b:1\n    layers: 3-7\n", 4, "overlap"},
    {"stages:\n  - address: a:1\n    layers: 1-3\n", 2, "layers 0-0 are run by no stage"},
    {"stages:\n  - address: a:1\n    layers: 0-3\n  - address: b:1\n", 4, "for every stage or for none"},
    {"stages:\n  - address: a:1\n    address: b:2\n", 3, "'address' is given twice"},
    {"model: [a]\nstages:\n  - address: a:1\n", 1, "'model' must be a non-empty string"},
    {"stages:\n  - address: a:1\ngeneration: {top_p: 2}\n", 3, "top_p must be in (0, 1]"},
    {"stages:\n  - address: a:1\ngeneration: {temperature: hot}\n", 3, "must be a number"},
    {"stages:\n  - address: a:1\ngeneration: {temperature: -0.1}\n", 3, "temperature must be >= 0"},
    {"stages:\n  - address: a:1\ngeneration: {min_p: 1.5}\n", 3, "min_p must be in [0, 1]"},
    {"stages:\n  - address: a:1\ngeneration: {min_p: -0.1}\n", 3, "min_p must be in [0, 1]"},
    {"stages:\n  - address: a:1\ngeneration: {repeat_penalty: 0}\n", 3, "repeat_penalty must be > 0"},
    {"stages:\n  - address: a:1\ngeneration: {repeat_penalty: inf}\n", 3, "must be a number"},
    {"stages:\n  - address: a:1\ngeneration: {repeat_last_n: -2}\n", 3,
     "repeat_last_n must be a number of tokens up to 2147483647, or -1"},
    {"stages:\n  - address: a:1\ngeneration: {repeat_last_n: 3000000000}\n", 3, "repeat_last_n must be"},
    {"stages:\n  - address: a:1\ngeneration: {repeat_last_n: 1.5}\n", 3, "repeat_last_n must be"},
    {"stages:\n  - address: a:1\ngeneration: {presence_penalty: nan}\n", 3, "must be a number"},
    {"stages:\n  - address: a:1\ngeneration: {frequency_penalty: [1]}\n", 3, "'frequency_penalty' must be a number"},
    {"stages:\n  - address: a:1\ngeneration: {min-p: 0.1}\n", 3,
     "unknown key 'min-p' in generation (known: max_tokens, temperature, top_k, top_p, seed, min_p,"},
    {"stages:\n  - address: a:1\nspeculator: {draft_tokens: 4}\n", 3, "needs a plugin"},
    {"stages:\n  - address: a:1\nspeculator: {plugin: mtp, k: 4}\n", 3, "unknown key 'k' in speculator"},
    {"stages:\n  - address: a:1\n  - address: [b\n", 4, "not valid YAML"},
    /* standby */
    {"stages:\n  - address: a:1\n    standby: {host: b, port: 2}\n", 3,
     "'standby' must be an address (host:port) or a list of addresses"},
    {"stages:\n  - address: a:1\n    standby:\n", 3, "'standby' must be an address"},
    {"stages:\n  - address: a:1\n    standby: []\n", 3, "'standby' is empty"},
    {"stages:\n  - address: a:1\n    standby:\n      - b:2\n      - [c:3]\n", 5,
     "each 'standby' entry must be an address"},
    {"stages:\n  - address: a:1\n    standby:\n      - b:2\n      - nohost\n", 5,
     "standby: address 'nohost' has no port"},
    {"stages:\n  - address: a:1\n    standby: b:0\n", 3, "standby: 'b:0': the port must be"},
    {"stages:\n  - address: a:1\n    standby: [b:1, b:2, b:3, b:4, b:5, b:6, b:7, b:8, b:9]\n", 3,
     "'standby' lists 9 addresses; a stage may have at most 8"},
    {"stages:\n  - address: a:1\n    standby: [b:2, A:1]\n", 3, "stage 0: standby A:1 is the stage's own address"},
    /* a later stage's address, found once every stage is read; the line is the standby's */
    {"stages:\n  - address: a:1\n    standby:\n      - b:2\n      - c:3\n  - address: c:3\n", 5,
     "stage 0: standby c:3 is the address of stage 1 (line 6)"},
    {"stages:\n  - address: a:1\n    standby:\n      - b:2\n      - B:2\n", 5,
     "stage 0: standby B:2 is listed twice (line 4)"},
    {"stages:\n  - address: a:1\n    standby: b:2\n  - address: c:3\n    standby: [d:4, b:2]\n", 5,
     "stage 1: standby b:2 is already a standby of stage 0 (line 3)"},
    {"stages:\n  - address: a:1\n    standby: b:2\n    standby: c:3\n", 4, "'standby' is given twice"},
    {"stages:\n  - address: a:1\n    stand_by: b:2\n", 3, "listen, standby, tls)"},
    /* timeouts */
    {"stages:\n  - address: a:1\ntimeouts: {recovery_ms: 0}\n", 3, "'recovery_ms' must be at least 1"},
    {"stages:\n  - address: a:1\ntimeouts:\n  recovery_ms: soon\n", 4, "'recovery_ms' must be a non-negative integer"},
    {"stages:\n  - address: a:1\ntimeouts: {recover_ms: 5}\n", 3,
     "unknown key 'recover_ms' in timeouts (known: connect_ms, control_ms, per_position_ms, recovery_ms, "
     "idle_ms)"},
    {"stages:\n  - address: a:1\ntimeouts: {idle_ms: 0}\n", 3, "'idle_ms' must be at least 1"},
    /* limits */
    {"stages:\n  - address: a:1\nlimits: {connections: 0}\n", 3, "'connections' must be at least 1"},
    {"stages:\n  - address: a:1\nlimits: {sessions: 4294967296}\n", 3,
     "'sessions' must be an integer from 0 to 4294967295, not '4294967296'"},
    {"stages:\n  - address: a:1\nlimits:\n  positions: 0\n", 4, "'positions' must be at least 1"},
    {"stages:\n  - address: a:1\nlimits: {positions: -5}\n", 3, "'positions' must be a non-negative integer"},
    {"stages:\n  - address: a:1\nlimits: {conns: 4}\n", 3,
     "unknown key 'conns' in limits (known: connections, sessions, positions)"},
    {"stages:\n  - address: a:1\nlimits: 16\n", 3, "'limits' must be a mapping"},
    /* auth */
    {"stages:\n  - address: a:1\nauth: {}\n", 3, "auth: needs token_file"},
    {"stages:\n  - address: a:1\nauth: pipeline.token\n", 3, "'auth' must be a mapping"},
    {"stages:\n  - address: a:1\nauth: {token_file: ''}\n", 3, "'token_file' must be a non-empty string"},
    {"stages:\n  - address: a:1\nauth:\n  token_file: t\n  token: s3cret\n", 5,
     "unknown key 'token' in auth (known: token_file)"},
    {"stages:\n  - address: a:1\nauth: {token_file: a}\nauth: {token_file: b}\n", 4, "'auth' is given twice"},
    /* tls: all three files at the top, cert and key in a stage, which needs the top's ca */
    {"stages:\n  - address: a:1\ntls: {ca: ca.pem, cert: n.pem}\n", 3, "tls: needs ca, cert and key together"},
    {"stages:\n  - address: a:1\ntls: {ca: ca.pem, cert: n.pem}\n", 3, "missing: key"},
    {"stages:\n  - address: a:1\ntls:\n  name: stage.internal\n", 4, "missing: ca, cert, key"},
    {"stages:\n  - address: a:1\ntls: {ca: c, cert: n, key: k, sni: x}\n", 3,
     "unknown key 'sni' in tls (known: ca, cert, key, name)"},
    {"stages:\n  - address: a:1\ntls:\n  ca: [c]\n  cert: n\n  key: k\n", 4, "'ca' must be a non-empty string"},
    {"stages:\n  - address: a:1\ntls:\n  ca: c\n  cert: n\n  key: k\n  ca: d\n", 7, "'ca' is given twice"},
    {"stages:\n  - address: a:1\ntls: on\n", 3, "'tls' must be a mapping"},
    {"stages:\n  - address: a:1\n    tls: {cert: s.pem}\ntls: {ca: c, cert: n, key: k}\n", 3,
     "a stage's tls: needs both cert and key"},
    {"stages:\n  - address: a:1\n    tls: {cert: s.pem, key: s.key, ca: c}\n", 3,
     "'ca' belongs in the file's top-level tls:"},
    {"stages:\n  - address: a:1\n    tls: {cert: s.pem, key: s.key, name: s}\n", 3,
     "'name' belongs in the file's top-level tls:"},
    {"stages:\n  - address: a:1\n    tls: {cert: s.pem, key: s.key, chain: x}\n", 3,
     "unknown key 'chain' in a stage's tls (known: cert, key)"},
    {"stages:\n  - address: a:1\n    tls: s.pem\n", 3, "a stage's 'tls' must be a mapping"},
    {"stages:\n  - address: a:1\n  - address: b:1\n    tls:\n      cert: s.pem\n      key: s.key\n", 5,
     "stage 1's tls: gives its certificate, but the file has no top-level tls: with the ca"},
    {"", 1, "empty"},
    {"- a\n- b\n", 1, "must be a mapping"},
};

static void test_deploy_errors_name_file_and_line(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_deploys / sizeof bad_deploys[0]; i++) {
        const struct bad_deploy *b = &bad_deploys[i];
        const char *path = write_file("bad.yaml", b->text);
        rlx_deploy *d = (rlx_deploy *)&d;
        assert_int_not_equal(rlx_deploy_open(path, &d), RLX_OK);
        assert_null(d);
        char where[600];
        snprintf(where, sizeof where, "%s:%u: ", path, b->line);
        if (!strstr(rlx_last_error(), where) || !strstr(rlx_last_error(), b->needle))
            fail_msg("case %zu:\n%s\ngot: %s\nwanted %s...%s", i, b->text, rlx_last_error(), where, b->needle);
    }
}

/* auth:, tls: (the file's and a stage's own certificate), limits: and timeouts.idle_ms: relative
 * paths land in the file's folder, absolute ones stay; a stage without its own certificate
 * gets the file's; the driver alone gets the name. */
static void test_deploy_security_and_limits(void **state) {
    (void)state;
    const char *path = write_file("secure.yaml", "stages:\n"
                                                 "  - address: s0.internal:7101\n"
                                                 "    tls: {cert: pki/s0.pem, key: /etc/rlx/s0.key}\n"
                                                 "  - address: s1.internal:7102\n"
                                                 "auth: {token_file: secrets/pipeline.token}\n"
                                                 "tls:\n"
                                                 "  ca: pki/ca.pem\n"
                                                 "  cert: /etc/rlx/node.pem\n"
                                                 "  key: pki/node.key\n"
                                                 "  name: stage.internal\n"
                                                 "limits: {connections: 4, sessions: 32, positions: 8589934592}\n"
                                                 "timeouts: {idle_ms: 60000}\n");
    char want[700];
    rlx_deploy *d = NULL;
    assert_int_equal(rlx_deploy_open(path, &d), RLX_OK);
    const rlx_deploy_limits *l = rlx_deploy_limits_of(d);
    assert_int_equal(l->connections, 4);
    assert_int_equal(l->sessions, 32);
    assert_true(l->positions == 8589934592ull);
    assert_int_equal(rlx_deploy_timeouts_of(d)->idle_ms, 60000);
    assert_int_equal(rlx_deploy_timeouts_of(d)->connect_ms, 0);

    rlx_dist_security sec;
    memset(&sec, 0xff, sizeof sec);
    assert_int_equal(rlx_deploy_security(d, -1, &sec), RLX_OK);
    snprintf(want, sizeof want, "%s/pki/ca.pem", tmpdir);
    assert_string_equal(sec.tls_ca, want);
    assert_string_equal(sec.tls_cert, "/etc/rlx/node.pem");
    snprintf(want, sizeof want, "%s/pki/node.key", tmpdir);
    assert_string_equal(sec.tls_key, want);
    assert_string_equal(sec.tls_name, "stage.internal");
    snprintf(want, sizeof want, "%s/secrets/pipeline.token", tmpdir);
    assert_string_equal(sec.auth_token_file, want);
    assert_int_equal(sec.insecure_listen, 0);

    assert_int_equal(rlx_deploy_security(d, 0, &sec), RLX_OK); /* its own certificate */
    snprintf(want, sizeof want, "%s/pki/s0.pem", tmpdir);
    assert_string_equal(sec.tls_cert, want);
    assert_string_equal(rlx_deploy_stage_at(d, 0)->tls_cert, want);
    assert_string_equal(sec.tls_key, "/etc/rlx/s0.key");
    snprintf(want, sizeof want, "%s/pki/ca.pem", tmpdir);
    assert_string_equal(sec.tls_ca, want);
    assert_null(sec.tls_name);
    assert_non_null(strstr(sec.auth_token_file, "/secrets/pipeline.token"));

    assert_int_equal(rlx_deploy_security(d, 1, &sec), RLX_OK); /* the file's */
    assert_string_equal(sec.tls_cert, "/etc/rlx/node.pem");
    assert_non_null(strstr(sec.tls_key, "/pki/node.key"));
    assert_null(rlx_deploy_stage_at(d, 1)->tls_cert);
    assert_null(rlx_deploy_stage_at(d, 1)->tls_key);

    assert_int_equal(rlx_deploy_security(d, 2, &sec), RLX_E_INVALID);
    assert_non_null(strstr(rlx_last_error(), "has 2 stages; stage 2 is not one of them"));
    assert_int_equal(rlx_deploy_security(d, -1, NULL), RLX_E_INVALID);
    rlx_deploy_close(d);

    /* none given: no credentials, no limits */
    assert_int_equal(rlx_deploy_open(write_file("plain.yaml", "stages:\n  - address: a:1\n"), &d), RLX_OK);
    memset(&sec, 0xff, sizeof sec);
    assert_int_equal(rlx_deploy_security(d, 0, &sec), RLX_OK);
    assert_true(!sec.tls_ca && !sec.tls_cert && !sec.tls_key && !sec.tls_name && !sec.auth_token_file &&
                !sec.insecure_listen);
    l = rlx_deploy_limits_of(d);
    assert_true(!l->connections && !l->sessions && !l->positions && !rlx_deploy_timeouts_of(d)->idle_ms);
    rlx_deploy_close(d);
}

static void test_deploy_missing_file(void **state) {
    (void)state;
    rlx_deploy *d;
    assert_int_equal(rlx_deploy_open("/nonexistent/deploy.yaml", &d), RLX_E_IO);
    assert_non_null(strstr(rlx_last_error(), "/nonexistent/deploy.yaml"));
}

static void test_check_address(void **state) {
    (void)state;
    assert_int_equal(rlx_deploy_check_address("127.0.0.1:7101", 0), RLX_OK);
    assert_int_equal(rlx_deploy_check_address("[fe80::1]:1", 0), RLX_OK);
    assert_int_equal(rlx_deploy_check_address("0.0.0.0:0", 1), RLX_OK);
    assert_int_equal(rlx_deploy_check_address("0.0.0.0:0", 0), RLX_E_INVALID);
    assert_int_equal(rlx_deploy_check_address("::1:7", 0), RLX_E_INVALID);
    assert_int_equal(rlx_deploy_check_address("[]:7", 0), RLX_E_INVALID);
    assert_int_equal(rlx_deploy_check_address("host:", 0), RLX_E_INVALID);
    assert_int_equal(rlx_deploy_check_address(":80", 0), RLX_E_INVALID);
}

// ---- model identity ----

/* Appends n bytes of file path from its start (all of it when n is 0) to out; returns the count. */
static size_t append_file(FILE *out, const char *path, size_t n) {
    FILE *in = fopen(path, "rb");
    assert_non_null(in);
    char buf[65536];
    size_t done = 0, got;
    while ((!n || done < n) && (got = fread(buf, 1, !n || n - done > sizeof buf ? sizeof buf : n - done, in)) > 0) {
        assert_int_equal(fwrite(buf, 1, got, out), got);
        done += got;
    }
    fclose(in);
    return done;
}

/* The id is SHA-256 over config.json, then per safetensors file its size (8 bytes, little-endian)
 * and its first 8 + header-length bytes: the same bytes through coreutils' sha256sum, an
 * implementation rlx does not use, give the same digest. */
static void test_model_id_is_the_sha256_of_its_bytes(void **state) {
    (void)state;
    const char *dir = RLX_TEST_DATA "/dense-tied-f32-s1";
    char id[RLX_MODEL_ID_SIZE], path[1200], stream[1200], cmd[2600], want[65] = "";
    assert_int_equal(rlx_model_id(dir, id), RLX_OK);
    snprintf(stream, sizeof stream, "%s/id-stream", tmpdir);
    FILE *out = fopen(stream, "wb");
    assert_non_null(out);
    snprintf(path, sizeof path, "%s/config.json", dir);
    append_file(out, path, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *st = fopen(path, "rb");
    uint8_t prefix[8];
    assert_non_null(st);
    assert_int_equal(fread(prefix, 1, 8, st), 8);
    fseek(st, 0, SEEK_END);
    const uint64_t size = (uint64_t)ftell(st);
    fclose(st);
    uint64_t header = 0;
    for (int i = 0; i < 8; i++)
        header |= (uint64_t)prefix[i] << (8 * i);
    assert_int_equal(fwrite(&size, 1, 8, out), 8); /* the host is little-endian (dist_internal.h) */
    assert_int_equal(append_file(out, path, 8 + header), 8 + header);
    assert_int_equal(fclose(out), 0);
    snprintf(cmd, sizeof cmd, "sha256sum %s", stream);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_int_equal(fscanf(p, "%64s", want), 1);
    pclose(p);
    assert_string_equal(id, want);
}

static void test_model_id_is_stable_and_discriminating(void **state) {
    (void)state;
    char a[RLX_MODEL_ID_SIZE], b[RLX_MODEL_ID_SIZE], c[RLX_MODEL_ID_SIZE], cmd[1200];
    assert_int_equal(rlx_model_id(RLX_TEST_DATA "/dense-tied-f32-s1", a), RLX_OK);
    assert_int_equal(strlen(a), 64);
    /* the same files elsewhere: the same id */
    snprintf(cmd, sizeof cmd, "cp -r %s %s/copy", RLX_TEST_DATA "/dense-tied-f32-s1", tmpdir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/copy", tmpdir);
    assert_int_equal(rlx_model_id(cmd, b), RLX_OK);
    assert_string_equal(a, b);
    /* another model, or the same weights sharded, or a changed config.json: another id */
    assert_int_equal(rlx_model_id(RLX_TEST_DATA "/dense-untied-bias-f32-s1", c), RLX_OK);
    assert_string_not_equal(a, c);
    assert_int_equal(rlx_model_id(RLX_TEST_DATA "/dense-untied-bias-f32-s3", b), RLX_OK);
    assert_string_not_equal(b, c);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"rms_norm_eps\": 1e-06/\"rms_norm_eps\": 1e-05/' %s/copy/config.json",
             tmpdir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/copy", tmpdir);
    assert_int_equal(rlx_model_id(cmd, b), RLX_OK);
    assert_string_not_equal(a, b);
    assert_int_equal(rlx_model_id("/nonexistent", b), RLX_E_IO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_even_gives_earlier_stages_the_extra_layers),
        cmocka_unit_test(test_split_balanced_weighs_the_lm_head),
        cmocka_unit_test(test_check_ranges_names_gaps_and_overlaps),
        cmocka_unit_test(test_parse_range),
        cmocka_unit_test(test_deploy_full_file),
        cmocka_unit_test(test_deploy_defaults_and_even_split),
        cmocka_unit_test(test_deploy_standby),
        cmocka_unit_test(test_deploy_errors_name_file_and_line),
        cmocka_unit_test(test_deploy_security_and_limits),
        cmocka_unit_test(test_deploy_missing_file),
        cmocka_unit_test(test_check_address),
        cmocka_unit_test(test_model_id_is_stable_and_discriminating),
        cmocka_unit_test(test_model_id_is_the_sha256_of_its_bytes),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
