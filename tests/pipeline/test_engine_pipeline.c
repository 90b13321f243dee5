/* The batched engine over a pipeline (rlx_engine_create_pipeline), its stages served in this
 * process over the tcp transport on 127.0.0.1, against the engine on the whole model:
 * - parity: over 2 and 3 stages, requests of every prompt length (chunked prompts, a prefix
 *   copied between slots while its owner decodes), greedy and seeded, give the tokens,
 *   log-probabilities and top alternatives of the local engine to the bit;
 * - stress: threads submitting and cancelling at random moments lose no request, each gets one
 *   DONE and nothing after it, the finished ones their local tokens, and teardown is prompt;
 * - recovery: a stage stopped mid-stream and served again at its address, or one whose link
 *   stalls, is replaced and the streams replayed (outputs unchanged to the bit, one recovery
 *   counted); with no replacement in time every request ends with an error naming the stage,
 *   within a bound;
 * - the slot contract: a step whose rows of a slot skip a position is refused;
 * - a hybrid (second argument `hybrid`, a model with linear-attention layers): prefix reuse only
 *   where a slot's recurrent state ends, and recovery, also after every slot restarted with a
 *   shorter sequence than it held, each to the bit.
 *
 * Bit parity needs batch-invariant kernels: cpu-blas in its batch_invariant=1 mode (or the
 * reference kernels with RLX_BACKEND=ref). The model is the first argument (deep-dense-f32, five
 * layers, by default); RLX_TEST_SEED changes the stress test's random choices. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define TCP_PLUGIN RLX_BUILD_PLUGIN_DIR "/rlx-transport-tcp.so"
#define BLAS_PLUGIN RLX_BUILD_PLUGIN_DIR "/rlx-backend-cpu-blas.so"

#define MAX_PROMPT 64
#define N_TOP TU_MAX_TOP
#define CAPACITY 160 /* positions per slot, in the stages and in the local engine */
#define MAX_STAGES 3
/* the driver's bound on a control message and, plus 100 ms per row, on a step: short, so a
 * stalled stage is noticed within seconds (a closed connection is noticed at once anyway) */
#define TIMEOUT_MS 2000
/* the longest any single wait of this test may take (ASan on two cores is slow) */
#define WAIT_MS 90000
/* How long the engine, the driver and a stage may take to shut down: the engine waits for the
 * steps in flight (milliseconds each here), the driver for its threads' jobs and the stages'
 * answers to EndSession (at most TIMEOUT_MS), a stage for its poll (20 ms). */
#define TEARDOWN_MS 5000

static const char *model_dir = RLX_TEST_DATA "/deep-dense-f32";
static rlx_model *model;
static rlx_plugin_handle *tcp, *blas;
static int64_t vocab;
static uint64_t seed = 0x5eedf00dULL;

/* ---- log lines: the recovery's report is part of what is checked ---- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[32768];
static size_t log_len;
static double t_replaced; /* when the first "replaced" line came, 0 before */

static void on_log(void *ctx, int level, const char *message) {
    (void)ctx;
    if (level > 1)
        return;
    fprintf(stderr, "[rlx %s] %s\n", level ? "warning" : "error", message);
    pthread_mutex_lock(&log_mu);
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s\n", message);
    if (n > 0)
        log_len = log_len + (size_t)n < sizeof log_text ? log_len + (size_t)n : sizeof log_text - 1;
    if (!t_replaced && strstr(message, "replaced and its streams replayed"))
        t_replaced = tu_now_s();
    pthread_mutex_unlock(&log_mu);
}

static void log_clear(void) {
    pthread_mutex_lock(&log_mu);
    log_len = 0;
    log_text[0] = 0;
    t_replaced = 0;
    pthread_mutex_unlock(&log_mu);
}

/* Whether a logged line holds both a and b. */
static int log_has(const char *a, const char *b) {
    int found = 0;
    pthread_mutex_lock(&log_mu);
    for (const char *line = log_text; *line && !found;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[1200];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        found = strstr(buf, a) && strstr(buf, b);
        line += len + (end ? 1 : 0);
    }
    pthread_mutex_unlock(&log_mu);
    return found;
}

/* ---- backends ---- */

/* A backend instance of its own for each user: an instance takes calls from one thread at a time
 * (backend_iface.h), and every stage and the local engine compute on their own threads. One
 * thread each, so four of them do not fight over two cores. NULL means the reference kernels. */
static rlx_backend *new_backend(void) {
    if (!blas)
        return NULL;
    const rlx_backend_options bo = {.size = sizeof bo, .n_threads = 1, .extra = "batch_invariant=1"};
    rlx_backend *b = NULL;
    assert_ok(rlx_backend_create(blas, &bo, &b));
    return b;
}

/* ---- requests and what they received ---- */

typedef struct spec {
    int32_t prompt[MAX_PROMPT];
    uint32_t n_prompt, max_tokens;
    int sampled;   /* else greedy */
    uint64_t seed; /* the sampler's, when sampled */
    uint32_t top;  /* top_logprobs; every request asks for log-probabilities */
    /* stress: 1 = the submitting thread cancels after cancel_ms, 2 = the callback cancels at
     * token cancel_at */
    int cancel;
    uint32_t cancel_ms, cancel_at;
} spec;

/* Waits up to WAIT_MS until r's callback holds the engine's worker at its hold h (1 or 2). */
static void wait_holding(tu_events *r, int h) {
    if (!tu_wait_holding(r, h, WAIT_MS))
        fail_msg("the engine's worker did not reach hold %d (token %u) within %d ms: %u tokens", h, r->hold[h - 1],
                 WAIT_MS, tu_tokens_of(r));
}

/* never generated: no request stops early, so every comparison runs the whole length */
static const int32_t no_stop = -1;

static rlx_request make_request(const spec *s, tu_events *r) {
    rlx_request q = {.size = sizeof q, .prompt = s->prompt, .n_prompt = s->n_prompt, .max_tokens = s->max_tokens};
    q.sampler = rlx_sampler_params_default();
    if (s->sampled) {
        /* the seed makes the draws the request's own, wherever and beside whatever it runs */
        q.sampler.temperature = 0.9f;
        q.sampler.top_k = 40;
        q.sampler.top_p = 0.95f;
        q.sampler.repeat_penalty = 1.1f;
        q.sampler.seed = s->seed;
    } else {
        q.sampler.greedy = 1;
    }
    q.logprobs = 1;
    q.top_logprobs = s->top;
    q.stop_ids = &no_stop;
    q.n_stop_ids = 1;
    q.on_event = tu_on_event;
    q.ctx = r;
    return q;
}

static void random_ids(uint64_t *rng, int32_t *out, uint32_t n) {
    for (uint32_t k = 0; k < n; k++)
        out[k] = (int32_t)(tu_rand(rng) % (uint64_t)vocab);
}

/* Whether `got` received exactly `want`'s events over want's first n tokens: ids,
 * log-probabilities and alternatives, floats compared as bits. Says where they part. */
static int same_tokens(const char *what, int i, const tu_events *got, const tu_events *want, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) {
        const int differ = got->tokens[k] != want->tokens[k] ||
                           memcmp(&got->logprobs[k], &want->logprobs[k], sizeof(float)) != 0 ||
                           got->n_top[k] != want->n_top[k] ||
                           memcmp(got->top_ids[k], want->top_ids[k], want->n_top[k] * sizeof(int32_t)) != 0 ||
                           memcmp(got->top_lp[k], want->top_lp[k], want->n_top[k] * sizeof(float)) != 0;
        if (differ) {
            fprintf(stderr,
                    "%s: request %d token %u: pipeline %d (log-prob %.9g, best alternative %d at %.9g), "
                    "local engine %d (log-prob %.9g, best alternative %d at %.9g)\n",
                    what, i, k, got->tokens[k], (double)got->logprobs[k], got->n_top[k] ? got->top_ids[k][0] : -1,
                    got->n_top[k] ? (double)got->top_lp[k][0] : 0.0, want->tokens[k], (double)want->logprobs[k],
                    want->n_top[k] ? want->top_ids[k][0] : -1, want->n_top[k] ? (double)want->top_lp[k][0] : 0.0);
            return 0;
        }
    }
    return 1;
}

