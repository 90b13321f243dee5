/* UTF-8 validation and decoding, White_Space, and NFC through utf8proc. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text_internal.h"

size_t rlx__utf8_check(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF; /* bounds of the second byte (Unicode Table 3-7) */
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0)
                lo = 0xA0;
            else if (b == 0xED)
                hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0)
                lo = 0x90;
            else if (b == 0xF4)
                hi = 0x8F;
        } else {
            return i;
        }
        if (len - i <= need)
            return i;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return i;
        i += need + 1;
    }
    return len;
}

uint32_t rlx__utf8_decode(const uint8_t *s, size_t *n) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *n = 1;
        return b;
    }
    if (b < 0xE0) {
        *n = 2;
        return ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (b < 0xF0) {
        *n = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

int rlx__unicode_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

rlx_status rlx__nfc(const char *s, size_t len, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    utf8proc_uint8_t *dst = NULL;
    /* With an explicit length (no UTF8PROC_NULLTERM) embedded NUL bytes are ordinary characters. */
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {
        if (n == UTF8PROC_ERROR_NOMEM)
            return rlx_error(RLX_E_NOMEM, "NFC normalisation of %zu bytes: out of memory", len);
        return rlx_error(RLX_E_INTERNAL, "NFC normalisation failed: %s", utf8proc_errmsg(n));
    }
    *out = (char *)dst;
    *out_len = (size_t)n;
    return RLX_OK;
}
