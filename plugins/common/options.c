#include "options.h"

#include <stdlib.h>

int plugin_option_next(const rlx_host *host, const char *plugin, const char **cursor, plugin_option *opt)
{
    const char *p = *cursor;
    if (!p || !*p)
        return 0;
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    *cursor = end ? end + 1 : NULL;
    const char *eq = memchr(p, '=', len);
    if (!eq)
        return host->error(RLX_E_INVALID, "%s: option '%.*s' is not key=value", plugin, (int)len, p);
    opt->item = p;
    opt->item_len = (int)len;
    opt->key = p;
    opt->key_len = (size_t)(eq - p);
    opt->value_len = len - opt->key_len - 1;
    if (opt->value_len == 0 || opt->value_len >= sizeof opt->value)
        return host->error(RLX_E_INVALID, "%s: bad value in option '%.*s'", plugin, (int)len, p);
    memcpy(opt->value, eq + 1, opt->value_len);
    opt->value[opt->value_len] = '\0';
    char *vend;
    opt->num = strtol(opt->value, &vend, 10);
    opt->is_num = *vend == '\0';
    return 1;
}
