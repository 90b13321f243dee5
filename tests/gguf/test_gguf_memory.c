/* What a GGUF model keeps resident, on a GGUF file written by rlx quantize from the Brown draft
 * model (RLX_MEMORY_GGUF, made by the gguf_memory_model fixture), and the tokenizer and sampling
 * defaults read from the header the model parsed.
 *
 * The bounds, and why each can fail:
 * - The file's mapping holds no more than the tensor data (plus, per tensor, the alignment
 *   padding before it and one partial page at each end of the data area) after a load, a
 *   tokenizer read from the model's header and a generation: the metadata (token and merge
 *   strings, 5.6 MiB for Qwen3) is read once and its pages released, by the model after its
 *   configuration and by the tokenizer after copying the vocabulary. Keeping either would add
 *   the header's pages (about 40 of them here).
 * - Resident memory grows with the positions a session uses, not with the context it was given:
 *   the same generation in a session of the model's whole context (1024 positions, 4 MiB of F32
 *   KV cache here) and in one of 32 positions may differ by less than 1 MiB, a quarter of that
 *   cache, which a cache allocated touched (calloc, memset) would exceed. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "testutil.h"

#define DRAFT RLX_SOURCE_DIR "/share/models/brown/draft"

static const char *const texts[] = {"The quick brown fox jumps over the lazy dog.", "  it's 3.14, isn't it?\n\nYes",
                                    "<|im_start|>user\nhello<|im_end|>"};

static rlx_runtime *open_runtime(const char *model, uint32_t kv_capacity) {
    rlx_runtime_options o = rlx_runtime_options_default();
    o.model_dir = model;
    o.n_threads = 1;
    o.kv_capacity = kv_capacity;
    rlx_runtime *rt = NULL;
    assert_ok(rlx_runtime_open(&o, &rt));
    return rt;
}

/* Greedy decoding of n tokens after the prompt's ids. */
static void generate(const rlx_lm *lm, const int32_t *ids, size_t n_ids, uint32_t n) {
    const float *logits;
    assert_ok(lm->forward(lm->self, ids, (uint32_t)n_ids, 0, &logits));
    for (uint32_t i = 0; i < n; i++) {
        int32_t next = 0;
        for (int64_t v = 1; v < lm->vocab; v++)
            if (logits[v] > logits[next])
                next = (int32_t)v;
        assert_ok(lm->forward(lm->self, &next, 1, 0, &logits));
    }
}

/* Resident bytes of the mappings of the file at path (its real path, as /proc names it). */
static size_t mapped_rss(const char *path) {
    char real[PATH_MAX];
    assert_non_null(realpath(path, real));
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[PATH_MAX + 256];
    int in_file = 0;
    size_t kib = 0, total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char name[PATH_MAX + 1] = "";
        /* a mapping's line is "lo-hi perms offset dev inode [path]"; its fields' lines start with a
         * name and a colon, which never reads as "hex-hex" */
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %4096[^\n]", &lo, &hi, name) >= 2)
            in_file = strcmp(name, real) == 0;
        else if (in_file && sscanf(line, "Rss: %zu kB", &kib) == 1)
            total += kib * 1024;
    }
    fclose(f);
    return total;
}

/* RssAnon of this process, in bytes. */
static size_t anon_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    size_t kib = 0;
    while (fgets(line, sizeof line, f) && sscanf(line, "RssAnon: %zu kB", &kib) != 1)
        ;
    fclose(f);
    return kib * 1024;
}

static void test_mapping_holds_only_tensor_data(void **state) {
    (void)state;
    rlx_runtime *rt = open_runtime(RLX_MEMORY_GGUF, 64);
    const rlx_model *m = rlx_runtime_model(rt);
    rlx_tokenizer *tok;
    assert_ok(rlx_tokenizer_open_model(m, &tok));
    int32_t *ids;
    size_t n_ids;
    assert_ok(rlx_tokenizer_encode(tok, texts[0], strlen(texts[0]), 1, &ids, &n_ids));
    generate(rlx_runtime_lm(rt), ids, n_ids, 16);
    free(ids);

    const rlx_weights *w = rlx_model_weights(m);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), alignment = 32;
    const size_t bound = rlx_weights_total_bytes(w) + rlx_weights_count(w) * alignment + 2 * page;
    const size_t rss = mapped_rss(RLX_MEMORY_GGUF);
    print_message("mapping: %zu bytes resident, bound %zu (tensor data %zu)\n", rss, bound, rlx_weights_total_bytes(w));
    assert_true(rss > 0);
    assert_true(rss <= bound);
    rlx_tokenizer_close(tok);
    rlx_runtime_close(rt);
}

