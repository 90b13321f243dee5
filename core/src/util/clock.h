/* Monotonic seconds for the timing figures of generation statistics. */
#ifndef RLX_UTIL_CLOCK_H
#define RLX_UTIL_CLOCK_H

#include <time.h>

static inline double rlx__now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
