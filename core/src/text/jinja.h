/* A Jinja engine for chat templates: what Hugging Face chat templates use, rendered as
 * @huggingface/jinja renders them (the preprocessing of apply_chat_template's trim_blocks and
 * lstrip_blocks, its lexer and operator precedence, its printing of values and its tojson).
 *
 * lexer -> parser -> AST -> evaluator. The parser and the evaluator bound their recursion depth,
 * the evaluator bounds the loop iterations, the memory it allocates and the output size, so a
 * hostile template gets an error, never a crash, a hang or unbounded memory. A feature the
 * engine lacks (an unknown filter, test, tag or method, unsupported syntax) is an error naming
 * the template's line and column, never silently wrong output. docs/CHAT_TEMPLATES.md lists
 * what is supported.
 *
 * Every output byte is known to come either from the template (its text, literals, numbers) or
 * from the caller's data (message contents, tool definitions): the render reports the spans of
 * the former, so that special-token text inside messages can be kept as text. */
#ifndef RLX_TEXT_JINJA_H
#define RLX_TEXT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "rlx/status.h"
#include "rlx/text.h"

/* Templates larger than this are refused (the tokenizer loader's limit on chat templates). */
#define RLX_JINJA_MAX_SOURCE (1u << 20)

typedef struct rlx__jinja rlx__jinja;

/* Limits of one render; rlx__jinja_limits_default() gives the ones chat rendering uses. */
typedef struct rlx__jinja_limits {
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes the evaluator may allocate in all (strings, lists, scopes) */
    uint64_t max_steps; /* loop iterations plus macro calls */
    unsigned max_depth; /* nesting of statements, expressions and macro calls */
} rlx__jinja_limits;

rlx__jinja_limits rlx__jinja_limits_default(void);

/* Parses len bytes of template source. A syntax error is RLX_E_FORMAT with a message that names
 * the line and column ("chat template line 3 column 7: ..."); on failure *out is NULL. */
rlx_status rlx__jinja_parse(const char *src, size_t len, rlx__jinja **out);
void rlx__jinja_free(rlx__jinja *t); /* NULL is a no-op */

/* Renders t with the members of the JSON objects data and trusted as its variables (trusted
 * wins on a name both have). Strings from data (messages, tools, kwargs) are the caller's data;
 * strings from trusted (bos_token, eos_token) count as the template's own text. On success *out
 * is a malloc'd NUL-terminated string of *out_len bytes, and *markup (when not NULL) a malloc'd
 * array of *n_markup sorted, non-adjacent spans of the bytes that do not come from data.
 * raise_exception(msg) is RLX_E_INVALID with msg in the message; a limit reached is
 * RLX_E_RANGE; any other error RLX_E_FORMAT naming the line and column. */
rlx_status rlx__jinja_render(const rlx__jinja *t, const cJSON *data, const cJSON *trusted,
                             const rlx__jinja_limits *limits, char **out, size_t *out_len, rlx_text_span **markup,
                             size_t *n_markup);

#endif
