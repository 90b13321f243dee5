/* rlx_model_config_*: config.json and generation_config.json of real Qwen3 checkpoints, the
 * Hugging Face defaults and derived per-layer flags, and every kind of broken field; the
 * sampling keys of generation_config.json (rlx_generation_config_load) with Hugging Face's
 * GenerationConfig defaults. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "rlx/model.h"
#include "model_fixture.h"

/* Qwen/Qwen3-0.6B config.json as published. */
static const char QWEN3_0_6B[] =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":1024,"
    "\"initializer_range\":0.02,\"intermediate_size\":3072,\"max_position_embeddings\":40960,"
    "\"max_window_layers\":28,\"model_type\":\"qwen3\",\"num_attention_heads\":16,\"num_hidden_layers\":28,"
    "\"num_key_value_heads\":8,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,"
    "\"sliding_window\":null,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.51.0\",\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";

/* Qwen/Qwen3-30B-A3B config.json as published. */
static const char QWEN3_30B_A3B[] =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"decoder_sparse_step\":1,\"eos_token_id\":151645,\"head_dim\":128,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":6144,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":48,\"mlp_only_layers\":[],\"model_type\":\"qwen3_moe\","
    "\"moe_intermediate_size\":768,\"norm_topk_prob\":true,\"num_attention_heads\":32,\"num_experts\":128,"
    "\"num_experts_per_tok\":8,\"num_hidden_layers\":48,\"num_key_value_heads\":4,\"output_router_logits\":false,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,"
    "\"sliding_window\":null,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.51.0\",\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";

/* meta-llama/Llama-3.2-1B-Instruct config.json as published: tied head, head_dim stated, RoPE
 * scaled as Llama 3.1 does. */
static const char LLAMA_3_2_1B[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"head_dim\":64,\"hidden_act\":\"silu\","
    "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":8192,\"max_position_embeddings\":131072,"
    "\"mlp_bias\":false,\"model_type\":\"llama\",\"num_attention_heads\":32,\"num_hidden_layers\":16,"
    "\"num_key_value_heads\":8,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,"
    "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
    "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.45.0.dev0\",\"use_cache\":true,\"vocab_size\":128256}";

/* mistralai/Mistral-7B-v0.1 config.json as published: no head_dim, a 4096-position window. */
static const char MISTRAL_7B[] =
    "{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,\"max_position_embeddings\":32768,"
    "\"model_type\":\"mistral\",\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"sliding_window\":4096,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.34.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}";

/* A Qwen3.5 multimodal checkpoint's config.json in the layout Qwen/Qwen3.5-0.8B uses: the text
 * model's fields under text_config (rope_parameters, layer_types), tie_word_embeddings at the top. */
static const char QWEN3_5_0_8B[] =
    "{\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],\"image_token_id\":248056,\"model_type\":\"qwen3_5\","
    "\"text_config\":{\"attention_bias\":false,\"attn_output_gate\":true,\"eos_token_id\":248044,"
    "\"full_attention_interval\":4,\"head_dim\":256,\"hidden_act\":\"silu\",\"hidden_size\":1024,"
    "\"intermediate_size\":3584,\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\","
    "\"full_attention\",\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"],"
    "\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":16,\"linear_value_head_dim\":128,\"max_position_embeddings\":262144,"
    "\"model_type\":\"qwen3_5_text\",\"mtp_num_hidden_layers\":1,\"num_attention_heads\":8,"
    "\"num_hidden_layers\":8,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
    "\"rope_parameters\":{\"mrope_interleaved\":true,\"mrope_section\":[11,11,10],\"partial_rotary_factor\":0.25,"
    "\"rope_theta\":10000000,\"rope_type\":\"default\"},\"tie_word_embeddings\":true,\"vocab_size\":248320},"
    "\"tie_word_embeddings\":true,\"vision_config\":{\"depth\":12,\"hidden_size\":768}}";

/* The same text model as Qwen3_5ForCausalLM writes it: flat, model_type qwen3_5_text. */
static const char QWEN3_5_FLAT[] =
    "{\"model_type\":\"qwen3_5_text\",\"eos_token_id\":248044,\"head_dim\":256,\"hidden_size\":1024,"
    "\"intermediate_size\":3584,\"linear_num_key_heads\":16,\"linear_num_value_heads\":32,"
    "\"num_attention_heads\":8,\"num_hidden_layers\":8,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
    "\"rope_theta\":10000000,\"vocab_size\":248320,\"tie_word_embeddings\":false}";

/* A Qwen3.5-MoE multimodal checkpoint's config.json in the layout Qwen/Qwen3.5-35B-A3B uses (8 of
 * its 40 layers): every MLP a mixture of experts, no intermediate_size, no norm_topk_prob. */
static const char QWEN3_5_35B_A3B[] =
    "{\"architectures\":[\"Qwen3_5MoeForConditionalGeneration\"],\"image_token_id\":248056,"
    "\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"attention_bias\":false,\"attn_output_gate\":true,"
    "\"eos_token_id\":248044,\"full_attention_interval\":4,\"head_dim\":256,\"hidden_act\":\"silu\","
    "\"hidden_size\":2048,\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":32,\"linear_value_head_dim\":128,\"max_position_embeddings\":262144,"
    "\"model_type\":\"qwen3_5_moe_text\",\"moe_intermediate_size\":512,\"mtp_num_hidden_layers\":1,"
    "\"num_attention_heads\":16,\"num_experts\":256,\"num_experts_per_tok\":8,\"num_hidden_layers\":8,"
    "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"rope_parameters\":{\"mrope_interleaved\":true,"
    "\"mrope_section\":[11,11,10],\"partial_rotary_factor\":0.25,\"rope_theta\":10000000,"
    "\"rope_type\":\"default\"},\"shared_expert_intermediate_size\":512,\"vocab_size\":248320},"
    "\"tie_word_embeddings\":false,\"vision_config\":{\"depth\":27,\"hidden_size\":1152}}";