/* Token ids of every text by both tokenizers. */
static void assert_same_tokenizer(const rlx_tokenizer *a, const rlx_tokenizer *b) {
    assert_int_equal(rlx_tokenizer_vocab_size(a), rlx_tokenizer_vocab_size(b));
    assert_int_equal(rlx_tokenizer_eos_id(a), rlx_tokenizer_eos_id(b));
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        int32_t *x, *y;
        size_t nx, ny;
        assert_ok(rlx_tokenizer_encode(a, texts[t], strlen(texts[t]), 1, &x, &nx));
        assert_ok(rlx_tokenizer_encode(b, texts[t], strlen(texts[t]), 1, &y, &ny));
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, nx * sizeof *x);
        free(x);
        free(y);
    }
}

static void test_tokenizer_and_defaults_of_the_model(void **state) {
    (void)state;
    const char *const models[] = {RLX_MEMORY_GGUF, DRAFT};
    for (size_t i = 0; i < 2; i++) {
        rlx_model *m;
        assert_ok(rlx_model_open(models[i], &m));
        rlx_tokenizer *of_model, *of_path;
        assert_ok(rlx_tokenizer_open_model(m, &of_model));
        assert_ok(rlx_tokenizer_open(models[i], &of_path));
        assert_same_tokenizer(of_model, of_path);
        rlx_generation_defaults a, b;
        assert_ok(rlx_generation_config_of(m, &a));
        assert_ok(rlx_generation_config_load(models[i], &b));
        assert_memory_equal(&a, &b, sizeof a);
        rlx_model_close(m); /* the tokenizer keeps nothing of the model */
        assert_same_tokenizer(of_model, of_path);
        rlx_tokenizer_close(of_model);
        rlx_tokenizer_close(of_path);
    }
    rlx_tokenizer *tok = (rlx_tokenizer *)&tok;
    assert_int_equal(rlx_tokenizer_open_model(NULL, &tok), RLX_E_INVALID);
    assert_null(tok);
    rlx_generation_defaults d;
    assert_int_equal(rlx_generation_config_of(NULL, &d), RLX_E_INVALID);
}

/* Anonymous memory a generation of 24 positions (8 prompt ids, 16 decoded) adds in a fresh runtime of kv_capacity. */
static size_t generation_growth(uint32_t kv_capacity) {
    static const int32_t prompt[8] = {11, 230, 7, 1999, 42, 3000, 5, 77};
    const size_t before = anon_rss();
    rlx_runtime *rt = open_runtime(RLX_MEMORY_GGUF, kv_capacity);
    generate(rlx_runtime_lm(rt), prompt, 8, 16);
    const size_t after = anon_rss(), grown = after > before ? after - before : 0;
    rlx_runtime_close(rt);
    return grown;
}

static void test_resident_memory_follows_positions_not_context(void **state) {
    (void)state;
    rlx_model_config c;
    assert_ok(rlx_model_config_load_model(RLX_MEMORY_GGUF, &c));
    const uint32_t full = (uint32_t)c.max_position_embeddings;
    const size_t full_kv = (size_t)c.num_hidden_layers * 2 * full * (size_t)(c.num_key_value_heads * c.head_dim) * 4;
    (void)generation_growth(32); /* first use: libraries' buffers, thread pools */
    const size_t small = generation_growth(32), large = generation_growth(full);
    print_message("growth: %zu bytes at 32 positions, %zu at %u (whole KV cache %zu)\n", small, large, full, full_kv);
    assert_true(large < small + full_kv / 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapping_holds_only_tensor_data),
        cmocka_unit_test(test_tokenizer_and_defaults_of_the_model),
        cmocka_unit_test(test_resident_memory_follows_positions_not_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
