/* Transports: what a transport plugin implements (rlx_transport_iface and its contracts) is in
 * rlx/transport_iface.h, included here; this header adds nothing yet for core users beyond it. */
#ifndef RLX_TRANSPORT_H
#define RLX_TRANSPORT_H

#include "rlx/plugin.h"
#include "rlx/transport_iface.h"

#endif