/* The same text model as Qwen3_5MoeForCausalLM writes it: flat, model_type qwen3_5_moe_text. */
static const char QWEN3_5_MOE_FLAT[] =
    "{\"model_type\":\"qwen3_5_moe_text\",\"eos_token_id\":248044,\"head_dim\":256,\"hidden_size\":2048,"
    "\"linear_num_key_heads\":16,\"linear_num_value_heads\":32,\"moe_intermediate_size\":512,"
    "\"num_attention_heads\":16,\"num_experts\":256,\"num_experts_per_tok\":8,\"num_hidden_layers\":4,"
    "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"rope_theta\":10000000,"
    "\"shared_expert_intermediate_size\":512,\"vocab_size\":248320,\"tie_word_embeddings\":false}";

/* Qwen/Qwen3-Next-80B-A3B-Instruct config.json as published, but 8 of its 48 layers. */
static const char QWEN3_NEXT_80B_A3B[] =
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"decoder_sparse_step\":1,\"eos_token_id\":151645,\"full_attention_interval\":4,"
    "\"head_dim\":256,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
    "\"intermediate_size\":5120,\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,"
    "\"linear_num_key_heads\":16,\"linear_num_value_heads\":32,\"linear_value_head_dim\":128,"
    "\"max_position_embeddings\":262144,\"mlp_only_layers\":[],\"model_type\":\"qwen3_next\","
    "\"moe_intermediate_size\":512,\"norm_topk_prob\":true,\"num_attention_heads\":16,\"num_experts\":512,"
    "\"num_experts_per_tok\":10,\"num_hidden_layers\":8,\"num_key_value_heads\":2,"
    "\"output_router_logits\":false,\"partial_rotary_factor\":0.25,\"rms_norm_eps\":1e-06,"
    "\"rope_scaling\":null,\"rope_theta\":10000000,\"router_aux_loss_coef\":0.001,"
    "\"shared_expert_intermediate_size\":512,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.57.0.dev0\",\"use_cache\":true,\"use_sliding_window\":false,"
    "\"vocab_size\":151936}";

/* The required fields only. */
static const char MINIMAL[] =
    "{\"model_type\":\"qwen3\",\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"rms_norm_eps\":1e-05}";

static int setup(void **state) {
    *state = fixture_dir_create();
    return 0;
}

static int teardown(void **state) {
    fixture_dir_remove(*state);
    free(*state);
    return 0;
}

/* Writes base with field set to the JSON text value (removed when value is NULL) as dir/name and
 * returns the path (valid until the next fixture_path call). */
static const char *write_variant(const char *dir, const char *name, const char *base, const char *field,
                                 const char *value) {
    cJSON *root = cJSON_Parse(base);
    assert_non_null(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, field);
    if (value) {
        cJSON *v = cJSON_Parse(value);
        assert_non_null(v);
        cJSON_AddItemToObject(root, field, v);
    }
    char *text = cJSON_PrintUnformatted(root);
    assert_non_null(text);
    fixture_write_text(dir, name, text);
    cJSON_free(text);
    cJSON_Delete(root);
    return fixture_path(dir, name);
}

static void load_ok(const char *dir, const char *text, rlx_model_config *c) {
    fixture_write_text(dir, "config.json", text);
    assert_int_equal(rlx_model_config_load(fixture_path(dir, "config.json"), c), RLX_OK);
}

/* base with field set to value must fail with RLX_E_FORMAT naming the file, and containing needle;
 * the output struct must be left alone. */
static void variant_fails(const char *dir, const char *base, const char *field, const char *value, const char *needle) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", write_variant(dir, "config.json", base, field, value));
    rlx_model_config c;
    memset(&c, 0xAB, sizeof c);
    rlx_status st = rlx_model_config_load(path, &c);
    if (st != RLX_E_FORMAT)
        print_error("%s = %s: status %d (%s)\n", field, value ? value : "(removed)", st, rlx_last_error());
    assert_int_equal(st, RLX_E_FORMAT);
    fixture_assert_error_has(path, needle);
    assert_int_equal(c.vocab_size, (int64_t)0xABABABABABABABABull);
}

// ---- real configs

static void test_qwen3_0_6b(void **state) {
    rlx_model_config c;
    load_ok(*state, QWEN3_0_6B, &c);
    assert_string_equal(c.model_type, "qwen3");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 1024);
    assert_int_equal(c.intermediate_size, 3072);
    assert_int_equal(c.num_hidden_layers, 28);
    assert_int_equal(c.num_attention_heads, 16);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 128); /* not hidden / heads = 64: Qwen3 sets it explicitly */
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.use_sliding_window, 0);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.max_window_layers, 28);
    for (int i = 0; i < 28; i++) {
        assert_int_equal(c.layer_sliding[i], 0);
        assert_int_equal(rlx_model_config_layer_is_moe(&c, i), 0);
    }
    assert_int_equal(c.num_experts, 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 151645);
    assert_int_equal(c.bos_id, 151643);
}

