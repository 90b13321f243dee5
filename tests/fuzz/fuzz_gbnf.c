/* libFuzzer target: GBNF grammars, and a matcher following text through the ones that compile,
 * over a real vocabulary (the tokenizer in RLX_FUZZ_TOKENIZER, loaded once).
 * Input: grammar text, then a NUL byte and the text to follow. The text is fed in chunks whose
 * sizes its own bytes choose; between chunks the mask is computed and checked against
 * allows() for a few ids, a copy is taken and fed the rest, and the matcher is reset once. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/grammar.h"
#include "rlx/text.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static rlx_tokenizer *tok;
static rlx_grammar_vocab *vocab;
static float *logits;
static int32_t n_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("RLX_FUZZ_TOKENIZER");
    if (!dir || rlx_tokenizer_open(dir, &tok) != RLX_OK || rlx_grammar_vocab_create(tok, &vocab) != RLX_OK) {
        fprintf(stderr, "fuzz_gbnf: set RLX_FUZZ_TOKENIZER to a model folder with a tokenizer: %s\n",
                dir ? rlx_last_error() : "not set");
        exit(2);
    }
    n_vocab = rlx_tokenizer_vocab_size(tok);
    logits = malloc(((size_t)n_vocab + 2) * sizeof *logits);
    return logits ? 0 : 2;
}

/* The mask agrees with allows() on a few ids. */
static void check_mask(rlx_grammar_matcher *m, const uint8_t *salt, size_t n_salt) {
    const int32_t ends[1] = {n_vocab};
    memset(logits, 0, ((size_t)n_vocab + 2) * sizeof *logits);
    const int64_t allowed = rlx_grammar_matcher_mask(m, logits, n_vocab + 2, ends, 1);
    if (allowed < 0)
        return; /* out of memory under the fuzzer's limit */
    int64_t count = 0;
    for (int32_t i = 0; i < n_vocab + 2; i++)
        count += !isinf(logits[i]);
    if (count != allowed) {
        fprintf(stderr, "mask returned %lld but left %lld ids\n", (long long)allowed, (long long)count);
        abort();
    }
    for (size_t k = 0; k + 1 < n_salt && k < 16; k += 2) {
        const int32_t id = (int32_t)((salt[k] << 8 | salt[k + 1]) % (uint32_t)(n_vocab + 2));
        if (rlx_grammar_matcher_allows(m, id, ends, 1) != !isinf(logits[id])) {
            fprintf(stderr, "allows(%d) disagrees with the mask\n", id);
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t glen = nul ? (size_t)(nul - data) : size;
    rlx_grammar *g = NULL;
    if (rlx_grammar_parse((const char *)data, glen, NULL, &g) != RLX_OK)
        return 0;
    rlx_grammar_matcher *m = NULL;
    if (rlx_grammar_matcher_create(g, vocab, &m) != RLX_OK) {
        rlx_grammar_destroy(g);
        return 0;
    }
    const uint8_t *text = nul ? nul + 1 : data + size;
    const size_t n = (size_t)(data + size - text);
    check_mask(m, text, n);
    size_t at = 0;
    for (int round = 0; at < n && round < 16; round++) {
        const size_t chunk = 1 + text[at] % 8 < n - at ? 1 + text[at] % 8 : n - at;
        if (rlx_grammar_matcher_accept_bytes(m, (const char *)text + at, chunk) == RLX_OK) {
            if (round % 4 == 1)
                check_mask(m, text + at, chunk);
            if (round == 2) {
                rlx_grammar_matcher *k = NULL;
                if (rlx_grammar_matcher_clone(m, &k) == RLX_OK) {
                    (void)rlx_grammar_matcher_accept_bytes(k, (const char *)text + at, n - at);
                    (void)rlx_grammar_matcher_is_done(k);
                    rlx_grammar_matcher_destroy(k);
                }
            }
        } else if (round == 5) {
            rlx_grammar_matcher_reset(m);
        }
        at += chunk;
    }
    (void)rlx_grammar_matcher_can_end(m);
    rlx_grammar_matcher_destroy(m);
    rlx_grammar_destroy(g);
    return 0;
}
