/* Node validation shared by the backend plugins built in this tree: the op, dtype and shape
 * combinations their kernels accept, checked the same way in supports() (silently) and again
 * in compute() (reporting), since a node view may come from any core. Linked statically into
 * each plugin, hidden from its exports. */
#ifndef RLX_PLUGINS_NODE_CHECK_H
#define RLX_PLUGINS_NODE_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "rlx/backend_iface.h"

/* RLX_OK when node n is one the in-tree kernels compute, else a status; with report, also a
 * message through host->error that starts with the plugin's name. Block-quantized dtypes (ABI
 * 1.3) are accepted for MATMUL's weight, EMBED's table and MOE's expert matrices when their
 * innermost dimension is a whole number of blocks; bias, norm weights and the MOE router stay
 * F32/BF16/F16. ATTENTION takes the ABI 1.4 forms too (3-D caches with seq, F16 caches), and
 * GATHER_ROWS (1.4) is accepted; SIGMOID_MUL, SSM_CONV, GATED_DELTA and a partial ROPE (1.6)
 * only from a core of ABI 1.6 on (host->abi_minor), which is the only one to send them. */
int node_check(const rlx_host *host, const char *plugin, const rlx_node_view *n, bool report);

/* The rlx_dtype of the weights node n multiplies, which decide how a backend computes it (its
 * precision): a MATMUL's w, a MOE's expert matrices; -1 for any other node. */
int node_weight_dtype(const rlx_node_view *n);

#endif