static void test_llama_3_2_1b(void **state) {
    rlx_model_config c;
    load_ok(*state, LLAMA_3_2_1B, &c);
    assert_string_equal(c.model_type, "llama");
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.num_hidden_layers, 16);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_true(c.rope_theta == 5e5);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.attention_bias, 0);
    for (int i = 0; i < 16; i++)
        assert_int_equal(c.layer_sliding[i], 0);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_ids[2], 128009);
    assert_int_equal(c.bos_id, 128000);

    /* Without head_dim and the other optional fields: LlamaConfig's defaults. */
    cJSON *root = cJSON_Parse(LLAMA_3_2_1B);
    for (const char *const *f = (const char *const[]){"head_dim", "max_position_embeddings", "num_key_value_heads",
                                                      "rope_theta", "tie_word_embeddings", NULL};
         *f; f++)
        cJSON_DeleteItemFromObjectCaseSensitive(root, *f);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    load_ok(*state, text, &c);
    cJSON_free(text);
    assert_int_equal(c.head_dim, 64); /* 2048 / 32 */
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(c.num_key_value_heads, 32);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.tie_word_embeddings, 0);
}

static void test_mistral_7b(void **state) {
    rlx_model_config c;
    load_ok(*state, MISTRAL_7B, &c);
    assert_string_equal(c.model_type, "mistral");
    assert_int_equal(c.head_dim, 128); /* 4096 / 32 */
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.use_sliding_window, 1);
    assert_int_equal(c.sliding_window, 4096);
    for (int i = 0; i < 32; i++) /* every layer slides, unlike Qwen's max_window_layers rule */
        assert_int_equal(c.layer_sliding[i], 1);

    /* sliding_window null: full attention; absent: MistralConfig's 4096. */
    assert_int_equal(
        rlx_model_config_load(write_variant(*state, "variant.json", MISTRAL_7B, "sliding_window", "null"), &c), RLX_OK);
    assert_int_equal(c.use_sliding_window, 0);
    for (int i = 0; i < 32; i++)
        assert_int_equal(c.layer_sliding[i], 0);
    assert_int_equal(
        rlx_model_config_load(write_variant(*state, "variant.json", MISTRAL_7B, "sliding_window", NULL), &c), RLX_OK);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.layer_sliding[31], 1);
}

static void test_qwen3_5(void **state) {
    rlx_model_config c;
    load_ok(*state, QWEN3_5_0_8B, &c);
    assert_string_equal(c.model_type, "qwen3_5");
    assert_int_equal(c.vocab_size, 248320);
    assert_int_equal(c.hidden_size, 1024);
    assert_int_equal(c.num_hidden_layers, 8);
    assert_int_equal(c.num_attention_heads, 8);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.head_dim, 256);
    assert_true(c.rope_theta == 1e7);           /* from rope_parameters */
    assert_int_equal(c.tie_word_embeddings, 1); /* from the top level */
    assert_int_equal(c.n_eos, 1);               /* from text_config */
    assert_int_equal(c.eos_ids[0], 248044);

    load_ok(*state, QWEN3_5_FLAT, &c);
    assert_string_equal(c.model_type, "qwen3_5_text");
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_true(c.rope_theta == 1e7); /* the older top-level key */

    variant_fails(*state, QWEN3_5_FLAT, "layer_types", "[\"linear_attention\",\"full_attention\"]",
                  "'layer_types' has 2 entries");
    variant_fails(*state, QWEN3_5_FLAT, "layer_types",
                  "[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"sliding_attention\","
                  "\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"]",
                  "layer_types[3]");
    variant_fails(*state, QWEN3_5_FLAT, "linear_num_key_heads", "12", "does not divide linear_num_value_heads");
    variant_fails(*state, QWEN3_5_FLAT, "partial_rotary_factor", "0.003", "even number");
    variant_fails(*state, QWEN3_5_FLAT, "partial_rotary_factor", "1.5", "a number in (0, 1]");
    variant_fails(*state, QWEN3_5_FLAT, "rope_parameters", "{\"rope_type\":\"yarn\",\"factor\":4}",
                  "rope_parameters.rope_type");
    variant_fails(*state, QWEN3_5_FLAT, "attention_bias", "true", "without biases");
    variant_fails(*state, QWEN3_5_FLAT, "hidden_act", "\"gelu\"", "hidden_act");
    variant_fails(*state, QWEN3_5_FLAT, "text_config", "[]", "'text_config' must be an object");
    /* the LM head must not be ambiguous */
    variant_fails(*state, QWEN3_5_0_8B, "tie_word_embeddings", "false", "true in text_config");
}

