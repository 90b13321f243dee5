/* Tool calls and structured output (job.h): what a request's tools, tool_choice,
 * response_format, json_schema and grammar ask becomes one GBNF grammar that constrains the
 * reply (rlx/grammar.h), and a reply in the model family's tool-call format becomes OpenAI's
 * tool_calls, whole or as stream deltas.
 *
 * The format is the chat template's: a template that writes `<tool_call>` and `<function=` is
 * Qwen3.5's and Qwen3-Coder's XML form
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
 * and one that writes `<tool_call>` alone is the Hermes form of Qwen2.5 and Qwen3
 *   <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
 * Any other template gets tools refused (400): its calls would come back as text.
 *
 * tool_choice "auto" leaves the reply free and parses the calls out of it; "required" and a named
 * function constrain it to calls whose arguments match the function's JSON schema, after the
 * model's thinking when its template leaves it thinking; "none" shows the model no tools. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "job.h"
#include "rlx/grammar.h"

/* Tools one request may define: each becomes template text and grammar rules. */
#define SERVE_MAX_TOOLS 128
/* The longest GBNF a request may send, and the longest its schemas and tools may become. */
#define SERVE_MAX_GRAMMAR_BYTES (512u * 1024u)
/* XML calls: a parameter's name, and a string parameter's minLength and maxLength. */
#define SERVE_MAX_XML_KEY 256
#define SERVE_MAX_XML_LENGTH 4096
/* OpenAI's bound on a function's name, which is [a-zA-Z0-9_-]. */
#define SERVE_MAX_TOOL_NAME 64

static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";
#define CALL_OPEN_LEN (sizeof CALL_OPEN - 1)
#define CALL_CLOSE_LEN (sizeof CALL_CLOSE - 1)

serve_call_format serve_call_format_of(const char *tmpl) {
    if (!tmpl || !strstr(tmpl, CALL_OPEN))
        return SERVE_CALLS_NONE;
    return strstr(tmpl, "<function=") ? SERVE_CALLS_XML : SERVE_CALLS_HERMES;
}

// ---- grammar text ----

static void put(serve_buf *b, const char *s) { serve_buf_append(b, s, strlen(s)); }

/* s as a GBNF string literal: quotes, backslashes and control bytes escaped, UTF-8 as it is. */
static void gbnf_literal(serve_buf *b, const char *s, size_t len) {
    put(b, "\"");
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            serve_buf_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            serve_buf_printf(b, "\\x%02X", c);
        else
            serve_buf_append(b, s + i, 1);
    }
    put(b, "\"");
}

/* Rules NAME-0 .. NAME-(n-1): any text in which the ASCII string stop does not occur, then stop
 * (the matching automaton of stop, one rule per state: state i has matched stop's first i
 * bytes; a byte that breaks the match falls back to the longest prefix of stop it ends). */
static void gbnf_until(serve_buf *b, const char *name, const char *stop) {
    const size_t n = strlen(stop);
    size_t fail[64] = {0}; /* fail[i]: the longest proper border of stop[0 .. i] */
    for (size_t i = 1, k = 0; i < n; i++) {
        while (k && stop[i] != stop[k])
            k = fail[k - 1];
        k += stop[i] == stop[k];
        fail[i] = k;
    }
    for (size_t state = 0; state < n; state++) {
        serve_buf_printf(b, "%s-%zu ::= [^", name, state);
        for (size_t i = 0; i < n; i++)
            if (!memchr(stop, stop[i], i)) /* each distinct byte once */
                serve_buf_printf(b, "\\x%02X", (unsigned char)stop[i]);
        serve_buf_printf(b, "] %s-0", name);
        for (size_t i = 0; i < n; i++) {
            if (memchr(stop, stop[i], i))
                continue;
            size_t next = state;
            while (next && stop[next] != stop[i])
                next = fail[next - 1];
            next += stop[next] == stop[i];
            serve_buf_printf(b, " | \"\\x%02X\"", (unsigned char)stop[i]);
            if (next < n)
                serve_buf_printf(b, " %s-%zu", name, next);
        }
        put(b, "\n");
    }
}

/* The rules of a JSON schema (JSON text) under prefix, whose start rule is prefix "root"; -1
 * after setting e (400 naming param, with the converter's reason). */
