/* The plugins' thread pool (pool.h). Posting a job bumps `gen`, the futex word idle workers wait
 * on. Threads claim chunks by compare-and-swap on `claim`, which holds (generation << 32 | next
 * chunk). The caller publishes a job like a seqlock writer: it closes `claim` (generation 0,
 * which no job uses), writes the job's fields, then opens `claim` on the new generation. Readers
 * check that their claim succeeded on the very value they read the fields under, so nobody runs
 * a chunk with fields of another job (see pool_work). The caller waits for the last chunks
 * spinning, then on `n_done` as a futex that the thread finishing the last chunk wakes. */
#include "pool.h"

#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rlx/status.h"

#ifdef RLX_POOL_TEST_HOOKS
void (*plugin_pool_test_hook)(plugin_pool_hook_at at);
#define POOL_HOOK(at)                                                                                                  \
    do {                                                                                                               \
        if (plugin_pool_test_hook)                                                                                     \
            plugin_pool_test_hook(at);                                                                                 \
    } while (0)
#else
#define POOL_HOOK(at) ((void)0)
#endif

#define POOL_CLOSED 0 /* claim while the caller writes a job: generation 0 */

typedef struct pool_worker {
    plugin_pool *pool;
    int ith;
    pthread_t tid;
} pool_worker;

