/* Architectures as data (core/src/model/arch.h): the registry's refusal of an unknown
 * model_type, the architecture-neutral description read through the sized accessors, and the
 * weights a block reads, derived from the architecture's tensor table, on the golden models. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "rlx/model.h"
#include "model_fixture.h"

static rlx_model *open_model(const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", RLX_TEST_DATA, name);
    rlx_model *m = NULL;
    if (rlx_model_open(path, &m) != RLX_OK)
        print_error("%s: %s\n", path, rlx_last_error());
    assert_non_null(m);
    return m;
}

/* An unknown model_type names itself and every architecture with its config.json and GGUF
 * names, so the user sees what would have worked. */
static void test_unknown_model_type(void **state) {
    (void)state;
    char *dir = fixture_dir_create();
    fixture_write_text(dir, "config.json",
                       "{\"model_type\":\"mamba\",\"vocab_size\":8,\"hidden_size\":4,\"intermediate_size\":8,"
                       "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"rms_norm_eps\":1e-6}");
    rlx_model_config c;
    assert_int_equal(rlx_model_config_load(fixture_path(dir, "config.json"), &c), RLX_E_FORMAT);
    fixture_assert_error_has("config.json", "\"mamba\"", "qwen3 (model_type qwen3, GGUF qwen3)",
                             "qwen3_moe (model_type qwen3_moe, GGUF qwen3moe)", "llama (model_type llama, GGUF llama)",
                             "mistral (model_type mistral, GGUF none)");
    fixture_dir_remove(dir);
    free(dir);
}

static rlx_model_arch_info arch_info(const rlx_model *m) {
    rlx_model_arch_info a = {.size = sizeof a};
    assert_int_equal(rlx_model_arch_info_of(m, &a), RLX_OK);
    return a;
}

static rlx_model_layer_info layer_info(const rlx_model *m, uint32_t layer) {
    rlx_model_layer_info l = {.size = sizeof l};
    assert_int_equal(rlx_model_layer_info_of(m, layer, &l), RLX_OK);
    return l;
}

/* The description of the golden model `name` says arch and these flags. */
static void assert_arch(const char *name, const char *arch, uint32_t qk_norm, uint32_t qkv_bias, uint32_t o_bias,
                        uint32_t rope_type) {
    rlx_model *m = open_model(name);
    const rlx_model_arch_info a = arch_info(m);
    assert_string_equal(a.arch, arch);
    assert_int_equal(a.qk_norm, qk_norm);
    assert_int_equal(a.qkv_bias, qkv_bias);
    assert_int_equal(a.o_bias, o_bias);
    assert_int_equal(a.rope_type, rope_type);
    rlx_model_close(m);
}

static void test_arch_info(void **state) {
    (void)state;
    assert_arch("dense-untied-bias-f32-s1", "qwen3", 1, 1, 1, RLX_ROPE_DEFAULT);
    /* attention_bias: all four projections */
    assert_arch("llama-untied-bias-f32-s1", "llama", 0, 1, 1, RLX_ROPE_DEFAULT);
    assert_arch("llama3-rope-f32-s1", "llama", 0, 0, 0, RLX_ROPE_LLAMA3);
    assert_arch("mistral-f32-s1", "mistral", 0, 0, 0, RLX_ROPE_DEFAULT);
    rlx_model *m;
    rlx_model_arch_info a;

    m = open_model("dense-tied-f32-s1");
    a = arch_info(m);
    assert_int_equal(a.qkv_bias, 0);
    assert_int_equal(a.o_bias, 0);
    /* a caller built before arch existed would pass a shorter struct: refused, not overrun */
    rlx_model_arch_info short_info = {.size = offsetof(rlx_model_arch_info, arch)};
    assert_int_equal(rlx_model_arch_info_of(m, &short_info), RLX_E_INVALID);
    rlx_model_close(m);

    m = open_model("moe-f32-s1");
    assert_string_equal(arch_info(m).arch, "qwen3_moe");
    const uint32_t moe[3] = {1, 0, 1}; /* mlp_only_layers [1] */
    for (uint32_t l = 0; l < 3; l++) {
        assert_int_equal(layer_info(m, l).moe, moe[l]);
        assert_int_equal(layer_info(m, l).window, 0);
    }
    rlx_model_layer_info l = {.size = sizeof l};
    assert_int_equal(rlx_model_layer_info_of(m, 3, &l), RLX_E_RANGE);
    /* a caller built against a later header: the members this version has are written, the rest
     * of its struct stays as it was */
    struct {
        rlx_model_layer_info known;
        uint32_t later;
    } bigger = {.known = {.size = sizeof bigger}, .later = 77};
    assert_int_equal(rlx_model_layer_info_of(m, 0, &bigger.known), RLX_OK);
    assert_int_equal(bigger.known.moe, 1);
    assert_int_equal(bigger.known.size, sizeof bigger);
    assert_int_equal(bigger.later, 77);
    rlx_model_close(m);

    m = open_model("qwen2-tied-f32-s1"); /* Qwen2.5: q/k/v biases only, no q/k norms */
    a = arch_info(m);
    assert_string_equal(a.arch, "qwen2");
    assert_int_equal(a.qk_norm, 0);
    assert_int_equal(a.qkv_bias, 1);
    assert_int_equal(a.o_bias, 0);
    rlx_model_close(m);

    m = open_model("mistral-f32-s1"); /* every layer slides */
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(layer_info(m, i).window, 4);
    rlx_model_close(m);

    m = open_model("sliding-f32-s1");
    const uint32_t window[3] = {0, 4, 4}; /* sliding_window 4 from max_window_layers 1 */
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(layer_info(m, i).window, window[i]);
        assert_int_equal(layer_info(m, i).moe, 0);
    }
    rlx_model_close(m);
}

