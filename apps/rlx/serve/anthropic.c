/* Anthropic's Messages API (job.h): POST /v1/messages read as the chat request it is, answered as
 * a message object or a stream of Anthropic's events, with Anthropic's error shape; and
 * /v1/messages/count_tokens. Text and tools: tools (input_schema), tool_choice (auto, any, tool,
 * none) and disable_parallel_tool_use become OpenAI's fields, tool_use blocks an assistant's
 * tool_calls and tool_result blocks tool messages, so the calls are the OpenAI side's (tools.c)
 * and come back as tool_use blocks. Other content blocks (images, documents) are refused by
 * name, never dropped. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "job.h"

/* The text of an Anthropic content value (a string, or an array of text blocks) as one string
 * member `name` of out; -1 after setting e. */
static int add_text(cJSON *out, const char *name, const cJSON *content, const char *param, serve_error *e) {
    if (cJSON_IsString(content))
        return cJSON_AddStringToObject(out, name, content->valuestring)
                   ? 0
                   : (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
    if (!cJSON_IsArray(content))
        return serve_bad(e, param, "'%s' must be %s", "a string or an array of content blocks");
    serve_buf text = {0};
    for (const cJSON *block = content->child; block; block = block->next) {
        const cJSON *type = cJSON_IsObject(block) ? cJSON_GetObjectItemCaseSensitive(block, "type") : NULL;
        const cJSON *t = cJSON_IsObject(block) ? cJSON_GetObjectItemCaseSensitive(block, "text") : NULL;
        if (!cJSON_IsString(type)) {
            serve_buf_free(&text);
            return serve_bad(e, param, "'%s' blocks need %s", "a string type");
        }
        if (strcmp(type->valuestring, "text") != 0) {
            serve_error_set(e, 400, "invalid_request_error", "unsupported_content", param,
                            "content blocks of type '%.64s' are not supported: rlx serve takes text blocks only",
                            type->valuestring);
            serve_buf_free(&text);
            return -1;
        }
        if (!cJSON_IsString(t)) {
            serve_buf_free(&text);
            return serve_bad(e, param, "'%s' text blocks need %s", "a string text");
        }
        serve_buf_append(&text, t->valuestring, strlen(t->valuestring));
    }
    const int failed = text.failed || !cJSON_AddStringToObject(out, name, text.data ? text.data : "");
    serve_buf_free(&text);
    return failed ? (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1) : 0;
}

static cJSON *new_message(cJSON *list, const char *role, serve_error *e);

/* The text blocks of content, with the tool blocks (tool_use, tool_result) left to the caller. */
static int add_text_of(cJSON *out, const cJSON *content, const char *param, serve_error *e) {
    if (!cJSON_IsArray(content))
        return add_text(out, "content", content, param, e);
    cJSON *texts = cJSON_CreateArray();
    for (const cJSON *block = content->child; texts && block; block = block->next) {
        const cJSON *type = cJSON_IsObject(block) ? cJSON_GetObjectItemCaseSensitive(block, "type") : NULL;
        if (cJSON_IsString(type) &&
            (!strcmp(type->valuestring, "tool_use") || !strcmp(type->valuestring, "tool_result")))
            continue;
        cJSON *dup = cJSON_Duplicate(block, 1);
        if (!dup || !cJSON_AddItemToArray(texts, dup)) {
            cJSON_Delete(dup);
            cJSON_Delete(texts);
            texts = NULL;
        }
    }
    const int rc = texts ? add_text(out, "content", texts, param, e)
                         : (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1);
    cJSON_Delete(texts);
    return rc;
}

/* A tool_use block as an OpenAI tool call {id, type, function: {name, arguments}}. */
static cJSON *tool_call_of(const cJSON *block, serve_error *e) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(block, "id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(block, "name");
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(block, "input");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input))
        return serve_bad(e, "messages", "'%s' tool_use blocks need %s", "a string id and name and an object input"),
               NULL;
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject(), *args = cJSON_Duplicate(input, 1);
    if (!call || !fn || !args || !cJSON_AddStringToObject(call, "id", id->valuestring) ||
        !cJSON_AddStringToObject(call, "type", "function") || !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
        !cJSON_AddItemToObject(fn, "arguments", args)) {
        cJSON_Delete(call);
        cJSON_Delete(fn);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), NULL;
    }
    cJSON_AddItemToObject(call, "function", fn);
    return call;
}

