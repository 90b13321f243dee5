/* The Jinja engine against @huggingface/jinja: jinja_parity CASES.json, the file
 * make_jinja_cases.js writes. Each case is a template, its variables (data: messages, tools,
 * add_generation_prompt and any others, which go in as chat_template_kwargs; trusted: bos_token
 * and eos_token) rendered through rlx_chat_render_ex, and either the reference
 * rendering ("expected": the engine must give it byte for byte), the reference's refusal
 * ("error": the engine must refuse too, with raise_exception's message when the template raised)
 * or an error the engine must give ("engine_error": a substring of its message, which must also
 * name the template line). The markup spans of every rendering are checked for being sorted,
 * apart and inside the text, and every string of the caller's data that the rendering holds
 * verbatim must lie outside them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "read_file.h"
#include "rlx/text.h"

static int in_markup(const rlx_text_span *spans, size_t n, size_t off) {
    for (size_t i = 0; i < n; i++)
        if (off >= spans[i].off && off < spans[i].off + spans[i].len)
            return 1;
    return 0;
}

/* Message contents long enough to be unambiguous that appear in the text must be outside the
 * markup spans (the template's own text), wherever they occur verbatim. */
static int check_content(const char *name, const char *text, const rlx_text_span *spans, size_t n_spans,
                         const cJSON *data) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(data, "messages");
    for (const cJSON *m = msgs ? msgs->child : NULL; m; m = m->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(c) || strlen(c->valuestring) < 6)
            continue;
        const char *at = strstr(text, c->valuestring);
        if (!at)
            continue;
        for (size_t k = 0; c->valuestring[k]; k++)
            if (in_markup(spans, n_spans, (size_t)(at - text) + k)) {
                fprintf(stderr, "FAIL %s: byte %zu of message text \"%s\" is marked as template text\n", name, k,
                        c->valuestring);
                return 1;
            }
    }
    return 0;
}

static int check_spans(const char *name, size_t len, const rlx_text_span *spans, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (spans[i].len == 0 || spans[i].off + spans[i].len > len ||
            (i && spans[i].off <= spans[i - 1].off + spans[i - 1].len)) {
            fprintf(stderr, "FAIL %s: markup span %zu (%zu+%zu) is empty, out of order or adjacent\n", name, i,
                    spans[i].off, spans[i].len);
            return 1;
        }
    return 0;
}

static void show_diff(const char *name, const char *want, const char *got, size_t got_len) {
    size_t i = 0;
    while (want[i] && i < got_len && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "FAIL %s: differs at byte %zu\n  expected: \"%.80s\"\n  rendered: \"%.80s\"\n", name, i,
            want + from, got + from);
}

static int run_case(const cJSON *c) {
    const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
    const char *tmpl = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(c, "data");
    const cJSON *trusted = cJSON_GetObjectItemCaseSensitive(c, "trusted");
    const cJSON *expected = cJSON_GetObjectItemCaseSensitive(c, "expected");
    const cJSON *ref_error = cJSON_GetObjectItemCaseSensitive(c, "error");
    const cJSON *engine_error = cJSON_GetObjectItemCaseSensitive(c, "engine_error");
    char *out = NULL;
    size_t len = 0, n_spans = 0;
    rlx_text_span *spans = NULL;
    cJSON *kwargs = cJSON_Duplicate(data, 1);
    for (const cJSON *e = trusted ? trusted->child : NULL; e; e = e->next)
        cJSON_AddItemToObject(kwargs, e->string, cJSON_Duplicate(e, 1));
    cJSON *messages = cJSON_DetachItemFromObjectCaseSensitive(kwargs, "messages");
    cJSON *tools = cJSON_DetachItemFromObjectCaseSensitive(kwargs, "tools");
    cJSON *add_gen = cJSON_DetachItemFromObjectCaseSensitive(kwargs, "add_generation_prompt");
    char *messages_json = messages ? cJSON_PrintUnformatted(messages) : NULL;
    char *tools_json = tools ? cJSON_PrintUnformatted(tools) : NULL;
    char *kwargs_json = cJSON_PrintUnformatted(kwargs);
    rlx_chat_options o = {.size = sizeof o,
                          .add_generation_prompt = cJSON_IsTrue(add_gen),
                          .messages_json = messages_json ? messages_json : "[]",
                          .tools_json = tools_json,
                          .kwargs_json = kwargs_json,
                          .chat_template = tmpl};
    rlx_status st = rlx_chat_render_ex(NULL, NULL, 0, &o, &out, &spans, &n_spans);
    len = out ? strlen(out) : 0;
    cJSON_Delete(kwargs);
    cJSON_Delete(messages);
    cJSON_Delete(tools);
    cJSON_Delete(add_gen);
    free(messages_json);
    free(tools_json);
    free(kwargs_json);
    const char *msg = st == RLX_OK ? "" : rlx_last_error();
    int bad = 0;
    if (cJSON_IsString(expected)) {
        if (st != RLX_OK) {
            fprintf(stderr, "FAIL %s: %s\n", name, msg);
            bad = 1;
        } else if (len != strlen(expected->valuestring) || memcmp(out, expected->valuestring, len) != 0) {
            show_diff(name, expected->valuestring, out, len);
            bad = 1;
        } else {
            bad = check_spans(name, len, spans, n_spans) || check_content(name, out, spans, n_spans, data);
        }
    } else if (cJSON_IsString(ref_error)) {
        if (st == RLX_OK) {
            fprintf(stderr, "FAIL %s: rendered, but @huggingface/jinja refuses it: %s\n", name, ref_error->valuestring);
            bad = 1;
        } else if (strstr(msg, "raise_exception") && !strstr(msg, ref_error->valuestring)) {
            fprintf(stderr, "FAIL %s: raised \"%s\", @huggingface/jinja \"%s\"\n", name, msg, ref_error->valuestring);
            bad = 1;
        }
    } else if (cJSON_IsString(engine_error)) {
        if (st == RLX_OK || !strstr(msg, engine_error->valuestring) ||
            (!strstr(msg, " line ") && !strstr(engine_error->valuestring, "chat template:"))) {
            fprintf(stderr, "FAIL %s: expected an error with \"%s\", got %s\n", name, engine_error->valuestring,
                    st == RLX_OK ? "a rendering" : msg);
            bad = 1;
        }
    }
    free(out);
    free(spans);
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: jinja_parity CASES.json\n");
        return 2;
    }
    char *text = test_read_file(argv[1], NULL);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!cJSON_IsArray(cases)) {
        fprintf(stderr, "jinja_parity: cannot read %s\n", argv[1]);
        return 2;
    }
    int failed = 0, total = 0;
    for (const cJSON *c = cases->child; c; c = c->next, total++)
        failed += run_case(c);
    cJSON_Delete(cases);
    printf("%d of %d chat template cases pass\n", total - failed, total);
    return failed ? 1 : 0;
}
