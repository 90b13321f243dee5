/* OpenAI's Responses API (job.h): POST /v1/responses read as the chat request it is, answered as
 * a response object or a stream of its typed events. input (a string or a list of items) becomes
 * chat messages: instructions the system message, message items their role's message,
 * function_call items an assistant's tool_calls and function_call_output items tool messages, a
 * reasoning item the next assistant message's reasoning_content. The flat function tools,
 * tool_choice and text.format become chat's tools, tool_choice and response_format, so calls and
 * structured output are the chat path's (tools.c). rlx stores nothing: store true,
 * previous_response_id and conversation are refused, as is any field this file does not know. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "job.h"

static int oom(serve_error *e) { return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1; }

/* The text of an item's content (a string, or parts of the types allowed, each with a string
 * text) into member name of out; -1 after setting e. Images, files and audio are refused by name. */
static int add_text(cJSON *out, const char *name, const cJSON *content, serve_error *e) {
    if (cJSON_IsString(content))
        return cJSON_AddStringToObject(out, name, content->valuestring) ? 0 : oom(e);
    if (!cJSON_IsArray(content))
        return serve_bad(e, "input", "'%s' content must be %s", "a string or an array of text parts");
    serve_buf text = {0};
    for (const cJSON *part = content->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) ||
            (strcmp(type->valuestring, "input_text") && strcmp(type->valuestring, "output_text") &&
             strcmp(type->valuestring, "reasoning_text") && strcmp(type->valuestring, "summary_text"))) {
            serve_error_set(e, 400, "invalid_request_error", "unsupported_content", "input",
                            "content parts of type '%.64s' are not supported: rlx serve takes input_text and "
                            "output_text parts",
                            cJSON_IsString(type) ? type->valuestring : "(none)");
            serve_buf_free(&text);
            return -1;
        }
        if (!cJSON_IsString(t)) {
            serve_buf_free(&text);
            return serve_bad(e, "input", "'%s' text parts need %s", "a string text");
        }
        serve_buf_append(&text, t->valuestring, strlen(t->valuestring));
    }
    const int failed = text.failed || !cJSON_AddStringToObject(out, name, text.data ? text.data : "");
    serve_buf_free(&text);
    return failed ? oom(e) : 0;
}

/* A new {"role": role} at the end of list, or NULL after setting e. */
static cJSON *new_message(cJSON *list, const char *role, serve_error *e) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddItemToArray(list, m)) {
        cJSON_Delete(m);
        return oom(e), NULL;
    }
    return m;
}

/* The assistant message a function_call item joins: the last message when it is the
 * assistant's (calls after its text are the same turn), else a new one without text. */
static cJSON *assistant_turn(cJSON *list, serve_error *e) {
    cJSON *last = cJSON_GetArrayItem(list, cJSON_GetArraySize(list) - 1);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant"))
        return last;
    cJSON *m = new_message(list, "assistant", e);
    return m && cJSON_AddStringToObject(m, "content", "") ? m : (m ? oom(e), NULL : NULL);
}

/* A function_call item {call_id, name, arguments} as a tool call of the assistant's turn. */
static int add_call(cJSON *list, const cJSON *item, serve_error *e) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "call_id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(item, "arguments");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
        return serve_bad(e, "input", "'%s' function_call items need %s", "string call_id, name and arguments");
    cJSON *m = assistant_turn(list, e);
    if (!m)
        return -1;
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(m, "tool_calls")))
        return oom(e);
    /* {id, type, function: {name, arguments}} in chat's order: the template prints what it is given */
    cJSON *call = cJSON_CreateObject(), *fn;
    if (!call || !cJSON_AddItemToArray(calls, call)) {
        cJSON_Delete(call);
        return oom(e);
    }
    return cJSON_AddStringToObject(call, "id", id->valuestring) && cJSON_AddStringToObject(call, "type", "function") &&
                   (fn = cJSON_AddObjectToObject(call, "function")) &&
                   cJSON_AddStringToObject(fn, "name", name->valuestring) &&
                   cJSON_AddStringToObject(fn, "arguments", args->valuestring)
               ? 0
               : oom(e);
}