static int schema_rules(serve_buf *b, const cJSON *schema, const char *prefix, const char *param, serve_error *e) {
    char *text = cJSON_PrintUnformatted(schema);
    if (!text)
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    rlx_json_schema_options o = rlx_json_schema_options_default();
    o.rule_prefix = prefix;
    char *gbnf = NULL;
    size_t len = 0;
    rlx_status rc = rlx_json_schema_to_gbnf(text, strlen(text), &o, &gbnf, &len);
    free(text);
    if (rc != RLX_OK) {
        serve_error_set(e, 400, "invalid_request_error",
                        rc == RLX_E_UNSUPPORTED ? "unsupported_value" : "invalid_value", param, "%s: %s", param,
                        rlx_last_error());
        return -1;
    }
    serve_buf_append(b, gbnf, len);
    put(b, "\n");
    free(gbnf);
    return 0;
}

// ---- the request ----

/* The request's tools, checked: each {"type": "function", "function": {"name", "parameters"?}}. */
static int check_tools(const cJSON *tools, serve_error *e) {
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) > SERVE_MAX_TOOLS)
        return serve_bad(e, "tools", "'%s' must be %s", "an array of at most 128 tool definitions");
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(fn))
            return serve_bad(e, "tools", "'%s' entries must be %s", "{\"type\": \"function\", \"function\": {...}}");
        size_t len = cJSON_IsString(name) ? strlen(name->valuestring) : 0;
        if (len == 0 || len > SERVE_MAX_TOOL_NAME ||
            strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789_-") != len)
            return serve_bad(e, "tools", "'%s' need %s", "function names of 1 to 64 letters, digits, '_' or '-'");
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return serve_bad(e, "tools", "'%s' function parameters must be %s", "a JSON schema object");
        for (const cJSON *u = tools->child; u != t; u = u->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"), "name")
                            ->valuestring,
                        name->valuestring))
                return serve_bad(e, "tools", "'%s' %s", "define a function name twice");
    }
    return 0;
}

static const cJSON *tool_params(const cJSON *tool) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "parameters");
    return cJSON_IsObject(p) ? p : NULL;
}

static const char *tool_name(const cJSON *tool) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name")->valuestring;
}

/* tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name"}} (*named
 * then points at the name). */
static int parse_tool_choice(const cJSON *root, const cJSON *tools, serve_tool_choice *choice, const char **named,
                             serve_error *e) {
    const cJSON *c = serve_member(root, "tool_choice");
    *choice = tools ? SERVE_TOOLS_AUTO : SERVE_TOOLS_NONE;
    *named = NULL;
    if (!c)
        return 0;
    if (!tools)
        return serve_bad(e, "tool_choice", "'%s' %s", "is only allowed when tools are given");
    if (cJSON_IsString(c)) {
        static const char *const names[] = {"none", "auto", "required"};
        for (int k = 0; k < 3; k++)
            if (!strcmp(c->valuestring, names[k])) {
                *choice = (serve_tool_choice)k;
                return 0;
            }
    } else if (cJSON_IsObject(c)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "name");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "function") && cJSON_IsString(name)) {
            for (const cJSON *t = tools->child; t; t = t->next)
                if (!strcmp(tool_name(t), name->valuestring)) {
                    *choice = SERVE_TOOLS_NAMED;
                    *named = tool_name(t);
                    return 0;
                }
            return serve_bad(e, "tool_choice", "'%s' names %s", "a function that is not among the tools");
        }
    }
    return serve_bad(e, "tool_choice", "'%s' must be %s",
                     "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
}

/* The last occurrence of what in s, or NULL. */
static const char *last_of(const char *s, const char *what) {
    const char *last = NULL;
    for (const char *p = s; (p = strstr(p, what)); p++)
        last = p;
    return last;
}

/* Where the rendered prompt leaves a thinking model: 2 inside an open <think> block, 1 free to
 * open one, 0 neither (no thinking in the template, no chat prompt, or the template closed the
 * block itself, as Qwen3's does with enable_thinking false). */
static int think_state(const char *tmpl, const char *prompt) {
    if (!tmpl || !prompt || !strstr(tmpl, "<think>"))
        return 0;
    const char *open = last_of(prompt, "<think>"), *close = last_of(prompt, "</think>");
    if (open && (!close || close < open))
        return 2;
    /* a block the template closed after the last turn's start: the model answers straight away */
    const char *turn = last_of(prompt, "<|im_start|>assistant");
    return close && turn && close > turn ? 0 : 1;
}

/* An XML string parameter's value, rule tK-pI's rest: raw text (the format has no quotes) as its
 * schema allows it: anything up to the closing tag, one of its enum's strings, or minLength to
 * maxLength characters on one line (so the closing tag cannot occur inside). Other string
 * keywords are refused rather than left unchecked. */
