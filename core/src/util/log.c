/* Routing of log lines to the application's handler. */
#include <stdarg.h>
#include <stdio.h>

#include "util/log.h"

static rlx_log_fn log_fn;
static void *log_ctx;

void rlx_log_set_handler(rlx_log_fn fn, void *ctx) {
    log_ctx = ctx;
    log_fn = fn;
}

void rlx__log_v(int level, const char *fmt, va_list ap) {
    if (!log_fn)
        return;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    log_fn(log_ctx, level, buf);
}

void rlx__log(int level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rlx__log_v(level, fmt, ap);
    va_end(ap);
}