/* One input item as chat messages; *reasoning holds a reasoning item's text (owned) until the
 * assistant message it belongs to. */
static int add_item(cJSON *list, const cJSON *item, cJSON **reasoning, serve_error *e) {
    if (!cJSON_IsObject(item))
        return serve_bad(e, "input", "'%s' must be %s", "a string or an array of input items (objects)");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : type ? "" : "message"; /* an easy input message */
    if (!strcmp(t, "message")) {
        static const char *const roles[] = {"user", "assistant", "system", "developer"};
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
        size_t k = 0;
        while (k < 4 && !(cJSON_IsString(role) && !strcmp(role->valuestring, roles[k])))
            k++;
        if (k == 4)
            return serve_bad(e, "input", "'%s' messages need a role of %s", "user, assistant, system or developer");
        cJSON *m = new_message(list, roles[k], e);
        if (!m || add_text(m, "content", cJSON_GetObjectItemCaseSensitive(item, "content"), e) < 0)
            return -1;
        if (k == 1 && *reasoning) {
            cJSON_AddItemToObject(m, "reasoning_content", *reasoning);
            *reasoning = NULL;
        }
        return 0;
    }
    if (!strcmp(t, "function_call")) {
        if (add_call(list, item, e) < 0)
            return -1;
        cJSON *m = cJSON_GetArrayItem(list, cJSON_GetArraySize(list) - 1);
        if (*reasoning && !cJSON_GetObjectItemCaseSensitive(m, "reasoning_content")) {
            cJSON_AddItemToObject(m, "reasoning_content", *reasoning);
            *reasoning = NULL;
        }
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "call_id");
        if (!cJSON_IsString(id))
            return serve_bad(e, "input", "'%s' function_call_output items need %s", "a string call_id");
        cJSON *m = new_message(list, "tool", e);
        if (!m || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring))
            return m ? oom(e) : -1;
        return add_text(m, "content", cJSON_GetObjectItemCaseSensitive(item, "output"), e);
    }
    if (!strcmp(t, "reasoning")) { /* its text (content, else summary); encrypted content alone adds nothing */
        const cJSON *parts = serve_member(item, "content");
        if (!cJSON_IsArray(parts) || !parts->child)
            parts = serve_member(item, "summary");
        if (!parts)
            return 0;
        cJSON *r = cJSON_CreateObject();
        if (!r)
            return oom(e);
        if (add_text(r, "text", parts, e) < 0) {
            cJSON_Delete(r);
            return -1;
        }
        cJSON_Delete(*reasoning);
        *reasoning = cJSON_DetachItemFromObjectCaseSensitive(r, "text");
        cJSON_Delete(r);
        return 0;
    }
    serve_error_set(e, 400, "invalid_request_error", "unsupported_value", "input",
                    "input items of type '%.64s' are not supported: rlx serve takes message, function_call, "
                    "function_call_output and reasoning items",
                    t);
    return -1;
}

/* instructions and input as chat's messages. */
static int add_messages(cJSON *out, const cJSON *root, serve_error *e) {
    const cJSON *input = serve_member(root, "input");
    const cJSON *instructions = serve_member(root, "instructions");
    if (!cJSON_IsString(input) && !(cJSON_IsArray(input) && input->child))
        return serve_bad(e, "input", "'%s' must be %s", "a string or a non-empty array of input items");
    if (instructions && !cJSON_IsString(instructions))
        return serve_bad(e, "instructions", "'%s' must be %s", "a string");
    cJSON *list = cJSON_AddArrayToObject(out, "messages"), *m;
    if (!list)
        return oom(e);
    if (instructions && (!(m = new_message(list, "system", e)) || add_text(m, "content", instructions, e) < 0))
        return -1;
    if (cJSON_IsString(input))
        return (m = new_message(list, "user", e)) ? add_text(m, "content", input, e) : -1;
    cJSON *reasoning = NULL;
    int rc = 0;
    for (const cJSON *item = input->child; item && rc == 0; item = item->next)
        rc = add_item(list, item, &reasoning, e);
    cJSON_Delete(reasoning); /* a reasoning item no assistant turn followed */
    return rc;
}

