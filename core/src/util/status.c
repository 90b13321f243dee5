/* Status strings and the thread-local last-error buffer behind rlx_error(). */
#include <stdarg.h>
#include <stdio.h>

#include "rlx/status.h"

static _Thread_local char last_error[1024];

const char *rlx_status_str(int status) {
    switch (status) {
#define RLX_STATUS_CASE_(name, code, text)                                                                             \
    case code:                                                                                                         \
        return text;
        RLX_STATUS_MAP(RLX_STATUS_CASE_)
#undef RLX_STATUS_CASE_
    default:
        return "unknown status";
    }
}

const char *rlx_last_error(void) { return last_error; }

void rlx_error_clear(void) { last_error[0] = '\0'; }

int rlx_error(int status, const char *fmt, ...) {
    char buf[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap); /* fmt may reference the old message, so format aside */
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%s", buf);
    return status;
}
