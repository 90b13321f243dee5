/* Request bodies (serve.h): strict JSON objects, and typed members read with the errors every
 * endpoint answers alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

/* A member of the request that may be absent: NULL when missing or null, as OpenAI reads both. */
const cJSON *serve_member(const cJSON *root, const char *name) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    return item && !cJSON_IsNull(item) ? item : NULL;
}

int serve_bad(serve_error *e, const char *param, const char *fmt, const char *what) {
    serve_error_set(e, 400, "invalid_request_error", "invalid_value", param, fmt, param, what);
    return -1;
}

/* A number member in [lo, hi]: 1 when given, 0 when absent, -1 after setting e. */
int serve_get_number(const cJSON *root, const char *name, double lo, double hi, double *out, serve_error *e) {
    const cJSON *item = serve_member(root, name);
    if (!item)
        return 0;
    char range[64];
    snprintf(range, sizeof range, "from %g to %g", lo, hi);
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble) || item->valuedouble < lo || item->valuedouble > hi)
        return serve_bad(e, name, "'%s' must be a number %s", range);
    *out = item->valuedouble;
    return 1;
}

/* An integer member in [lo, hi] (JSON numbers are doubles: exact up to 2^53). */
int serve_get_integer(const cJSON *root, const char *name, double lo, double hi, double *out, serve_error *e) {
    const cJSON *item = serve_member(root, name);
    if (!item)
        return 0;
    char range[64];
    snprintf(range, sizeof range, "from %.0f to %.0f", lo, hi);
    double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    if (!isfinite(v) || v != floor(v) || v < lo || v > hi)
        return serve_bad(e, name, "'%s' must be an integer %s", range);
    *out = v;
    return 1;
}

int serve_get_bool(const cJSON *root, const char *name, int *out, serve_error *e) {
    const cJSON *item = serve_member(root, name);
    if (!item)
        return 0;
    if (!cJSON_IsBool(item))
        return serve_bad(e, name, "'%s' must be %s", "true or false");
    *out = cJSON_IsTrue(item);
    return 1;
}

int serve_get_string(const cJSON *root, const char *name, const char **out, serve_error *e) {
    const cJSON *item = serve_member(root, name);
    if (!item)
        return 0;
    if (!cJSON_IsString(item))
        return serve_bad(e, name, "'%s' must be %s", "a string");
    *out = item->valuestring;
    return 1;
}

/* The first NUL in the body, raw or as the escape \u0000 in a string, or NULL. cJSON hands out
 * C strings, which a NUL would cut short without a word. body[0, len) is valid JSON, so quotes
 * outside strings and backslashes inside them are its syntax. */
static const char *nul_character(const char *body, size_t len) {
    const char *raw = memchr(body, '\0', len), *end = body + len;
    if (raw)
        return raw;
    int in_string = 0;
    for (const char *p = body; p < end; p++) {
        if (*p == '"')
            in_string = !in_string;
        else if (in_string && *p == '\\') {
            if (end - p >= 6 && memcmp(p + 1, "u0000", 5) == 0)
                return p;
            p++; /* the escaped character, which may be a quote */
        }
    }
    return NULL;
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A key that an object of the tree holds twice (cJSON would keep both and read the first), or
 * NULL; *failed is set when out of memory. Sorted names: an object of n keys costs n log n. */
static const char *duplicate_key(const cJSON *item, int *failed) {
    const int n = cJSON_IsObject(item) ? cJSON_GetArraySize(item) : 0;
    const char *found = NULL;
    if (n > 1) {
        const char **names = malloc((size_t)n * sizeof *names);
        if (!names) {
            *failed = 1;
            return NULL;
        }
        int k = 0;
        for (const cJSON *c = item->child; c; c = c->next)
            names[k++] = c->string;
        qsort(names, (size_t)n, sizeof *names, by_name);
        for (int i = 1; i < n && !found; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                found = names[i];
        free(names);
    }
    for (const cJSON *c = item->child; c && !found && !*failed; c = c->next)
        found = duplicate_key(c, failed);
    return found;
}

/* The body as a JSON object, or NULL after setting e: invalid JSON (with the byte where it
 * stops, this request's own), anything after the value, a NUL in it, a key given twice. */
cJSON *serve_parse_body(const char *body, size_t len, serve_error *e) {
    const char *end = body;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        serve_error_set(e, 400, "invalid_request_error", "invalid_json", "",
                        "the body is not valid JSON (error near byte %zu)", (size_t)(end - body));
        return NULL;
    }
    size_t trailing = (size_t)(end - body); /* the body need not end in a NUL: no strspn */
    while (trailing < len && strchr(" \t\r\n", body[trailing]) && body[trailing])
        trailing++;
    const char *nul = nul_character(body, len);
    const char *twice = NULL;
    int failed = 0;
    if (trailing < len && (!nul || nul >= end))
        serve_error_set(e, 400, "invalid_request_error", "invalid_json", "",
                        "the body has data after its JSON value (at byte %zu)", trailing);
    else if (nul)
        serve_error_set(e, 400, "invalid_request_error", "invalid_value", "",
                        "the body holds a NUL character (at byte %zu): text must not contain U+0000",
                        (size_t)(nul - body));
    else if (!cJSON_IsObject(root))
        serve_error_set(e, 400, "invalid_request_error", "invalid_json", "", "the body must be a JSON object");
    else if ((twice = duplicate_key(root, &failed)) != NULL)
        serve_error_set(e, 400, "invalid_request_error", "invalid_json", "",
                        "the body gives the key '%.64s' twice in one object", twice);
    else if (failed)
        serve_error_set(e, 500, "server_error", NULL, "", "out of memory");
    else
        return root;
    cJSON_Delete(root);
    return NULL;
}