/* The flat function tools {type, name, description, parameters, strict} as chat's nested ones,
 * and tool_choice's {type: function, name} as chat's {type, function: {name}}. */
static int add_tools(cJSON *out, const cJSON *root, serve_error *e) {
    const cJSON *tools = serve_member(root, "tools"), *choice = serve_member(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools))
        return serve_bad(e, "tools", "'%s' must be %s", "an array of tools");
    cJSON *list = tools ? cJSON_AddArrayToObject(out, "tools") : NULL;
    if (tools && !list)
        return oom(e);
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            serve_error_set(e, 400, "invalid_request_error", "unsupported_value", "tools",
                            "tools of type '%.64s' are not supported: rlx serve runs function tools, which the "
                            "client executes",
                            cJSON_IsString(type) ? type->valuestring : "(none)");
            return -1;
        }
        /* {type, function: {name, description, parameters, strict}} in chat's order */
        cJSON *o = cJSON_CreateObject(), *fn;
        if (!o || !cJSON_AddItemToArray(list, o)) {
            cJSON_Delete(o);
            return oom(e);
        }
        if (!cJSON_AddStringToObject(o, "type", "function") || !(fn = cJSON_AddObjectToObject(o, "function")) ||
            serve_json_copy(fn, t, "name", "name", e) < 0 ||
            serve_json_copy(fn, t, "description", "description", e) < 0 ||
            serve_json_copy(fn, t, "parameters", "parameters", e) < 0 ||
            serve_json_copy(fn, t, "strict", "strict", e) < 0)
            return oom(e);
    }
    if (!choice)
        return 0;
    if (cJSON_IsString(choice))
        return serve_json_copy(out, root, "tool_choice", "tool_choice", e);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
        return serve_bad(e, "tool_choice", "'%s' must be %s",
                         "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}");
    cJSON *c = cJSON_AddObjectToObject(out, "tool_choice");
    cJSON *fn = c ? cJSON_AddObjectToObject(c, "function") : NULL;
    return fn && cJSON_AddStringToObject(c, "type", "function") &&
                   cJSON_AddStringToObject(fn, "name", name->valuestring)
               ? 0
               : oom(e);
}

