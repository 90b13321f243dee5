/* Anthropic's Messages API (job.h): POST /v1/messages read as the chat request it is, answered as
 * a message object or a stream of Anthropic's events, with Anthropic's error shape; and
 * /v1/messages/count_tokens. Text only: content blocks other than text (images, documents,
 * tool_use, tool_result) and tools are refused by name, never dropped. */
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

/* Copies member name of from into to (when present), or -1 after setting e. */
static int copy(cJSON *to, const cJSON *from, const char *name, const char *as, serve_error *e) {
    const cJSON *item = serve_member(from, name);
    if (!item)
        return 0;
    cJSON *dup = cJSON_Duplicate(item, 1);
    if (!dup || !cJSON_AddItemToObject(to, as, dup)) {
        cJSON_Delete(dup);
        return serve_error_set(e, 500, "server_error", NULL, "", "out of memory"), -1;
    }
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
    if (serve_member(root, "tools") || serve_member(root, "tool_choice")) {
        serve_error_set(e, 400, "invalid_request_error", "unsupported_value", "tools",
                        "tools are not supported on /v1/messages yet: the reply would be text only");
        return NULL;
    }
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
        if (!(m = new_message(list, role->valuestring, e)) ||
            add_text(m, "content", cJSON_GetObjectItemCaseSensitive(msg, "content"), "messages", e) < 0)
            goto fail;
    }
    const cJSON *stops = serve_member(root, "stop_sequences");
    if (stops && !cJSON_IsArray(stops)) {
        serve_bad(e, "stop_sequences", "'%s' must be %s", "an array of strings");
        goto fail;
    }
    if (copy(out, root, "model", "model", e) < 0 || copy(out, root, "max_tokens", "max_tokens", e) < 0 ||
        copy(out, root, "temperature", "temperature", e) < 0 || copy(out, root, "top_p", "top_p", e) < 0 ||
        copy(out, root, "top_k", "top_k", e) < 0 || copy(out, root, "stream", "stream", e) < 0 ||
        copy(out, root, "stop_sequences", "stop_sequences", e) < 0)
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

static const char *stop_reason(const serve_job *j) {
    return j->stop_hit ? "stop_sequence" : j->finish == RLX_FINISH_EOS ? "end_turn" : "max_tokens";
}

static void add_stop(cJSON *o, const serve_job *j) {
    cJSON_AddStringToObject(o, "stop_reason", stop_reason(j));
    const char *word = serve_job_stop_string(j);
    if (word)
        cJSON_AddStringToObject(o, "stop_sequence", word);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
}

/* The message object; content and the stop fields only when final (message_start has none). */
static cJSON *message(const serve_job *j, int final) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", j->id);
    cJSON_AddStringToObject(root, "type", "message");
    cJSON_AddStringToObject(root, "role", "assistant");
    cJSON_AddStringToObject(root, "model", j->model);
    cJSON *content = cJSON_AddArrayToObject(root, "content");
    if (final) {
        cJSON *block = cJSON_CreateObject();
        cJSON_AddStringToObject(block, "type", "text");
        char *text = strndup(j->text.len ? j->text.data : "", j->text.len);
        cJSON_AddStringToObject(block, "text", text ? text : "");
        free(text);
        cJSON_AddItemToArray(content, block);
        add_stop(root, j);
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

/* An event's object: {"type": type} with index 0 when index. */
static cJSON *event(const char *type, int index) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    if (index)
        cJSON_AddNumberToObject(o, "index", 0);
    return o;
}

int serve_anthropic_stream(serve_job *j, serve_buf *out) {
    if (!j->opened) {
        cJSON *start = event("message_start", 0);
        cJSON_AddItemToObject(start, "message", message(j, 0));
        serve_add_event(out, "message_start", start);
        cJSON *block = event("content_block_start", 1), *cb = cJSON_AddObjectToObject(block, "content_block");
        cJSON_AddStringToObject(cb, "type", "text");
        cJSON_AddStringToObject(cb, "text", "");
        serve_add_event(out, "content_block_start", block);
        serve_add_event(out, "ping", event("ping", 0));
        j->opened = 1;
    }
    if (j->text.len > j->text_sent) {
        cJSON *delta = event("content_block_delta", 1), *d = cJSON_AddObjectToObject(delta, "delta");
        cJSON_AddStringToObject(d, "type", "text_delta");
        char *text = strndup(j->text.data + j->text_sent, j->text.len - j->text_sent);
        cJSON_AddStringToObject(d, "text", text ? text : "");
        free(text);
        serve_add_event(out, "content_block_delta", delta);
        j->text_sent = j->text.len;
    }
    j->lps_sent = j->n_lps;
    serve_error e;
    if (j->done && serve_job_end_error(j, &e)) {
        serve_add_error_event(out, "error", serve_anthropic_error_json(&e));
    } else if (j->done) {
        serve_add_event(out, "content_block_stop", event("content_block_stop", 1));
        cJSON *md = event("message_delta", 0), *delta = cJSON_AddObjectToObject(md, "delta");
        add_stop(delta, j);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(md, "usage"), "output_tokens", j->usage.n_generated);
        serve_add_event(out, "message_delta", md);
        serve_add_event(out, "message_stop", event("message_stop", 0));
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
