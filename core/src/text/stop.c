/* Stop strings over streamed text. The matcher keeps the bytes it has not shown yet: after each
 * push it looks for a stop string completing in the new bytes (nothing before them can: every
 * byte shown or dropped earlier was checked), and otherwise holds back the longest tail that is
 * a proper prefix of some stop string. No stop string can start before that tail, since the
 * text from any earlier byte is neither a full match nor a prefix, so the rest is safe to show.
 * A push costs O(bytes pushed + held) * total stop-string bytes. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/text.h"
#include "util/alloc.h"

struct rlx_stop_matcher {
    char **stops; /* [n], one allocation after the array */
    size_t *lens; /* [n] */
    size_t n;
    size_t max_len;
    char *buf; /* buf[shown, len) is held back; buf[0, shown) went out with the last call */
    size_t cap, len, shown;
    int stopped;
};

rlx_status rlx_stop_matcher_create(const char *const *stops, size_t n, rlx_stop_matcher **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_stop_matcher_create: out is NULL");
    *out = NULL;
    if (!stops || n == 0)
        return rlx_error(RLX_E_INVALID, "a stop matcher needs at least one stop string");
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0])
            return rlx_error(RLX_E_INVALID, "stop string %zu is %s: it would stop before any text", i,
                             stops[i] ? "empty" : "NULL");
        bytes += strlen(stops[i]) + 1;
    }
    rlx_stop_matcher *m = rlx__calloc(1, sizeof *m);
    if (!m || !(m->stops = rlx__malloc(n * sizeof *m->stops + bytes)) ||
        !(m->lens = rlx__malloc(n * sizeof *m->lens))) {
        rlx_stop_matcher_destroy(m);
        return rlx_error(RLX_E_NOMEM, "stop matcher: out of memory for %zu stop strings", n);
    }
    char *text = (char *)(m->stops + n);
    for (size_t i = 0; i < n; i++) {
        m->lens[i] = strlen(stops[i]);
        memcpy(text, stops[i], m->lens[i] + 1);
        m->stops[i] = text;
        text += m->lens[i] + 1;
        if (m->lens[i] > m->max_len)
            m->max_len = m->lens[i];
    }
    m->n = n;
    *out = m;
    return RLX_OK;
}

void rlx_stop_matcher_destroy(rlx_stop_matcher *m) {
    if (!m)
        return;
    free(m->stops);
    free(m->lens);
    free(m->buf);
    free(m);
}

/* The start of the stop string that completes first at an end in (from, len], the one starting
 * first among those ending together; -1 when none does. */
static ptrdiff_t first_match(const rlx_stop_matcher *m, size_t from) {
    for (size_t end = from + 1; end <= m->len; end++) {
        ptrdiff_t start = -1;
        for (size_t i = 0; i < m->n; i++) {
            size_t l = m->lens[i];
            int earlier = start < 0 || (ptrdiff_t)(end - l) < start;
            if (l <= end && earlier && memcmp(m->buf + end - l, m->stops[i], l) == 0)
                start = (ptrdiff_t)(end - l);
        }
        if (start >= 0)
            return start;
    }
    return -1;
}

/* The length of the longest tail of the text that is a proper prefix of a stop string. */
static size_t held_tail(const rlx_stop_matcher *m) {
    size_t longest = m->max_len - 1 < m->len ? m->max_len - 1 : m->len;
    for (size_t t = longest; t > 0; t--)
        for (size_t i = 0; i < m->n; i++)
            if (m->lens[i] > t && memcmp(m->buf + m->len - t, m->stops[i], t) == 0)
                return t;
    return 0;
}

rlx_status rlx_stop_matcher_push(rlx_stop_matcher *m, const char *text, size_t len, const char **emit, size_t *emit_len,
                                 int *stopped) {
    if (!m || (!text && len) || !emit || !emit_len || !stopped)
        return rlx_error(RLX_E_INVALID, "rlx_stop_matcher_push: NULL argument");
    *emit = m->buf ? m->buf : "";
    *emit_len = 0;
    *stopped = m->stopped;
    if (m->stopped)
        return RLX_OK;
    size_t held = m->len - m->shown;
    if (held + len > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < held + len)
            cap *= 2;
        char *grown = rlx__malloc(cap);
        if (!grown)
            return rlx_error(RLX_E_NOMEM, "stop matcher: out of memory for %zu bytes of text", held + len);
        if (held)
            memcpy(grown, m->buf + m->shown, held);
        free(m->buf);
        m->buf = grown;
        m->cap = cap;
    } else if (held) {
        memmove(m->buf, m->buf + m->shown, held);
    }
    if (len)
        memcpy(m->buf + held, text, len);
    m->len = held + len;
    m->shown = 0;
    ptrdiff_t stop = first_match(m, held);
    if (stop >= 0) {
        m->stopped = *stopped = 1;
        m->len = m->shown = (size_t)stop; /* the stop string and what follows are dropped */
    } else {
        m->shown = m->len - held_tail(m);
    }
    *emit = m->buf ? m->buf : "";
    *emit_len = m->shown;
    return RLX_OK;
}

void rlx_stop_matcher_flush(rlx_stop_matcher *m, const char **emit, size_t *emit_len) {
    *emit = m->buf ? m->buf + m->shown : "";
    *emit_len = m->len - m->shown;
    m->shown = m->len;
}

void rlx_stop_matcher_reset(rlx_stop_matcher *m) {
    m->len = m->shown = 0;
    m->stopped = 0;
}
