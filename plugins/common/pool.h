/* A persistent thread pool for the backend plugins: n_threads - 1 workers plus the calling
 * thread run a job, a function over chunks 0..n_chunks-1 that every thread claims one at a time
 * (dynamic scheduling). Idle threads spin for spin_ns, then sleep on a futex, so a pool that has
 * nothing to do leaves the cores to other processes. The caller never waits for a worker that has
 * not started: it takes every chunk nobody claimed and only waits for chunks already running.
 * Linked statically into each plugin, hidden from its exports. */
#ifndef RLX_PLUGINS_POOL_H
#define RLX_PLUGINS_POOL_H

#include <stdbool.h>
#include <stdint.h>

/* Runs chunk `chunk` of a job; ith identifies the thread (0 = the caller, 1..n_threads-1 the
 * workers), e.g. to pick a per-thread scratch buffer. */
typedef void (*plugin_pool_fn)(void *ctx, int ith, int64_t chunk);

typedef struct plugin_pool plugin_pool;

/* Stragglers: a worker that loses its core while it holds a chunk (another busy process on the
 * machine) stalls the whole job for a scheduler slice, about 1-10 ms, whereas chunks last from
 * microseconds (decode) to about a millisecond (prefill tiles). So a parallel job stalled when
 * the caller, out of chunks to claim, then waited at least stall_min_ns for the last ones.
 * Stalls come and go with the other process's slices, not in runs, so they are summed over
 * windows of PLUGIN_POOL_WINDOW_JOBS parallel jobs: when stalls took over 1/stall_share of a
 * window's time, the next PLUGIN_POOL_SERIAL_JOBS parallel jobs (some tokens of decoding) run on
 * the calling thread alone, after which the next window probes parallel again. A probe that
 * stalls costs a window of stalls, so a window ends as soon as two stalls exceed its share so far,
 * and each probe that fails doubles the serial stretch, up to
 * PLUGIN_POOL_SERIAL_MAX (some seconds of work: how long a machine that became free again may
 * stay unused); a window without any stall resets it.
 * The pool, whose chunks are claimed dynamically (the caller takes over all unclaimed work, and
 * 2 threads still beat 1 on a core and a half), uses 1 ms and a third; OpenMP's static shares
 * (the onednn plugin) wait at the barrier for every late thread, so they go serial sooner. */
#define PLUGIN_POOL_WINDOW_JOBS 32
#define PLUGIN_POOL_SERIAL_JOBS 256
#define PLUGIN_POOL_SERIAL_MAX 16384

/* The straggler rule's state, for the pool and for other thread runtimes (the onednn plugin's
 * OpenMP regions); set up by plugin_stragglers_init. Used by one thread at a time. */
typedef struct plugin_stragglers {
    int64_t stall_min_ns; /* a wait this long is a stall */
    int stall_share;      /* go serial when stalls exceed 1/stall_share of a window */
    int window_jobs;
    int window_stalls;       /* jobs of the window that stalled */
    int64_t window_ns;       /* time of the window's jobs */
    int64_t window_stall_ns; /* of which the caller waited in stalls */
    int serial_left;         /* parallel jobs still to run on the caller alone */
    int serial_next;         /* the stretch after the next stalled window; 0: SERIAL_JOBS */
} plugin_stragglers;

/* Starts the rule with these thresholds (see above). */
void plugin_stragglers_init(plugin_stragglers *s, int64_t stall_min_ns, int stall_share);
/* Whether a job that would run in parallel should run on the calling thread alone instead
 * (counting it against the serial stretch). */
bool plugin_stragglers_serial(plugin_stragglers *s);
/* After a parallel job that took job_ns, of which the caller spent wait_ns waiting for work
 * that other threads held. */
void plugin_stragglers_note(plugin_stragglers *s, int64_t job_ns, int64_t wait_ns);
/* CLOCK_MONOTONIC in nanoseconds. */
int64_t plugin_now_ns(void);

/* Starts a pool of n_threads threads counting the caller (n_threads - 1 workers; 1 means none).
 * spin_ns is how long an idle thread busy-waits before it sleeps. Returns 0 with *out set to a
 * pool the caller owns (release it with plugin_pool_destroy), or RLX_E_NOMEM / RLX_E_INTERNAL
 * (a thread could not be started) with *out NULL and nothing leaked. */
int plugin_pool_create(int n_threads, int64_t spin_ns, plugin_pool **out);

/* Stops and joins the workers and frees the pool. NULL is a no-op. */
void plugin_pool_destroy(plugin_pool *p);

/* Runs fn(ctx, ith, i) for every i in [0, n_chunks), each exactly once, and returns when all
 * have returned; nothing of the job runs afterwards, so ctx may live on the caller's stack. When
 * parallel is false (the job is too small to be worth waking threads) the calling thread runs
 * every chunk. Only one thread may call this at a time; fn must not call it. */
void plugin_pool_run(plugin_pool *p, plugin_pool_fn fn, void *ctx, int64_t n_chunks, bool parallel);

#ifdef RLX_POOL_TEST_HOOKS
/* Tests only (compiled in with -DRLX_POOL_TEST_HOOKS): when set, called at the points where a
 * delay widens the window of a publication race, to let a stress test shuffle the threads. */
typedef enum plugin_pool_hook_at {
    PLUGIN_POOL_HOOK_PUBLISH, /* caller: job fields written, claim not open yet */
    PLUGIN_POOL_HOOK_LOADED,  /* any thread: claim loaded, job fields not read yet */
    PLUGIN_POOL_HOOK_READ,    /* any thread: job fields read, claim not taken yet */
} plugin_pool_hook_at;
extern void (*plugin_pool_test_hook)(plugin_pool_hook_at at);
#endif

#endif