typedef struct listing {
    char names[128][96];
    size_t n;
} listing;

static int collect(void *ctx, const char *name) {
    listing *l = ctx;
    assert_true(l->n < 128);
    snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
    return 0;
}

static size_t count_with(const listing *l, const char *part) {
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        n += strstr(l->names[i], part) != NULL;
    return n;
}

static listing block_weights(const rlx_model *m, uint32_t start, uint32_t end, uint32_t embed, uint32_t logits) {
    rlx_block_spec s = {
        .size = sizeof s, .layer_start = start, .layer_end = end, .embed_input = embed, .produce_logits = logits};
    listing l = {.n = 0};
    assert_int_equal(rlx_model_block_weights(m, &s, collect, &l), RLX_OK);
    assert_int_equal(rlx_model_check_block(m, &s), RLX_OK);
    return l;
}

/* What a pipeline stage loads is what its layers' rows of the table apply to: the router and
 * experts only in sparse layers, biases only where the config has them, the tied head once. */
static void test_block_weights(void **state) {
    (void)state;
    rlx_model *m = open_model("moe-f32-s1");
    listing l = block_weights(m, 0, 1, 1, 0);
    assert_int_equal(l.n, 1 + 8 + 1 + 3 * 8); /* embed; norms, q/k/v/o, q/k norms; router; experts */
    assert_int_equal(count_with(&l, "model.layers.0.mlp.gate.weight"), 1);
    assert_int_equal(count_with(&l, "model.layers.0.mlp.experts.7.down_proj.weight"), 1);
    assert_int_equal(count_with(&l, "model.embed_tokens.weight"), 1);
    l = block_weights(m, 1, 2, 0, 0); /* the dense layer */
    assert_int_equal(l.n, 8 + 3);
    assert_int_equal(count_with(&l, "experts"), 0);
    assert_int_equal(count_with(&l, "model.layers.1.mlp.up_proj.weight"), 1);
    rlx_model_close(m);

    m = open_model("dense-tied-f32-s1");
    l = block_weights(m, 0, 3, 1, 1); /* the whole model: the tied head is the embedding, listed once */
    assert_int_equal(l.n, 1 + 3 * 11 + 1);
    assert_int_equal(count_with(&l, "model.embed_tokens.weight"), 1);
    assert_int_equal(count_with(&l, "lm_head"), 0);
    assert_int_equal(count_with(&l, ".bias"), 0);
    l = block_weights(m, 2, 3, 0, 1); /* a last stage still reads the table for its tied head */
    assert_int_equal(count_with(&l, "model.embed_tokens.weight"), 1);
    rlx_model_close(m);

    m = open_model("qwen2-tied-f32-s1");
    l = block_weights(m, 0, 1, 0, 0);
    assert_int_equal(l.n, 1 + 4 + 3 + 1 + 3); /* norm, q/k/v/o, q/k/v biases, norm, MLP */
    assert_int_equal(count_with(&l, "q_norm") + count_with(&l, "k_norm"), 0);
    assert_int_equal(count_with(&l, "o_proj.bias"), 0);
    rlx_model_close(m);

    m = open_model("llama-untied-bias-f32-s1"); /* attention_bias and mlp_bias */
    l = block_weights(m, 0, 1, 0, 0);
    assert_int_equal(l.n, 2 + 4 + 4 + 3 + 3); /* norms, q/k/v/o and their biases, MLP and its */
    assert_int_equal(count_with(&l, "mlp.down_proj.bias"), 1);
    assert_int_equal(count_with(&l, "q_norm"), 0);
    rlx_model_close(m);

    m = open_model("dense-untied-bias-f32-s1");
    l = block_weights(m, 1, 2, 0, 1);
    assert_int_equal(count_with(&l, ".bias"), 4);
    assert_int_equal(count_with(&l, "lm_head.weight"), 1);
    assert_int_equal(count_with(&l, "model.norm.weight"), 1);
    rlx_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_model_type),
        cmocka_unit_test(test_arch_info),
        cmocka_unit_test(test_block_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
