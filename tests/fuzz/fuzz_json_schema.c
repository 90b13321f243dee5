/* libFuzzer target: JSON schemas into GBNF (core/src/gen/json_schema.c). Input: a schema, its
 * first byte choosing a rule prefix (or none). A refusal must be RLX_E_INVALID or
 * RLX_E_UNSUPPORTED with a message; a grammar the converter returns must be NUL-terminated at its
 * length, carry the prefix on every rule, and compile with rlx_grammar_parse (a converter output
 * that does not compile is a converter bug). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const prefixes[] = {NULL, "", "t1-", "Tool-2"};
    const char *prefix = size ? prefixes[data[0] & 3] : NULL;
    rlx_json_schema_options o = rlx_json_schema_options_default();
    o.rule_prefix = prefix;
    char *gbnf = NULL;
    size_t len = 0;
    int st = rlx_json_schema_to_gbnf((const char *)data, size, &o, &gbnf, &len);
    if (st != RLX_OK) {
        if ((st != RLX_E_INVALID && st != RLX_E_UNSUPPORTED) || !rlx_last_error()[0] || gbnf || len) {
            fprintf(stderr, "a refusal with status %d: %s\n", st, rlx_last_error());
            abort();
        }
        return 0;
    }
    if (!gbnf || strlen(gbnf) != len)
        abort();
    size_t plen = prefix ? strlen(prefix) : 0;
    for (const char *line = gbnf; *line; line = strchr(line, '\n') + 1)
        if (!strchr(line, '\n') || strncmp(line, prefix ? prefix : "", plen) != 0) {
            fprintf(stderr, "a rule without the prefix: %.80s\n", line);
            abort();
        }
    char root[80];
    snprintf(root, sizeof root, "%sroot", prefix ? prefix : "");
    rlx_grammar *g = NULL;
    if (rlx_grammar_parse(gbnf, len, root, &g) != RLX_OK) {
        fprintf(stderr, "the converter's grammar does not compile: %s\n%s\n", rlx_last_error(), gbnf);
        abort();
    }
    rlx_grammar_destroy(g);
    free(gbnf);
    return 0;
}
