/* What librlx exports for its own tree only: the error setter, which librlx's sources, the
 * in-tree apps and the tests use to report through rlx_last_error(), and the fault injection of
 * the tests. Not installed and not part of the public API: these symbols carry the version
 * RLX_PRIVATE (core/librlx.map), the ABI check ignores them, and they may change in any release. */
#ifndef RLX_PRIVATE_H
#define RLX_PRIVATE_H

#include <stdint.h>

#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style detail message for this thread and returns status unchanged, so a
 * failure path reads `return rlx_error(RLX_E_INVALID, "n must be > 0");`. */
RLX_API int rlx_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Fault injection, for tests: the nth heap allocation of librlx from now on (1 = the next;
 * plugins' rlx_host.alloc counts too) fails, and with persistent every later one as well; 0
 * turns failures off. Returns how many allocations were made since the previous call, so a
 * test can fail each allocation of an operation in turn until one run makes fewer than nth. */
RLX_API uint64_t rlx_debug_fail_alloc(uint64_t nth, int persistent);

#ifdef __cplusplus
}
#endif
#endif