/* Runs the requests on the engine over the whole model, all submitted at once on `slots` slots
 * with a budget of 64 rows per step (prompts mostly in one pass, unlike the pipeline's chunks):
 * the reference every pipeline request must equal. */
static void run_local(const spec *specs, uint32_t n, uint32_t slots, tu_events *out) {
    rlx_backend *b = new_backend();
    rlx_engine_options o = rlx_engine_options_default();
    o.n_slots = slots;
    o.slot_positions = CAPACITY;
    o.max_queue = n;
    o.step_tokens = 64;
    o.backends = b ? &b : NULL;
    o.n_backends = b ? 1 : 0;
    rlx_engine *e;
    assert_ok(rlx_engine_create(model, &o, &e));
    for (uint32_t i = 0; i < n; i++) {
        tu_events_init(&out[i]);
        rlx_request q = make_request(&specs[i], &out[i]);
        uint64_t id;
        assert_ok(rlx_engine_submit(e, &q, &id));
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!tu_wait_done(&out[i], WAIT_MS))
            fail_msg("local engine: request %u did not finish within %d ms", i, WAIT_MS);
        if (out[i].done.finish != RLX_FINISH_LENGTH || out[i].n != specs[i].max_tokens)
            fail_msg("local engine: request %u ended with finish %u after %u tokens: %s", i, out[i].done.finish,
                     out[i].n, out[i].message);
    }
    rlx_engine_destroy(e);
    rlx_backend_destroy(b);
}

/* ---- stages in threads ---- */

typedef struct stage_run {
    pthread_t thread;
    int started; /* a thread runs rlx_stage_serve, not joined yet */
    rlx_layer_range layers;
    rlx_backend *backend;
    char listen[64]; /* where to listen: 127.0.0.1:0, or the address of the stage it replaces */
    volatile sig_atomic_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char address[64]; /* bound, once listening */
    int listening, ended;
    rlx_status rc;
    char error[512];
} stage_run;