static int xml_string_rules(serve_buf *b, const cJSON *p, int k, int i, serve_error *e) {
    static const char *const allowed[] = {"type",      "description", "title",   "enum",
                                          "minLength", "maxLength",   "default", "examples"};
    for (const cJSON *key = p->child; key; key = key->next) {
        size_t a = 0;
        while (a < sizeof allowed / sizeof allowed[0] && strcmp(key->string, allowed[a]))
            a++;
        if (a == sizeof allowed / sizeof allowed[0])
            return serve_bad(e, "tools", "'%s' with this model's XML tool calls take string parameters with %s",
                             "enum, minLength and maxLength only");
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(p, "enum");
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(p, "minLength");
    const cJSON *hi = cJSON_GetObjectItemCaseSensitive(p, "maxLength");
    if (en) {
        if (!cJSON_IsArray(en) || !en->child)
            return serve_bad(e, "tools", "'%s' enum must be %s", "a non-empty array of strings");
        put(b, " (");
        for (const cJSON *v = en->child; v; v = v->next) {
            if (!cJSON_IsString(v) || strchr(v->valuestring, '\n'))
                return serve_bad(e, "tools", "'%s' XML string enum values must be %s", "strings on one line");
            if (v != en->child)
                put(b, " | ");
            gbnf_literal(b, v->valuestring, strlen(v->valuestring));
        }
        put(b, ") \"\\n</parameter>\\n\"\n");
        return 0;
    }
    if (lo || hi) {
        const double min = cJSON_IsNumber(lo) ? lo->valuedouble : 0, max = cJSON_IsNumber(hi) ? hi->valuedouble : -1;
        if ((lo && (!cJSON_IsNumber(lo) || min < 0 || min > SERVE_MAX_XML_LENGTH || min != (int)min)) ||
            (hi && (!cJSON_IsNumber(hi) || max < min || max > SERVE_MAX_XML_LENGTH || max != (int)max)))
            return serve_bad(e, "tools", "'%s' XML string lengths must be %s", "integers from 0 to 4096, min <= max");
        if (hi)
            serve_buf_printf(b, " [^\\n]{%d,%d} \"\\n</parameter>\\n\"\n", (int)min, (int)max);
        else
            serve_buf_printf(b, " [^\\n]{%d,} \"\\n</parameter>\\n\"\n", (int)min);
        return 0;
    }
    char until[32];
    snprintf(until, sizeof until, "t%d-u%d", k, i);
    serve_buf_printf(b, " %s-0 \"\\n\"\n", until);
    gbnf_until(b, until, "\n</parameter>");
    return 0;
}

/* One call of tool t in the template's format, as rule call-K. */
static int call_rules(serve_buf *b, serve_call_format f, const cJSON *t, int k, serve_error *e) {
    const char *name = tool_name(t);
    const cJSON *params = tool_params(t);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t%d-", k);
    if (f == SERVE_CALLS_HERMES) {
        serve_buf_printf(b,
                         "call-%d ::= \"<tool_call>\\n{\\\"name\\\": \\\"%s\\\", \\\"arguments\\\": \" t%d-root "
                         "\"}\\n</tool_call>\"\n",
                         k, name, k);
        if (params)
            return schema_rules(b, params, prefix, "tools", e);
        /* no parameters: the function takes none */
        serve_buf_printf(b, "t%d-root ::= \"{}\"\n", k);
        return 0;
    }
    /* XML: one <parameter=KEY> block per property, in the schema's order, the required ones
     * required; a string's value is raw text up to the closing tag, any other value JSON */
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(params, "required");
    for (const cJSON *key = params ? params->child : NULL; key; key = key->next)
        if (strcmp(key->string, "type") && strcmp(key->string, "properties") && strcmp(key->string, "required") &&
            strcmp(key->string, "additionalProperties") && strcmp(key->string, "title") &&
            strcmp(key->string, "description") && strcmp(key->string, "$schema"))
            return serve_bad(e, "tools", "'%s' with this model's XML tool calls take parameters of %s",
                             "type, properties, required, additionalProperties: false (no '$defs' or combinators)");
    /* the grammar writes the listed properties only: a required name that is not among them would
     * make every call it allows invalid */
    const cJSON *params_type = cJSON_GetObjectItemCaseSensitive(params, "type");
    if (params_type && !(cJSON_IsString(params_type) && !strcmp(params_type->valuestring, "object")))
        return serve_bad(e, "tools", "'%s' with this model's XML tool calls take parameters of %s", "type object");
    for (const cJSON *r = cJSON_IsArray(required) ? required->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r) || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return serve_bad(e, "tools", "'%s' with this model's XML tool calls need %s",
                             "every required parameter among the properties");
    for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next)
        if (strlen(p->string) > SERVE_MAX_XML_KEY || strpbrk(p->string, "<>\n"))
            return serve_bad(e, "tools", "'%s' with this model's XML tool calls need %s",
                             "parameter names of at most 256 bytes without '<', '>' or a newline");
    serve_buf_printf(b, "call-%d ::= \"<tool_call>\\n<function=%s>\\n\"", k, name);
    int i = 0;
    for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next, i++) {
        int is_required = 0;
        for (const cJSON *r = cJSON_IsArray(required) ? required->child : NULL; r; r = r->next)
            is_required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        serve_buf_printf(b, " t%d-p%d%s", k, i, is_required ? "" : "?");
    }
    put(b, " \"</function>\\n</tool_call>\"\n");
    i = 0;
    for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next, i++) {
        char open[SERVE_MAX_XML_KEY + 16];
        snprintf(open, sizeof open, "<parameter=%s>\n", p->string);
        serve_buf_printf(b, "t%d-p%d ::= ", k, i);
        gbnf_literal(b, open, strlen(open));
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "string")) {
            if (xml_string_rules(b, p, k, i, e) < 0)
                return -1;
        } else {
            char value[32];
            snprintf(value, sizeof value, "t%d-v%d-", k, i);
            serve_buf_printf(b, " t%d-v%d-root \"\\n</parameter>\\n\"\n", k, i);
            if (schema_rules(b, p, value, "tools", e) < 0)
                return -1;
        }
    }
    return 0;
}

