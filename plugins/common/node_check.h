/* Node validation shared by the backend plugins built in this tree: the op, dtype and shape
 * combinations their kernels accept, checked the same way in supports() (silently) and again
 * in compute() (reporting), since a node view may come from any core. Linked statically into
 * each plugin, hidden from its exports. */
#ifndef RLX_PLUGINS_NODE_CHECK_H
#define RLX_PLUGINS_NODE_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "rlx/backend.h"

/* Rows of t: the product of every dimension but the last. */
static inline int64_t node_rows(const rlx_tensor *t)
{
    int64_t r = 1;
    for (uint32_t i = 0; i + 1 < t->n_dims; i++)
        r *= t->shape[i];
    return r;
}

static inline int64_t node_cols(const rlx_tensor *t)
{
    return t->shape[t->n_dims - 1];
}

static inline int64_t node_numel(const rlx_tensor *t)
{
    return node_rows(t) * node_cols(t);
}

/* RLX_OK when node n is one the in-tree kernels compute, else a status; with report, also a
 * message through host->error that starts with the plugin's name. */
int node_check(const rlx_host *host, const char *plugin, const rlx_node_view *n, bool report);

#endif
