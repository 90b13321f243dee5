/* Umbrella header: the whole public API of librlx. */
#ifndef RLX_RLX_H
#define RLX_RLX_H

#include "rlx/backend.h"
#include "rlx/deploy.h"
#include "rlx/dist.h"
#include "rlx/gen.h"
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