/* text.format: text, json_object, or json_schema {name, schema, strict} as chat's response_format. */
static int add_format(cJSON *out, const cJSON *root, serve_error *e) {
    const cJSON *text = serve_member(root, "text");
    if (!text)
        return 0;
    for (const cJSON *k = cJSON_IsObject(text) ? text->child : NULL; k; k = k->next)
        if (strcmp(k->string, "format"))
            return serve_bad(e, "text", "'%s' takes %s", "format alone");
    const cJSON *format = serve_member(text, "format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(format, "type");
    if (!cJSON_IsObject(text) || (format && !cJSON_IsString(type)))
        return serve_bad(e, "text", "'%s' must be %s", "an object with a format {\"type\": ...}");
    if (!format || !strcmp(type->valuestring, "text"))
        return 0;
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    if (!rf || !cJSON_AddStringToObject(rf, "type", type->valuestring))
        return oom(e);
    if (!strcmp(type->valuestring, "json_object"))
        return 0;
    if (strcmp(type->valuestring, "json_schema"))
        return serve_bad(e, "text", "'%s' format type must be %s", "text, json_object or json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(format, "schema");
    if (!cJSON_IsObject(schema))
        return serve_bad(e, "text", "'%s' format json_schema needs %s", "a schema object");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    return js && serve_json_copy(js, format, "name", "name", e) == 0 &&
                   serve_json_copy(js, format, "schema", "schema", e) == 0 &&
                   serve_json_copy(js, format, "strict", "strict", e) == 0
               ? 0
               : (js ? -1 : oom(e));
}

/* reasoning {effort, summary}: accepted; an effort of none or minimal turns a thinking template's
 * thinking off (chat_template_kwargs.enable_thinking), as it asks the model not to reason. */
static int add_reasoning(cJSON *out, const cJSON *root, serve_error *e) {
    const cJSON *r = serve_member(root, "reasoning");
    if (!r)
        return 0;
    const char *effort = NULL, *summary = NULL;
    if (!cJSON_IsObject(r) || serve_get_string(r, "effort", &effort, e) < 0 ||
        serve_get_string(r, "summary", &summary, e) < 0)
        return serve_bad(e, "reasoning", "'%s' must be %s", "an object with string effort and summary");
    if (effort && (!strcmp(effort, "none") || !strcmp(effort, "minimal"))) {
        cJSON *kw = cJSON_AddObjectToObject(out, "chat_template_kwargs");
        if (!kw || !cJSON_AddFalseToObject(kw, "enable_thinking"))
            return oom(e);
    }
    return 0;
}

/* The fields rlx reads or accepts; any other is refused by name. */
static const char *const known_fields[] = {"model",
                                           "input",
                                           "instructions",
                                           "tools",
                                           "tool_choice",
                                           "parallel_tool_calls",
                                           "max_output_tokens",
                                           "stream",
                                           "text",
                                           "reasoning",
                                           "temperature",
                                           "top_p",
                                           "store",
                                           "metadata",
                                           "user",
                                           "include",
                                           "truncation",
                                           "stream_options",
                                           "service_tier",
                                           "safety_identifier",
                                           "prompt_cache_key",
                                           "background",
                                           "previous_response_id",
                                           "conversation"};

/* What the request asks that rlx cannot do: a stored response, or a field it does not know. */
static int check_fields(const cJSON *root, serve_error *e) {
    for (const cJSON *k = root->child; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof known_fields / sizeof *known_fields && strcmp(k->string, known_fields[i]))
            i++;
        if (i == sizeof known_fields / sizeof *known_fields) {
            serve_error_set(e, 400, "invalid_request_error", "unknown_parameter", "",
                            "unknown or unsupported parameter '%.64s'", k->string);
            snprintf(e->param, sizeof e->param, "%s", k->string);
            return -1;
        }
    }
    int flag = 0;
    if (serve_get_bool(root, "store", &flag, e) < 0)
        return -1;
    if (flag)
        return serve_bad(e, "store", "'%s' must be false: %s", "rlx serve stores no responses");
    if (serve_member(root, "previous_response_id") || serve_member(root, "conversation")) {
        const char *name = serve_member(root, "conversation") ? "conversation" : "previous_response_id";
        return serve_bad(e, name, "'%s' is not supported: %s",
                         "rlx serve stores no responses; send the whole conversation in input");
    }
    if (serve_get_bool(root, "background", &flag, e) < 0)
        return -1;
    if (flag)
        return serve_bad(e, "background", "'%s' is not supported: %s", "responses are answered on their connection");
    const cJSON *include = serve_member(root, "include");
    if (include && !(cJSON_IsArray(include) && !include->child))
        return serve_bad(e, "include", "'%s' is not supported: %s", "no extra output data is available");
    const cJSON *truncation = serve_member(root, "truncation");
    if (truncation && !(cJSON_IsString(truncation) && !strcmp(truncation->valuestring, "disabled")))
        return serve_bad(e, "truncation", "'%s' must be %s", "\"disabled\" (a prompt over the context is refused)");
    const cJSON *metadata = serve_member(root, "metadata"), *so = serve_member(root, "stream_options");
    if ((metadata && !cJSON_IsObject(metadata)) || (so && !cJSON_IsObject(so)))
        return serve_bad(e, metadata && !cJSON_IsObject(metadata) ? "metadata" : "stream_options", "'%s' must be %s",
                         "an object");
    const char *s;
    double v;
    return serve_get_string(root, "user", &s, e) < 0 || serve_get_string(root, "safety_identifier", &s, e) < 0 ||
                   serve_get_string(root, "prompt_cache_key", &s, e) < 0 ||
                   serve_get_string(root, "service_tier", &s, e) < 0 ||
                   serve_get_integer(root, "max_output_tokens", 1, 16777216, &v, e) < 0
               ? -1
               : 0;
}

cJSON *serve_responses_request(const cJSON *root, serve_error *e) {
    if (check_fields(root, e) < 0)
        return NULL;
    cJSON *out = cJSON_CreateObject();
    if (!out)
        return oom(e), NULL;
    if (add_messages(out, root, e) < 0 || add_tools(out, root, e) < 0 || add_format(out, root, e) < 0 ||
        add_reasoning(out, root, e) < 0 || serve_json_copy(out, root, "model", "model", e) < 0 ||
        serve_json_copy(out, root, "max_output_tokens", "max_tokens", e) < 0 ||
        serve_json_copy(out, root, "temperature", "temperature", e) < 0 ||
        serve_json_copy(out, root, "top_p", "top_p", e) < 0 || serve_json_copy(out, root, "stream", "stream", e) < 0 ||
        serve_json_copy(out, root, "parallel_tool_calls", "parallel_tool_calls", e) < 0) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

// ---- the answer ----

/* Whether the reply was cut by its token budget (or the slot's end) rather than ending. */
static int cut_short(const serve_job *j) { return j->finish == RLX_FINISH_LENGTH || j->finish == RLX_FINISH_CONTEXT; }

/* An output item's id: its kind's prefix, the response's random part and its place. */
static void item_id(char *out, size_t size, const serve_job *j, const char *prefix, int index) {
    snprintf(out, size, "%s%s_%d", prefix, j->id + 5 /* after "resp_" */, index);
}

/* The response object: in progress (no output or usage yet), or final with output and usage. */
static cJSON *response_object(const serve_job *j, cJSON *output) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", j->id);
    cJSON_AddStringToObject(root, "object", "response");
    cJSON_AddNumberToObject(root, "created_at", (double)j->created);
    cJSON_AddStringToObject(root, "status", !output ? "in_progress" : cut_short(j) ? "incomplete" : "completed");
    cJSON_AddNullToObject(root, "error");
    if (output && cut_short(j))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(root, "incomplete_details");
    cJSON_AddStringToObject(root, "model", j->model);
    cJSON_AddItemToObject(root, "output", output ? output : cJSON_CreateArray());
    if (!output) {
        cJSON_AddNullToObject(root, "usage");
        return root;
    }
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", j->usage.n_prompt);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", j->usage.n_cached);
    cJSON_AddNumberToObject(u, "output_tokens", j->usage.n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", (double)j->usage.n_prompt + j->usage.n_generated);
    return root;
}

enum { ITEM_NONE = 0, ITEM_MESSAGE = 1, ITEM_CALL = 2, ITEM_REASONING = 3 };

/* A new output item of kind at the end of output, in progress (its text or arguments empty). */
static cJSON *new_item(const serve_job *j, cJSON *output, int kind, const char *call_id, const char *name) {
    char id[80];
    const int index = cJSON_GetArraySize(output);
    cJSON *item = cJSON_CreateObject();
    if (!item || !cJSON_AddItemToArray(output, item)) {
        cJSON_Delete(item);
        return NULL;
    }
    if (kind == ITEM_CALL) {
        item_id(id, sizeof id, j, "fc_", index);
        cJSON_AddStringToObject(item, "type", "function_call");
        cJSON_AddStringToObject(item, "id", id);
        cJSON_AddStringToObject(item, "call_id", call_id);
        cJSON_AddStringToObject(item, "name", name);
        cJSON_AddStringToObject(item, "arguments", "");
        cJSON_AddStringToObject(item, "status", "in_progress");
        return item;
    }
    item_id(id, sizeof id, j, kind == ITEM_MESSAGE ? "msg_" : "rs_", index);
    cJSON_AddStringToObject(item, "type", kind == ITEM_MESSAGE ? "message" : "reasoning");
    cJSON_AddStringToObject(item, "id", id);
    if (kind == ITEM_REASONING)
        cJSON_AddArrayToObject(item, "summary");
    else
        cJSON_AddStringToObject(item, "status", "in_progress");
    if (kind == ITEM_MESSAGE)
        cJSON_AddStringToObject(item, "role", "assistant");
    cJSON_AddArrayToObject(item, "content");
    return item;
}

/* The content part of a message or reasoning item, its text empty. */
static cJSON *new_part(int kind) {
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", kind == ITEM_MESSAGE ? "output_text" : "reasoning_text");
    cJSON_AddStringToObject(part, "text", "");
    if (kind == ITEM_MESSAGE) {
        cJSON_AddArrayToObject(part, "annotations");
        cJSON_AddArrayToObject(part, "logprobs");
    }
    return part;
}

static int item_kind(const cJSON *item) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    return !strcmp(t, "message") ? ITEM_MESSAGE : !strcmp(t, "function_call") ? ITEM_CALL : ITEM_REASONING;
}

