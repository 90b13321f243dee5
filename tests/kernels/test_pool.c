/* The plugins' thread pool (plugins/common/pool.c, compiled here with RLX_POOL_TEST_HOOKS):
 * back-to-back jobs of 1..200 chunks, small and large in turn as speculative decoding posts them,
 * with random delays injected where a job's publication could race with late workers, run every
 * chunk exactly once and nothing after plugin_pool_run returned; and the straggler rule sends
 * jobs to the calling thread when stalls take much of a window's time, then probes again. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"
#include "testutil.h"

#define STRESS_JOBS 1500
#define STRESS_MAX_CHUNKS 200

typedef struct stress_job {
    _Atomic int live; /* 1 until plugin_pool_run(this job) returned */
    int n_chunks;
    _Atomic int *runs; /* [n_chunks] times each chunk started */
} stress_job;

static int stress_threads;
static _Atomic long stress_late;      /* chunks running after their job returned */
static _Atomic long stress_bad_chunk; /* chunk index or ith out of range */

/* tu_rand's, seeded per thread by the variable's own address */
static _Thread_local uint64_t rng_state;

static uint32_t rng_next(void) {
    if (!rng_state)
        rng_state = (uint64_t)(uintptr_t)&rng_state;
    return tu_rand(&rng_state);
}

/* A short random pause: usually nothing, sometimes a busy-wait, now and then a yield. */
static void random_delay(void) {
    const uint32_t r = rng_next();
    if (r % 16 == 0) {
        sched_yield();
    } else if (r % 4 == 0) {
        for (volatile uint32_t i = 0; i < (r >> 8) % 2048; i++) {
        }
    }
}

static void stress_hook(plugin_pool_hook_at at) {
    (void)at;
    random_delay();
}

static void stress_chunk(void *ctx, int ith, int64_t chunk) {
    stress_job *j = ctx;
    if (!atomic_load(&j->live))
        atomic_fetch_add(&stress_late, 1);
    if (chunk < 0 || chunk >= j->n_chunks || ith < 0 || ith >= stress_threads) {
        atomic_fetch_add(&stress_bad_chunk, 1);
        return;
    }
    atomic_fetch_add(&j->runs[chunk], 1);
    random_delay();
    if (!atomic_load(&j->live))
        atomic_fetch_add(&stress_late, 1);
}

static void stress(int n_threads, int64_t spin_ns) {
    stress_threads = n_threads;
    atomic_store(&stress_late, 0);
    atomic_store(&stress_bad_chunk, 0);
    stress_job *jobs = calloc(STRESS_JOBS, sizeof *jobs);
    _Atomic int *runs = calloc((size_t)STRESS_JOBS * STRESS_MAX_CHUNKS, sizeof *runs);
    assert_non_null(jobs);
    assert_non_null(runs);
    plugin_pool *p;
    assert_int_equal(plugin_pool_create(n_threads, spin_ns, &p), 0);
    plugin_pool_test_hook = stress_hook;
    long missing = 0;
    for (int i = 0; i < STRESS_JOBS; i++) {
        stress_job *j = &jobs[i];
        const uint32_t r = rng_next();
        j->n_chunks = i % 2 ? 1 + (int)(r % 4) : 50 + (int)(r % (STRESS_MAX_CHUNKS - 49));
        j->runs = runs + (size_t)i * STRESS_MAX_CHUNKS;
        atomic_store(&j->live, 1);
        plugin_pool_run(p, stress_chunk, j, j->n_chunks, true);
        atomic_store(&j->live, 0);
        for (int c = 0; c < j->n_chunks; c++)
            missing += atomic_load(&j->runs[c]) == 0;
    }
    plugin_pool_test_hook = NULL;
    plugin_pool_destroy(p);
    long twice = 0;
    for (int i = 0; i < STRESS_JOBS; i++)
        for (int c = 0; c < jobs[i].n_chunks; c++)
            twice += atomic_load(&jobs[i].runs[c]) > 1;
    free(runs);
    free(jobs);
    if (missing || twice || stress_late || stress_bad_chunk)
        fail_msg("%d threads, spin %lld ns: %ld chunks not run by return, %ld run more than once, %ld running "
                 "after return, %ld out of range",
                 n_threads, (long long)spin_ns, missing, twice, (long)stress_late, (long)stress_bad_chunk);
}

static void test_every_chunk_runs_once_before_return(void **state) {
    (void)state;
    stress(2, 200000);
    stress(2, 0); /* idle threads sleep at once: the futex paths every time */
    stress(3, 0);
    stress(4, 200000);
}

static void test_serial_jobs_stay_on_caller(void **state) {
    (void)state;
    plugin_pool *p;
    assert_int_equal(plugin_pool_create(1, 0, &p), 0);
    stress_job j = {.n_chunks = 7};
    _Atomic int runs[7] = {0};
    j.runs = runs;
    stress_threads = 1;
    atomic_store(&j.live, 1);
    plugin_pool_run(p, stress_chunk, &j, j.n_chunks, true); /* ith >= 1 would count as bad */
    for (int c = 0; c < j.n_chunks; c++)
        assert_int_equal(atomic_load(&runs[c]), 1);
    assert_int_equal(atomic_load(&stress_bad_chunk), 0);
    plugin_pool_destroy(p);
}

// ---- the straggler rule ----

