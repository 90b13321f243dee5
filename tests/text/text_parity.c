/* Compares rlx's tokenizer with Hugging Face's on the cases make_cases.js wrote.
 *
 * usage: text_parity MODEL_DIR CASES_DIR
 *
 * cases.bin: "RLXTCAS1", then cases until a kind of 0xFFFFFFFF. A case is
 *   u32 kind (0 encode, 1 decode only), u32 flags (1 parse special, 2 skip special when decoding,
 *   4 Hugging Face's decode gives back the text, 8 encoded with add_special_tokens: the BOS/EOS
 *   the model's files ask for), name, text (u32 length + bytes each),
 *   u32 n, n int32 ids, decoded text (u32 length + bytes); all little-endian.
 * For an encode case the ids must match, decoding them must give Hugging Face's text, and the
 * streaming decoder fed one id at a time must emit only whole UTF-8 characters adding up to the
 * same text, and an encoding limited to fewer ids than the text has must stop with a prefix of
 * Hugging Face's ids. chat.json holds conversations with the Jinja rendering and its ids: the
 * rendering must match, and so must its ids when the template's markup alone holds special
 * tokens (rlx_chat_render_spans); a message holding special-token text keeps it as text. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "read_file.h"
#include "rlx/text.h"

static int failures, passes;
static size_t limited_total, limited_kept; /* ids asked for and given by limited encodings */

static void fail(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(const char *name, const char *fmt, ...) {
    if (++failures <= 40) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL %s: ", name);
        vprintf(fmt, ap);
        putchar('\n');
        va_end(ap);
    }
}

/* 1 when s[0, n) is valid UTF-8 (written out again here: librlx's helper is not exported). */
static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned b = s[i], need, lo = 0x80, hi = 0xBF;
        if (b < 0x80) {
            i++;
            continue;
        }
        if (b >= 0xC2 && b <= 0xDF)
            need = 1;
        else if (b >= 0xE0 && b <= 0xEF)
            need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
        else if (b >= 0xF0 && b <= 0xF4)
            need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
        else
            return 0;
        if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (unsigned k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += need + 1;
    }
    return 1;
}

typedef struct reader {
    const unsigned char *p, *end;
    int bad;
} reader;

static uint32_t rd_u32(reader *r) {
    if (r->end - r->p < 4) {
        r->bad = 1;
        return 0xFFFFFFFF;
    }
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

static const char *rd_bytes(reader *r, size_t *len) {
    *len = rd_u32(r);
    if (r->bad || (size_t)(r->end - r->p) < *len) {
        r->bad = 1;
        return "";
    }
    const char *s = (const char *)r->p;
    r->p += *len;
    return s;
}

static void show_ids(const char *label, const int32_t *ids, size_t n, size_t at) {
    size_t lo = at > 4 ? at - 4 : 0, hi = at + 5 < n ? at + 5 : n;
    printf("    %s[%zu..%zu):", label, lo, hi);
    for (size_t i = lo; i < hi; i++)
        printf(" %d", ids[i]);
    printf("%s\n", hi < n ? " ..." : "");
}

/* Streams ids through a detokenizer; every chunk must be whole characters and the chunks must add
 * up to want. */
static int check_stream(const rlx_tokenizer *tok, const char *name, const int32_t *ids, size_t n, unsigned flags,
                        const char *want, size_t want_len) {
    rlx_detok *d;
    if (rlx_detok_create(tok, flags, &d) != RLX_OK) {
        fail(name, "rlx_detok_create: %s", rlx_last_error());
        return 0;
    }
    char *acc = malloc(want_len + 64);
    size_t acc_len = 0, cap = want_len + 64;
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *t;
        size_t len;
        rlx_status st = i < n ? rlx_detok_push(d, ids[i], &t, &len) : rlx_detok_flush(d, &t, &len);
        if (st != RLX_OK) {
            fail(name, "streaming decoder: %s", rlx_last_error());
            ok = 0;
            break;
        }
        if (!utf8_valid((const unsigned char *)t, len)) {
            fail(name, "streaming decoder emitted a partial UTF-8 character after id %zu", i);
            ok = 0;
        }
        if (acc_len + len > cap) {
            cap = (acc_len + len) * 2;
            acc = realloc(acc, cap);
        }
        memcpy(acc + acc_len, t, len);
        acc_len += len;
    }
    if (ok && (acc_len != want_len || memcmp(acc, want, want_len) != 0)) {
        fail(name, "streamed text (%zu bytes) differs from the decoded text (%zu bytes)", acc_len, want_len);
        ok = 0;
    }
    free(acc);
    rlx_detok_destroy(d);
    return ok;
}

