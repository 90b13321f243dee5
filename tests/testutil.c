/* The helpers of testutil.h. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

// ---- time ----

double tu_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct timespec tu_after_ms(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += ms % 1000 * 1000000L;
    if (t.tv_nsec >= 1000000000L)
        t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

void tu_sleep_ms(long ms) {
    struct timespec t = {ms / 1000, ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

// ---- random numbers ----

void tu_fill(float *x, int64_t n, uint64_t *s) {
    for (int64_t i = 0; i < n; i++)
        x[i] = tu_uniform(s);
}

// ---- graphs ----

rlx_graph *tu_doubling_chain(int64_t rows, int64_t cols, int n_doublings, int gather_last, int *x, int *out) {
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    *x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){rows, cols}, NULL);
    int prev = *x;
    for (int i = 0; i < n_doublings; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", i + 1);
        prev = rlx_graph_add_node(g, RLX_OP_ADD, name, (int[]){prev, prev}, 2, NULL);
        assert_true(prev >= 0);
    }
    *out = gather_last ? rlx_graph_add_node(g, RLX_OP_GATHER_LAST, "last", &prev, 1, NULL) : prev;
    assert_ok(rlx_graph_mark_output(g, *out));
    return g;
}

// ---- a model and a backend, for a group's setup ----

int tu_open_model(const char *dir, const char *backend, const rlx_backend_options *bo, rlx_model **m,
                  rlx_plugin_handle **plugin, rlx_backend **b) {
    *m = NULL, *plugin = NULL, *b = NULL;
    if (!backend)
        backend = getenv("RLX_BACKEND") ? getenv("RLX_BACKEND") : "cpu-blas";
    rlx_registry *r = NULL;
    int ok = rlx_model_open(dir, m) == RLX_OK;
    if (ok && strcmp(backend, "ref") != 0)
        ok = rlx_registry_create(NULL, &r) == RLX_OK &&
             rlx_registry_load(r, RLX_PLUGIN_BACKEND, backend, plugin) == RLX_OK &&
             rlx_backend_create(*plugin, bo, b) == RLX_OK;
    if (!ok)
        fprintf(stderr, "setup: %s\n", rlx_last_error());
    rlx_registry_destroy(r);
    return ok ? 0 : -1;
}

void tu_close_model(rlx_model *m, rlx_plugin_handle *plugin, rlx_backend *b) {
    rlx_model_close(m);
    rlx_backend_destroy(b);
    rlx_plugin_unload(plugin);
}

// ---- the events of an engine request ----

void tu_events_init(tu_events *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

void tu_events_destroy(tu_events *r) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

/* Blocks the worker (r->mu held) at each hold this token reaches, until released or timed out. */
static void hold_here(tu_events *r) {
    for (int h = 0; h < 2; h++)
        if (r->hold[h] && r->n == r->hold[h]) {
            r->holding = h + 1;
            pthread_cond_broadcast(&r->cv);
            const struct timespec until = tu_after_ms(r->hold_ms ? r->hold_ms : TU_WAIT_MS);
            while (r->releases <= h)
                if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0)
                    break;
            r->holding = 0;
        }
}

int tu_on_event(void *ctx, const rlx_engine_event *ev) {
    tu_events *r = ctx;
    rlx_engine *cancel = NULL;
    int stop = 0;
    pthread_mutex_lock(&r->mu);
    if (r->n_done)
        r->events_after_done++;
    if (ev->kind == RLX_ENGINE_TOKEN) {
        if (r->n < TU_MAX_TOKENS) {
            r->tokens[r->n] = ev->token;
            r->logprobs[r->n] = ev->logprob;
            r->n_top[r->n] = ev->n_top;
            for (uint32_t k = 0; k < ev->n_top && k < TU_MAX_TOP; k++) {
                r->top_ids[r->n][k] = ev->top_ids[k];
                r->top_lp[r->n][k] = ev->top_logprobs[k];
            }
        } else {
            r->bad_events++; /* more tokens than any request of the tests asks for */
        }
        r->n++;
        stop = r->stop_after > 0 && r->n >= r->stop_after;
        if (r->cancel_at && r->n >= r->cancel_at && r->id && !r->cancel_sent) {
            r->cancel_sent = 1;
            cancel = r->engine;
        }
        pthread_cond_broadcast(&r->cv);
        hold_here(r);
    } else if (ev->kind == RLX_ENGINE_DONE) {
        r->done = *ev;
        snprintf(r->message, sizeof r->message, "%s", ev->message ? ev->message : "(null)");
        r->done.message = r->message;
        r->t_done = tu_now_s();
        r->n_done++;
    } else {
        r->bad_events++;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    /* a callback may cancel (engine.c delivers events without its lock held) */
    if (cancel)
        rlx_engine_cancel(cancel, r->id);
    return stop;
}

void tu_events_submitted(tu_events *r, rlx_engine *e, uint64_t id) {
    pthread_mutex_lock(&r->mu);
    r->engine = e;
    r->id = id;
    pthread_mutex_unlock(&r->mu);
}

int tu_wait_done(tu_events *r, long ms) {
    const struct timespec until = tu_after_ms(ms);
    pthread_mutex_lock(&r->mu);
    while (!r->n_done)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0)
            break;
    const int done = r->n_done > 0;
    pthread_mutex_unlock(&r->mu);
    return done;
}

int tu_wait_tokens(tu_events *r, uint32_t n, long ms) {
    const struct timespec until = tu_after_ms(ms);
    pthread_mutex_lock(&r->mu);
    while (r->n < n && !r->n_done)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0)
            break;
    const int got = r->n >= n;
    pthread_mutex_unlock(&r->mu);
    return got;
}

int tu_wait_holding(tu_events *r, int h, long ms) {
    const struct timespec until = tu_after_ms(ms);
    pthread_mutex_lock(&r->mu);
    while (r->holding != h && !r->n_done)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0)
            break;
    const int holding = r->holding == h;
    pthread_mutex_unlock(&r->mu);
    return holding;
}

void tu_release(tu_events *r) {
    pthread_mutex_lock(&r->mu);
    r->releases++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

uint32_t tu_tokens_of(tu_events *r) {
    pthread_mutex_lock(&r->mu);
    const uint32_t n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void *tu_before_guard(size_t bytes, void **map, size_t *len) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), body = (bytes + page - 1) / page * page;
    *len = body + page;
    *map = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(*map != MAP_FAILED);
    assert_int_equal(mprotect((char *)*map + body, page, PROT_NONE), 0);
    return (char *)*map + body - bytes;
}
