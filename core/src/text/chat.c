/* The Qwen3 chat template, implemented in C.
 *
 * Jinja cannot run here, so the standard Qwen3 template (the one shipped in the tokenizer_config.json
 * of the Qwen3 dense and MoE checkpoints) is recognised by its text and its semantics are written
 * out below, statement by statement, with Python's str methods where the template uses them. */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "util/alloc.h"

/* The template verbatim, as tokenizer_config.json holds it. */
static const char qwen3_template[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>') "
    "and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = "
    "message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}";

// ---- recognising a template

/* The template with CR LF turned into LF and surrounding whitespace dropped, in a new string. */
static char *canonical(const char *t) {
    while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r')
        t++;
    size_t n = strlen(t);
    char *c = rlx__malloc(n + 1);
    if (!c)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!(t[i] == '\r' && t[i + 1] == '\n'))
            c[k++] = t[i];
    while (k > 0 && (c[k - 1] == ' ' || c[k - 1] == '\t' || c[k - 1] == '\n' || c[k - 1] == '\r'))
        k--;
    c[k] = '\0';
    return c;
}

rlx_chat_template_kind rlx__chat_template_kind(const char *tmpl) {
    char *c = canonical(tmpl);
    if (!c)
        return RLX_CHAT_TEMPLATE_UNKNOWN;
    rlx_chat_template_kind kind = strcmp(c, qwen3_template) == 0 ? RLX_CHAT_TEMPLATE_QWEN3 : RLX_CHAT_TEMPLATE_UNKNOWN;
    free(c);
    return kind;
}

// ---- output and Python string helpers

typedef struct out_buf {
    char *v;
    size_t n, cap;
    int failed;
    int track;            /* record the markup spans */
    rlx_text_span *spans; /* the template's own text, adjacent pieces joined */
    size_t n_spans, cap_spans;
} out_buf;

static void put_n(out_buf *b, const char *s, size_t n) {
    if (b->failed)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *grown = rlx__realloc(b->v, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->v = grown;
        b->cap = cap;
    }
    memcpy(b->v + b->n, s, n);
    b->n += n;
    b->v[b->n] = '\0';
}

/* Text the template writes itself (markup); put_n alone is message text. */
static void put(out_buf *b, const char *s) {
    size_t at = b->n, n = strlen(s);
    put_n(b, s, n);
    if (!b->track || b->failed || n == 0)
        return;
    if (b->n_spans && b->spans[b->n_spans - 1].off + b->spans[b->n_spans - 1].len == at) {
        b->spans[b->n_spans - 1].len += n;
        return;
    }
    if (b->n_spans == b->cap_spans) {
        size_t cap = b->cap_spans ? 2 * b->cap_spans : 16;
        rlx_text_span *grown = rlx__realloc(b->spans, cap * sizeof *grown);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->spans = grown;
        b->cap_spans = cap;
    }
    b->spans[b->n_spans++] = (rlx_text_span){at, n};
}

/* A borrowed slice of a string. */
typedef struct slice {
    const char *p;
    size_t n;
} slice;

static slice whole(const char *s) { return (slice){s ? s : "", s ? strlen(s) : 0}; }

static const char *find(slice s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; k <= s.n && i <= s.n - k; i++)
        if (memcmp(s.p + i, needle, k) == 0)
            return s.p + i;
    return NULL;
}

static const char *find_last(slice s, const char *needle) {
    size_t k = strlen(needle);
    if (k > s.n)
        return NULL;
    for (size_t i = s.n - k + 1; i-- > 0;)
        if (memcmp(s.p + i, needle, k) == 0)
            return s.p + i;
    return NULL;
}

/* s.split(sep)[0] and s.split(sep)[-1] */
static slice split_first(slice s, const char *sep) {
    const char *at = find(s, sep);
    return at ? (slice){s.p, (size_t)(at - s.p)} : s;
}

static slice split_last(slice s, const char *sep) {
    const char *at = find_last(s, sep);
    if (!at)
        return s;
    at += strlen(sep);
    return (slice){at, s.n - (size_t)(at - s.p)};
}