static void set_status(cJSON *item, const char *status) {
    if (cJSON_GetObjectItemCaseSensitive(item, "status"))
        cJSON_ReplaceItemInObjectCaseSensitive(item, "status", cJSON_CreateString(status));
}

/* A whole reply's output items from serve_calls_scan, in the order it wrote them. */
typedef struct item_sink {
    const serve_job *j;
    cJSON *output;
} item_sink;

/* The last item when it is of kind (text joins it), else a new one of kind with its part. */
static cJSON *text_item(item_sink *s, int kind) {
    cJSON *last = cJSON_GetArrayItem(s->output, cJSON_GetArraySize(s->output) - 1);
    if (last && item_kind(last) == kind)
        return last;
    cJSON *item = new_item(s->j, s->output, kind, NULL, NULL);
    if (item)
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(item, "content"), new_part(kind));
    return item;
}

static void sink_text(item_sink *s, int kind, const char *text, size_t len) {
    cJSON *item = text_item(s, kind);
    if (item)
        serve_json_append(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(item, "content"), 0), "text", text, len);
}

static void sink_content(void *ctx, const char *text, size_t len) { sink_text(ctx, ITEM_MESSAGE, text, len); }
static void sink_reasoning(void *ctx, const char *text, size_t len) { sink_text(ctx, ITEM_REASONING, text, len); }

