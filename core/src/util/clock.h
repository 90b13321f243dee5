/* Monotonic time: seconds for the timing figures of generation statistics, and the deadlines of
 * the condition variables that wait on that clock. */
#ifndef RLX_UTIL_CLOCK_H
#define RLX_UTIL_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline double rlx__now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A condition variable whose timed waits take deadlines on CLOCK_MONOTONIC (rlx__deadline_in),
 * so a change of the wall clock neither cuts a wait short nor stretches it. */
static inline void rlx__cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* The deadline ms milliseconds from now, for a condition variable of rlx__cond_init_monotonic. */
static inline struct timespec rlx__deadline_in(uint64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif
