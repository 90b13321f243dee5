/* rlx perplexity: a model's perplexity on a text, by the method of llama.cpp's perplexity tool,
 * so the two figures can be compared directly (a new backend, a quantized model).
 *
 * The method: the whole text is tokenized with the ids the model's files put around a text
 * (Llama 3's and Mistral's BOS; Qwen3's tokenizers add none), cut into floor(n_tokens / N) chunks
 * of N tokens (-c), the tail dropped. When the tokenizer adds a BOS, each chunk's first token is
 * replaced by it, as llama-perplexity does, so every chunk starts as a prompt would. Each chunk
 * runs from an empty KV cache in one forward pass; position j's logits predict token j + 1, and positions
 * N/2 .. N-2 are scored (their predictions have at least N/2 tokens of context), N - N/2 - 1 per
 * chunk. With nll = the mean over all scored positions of -log softmax(logits)[next token]:
 *   PPL = exp(nll), reported with exp(nll) * sqrt((mean(log p^2) - nll^2) / (count - 1)),
 * the standard error of the mean carried through exp to first order.
 *
 * A chunk's unscored first half runs as one forward that keeps no logits, its scored positions
 * in slices whose logits stay within LOGITS_MAX_BYTES: all N rows of logits at once would be
 * N * vocab floats (297 MiB for 512 rows of Qwen3's 151936), more than a quantized model's
 * weights. The predictions are those of the whole chunk at once (a causal model's row j sees
 * positions 0 .. j either way), up to the rounding of matmuls of another width. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char usage[] =
    "usage: rlx perplexity [-m PATH] -f FILE [-c N] [--chunks K] [options]\n\n"
    "Perplexity of the model on the text of FILE ('-' for standard input), as llama.cpp's\n"
    "llama-perplexity computes it: the text's tokens are cut into chunks of N, each evaluated\n"
    "from an empty cache (starting with the BOS token when the model's tokenizer adds one), and\n"
    "the second half of each chunk's predictions is scored. Prints the running perplexity after\n"
    "each chunk, then 'Final estimate: PPL = X +/- Y'.\n\n";

/* The logits one forward may return: 7 rows of Qwen3's vocabulary, a whole chunk of a small
 * one (1024 rows of Brown's 4096). */
#define LOGITS_MAX_BYTES ((size_t)4 << 20)

/* Adds -log p(next token) of logits rows [0, n) predicting ids[1 .. n] to *nll, and its square to *nll2. */
static void score_rows(const float *logits, int64_t vocab, const int32_t *ids, uint32_t n, double *nll, double *nll2) {
    for (uint32_t r = 0; r < n; r++) {
        const float *row = logits + (size_t)r * (size_t)vocab;
        const double log_p = (double)row[ids[r + 1]] - app_log_sum_exp(row, vocab);
        *nll -= log_p;
        *nll2 += log_p * log_p;
    }
}

int cmd_perplexity(int argc, char **argv, app_options *o) {
    const char *file = NULL;
    uint32_t chunk = 512, max_chunks = 0;
    const app_opt own[] = {
        {'f', "file", NULL, "FILE", "the text (UTF-8)", APP_OPT_STRING, &file},
        {'c', "ctx-size", "ctx", "N", "tokens per chunk, the context of each evaluation (default 512; at least 4)",
         APP_OPT_U32, &chunk},
        {0, "chunks", NULL, "K", "score only the first K chunks (default: all)", APP_OPT_U32, &max_chunks, .min = 1},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("perplexity:", own), app_common_group(o),
                                    app_pipeline_group(&o->pipeline)};
    int exit_status;
    if (app_parse_command("perplexity", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    if (!file)
        return app_fail("perplexity: -f FILE is required (see rlx perplexity --help)");
    if (chunk < 4)
        return app_fail("perplexity: a chunk of %u tokens (-c) is too small: it needs at least 4", chunk);
    o->ctx = chunk; /* the cache only ever holds one chunk */
    size_t len;
    char *text = app_read_file("perplexity", file, 1, &len);
    if (!text)
        return 1;
    app_runtime rt;
    if (app_runtime_open(&rt, o, NULL)) {
        free(text);
        return 1;
    }
    rlx_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int status = 0;
    if (app_tokenizer_open(&rt, &tok) != RLX_OK) {
        status = app_fail_rlx("perplexity: cannot load the tokenizer");
        goto done;
    }
    /* special tokens in the text stay text, as llama-perplexity tokenizes it */
    const rlx_encode_options eo = {.size = sizeof eo, .add_special = 1};
    if (rlx_tokenizer_encode_ex(tok, text, len, &eo, &ids, &n_ids, NULL) != RLX_OK) {
        status = app_fail_rlx("perplexity: cannot encode the text");
        goto done;
    }
    /* the text is not parsed for special tokens, so a leading BOS is one the tokenizer added */
    const int32_t bos = rlx_tokenizer_bos_id(tok);
    const int starts_with_bos = bos >= 0 && n_ids > 0 && ids[0] == bos;
    /* nothing is decoded: the vocabulary and merges (11 MiB for Qwen3) need not outlive the encoding */
    rlx_tokenizer_close(tok);
    tok = NULL;
    uint32_t n_chunks = (uint32_t)(n_ids / chunk);
    if (n_chunks == 0) {
        status = app_fail("perplexity: %s has %zu tokens, fewer than one chunk of %u (lower -c)", file, n_ids, chunk);
        goto done;
    }
    if (max_chunks && max_chunks < n_chunks)
        n_chunks = max_chunks;
    const uint32_t first = chunk / 2, scored = chunk - first - 1;
    fprintf(stderr, "rlx: %zu tokens, %u chunk%s of %u, scoring %u positions per chunk\n", n_ids, n_chunks,
            n_chunks == 1 ? "" : "s", chunk, scored);
    double nll = 0, nll2 = 0;
    uint64_t count = 0;
    const size_t row_bytes = (size_t)rt.lm.vocab * sizeof(float);
    const uint32_t slice = row_bytes < LOGITS_MAX_BYTES ? (uint32_t)(LOGITS_MAX_BYTES / row_bytes) : 1;
    for (uint32_t c = 0; c < n_chunks; c++) {
        int32_t *cids = ids + (size_t)c * chunk;
        if (starts_with_bos)
            cids[0] = bos;
        const float *logits;
        if (rt.lm.truncate(rt.lm.self, 0) != RLX_OK || rt.lm.forward(rt.lm.self, cids, first, 0, &logits) != RLX_OK) {
            status = app_fail_rlx("perplexity");
            goto done;
        }
        for (uint32_t r = first; r < first + scored; r += slice) {
            const uint32_t n = first + scored - r < slice ? first + scored - r : slice;
            if (rt.lm.forward(rt.lm.self, cids + r, n, 1, &logits) != RLX_OK) {
                status = app_fail_rlx("perplexity");
                goto done;
            }
            score_rows(logits, rt.lm.vocab, cids + r, n, &nll, &nll2);
        }
        count += scored;
        printf("[%u]%.4f,", c + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    const double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    const double ppl = exp(mean), err = var > 0 && count > 1 ? ppl * sqrt(var / (double)(count - 1)) : 0;
    printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, err);
done:
    free(ids);
    rlx_tokenizer_close(tok);
    free(text);
    app_runtime_close(&rt);
    return status;
}