/* One Anthropic message as chat messages in list: a user's tool_result blocks first, each a tool
 * message (as Anthropic puts them first), then its text; an assistant's text with its tool_use
 * blocks as tool_calls. -1 after setting e. */
static int add_message(cJSON *list, const char *role, const cJSON *content, serve_error *e) {
    const int assistant = !strcmp(role, "assistant");
    cJSON *m, *calls = NULL;
    int texts = !cJSON_IsArray(content);
    for (const cJSON *block = cJSON_IsArray(content) ? content->child : NULL; block; block = block->next) {
        const cJSON *type = cJSON_IsObject(block) ? cJSON_GetObjectItemCaseSensitive(block, "type") : NULL;
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "tool_result") && !assistant) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(block, "tool_use_id");
            if (!cJSON_IsString(id))
                return serve_bad(e, "messages", "'%s' tool_result blocks need %s", "a string tool_use_id");
            const cJSON *result = cJSON_GetObjectItemCaseSensitive(block, "content");
            if (!(m = new_message(list, "tool", e)) || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring) ||
                (result ? add_text(m, "content", result, "messages", e) : !cJSON_AddStringToObject(m, "content", "")))
                return -1;
        } else if (!strcmp(t, "tool_use") && assistant) {
            cJSON *call = tool_call_of(block, e);
            if (!call || (!calls && !(calls = cJSON_CreateArray())) || !cJSON_AddItemToArray(calls, call)) {
                cJSON_Delete(call);
                cJSON_Delete(calls);
                return call ? (serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1) : -1;
            }
        } else {
            texts = 1;
        }
    }
    if (!texts && !calls)
        return 0;
    if (!(m = new_message(list, role, e)) || add_text_of(m, content, "messages", e) < 0) {
        cJSON_Delete(calls);
        return -1;
    }
    if (calls && !cJSON_AddItemToObject(m, "tool_calls", calls)) {
        cJSON_Delete(calls);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    }
    return 0;
}

/* tools [{name, description, input_schema}] and tool_choice {type: auto|any|tool|none, name,
 * disable_parallel_tool_use} as OpenAI's tools, tool_choice and parallel_tool_calls. */
static int add_tools(cJSON *out, const cJSON *root, serve_error *e) {
    const cJSON *tools = serve_member(root, "tools"), *choice = serve_member(root, "tool_choice");
    if (tools && !cJSON_IsArray(tools))
        return serve_bad(e, "tools", "'%s' must be %s", "an array of tools");
    cJSON *list = tools ? cJSON_AddArrayToObject(out, "tools") : NULL;
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "custom")))
            return serve_bad(e, "tools", "'%s' of Anthropic's server tools (%s) are not supported",
                             cJSON_IsString(type) ? type->valuestring : "a typed tool");
        if (!cJSON_IsString(name) || !cJSON_IsObject(schema))
            return serve_bad(e, "tools", "'%s' entries need %s", "a name and an input_schema object");
        cJSON *o = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(o, "function");
        if (!list || !o || !fn || !cJSON_AddItemToArray(list, o) || !cJSON_AddStringToObject(o, "type", "function") ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
            !cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1)) ||
            serve_json_copy(fn, t, "description", "description", e) < 0)
            return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    }
    if (!choice)
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    int single = 0;
    if (serve_get_bool(choice, "disable_parallel_tool_use", &single, e) < 0)
        return -1;
    cJSON *c = !strcmp(t, "auto")                           ? cJSON_CreateString("auto")
               : !strcmp(t, "any")                          ? cJSON_CreateString("required")
               : !strcmp(t, "none")                         ? cJSON_CreateString("none")
               : !strcmp(t, "tool") && cJSON_IsString(name) ? cJSON_CreateObject()
                                                            : NULL;
    if (!c)
        return serve_bad(e, "tool_choice", "'%s' must be %s",
                         "{\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                         "{\"type\": \"tool\", \"name\": ...}");
    if (cJSON_IsObject(c)) {
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    }
    cJSON_AddItemToObject(out, "tool_choice", c);
    if (single)
        cJSON_AddBoolToObject(out, "parallel_tool_calls", 0);
    return 0;
}

