/* Internal logging entry points; see rlx_log_set_handler in rlx/status.h. */
#ifndef RLX_UTIL_LOG_H
#define RLX_UTIL_LOG_H

#include <stdarg.h>

#include "rlx/status.h"

void rlx__log_v(int level, const char *fmt, va_list ap);
void rlx__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