static void sink_call(void *ctx, int index, const char *id, const char *name, const char *args, size_t len) {
    item_sink *s = ctx;
    (void)index;
    const int last = cJSON_GetArraySize(s->output) - 1;
    if (!args) { /* a call cut short: no call */
        cJSON_DeleteItemFromArray(s->output, last);
        return;
    }
    cJSON *item = id ? new_item(s->j, s->output, ITEM_CALL, id, name) : cJSON_GetArrayItem(s->output, last);
    if (item)
        serve_json_append(item, "arguments", args, len);
}

/* Every item of a finished reply marked done: the last one incomplete when the reply was cut. */
static void finish_items(const serve_job *j, cJSON *output) {
    for (cJSON *item = output->child; item; item = item->next)
        set_status(item, item->next || !cut_short(j) ? "completed" : "incomplete");
}

cJSON *serve_responses_response(serve_job *j) {
    item_sink s = {.j = j, .output = cJSON_CreateArray()};
    if (serve_reply_scanned(j)) {
        serve_calls scan = j->calls;
        j->calls = (serve_calls){0};
        serve_calls_scan(j, 1, &(serve_call_sink){sink_reasoning, sink_content, sink_call, &s});
        j->calls = scan;
    }
    if (!serve_reply_scanned(j) || !s.output->child) /* a reply of text, or of nothing: one message */
        sink_content(&s, j->text.len ? j->text.data : "", j->text.len);
    finish_items(j, s.output);
    return response_object(j, s.output);
}