/* s.lstrip('\n'), s.rstrip('\n') */
static slice lstrip_nl(slice s) {
    while (s.n && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}

static slice rstrip_nl(slice s) {
    while (s.n && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

static int starts_with(slice s, const char *prefix) {
    size_t k = strlen(prefix);
    return s.n >= k && memcmp(s.p, prefix, k) == 0;
}

static int ends_with(slice s, const char *suffix) {
    size_t k = strlen(suffix);
    return s.n >= k && memcmp(s.p + s.n - k, suffix, k) == 0;
}

static int role_is(const rlx_chat_message *m, const char *role) { return m->role && strcmp(m->role, role) == 0; }

// ---- the Qwen3 template

static void render_qwen3(const rlx_chat_message *msgs, size_t n, int add_generation_prompt, int enable_thinking,
                         out_buf *b) {
    /* {%- if tools %} ... is not supported; without tools: */
    if (role_is(&msgs[0], "system")) {
        put(b, "<|im_start|>system\n");
        put(b, msgs[0].content ? msgs[0].content : "");
        put(b, "<|im_end|>\n");
    }
    /* The last user message that is not a wrapped tool response; reasoning is kept only for the
     * assistant turns after it. */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        slice c = whole(msgs[k].content);
        if (role_is(&msgs[k], "user") && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const rlx_chat_message *m = &msgs[i];
        slice content = whole(m->content);
        if (role_is(m, "user") || (role_is(m, "system") && i != 0)) {
            put(b, "<|im_start|>");
            put(b, m->role);
            put(b, "\n");
            put_n(b, content.p, content.n);
            put(b, "<|im_end|>\n");
        } else if (role_is(m, "assistant")) {
            slice reasoning = {"", 0};
            if (m->reasoning_content) {
                reasoning = whole(m->reasoning_content);
            } else if (find(content, "</think>")) {
                slice full = content;
                content = lstrip_nl(split_last(full, "</think>"));
                reasoning = lstrip_nl(split_last(rstrip_nl(split_first(full, "</think>")), "<think>"));
            }
            put(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
                slice r = lstrip_nl(rstrip_nl(reasoning));
                put(b, "<think>\n");
                put_n(b, r.p, r.n);
                put(b, "\n</think>\n\n");
                content = lstrip_nl(content);
            }
            put_n(b, content.p, content.n);
            put(b, "<|im_end|>\n");
        } else if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool"))
                put(b, "<|im_start|>user");
            put(b, "\n<tool_response>\n");
            put_n(b, content.p, content.n);
            put(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&msgs[i + 1], "tool"))
                put(b, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) {
        put(b, "<|im_start|>assistant\n");
        if (!enable_thinking)
            put(b, "<think>\n\n</think>\n\n");
    }
}

rlx_status rlx_chat_render_spans(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n,
                                 int add_generation_prompt, int enable_thinking, char **out, rlx_text_span **markup,
                                 size_t *n_markup) {
    if (out)
        *out = NULL;
    if (markup)
        *markup = NULL;
    if (n_markup)
        *n_markup = 0;
    if (!tok || !out || (!msgs && n) || (!markup) != (!n_markup))
        return rlx_error(RLX_E_INVALID, "rlx_chat_render: NULL argument");
    if (n == 0)
        return rlx_error(RLX_E_INVALID, "rlx_chat_render: no messages");
    if (tok->chat_kind == RLX_CHAT_TEMPLATE_NONE)
        return rlx_error(RLX_E_NOT_FOUND, "the model has no chat template (tokenizer_config.json chat_template or "
                                          "chat_template.jinja)");
    if (tok->chat_kind != RLX_CHAT_TEMPLATE_QWEN3)
        return rlx_error(RLX_E_UNSUPPORTED, "the model's chat template is not the standard Qwen3 template, the only "
                                            "one rlx implements");
    out_buf b = {.track = markup != NULL};
    render_qwen3(msgs, n, add_generation_prompt, enable_thinking, &b);
    if (b.failed || !b.v) {
        free(b.v);
        free(b.spans);
        return rlx_error(RLX_E_NOMEM, "cannot allocate the rendered chat");
    }
    *out = b.v;
    if (markup) {
        *markup = b.spans;
        *n_markup = b.n_spans;
    }
    return RLX_OK;
}

rlx_status rlx_chat_render(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n, int add_generation_prompt,
                           int enable_thinking, char **out) {
    return rlx_chat_render_spans(tok, msgs, n, add_generation_prompt, enable_thinking, out, NULL, NULL);
}
