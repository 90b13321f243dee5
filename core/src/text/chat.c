/* Chat rendering: the model's own chat template through the Jinja engine (jinja.h), with the
 * variables Hugging Face's apply_chat_template gives it. Message text is the caller's data, so
 * the rendering's markup spans (the template's own text) never cover it. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/jinja.h"
#include "text_internal.h"

rlx_chat_template_kind rlx__chat_template_kind(const char *tmpl) {
    rlx__jinja *t = NULL;
    if (rlx__jinja_parse(tmpl, strlen(tmpl), &t) != RLX_OK) {
        rlx_error_clear();
        return RLX_CHAT_TEMPLATE_UNKNOWN;
    }
    rlx__jinja_free(t);
    return RLX_CHAT_TEMPLATE_JINJA;
}

/* Adds a string that msgs keeps alive for the call (no copy: a message may be megabytes). */
static int add_ref(cJSON *obj, const char *name, const char *text) {
    cJSON *item = cJSON_CreateStringReference(text);
    if (!item || !cJSON_AddItemToObject(obj, name, item)) {
        cJSON_Delete(item);
        return 0;
    }
    return 1;
}

/* The messages as the template sees them: role, content and reasoning_content when present. */
static cJSON *messages_of(const rlx_chat_message *msgs, size_t n) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m) {
            cJSON_Delete(arr);
            return NULL;
        }
        cJSON_AddItemToArray(arr, m); /* cannot fail with both not NULL; arr owns m from here */
        if (!add_ref(m, "role", msgs[i].role ? msgs[i].role : "") ||
            !add_ref(m, "content", msgs[i].content ? msgs[i].content : "") ||
            (msgs[i].reasoning_content && !add_ref(m, "reasoning_content", msgs[i].reasoning_content))) {
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

/* Parses option what (a JSON text) that must be an array or an object; NULL text gives NULL. */
static rlx_status parse_option(const char *what, const char *text, int want_array, cJSON **out) {
    *out = NULL;
    if (!text)
        return RLX_OK;
    cJSON *j = cJSON_Parse(text);
    if (!j)
        return rlx_error(RLX_E_INVALID, "rlx_chat_render_ex: %s is not valid JSON", what);
    if (want_array ? !cJSON_IsArray(j) : !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rlx_error(RLX_E_INVALID, "rlx_chat_render_ex: %s must be a JSON %s", what,
                         want_array ? "array" : "object");
    }
    *out = j;
    return RLX_OK;
}

static int add_token(cJSON *trusted, const rlx_tokenizer *tok, const char *name, int32_t id) {
    const char *text = id >= 0 ? rlx_tokenizer_token_text(tok, id) : NULL;
    return !text || cJSON_AddStringToObject(trusted, name, text) != NULL;
}

rlx_status rlx_chat_render_ex(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n,
                              const rlx_chat_options *opts, char **out, rlx_text_span **markup, size_t *n_markup) {
    if (out)
        *out = NULL;
    if (markup)
        *markup = NULL;
    if (n_markup)
        *n_markup = 0;
    rlx_chat_options o = {0};
    if (opts) {
        if (opts->size < sizeof(uint32_t) + sizeof(int))
            return rlx_error(RLX_E_INVALID, "rlx_chat_render_ex: opts->size %u is too small", opts->size);
        memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
    }
    if (!out || (!msgs && n) || (!markup) != (!n_markup) || (!tok && !o.chat_template))
        return rlx_error(RLX_E_INVALID, "rlx_chat_render: NULL argument");
    if (o.messages_json && (msgs || n))
        return rlx_error(RLX_E_INVALID, "rlx_chat_render_ex: messages given both as msgs and as messages_json");
    if (!o.messages_json && n == 0)
        return rlx_error(RLX_E_INVALID, "rlx_chat_render: no messages");
    cJSON *data = NULL, *trusted = NULL, *messages = NULL, *tools = NULL, *kwargs = NULL;
    rlx__jinja *t = NULL;
    rlx_status st;
    if ((st = parse_option("messages_json", o.messages_json, 1, &messages)) != RLX_OK ||
        (st = parse_option("tools_json", o.tools_json, 1, &tools)) != RLX_OK ||
        (st = parse_option("kwargs_json", o.kwargs_json, 0, &kwargs)) != RLX_OK)
        goto done;
    const char *tmpl = o.chat_template;
    if (!tmpl)
        tmpl = tools && tok->chat_template_tool_use ? tok->chat_template_tool_use : tok->chat_template;
    if (!tmpl) {
        st = rlx_error(RLX_E_NOT_FOUND, "the model has no chat template (tokenizer_config.json chat_template, "
                                        "chat_template.jinja or GGUF tokenizer.chat_template)");
        goto done;
    }
    if ((st = rlx__jinja_parse(tmpl, strlen(tmpl), &t)) != RLX_OK)
        goto done;
    if (!messages && !(messages = messages_of(msgs, n)))
        goto nomem;
    /* kwargs first: the named variables below take precedence over a kwarg of the same name */
    data = kwargs ? kwargs : cJSON_CreateObject();
    kwargs = NULL;
    trusted = cJSON_CreateObject();
    if (!data || !trusted)
        goto nomem;
    cJSON_DeleteItemFromObjectCaseSensitive(data, "messages");
    cJSON_DeleteItemFromObjectCaseSensitive(data, "add_generation_prompt");
    if (!cJSON_AddItemToObject(data, "messages", messages)) {
        cJSON_Delete(messages);
        messages = NULL;
        goto nomem;
    }
    messages = NULL;
    if (tools) {
        cJSON_DeleteItemFromObjectCaseSensitive(data, "tools");
        if (!cJSON_AddItemToObject(data, "tools", tools)) {
            cJSON_Delete(tools);
            tools = NULL;
            goto nomem;
        }
        tools = NULL;
    }
    if (!cJSON_AddBoolToObject(data, "add_generation_prompt", o.add_generation_prompt != 0))
        goto nomem;
    if (tok &&
        (!add_token(trusted, tok, "bos_token", tok->bos_id) || !add_token(trusted, tok, "eos_token", tok->eos_id)))
        goto nomem;
    size_t len;
    st = rlx__jinja_render(t, data, trusted, NULL, out, &len, markup, n_markup);
    goto done;
nomem:
    st = rlx_error(RLX_E_NOMEM, "cannot allocate the chat template's variables");
done:
    rlx__jinja_free(t);
    cJSON_Delete(data);
    cJSON_Delete(trusted);
    cJSON_Delete(messages);
    cJSON_Delete(tools);
    cJSON_Delete(kwargs);
    return st;
}

rlx_status rlx_chat_render_spans(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n,
                                 int add_generation_prompt, int enable_thinking, char **out, rlx_text_span **markup,
                                 size_t *n_markup) {
    if (!tok) {
        if (out)
            *out = NULL;
        return rlx_error(RLX_E_INVALID, "rlx_chat_render: NULL argument");
    }
    rlx_chat_options o = {.size = sizeof o,
                          .add_generation_prompt = add_generation_prompt,
                          .kwargs_json =
                              enable_thinking ? "{\"enable_thinking\": true}" : "{\"enable_thinking\": false}"};
    return rlx_chat_render_ex(tok, msgs, n, &o, out, markup, n_markup);
}

rlx_status rlx_chat_render(const rlx_tokenizer *tok, const rlx_chat_message *msgs, size_t n, int add_generation_prompt,
                           int enable_thinking, char **out) {
    return rlx_chat_render_spans(tok, msgs, n, add_generation_prompt, enable_thinking, out, NULL, NULL);
}
