/* JSON files and values: see json.h. */
#include "util/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/alloc.h"

/* Far above any config or safetensors index (a 20000-tensor index is ~2 MB); more is a wrong file. */
#define JSON_MAX_BYTES (64 << 20)
/* 2^53: beyond it a JSON number parsed into a double no longer holds every integer. */
#define JSON_EXACT_INT 9007199254740992.0

int rlx__json_int(const cJSON *item, int64_t *out) {
    if (!cJSON_IsNumber(item))
        return 0;
    double v = item->valuedouble;
    if (!(v >= -JSON_EXACT_INT && v <= JSON_EXACT_INT)) /* also rejects NaN and infinities */
        return 0;
    int64_t i = (int64_t)v;
    if ((double)i != v)
        return 0;
    *out = i;
    return 1;
}

int rlx__json_u64(const cJSON *item, uint64_t *out) {
    int64_t v;
    if (!rlx__json_int(item, &v) || v < 0)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

/* A parse error's byte offset as "line L, column C (byte B)", which is what an editor can jump to. */
static rlx_status malformed(const char *path, const char *text, size_t offset) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < offset; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return rlx_error(RLX_E_FORMAT, "%s: malformed JSON at line %zu, column %zu (byte %zu)", path, line, col, offset);
}

rlx_status rlx__json_load(const char *path, int missing_ok, cJSON **out) {
    *out = NULL;
    rlx_status st = RLX_OK;
    char *text = NULL;
    size_t len = 0;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (missing_ok && errno == ENOENT)
            return RLX_OK;
        return rlx_error(RLX_E_IO, "%s: %s", path, strerror(errno));
    }
    if (fstat(fd, &sb) != 0) {
        st = rlx_error(RLX_E_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = rlx_error(RLX_E_IO, "%s: not a regular file", path);
        goto fail;
    }
    if (sb.st_size > JSON_MAX_BYTES) {
        st = rlx_error(RLX_E_FORMAT, "%s: %lld bytes is too large for a JSON file rlx reads (limit %d)", path,
                       (long long)sb.st_size, JSON_MAX_BYTES);
        goto fail;
    }
    text = rlx__malloc((size_t)sb.st_size + 1);
    if (!text) {
        st = rlx_error(RLX_E_NOMEM, "%s: cannot allocate %lld bytes", path, (long long)sb.st_size + 1);
        goto fail;
    }
    while (len < (size_t)sb.st_size) {
        ssize_t got = read(fd, text + len, (size_t)sb.st_size - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            st = rlx_error(RLX_E_IO, "%s: %s", path, strerror(errno));
            goto fail;
        }
        if (got == 0) /* the file shrank since fstat: parse what is there */
            break;
        len += (size_t)got;
    }
    text[len] = '\0';
    /* The terminator is part of the buffer so cJSON checks that nothing but whitespace follows. */
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (!*out)
        st = malformed(path, text, end ? (size_t)(end - text) : 0);
fail:
    free(text);
    close(fd);
    return st;
}

void rlx__json_describe(const cJSON *item, char *buf, size_t size) {
    if (cJSON_IsNumber(item))
        snprintf(buf, size, "%g", item->valuedouble);
    else if (cJSON_IsString(item))
        snprintf(buf, size, "the string \"%.40s\"", item->valuestring);
    else if (cJSON_IsBool(item))
        snprintf(buf, size, "%s", cJSON_IsTrue(item) ? "true" : "false");
    else if (cJSON_IsNull(item))
        snprintf(buf, size, "null");
    else
        snprintf(buf, size, "%s", cJSON_IsArray(item) ? "an array" : "an object");
}