/* Encoding limited to fewer ids than the n_want the text has (half of them, and all but one)
 * stops early with a prefix of the full encoding that stops short of the limit only where a long
 * word alone would pass it. */
static int check_limited(const rlx_tokenizer *tok, const char *name, const char *text, size_t text_len, int special,
                         int add_special, const int32_t *want, size_t n_want) {
    const size_t limits[] = {n_want / 2, n_want - 1};
    for (size_t k = 0; k < 2; k++) {
        rlx_encode_options eo = {
            .size = sizeof eo, .parse_special = special, .max_ids = limits[k], .add_special = add_special};
        int32_t *ids = NULL;
        size_t n = 0;
        int truncated = 0;
        if (rlx_tokenizer_encode_ex(tok, text, text_len, &eo, &ids, &n, &truncated) != RLX_OK) {
            fail(name, "encode with max_ids %zu: %s", limits[k], rlx_last_error());
            return 0;
        }
        int ok = truncated && n <= limits[k] && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
        free(ids);
        if (!ok) {
            fail(name, "max_ids %zu of %zu: truncated %d, %zu ids, not a prefix of the full encoding", limits[k],
                 n_want, truncated, n);
            return 0;
        }
        limited_total += limits[k];
        limited_kept += n;
    }
    return 1;
}

static int run_cases(const rlx_tokenizer *tok, const char *path, size_t *n_texts, size_t *n_bytes, size_t *roundtrips) {
    size_t len;
    unsigned char *data = (unsigned char *)test_read_file(path, &len);
    if (!data || len < 8 || memcmp(data, "RLXTCAS1", 8) != 0) {
        printf("cannot read %s\n", path);
        free(data);
        return -1;
    }
    reader r = {data + 8, data + len, 0};
    for (;;) {
        uint32_t kind = rd_u32(&r);
        if (kind == 0xFFFFFFFF || r.bad)
            break;
        uint32_t flags = rd_u32(&r);
        size_t name_len, text_len, dec_len;
        const char *name_raw = rd_bytes(&r, &name_len);
        const char *text = rd_bytes(&r, &text_len);
        size_t n_ids = rd_u32(&r);
        if (r.bad || (size_t)(r.end - r.p) / 4 < n_ids)
            break;
        int32_t *want = malloc(n_ids * sizeof *want + 4);
        memcpy(want, r.p, n_ids * 4);
        r.p += n_ids * 4;
        const char *dec = rd_bytes(&r, &dec_len);
        if (r.bad) {
            free(want);
            break;
        }
        char name[160];
        snprintf(name, sizeof name, "%.*s", (int)(name_len < 150 ? name_len : 150), name_raw);
        unsigned dflags = (flags & 2) ? RLX_DECODE_SKIP_SPECIAL : 0;
        int ok = 1;
        if (kind == 0) {
            int32_t *ids = NULL;
            size_t n = 0;
            (*n_texts)++;
            *n_bytes += text_len;
            rlx_encode_options eo = {.size = sizeof eo, .parse_special = flags & 1, .add_special = (flags & 8) != 0};
            if (rlx_tokenizer_encode_ex(tok, text, text_len, &eo, &ids, &n, NULL) != RLX_OK) {
                fail(name, "encode: %s", rlx_last_error());
                ok = 0;
            } else {
                size_t at = 0;
                while (at < n && at < n_ids && ids[at] == want[at])
                    at++;
                if (at < n || at < n_ids) {
                    fail(name, "ids differ at %zu (rlx %zu ids, Hugging Face %zu)", at, n, n_ids);
                    if (failures <= 40) {
                        show_ids("rlx ", ids, n, at);
                        show_ids("hf  ", want, n_ids, at);
                    }
                    ok = 0;
                }
            }
            free(ids);
            if (ok && n_ids >= 2)
                ok = check_limited(tok, name, text, text_len, flags & 1, (flags & 8) != 0, want, n_ids);
        }
        char *text_out = NULL;
        size_t out_len = 0;
        if (ok && rlx_tokenizer_decode(tok, want, n_ids, dflags, &text_out, &out_len) != RLX_OK) {
            fail(name, "decode: %s", rlx_last_error());
            ok = 0;
        } else if (ok && (out_len != dec_len || memcmp(text_out, dec, dec_len) != 0)) {
            fail(name, "decoded text differs from Hugging Face's (%zu vs %zu bytes)", out_len, dec_len);
            ok = 0;
        } else if (ok && kind == 0 && (flags & 4)) {
            if (out_len != text_len || memcmp(text_out, text, text_len) != 0) {
                fail(name, "decoding does not give the text back");
                ok = 0;
            } else {
                (*roundtrips)++;
            }
        }
        if (ok)
            ok = check_stream(tok, name, want, n_ids, dflags, dec, dec_len);
        free(text_out);
        free(want);
        if (ok)
            passes++;
    }
    int bad = r.bad;
    free(data);
    if (bad) {
        printf("%s is truncated\n", path);
        return -1;
    }
    return 0;
}

