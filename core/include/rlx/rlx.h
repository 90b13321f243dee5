/* Umbrella header: the whole public API of librlx.
 *
 * Conventions every header follows:
 * - Lifecycles come in one verb pair per kind of object: what is read from files is opened and
 *   closed (rlx_model_open, rlx_weights_open, rlx_tokenizer_open, rlx_deploy_open,
 *   rlx_runtime_open ... _close); plugins are loaded and unloaded (rlx_plugin_load,
 *   rlx_plugin_unload); everything else is created and destroyed (rlx_graph_create, plans,
 *   sessions, samplers, backends, drivers ... _destroy). Each closing call accepts NULL.
 * - Fallible calls return an rlx_status (negative on failure) with the detail in
 *   rlx_last_error(); on failure an out-parameter is NULL and nothing is leaked.
 * - Structs the caller fills and the library may grow start with `uint32_t size`
 *   (sizeof as the caller compiled it); the library reads only what that size covers. */
#ifndef RLX_RLX_H
#define RLX_RLX_H

#include "rlx/backend.h"
#include "rlx/deploy.h"
#include "rlx/engine.h"
#include "rlx/dist.h"
#include "rlx/gen.h"
#include "rlx/grammar.h"
#include "rlx/graph.h"
#include "rlx/model.h"
#include "rlx/plugin.h"
#include "rlx/runtime.h"
#include "rlx/sched.h"
#include "rlx/speculator.h"
#include "rlx/status.h"
#include "rlx/text.h"
#include "rlx/transport.h"

#endif