static void on_listening(void *ctx, const char *bound) {
    stage_run *s = ctx;
    pthread_mutex_lock(&s->mu);
    snprintf(s->address, sizeof s->address, "%s", bound);
    s->listening = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* The stages' idle timeout; 0 = the default (far beyond any test). */
static uint32_t stage_idle_ms;

static void *serve(void *arg) {
    stage_run *s = arg;
    rlx_stage_options o = rlx_stage_options_default();
    o.address = s->listen;
    o.transport = tcp;
    o.layers = s->layers;
    o.session = (rlx_session_options){.size = sizeof(rlx_session_options),
                                      .kv_capacity = CAPACITY,
                                      .backends = s->backend ? &s->backend : NULL,
                                      .n_backends = s->backend ? 1 : 0};
    o.backend_name = s->backend ? "cpu-blas" : "ref";
    o.timeout_ms = TIMEOUT_MS;
    o.poll_ms = 20; /* how soon the stop flag is seen */
    o.idle_timeout_ms = stage_idle_ms;
    o.stop = &s->stop;
    o.on_listening = on_listening;
    o.ctx = s;
    rlx_status rc = rlx_stage_serve(model, &o);
    pthread_mutex_lock(&s->mu);
    s->rc = rc;
    snprintf(s->error, sizeof s->error, "%s", rc == RLX_OK ? "" : rlx_last_error());
    s->ended = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Serves layers on `listen` in a new thread and waits until it listens. */
static void stage_start(stage_run *s, rlx_layer_range layers, const char *listen) {
    s->layers = layers;
    snprintf(s->listen, sizeof s->listen, "%s", listen);
    s->stop = 0;
    s->listening = s->ended = 0;
    s->address[0] = 0;
    if (!s->backend)
        s->backend = new_backend();
    assert_int_equal(pthread_create(&s->thread, NULL, serve, s), 0);
    s->started = 1;
    const struct timespec until = tu_after_ms(WAIT_MS);
    pthread_mutex_lock(&s->mu);
    while (!s->listening && !s->ended)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
            break;
    const int listening = s->listening;
    pthread_mutex_unlock(&s->mu);
    if (!listening)
        fail_msg("stage %u-%u did not listen on %s: %s", layers.start, layers.end - 1, listen, s->error);
}

/* Sets the stage's stop flag and joins its thread within ms: rlx_stage_serve sees the flag every
 * poll_ms, and a step it computes is short. Returns the milliseconds it took. */
static double stage_stop(stage_run *s, long ms) {
    if (!s->started)
        return 0;
    const double t0 = tu_now_s();
    s->stop = 1;
    struct timespec until = tu_after_ms(ms);
    int err = pthread_timedjoin_np(s->thread, NULL, &until);
    if (err)
        fail_msg("stage %u-%u did not stop within %ld ms: %s", s->layers.start, s->layers.end - 1, ms, strerror(err));
    s->started = 0;
    if (s->rc != RLX_OK)
        fail_msg("stage %u-%u ended with %s: %s", s->layers.start, s->layers.end - 1, rlx_status_str(s->rc), s->error);
    return (tu_now_s() - t0) * 1000;
}

/* ---- a link that stalls ---- */

/* A TCP relay in front of one stage: it passes bytes both ways until proxy_freeze(), after which
 * the connections open then carry nothing more (what arrives is read and dropped, so a hang-up
 * is still seen and passed on to the other side), while new connections are relayed again. So
 * the stage stalls mid-stream as behind a hung host or a lost route, with its connection up,
 * and the driver's reconnection reaches the same stage. */
#define PROXY_PAIRS 8

typedef struct proxy {
    int listen_fd;
    char address[64]; /* where the driver connects */
    struct sockaddr_in target;
    pthread_t thread;
    int started;
    atomic_int stop, freeze;
    struct {
        int fd[2]; /* the driver's side, the stage's */
        int frozen;
    } pairs[PROXY_PAIRS];
    int n;
} proxy;

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *proxy_main(void *arg) {
    proxy *x = arg;
    static char buf[1 << 16]; /* one proxy runs at a time */
    const int one = 1;
    while (!atomic_load(&x->stop)) {
        if (atomic_exchange(&x->freeze, 0))
            for (int k = 0; k < x->n; k++)
                x->pairs[k].frozen = 1;
        struct pollfd pf[1 + 2 * PROXY_PAIRS];
        pf[0] = (struct pollfd){.fd = x->listen_fd, .events = POLLIN};
        for (int k = 0; k < x->n; k++)
            for (int side = 0; side < 2; side++)
                pf[1 + 2 * k + side] = (struct pollfd){.fd = x->pairs[k].fd[side], .events = POLLIN};
        /* the timeout bounds how late stop and freeze are seen */
        if (poll(pf, (nfds_t)(1 + 2 * x->n), 10) <= 0)
            continue;
        /* from the last pair down, so removing one moves an already handled pair into its place */
        for (int k = x->n - 1; k >= 0; k--) {
            int dead = 0;
            for (int side = 0; side < 2 && !dead; side++) {
                if (!(pf[1 + 2 * k + side].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
                ssize_t got = recv(x->pairs[k].fd[side], buf, sizeof buf, 0);
                if (got <= 0 || (!x->pairs[k].frozen && send_all(x->pairs[k].fd[1 - side], buf, (size_t)got) != 0))
                    dead = 1;
            }
            if (dead) {
                close(x->pairs[k].fd[0]);
                close(x->pairs[k].fd[1]);
                x->pairs[k] = x->pairs[--x->n];
            }
        }
        if (pf[0].revents & POLLIN) {
            int c = accept(x->listen_fd, NULL, NULL);
            int s = c >= 0 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
            if (s >= 0 && x->n < PROXY_PAIRS &&
                connect(s, (const struct sockaddr *)&x->target, sizeof x->target) == 0) {
                /* small messages both ways: no Nagle delay on top of the transport's */
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                x->pairs[x->n].fd[0] = c;
                x->pairs[x->n].fd[1] = s;
                x->pairs[x->n].frozen = 0;
                x->n++;
            } else {
                if (c >= 0)
                    close(c);
                if (s >= 0)
                    close(s);
            }
        }
    }
    for (int k = 0; k < x->n; k++) {
        close(x->pairs[k].fd[0]);
        close(x->pairs[k].fd[1]);
    }
    x->n = 0;
    return NULL;
}

/* Relays 127.0.0.1:<a free port> to target ("127.0.0.1:PORT"). */
static void proxy_start(proxy *x, const char *target) {
    memset(x, 0, sizeof *x);
    const char *colon = strrchr(target, ':');
    assert_non_null(colon);
    x->target.sin_family = AF_INET;
    x->target.sin_port = htons((uint16_t)atoi(colon + 1));
    assert_int_equal(inet_pton(AF_INET, "127.0.0.1", &x->target.sin_addr), 1);
    struct sockaddr_in at = {.sin_family = AF_INET};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof at;
    x->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(x->listen_fd >= 0);
    assert_int_equal(bind(x->listen_fd, (struct sockaddr *)&at, sizeof at), 0);
    assert_int_equal(listen(x->listen_fd, 8), 0);
    assert_int_equal(getsockname(x->listen_fd, (struct sockaddr *)&at, &len), 0);
    snprintf(x->address, sizeof x->address, "127.0.0.1:%u", (unsigned)ntohs(at.sin_port));
    assert_int_equal(pthread_create(&x->thread, NULL, proxy_main, x), 0);
    x->started = 1;
}

static void proxy_freeze(proxy *x) { atomic_store(&x->freeze, 1); }

static void proxy_stop(proxy *x) {
    if (!x->started)
        return;
    atomic_store(&x->stop, 1);
    struct timespec until = tu_after_ms(TEARDOWN_MS);
    if (pthread_timedjoin_np(x->thread, NULL, &until) != 0)
        fail_msg("the relay did not stop within %d ms", TEARDOWN_MS);
    x->started = 0;
    close(x->listen_fd);
}

typedef struct pipeline {
    uint32_t n_stages;
    stage_run stages[MAX_STAGES];
    rlx_driver *driver;
    rlx_engine *engine;
} pipeline;

/* Starts n_stages stages over an even split of the layers, a driver of n_slots slots (recovery
 * within recovery_ms, 0 = the default) and an engine over it with step_tokens rows per step and
 * max_queue requests waiting (0 = the default). With px, the driver reaches stage `relayed`
 * through that relay. */
static void pipeline_start(pipeline *p, uint32_t n_stages, uint32_t n_slots, uint32_t step_tokens, uint32_t max_queue,
                           uint32_t recovery_ms, proxy *px, uint32_t relayed) {
    memset(p, 0, sizeof *p);
    p->n_stages = n_stages;
    rlx_layer_range ranges[MAX_STAGES];
    assert_ok(rlx_dist_split_even((uint32_t)rlx_model_config_of(model)->num_hidden_layers, n_stages, ranges));
    rlx_driver_stage ds[MAX_STAGES];
    for (uint32_t i = 0; i < n_stages; i++) {
        stage_run *s = &p->stages[i];
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cv, NULL);
        stage_start(s, ranges[i], "127.0.0.1:0");
        ds[i] = (rlx_driver_stage){.address = s->address, .layers = ranges[i]};
    }
    if (px) {
        proxy_start(px, p->stages[relayed].address);
        ds[relayed].address = px->address;
    }
    rlx_driver_options o = rlx_driver_options_default();
    o.transport = tcp;
    o.stages = ds;
    o.n_stages = n_stages;
    o.kv_capacity = CAPACITY;
    o.connect_timeout_ms = 10000;
    o.timeout_ms = TIMEOUT_MS;
    o.n_slots = n_slots;
    o.recovery_timeout_ms = recovery_ms;
    assert_ok(rlx_driver_create(model_dir, &o, &p->driver));
    assert_int_equal(rlx_driver_n_slots(p->driver), n_slots);
    assert_int_equal(rlx_driver_capacity(p->driver), CAPACITY);
    rlx_engine_options eo = rlx_engine_options_default();
    eo.step_tokens = step_tokens;
    eo.max_queue = max_queue;
    assert_ok(rlx_engine_create_pipeline(p->driver, &eo, &p->engine));
}

/* ---- teardown, bounded ---- */

typedef struct call {
    void (*fn)(void *);
    void *arg;
} call;

static void *run_call(void *p) {
    const call *c = p;
    c->fn(c->arg);
    return NULL;
}

/* Runs fn(arg) on a thread of its own and fails when it takes longer than ms, so a teardown
 * that hangs fails the test rather than hanging it. Returns the milliseconds it took. */
static double bounded(void (*fn)(void *), void *arg, long ms, const char *what) {
    call c = {fn, arg};
    pthread_t t;
    const double t0 = tu_now_s();
    assert_int_equal(pthread_create(&t, NULL, run_call, &c), 0);
    struct timespec until = tu_after_ms(ms);
    if (pthread_timedjoin_np(t, NULL, &until) != 0)
        fail_msg("%s did not finish within %ld ms", what, ms);
    return (tu_now_s() - t0) * 1000;
}

static void engine_destroy_fn(void *e) { rlx_engine_destroy(e); }
static void driver_destroy_fn(void *d) { rlx_driver_destroy(d); }

static pipeline pl;
static proxy px; /* the stall test's relay */

/* Destroys the engine, then the driver, then stops the stages, each within its bound. */
static void pipeline_stop(pipeline *p) {
    if (p->engine) {
        const double ms = bounded(engine_destroy_fn, p->engine, TEARDOWN_MS, "rlx_engine_destroy");
        p->engine = NULL;
        fprintf(stderr, "rlx_engine_destroy took %.0f ms\n", ms);
    }
    if (p->driver) {
        const double ms = bounded(driver_destroy_fn, p->driver, TEARDOWN_MS, "rlx_driver_destroy");
        p->driver = NULL;
        fprintf(stderr, "rlx_driver_destroy took %.0f ms\n", ms);
    }
    for (uint32_t i = 0; i < p->n_stages; i++) {
        stage_stop(&p->stages[i], TEARDOWN_MS);
        rlx_backend_destroy(p->stages[i].backend);
        p->stages[i].backend = NULL;
        pthread_mutex_destroy(&p->stages[i].mu);
        pthread_cond_destroy(&p->stages[i].cv);
    }
    p->n_stages = 0;
}

/* After a failed test: whatever still runs is stopped without asserting, so the next test
 * starts clean (a hung engine or driver is left behind rather than waited for forever). */
static int cleanup(void **state) {
    (void)state;
    pipeline *p = &pl;
    /* the stages serve until the engine and the driver are gone: a stage lost first would make
     * the driver try to replace it, for up to its recovery timeout */
    call c[2] = {{engine_destroy_fn, p->engine}, {driver_destroy_fn, p->driver}};
    for (int k = 0; k < 2; k++) {
        pthread_t t;
        struct timespec until = tu_after_ms(TEARDOWN_MS);
        if (c[k].arg && pthread_create(&t, NULL, run_call, &c[k]) == 0 && pthread_timedjoin_np(t, NULL, &until) != 0)
            return -1;
    }
    p->engine = NULL;
    p->driver = NULL;
    for (uint32_t i = 0; i < p->n_stages; i++)
        p->stages[i].stop = 1;
    for (uint32_t i = 0; i < p->n_stages; i++) {
        struct timespec until = tu_after_ms(TEARDOWN_MS);
        if (p->stages[i].started && pthread_timedjoin_np(p->stages[i].thread, NULL, &until) != 0)
            return -1;
        p->stages[i].started = 0;
        rlx_backend_destroy(p->stages[i].backend);
        p->stages[i].backend = NULL;
        pthread_mutex_destroy(&p->stages[i].mu);
        pthread_cond_destroy(&p->stages[i].cv);
    }
    p->n_stages = 0;
    if (px.started) {
        atomic_store(&px.stop, 1);
        struct timespec until = tu_after_ms(TEARDOWN_MS);
        if (pthread_timedjoin_np(px.thread, NULL, &until) != 0)
            return -1;
        px.started = 0;
        close(px.listen_fd);
    }
    return 0;
}

/* Submits, trying again while the queue is full: submit counts the requests the worker has not
 * admitted yet as queued, even with slots free, so a burst may be refused for a moment. */
static void submit(rlx_engine *e, const spec *s, tu_events *r) {
    rlx_request q = make_request(s, r);
    uint64_t id;
    const double give_up = tu_now_s() + WAIT_MS / 1000.0;
    rlx_status rc;
    while ((rc = rlx_engine_submit(e, &q, &id)) == RLX_E_BUSY && tu_now_s() < give_up)
        tu_sleep_ms(2);
    assert_ok(rc);
    tu_events_submitted(r, e, id);
}

static void wait_all(tu_events *r, uint32_t n, const char *what) {
    for (uint32_t i = 0; i < n; i++)
        if (!tu_wait_done(&r[i], WAIT_MS))
            fail_msg("%s: request %u got no DONE within %d ms (%u tokens so far)", what, i, WAIT_MS,
                     tu_tokens_of(&r[i]));
}

/* Every stage answered every step of the engine: Rows go through all the stages, in order. The
 * engine counts a step once its tokens are delivered, so the last DONE may come just before
 * the last step is counted: the counts are compared once they settle, within a bound. */
static void expect_steps_everywhere(const pipeline *p) {
    rlx_engine_stats es;
    rlx_driver_stage_stats ss[MAX_STAGES];
    const double give_up = tu_now_s() + 5;
    int same;
    do {
        rlx_engine_stats_of(p->engine, &es);
        same = 1;
        for (uint32_t i = 0; i < p->n_stages; i++) {
            assert_ok(rlx_driver_stage_stats_of(p->driver, i, &ss[i]));
            same &= ss[i].steps == es.steps;
        }
        if (!same)
            tu_sleep_ms(5);
    } while (!same && tu_now_s() < give_up);
    assert_true(es.steps > 0);
    for (uint32_t i = 0; i < p->n_stages; i++)
        if (ss[i].steps != es.steps)
            fail_msg("stage %u answered %llu steps, the engine took %llu back", i, (unsigned long long)ss[i].steps,
                     (unsigned long long)es.steps);
}

// ---- parity ----

/* Twelve requests on four slots with 16 rows per step: the first, a 40-token prompt read in
 * three chunks, decodes while three more with its first 24 tokens are admitted, each taking
 * them by a copy between slots in every stage (in order with the owner's steps, which write its
 * later positions meanwhile); the others, of 1 to 48 tokens, queue and take freed slots. Half
 * sample with their seeds. Each gets the local engine's events to the bit. */
static void parity(uint32_t n_stages) {
    enum { N = 12, SHARED = 24 };
    static spec specs[N];
    static tu_events want[N], got[N];
    memset(specs, 0, sizeof specs);
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    int32_t prefix[SHARED];
    random_ids(&rng, prefix, SHARED);
    const uint32_t suffix[4] = {16, 5, 11, 30}, shared_max[4] = {40, 12, 16, 10}, shared_top[4] = {5, 5, 0, 3};
    for (int i = 0; i < 4; i++) {
        memcpy(specs[i].prompt, prefix, sizeof prefix);
        random_ids(&rng, specs[i].prompt + SHARED, suffix[i]);
        specs[i].n_prompt = SHARED + suffix[i];
        specs[i].max_tokens = shared_max[i];
        specs[i].sampled = i % 2;
        specs[i].seed = 1000 + (uint64_t)i;
        specs[i].top = shared_top[i];
    }
    const uint32_t lens[8] = {3, 9, 17, 33, 1, 48, 16, 25}, maxes[8] = {20, 8, 14, 6, 18, 9, 22, 11};
    for (int i = 4; i < N; i++) {
        random_ids(&rng, specs[i].prompt, lens[i - 4]);
        specs[i].n_prompt = lens[i - 4];
        specs[i].max_tokens = maxes[i - 4];
        specs[i].sampled = i % 2;
        specs[i].seed = 1000 + (uint64_t)i;
        specs[i].top = i % 3 == 0 ? 2 : N_TOP;
    }
    run_local(specs, N, 4, want);

    pipeline_start(&pl, n_stages, 4, 16, 0, 0, NULL, 0);
    for (int i = 0; i < N; i++)
        tu_events_init(&got[i]);
    /* its prompt is in its slot once its first token came; the worker waits there until the
     * others are queued, so they are admitted while it runs whatever the scheduling */
    got[0].hold[0] = 1;
    submit(pl.engine, &specs[0], &got[0]);
    wait_holding(&got[0], 1);
    for (int i = 1; i < N; i++)
        submit(pl.engine, &specs[i], &got[i]);
    tu_release(&got[0]);
    wait_all(got, N, "pipeline");
    int differ = 0;
    for (int i = 0; i < N; i++) {
        if (got[i].done.finish != RLX_FINISH_LENGTH)
            fail_msg("request %d ended with finish %u status %d: %s", i, got[i].done.finish, got[i].done.status,
                     got[i].message);
        assert_int_equal(got[i].n, specs[i].max_tokens);
        assert_int_equal(got[i].done.usage.n_generated, specs[i].max_tokens);
        assert_int_equal(got[i].done.usage.n_prompt, specs[i].n_prompt);
        assert_int_equal(got[i].n_done, 1);
        assert_int_equal(got[i].events_after_done + got[i].bad_events, 0);
        differ += !same_tokens(n_stages == 2 ? "2 stages" : "3 stages", i, &got[i], &want[i], want[i].n);
    }
    assert_int_equal(differ, 0);
    /* the shared prefix came from the cache, not from the stages' compute */
    for (int i = 1; i < 4; i++)
        assert_int_equal(got[i].done.usage.n_cached, SHARED);
    rlx_engine_stats es;
    rlx_engine_stats_of(pl.engine, &es);
    assert_int_equal(es.requests_done, N);
    assert_int_equal(es.requests_failed + es.requests_cancelled, 0);
    assert_int_equal(es.running + es.queued, 0);
    expect_steps_everywhere(&pl);
    rlx_driver_stats ds;
    rlx_driver_stats_of(pl.driver, &ds);
    assert_int_equal(ds.recoveries, 0);
    pipeline_stop(&pl);
    for (int i = 0; i < N; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

static void test_parity_two_stages(void **state) {
    (void)state;
    parity(2);
}

static void test_parity_three_stages(void **state) {
    (void)state;
    parity(3);
}

// ---- stress ----

#define STRESS_THREADS 3
#define STRESS_EACH 20

typedef struct stress_arg {
    rlx_engine *e;
    const spec *specs; /* [STRESS_EACH] */
    tu_events *r;      /* [STRESS_EACH] */
    uint64_t rng;
    uint32_t busy; /* RLX_E_BUSY answers, each tried again */
    const char *error;
} stress_arg;

static void *stress_thread(void *p) {
    stress_arg *a = p;
    for (int i = 0; i < STRESS_EACH; i++) {
        const spec *s = &a->specs[i];
        tu_events *r = &a->r[i];
        r->cancel_at = s->cancel == 2 ? s->cancel_at : 0;
        rlx_request q = make_request(s, r);
        uint64_t id = 0;
        const double give_up = tu_now_s() + WAIT_MS / 1000.0;
        for (;;) {
            rlx_status rc = rlx_engine_submit(a->e, &q, &id);
            if (rc == RLX_OK)
                break;
            if (rc != RLX_E_BUSY) {
                a->error = "rlx_engine_submit: a status other than OK or BUSY";
                return NULL;
            }
            /* a full queue refuses at once: come back when a slot may have freed */
            a->busy++;
            if (tu_now_s() > give_up) {
                a->error = "the queue stayed full";
                return NULL;
            }
            tu_sleep_ms(2);
        }
        tu_events_submitted(r, a->e, id);
        if (s->cancel == 1) {
            tu_sleep_ms(s->cancel_ms);
            rlx_engine_cancel(a->e, id);
        }
        /* mostly in bursts, so the queue fills and refuses */
        if (tu_rand(&a->rng) % 4 == 0)
            tu_sleep_ms(1);
    }
    return NULL;
}

/* Three threads submit twenty requests each (prompts of 1 to 45 tokens, most sharing one of
 * three 20-token prefixes, so copies between slots run among everything else; 1 to 24 tokens)
 * into six slots over two stages, retrying when the queue (of three) is full; a third of the requests are
 * cancelled by their thread after up to 40 ms, a third by their own callback at a random token.
 * Each accepted request gets exactly one DONE and nothing after; what it received is the start
 * of its local run, all of it unless it was cancelled; the counters add up. Then six long
 * requests are left running and the engine, driver and stages are torn down within bounds,
 * each of the six still getting its one DONE. */
static void test_stress_submit_and_cancel(void **state) {
    (void)state;
    enum { N = STRESS_THREADS * STRESS_EACH, SHARED = 20, EXTRA = 6 };
    static spec specs[N];
    static tu_events want[N], got[N], extra[EXTRA];
    memset(specs, 0, sizeof specs);
    uint64_t rng = seed;
    fprintf(stderr, "stress seed %llu (RLX_TEST_SEED)\n", (unsigned long long)seed);
    int32_t prefixes[3][SHARED];
    for (int f = 0; f < 3; f++)
        random_ids(&rng, prefixes[f], SHARED);
    for (int i = 0; i < N; i++) {
        spec *s = &specs[i];
        const uint32_t family = (uint32_t)(tu_rand(&rng) % 4); /* 3: no shared prefix */
        const uint32_t own = 1 + (uint32_t)(tu_rand(&rng) % 25);
        if (family < 3) {
            memcpy(s->prompt, prefixes[family], sizeof prefixes[family]);
            random_ids(&rng, s->prompt + SHARED, own);
            s->n_prompt = SHARED + own;
        } else {
            random_ids(&rng, s->prompt, own);
            s->n_prompt = own;
        }
        s->max_tokens = 1 + (uint32_t)(tu_rand(&rng) % 24);
        s->sampled = tu_rand(&rng) % 4 == 0;
        s->seed = tu_rand(&rng);
        s->top = tu_rand(&rng) % 2 ? N_TOP : 0;
        s->cancel = (int)(tu_rand(&rng) % 3);
        s->cancel_ms = (uint32_t)(tu_rand(&rng) % 41);
        s->cancel_at = 1 + (uint32_t)(tu_rand(&rng) % s->max_tokens);
    }
    run_local(specs, N, 8, want);

    pipeline_start(&pl, 2, 6, 24, 3, 0, NULL, 0);
    stress_arg args[STRESS_THREADS];
    pthread_t th[STRESS_THREADS];
    for (int i = 0; i < N; i++)
        tu_events_init(&got[i]);
    for (int t = 0; t < STRESS_THREADS; t++) {
        args[t] = (stress_arg){.e = pl.engine,
                               .specs = specs + t * STRESS_EACH,
                               .r = got + t * STRESS_EACH,
                               .rng = seed + 1 + (uint64_t)t};
        assert_int_equal(pthread_create(&th[t], NULL, stress_thread, &args[t]), 0);
    }
    uint32_t busy = 0;
    for (int t = 0; t < STRESS_THREADS; t++) {
        /* each thread ends within its own bound (WAIT_MS of retries, 40 ms per cancel) */
        struct timespec until = tu_after_ms(2 * WAIT_MS);
        if (pthread_timedjoin_np(th[t], NULL, &until) != 0)
            fail_msg("stress thread %d did not end", t);
        if (args[t].error)
            fail_msg("stress thread %d: %s", t, args[t].error);
        busy += args[t].busy;
    }
    wait_all(got, N, "stress");
    uint32_t n_cancelled = 0, n_done = 0, differ = 0;
    for (int i = 0; i < N; i++) {
        const tu_events *r = &got[i];
        assert_int_equal(r->n_done, 1);
        assert_int_equal(r->events_after_done + r->bad_events, 0);
        assert_int_equal(r->done.usage.n_generated, r->n);
        assert_int_equal(r->done.usage.n_prompt, specs[i].n_prompt);
        assert_true(r->n <= specs[i].max_tokens);
        /* whatever came is what the request alone makes, cut short or not */
        differ += !same_tokens("stress", i, r, &want[i], r->n);
        if (r->done.finish == RLX_FINISH_CANCELLED) {
            if (!specs[i].cancel)
                fail_msg("request %d was not cancelled but ended CANCELLED after %u tokens", i, r->n);
            n_cancelled++;
        } else if (r->done.finish == RLX_FINISH_LENGTH) {
            assert_int_equal(r->n, specs[i].max_tokens);
            n_done++;
        } else {
            fail_msg("request %d ended with finish %u status %d: %s", i, r->done.finish, r->done.status, r->message);
        }
    }
    assert_int_equal(differ, 0);
    fprintf(stderr, "stress: %u finished, %u cancelled, %u BUSY answers\n", n_done, n_cancelled, busy);
    assert_true(n_cancelled > 0); /* else the cancels tested nothing */
    rlx_engine_stats es;
    rlx_engine_stats_of(pl.engine, &es);
    assert_int_equal(es.requests_done, n_done);
    assert_int_equal(es.requests_cancelled, n_cancelled);
    assert_int_equal(es.requests_failed, 0);
    assert_int_equal(es.requests_refused, busy);
    assert_int_equal(es.running + es.queued, 0);
    expect_steps_everywhere(&pl);
    rlx_driver_stats ds;
    rlx_driver_stats_of(pl.driver, &ds);
    assert_int_equal(ds.recoveries, 0);

    /* teardown with steps in flight: six long requests, destroyed mid-stream */
    for (int i = 0; i < EXTRA; i++) {
        tu_events_init(&extra[i]);
        spec s = specs[i];
        s.max_tokens = 100;
        submit(pl.engine, &s, &extra[i]);
    }
    if (!tu_wait_tokens(&extra[0], 2, WAIT_MS))
        fail_msg("the long requests got no tokens within %d ms", WAIT_MS);
    pipeline_stop(&pl);
    for (int i = 0; i < EXTRA; i++) {
        const tu_events *r = &extra[i];
        assert_int_equal(r->n_done, 1);
        assert_int_equal(r->events_after_done + r->bad_events, 0);
        assert_true(r->done.finish == RLX_FINISH_CANCELLED || (r->done.finish == RLX_FINISH_LENGTH && r->n == 100));
        /* a request's tokens do not depend on max_tokens: the start is the short run's */
        assert_true(same_tokens("stress, destroyed", i, r, &want[i], r->n < want[i].n ? r->n : want[i].n));
        tu_events_destroy(&extra[i]);
    }
    for (int i = 0; i < N; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

// ---- recovery ----

#define LONG_TOKENS 100

/* Four greedy requests of 100 tokens: two share a 20-token prefix (copied between slots, so the
 * replay log holds a copy), one prompt is chunked, one is short. */
static void long_specs(spec *specs) {
    enum { SHARED = 20 };
    memset(specs, 0, 4 * sizeof *specs);
    uint64_t rng = 0xdecafbadULL;
    int32_t prefix[SHARED];
    random_ids(&rng, prefix, SHARED);
    const uint32_t lens[4] = {SHARED + 6, SHARED + 13, 30, 5};
    for (int i = 0; i < 4; i++) {
        if (i < 2) {
            memcpy(specs[i].prompt, prefix, sizeof prefix);
            random_ids(&rng, specs[i].prompt + SHARED, lens[i] - SHARED);
        } else {
            random_ids(&rng, specs[i].prompt, lens[i]);
        }
        specs[i].n_prompt = lens[i];
        specs[i].max_tokens = LONG_TOKENS;
        specs[i].top = N_TOP;
    }
}

/* The worker's second hold: request 0's 12th token, when every request is well under way
 * (steps alternate between the two groups, so the others have a few tokens each) and none is
 * near its end. */
#define HOLD_TOKEN 12

/* Submits the four (the others while the first, its prompt in its slot, holds the worker) and
 * returns with the worker held at request 0's HOLD_TOKEN-th token; tu_release(&got[0]) lets it go.
 * What each has then is in before[]. */
static void start_long(const spec *specs, tu_events *got, uint32_t *before) {
    for (int i = 0; i < 4; i++)
        tu_events_init(&got[i]);
    got[0].hold[0] = 1;
    got[0].hold[1] = HOLD_TOKEN;
    submit(pl.engine, &specs[0], &got[0]);
    wait_holding(&got[0], 1);
    for (int i = 1; i < 4; i++)
        submit(pl.engine, &specs[i], &got[i]);
    tu_release(&got[0]);
    wait_holding(&got[0], 2);
    for (int i = 0; i < 4; i++) {
        before[i] = tu_tokens_of(&got[i]);
        if (before[i] < 3 || before[i] >= LONG_TOKENS)
            fail_msg("request %d had %u tokens at the hold, not 3 to %d", i, before[i], LONG_TOKENS - 1);
    }
}

/* Four greedy requests, each filling a slot to 80 positions: later sequences in those slots
 * restart at position 0 and stay shorter until the recovery, so the positions beyond them hold
 * these sequences' rows, which a replay must not feed to a recurrent state. */
static void fill_slots(void) {
    enum { PROMPT = 40, GEN = 40 };
    static spec specs[4];
    static tu_events got[4];
    memset(specs, 0, sizeof specs);
    uint64_t rng = 0xf111ed5107ULL;
    for (int i = 0; i < 4; i++) {
        random_ids(&rng, specs[i].prompt, PROMPT);
        specs[i].n_prompt = PROMPT;
        specs[i].max_tokens = GEN;
        tu_events_init(&got[i]);
        submit(pl.engine, &specs[i], &got[i]);
    }
    wait_all(got, 4, "filling the slots");
    for (int i = 0; i < 4; i++) {
        if (got[i].done.finish != RLX_FINISH_LENGTH)
            fail_msg("filling request %d ended with finish %u: %s", i, got[i].done.finish, got[i].message);
        tu_events_destroy(&got[i]);
    }
}

/* Stage `lost` of n_stages stops serving mid-stream (its listener and connections closed) and a
 * new one serves the same layers on the same address: the driver reconnects there, replays
 * every slot into it, and the four requests end as the local engine's runs, to the bit. With
 * `filled`, longer sequences ran in every slot before (fill_slots). */
static void recovery(uint32_t n_stages, uint32_t lost, int filled) {
    static spec specs[4];
    static tu_events want[4], got[4];
    long_specs(specs);
    run_local(specs, 4, 4, want);
    log_clear();
    pipeline_start(&pl, n_stages, 4, 16, 0, 30000, NULL, 0);
    if (filled)
        fill_slots();
    uint32_t before[4];
    start_long(specs, got, before);
    char address[64];
    snprintf(address, sizeof address, "%s", pl.stages[lost].address);
    /* the stage sees its stop flag between messages: with the worker let go it may be computing
     * a step, or waiting for the next, when it closes */
    pl.stages[lost].stop = 1;
    tu_release(&got[0]);
    const double stopped_ms = stage_stop(&pl.stages[lost], TEARDOWN_MS);
    stage_start(&pl.stages[lost], pl.stages[lost].layers, address);
    assert_string_equal(pl.stages[lost].address, address);
    wait_all(got, 4, "recovery");
    for (int i = 0; i < 4; i++) {
        if (got[i].done.finish != RLX_FINISH_LENGTH)
            fail_msg("request %d ended with finish %u status %d: %s", i, got[i].done.finish, got[i].done.status,
                     got[i].message);
        assert_int_equal(got[i].n, LONG_TOKENS);
        assert_int_equal(got[i].n_done, 1);
        assert_int_equal(got[i].events_after_done + got[i].bad_events, 0);
        assert_true(same_tokens("recovery", i, &got[i], &want[i], LONG_TOKENS));
    }
    rlx_driver_stats ds;
    rlx_driver_stats_of(pl.driver, &ds);
    fprintf(stderr, "stage %u of %u stopped in %.0f ms, replaced and replayed in %.3f s\n", lost, n_stages, stopped_ms,
            ds.last_recovery_seconds);
    assert_int_equal(ds.recoveries, 1);
    assert_true(ds.last_recovery_seconds > 0 && ds.recovery_seconds == ds.last_recovery_seconds);
    rlx_driver_stage_info info;
    assert_ok(rlx_driver_stage_info_of(pl.driver, lost, &info));
    assert_string_equal(info.address, address);
    char who[128];
    snprintf(who, sizeof who, "stage %u (%s)", lost, address);
    if (!log_has(who, "replaced and its streams replayed"))
        fail_msg("no log line says that %s was replaced", who);
    rlx_engine_stats es;
    rlx_engine_stats_of(pl.engine, &es);
    assert_int_equal(es.requests_done, filled ? 8 : 4);
    assert_int_equal(es.requests_failed, 0);
    pipeline_stop(&pl);
    for (int i = 0; i < 4; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

static void test_recovery_of_the_last_stage(void **state) {
    (void)state;
    recovery(2, 1, 0);
}

static void test_recovery_of_the_first_stage(void **state) {
    (void)state;
    recovery(2, 0, 0);
}

static void test_recovery_of_a_middle_stage(void **state) {
    (void)state;
    recovery(3, 1, 0);
}

/* The last of 2 stages lost while every slot holds a sequence shorter than one it held before:
 * the replay gives each slot's state its own positions only (a step's last row of a slot ends
 * the slot, rlx/dist.h). */
static void test_recovery_after_shorter_restarts(void **state) {
    (void)state;
    recovery(2, 1, 1);
}

/* No stage comes back at the lost one's address within recovery_timeout_ms (1500): every request
 * ends with RLX_FINISH_ERROR and a message naming the stage and its address, within the
 * recovery's bound plus a step's, and what each received before is its local run's start. A
 * request submitted afterwards fails at once with the same cause. */
static void test_unreplaced_stage_fails_naming_it(void **state) {
    (void)state;
    enum { RECOVERY_MS = 1500 };
    static spec specs[4];
    static tu_events want[4], got[4];
    long_specs(specs);
    run_local(specs, 4, 4, want);
    pipeline_start(&pl, 2, 4, 16, 0, RECOVERY_MS, NULL, 0);
    uint32_t before[4];
    start_long(specs, got, before);
    char who[128];
    snprintf(who, sizeof who, "stage 1 (%s)", pl.stages[1].address);
    const double t_stop = tu_now_s();
    pl.stages[1].stop = 1;
    tu_release(&got[0]);
    stage_stop(&pl.stages[1], TEARDOWN_MS);
    wait_all(got, 4, "unreplaced stage");
    double last = t_stop;
    for (int i = 0; i < 4; i++) {
        const tu_events *r = &got[i];
        if (r->done.finish != RLX_FINISH_ERROR || r->done.status == RLX_OK || !strstr(r->message, who))
            fail_msg("request %d ended with finish %u status %d after %u tokens: \"%s\" (wanted an error naming %s)", i,
                     r->done.finish, r->done.status, r->n, r->message, who);
        assert_int_equal(r->n_done, 1);
        assert_int_equal(r->events_after_done + r->bad_events, 0);
        assert_true(r->n >= before[i] && r->n < LONG_TOKENS);
        assert_true(same_tokens("unreplaced stage", i, r, &want[i], r->n));
        last = r->t_done > last ? r->t_done : last;
    }
    /* the message says recovery was tried for its whole time */
    char tried[64];
    snprintf(tried, sizeof tried, "not replaced within %d ms", RECOVERY_MS);
    int says = 0;
    for (int i = 0; i < 4; i++)
        says |= strstr(got[i].message, tried) != NULL;
    if (!says)
        fail_msg("no request's error says \"%s\": %s", tried, got[0].message);
    const double took_ms = (last - t_stop) * 1000;
    fprintf(stderr, "the last request failed %.0f ms after the stage stopped: %s\n", took_ms, got[0].message);
    /* the lost stage is noticed at once (its connection closes), then replacing it is tried for
     * RECOVERY_MS; a step's deadline (TIMEOUT_MS) covers the rest */
    assert_true(took_ms >= RECOVERY_MS - 100);
    assert_true(took_ms < RECOVERY_MS + TIMEOUT_MS + 1000);
    rlx_driver_stats ds;
    rlx_driver_stats_of(pl.driver, &ds);
    assert_int_equal(ds.recoveries, 0);
    rlx_engine_stats es;
    rlx_engine_stats_of(pl.engine, &es);
    assert_int_equal(es.requests_failed, 4);
    /* the driver refuses from now on: a new request fails without another recovery's wait */
    tu_events late;
    tu_events_init(&late);
    const double t_late = tu_now_s();
    submit(pl.engine, &specs[3], &late);
    if (!tu_wait_done(&late, WAIT_MS))
        fail_msg("a request after the failure got no DONE within %d ms", WAIT_MS);
    assert_int_equal(late.done.finish, RLX_FINISH_ERROR);
    assert_int_equal(late.n, 0);
    if (!strstr(late.message, who))
        fail_msg("the later request's error does not name %s: %s", who, late.message);
    assert_true((late.t_done - t_late) * 1000 < RECOVERY_MS);
    pipeline_stop(&pl);
    tu_events_destroy(&late);
    for (int i = 0; i < 4; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

/* Destroying the engine while a lost stage is being replaced (nothing will come: the recovery
 * would go on for its whole 60 s) gives the recovery up: destroy returns within the teardown
 * bound, and every request ends with exactly one DONE, cancelled or failed naming the stage. */
static void test_destroy_during_recovery_is_prompt(void **state) {
    (void)state;
    static spec specs[4];
    static tu_events want[4], got[4];
    long_specs(specs);
    run_local(specs, 4, 4, want);
    pipeline_start(&pl, 2, 4, 16, 0, 60000, NULL, 0);
    uint32_t before[4];
    start_long(specs, got, before);
    pl.stages[1].stop = 1;
    tu_release(&got[0]);
    stage_stop(&pl.stages[1], TEARDOWN_MS);
    /* the driver is inside its recovery once it says it replaces the stage */
    const double t0 = tu_now_s();
    while (!log_has("replacing stage 1", "; ") && tu_now_s() - t0 < WAIT_MS / 1000.0)
        tu_sleep_ms(10);
    assert_true(log_has("replacing stage 1", "; "));
    const double ms = bounded(engine_destroy_fn, pl.engine, TEARDOWN_MS, "rlx_engine_destroy during a recovery");
    pl.engine = NULL;
    fprintf(stderr, "rlx_engine_destroy during a recovery took %.0f ms\n", ms);
    for (int i = 0; i < 4; i++) {
        const tu_events *r = &got[i];
        assert_int_equal(r->n_done, 1);
        assert_int_equal(r->events_after_done + r->bad_events, 0);
        assert_true(r->done.finish == RLX_FINISH_CANCELLED || r->done.finish == RLX_FINISH_ERROR);
        assert_true(same_tokens("destroy during a recovery", i, r, &want[i], r->n));
    }
    pipeline_stop(&pl);
    for (int i = 0; i < 4; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

/* Stage 1's link stalls mid-stream (the relay stops passing bytes; the connection stays up):
 * the driver waits out the step's deadline (timeout_ms plus 100 ms per row), no sooner, then
 * hangs up, reconnects through the relay to the same stage (which freed the old connection's
 * slots when the relay passed the hang-up on) and replays every slot into it; the requests end
 * as the local engine's runs, to the bit. */
static void test_stalled_stage_is_replaced(void **state) {
    (void)state;
    static spec specs[4];
    static tu_events want[4], got[4];
    long_specs(specs);
    run_local(specs, 4, 4, want);
    log_clear();
    pipeline_start(&pl, 2, 4, 16, 0, 30000, &px, 1);
    uint32_t before[4];
    start_long(specs, got, before);
    char who[128];
    snprintf(who, sizeof who, "stage 1 (%s)", px.address);
    const double t_freeze = tu_now_s();
    proxy_freeze(&px);
    tu_release(&got[0]);
    wait_all(got, 4, "stalled stage");
    for (int i = 0; i < 4; i++) {
        if (got[i].done.finish != RLX_FINISH_LENGTH)
            fail_msg("request %d ended with finish %u status %d: %s", i, got[i].done.finish, got[i].done.status,
                     got[i].message);
        assert_int_equal(got[i].n, LONG_TOKENS);
        assert_int_equal(got[i].events_after_done + got[i].bad_events, 0);
        assert_true(same_tokens("stalled stage", i, &got[i], &want[i], LONG_TOKENS));
    }
    rlx_driver_stats ds;
    rlx_driver_stats_of(pl.driver, &ds);
    assert_int_equal(ds.recoveries, 1);
    if (!log_has(who, "no answer to Rows within"))
        fail_msg("no log line says that %s stalled", who);
    pthread_mutex_lock(&log_mu);
    const double replaced_ms = (t_replaced - t_freeze) * 1000;
    pthread_mutex_unlock(&log_mu);
    fprintf(stderr, "the stalled stage was replaced %.0f ms after its link froze\n", replaced_ms);
    /* the stall is noticed at a step's deadline, at least TIMEOUT_MS and at most TIMEOUT_MS plus
     * 100 ms for each of a step's 16 rows; the replay then takes milliseconds */
    assert_true(replaced_ms >= TIMEOUT_MS);
    assert_true(replaced_ms < TIMEOUT_MS + 16 * 100 + 2000);
    pipeline_stop(&pl);
    proxy_stop(&px);
    for (int i = 0; i < 4; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

/* Stages that close a connection silent for 300 ms, and a pipeline idle for 1.5 s between two
 * requests: the driver's threads ping each stage well within that, so the second request runs on
 * the same connections, with no stage lost or replaced, and gives the local engine's tokens. */
static void test_idle_pipeline_is_kept_by_pings(void **state) {
    (void)state;
    static spec specs[2];
    static tu_events want[2], got[2];
    memset(specs, 0, sizeof specs);
    uint64_t rng = 0x1d1e5eedULL;
    for (int i = 0; i < 2; i++) {
        random_ids(&rng, specs[i].prompt, 9 + 4 * (uint32_t)i);
        specs[i].n_prompt = 9 + 4 * (uint32_t)i;
        specs[i].max_tokens = 6;
        specs[i].top = 1;
    }
    run_local(specs, 2, 2, want);
    log_clear();
    stage_idle_ms = 300;
    pipeline_start(&pl, 2, 2, 16, 0, 0, NULL, 0);
    for (int i = 0; i < 2; i++) {
        tu_events_init(&got[i]);
        submit(pl.engine, &specs[i], &got[i]);
        wait_all(&got[i], 1, "a request around an idle pause");
        if (i == 0)
            tu_sleep_ms(1500);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(got[i].done.finish, RLX_FINISH_LENGTH);
        assert_true(same_tokens("after an idle pause", i, &got[i], &want[i], specs[i].max_tokens));
    }
    rlx_driver_stats ds;
    rlx_driver_stats_of(pl.driver, &ds);
    assert_int_equal(ds.recoveries, 0);
    if (log_has("idle timeout", ""))
        fail_msg("a stage closed an idle driver connection that its driver was pinging");
    pipeline_stop(&pl);
    stage_idle_ms = 0;
    for (int i = 0; i < 2; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

// ---- a hybrid model (linear-attention layers) ----

/* Runs one request alone on a fresh local engine: no slot holds anything before it, so no
 * prefix is reused; the reference for a request the pipeline may serve from its cache. */
static void run_alone(const spec *s, tu_events *out) { run_local(s, 1, 1, out); }

/* Three greedy requests, one after another, over 2 stages of 2 slots that each hold linear
 * layers: A; B continuing all A's slot holds (its prompt and its tokens but the last, and 5 new
 * ids), which reuses A's slot; C sharing only A's first 10 ids, which a recurrent state cannot
 * be cut back to, so C reuses nothing. Each gets the tokens of its run alone on a fresh local
 * engine, to the bit. */
static void test_hybrid_prefix_reuse(void **state) {
    (void)state;
    enum { A_PROMPT = 20, A_GEN = 10, EXTRA = 5, C_SHARED = 10 };
    static spec specs[3];
    static tu_events want[3], got[3];
    memset(specs, 0, sizeof specs);
    uint64_t rng = 0x51ab1e5eedULL;
    random_ids(&rng, specs[0].prompt, A_PROMPT);
    specs[0].n_prompt = A_PROMPT;
    for (int i = 0; i < 3; i++) {
        specs[i].max_tokens = 12;
        specs[i].top = N_TOP;
    }
    specs[0].max_tokens = A_GEN;
    run_alone(&specs[0], &want[0]);
    /* B: all A's slot holds (A's last token was never fed), then new ids */
    memcpy(specs[1].prompt, specs[0].prompt, A_PROMPT * sizeof(int32_t));
    memcpy(specs[1].prompt + A_PROMPT, want[0].tokens, (A_GEN - 1) * sizeof(int32_t));
    random_ids(&rng, specs[1].prompt + A_PROMPT + A_GEN - 1, EXTRA);
    specs[1].n_prompt = A_PROMPT + A_GEN - 1 + EXTRA;
    memcpy(specs[2].prompt, specs[0].prompt, C_SHARED * sizeof(int32_t));
    random_ids(&rng, specs[2].prompt + C_SHARED, 14);
    specs[2].n_prompt = C_SHARED + 14;
    for (int i = 1; i < 3; i++)
        run_alone(&specs[i], &want[i]);

    pipeline_start(&pl, 2, 2, 16, 0, 0, NULL, 0);
    const uint32_t cached[3] = {0, A_PROMPT + A_GEN - 1, 0};
    for (int i = 0; i < 3; i++) {
        tu_events_init(&got[i]);
        submit(pl.engine, &specs[i], &got[i]);
        wait_all(&got[i], 1, "hybrid prefix reuse");
        if (got[i].done.finish != RLX_FINISH_LENGTH)
            fail_msg("request %d ended with finish %u: %s", i, got[i].done.finish, got[i].message);
        assert_int_equal(got[i].n, specs[i].max_tokens);
        assert_true(same_tokens("hybrid prefix reuse", i, &got[i], &want[i], specs[i].max_tokens));
        if (got[i].done.usage.n_cached != cached[i])
            fail_msg("request %d took %u positions from the cache, want %u", i, got[i].done.usage.n_cached, cached[i]);
    }
    pipeline_stop(&pl);
    for (int i = 0; i < 3; i++) {
        tu_events_destroy(&want[i]);
        tu_events_destroy(&got[i]);
    }
}

// ---- the slot contract ----

/* A step whose rows of one slot skip a position is refused with a message naming the row (the
 * last row of a slot ends it, so a gap would hide positions from a replay); the same rows at
 * consecutive positions, beside another slot's, run. Straight on the driver, its engine gone. */
static void test_step_with_a_gap_is_refused(void **state) {
    (void)state;
    pipeline_start(&pl, 2, 2, 16, 0, 0, NULL, 0);
    bounded(engine_destroy_fn, pl.engine, TEARDOWN_MS, "rlx_engine_destroy");
    pl.engine = NULL;
    const int32_t ids[3] = {1, 2, 3}, slots[3] = {0, 1, 0}, out_rows[1] = {2};
    int32_t positions[3] = {0, 0, 2};
    rlx_driver_rows rows = {
        .ids = ids, .positions = positions, .slots = slots, .n = 3, .out_rows = out_rows, .n_out = 1};
    uint64_t ticket;
    assert_int_equal(rlx_driver_submit(pl.driver, &rows, &ticket), RLX_E_INVALID);
    assert_non_null(strstr(rlx_last_error(), "row 2: position 2 of slot 0 follows its position 0"));
    assert_int_equal(ticket, 0);
    positions[2] = 1;
    assert_ok(rlx_driver_submit(pl.driver, &rows, &ticket));
    uint64_t done;
    const float *logits;
    assert_ok(rlx_driver_wait(pl.driver, &done, &logits));
    assert_int_equal(done, ticket);
    assert_non_null(logits);
    pipeline_stop(&pl);
}

static int setup(void **state) {
    (void)state;
    if (rlx_model_open(model_dir, &model) != RLX_OK || rlx_plugin_load(TCP_PLUGIN, &tcp) != RLX_OK) {
        fprintf(stderr, "setup: %s\n", rlx_last_error());
        return -1;
    }
    const char *name = getenv("RLX_BACKEND") ? getenv("RLX_BACKEND") : "cpu-blas";
    if (strcmp(name, "ref") != 0 && rlx_plugin_load(BLAS_PLUGIN, &blas) != RLX_OK) {
        fprintf(stderr, "setup: %s\n", rlx_last_error());
        return -1;
    }
    vocab = rlx_model_config_of(model)->vocab_size;
    if (getenv("RLX_TEST_SEED"))
        seed = strtoull(getenv("RLX_TEST_SEED"), NULL, 0);
    if (!seed)
        seed = 1; /* xorshift stays at 0 */
    rlx_log_set_handler(on_log, NULL);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rlx_log_set_handler(NULL, NULL);
    rlx_model_close(model);
    rlx_plugin_unload(blas);
    rlx_plugin_unload(tcp);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1)
        model_dir = argv[1];
    /* a hybrid's own list: parity's prefix copies from a busy slot are not for recurrent states;
     * a recovery there restarts the states of the stages before the lost one too, which must
     * end where they were */
    const int hybrid = argc > 2 && strcmp(argv[2], "hybrid") == 0;
    /* the stages and the driver talk through the tcp transport plugin of this build */
    if (access(TCP_PLUGIN, R_OK) != 0) {
        printf("SKIPPED: missing input: the tcp transport plugin %s is not built\n", TCP_PLUGIN);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_parity_two_stages, cleanup),
        cmocka_unit_test_teardown(test_parity_three_stages, cleanup),
        cmocka_unit_test_teardown(test_stress_submit_and_cancel, cleanup),
        cmocka_unit_test_teardown(test_recovery_of_the_last_stage, cleanup),
        cmocka_unit_test_teardown(test_recovery_of_the_first_stage, cleanup),
        cmocka_unit_test_teardown(test_recovery_of_a_middle_stage, cleanup),
        cmocka_unit_test_teardown(test_stalled_stage_is_replaced, cleanup),
        cmocka_unit_test_teardown(test_unreplaced_stage_fails_naming_it, cleanup),
        cmocka_unit_test_teardown(test_destroy_during_recovery_is_prompt, cleanup),
        cmocka_unit_test_teardown(test_idle_pipeline_is_kept_by_pings, cleanup),
        cmocka_unit_test_teardown(test_step_with_a_gap_is_refused, cleanup),
    };
    const struct CMUnitTest hybrid_tests[] = {
        cmocka_unit_test_teardown(test_hybrid_prefix_reuse, cleanup),
        cmocka_unit_test_teardown(test_recovery_of_the_last_stage, cleanup),
        cmocka_unit_test_teardown(test_recovery_of_a_middle_stage, cleanup),
        cmocka_unit_test_teardown(test_recovery_after_shorter_restarts, cleanup),
    };
    return hybrid ? cmocka_run_group_tests(hybrid_tests, setup, teardown)
                  : cmocka_run_group_tests(tests, setup, teardown);
}