/* Counts the special ids among ids[0, n). */
static size_t count_special(const rlx_tokenizer *tok, const int32_t *ids, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)rlx_tokenizer_is_special(tok, ids[i]);
    return k;
}

/* 1 when a message's content or reasoning holds text that encodes to a special token. */
static int content_has_special(const rlx_tokenizer *tok, const rlx_chat_message *m, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            const char *t = k ? m[i].reasoning_content : m[i].content;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (t && rlx_tokenizer_encode(tok, t, strlen(t), 1, &ids, &n_ids) == RLX_OK &&
                count_special(tok, ids, n_ids)) {
                free(ids);
                return 1;
            }
            free(ids);
        }
    return 0;
}

/* A rendering whose messages hold special-token text: its special ids are exactly those of the
 * markup, and the ids still decode to the rendering (the message text is there as characters). */
static int check_special_stays_text(const rlx_tokenizer *tok, const char *name, const char *out,
                                    const rlx_text_span *markup, size_t n_markup, const int32_t *ids, size_t n_ids) {
    size_t in_markup = 0;
    for (size_t k = 0; k < n_markup; k++) {
        int32_t *mids = NULL;
        size_t n_m = 0;
        if (rlx_tokenizer_encode(tok, out + markup[k].off, markup[k].len, 1, &mids, &n_m) == RLX_OK)
            in_markup += count_special(tok, mids, n_m);
        free(mids);
    }
    char *text = NULL;
    size_t len = 0;
    int ok = count_special(tok, ids, n_ids) == in_markup &&
             rlx_tokenizer_decode(tok, ids, n_ids, 0, &text, &len) == RLX_OK && len == strlen(out) &&
             memcmp(text, out, len) == 0;
    if (!ok)
        fail(name,
             "special-token text in a message: %zu special ids where the markup has %zu, or the ids do not "
             "decode to the rendering",
             count_special(tok, ids, n_ids), in_markup);
    free(text);
    return ok;
}

