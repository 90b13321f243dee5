/* rlx perplexity: a model's perplexity on a text, by the method of llama.cpp's perplexity tool,
 * so the two figures can be compared directly (a new backend, a quantized model).
 *
 * The method: the whole text is tokenized (no BOS: Qwen3's tokenizers add none), cut into
 * floor(n_tokens / N) chunks of N tokens (-c), the tail dropped. Each chunk runs from an empty
 * KV cache in one forward pass; position j's logits predict token j + 1, and positions
 * N/2 .. N-2 are scored (their predictions have at least N/2 tokens of context), N - N/2 - 1 per
 * chunk. With nll = the mean over all scored positions of -log softmax(logits)[next token]:
 *   PPL = exp(nll), reported with exp(nll) * sqrt((mean(log p^2) - nll^2) / (count - 1)),
 * the standard error of the mean carried through exp to first order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char help[] =
    "usage: rlx perplexity [--model DIR] -f FILE [-c N] [--chunks K] [options]\n\n"
    "Perplexity of the model on the text of FILE ('-' for standard input), as llama.cpp's\n"
    "llama-perplexity computes it: the text's tokens are cut into chunks of N, each evaluated\n"
    "from an empty cache, and the second half of each chunk's predictions is scored. Prints the\n"
    "running perplexity after each chunk, then 'Final estimate: PPL = X +/- Y'.\n\n"
    "  -f, --file FILE   the text (UTF-8)\n"
    "  -c N              tokens per chunk (default 512; at least 4, at most the KV cache)\n"
    "  --chunks K        score only the first K chunks (default: all)\n\noptions:\n";

/* Adds -log p(next token) of logits rows [0, n) predicting ids[1 .. n] to *nll, and its square to *nll2. */
static void score_rows(const float *logits, int64_t vocab, const int32_t *ids, uint32_t n, double *nll,
                       double *nll2) {
    for (uint32_t r = 0; r < n; r++) {
        const float *row = logits + (size_t)r * (size_t)vocab;
        float mx = row[0];
        for (int64_t v = 1; v < vocab; v++)
            mx = row[v] > mx ? row[v] : mx;
        double sum = 0;
        for (int64_t v = 0; v < vocab; v++)
            sum += exp((double)row[v] - mx);
        const double log_p = (double)row[ids[r + 1]] - mx - log(sum);
        *nll -= log_p;
        *nll2 += log_p * log_p;
    }
}

int cmd_perplexity(int argc, char **argv, app_options *o) {
    const char *file = NULL;
    uint32_t chunk = 512, max_chunks = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            printf("%s%s", help, app_common_help);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        const char *v;
        if (strcmp(argv[i], "-f") == 0 || strcmp(argv[i], "--file") == 0) {
            if (!(file = app_value(argc, argv, &i)))
                return 1;
        } else if (strcmp(argv[i], "-c") == 0) {
            if (!(v = app_value(argc, argv, &i)) || app_parse_u32("-c", v, &chunk) < 0)
                return 1;
        } else if (strcmp(argv[i], "--chunks") == 0) {
            if (!(v = app_value(argc, argv, &i)) || app_parse_u32("--chunks", v, &max_chunks) < 0)
                return 1;
        } else {
            return app_fail("perplexity: unknown option '%s' (see rlx perplexity --help)", argv[i]);
        }
    }
    if (!file)
        return app_fail("perplexity: -f FILE is required (see rlx perplexity --help)");
    if (chunk < 4)
        return app_fail("perplexity: -c %u is too small: a chunk needs at least 4 tokens", chunk);
    if (!o->ctx)
        o->ctx = chunk; /* the cache only ever holds one chunk */
    size_t len;
    char *text = app_read_file("perplexity", file, &len);
    if (!text)
        return 1;
    app_runtime rt;
    if (app_runtime_open(&rt, o)) {
        free(text);
        return 1;
    }
    rlx_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int status = 0;
    if (rlx_tokenizer_load(rt.model_dir, &tok) != RLX_OK) {
        status = app_fail_rlx("perplexity: cannot load the tokenizer");
        goto done;
    }
    /* special tokens in the text stay text, as llama-perplexity tokenizes it */
    if (rlx_tokenizer_encode(tok, text, len, 0, &ids, &n_ids) != RLX_OK) {
        status = app_fail_rlx("perplexity: cannot encode the text");
        goto done;
    }
    if (chunk > rt.lm.capacity(rt.lm.self)) {
        status = app_fail("perplexity: -c %u exceeds the KV cache of %u positions (raise --ctx)", chunk,
                          rt.lm.capacity(rt.lm.self));
        goto done;
    }
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
    for (uint32_t c = 0; c < n_chunks; c++) {
        const int32_t *cids = ids + (size_t)c * chunk;
        const float *logits;
        if (rt.lm.truncate(rt.lm.self, 0) != RLX_OK || rt.lm.forward(rt.lm.self, cids, chunk, 1, &logits) != RLX_OK) {
            status = app_fail_rlx("perplexity");
            goto done;
        }
        score_rows(logits + (size_t)first * (size_t)rt.lm.vocab, rt.lm.vocab, cids + first, scored, &nll, &nll2);
        count += scored;
        printf("[%u]%.4f,", c + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    const double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    const double ppl = exp(mean), err = var > 0 && count > 1 ? ppl * sqrt(var / (double)(count - 1)) : 0;
    printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, err);
done:
    free(ids);
    rlx_tokenizer_destroy(tok);
    free(text);
    app_runtime_close(&rt);
    return status;
}