/* The grammar of a reply that must call tools (all of them, or the named one). */
static int tools_grammar(serve_buf *b, serve_call_format f, const cJSON *tools, const char *named, int parallel,
                         int think, serve_error *e) {
    put(b, "root ::= ");
    if (think == 2)
        put(b, "think-0 ws ");
    else if (think == 1)
        put(b, "(\"<think>\" think-0 ws)? ");
    put(b, parallel ? "call (ws call)*\n" : "call\n");
    put(b, "ws ::= [ \\t\\n]{0,8}\ncall ::= ");
    int k = 0, first = 1;
    for (const cJSON *t = tools->child; t; t = t->next, k++)
        if (!named || !strcmp(tool_name(t), named)) {
            serve_buf_printf(b, "%scall-%d", first ? "" : " | ", k);
            first = 0;
        }
    put(b, "\n");
    if (think)
        gbnf_until(b, "think", "</think>");
    k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++)
        if ((!named || !strcmp(tool_name(t), named)) && call_rules(b, f, t, k, e) < 0)
            return -1;
    return 0;
}

/* response_format: text, json_object (llama-server's optional "schema"), json_schema {schema}. */
static int response_format_schema(const cJSON *root, const cJSON **schema, int *any_object, serve_error *e) {
    const cJSON *rf = serve_member(root, "response_format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    *schema = NULL;
    *any_object = 0;
    if (!rf)
        return 0;
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return serve_bad(e, "response_format", "'%s' must be %s", "an object with a type");
    if (!strcmp(type->valuestring, "text"))
        return 0;
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(inner) ? inner : rf, "schema");
    if (!strcmp(type->valuestring, "json_object")) {
        *schema = cJSON_IsObject(s) ? s : NULL;
        *any_object = !*schema;
        return 0;
    }
    if (!strcmp(type->valuestring, "json_schema")) {
        if (!cJSON_IsObject(s) && !cJSON_IsBool(s))
            return serve_bad(e, "response_format", "'%s' of type json_schema needs %s",
                             "json_schema.schema, a JSON schema");
        *schema = s;
        return 0;
    }
    return serve_bad(e, "response_format", "'%s' type must be %s", "text, json_object or json_schema");
}

int serve_reply_scanned(const serve_job *j) {
    return (j->ep == SERVE_CHAT || j->ep == SERVE_ANTHROPIC || j->ep == SERVE_RESPONSES) &&
           (j->call_format || j->reasoning);
}

/* reasoning_format (llama-server's per-request field): whether a <think> block is split out;
 * think is think_state's. */