struct plugin_pool {
    int n_threads; /* including the caller */
    int n_started; /* workers running */
    int64_t spin_ns;
    pool_worker *workers;
    plugin_stragglers stragglers; /* the straggler rule of pool.h */
    /* The current job. Written only while claim is closed, but atomic because a late worker may
     * read them meanwhile (its claim then fails, so it never uses what it read). */
    _Atomic(plugin_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic uint32_t n_chunks;
    _Alignas(64) _Atomic uint32_t gen; /* futex word of idle workers; never 0 once a job ran */
    _Atomic int n_sleeping;            /* workers asleep on gen */
    _Atomic int quit;
    _Alignas(64) _Atomic uint64_t claim;
    _Alignas(64) _Atomic uint32_t n_done; /* chunks of the current job finished; caller's futex */
    _Atomic int caller_sleeping;
};

/* The pool's straggler thresholds (pool.h). */
#define POOL_STALL_MIN_NS 1000000
#define POOL_STALL_SHARE 3

int64_t plugin_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits until *word differs from old and returns its new value: busy-waits until the clock
 * passes spin_until, then sleeps on word as a futex, counted in *sleepers. seq_cst pairs with
 * pool_wake: either the waker sees *sleepers > 0 and wakes us, or we see its new value. */
static uint32_t pool_wait_change(_Atomic uint32_t *word, uint32_t old, _Atomic int *sleepers, int64_t spin_until) {
    uint32_t v;
    for (unsigned i = 1;; i++) {
        if ((v = atomic_load_explicit(word, memory_order_acquire)) != old)
            return v;
        _mm_pause();
        if (i % 64 == 0 && plugin_now_ns() > spin_until)
            break;
    }
    atomic_fetch_add(sleepers, 1);
    while ((v = atomic_load(word)) == old)
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
    atomic_fetch_sub(sleepers, 1);
    return v;
}

/* Call after a seq_cst store to *word: wakes up to n threads asleep on it, if any. */
static void pool_wake(_Atomic uint32_t *word, _Atomic int *sleepers, int n) {
    if (atomic_load(sleepers) > 0)
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Runs chunks of job g until none is left (or the job is no longer g).
 *
 * Why a successful claim proves that fn, ctx and n were job g's: the caller writes a job's
 * fields after closing claim and a release fence; we read them, then an acquire fence, then
 * the CAS. If one of our reads saw a field store of a later job, that store (after the release
 * fence) read by our load (before the acquire fence) makes the fences synchronize, so the
 * closing store happens before our CAS and, by coherence, the CAS reads claim at or after it:
 * a closed or newer value, never c, so it fails. Nor can a read return a value older than job
 * g's: we loaded claim = c with acquire from g's release opening (or a CAS after it). */
static void pool_work(plugin_pool *p, uint32_t g, int ith) {
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    while ((uint32_t)(c >> 32) == g) {
        POOL_HOOK(PLUGIN_POOL_HOOK_LOADED);
        const plugin_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        const uint32_t n = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
        POOL_HOOK(PLUGIN_POOL_HOOK_READ);
        atomic_thread_fence(memory_order_acquire);
        /* n may be a newer job's here; stopping early is harmless, the caller finishes g. */
        if ((uint32_t)c >= n)
            break;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acquire, memory_order_acquire))
            continue;
        fn(ctx, ith, (int64_t)(uint32_t)c);
        /* Counts a chunk of g: the caller resets n_done only after all of g's were counted. */
        if (atomic_fetch_add(&p->n_done, 1) + 1 == n)
            pool_wake(&p->n_done, &p->caller_sleeping, 1);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *pool_worker_main(void *arg) {
    pool_worker *w = arg;
    plugin_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = pool_wait_change(&p->gen, seen, &p->n_sleeping, plugin_now_ns() + p->spin_ns);
        if (atomic_load_explicit(&p->quit, memory_order_acquire))
            break;
        pool_work(p, seen, w->ith);
    }
    return NULL;
}

/* Only the caller (and destroy) writes gen. */
static uint32_t pool_next_gen(plugin_pool *p) {
    const uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    return g == POOL_CLOSED ? g + 1 : g;
}

void plugin_stragglers_init(plugin_stragglers *s, int64_t stall_min_ns, int stall_share) {
    *s = (plugin_stragglers){.stall_min_ns = stall_min_ns, .stall_share = stall_share};
}

bool plugin_stragglers_serial(plugin_stragglers *s) {
    if (s->serial_left <= 0)
        return false;
    s->serial_left--;
    return true;
}

void plugin_stragglers_note(plugin_stragglers *s, int64_t job_ns, int64_t wait_ns) {
    s->window_ns += job_ns;
    if (wait_ns >= s->stall_min_ns) {
        s->window_stall_ns += wait_ns;
        s->window_stalls++;
    }
    /* a window that has already stalled twice over its share ends now: a probe on a loaded
     * machine would otherwise spend a whole window of stalls, each worth hundreds of jobs */
    const bool early = s->window_stalls >= 2 && s->stall_share * s->window_stall_ns > s->window_ns;
    if (++s->window_jobs < PLUGIN_POOL_WINDOW_JOBS && !early)
        return;
    const int stretch = s->serial_next ? s->serial_next : PLUGIN_POOL_SERIAL_JOBS;
    if (s->stall_share * s->window_stall_ns > s->window_ns) {
        s->serial_left = stretch;
        s->serial_next = 2 * stretch < PLUGIN_POOL_SERIAL_MAX ? 2 * stretch : PLUGIN_POOL_SERIAL_MAX;
    } else if (s->window_stall_ns == 0) {
        s->serial_next = PLUGIN_POOL_SERIAL_JOBS;
    }
    s->window_jobs = s->window_stalls = 0;
    s->window_ns = s->window_stall_ns = 0;
}

void plugin_pool_run(plugin_pool *p, plugin_pool_fn fn, void *ctx, int64_t n_chunks, bool parallel) {
    if (parallel && plugin_stragglers_serial(&p->stragglers))
        parallel = false;
    if (!parallel || p->n_threads == 1 || n_chunks <= 1) {
        for (int64_t i = 0; i < n_chunks; i++)
            fn(ctx, 0, i);
        return;
    }
    const int64_t t0 = plugin_now_ns();
    const uint32_t g = pool_next_gen(p);
    /* Every chunk of the previous job has finished, but a late worker may still be between
     * loading claim and its CAS: closing first makes that CAS fail (see pool_work). */
    atomic_store_explicit(&p->claim, POOL_CLOSED, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n_chunks, (uint32_t)n_chunks, memory_order_relaxed);
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    POOL_HOOK(PLUGIN_POOL_HOOK_PUBLISH);
    atomic_store_explicit(&p->claim, (uint64_t)g << 32, memory_order_release);
    atomic_store(&p->gen, g);
    pool_wake(&p->gen, &p->n_sleeping, INT_MAX);

    pool_work(p, g, 0);
    const int64_t t1 = plugin_now_ns();
    uint32_t d;
    while ((d = atomic_load_explicit(&p->n_done, memory_order_acquire)) < (uint32_t)n_chunks)
        pool_wait_change(&p->n_done, d, &p->caller_sleeping, t1 + p->spin_ns);
    const int64_t t2 = plugin_now_ns();
    plugin_stragglers_note(&p->stragglers, t2 - t0, t2 - t1);
}

void plugin_pool_destroy(plugin_pool *p) {
    if (!p)
        return;
    atomic_store_explicit(&p->quit, 1, memory_order_relaxed);
    atomic_store(&p->gen, pool_next_gen(p)); /* release: a worker that sees it sees quit */
    pool_wake(&p->gen, &p->n_sleeping, INT_MAX);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i].tid, NULL);
    free(p->workers);
    free(p);
}

int plugin_pool_create(int n_threads, int64_t spin_ns, plugin_pool **out) {
    *out = NULL;
    /* aligned: the hot atomics sit on cache lines of their own */
    plugin_pool *p = aligned_alloc(_Alignof(plugin_pool), sizeof *p);
    if (!p)
        return RLX_E_NOMEM;
    memset(p, 0, sizeof *p);
    plugin_stragglers_init(&p->stragglers, POOL_STALL_MIN_NS, POOL_STALL_SHARE);
    p->n_threads = n_threads > 1 ? n_threads : 1;
    p->spin_ns = spin_ns;
    p->workers = calloc((size_t)p->n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return RLX_E_NOMEM;
    }
    for (int i = 1; i < p->n_threads; i++) {
        pool_worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->tid, NULL, pool_worker_main, w) != 0) {
            plugin_pool_destroy(p);
            return RLX_E_INTERNAL;
        }
        p->n_started++;
    }
    *out = p;
    return 0;
}
