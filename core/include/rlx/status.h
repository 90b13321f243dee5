/* Status codes and the per-thread last-error message shared by librlx and its plugins.
 * Every fallible call returns an rlx_status; negative values are errors, so a function may
 * also return a non-negative count. The detail of the latest failure on this thread is
 * available from rlx_last_error() until the next failing call on the same thread. */
#ifndef RLX_STATUS_H
#define RLX_STATUS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RLX_BUILDING_LIBRARY)
#define RLX_API __attribute__((visibility("default")))
#else
#define RLX_API
#endif

#define RLX_STATUS_MAP(X)                                                                                              \
    X(OK, 0, "success")                                                                                                \
    X(E_INVALID, -1, "invalid argument")                                                                               \
    X(E_NOMEM, -2, "out of memory")                                                                                    \
    X(E_ABI, -3, "plugin ABI mismatch")                                                                                \
    X(E_IO, -4, "input/output error")                                                                                  \
    X(E_FORMAT, -5, "malformed file")                                                                                  \
    X(E_NOT_FOUND, -6, "not found")                                                                                    \
    X(E_SHAPE, -7, "shape mismatch")                                                                                   \
    X(E_UNSUPPORTED, -8, "unsupported")                                                                                \
    X(E_PLUGIN, -9, "plugin failure")                                                                                  \
    X(E_RANGE, -10, "out of range")                                                                                    \
    X(E_TIMEOUT, -11, "timed out")                                                                                     \
    X(E_PEER, -12, "peer failure")                                                                                     \
    X(E_INTERNAL, -13, "internal error")                                                                               \
    X(E_BUSY, -14, "busy")                                                                                             \
    X(E_AUTH, -15, "authentication failed")

typedef enum rlx_status {
#define RLX_STATUS_ENUM_(name, code, text) RLX_##name = code,
    RLX_STATUS_MAP(RLX_STATUS_ENUM_)
#undef RLX_STATUS_ENUM_
} rlx_status;

/* Static description of a status code; never NULL, also for unknown codes. */
RLX_API const char *rlx_status_str(int status);

/* This thread's detail message for its latest failure ("" if none yet). The text is owned by
 * librlx and stays valid until the next failing call on this thread. */
RLX_API const char *rlx_last_error(void);

/* Clears this thread's detail message. */
RLX_API void rlx_error_clear(void);

/* Log lines from librlx and plugins (levels: 0 error, 1 warning, 2 info, 3 debug) go to the
 * handler set here; by default they are dropped, since only the application decides what to
 * print. The handler may be called from any thread. */
typedef void (*rlx_log_fn)(void *ctx, int level, const char *message);
RLX_API void rlx_log_set_handler(rlx_log_fn fn, void *ctx);

/* Frees what a librlx call allocated and handed to the caller (token ids, decoded and rendered
 * text, spans, GBNF): each such call says so. NULL is a no-op. The caller must not use free(),
 * which would tie it to the allocator librlx was built with. */
RLX_API void rlx_free(void *p);

#ifdef __cplusplus
}
#endif

/* librlx's own sources report errors with rlx_error (rlx/private.h, not installed). */
#ifdef RLX_BUILDING_LIBRARY
#include "rlx/private.h"
#endif
#endif