static int parse_reasoning(serve_job *j, const cJSON *root, const char *tmpl, int think, serve_error *e) {
    int split = j->server->reasoning_split;
    const char *format = NULL;
    if (serve_get_string(root, "reasoning_format", &format, e) < 0)
        return -1;
    if (format && strcmp(format, "none") && strcmp(format, "auto") && strcmp(format, "deepseek"))
        return serve_bad(e, "reasoning_format", "'%s' must be %s", "none, auto or deepseek");
    if (format)
        split = strcmp(format, "none") != 0;
    j->reasoning = split && tmpl && strstr(tmpl, "<think>");
    j->think_open = think == 2;
    return 0;
}

int serve_constraint_parse(serve_job *j, const cJSON *root, const char *prompt, serve_error *e) {
    serve_server *s = j->server;
    const int chat = j->ep == SERVE_CHAT || j->ep == SERVE_ANTHROPIC || j->ep == SERVE_RESPONSES;
    const cJSON *tools = chat ? serve_member(root, "tools") : NULL;
    if (tools && check_tools(tools, e) < 0)
        return -1;
    const char *named;
    if (parse_tool_choice(root, tools, &j->tool_choice, &named, e) < 0)
        return -1;
    int parallel = 1;
    if (serve_get_bool(root, "parallel_tool_calls", &parallel, e) < 0)
        return -1;
    const char *tmpl = s->chat_template ? s->chat_template : rlx_chat_template_text(s->tok);
    const int think = think_state(tmpl, prompt);
    /* Anthropic's thinking blocks carry signatures rlx cannot make: its replies keep <think> as text */
    if ((j->ep == SERVE_CHAT || j->ep == SERVE_RESPONSES) && parse_reasoning(j, root, tmpl, think, e) < 0)
        return -1;
    if (tools && j->tool_choice != SERVE_TOOLS_NONE) {
        j->call_format = serve_call_format_of(tmpl);
        if (j->call_format == SERVE_CALLS_NONE)
            return serve_error_set(e, 400, "invalid_request_error", "unsupported_value", "tools",
                                   "this model's chat template has no tool-call format rlx reads (Hermes "
                                   "<tool_call>{json}</tool_call> or the XML <tool_call><function=...>): "
                                   "its calls would come back as text"),
                   -1;
        if (!(j->tools = cJSON_Duplicate(tools, 1)))
            return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    }
    /* the constraints: at most one of them */
    const cJSON *gbnf = serve_member(root, "grammar");
    const cJSON *llama_schema = serve_member(root, "json_schema");
    const cJSON *rf_schema;
    int any_object;
    if (response_format_schema(root, &rf_schema, &any_object, e) < 0)
        return -1;
    const int forced = j->tool_choice == SERVE_TOOLS_REQUIRED || j->tool_choice == SERVE_TOOLS_NAMED;
    const char *given[4];
    int n_given = 0;
    if (gbnf)
        given[n_given++] = "grammar";
    if (llama_schema)
        given[n_given++] = "json_schema";
    if (rf_schema || any_object)
        given[n_given++] = "response_format";
    if (forced)
        given[n_given++] = "tool_choice";
    if (n_given > 1) {
        serve_error_set(e, 400, "invalid_request_error", "invalid_value", given[1],
                        "'%s' and '%s' both constrain the reply: give one", given[0], given[1]);
        return -1;
    }
    if (n_given == 0)
        return 0;
    serve_buf b = {0};
    int rc = 0;
    if (gbnf) {
        if (!cJSON_IsString(gbnf) || strlen(gbnf->valuestring) > SERVE_MAX_GRAMMAR_BYTES)
            rc = serve_bad(e, "grammar", "'%s' must be %s", "GBNF text of at most 512 KiB");
        else
            serve_buf_append(&b, gbnf->valuestring, strlen(gbnf->valuestring));
    } else if (llama_schema || rf_schema || any_object) {
        const cJSON *schema = llama_schema ? llama_schema : rf_schema;
        cJSON *object = any_object ? cJSON_CreateObject() : NULL;
        if (any_object && !cJSON_AddStringToObject(object, "type", "object"))
            rc = (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
        if (rc == 0 && !cJSON_IsObject(any_object ? object : schema) && !cJSON_IsBool(schema))
            rc = serve_bad(e, llama_schema ? "json_schema" : "response_format", "'%s' must be %s", "a JSON schema");
        if (rc == 0)
            rc =
                schema_rules(&b, any_object ? object : schema, "", llama_schema ? "json_schema" : "response_format", e);
        cJSON_Delete(object);
    } else {
        rc = tools_grammar(&b, (serve_call_format)j->call_format, tools, named, parallel, think, e);
    }
    if (rc == 0 && (b.failed || b.len > 2 * SERVE_MAX_GRAMMAR_BYTES))
        rc = (serve_error_set(e, 400, "invalid_request_error", "invalid_value", given[0],
                              "the grammar of '%s' is too large (over 1 MiB of GBNF)", given[0]),
              -1);
    if (rc == 0 && rlx_grammar_parse(b.data, b.len, "root", &j->grammar) != RLX_OK) {
        /* the request's own GBNF is its error; one built from schemas or tools is rlx's */
        if (gbnf)
            serve_error_set(e, 400, "invalid_request_error", "invalid_value", "grammar", "%s", rlx_last_error());
        else
            serve_error_set(e, 500, "server_error", NULL, "", "the grammar of '%s' does not compile: %s", given[0],
                            rlx_last_error());
        rc = -1;
    }
    serve_buf_free(&b);
    return rc;
}

// ---- the reply ----

/* The end of s[0 .. len) without trailing whitespace. */
static size_t trim_end(const char *s, size_t len) {
    while (len && isspace((unsigned char)s[len - 1]))
        len--;
    return len;
}

static size_t skip_space(const char *s, size_t i, size_t len) {
    while (i < len && isspace((unsigned char)s[i]))
        i++;
    return i;
}

static const char *find(const char *s, size_t len, const char *what) { return memmem(s, len, what, strlen(what)); }

/* Where a Hermes call's arguments object starts in block[0 .. len) (after `"arguments":`), or
 * len when it does not (yet) open an object there. The name must come first, as the grammar and
 * Qwen's templates write it. */
static size_t hermes_args_start(const char *block, size_t len) {
    const char *key = find(block, len, "\"arguments\"");
    if (!key)
        return len;
    size_t i = skip_space(block, (size_t)(key - block) + 11, len);
    if (i >= len || block[i] != ':')
        return len;
    i = skip_space(block, i + 1, len);
    return i < len && block[i] == '{' ? i : len;
}

/* The name of a Hermes call from the text before its arguments: `{"name": "NAME",` parsed as the
 * object it begins. NULL when that is not what it is (malloc'd). */
static char *hermes_name(const char *block, size_t args_key) {
    size_t end = args_key, start = skip_space(block, 0, end);
    end = trim_end(block, end);
    if (end == 0 || block[end - 1] != ',' || start >= end || block[start] != '{')
        return NULL;
    char *text = malloc(end - start + 1);
    if (!text)
        return NULL;
    memcpy(text, block + start, end - start - 1);
    text[end - start - 1] = '}';
    text[end - start] = 0;
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    char *out = cJSON_IsString(name) && cJSON_GetArraySize(o) == 1 ? strdup(name->valuestring) : NULL;
    cJSON_Delete(o);
    return out;
}

/* A whole Hermes call: *name and *args (JSON text) malloc'd, or -1. The arguments are the
 * model's own text when it wrote them as the last member (so a stream that sent them as they
 * came says the same), else their JSON. */
static int hermes_call(const char *block, size_t len, char **name, char **args) {
    *name = *args = NULL;
    cJSON *o = cJSON_ParseWithLength(block, len);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!cJSON_IsString(n) || !(cJSON_IsObject(a) || cJSON_IsString(a))) {
        cJSON_Delete(o);
        return -1;
    }
    *name = strdup(n->valuestring);
    size_t start = hermes_args_start(block, len);
    const char *brace = NULL;
    for (size_t i = trim_end(block, len); i-- > 0;)
        if (block[i] == '}') {
            brace = block + i;
            break;
        }
    size_t end = brace ? trim_end(block, (size_t)(brace - block)) : 0;
    cJSON *raw = start < end ? cJSON_ParseWithLength(block + start, end - start) : NULL;
    if (raw && cJSON_Compare(raw, a, 1))
        *args = strndup(block + start, end - start);
    else if (cJSON_IsString(a)) /* arguments written as a JSON string: its text */
        *args = strdup(a->valuestring);
    else
        *args = cJSON_PrintUnformatted(a);
    cJSON_Delete(raw);
    cJSON_Delete(o);
    if (!*name || !*args) {
        free(*name);
        free(*args);
        return -1;
    }
    return 0;
}