static void test_qwen3_5_moe(void **state) {
    rlx_model_config c;
    load_ok(*state, QWEN3_5_35B_A3B, &c);
    assert_string_equal(c.model_type, "qwen3_5_moe");
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.num_hidden_layers, 8);
    assert_int_equal(c.num_experts, 256);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 512);
    assert_int_equal(c.norm_topk_prob, 1); /* Qwen3_5MoeTopKRouter always renormalises */
    assert_int_equal(c.intermediate_size, 0);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_true(c.rope_theta == 1e7);
    for (int i = 0; i < 8; i++)
        assert_int_equal(rlx_model_config_layer_is_moe(&c, i), 1);

    load_ok(*state, QWEN3_5_MOE_FLAT, &c);
    assert_string_equal(c.model_type, "qwen3_5_moe_text");
    assert_int_equal(c.num_experts, 256);
    assert_int_equal(rlx_model_config_layer_is_moe(&c, 3), 1);

    /* the expert counts and sizes are required rather than taken from the 35B's defaults */
    variant_fails(*state, QWEN3_5_MOE_FLAT, "num_experts", NULL, "missing required field 'num_experts'");
    variant_fails(*state, QWEN3_5_MOE_FLAT, "shared_expert_intermediate_size", NULL,
                  "missing required field 'shared_expert_intermediate_size'");
    variant_fails(*state, QWEN3_5_MOE_FLAT, "num_experts_per_tok", "257", "exceeds num_experts");
    variant_fails(*state, QWEN3_5_MOE_FLAT, "num_experts", "100000", "num_experts");
    variant_fails(*state, QWEN3_5_MOE_FLAT, "moe_intermediate_size", "\"512\"", "moe_intermediate_size");
}

static void test_qwen3_next(void **state) {
    rlx_model_config c;
    load_ok(*state, QWEN3_NEXT_80B_A3B, &c);
    assert_string_equal(c.model_type, "qwen3_next");
    assert_int_equal(c.num_experts, 512);
    assert_int_equal(c.num_experts_per_tok, 10);
    assert_int_equal(c.moe_intermediate_size, 512);
    assert_int_equal(c.intermediate_size, 5120);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.head_dim, 256);
    assert_true(c.rope_theta == 1e7);
    for (int i = 0; i < 8; i++)
        assert_int_equal(rlx_model_config_layer_is_moe(&c, i), 1);

    /* norm_topk_prob defaults to true (Qwen3NextConfig), unlike Qwen3-MoE's false */
    assert_int_equal(
        rlx_model_config_load(write_variant(*state, "variant.json", QWEN3_NEXT_80B_A3B, "norm_topk_prob", NULL), &c),
        RLX_OK);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(
        rlx_model_config_load(write_variant(*state, "variant.json", QWEN3_NEXT_80B_A3B, "norm_topk_prob", "false"), &c),
        RLX_OK);
    assert_int_equal(c.norm_topk_prob, 0);
    /* mlp_only_layers leaves layers 0 and 5 dense */
    assert_int_equal(rlx_model_config_load(
                         write_variant(*state, "variant.json", QWEN3_NEXT_80B_A3B, "mlp_only_layers", "[5, 0]"), &c),
                     RLX_OK);
    for (int i = 0; i < 8; i++)
        assert_int_equal(rlx_model_config_layer_is_moe(&c, i), i != 0 && i != 5);

    variant_fails(*state, QWEN3_NEXT_80B_A3B, "moe_intermediate_size", NULL,
                  "missing required field 'moe_intermediate_size'");
    variant_fails(*state, QWEN3_NEXT_80B_A3B, "mlp_only_layers", "[8]", "mlp_only_layers[0]");
    variant_fails(*state, QWEN3_NEXT_80B_A3B, "decoder_sparse_step", "0", "decoder_sparse_step");
    variant_fails(*state, QWEN3_NEXT_80B_A3B, "linear_num_value_heads", "24", "does not divide");
}

static void test_qwen3_next_dense_layer_needs_intermediate_size(void **state) {
    /* A dense layer (mlp_only_layers) reads intermediate_size, which the file must then give. */
    cJSON *root = cJSON_Parse(QWEN3_NEXT_80B_A3B);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "intermediate_size");
    cJSON_ReplaceItemInObjectCaseSensitive(root, "mlp_only_layers", cJSON_Parse("[2]"));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    fixture_write_text(*state, "config.json", text);
    cJSON_free(text);
    rlx_model_config c;
    const char *path = fixture_path(*state, "config.json");
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_FORMAT);
    fixture_assert_error_has(path, "'intermediate_size', needed by the dense MLP of layer 2");
}

static void test_qwen3_30b_a3b(void **state) {
    rlx_model_config c;
    load_ok(*state, QWEN3_30B_A3B, &c);
    assert_string_equal(c.model_type, "qwen3_moe");
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.intermediate_size, 6144);
    assert_int_equal(c.num_hidden_layers, 48);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.num_experts, 128);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.tie_word_embeddings, 0);
    for (int i = 0; i < 48; i++) {
        assert_int_equal(c.layer_dense_mlp[i], 0);
        assert_int_equal(rlx_model_config_layer_is_moe(&c, i), 1);
    }
    assert_int_equal(rlx_model_config_layer_is_moe(&c, 48), 0);
    assert_int_equal(rlx_model_config_layer_is_moe(&c, -1), 0);
    assert_int_equal(rlx_model_config_layer_is_moe(NULL, 0), 0);
}

static void test_moe_layer_pattern(void **state) {
    /* Sparse when (i + 1) % 2 == 0 and i is not in mlp_only_layers: layers 1 and 5 of 0..5. */
    cJSON *root = cJSON_Parse(QWEN3_30B_A3B);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "decoder_sparse_step", cJSON_CreateNumber(2));
    cJSON_ReplaceItemInObjectCaseSensitive(root, "num_hidden_layers", cJSON_CreateNumber(6));
    cJSON_ReplaceItemInObjectCaseSensitive(root, "mlp_only_layers", cJSON_Parse("[3, 0]"));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    rlx_model_config c;
    load_ok(*state, text, &c);
    cJSON_free(text);
    const int moe[6] = {0, 1, 0, 0, 0, 1}, dense[6] = {1, 0, 0, 1, 0, 0};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(rlx_model_config_layer_is_moe(&c, i), moe[i]);
        assert_int_equal(c.layer_dense_mlp[i], dense[i]);
    }
}

