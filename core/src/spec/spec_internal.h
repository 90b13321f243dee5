/* Shared between the plugin loader and the speculator wrapper. */
#ifndef RLX_SPEC_INTERNAL_H
#define RLX_SPEC_INTERNAL_H

#include "rlx/speculator.h"

/* Checks a speculator plugin's table: long enough for, and filling, its required members.
 * Errors start with `what` (the plugin's path or name). */
rlx_status rlx__speculator_check_iface(const char *what, const rlx_speculator_iface *sp);

#endif