/* The schema type of parameter key of tool name, or NULL. */
static const char *param_type(const cJSON *tools, const char *name, const char *key) {
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next)
        if (!strcmp(tool_name(t), name)) {
            const cJSON *p =
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool_params(t), "properties"), key);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
            return cJSON_IsString(type) ? type->valuestring : NULL;
        }
    return NULL;
}

/* A whole XML call: <function=NAME> then <parameter=KEY>\nVALUE\n</parameter> blocks. A value is
 * a string when the tool's schema says so (or says nothing and it is no JSON), else JSON. */
static int xml_call(const cJSON *tools, const char *block, size_t len, char **name, char **args) {
    *name = *args = NULL;
    size_t i = skip_space(block, 0, len);
    if (len - i < 10 || memcmp(block + i, "<function=", 10) != 0)
        return -1;
    const char *gt = memchr(block + i, '>', len - i);
    if (!gt)
        return -1;
    cJSON *o = cJSON_CreateObject();
    *name = strndup(block + i + 10, (size_t)(gt - block) - i - 10);
    i = (size_t)(gt - block) + 1;
    for (;;) {
        i = skip_space(block, i, len);
        if (len - i >= 11 && !memcmp(block + i, "</function>", 11))
            break;
        if (len - i < 11 || memcmp(block + i, "<parameter=", 11) != 0)
            goto fail;
        const char *kgt = memchr(block + i, '>', len - i);
        const char *close = kgt ? find(kgt, len - (size_t)(kgt - block), "</parameter>") : NULL;
        if (!close)
            goto fail;
        char *key = strndup(block + i + 11, (size_t)(kgt - block) - i - 11);
        const char *v = kgt + 1;
        size_t vlen = (size_t)(close - v);
        if (vlen && *v == '\n') /* the newlines around a value are the format's */
            v++, vlen--;
        if (vlen && v[vlen - 1] == '\n')
            vlen--;
        const char *type = key && *name ? param_type(tools, *name, key) : NULL;
        cJSON *value = type && !strcmp(type, "string") ? NULL : cJSON_ParseWithLength(v, vlen);
        if (!value) {
            char *text = strndup(v, vlen);
            value = text ? cJSON_CreateString(text) : NULL;
            free(text);
        }
        if (!key || !value || cJSON_GetObjectItemCaseSensitive(o, key) || !cJSON_AddItemToObject(o, key, value)) {
            free(key);
            cJSON_Delete(value);
            goto fail;
        }
        free(key);
        i = (size_t)(close - block) + 12;
    }
    *args = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (*name && *args)
        return 0;
fail:
    cJSON_Delete(o);
    free(*name);
    free(*args);
    *name = *args = NULL;
    return -1;
}