/* A new {"role": role} in list, or NULL after setting e. */
static cJSON *new_message(cJSON *list, const char *role, serve_error *e) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(list, m)) {
        cJSON_Delete(m);
        m = NULL;
    } else if (!cJSON_AddStringToObject(m, "role", role)) {
        m = NULL; /* list owns it */
    }
    if (!m)
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
    return m;
}

/* The chat request of a Messages body; counting (count_tokens) needs no max_tokens. */
static cJSON *as_chat(const cJSON *root, int counting, serve_error *e) {
    const cJSON *msgs = serve_member(root, "messages");
    if (!cJSON_IsArray(msgs) || !msgs->child)
        return serve_bad(e, "messages", "'%s' must be %s", "a non-empty array of messages"), NULL;
    double v;
    int rc;
    if (!counting && (rc = serve_get_integer(root, "max_tokens", 1, 16777216, &v, e)) <= 0) {
        if (rc == 0)
            serve_bad(e, "max_tokens", "'%s' is required: %s", "the most tokens to generate");
        return NULL;
    }
    if (serve_get_number(root, "temperature", 0, 1, &v, e) < 0)
        return NULL;
    cJSON *out = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(out, "messages");
    if (!list) {
        cJSON_Delete(out);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), NULL;
    }
    const cJSON *system = serve_member(root, "system");
    cJSON *m;
    if (system && (!(m = new_message(list, "system", e)) || add_text(m, "content", system, "system", e) < 0))
        goto fail;
    for (const cJSON *msg = msgs->child; msg; msg = msg->next) {
        const cJSON *role = cJSON_IsObject(msg) ? cJSON_GetObjectItemCaseSensitive(msg, "role") : NULL;
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))) {
            serve_bad(e, "messages", "'%s' entries need a role of %s", "user or assistant");
            goto fail;
        }
        if (add_message(list, role->valuestring, cJSON_GetObjectItemCaseSensitive(msg, "content"), e) < 0)
            goto fail;
    }
    if (add_tools(out, root, e) < 0)
        goto fail;
    const cJSON *stops = serve_member(root, "stop_sequences");
    if (stops && !cJSON_IsArray(stops)) {
        serve_bad(e, "stop_sequences", "'%s' must be %s", "an array of strings");
        goto fail;
    }
    if (serve_json_copy(out, root, "model", "model", e) < 0 ||
        serve_json_copy(out, root, "max_tokens", "max_tokens", e) < 0 ||
        serve_json_copy(out, root, "temperature", "temperature", e) < 0 ||
        serve_json_copy(out, root, "top_p", "top_p", e) < 0 || serve_json_copy(out, root, "top_k", "top_k", e) < 0 ||
        serve_json_copy(out, root, "stream", "stream", e) < 0 ||
        serve_json_copy(out, root, "stop_sequences", "stop_sequences", e) < 0)
        goto fail;
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

cJSON *serve_anthropic_request(const cJSON *root, serve_error *e) { return as_chat(root, 0, e); }

char *serve_anthropic_count_tokens(const serve_server *s, const char *body, size_t len, serve_error *e) {
    cJSON *root = serve_parse_body(body, len, e), *chat = root ? as_chat(root, 1, e) : NULL;
    cJSON_Delete(root);
    int32_t *ids = NULL;
    size_t n = 0;
    char *json = NULL;
    if (chat && serve_chat_prompt(s, chat, &ids, &n, e) == 0) {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddNumberToObject(out, "input_tokens", (double)n);
        if (!(json = cJSON_PrintUnformatted(out)))
            serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
        cJSON_Delete(out);
    }
    free(ids);
    cJSON_Delete(chat);
    return json;
}

static const char *stop_reason(const serve_job *j, int calls) {
    return j->stop_hit                   ? "stop_sequence"
           : j->finish == RLX_FINISH_EOS ? (calls ? "tool_use" : "end_turn")
                                         : "max_tokens";
}

static void add_stop(cJSON *o, const serve_job *j, int calls) {
    cJSON_AddStringToObject(o, "stop_reason", stop_reason(j, calls));
    const char *word = serve_job_stop_string(j);
    if (word)
        cJSON_AddStringToObject(o, "stop_sequence", word);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
}

