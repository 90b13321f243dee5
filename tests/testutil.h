/* Shared includes and small helpers for the cmocka tests. */
#ifndef RLX_TESTUTIL_H
#define RLX_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "rlx/rlx.h"

#define assert_ok(expr)                                                                                                \
    do {                                                                                                               \
        int rc_ = (expr);                                                                                              \
        if (rc_ < 0)                                                                                                   \
            fail_msg("%s failed: %d %s", #expr, rc_, rlx_last_error());                                                \
    } while (0)

#define assert_error_mentions(text) assert_non_null_msg(strstr(rlx_last_error(), text), rlx_last_error())

static inline void assert_non_null_msg(const void *p, const char *msg) {
    if (!p)
        fail_msg("expected the error to mention it, got: %s", msg);
}

#endif