static void test_moe_intermediate_size_needed_only_by_dense_layers(void **state) {
    const char *dir = *state;
    rlx_model_config c;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", write_variant(dir, "config.json", QWEN3_30B_A3B, "intermediate_size", NULL));
    assert_int_equal(rlx_model_config_load(path, &c), RLX_OK);
    assert_int_equal(c.intermediate_size, 0);

    cJSON *root = cJSON_Parse(QWEN3_30B_A3B);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "intermediate_size");
    cJSON_ReplaceItemInObjectCaseSensitive(root, "mlp_only_layers", cJSON_Parse("[7]"));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    fixture_write_text(dir, "config.json", text);
    cJSON_free(text);
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_FORMAT);
    fixture_assert_error_has(path, "'intermediate_size'", "layer 7");
}

static void test_dense_model_ignores_moe_fields(void **state) {
    rlx_model_config c;
    write_variant(*state, "config.json", QWEN3_0_6B, "num_experts", "64");
    assert_int_equal(rlx_model_config_load(fixture_path(*state, "config.json"), &c), RLX_OK);
    assert_int_equal(c.num_experts, 0);
    assert_int_equal(rlx_model_config_layer_is_moe(&c, 0), 0);
}

// ---- defaults and derived flags

static void test_defaults(void **state) {
    rlx_model_config c;
    load_ok(*state, MINIMAL, &c);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 128); /* Qwen3Config's default, not hidden / heads */
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.use_sliding_window, 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.max_window_layers, 4);
    assert_int_equal(c.num_experts, 0);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(c.bos_id, -1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(c.layer_sliding[i], 0);
}