// ---- the stream ----

/* An event of type, numbered in the stream's order. */
static cJSON *event(serve_job *j, const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", (double)j->seq++);
    return o;
}

/* An event about the item at output_index (and its content part 0 for text). */
static cJSON *item_event(serve_job *j, const char *type, const cJSON *item, int content) {
    cJSON *o = event(j, type);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "id");
    cJSON_AddStringToObject(o, "item_id", cJSON_IsString(id) ? id->valuestring : "");
    cJSON_AddNumberToObject(o, "output_index", cJSON_GetArraySize(j->output) - 1);
    if (content)
        cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

typedef struct item_stream {
    serve_job *j;
    serve_buf *out;
} item_stream;

static cJSON *open_item(const item_stream *s) {
    return s->j->calls.block_kind ? cJSON_GetArrayItem(s->j->output, cJSON_GetArraySize(s->j->output) - 1) : NULL;
}

/* The done events of the open item: its text's (or arguments'), its part's, its own. */
static void close_item(item_stream *s, const char *status) {
    serve_job *j = s->j;
    cJSON *item = open_item(s);
    const int kind = j->calls.block_kind;
    if (!item)
        return;
    set_status(item, status);
    if (kind == ITEM_CALL) {
        cJSON *done = item_event(j, "response.function_call_arguments.done", item, 0);
        cJSON_AddItemToObject(done, "name", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(item, "name"), 1));
        cJSON_AddItemToObject(done, "arguments",
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(item, "arguments"), 1));
        serve_add_event(s->out, "response.function_call_arguments.done", done);
    } else {
        const cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(item, "content"), 0);
        const char *type = kind == ITEM_MESSAGE ? "response.output_text.done" : "response.reasoning_text.done";
        cJSON *done = item_event(j, type, item, 1);
        cJSON_AddItemToObject(done, "text", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(part, "text"), 1));
        if (kind == ITEM_MESSAGE)
            cJSON_AddArrayToObject(done, "logprobs");
        serve_add_event(s->out, type, done);
        cJSON *part_done = item_event(j, "response.content_part.done", item, 1);
        cJSON_AddItemToObject(part_done, "part", cJSON_Duplicate(part, 1));
        serve_add_event(s->out, "response.content_part.done", part_done);
    }
    cJSON *done = event(j, "response.output_item.done");
    cJSON_AddNumberToObject(done, "output_index", cJSON_GetArraySize(j->output) - 1);
    cJSON_AddItemToObject(done, "item", cJSON_Duplicate(item, 1));
    serve_add_event(s->out, "response.output_item.done", done);
    j->calls.block_kind = ITEM_NONE;
}

/* Opens an item of kind (a call with its id and name) unless one of that kind of text is open. */
static cJSON *open_kind(item_stream *s, int kind, const char *call_id, const char *name) {
    serve_job *j = s->j;
    if (kind != ITEM_CALL && j->calls.block_kind == kind)
        return open_item(s);
    close_item(s, "completed");
    cJSON *item = new_item(j, j->output, kind, call_id, name);
    if (!item) {
        s->out->failed = 1;
        return NULL;
    }
    j->calls.block_kind = kind;
    cJSON *added = event(j, "response.output_item.added");
    cJSON_AddNumberToObject(added, "output_index", cJSON_GetArraySize(j->output) - 1);
    cJSON_AddItemToObject(added, "item", cJSON_Duplicate(item, 1));
    serve_add_event(s->out, "response.output_item.added", added);
    if (kind != ITEM_CALL) {
        cJSON *part = new_part(kind), *part_added = item_event(j, "response.content_part.added", item, 1);
        cJSON_AddItemToObject(part_added, "part", cJSON_Duplicate(part, 1));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(item, "content"), part);
        serve_add_event(s->out, "response.content_part.added", part_added);
    }
    return item;
}