/* The longest suffix of s[0 .. len) that begins tag (held back until it is known). */
static size_t tag_prefix(const char *s, size_t len, const char *tag) {
    for (size_t k = strlen(tag) - 1; k > 0; k--)
        if (k <= len && !memcmp(s + len - k, tag, k))
            return k;
    return 0;
}

/* The reasoning phase: a reply that opens with <think> (or a prompt that opened it) has its
 * block, trimmed, told as reasoning; 0 when the scan must wait for more text. */
static int scan_reasoning(serve_job *j, int final, const serve_call_sink *sink) {
    serve_calls *c = &j->calls;
    const char *text = j->text.data ? j->text.data : "";
    const size_t len = j->text.len;
    if (c->phase == 0) {
        size_t i = skip_space(text, 0, len);
        if (!j->reasoning) {
            c->phase = 2;
        } else if (j->think_open) {
            c->phase = 1;
            c->at = i;
        } else if (len - i >= 7 && !memcmp(text + i, "<think>", 7)) {
            c->phase = 1;
            c->at = skip_space(text, i + 7, len);
        } else if (!final && !memcmp(text + i, "<think>", len - i)) {
            return 0; /* all there is could still open the block */
        } else {
            c->phase = 2;
        }
    }
    if (c->phase == 1) {
        const char *close = find(text + c->at, len - c->at, "</think>");
        size_t upto =
            close ? (size_t)(close - text) : len - (final ? 0 : tag_prefix(text + c->at, len - c->at, "</think>"));
        size_t end = close || !final ? trim_end(text + c->at, upto - c->at) + c->at : upto;
        if (!c->reasoned) /* the whitespace after <think> is the template's */
            c->at = skip_space(text, c->at, end);
        if (end > c->at) {
            sink->reasoning(sink->ctx, text + c->at, end - c->at);
            c->at = end;
            c->reasoned = 1;
        }
        if (!close)
            return 0;
        c->phase = 2;
        c->at = (size_t)(close - text) + 8;
        c->after_call = 1; /* the whitespace after the block is the template's */
    }
    return 1;
}

