/* What every part of rlx serve uses (serve.h): errors in OpenAI's shape and growable buffers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

void serve_error_set(serve_error *e, unsigned status, const char *type, const char *code, const char *param,
                     const char *fmt, ...) {
    *e = (serve_error){.status = status, .type = type, .code = code};
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *serve_error_json(const serve_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type);
    if (*e->param)
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json;
}

void serve_buf_append(serve_buf *b, const char *data, size_t len) {
    if (b->failed || !len)
        return;
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->len + len + 1) * 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void serve_buf_free(serve_buf *b) {
    free(b->data);
    *b = (serve_buf){0};
}

void serve_buf_printf(serve_buf *b, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    serve_buf_append(b, line, n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}
