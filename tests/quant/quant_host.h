/* The rlx_host the quantized-kernel test and benchmark hand the kernel library: errors printed
 * to stderr, aligned allocations from libc. */
#ifndef RLX_TESTS_QUANT_HOST_H
#define RLX_TESTS_QUANT_HOST_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "rlx/backend_iface.h"

static int quant_host_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return status;
}

static void quant_host_log(int level, const char *fmt, ...) { (void)level, (void)fmt; }

static void *quant_host_alloc(size_t size, size_t align) {
    return aligned_alloc(align, (size + align - 1) / align * align);
}

static const rlx_host quant_host = {.size = sizeof(rlx_host),
                                    .abi_major = RLX_ABI_MAJOR,
                                    .abi_minor = RLX_ABI_MINOR,
                                    .log = quant_host_log,
                                    .error = quant_host_error,
                                    .alloc = quant_host_alloc,
                                    .free = free};

#endif