static int run_chat(const rlx_tokenizer *tok, const char *path) {
    size_t len;
    char *data = test_read_file(path, &len);
    cJSON *root = data ? cJSON_Parse(data) : NULL;
    free(data);
    if (!cJSON_IsArray(root)) {
        printf("cannot read %s\n", path);
        cJSON_Delete(root);
        return -1;
    }
    if (!root->child) { /* no chat cases for this model */
        cJSON_Delete(root);
        return 0;
    }
    if (rlx_chat_template_of(tok) != RLX_CHAT_TEMPLATE_JINJA)
        fail("chat", "the Jinja engine does not parse the model's template");
    int index = 0;
    for (const cJSON *c = root->child; c; c = c->next, index++) {
        char name[32];
        snprintf(name, sizeof name, "chat %d", index);
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        size_t n = (size_t)cJSON_GetArraySize(msgs);
        rlx_chat_message *m = calloc(n + 1, sizeof *m);
        size_t k = 0;
        for (const cJSON *e = msgs->child; e; e = e->next, k++) {
            const cJSON *rc = cJSON_GetObjectItem(e, "reasoning_content");
            m[k].role = cJSON_GetObjectItem(e, "role")->valuestring;
            m[k].content = cJSON_GetObjectItem(e, "content")->valuestring;
            m[k].reasoning_content = cJSON_IsString(rc) ? rc->valuestring : NULL;
        }
        const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
        int add_gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        int enable_thinking = !cJSON_IsFalse(think);
        const char *expected = cJSON_GetObjectItem(c, "expected")->valuestring;
        char *out = NULL;
        rlx_text_span *markup = NULL;
        size_t n_markup = 0;
        int ok = 1;
        if (rlx_chat_render_spans(tok, m, n, add_gen, enable_thinking, &out, &markup, &n_markup) != RLX_OK) {
            fail(name, "render: %s", rlx_last_error());
            ok = 0;
        } else if (strcmp(out, expected) != 0) {
            fail(name, "rendering differs from Jinja's");
            printf("    rlx:   %s\n    jinja: %s\n", out, expected);
            ok = 0;
        } else {
            int32_t *ids = NULL;
            size_t n_ids = 0;
            const cJSON *want = cJSON_GetObjectItem(c, "ids");
            rlx_encode_options eo = {.size = sizeof eo, .special_spans = markup, .n_special_spans = n_markup};
            if (rlx_tokenizer_encode_ex(tok, out, strlen(out), &eo, &ids, &n_ids, NULL) != RLX_OK) {
                fail(name, "encode with the markup spans: %s", rlx_last_error());
                ok = 0;
            } else if (content_has_special(tok, m, n)) {
                ok = check_special_stays_text(tok, name, out, markup, n_markup, ids, n_ids);
            } else if (n_ids != (size_t)cJSON_GetArraySize(want)) {
                fail(name, "ids of the rendering differ in number");
                ok = 0;
            } else {
                size_t i = 0;
                for (const cJSON *w = want->child; w; w = w->next, i++)
                    if (ids[i] != w->valueint) {
                        fail(name, "ids of the rendering differ at %zu", i);
                        ok = 0;
                        break;
                    }
            }
            free(ids);
        }
        free(out);
        free(markup);
        free(m);
        if (ok)
            passes++;
    }
    cJSON_Delete(root);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: text_parity MODEL_DIR CASES_DIR\n");
        return 2;
    }
    rlx_tokenizer *tok;
    if (rlx_tokenizer_open(argv[1], &tok) != RLX_OK) {
        printf("cannot load the tokenizer: %s\n", rlx_last_error());
        return 1;
    }
    char path[4096];
    size_t n_texts = 0, n_bytes = 0, roundtrips = 0;
    snprintf(path, sizeof path, "%s/cases.bin", argv[2]);
    int rc = run_cases(tok, path, &n_texts, &n_bytes, &roundtrips);
    snprintf(path, sizeof path, "%s/chat.json", argv[2]);
    if (rc == 0)
        rc = run_chat(tok, path);
    rlx_tokenizer_close(tok);
    if (rc != 0)
        return 1;
    if (failures > 40)
        printf("... and %d more failures\n", failures - 40);
    printf("encoded %zu texts (%zu bytes); %zu decode back to their text exactly\n", n_texts, n_bytes, roundtrips);
    printf("limited encodings kept %zu of the %zu ids they allowed\n", limited_kept, limited_total);
    printf("text parity: %d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
