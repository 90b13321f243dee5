/* What every plugin includes (through its kind's header: backend_iface.h, transport_iface.h or
 * speculator_iface.h): the descriptor and host table of the plugin ABI, and static inline helpers
 * a plugin would otherwise write again, so that a plugin needs nothing of librlx at link time.
 *
 * The helpers here parse the "key=value,key=value" option strings every kind receives. They
 * report errors into a caller buffer rather than through a host, so a plugin words the final
 * message itself (usually `host->error(rc, "name: %s", err)`). Everything declared here is
 * either a type or static inline; nothing needs an RLX_API symbol. */
#ifndef RLX_PLUGIN_IFACE_H
#define RLX_PLUGIN_IFACE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RLX_ABI_MAJOR 1
#define RLX_ABI_MINOR 8

#define RLX_PLUGIN_EXPORT __attribute__((visibility("default")))
#define RLX_PLUGIN_ENTRY_SYMBOL "rlx_plugin_entry"

/* True when a table of type T that reports `size` bytes contains member m. */
#define RLX_HAS(T, p, m) ((p)->size >= offsetof(T, m) + sizeof(((T *)0)->m))

typedef enum rlx_plugin_kind {
    RLX_PLUGIN_BACKEND = 1,
    RLX_PLUGIN_TRANSPORT = 2,
    RLX_PLUGIN_SPECULATOR = 3
} rlx_plugin_kind;

/* Log levels. The application decides what it prints (rlx shows RLX_LOG_DEBUG only with -v),
 * so the level is how a plugin says who a line is for: RLX_LOG_DEBUG is detail only a verbose
 * run wants, such as what a library the plugin wraps logs itself. */
enum { RLX_LOG_ERROR = 0, RLX_LOG_WARN = 1, RLX_LOG_INFO = 2, RLX_LOG_DEBUG = 3 };