/* A whole reply's content blocks from serve_calls_scan: text runs and tool_use blocks. */
typedef struct block_sink {
    cJSON *content;
    int calls;
} block_sink;

static void block_text(void *ctx, const char *text, size_t len) {
    block_sink *b = ctx;
    cJSON *last = cJSON_GetArrayItem(b->content, cJSON_GetArraySize(b->content) - 1);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(last, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0) { /* a text run after a call */
        last = cJSON_CreateObject();
        if (!last || !cJSON_AddStringToObject(last, "type", "text") || !cJSON_AddItemToArray(b->content, last)) {
            cJSON_Delete(last);
            return;
        }
    }
    serve_json_append(last, "text", text, len);
}

/* Anthropic's tool ids are toolu_...: the call's id keeps its random part. */
static void tool_id(char *out, size_t size, const char *id) {
    snprintf(out, size, "toolu_%s", strncmp(id, "call_", 5) ? id : id + 5);
}

/* A tool_use block once its arguments are whole (input is their JSON object). */
static void block_call(void *ctx, int index, const char *id, const char *name, const char *args, size_t len) {
    block_sink *b = ctx;
    (void)index;
    cJSON *last = cJSON_GetArrayItem(b->content, cJSON_GetArraySize(b->content) - 1);
    if (!args) { /* a call cut short */
        cJSON_DeleteItemFromArray(b->content, cJSON_GetArraySize(b->content) - 1);
        b->calls--;
        return;
    }
    if (id) {
        char tid[64];
        tool_id(tid, sizeof tid, id);
        last = cJSON_CreateObject();
        cJSON_AddStringToObject(last, "type", "tool_use");
        cJSON_AddStringToObject(last, "id", tid);
        cJSON_AddStringToObject(last, "name", name);
        cJSON_AddStringToObject(last, "input", ""); /* the arguments' text until the call is whole */
        cJSON_AddItemToArray(b->content, last);
        b->calls++;
    }
    /* the arguments' text grows until it parses as the whole object */
    if (serve_json_append(last, "input", args, len) < 0)
        return;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(last, "input");
    cJSON *input = cJSON_Parse(text->valuestring);
    if (cJSON_IsObject(input))
        cJSON_ReplaceItemInObjectCaseSensitive(last, "input", input);
    else
        cJSON_Delete(input);
}

/* The message object; content and the stop fields only when final (message_start has none). */
static cJSON *message(serve_job *j, int final) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", j->id);
    cJSON_AddStringToObject(root, "type", "message");
    cJSON_AddStringToObject(root, "role", "assistant");
    cJSON_AddStringToObject(root, "model", j->model);
    cJSON *content = cJSON_AddArrayToObject(root, "content");
    if (final) {
        /* a scanned reply: text blocks and tool_use blocks, in the order it wrote them; any
         * other: its text as one block */
        block_sink b = {.content = content};
        if (serve_reply_scanned(j)) {
            serve_calls scan = j->calls;
            j->calls = (serve_calls){0};
            serve_calls_scan(j, 1, &(serve_call_sink){block_text, block_text, block_call, &b});
            j->calls = scan;
        } else {
            block_text(&b, j->text.len ? j->text.data : "", j->text.len);
        }
        add_stop(root, j, b.calls);
    } else {
        cJSON_AddNullToObject(root, "stop_reason");
        cJSON_AddNullToObject(root, "stop_sequence");
    }
    cJSON *usage = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(usage, "input_tokens", final ? j->usage.n_prompt : (double)j->n_prompt);
    cJSON_AddNumberToObject(usage, "output_tokens", final ? j->usage.n_generated : 0);
    if (final)
        cJSON_AddNumberToObject(usage, "cache_read_input_tokens", j->usage.n_cached);
    return root;
}

cJSON *serve_anthropic_response(serve_job *j) { return message(j, 1); }

