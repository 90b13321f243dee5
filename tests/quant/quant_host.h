/* What the quantized-kernel test and benchmark hand the kernel library: an rlx_host (errors
 * printed to stderr, aligned allocations from libc) and a kern_par on the plugins' futex pool,
 * cut as cpu-blas cuts its jobs (about four chunks a thread, claimed dynamically). All inline, so
 * a test that needs the host alone includes it too. */
#ifndef RLX_TESTS_QUANT_HOST_H
#define RLX_TESTS_QUANT_HOST_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kern.h"
#include "pool.h"
#include "rlx/backend_iface.h"

static inline int quant_host_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return status;
}

static inline void quant_host_log(int level, const char *fmt, ...) { (void)level, (void)fmt; }

static inline void *quant_host_alloc(size_t size, size_t align) {
    return aligned_alloc(align, (size + align - 1) / align * align);
}

static const rlx_host quant_host = {.size = sizeof(rlx_host),
                                    .abi_major = RLX_ABI_MAJOR,
                                    .abi_minor = RLX_ABI_MINOR,
                                    .log = quant_host_log,
                                    .error = quant_host_error,
                                    .alloc = quant_host_alloc,
                                    .free = free};

typedef struct quant_pool {
    plugin_pool *pool;
    int n_threads;
} quant_pool;

typedef struct quant_range {
    kern_range_fn fn;
    void *ctx;
    int64_t n, chunk;
} quant_range;

static inline void quant_range_task(void *arg, int ith, int64_t chunk) {
    const quant_range *r = arg;
    const int64_t i0 = chunk * r->chunk;
    r->fn(r->ctx, ith, i0, i0 + r->chunk < r->n ? i0 + r->chunk : r->n);
}

static inline void quant_parallel_for(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    const quant_pool *p = self;
    int64_t c = (n + 4 * p->n_threads - 1) / (4 * p->n_threads);
    c = (c + align - 1) / align * align;
    quant_range r = {.fn = fn, .ctx = ctx, .n = n, .chunk = c};
    plugin_pool_run(p->pool, quant_range_task, &r, (n + c - 1) / c, work >= KERN_PAR_MIN);
}

static inline void quant_parallel_tasks(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    const quant_pool *p = self;
    quant_range r = {.fn = fn, .ctx = ctx, .n = n, .chunk = 1};
    plugin_pool_run(p->pool, quant_range_task, &r, n, work >= KERN_PAR_MIN);
}

/* A parallel_for of one range and a parallel_tasks of the tasks in order, on the calling thread. */
static inline void quant_serial_for(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)align, (void)work;
    fn(ctx, 0, 0, n);
}

static inline void quant_serial_tasks(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)work;
    for (int64_t i = 0; i < n; i++)
        fn(ctx, 0, i, i + 1);
}

/* Starts n_threads threads (counting the caller); plugin_pool_destroy(p->pool) stops them. */
static inline int quant_pool_start(quant_pool *p, int n_threads) {
    p->n_threads = n_threads;
    return plugin_pool_create(n_threads, 200000, &p->pool);
}

static inline kern_par quant_pool_par(quant_pool *p) {
    return (kern_par){.self = p,
                      .n_threads = p->n_threads,
                      .parallel_for = quant_parallel_for,
                      .parallel_tasks = quant_parallel_tasks};
}

#endif