/* The core's services for plugins. Valid from rlx_plugin_entry until the plugin is unloaded. */
typedef struct rlx_host {
    uint32_t size;      /* sizeof(rlx_host) of the core */
    uint32_t abi_major; /* RLX_ABI_MAJOR of the core */
    uint32_t abi_minor; /* RLX_ABI_MINOR of the core */
    uint32_t reserved;
    /* Logs one line (no trailing newline needed). Thread-safe. */
    void (*log)(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* Records the calling thread's error detail and returns status, like rlx_error(). */
    int (*error)(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    /* Aligned allocation (align a power of two >= sizeof(void *)); NULL on failure.
     * Memory from alloc is released with free, by whichever side holds it last; free(NULL) is
     * a no-op. */
    void *(*alloc)(size_t size, size_t align);
    void (*free)(void *p);
} rlx_host;

/* The descriptor a plugin returns. Must stay valid until the plugin is unloaded. */
typedef struct rlx_plugin {
    uint32_t size;       /* sizeof(rlx_plugin) the plugin was built with */
    uint32_t abi_major;  /* RLX_ABI_MAJOR the plugin was built with */
    uint32_t abi_minor;  /* RLX_ABI_MINOR the plugin was built with */
    uint32_t kind;       /* rlx_plugin_kind */
    const char *name;    /* matched case-insensitively, e.g. "cpu-blas" */
    const char *version; /* the plugin's own version, e.g. "0.1.0" */
    const char *summary; /* one line for `rlx plugins` */
    const void *iface;   /* the kind's table: rlx_backend_iface for RLX_PLUGIN_BACKEND */
} rlx_plugin;

/* The entry point every plugin exports. Returns NULL if the plugin cannot run with this host
 * (it may call host->error first to say why). */
typedef const rlx_plugin *(*rlx_plugin_entry_fn)(const rlx_host *host);

/* Formats a helper's error message into err (err_size bytes, terminated when err_size > 0,
 * truncated to fit). For the helpers' own use, as `return rlx_iface__message(...), RLX_E_INVALID;`:
 * it returns nothing because a variadic function is never inlined, and the compiler must see
 * the constant status to know what a caller's success path has set. */
static inline void rlx_iface__message(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void rlx_iface__message(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

/* ---- option strings: "key=value" items separated by commas ---- */

/* The longest option value the scanner accepts (a path fits). */
#define RLX_IFACE_OPTION_VALUE_MAX 4096

/* One item of an option string. key and item point into the scanned string. */
typedef struct rlx_iface_option {
    const char *item; /* the whole item, for messages: item_len bytes, not terminated */
    int item_len;
    const char *key; /* key_len bytes (at least 1), not terminated */
    size_t key_len;
    char value[RLX_IFACE_OPTION_VALUE_MAX]; /* terminated copy, value_len bytes (at least 1) */
    size_t value_len;
} rlx_iface_option;

/* Reads the item at *cursor (a NULL or empty *cursor has none) and moves *cursor past it and its
 * comma. Returns 1 with *opt filled, 0 when no item is left, or RLX_E_INVALID with a message in
 * err (err_size bytes, always terminated when err_size > 0; it quotes the item, or only the key
 * when the value is at fault) for an item
 * without '=', with an empty key, or with an empty or over-long value. Which keys exist and
 * what their values may be is left to the caller (see rlx_iface_option_is and the parsers
 * below). */
static inline int rlx_iface_option_next(const char **cursor, rlx_iface_option *opt, char *err, size_t err_size) {
    const char *p = *cursor;
    if (!p || !*p)
        return 0;
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    *cursor = end ? end + 1 : p + len;
    const char *eq = (const char *)memchr(p, '=', len);
    if (!eq || eq == p)
        return rlx_iface__message(err, err_size, "option '%.*s' is not key=value", (int)len, p), RLX_E_INVALID;
    opt->item = p;
    opt->item_len = (int)len;
    opt->key = p;
    opt->key_len = (size_t)(eq - p);
    opt->value_len = len - opt->key_len - 1;
    if (opt->value_len == 0 || opt->value_len >= sizeof opt->value)
        return rlx_iface__message(err, err_size, "option '%.*s' needs a value of 1 to %d bytes", (int)opt->key_len, p,
                                  RLX_IFACE_OPTION_VALUE_MAX - 1),
               RLX_E_INVALID;
    memcpy(opt->value, eq + 1, opt->value_len);
    opt->value[opt->value_len] = '\0';
    return 1;
}

/* Whether the item's key is `key`. */
static inline bool rlx_iface_option_is(const rlx_iface_option *opt, const char *key) {
    return opt->key_len == strlen(key) && !memcmp(opt->key, key, opt->key_len);
}

/* Reads the decimal digits at *p (at least one) into *v and moves *p past them; false when
 * there are none or they overflow. For the parsers below. */
static inline bool rlx_iface__digits(const char **p, unsigned long long *v) {
    const char *c = *p;
    if (*c < '0' || *c > '9')
        return false;
    *v = 0;
    for (; *c >= '0' && *c <= '9'; c++) {
        const unsigned digit = (unsigned)(*c - '0');
        if (*v > (~0ull - digit) / 10)
            return false;
        *v = *v * 10 + digit;
    }
    *p = c;
    return true;
}

/* The value as a decimal integer in [min, max]: an optional '-' then digits only (no spaces, no
 * '+'). Returns true and sets *out, or false (and leaves *out) when it is not one. */
static inline bool rlx_iface_option_int(const rlx_iface_option *opt, long long min, long long max, long long *out) {
    const char *p = opt->value;
    const bool negative = *p == '-';
    p += negative;
    unsigned long long v;
    if (!rlx_iface__digits(&p, &v))
        return false;
    if (*p || v > (unsigned long long)INT64_MAX + negative)
        return false;
    const long long n = negative ? (long long)(0 - v) : (long long)v;
    if (n < min || n > max)
        return false;
    *out = n;
    return true;
}

/* The value as a byte count: digits with an optional K, M or G suffix (powers of 1024, either
 * case), e.g. "64M". Returns true and sets *out when the count is in [min, max], else false. */
static inline bool rlx_iface_option_size(const rlx_iface_option *opt, unsigned long long min, unsigned long long max,
                                         unsigned long long *out) {
    const char *p = opt->value;
    unsigned long long v;
    if (!rlx_iface__digits(&p, &v))
        return false;
    unsigned shift = 0;
    if (*p == 'K' || *p == 'k')
        shift = 10;
    else if (*p == 'M' || *p == 'm')
        shift = 20;
    else if (*p == 'G' || *p == 'g')
        shift = 30;
    if (shift)
        p++;
    if (*p || v > ~0ull >> shift)
        return false;
    v <<= shift;
    if (v < min || v > max)
        return false;
    *out = v;
    return true;
}

#ifdef __cplusplus
}
#endif
#endif
