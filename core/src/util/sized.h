/* Reading the sized structs callers hand the core (a uint32_t size first, members only appended):
 * a caller built against an older header has a shorter struct, so only the bytes its size covers
 * are read, over the defaults. */
#ifndef RLX_UTIL_SIZED_H
#define RLX_UTIL_SIZED_H

#include <stdint.h>
#include <string.h>

#include "rlx/status.h"

/* Copies the part of src that its size (its first member) covers into dst (dst_size bytes, which
 * holds the defaults), then sets dst's size to dst_size. A size below min_size (the members no
 * version lacks) is RLX_E_INVALID naming type. */
static inline rlx_status rlx__read_sized(void *dst, size_t dst_size, const void *src, size_t min_size,
                                         const char *type) {
    uint32_t size;
    memcpy(&size, src, sizeof size);
    if (size < min_size)
        return rlx_error(RLX_E_INVALID,
                         "%s.size is %u, below the %zu bytes of its first version (set it to "
                         "sizeof(%s))",
                         type, size, min_size, type);
    memcpy(dst, src, size < dst_size ? size : dst_size);
    size = (uint32_t)dst_size;
    memcpy(dst, &size, sizeof size);
    return RLX_OK;
}

#endif