typedef struct straggler_job {
    int64_t wait_ns;       /* the caller's chunk waits up to this long for a worker to hold the other */
    bool worker_sleeps;    /* the worker's chunk lasts 10 ms, like a thread that lost its core */
    int64_t caller_ns;     /* the caller's chunk lasts at least this long */
    _Atomic int on_worker; /* chunks a worker ran */
} straggler_job;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void straggler_chunk(void *ctx, int ith, int64_t chunk) {
    (void)chunk;
    straggler_job *j = ctx;
    if (ith != 0) {
        atomic_fetch_add(&j->on_worker, 1);
        if (j->worker_sleeps)
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        return;
    }
    const int64_t t0 = now_ns();
    while (!atomic_load(&j->on_worker) && now_ns() < t0 + j->wait_ns)
        sched_yield();
    while (now_ns() < t0 + j->caller_ns) {
    }
}

/* Runs a 2-chunk parallel job; returns how many chunks a worker ran. */
static int straggler_run(plugin_pool *p, int64_t wait_ns, bool worker_sleeps, int64_t caller_ns) {
    straggler_job j = {.wait_ns = wait_ns, .worker_sleeps = worker_sleeps, .caller_ns = caller_ns};
    plugin_pool_run(p, straggler_chunk, &j, 2, true);
    return atomic_load(&j.on_worker);
}

#define SURE_NS 2000000000 /* long enough for a worker to show up on a loaded machine */

/* A stall: the caller waits 10 ms for the worker's chunk, nearly all of the job. */
static void assert_stall(plugin_pool *p) { assert_true(straggler_run(p, SURE_NS, true, 0) >= 1); }

/* The next n jobs run on the caller alone, although each gives the (spinning) worker a
 * millisecond to take a chunk. */
static void assert_serial_period(plugin_pool *p, int n) {
    int on_worker = 0;
    for (int i = 0; i < n; i++)
        on_worker += straggler_run(p, 1000000, false, 0);
    assert_int_equal(on_worker, 0);
}

static void test_stragglers_send_jobs_to_the_caller(void **state) {
    (void)state;
    plugin_pool *p;
    assert_int_equal(plugin_pool_create(2, 200000, &p), 0);
    /* two stalls in a row are over a third of the window so far: serial at once */
    assert_stall(p);
    assert_stall(p);
    assert_serial_period(p, PLUGIN_POOL_SERIAL_JOBS);
    assert_stall(p); /* the probe stalls again */
    assert_stall(p);
    assert_serial_period(p, 2 * PLUGIN_POOL_SERIAL_JOBS); /* and the stretch doubled */
    plugin_pool_destroy(p);
}

/* n parallel jobs of job_ns each, the last n_stalls of which waited wait_ns. */
static void note_jobs(plugin_stragglers *s, int n, int n_stalls, int64_t job_ns, int64_t wait_ns) {
    for (int i = 0; i < n; i++) {
        assert_false(plugin_stragglers_serial(s));
        plugin_stragglers_note(s, job_ns, i >= n - n_stalls ? wait_ns : 0);
    }
}

/* Exactly the next n jobs go serial. */
static void assert_serial_jobs(plugin_stragglers *s, int n) {
    for (int i = 0; i < n; i++)
        assert_true(plugin_stragglers_serial(s));
    assert_false(plugin_stragglers_serial(s));
}

/* The rule itself, on synthetic times (a real machine's load would make these flaky): a window
 * goes serial when stalls of at least stall_min_ns take over 1/stall_share of it, at once when
 * two stalls do; failed probes double the stretch up to SERIAL_MAX; a window without
 * stalls resets it, one with a few keeps it. */
static void test_straggler_rule(void **state) {
    (void)state;
    plugin_stragglers s;
    const int64_t job = 100000, stall = 500000;
    const int window = PLUGIN_POOL_WINDOW_JOBS;
    plugin_stragglers_init(&s, stall, 10);
    note_jobs(&s, window, window, job, stall - 1); /* waits below a stall do not count */
    note_jobs(&s, window, 1, job, stall);          /* one stall, 0.5 of 3.2 ms, at the window's end */
    assert_serial_jobs(&s, PLUGIN_POOL_SERIAL_JOBS);
    note_jobs(&s, window, 2, 10 * job, stall); /* 1 of 33 ms: too few stalls, the stretch stays */
    assert_serial_jobs(&s, 0);
    note_jobs(&s, 2, 2, job, stall); /* two stalls in a row end the window */
    assert_serial_jobs(&s, 2 * PLUGIN_POOL_SERIAL_JOBS);
    for (int stretch = 4 * PLUGIN_POOL_SERIAL_JOBS; stretch <= 4 * PLUGIN_POOL_SERIAL_MAX; stretch *= 2) {
        note_jobs(&s, 2, 2, job, stall);
        assert_serial_jobs(&s, stretch < PLUGIN_POOL_SERIAL_MAX ? stretch : PLUGIN_POOL_SERIAL_MAX);
    }
    note_jobs(&s, window, 0, job, 0); /* clean: the next stalls serialise SERIAL_JOBS again */
    note_jobs(&s, 2, 2, job, stall);
    assert_serial_jobs(&s, PLUGIN_POOL_SERIAL_JOBS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunk_runs_once_before_return),
        cmocka_unit_test(test_serial_jobs_stay_on_caller),
        cmocka_unit_test(test_stragglers_send_jobs_to_the_caller),
        cmocka_unit_test(test_straggler_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