static void test_sliding_window_layers(void **state) {
    const char *dir = *state;
    rlx_model_config c;
    cJSON *root = cJSON_Parse(MINIMAL);
    cJSON_AddTrueToObject(root, "use_sliding_window");
    cJSON_AddNumberToObject(root, "max_window_layers", 2);
    char *text = cJSON_PrintUnformatted(root);
    load_ok(dir, text, &c);
    cJSON_free(text);
    const uint8_t derived[4] = {0, 0, 1, 1};
    assert_memory_equal(c.layer_sliding, derived, 4);
    assert_int_equal(c.sliding_window, 4096);

    /* A null window disables sliding even with use_sliding_window set, as in transformers. */
    cJSON_AddNullToObject(root, "sliding_window");
    text = cJSON_PrintUnformatted(root);
    load_ok(dir, text, &c);
    cJSON_free(text);
    assert_int_equal(c.sliding_window, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(c.layer_sliding[i], 0);

    /* An explicit layer_types list wins over the derivation. */
    cJSON_ReplaceItemInObjectCaseSensitive(root, "sliding_window", cJSON_CreateNumber(1024));
    cJSON_AddItemToObject(root, "layer_types",
                          cJSON_Parse("[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                                      "\"full_attention\"]"));
    text = cJSON_PrintUnformatted(root);
    load_ok(dir, text, &c);
    cJSON_free(text);
    const uint8_t listed[4] = {1, 0, 1, 0};
    assert_memory_equal(c.layer_sliding, listed, 4);
    assert_int_equal(c.sliding_window, 1024);

    /* Sliding layers need a window. */
    cJSON_ReplaceItemInObjectCaseSensitive(root, "sliding_window", cJSON_CreateNull());
    text = cJSON_PrintUnformatted(root);
    fixture_write_text(dir, "config.json", text);
    cJSON_free(text);
    assert_int_equal(rlx_model_config_load(fixture_path(dir, "config.json"), &c), RLX_E_FORMAT);
    fixture_assert_error_has("config.json", "'sliding_window'", "layer 0");
    cJSON_Delete(root);
}

static void test_eos_lists_and_generation_config(void **state) {
    const char *dir = *state;
    rlx_model_config c;
    write_variant(dir, "config.json", QWEN3_0_6B, "eos_token_id", "[151645, 151643, 151645]");
    assert_int_equal(rlx_model_config_load(fixture_path(dir, "config.json"), &c), RLX_OK);
    assert_int_equal(c.n_eos, 2);

    /* Qwen3-0.6B's generation_config.json: merged, duplicates dropped. */
    fixture_write_text(dir, "generation_config.json",
                       "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643, 151644],"
                       " \"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95,"
                       " \"transformers_version\": \"4.51.0\"}");
    char gen[PATH_MAX];
    snprintf(gen, sizeof gen, "%s", fixture_path(dir, "generation_config.json"));
    assert_int_equal(rlx_model_config_load_generation(gen, &c), RLX_OK);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_ids[0], 151645);
    assert_int_equal(c.eos_ids[1], 151643);
    assert_int_equal(c.eos_ids[2], 151644);

    fixture_write_text(dir, "generation_config.json", "{\"eos_token_id\": 7}");
    assert_int_equal(rlx_model_config_load_generation(gen, &c), RLX_OK);
    assert_int_equal(c.n_eos, 4);
    assert_int_equal(c.eos_ids[3], 7);

    /* A missing file is fine; broken ones fail and leave cfg alone. */
    assert_int_equal(rlx_model_config_load_generation(fixture_path(dir, "absent.json"), &c), RLX_OK);
    assert_int_equal(c.n_eos, 4);
    const char *broken[][2] = {
        {"{\"eos_token_id\": [1, 2,", "malformed JSON"},
        {"{\"eos_token_id\": \"</s>\"}", "field 'eos_token_id' must be an integer or a list of integers"},
        {"{\"eos_token_id\": [1, 2.5]}", "field 'eos_token_id[1]'"},
        {"{\"eos_token_id\": [-1]}", "field 'eos_token_id[0]'"},
        {"{\"eos_token_id\": [1, 2, 3, 4, 5]}", "more than 8 distinct"},
        {"[1]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        fixture_write_text(dir, "generation_config.json", broken[i][0]);
        assert_int_equal(rlx_model_config_load_generation(gen, &c), RLX_E_FORMAT);
        fixture_assert_error_has(gen, broken[i][1]);
        assert_int_equal(c.n_eos, 4);
        assert_int_equal(c.eos_ids[3], 7);
    }
    assert_int_equal(rlx_model_config_load_generation(NULL, &c), RLX_E_INVALID);
    assert_int_equal(rlx_model_config_load_generation(gen, NULL), RLX_E_INVALID);
}

// ---- generation_config.json sampling keys

static void test_generation_defaults_of_qwen3(void **state) {
    const char *dir = *state;
    /* Qwen/Qwen3-0.6B's generation_config.json as published */
    fixture_write_text(dir, "generation_config.json",
                       "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643],"
                       " \"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95,"
                       " \"transformers_version\": \"4.51.0\"}");
    rlx_generation_defaults g;
    assert_int_equal(rlx_generation_config_load(dir, &g), RLX_OK);
    assert_true(g.has_do_sample && g.do_sample);
    assert_true(g.has_temperature && g.temperature == 0.6f);
    assert_true(g.has_top_k && g.top_k == 20);
    assert_true(g.has_top_p && g.top_p == 0.95f);
    assert_false(g.has_min_p || g.has_repetition_penalty);
    assert_true(g.min_p == 0 && g.repetition_penalty == 1);
    fixture_write_text(dir, "generation_config.json",
                       "{\"do_sample\": false, \"min_p\": 0.05, \"repetition_penalty\": 1.1, \"temperature\": 0}");
    assert_int_equal(rlx_generation_config_load(dir, &g), RLX_OK);
    assert_true(g.has_do_sample && !g.do_sample && g.has_temperature && g.temperature == 0);
    assert_true(g.has_min_p && g.min_p == 0.05f && g.has_repetition_penalty && g.repetition_penalty == 1.1f);
}

/* What transformers' GenerationConfig() holds for keys a file leaves out: do_sample False,
 * temperature 1.0, top_k 50, top_p 1.0, min_p None, repetition_penalty 1.0. */
static void assert_hf_defaults(const rlx_generation_defaults *g) {
    assert_false(g->do_sample);
    assert_true(g->temperature == 1 && g->top_k == 50 && g->top_p == 1 && g->min_p == 0 && g->repetition_penalty == 1);
}

static void test_generation_defaults_when_absent(void **state) {
    const char *dir = *state;
    rlx_generation_defaults g;
    memset(&g, 0xAB, sizeof g);
    assert_int_equal(rlx_generation_config_load(dir, &g), RLX_OK); /* no file */
    assert_hf_defaults(&g);
    assert_false(g.has_do_sample || g.has_temperature || g.has_top_k || g.has_top_p || g.has_min_p ||
                 g.has_repetition_penalty);
    /* null is "not given", as None in transformers */
    fixture_write_text(dir, "generation_config.json",
                       "{\"do_sample\": null, \"temperature\": null, \"top_k\": null, \"top_p\": null,"
                       " \"min_p\": null, \"repetition_penalty\": null}");
    assert_int_equal(rlx_generation_config_load(dir, &g), RLX_OK);
    assert_hf_defaults(&g);
    assert_false(g.has_do_sample || g.has_temperature || g.has_top_k || g.has_top_p || g.has_min_p ||
                 g.has_repetition_penalty);
    fixture_write_text(dir, "generation_config.json", "{\"do_sample\": true}");
    assert_int_equal(rlx_generation_config_load(dir, &g), RLX_OK);
    assert_true(g.do_sample && g.temperature == 1 && g.top_k == 50 && g.top_p == 1);
}

static void test_generation_defaults_refuse_bad_values(void **state) {
    const char *dir = *state;
    const char *broken[][2] = {
        {"{\"do_sample\": \"yes\"}", "field 'do_sample' must be true or false"},
        {"{\"temperature\": -0.5}", "field 'temperature' is -0.5, must be a finite number >= 0"},
        {"{\"temperature\": \"0.6\"}", "field 'temperature' must be a number"},
        {"{\"temperature\": 1e999}", "field 'temperature'"},
        {"{\"top_k\": 2.5}", "field 'top_k' must be an integer"},
        {"{\"top_k\": -1}", "field 'top_k' is -1"},
        {"{\"top_p\": 0}", "field 'top_p' is 0, must be in (0, 1]"},
        {"{\"top_p\": 1.5}", "field 'top_p' is 1.5"},
        {"{\"min_p\": 2}", "field 'min_p' is 2, must be in [0, 1]"},
        {"{\"repetition_penalty\": 0}", "field 'repetition_penalty' is 0, must be a finite number > 0"},
        {"{\"temperature\": 0.6,", "malformed JSON"},
        {"[0.6]", "not a JSON object"},
    };
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fixture_path(dir, "generation_config.json"));
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        fixture_write_text(dir, "generation_config.json", broken[i][0]);
        rlx_generation_defaults g;
        memset(&g, 0xAB, sizeof g);
        rlx_status st = rlx_generation_config_load(dir, &g);
        if (st != RLX_E_FORMAT)
            print_error("%s: status %d (%s)\n", broken[i][0], st, rlx_last_error());
        assert_int_equal(st, RLX_E_FORMAT);
        fixture_assert_error_has(path, broken[i][1]);
        assert_int_equal(g.top_k, (int32_t)0xABABABAB); /* left alone */
    }
    rlx_generation_defaults g;
    assert_int_equal(rlx_generation_config_load(NULL, &g), RLX_E_INVALID);
    assert_int_equal(rlx_generation_config_load(dir, NULL), RLX_E_INVALID);
}