void serve_calls_scan(serve_job *j, int final, const serve_call_sink *sink) {
    serve_calls *c = &j->calls;
    const char *text = j->text.data ? j->text.data : "";
    const size_t len = j->text.len;
    if (!scan_reasoning(j, final, sink))
        return;
    for (;;) {
        if (!c->in_call) {
            if (c->after_call) /* whitespace after a call is the format's */
                c->at = skip_space(text, c->at, len);
            const char *open = j->call_format ? find(text + c->at, len - c->at, CALL_OPEN) : NULL;
            size_t upto = open
                              ? (size_t)(open - text)
                              : len - (final || !j->call_format ? 0 : tag_prefix(text + c->at, len - c->at, CALL_OPEN));
            /* whitespace before a call is the format's too: held back until text follows it */
            size_t content_end = open || !final ? trim_end(text + c->at, upto - c->at) + c->at : upto;
            if (content_end > c->at) {
                sink->content(sink->ctx, text + c->at, content_end - c->at);
                c->at = content_end;
                c->after_call = 0;
            }
            if (!open)
                return;
            c->in_call = 1;
            c->at = (size_t)(open - text) + CALL_OPEN_LEN;
            c->call_start = c->at;
            c->announced = 0;
            continue;
        }
        const char *block = text + c->call_start;
        const char *close = find(block, len - c->call_start, CALL_CLOSE);
        size_t block_len = close ? (size_t)(close - block) : len - c->call_start;
        if (j->call_format == SERVE_CALLS_HERMES) {
            size_t args = hermes_args_start(block, block_len);
            if (!c->announced && args < block_len) {
                char *name = hermes_name(block, (size_t)(find(block, block_len, "\"arguments\"") - block));
                if (name) {
                    serve_make_id(c->id, sizeof c->id, "call_");
                    sink->call(sink->ctx, c->index, c->id, name, "", 0);
                    free(name);
                    c->announced = 1;
                    c->args_sent = c->call_start + args;
                }
            }
            if (c->announced && !close) {
                /* up to the last '}' so far, which may be the one that closes the call */
                size_t end = c->args_sent;
                for (size_t i = len; i-- > c->args_sent;)
                    if (text[i] == '}') {
                        end = trim_end(text, i);
                        break;
                    }
                if (end > c->args_sent) {
                    sink->call(sink->ctx, c->index, NULL, NULL, text + c->args_sent, end - c->args_sent);
                    c->args_sent = end;
                }
            }
        }
        if (!close && !final)
            return;
        /* the block is whole (or the reply ended without its closing tag) */
        char *name = NULL, *args = NULL;
        int ok = j->call_format == SERVE_CALLS_HERMES ? hermes_call(block, block_len, &name, &args)
                                                      : xml_call(j->tools, block, block_len, &name, &args);
        if (ok == 0 && c->announced) {
            /* what the stream sent is a prefix of the arguments when they are the model's text */
            const char *from = block + hermes_args_start(block, block_len);
            size_t sent = (size_t)(text + c->args_sent - from);
            if (sent <= strlen(args) && !memcmp(args, from, sent))
                sink->call(sink->ctx, c->index, NULL, NULL, args + sent, strlen(args) - sent);
        } else if (ok == 0) {
            serve_make_id(c->id, sizeof c->id, "call_");
            sink->call(sink->ctx, c->index, c->id, name, args, strlen(args));
        } else if (c->announced) {
            /* a call cut short (the reply ran out of tokens): it never was a call */
            sink->call(sink->ctx, c->index, NULL, NULL, NULL, 0);
        } else if (!close && (j->tool_choice == SERVE_TOOLS_REQUIRED || j->tool_choice == SERVE_TOOLS_NAMED)) {
            /* the grammar allowed only calls, and the reply ran out of tokens inside this one */
        } else {
            /* not a call after all: the text it is */
            sink->content(sink->ctx, text + c->call_start - CALL_OPEN_LEN,
                          block_len + CALL_OPEN_LEN + (close ? CALL_CLOSE_LEN : 0));
        }
        free(name);
        free(args);
        if (ok == 0)
            c->index++;
        c->in_call = 0;
        c->after_call = 1;
        c->at = close ? (size_t)(close - text) + CALL_CLOSE_LEN : len;
        if (!close)
            return;
    }
}
