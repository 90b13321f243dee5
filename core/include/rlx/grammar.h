/* Constrained decoding: a grammar that says which texts a sequence may become, and a matcher
 * that follows one sequence through it token by token and says which tokens may come next.
 *
 * Grammars are written in llama.cpp's GBNF (docs/grammars.md): rules `name ::= alternatives`,
 * string literals, character classes, rule references, groups, `* + ?` and `{m}`, `{m,}`,
 * `{m,n}` repetitions, `.` for any character, comments. A JSON schema becomes GBNF with
 * rlx_json_schema_to_gbnf. A grammar is compiled once and shared read-only by any number of
 * matchers, on any number of threads.
 *
 * The matcher works on Unicode code points: a token whose bytes end inside a UTF-8 sequence is
 * allowed when some character the grammar allows there starts with those bytes, and the next
 * token must complete it. Tokens are seen through an rlx_grammar_vocab: each token's bytes as
 * decoding mid-text gives them; special added tokens (control tokens such as <|im_end|>) match
 * nothing, so the only way a grammar lets a sequence end is through the end ids the caller
 * names, allowed exactly when the text so far is a complete sentence of the grammar. */
#ifndef RLX_GRAMMAR_H
#define RLX_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/status.h"
#include "rlx/text.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlx_grammar rlx_grammar;
typedef struct rlx_grammar_vocab rlx_grammar_vocab;
typedef struct rlx_grammar_matcher rlx_grammar_matcher;

/* Compiles GBNF text of len bytes whose start rule is `root` (NULL = "root"). A syntax error,
 * an undefined or left-recursive rule, or a grammar past the engine's bounds is RLX_E_INVALID
 * with a message naming the line and column (or the rule). */
RLX_API rlx_status rlx_grammar_parse(const char *gbnf, size_t len, const char *root, rlx_grammar **out);
RLX_API void rlx_grammar_destroy(rlx_grammar *g); /* NULL is a no-op */

/* Options of rlx_json_schema_to_gbnf; start from rlx_json_schema_options_default(). */
typedef struct rlx_json_schema_options {
    uint32_t size;
    /* prepended to every rule name the schema produces (the start rule is prefix + "root"), so
     * several schemas can live in one grammar; NULL or "" = none. Letters, digits and '-'. */
    const char *rule_prefix;
} rlx_json_schema_options;

static inline rlx_json_schema_options rlx_json_schema_options_default(void) {
    rlx_json_schema_options o = {0};
    o.size = sizeof o;
    return o;
}

/* Turns a JSON schema (JSON text of len bytes) into GBNF whose start rule is prefix + "root",
 * accepting exactly the JSON texts the schema validates (docs/grammars.md lists the keywords;
 * whitespace between tokens is bounded). A schema that is not JSON or not a schema is
 * RLX_E_INVALID; a keyword or value the converter does not support is RLX_E_UNSUPPORTED naming
 * it, never a grammar that quietly accepts more or less. On success *gbnf is a NUL-terminated
 * string of *gbnf_len bytes that the caller releases with rlx_free. */
RLX_API rlx_status rlx_json_schema_to_gbnf(const char *schema, size_t len, const rlx_json_schema_options *opts,
                                           char **gbnf, size_t *gbnf_len);

/* The vocabulary of tok as matchers see it (each token's bytes, in a prefix tree), built once per
 * tokenizer and shared read-only; tok is borrowed for the vocab's lifetime. */
RLX_API rlx_status rlx_grammar_vocab_create(const rlx_tokenizer *tok, rlx_grammar_vocab **out);
RLX_API void rlx_grammar_vocab_destroy(rlx_grammar_vocab *v); /* NULL is a no-op */

/* A matcher at the start of g over v (both borrowed for the matcher's lifetime). */
RLX_API rlx_status rlx_grammar_matcher_create(const rlx_grammar *g, const rlx_grammar_vocab *v,
                                              rlx_grammar_matcher **out);
RLX_API void rlx_grammar_matcher_destroy(rlx_grammar_matcher *m); /* NULL is a no-op */

/* Whether token may come next: 1 or 0. An end id (one of n_end) is allowed when the text so far
 * is complete; any other id when its bytes continue the text within the grammar. */
RLX_API int rlx_grammar_matcher_allows(const rlx_grammar_matcher *m, int32_t token, const int32_t *end_ids,
                                       size_t n_end);
/* Sets logits[i] to -INFINITY for every token i < n_vocab that may not come next (the rule of
 * rlx_grammar_matcher_allows). Returns the number of tokens left allowed; 0 means the grammar
 * cannot go on from here with this vocabulary (RLX_E_INVALID in rlx_last_error), and a negative
 * status that memory ran out (the logits are then not to be used). */
RLX_API int64_t rlx_grammar_matcher_mask(rlx_grammar_matcher *m, float *logits, int64_t n_vocab, const int32_t *end_ids,
                                         size_t n_end);
/* Moves past token (not an end id). RLX_E_INVALID, the matcher unchanged, when the grammar does
 * not allow it. */
RLX_API rlx_status rlx_grammar_matcher_accept(rlx_grammar_matcher *m, int32_t token);
/* Moves past len bytes of text (a forced prefix, or a test's string). RLX_E_INVALID, the matcher
 * unchanged, when the grammar does not allow them. */
RLX_API rlx_status rlx_grammar_matcher_accept_bytes(rlx_grammar_matcher *m, const char *text, size_t len);
/* 1 when the text so far is a complete sentence of the grammar (an end id is allowed). */
RLX_API int rlx_grammar_matcher_can_end(const rlx_grammar_matcher *m);
/* 1 when the text is complete and no byte can extend it (only an end id is allowed). */
RLX_API int rlx_grammar_matcher_is_done(const rlx_grammar_matcher *m);
/* A matcher at the same place as m (a checkpoint to come back to, or a trial of what follows). */
RLX_API rlx_status rlx_grammar_matcher_clone(const rlx_grammar_matcher *m, rlx_grammar_matcher **out);
/* Back to the start of the grammar. */
RLX_API void rlx_grammar_matcher_reset(rlx_grammar_matcher *m);

#ifdef __cplusplus
}
#endif

#endif