/* An event's object: {"type": type}. */
static cJSON *event(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* The stream: each text run and tool call its own content block (a reply that is all text, one
 * block), a call's input as input_json_delta events as its arguments come. */
typedef struct block_stream {
    serve_job *j;
    serve_buf *out;
} block_stream;

static void stream_close_block(block_stream *b) {
    serve_calls *c = &b->j->calls;
    if (!c->block_kind)
        return;
    cJSON *stop = event("content_block_stop");
    cJSON_AddNumberToObject(stop, "index", c->block);
    serve_add_event(b->out, "content_block_stop", stop);
    c->block++;
    c->block_kind = 0;
}

/* Opens block kind (1 text, 2 tool_use with id and name) unless a text block is open for text. */
static void stream_open_block(block_stream *b, int kind, const char *id, const char *name) {
    serve_calls *c = &b->j->calls;
    if (c->block_kind == kind && kind == 1)
        return;
    stream_close_block(b);
    cJSON *start = event("content_block_start"), *cb = cJSON_CreateObject();
    cJSON_AddNumberToObject(start, "index", c->block);
    cJSON_AddItemToObject(start, "content_block", cb);
    if (kind == 1) {
        cJSON_AddStringToObject(cb, "type", "text");
        cJSON_AddStringToObject(cb, "text", "");
    } else {
        char tid[64];
        tool_id(tid, sizeof tid, id);
        cJSON_AddStringToObject(cb, "type", "tool_use");
        cJSON_AddStringToObject(cb, "id", tid);
        cJSON_AddStringToObject(cb, "name", name);
        cJSON_AddObjectToObject(cb, "input");
    }
    serve_add_event(b->out, "content_block_start", start);
    c->block_kind = kind;
}

static void stream_delta(block_stream *b, const char *type, const char *key, const char *text, size_t len) {
    cJSON *delta = event("content_block_delta"), *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(delta, "index", b->j->calls.block);
    cJSON_AddItemToObject(delta, "delta", d);
    cJSON_AddStringToObject(d, "type", type);
    char *copy = strndup(text, len);
    cJSON_AddStringToObject(d, key, copy ? copy : "");
    free(copy);
    serve_add_event(b->out, "content_block_delta", delta);
}

static void stream_text(void *ctx, const char *text, size_t len) {
    block_stream *b = ctx;
    stream_open_block(b, 1, NULL, NULL);
    stream_delta(b, "text_delta", "text", text, len);
}

static void stream_call(void *ctx, int index, const char *id, const char *name, const char *args, size_t len) {
    block_stream *b = ctx;
    (void)index;
    if (!args) /* a call cut short: what went out stays, and stop_reason says max_tokens */
        return;
    if (id)
        stream_open_block(b, 2, id, name);
    if (len)
        stream_delta(b, "input_json_delta", "partial_json", args, len);
}

int serve_anthropic_stream(serve_job *j, serve_buf *out) {
    block_stream b = {.j = j, .out = out};
    const int scanned = serve_reply_scanned(j);
    if (!j->opened) {
        cJSON *start = event("message_start");
        cJSON_AddItemToObject(start, "message", message(j, 0));
        serve_add_event(out, "message_start", start);
        if (!scanned) /* a reply that is all text has its one block from the start */
            stream_open_block(&b, 1, NULL, NULL);
        serve_add_event(out, "ping", event("ping"));
        j->opened = 1;
    }
    if (scanned)
        serve_calls_scan(j, j->done, &(serve_call_sink){stream_text, stream_text, stream_call, &b});
    else if (j->text.len > j->text_sent)
        stream_text(&b, j->text.data + j->text_sent, j->text.len - j->text_sent);
    j->text_sent = j->text.len;
    j->lps_sent = j->n_lps;
    serve_error e;
    if (j->done && serve_job_end_error(j, &e)) {
        serve_add_error_event(out, "error", serve_anthropic_error_json(&e));
    } else if (j->done) {
        stream_close_block(&b);
        cJSON *md = event("message_delta"), *delta = cJSON_AddObjectToObject(md, "delta");
        add_stop(delta, j, j->calls.index);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(md, "usage"), "output_tokens", j->usage.n_generated);
        serve_add_event(out, "message_delta", md);
        serve_add_event(out, "message_stop", event("message_stop"));
    }
    return j->done;
}

char *serve_anthropic_error_json(const serve_error *e) {
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "type", type);
    cJSON_AddStringToObject(err, "message", e->message);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json;
}
