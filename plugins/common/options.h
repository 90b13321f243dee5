/* The backends' free-form options (rlx_backend_options.extra): "key=value" items separated by
 * commas. The scanner is shared so every in-tree backend refuses malformed items with the same
 * messages; which keys exist and their ranges stay with each backend. */
#ifndef RLX_PLUGINS_OPTIONS_H
#define RLX_PLUGINS_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "rlx/plugin.h"

typedef struct plugin_option {
    const char *item; /* the whole item, for messages: item_len bytes, not terminated */
    int item_len;
    const char *key; /* key_len bytes, not terminated */
    size_t key_len;
    char value[32]; /* terminated, value_len bytes */
    size_t value_len;
    long num;    /* the value as a decimal integer, when is_num */
    bool is_num;
} plugin_option;

/* Reads the item at *cursor and moves *cursor past it. Returns 1 with *opt filled, 0 when no
 * item is left, or a negative status after host->error (message prefixed with `plugin`) for an
 * item without '=' or with an empty or over-long value. */
int plugin_option_next(const rlx_host *host, const char *plugin, const char **cursor, plugin_option *opt);

static inline bool plugin_option_is(const plugin_option *opt, const char *key)
{
    return opt->key_len == strlen(key) && !memcmp(opt->key, key, opt->key_len);
}

#endif