/* A delta event of the open item, and its text grown by it. */
static void delta(item_stream *s, cJSON *item, const char *type, const char *text, size_t len) {
    const int call = s->j->calls.block_kind == ITEM_CALL;
    cJSON *grown = call ? item : cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(item, "content"), 0);
    if (serve_json_append(grown, call ? "arguments" : "text", text, len) < 0) {
        s->out->failed = 1;
        return;
    }
    cJSON *d = item_event(s->j, type, item, !call);
    char *piece = strndup(text, len);
    cJSON_AddStringToObject(d, "delta", piece ? piece : "");
    free(piece);
    if (!call)
        cJSON_AddArrayToObject(d, "logprobs");
    serve_add_event(s->out, type, d);
}

static void stream_content(void *ctx, const char *text, size_t len) {
    cJSON *item = open_kind(ctx, ITEM_MESSAGE, NULL, NULL);
    if (item)
        delta(ctx, item, "response.output_text.delta", text, len);
}

static void stream_reasoning(void *ctx, const char *text, size_t len) {
    cJSON *item = open_kind(ctx, ITEM_REASONING, NULL, NULL);
    if (item)
        delta(ctx, item, "response.reasoning_text.delta", text, len);
}

static void stream_call(void *ctx, int index, const char *id, const char *name, const char *args, size_t len) {
    item_stream *s = ctx;
    (void)index;
    if (!args) { /* a call cut short: what went out stays, marked incomplete */
        close_item(s, "incomplete");
        return;
    }
    cJSON *item = id ? open_kind(s, ITEM_CALL, id, name) : open_item(s);
    if (item && len)
        delta(s, item, "response.function_call_arguments.delta", args, len);
}

int serve_responses_stream(serve_job *j, serve_buf *out) {
    item_stream s = {.j = j, .out = out};
    const int scanned = serve_reply_scanned(j);
    if (!j->opened) {
        if (!(j->output = cJSON_CreateArray())) {
            out->failed = 1;
            return 1;
        }
        cJSON *created = event(j, "response.created");
        cJSON_AddItemToObject(created, "response", response_object(j, NULL));
        serve_add_event(out, "response.created", created);
        cJSON *progress = event(j, "response.in_progress");
        cJSON_AddItemToObject(progress, "response", response_object(j, NULL));
        serve_add_event(out, "response.in_progress", progress);
        if (!scanned) /* a reply that is all text has its message from the start */
            open_kind(&s, ITEM_MESSAGE, NULL, NULL);
        j->opened = 1;
    }
    if (scanned)
        serve_calls_scan(j, j->done, &(serve_call_sink){stream_reasoning, stream_content, stream_call, &s});
    else if (j->text.len > j->text_sent)
        stream_content(&s, j->text.data + j->text_sent, j->text.len - j->text_sent);
    j->text_sent = j->text.len;
    j->lps_sent = j->n_lps;
    serve_error e;
    if (j->done && serve_job_end_error(j, &e)) {
        /* the status line went out with the first byte: the error travels as an event */
        cJSON *err = event(j, "error");
        cJSON_AddStringToObject(err, "code", e.code ? e.code : e.type);
        cJSON_AddStringToObject(err, "message", e.message);
        if (*e.param)
            cJSON_AddStringToObject(err, "param", e.param);
        else
            cJSON_AddNullToObject(err, "param");
        serve_add_event(out, "error", err);
    } else if (j->done) {
        if (!j->output->child) /* nothing was said: the one empty message a reply has */
            open_kind(&s, ITEM_MESSAGE, NULL, NULL);
        close_item(&s, cut_short(j) ? "incomplete" : "completed");
        const char *type = cut_short(j) ? "response.incomplete" : "response.completed";
        cJSON *end = event(j, type);
        cJSON_AddItemToObject(end, "response", response_object(j, cJSON_Duplicate(j->output, 1)));
        serve_add_event(out, type, end);
    }
    return j->done;
}