// ---- broken configs

static void test_missing_file_and_malformed_json(void **state) {
    const char *dir = *state;
    rlx_model_config c;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fixture_path(dir, "config.json"));
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_IO);
    fixture_assert_error_has(path, "No such file");

    fixture_write_text(dir, "config.json", "{\n  \"vocab_size\": 1000,\n  \"hidden_size\": ,\n}");
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_FORMAT);
    fixture_assert_error_has(path, "malformed JSON at line 3, column 18 (byte 41)");

    fixture_write_text(dir, "config.json", "{\"vocab_size\": 1000} trailing");
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_FORMAT);
    fixture_assert_error_has(path, "malformed JSON");

    fixture_write_text(dir, "config.json", "");
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_FORMAT);
    fixture_assert_error_has(path, "malformed JSON");

    fixture_write_text(dir, "config.json", "[1, 2]");
    assert_int_equal(rlx_model_config_load(path, &c), RLX_E_FORMAT);
    fixture_assert_error_has(path, "not a JSON object");

    assert_int_equal(rlx_model_config_load(dir, &c), RLX_E_IO); /* a directory */
    fixture_assert_error_has(dir, "not a regular file");
    assert_int_equal(rlx_model_config_load(NULL, &c), RLX_E_INVALID);
    assert_int_equal(rlx_model_config_load(path, NULL), RLX_E_INVALID);
}

static void test_missing_required_fields(void **state) {
    const char *required[] = {"model_type",        "vocab_size",   "hidden_size",        "intermediate_size",
                              "num_hidden_layers", "rms_norm_eps", "num_attention_heads"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "missing required field '%s'", required[i]);
        variant_fails(*state, QWEN3_0_6B, required[i], NULL, needle);
    }
    const char *moe_required[] = {"num_experts_per_tok", "moe_intermediate_size"};
    for (size_t i = 0; i < 2; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "missing required field '%s'", moe_required[i]);
        variant_fails(*state, QWEN3_30B_A3B, moe_required[i], NULL, needle);
    }
}

