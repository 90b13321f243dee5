/* What the cmocka tests share (testutil.c, linked into each by rlx_add_test): assertions on
 * rlx's status and error, the clock and bounded waits, one random generator, the doubling chain
 * graph, and the collector of an engine request's events. */
#ifndef RLX_TESTUTIL_H
#define RLX_TESTUTIL_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <time.h>

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

// ---- time ----

/* CLOCK_MONOTONIC in seconds. */
double tu_now_s(void);
/* The CLOCK_REALTIME instant ms milliseconds from now, for pthread_cond_timedwait. */
struct timespec tu_after_ms(long ms);
void tu_sleep_ms(long ms);

// ---- random numbers ----

/* The tests' one generator: a 64-bit LCG (Knuth's MMIX constants), a state per stream. Any seed
 * works, 0 too, so a test may seed it from a position to make a row the same wherever it is
 * drawn. The draw is the state's top 32 bits. */
static inline uint32_t tu_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

/* Uniform in [-1, 1) on a grid of 2^-23: 24 bits of a draw. */
static inline float tu_uniform(uint64_t *s) { return (float)(tu_rand(s) >> 8) * 0x1p-23f - 1.0f; }

/* x[0..n) uniform in [-1, 1). */
void tu_fill(float *x, int64_t n, uint64_t *s);

// ---- memory ----

/* bytes that end where a PROT_NONE page starts, so that reading or writing past them faults (for
 * kernels AddressSanitizer does not instrument: the GEMV and GEMM kernels, the AMX tiles); *map
 * and *len receive the mapping for munmap. */
void *tu_before_guard(size_t bytes, void **map, size_t *len);

// ---- graphs ----

/* x [rows, cols] -> d1 = x + x -> d2 = d1 + d1 -> ... -> dN (N = n_doublings), and with
 * gather_last its last row ("last"): each value a known power of two of its input, so a value
 * near FLT_MAX overflows at a known node, and each node's output dies with the next. *x and *out
 * get the input's and the marked output's ids. */
rlx_graph *tu_doubling_chain(int64_t rows, int64_t cols, int n_doublings, int gather_last, int *x, int *out);

// ---- a model and a backend, for a group's setup ----

/* Opens the model in dir and an instance (options bo, NULL for the defaults) of the backend
 * plugin named backend (NULL: $RLX_BACKEND, else cpu-blas), found on the default plugin path;
 * "ref" means the reference kernels (*b and *plugin NULL). 0, or -1 after saying why on stderr,
 * as a cmocka group setup returns. */
int tu_open_model(const char *dir, const char *backend, const rlx_backend_options *bo, rlx_model **m,
                  rlx_plugin_handle **plugin, rlx_backend **b);
void tu_close_model(rlx_model *m, rlx_plugin_handle *plugin, rlx_backend *b);

// ---- the events of an engine request ----

#define TU_MAX_TOKENS 128 /* tokens a collector keeps; more count as bad_events */
#define TU_MAX_TOP 5      /* alternatives per token it keeps */
#define TU_WAIT_MS 120000 /* the longest wait of a hold that is not released (hold_ms 0) */

/* What one request received, filled by tu_on_event on the engine's worker; the test sets the
 * asks (stop_after, cancel_at, hold, hold_ms) before submitting. */
typedef struct tu_events {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[TU_MAX_TOKENS];
    float logprobs[TU_MAX_TOKENS];
    uint32_t n_top[TU_MAX_TOKENS];
    int32_t top_ids[TU_MAX_TOKENS][TU_MAX_TOP];
    float top_lp[TU_MAX_TOKENS][TU_MAX_TOP];
    uint32_t n, n_done;
    int events_after_done, bad_events;
    rlx_engine_event done; /* its message points at message below */
    char message[1024];
    double t_done; /* tu_now_s() at the DONE event */
    /* asks: stop_after > 0 makes the callback return non-zero (stop) at that token; cancel_at
     * > 0 cancels the request from the callback at that token, once tu_events_submitted gave
     * the engine and id */
    uint32_t stop_after, cancel_at;
    rlx_engine *engine;
    uint64_t id;
    int cancel_sent;
    /* hold[h] > 0: the callback of that token blocks the engine's worker until the test
     * released it h + 1 times (tu_release), or for hold_ms (TU_WAIT_MS when 0), so the test
     * knows what has run, whatever the scheduling */
    uint32_t hold[2];
    long hold_ms;
    int holding, releases;
} tu_events;

void tu_events_init(tu_events *r);
void tu_events_destroy(tu_events *r);
/* The request's on_event, its ctx the tu_events. */
int tu_on_event(void *ctx, const rlx_engine_event *ev);
/* Records the engine and id a submit gave, for cancel_at. */
void tu_events_submitted(tu_events *r, rlx_engine *e, uint64_t id);
/* Waits up to ms for the DONE event; whether it came. */
int tu_wait_done(tu_events *r, long ms);
/* Waits up to ms for n tokens (or the DONE event); whether n tokens came. */
int tu_wait_tokens(tu_events *r, uint32_t n, long ms);
/* Waits up to ms until the callback holds the worker at its hold h (1 or 2); whether it does. */
int tu_wait_holding(tu_events *r, int h, long ms);
/* Lets the callback past its current (or next) hold. */
void tu_release(tu_events *r);
/* The tokens received so far. */
uint32_t tu_tokens_of(tu_events *r);

#endif