static void test_wrong_types_and_values(void **state) {
    const struct {
        const char *field, *value, *needle;
    } cases[] = {
        {"model_type", "\"gemma\"", "field 'model_type' is \"gemma\""},
        {"model_type", "5", "field 'model_type' must be a string, got 5"},
        {"vocab_size", "\"151936\"", "field 'vocab_size' must be an integer, got the string \"151936\""},
        {"vocab_size", "-5", "field 'vocab_size' is -5, must be in [1, 2147483647]"},
        {"vocab_size", "1e300", "field 'vocab_size' must be an integer, got 1e+300"},
        {"hidden_size", "true", "field 'hidden_size' must be an integer, got true"},
        {"hidden_size", "null", "field 'hidden_size' must be an integer, got null"},
        {"num_hidden_layers", "3.5", "field 'num_hidden_layers' must be an integer, got 3.5"},
        {"num_hidden_layers", "0", "field 'num_hidden_layers' is 0"},
        {"num_hidden_layers", "1025", "field 'num_hidden_layers' is 1025, must be in [1, 1024]"},
        {"num_attention_heads", "[16]", "field 'num_attention_heads' must be an integer, got an array"},
        {"num_key_value_heads", "3", "field 'num_key_value_heads' (3) does not divide num_attention_heads (16)"},
        {"num_key_value_heads", "0", "field 'num_key_value_heads' is 0"},
        {"head_dim", "127", "field 'head_dim' is 127; rotary embeddings need an even size"},
        {"head_dim", "{}", "field 'head_dim' must be an integer, got an object"},
        {"rms_norm_eps", "\"1e-6\"", "field 'rms_norm_eps' must be a number"},
        {"rms_norm_eps", "0", "field 'rms_norm_eps' must be a positive number, got 0"},
        {"rope_theta", "-1", "field 'rope_theta' must be a positive number, got -1"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
         "field 'rope_scaling' (type yarn) is not supported; rlx runs plain RoPE and type llama3"},
        {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}",
         "field 'rope_scaling' (type linear) is not supported"},
        {"rope_scaling", "{\"factor\": 2.0}", "field 'rope_scaling' (type unknown) is not supported"},
        {"rope_scaling", "8", "field 'rope_scaling' must be an object or null, got 8"},
        {"max_position_embeddings", "40960.5", "field 'max_position_embeddings' must be an integer"},
        {"tie_word_embeddings", "1", "field 'tie_word_embeddings' must be true or false, got 1"},
        {"attention_bias", "\"false\"", "field 'attention_bias' must be true or false"},
        {"use_sliding_window", "0", "field 'use_sliding_window' must be true or false"},
        {"sliding_window", "-4096", "field 'sliding_window' is -4096"},
        {"max_window_layers", "-1", "field 'max_window_layers' is -1"},
        {"layer_types", "\"full_attention\"", "field 'layer_types' must be a list of strings"},
        {"layer_types", "[\"full_attention\"]", "field 'layer_types' has 1 entries, num_hidden_layers is 28"},
        {"eos_token_id", "\"<|im_end|>\"", "field 'eos_token_id' must be an integer or a list of integers"},
        {"eos_token_id", "[151645, 1.5]", "field 'eos_token_id[1]'"},
        {"eos_token_id", "[1,2,3,4,5,6,7,8,9]", "field 'eos_token_id' makes more than 8 distinct"},
        {"bos_token_id", "-3", "field 'bos_token_id' is -3"},
        {"bos_token_id", "[1]", "field 'bos_token_id' must be an integer, got an array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        variant_fails(*state, QWEN3_0_6B, cases[i].field, cases[i].value, cases[i].needle);

    const struct {
        const char *field, *value, *needle;
    } moe_cases[] = {
        {"num_experts", "-1", "field 'num_experts' is -1"},
        {"num_experts_per_tok", "129", "field 'num_experts_per_tok' (129) exceeds num_experts (128)"},
        {"num_experts_per_tok", "0", "field 'num_experts_per_tok' is 0"},
        {"moe_intermediate_size", "768.0001", "field 'moe_intermediate_size' must be an integer"},
        {"decoder_sparse_step", "0", "field 'decoder_sparse_step' is 0"},
        {"norm_topk_prob", "\"yes\"", "field 'norm_topk_prob' must be true or false"},
        {"mlp_only_layers", "7", "field 'mlp_only_layers' must be a list of layer indices"},
        {"mlp_only_layers", "[0, 48]", "field 'mlp_only_layers[1]' must be a layer index in [0, 48), got 48"},
        {"mlp_only_layers", "[\"0\"]", "field 'mlp_only_layers[0]'"},
    };
    for (size_t i = 0; i < sizeof moe_cases / sizeof moe_cases[0]; i++)
        variant_fails(*state, QWEN3_30B_A3B, moe_cases[i].field, moe_cases[i].value, moe_cases[i].needle);

    /* Without head_dim, a Qwen3-MoE hidden_size must split evenly into heads. */
    cJSON *root = cJSON_Parse(QWEN3_30B_A3B);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "num_attention_heads", cJSON_CreateNumber(3));
    cJSON_DeleteItemFromObjectCaseSensitive(root, "head_dim");
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    variant_fails(*state, text, "num_key_value_heads", NULL, "field 'head_dim' is missing and hidden_size (2048)");
    cJSON_free(text);

    /* Llama: rope_scaling llama3 needs all four parameters, its bands in order */
    const struct {
        const char *field, *value, *needle;
    } llama_cases[] = {
        {"rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}",
         "field 'rope_scaling' (type dynamic) is not supported"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 8192}",
         "rope_scaling: missing required field 'factor'"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 32, \"low_freq_factor\": 1, "
         "\"high_freq_factor\": 4}",
         "rope_scaling: missing required field 'original_max_position_embeddings'"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": -2, \"low_freq_factor\": 1, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "rope_scaling: field 'factor' must be a positive number, got -2"},
        {"rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 32, \"low_freq_factor\": 4, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "high_freq_factor (4) must be greater than low_freq_factor (4)"},
        {"hidden_act", "\"gelu\"", "field 'hidden_act' must be \"silu\""},
        {"mlp_bias", "1", "field 'mlp_bias' must be true or false, got 1"},
        {"attention_bias", "\"no\"", "field 'attention_bias' must be true or false"},
    };
    for (size_t i = 0; i < sizeof llama_cases / sizeof llama_cases[0]; i++)
        variant_fails(*state, LLAMA_3_2_1B, llama_cases[i].field, llama_cases[i].value, llama_cases[i].needle);
    variant_fails(*state, MISTRAL_7B, "sliding_window", "0", "field 'sliding_window' is 0");
    variant_fails(*state, MISTRAL_7B, "sliding_window", "\"4096\"", "field 'sliding_window' must be an integer");
    variant_fails(*state, MISTRAL_7B, "hidden_act", "\"relu\"", "field 'hidden_act' must be \"silu\"");

    variant_fails(*state, MINIMAL, "layer_types",
                  "[\"full_attention\",\"global\",\"full_attention\",\"full_attention\"]",
                  "field 'layer_types[1]' must be \"full_attention\" or \"sliding_attention\", "
                  "got the string \"global\"");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_qwen3_0_6b, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3_30b_a3b, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama_3_2_1b, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mistral_7b, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3_5, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3_5_moe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3_next, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3_next_dense_layer_needs_intermediate_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_moe_layer_pattern, setup, teardown),
        cmocka_unit_test_setup_teardown(test_moe_intermediate_size_needed_only_by_dense_layers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dense_model_ignores_moe_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sliding_window_layers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eos_lists_and_generation_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_generation_defaults_of_qwen3, setup, teardown),
        cmocka_unit_test_setup_teardown(test_generation_defaults_when_absent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_generation_defaults_refuse_bad_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_file_and_malformed_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_required_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_types_and_values, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
