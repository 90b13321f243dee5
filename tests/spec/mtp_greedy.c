/* Greedy speculative decoding with the MTP speculator emits exactly plain greedy's tokens, for
 * k = 1..6, in one process and over a 2-stage pipeline (stages served by threads of this
 * process over the TCP transport, the driver asking the last stage for hidden states); a
 * pipeline that does not return hidden states is refused with a message saying so.
 *
 *   mtp_greedy --model DIR     (DIR holds MTP layer 0: make_model.py --mtp-layers 1)
 *
 * Exit status 0 on pass, 1 with a message on failure. */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/rlx.h"

#define N_NEW 40
#define MAX_K 6

static const int32_t prompt[] = {17, 3, 250, 99, 4, 301, 77, 12};
#define N_PROMPT (uint32_t)(sizeof prompt / sizeof prompt[0])

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mtp_greedy: FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (%s)\n", rlx_last_error());
    va_end(ap);
    return 1;
}

typedef struct tokens {
    int32_t ids[N_NEW];
    uint32_t n;
} tokens;

static int collect(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    tokens *t = ctx;
    t->ids[t->n++] = token;
    return 0;
}

typedef struct runtime {
    rlx_registry *reg;
    rlx_plugin_handle *cpu, *tcp, *mtp;
    const char *model_dir;
    rlx_model *model;
} runtime;

/* Plain greedy on lm (emptied first): the reference. */
static int plain_greedy(const rlx_lm *lm, tokens *out) {
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    rlx_sampler *s;
    memset(out, 0, sizeof *out);
    if (lm->truncate(lm->self, 0) != RLX_OK || rlx_sampler_create(&p, lm->vocab, &s) != RLX_OK)
        return fail("plain greedy setup");
    rlx_status rc = rlx_generate(lm, s, prompt, N_PROMPT, N_NEW, collect, out, NULL);
    rlx_sampler_destroy(s);
    return rc == RLX_OK ? 0 : fail("plain greedy");
}

/* The MTP speculator for lm's model on one backend (which must outlive it). */
static rlx_status open_mtp(runtime *rt, const rlx_lm *lm, rlx_backend **backend, rlx_speculator **spec) {
    rlx_spec_target target = {.size = sizeof target,
                              .kv_capacity = lm->capacity(lm->self),
                              .model_dir = rt->model_dir,
                              .vocab = lm->vocab,
                              .hidden_size = lm->hidden_size,
                              .backends = backend,
                              .n_backends = 1};
    return rlx_speculator_create(rt->mtp, &target, spec);
}

/* Speculative greedy with the MTP speculator for k = 1..MAX_K, each equal to want. */
static int spec_greedy(runtime *rt, const rlx_lm *lm, rlx_backend *backend, const tokens *want, const char *where) {
    rlx_speculator *spec;
    if (open_mtp(rt, lm, &backend, &spec) != RLX_OK)
        return fail("%s: cannot open the mtp speculator", where);
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    int status = 0;
    for (uint32_t k = 1; k <= MAX_K && !status; k++) {
        rlx_sampler *s;
        tokens got = {.n = 0};
        rlx_spec_stats st;
        if (lm->truncate(lm->self, 0) != RLX_OK || rlx_sampler_create(&p, lm->vocab, &s) != RLX_OK) {
            status = fail("%s k=%u: setup", where, k);
            break;
        }
        rlx_status rc = rlx_spec_generate(lm, spec, k, s, prompt, N_PROMPT, N_NEW, collect, &got, &st);
        rlx_sampler_destroy(s);
        if (rc != RLX_OK) {
            status = fail("%s k=%u: rlx_spec_generate", where, k);
        } else if (got.n != want->n || memcmp(got.ids, want->ids, got.n * sizeof *got.ids) != 0) {
            fprintf(stderr, "mtp_greedy: FAIL: %s k=%u: %u tokens differ from plain greedy's %u:\n  plain:", where, k,
                    got.n, want->n);
            for (uint32_t i = 0; i < want->n; i++)
                fprintf(stderr, " %d", want->ids[i]);
            fprintf(stderr, "\n  spec: ");
            for (uint32_t i = 0; i < got.n; i++)
                fprintf(stderr, " %d", got.ids[i]);
            fputc('\n', stderr);
            status = 1;
        } else if (st.proposed == 0) {
            status = fail("%s k=%u: the speculator proposed nothing", where, k);
        } else {
            printf("ok: %s k=%u: %u tokens as plain greedy; %llu proposed, %llu accepted, %llu target passes\n", where,
                   k, got.n, (unsigned long long)st.proposed, (unsigned long long)st.accepted,
                   (unsigned long long)st.target_passes);
        }
    }
    rlx_speculator_destroy(spec);
    return status;
}

static int single_process(runtime *rt, rlx_backend *backend, const tokens *want) {
    const rlx_model_config *c = rlx_model_config_of(rt->model);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1,
                           .emit_hidden = 1};
    rlx_session_options so = {
        .size = sizeof(rlx_session_options), .kv_capacity = 128, .backends = &backend, .n_backends = 1};
    rlx_session *target = NULL;
    rlx_lm lm;
    int status = rlx_session_create(rt->model, &spec, &so, &target) != RLX_OK || rlx_session_lm(target, &lm) != RLX_OK
                     ? fail("session")
                     : spec_greedy(rt, &lm, backend, want, "single process");
    rlx_session_destroy(target);
    return status;
}

/* rlx_spec_generate refuses an lm without hidden states for the MTP speculator. */
static int refused_without_hidden(runtime *rt, const rlx_lm *lm, rlx_backend *backend) {
    rlx_speculator *spec;
    rlx_sampler *s;
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    if (lm->hidden)
        return fail("a pipeline without emit_hidden offers hidden states");
    if (open_mtp(rt, lm, &backend, &spec) != RLX_OK || rlx_sampler_create(&p, lm->vocab, &s) != RLX_OK)
        return fail("speculator without hidden states: setup");
    rlx_status rc = rlx_spec_generate(lm, spec, 2, s, prompt, N_PROMPT, 4, NULL, NULL, NULL);
    rlx_sampler_destroy(s);
    rlx_speculator_destroy(spec);
    if (rc == RLX_OK || !strstr(rlx_last_error(), "hidden states"))
        return fail("a pipeline without hidden states was not refused clearly");
    printf("ok: a pipeline without hidden states is refused: %s\n", rlx_last_error());
    return 0;
}

// ---- the pipeline ----

typedef struct stage_thread {
    pthread_t thread;
    runtime *rt;
    rlx_backend *backend;
    rlx_layer_range layers;
    volatile sig_atomic_t stop;
    pthread_mutex_t lock;
    pthread_cond_t listening;
    char address[256];
    rlx_status rc;
} stage_thread;

static void on_listening(void *ctx, const char *bound) {
    stage_thread *t = ctx;
    pthread_mutex_lock(&t->lock);
    snprintf(t->address, sizeof t->address, "%s", bound);
    pthread_cond_signal(&t->listening);
    pthread_mutex_unlock(&t->lock);
}

static void *serve(void *arg) {
    stage_thread *t = arg;
    rlx_stage_options o = rlx_stage_options_default();
    o.address = "127.0.0.1:0";
    o.transport = t->rt->tcp;
    o.layers = t->layers;
    o.session = (rlx_session_options){
        .size = sizeof(rlx_session_options), .kv_capacity = 128, .backends = &t->backend, .n_backends = 1};
    o.backend_name = "cpu-blas";
    o.stop = &t->stop;
    o.poll_ms = 20;
    o.on_listening = on_listening;
    o.ctx = t;
    t->rc = rlx_stage_serve(t->rt->model, &o);
    on_listening(t, ""); /* wakes the main thread if serving failed before listening */
    return NULL;
}

static int pipeline(runtime *rt, rlx_backend *backend, const tokens *want) {
    const rlx_model_config *c = rlx_model_config_of(rt->model);
    uint32_t n_layers = (uint32_t)c->num_hidden_layers;
    stage_thread stages[2];
    rlx_driver_stage ds[2];
    int started = 0, status = 0;
    for (int i = 0; i < 2; i++) {
        stage_thread *t = &stages[i];
        memset(t, 0, sizeof *t);
        t->rt = rt;
        t->layers = i == 0 ? (rlx_layer_range){0, n_layers / 2} : (rlx_layer_range){n_layers / 2, n_layers};
        pthread_mutex_init(&t->lock, NULL);
        pthread_cond_init(&t->listening, NULL);
        if (rlx_backend_create(rt->cpu, NULL, &t->backend) != RLX_OK) {
            status = fail("stage backend");
            break;
        }
        pthread_mutex_lock(&t->lock);
        if (pthread_create(&t->thread, NULL, serve, t) != 0) {
            pthread_mutex_unlock(&t->lock);
            status = fail("stage thread");
            break;
        }
        started++;
        while (!t->address[0] && t->rc == RLX_OK)
            pthread_cond_wait(&t->listening, &t->lock);
        pthread_mutex_unlock(&t->lock);
        if (!t->address[0]) {
            status = fail("stage %d did not listen", i);
            break;
        }
        ds[i] = (rlx_driver_stage){.address = t->address, .layers = t->layers};
    }
    for (int hidden = 0; hidden < 2 && !status; hidden++) {
        rlx_driver_options o = rlx_driver_options_default();
        o.transport = rt->tcp;
        o.stages = ds;
        o.n_stages = 2;
        o.kv_capacity = 128;
        o.emit_hidden = (uint32_t)hidden;
        rlx_driver *d;
        rlx_lm lm;
        if (rlx_driver_create(rt->model_dir, &o, &d) != RLX_OK || rlx_driver_lm(d, &lm) != RLX_OK) {
            status = fail("driver (emit_hidden %d)", hidden);
            break;
        }
        if (!hidden) {
            tokens plain;
            status = plain_greedy(&lm, &plain);
            if (!status && (plain.n != want->n || memcmp(plain.ids, want->ids, plain.n * sizeof *plain.ids) != 0))
                status = fail("plain greedy over the pipeline differs from the single process");
            if (!status)
                status = refused_without_hidden(rt, &lm, backend);
        } else {
            status = spec_greedy(rt, &lm, backend, want, "2-stage pipeline");
        }
        rlx_driver_destroy(d);
    }
    for (int i = 0; i < started; i++) {
        stages[i].stop = 1;
        pthread_join(stages[i].thread, NULL);
        if (stages[i].rc != RLX_OK && !status)
            status = fail("stage %d ended with %s", i, rlx_status_str(stages[i].rc));
    }
    for (int i = 0; i < 2; i++) {
        rlx_backend_destroy(stages[i].backend);
        pthread_mutex_destroy(&stages[i].lock);
        pthread_cond_destroy(&stages[i].listening);
    }
    return status;
}

int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "--model") != 0) {
        fprintf(stderr, "usage: mtp_greedy --model DIR\n");
        return 2;
    }
    runtime rt = {.model_dir = argv[2]};
    rlx_backend *backend = NULL;
    int status = 1;
    if (rlx_registry_create(NULL, &rt.reg) != RLX_OK ||
        rlx_registry_load(rt.reg, RLX_PLUGIN_BACKEND, "cpu-blas", &rt.cpu) != RLX_OK ||
        rlx_registry_load(rt.reg, RLX_PLUGIN_TRANSPORT, "tcp", &rt.tcp) != RLX_OK ||
        rlx_registry_load(rt.reg, RLX_PLUGIN_SPECULATOR, "mtp", &rt.mtp) != RLX_OK ||
        rlx_backend_create(rt.cpu, NULL, &backend) != RLX_OK || rlx_model_open(rt.model_dir, &rt.model) != RLX_OK) {
        fail("setup");
        goto done;
    }
    tokens want;
    const rlx_model_config *c = rlx_model_config_of(rt.model);
    rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                           .layer_end = (uint32_t)c->num_hidden_layers,
                           .embed_input = 1,
                           .produce_logits = 1};
    rlx_session_options so = {
        .size = sizeof(rlx_session_options), .kv_capacity = 128, .backends = &backend, .n_backends = 1};
    rlx_session *plain;
    rlx_lm lm;
    if (rlx_session_create(rt.model, &spec, &so, &plain) != RLX_OK || rlx_session_lm(plain, &lm) != RLX_OK) {
        fail("session");
        goto done;
    }
    status = plain_greedy(&lm, &want);
    rlx_session_destroy(plain);
    if (!status)
        status = single_process(&rt, backend, &want);
    if (!status)
        status = pipeline(&rt, backend, &want);
    if (!status)
        printf("PASS greedy MTP speculation equals plain greedy (%u tokens), k = 1..%d, single process and "
               "2-stage pipeline\n",
               want.n, MAX_K);
done:
    rlx_model_close(rt.model);
    rlx_backend_destroy(backend);
    rlx_plugin_unload(rt.mtp);
    rlx_plugin_unload(rt.tcp);
    rlx_plugin_unload(rt.cpu);
    rlx_registry_destroy(rt.reg);
    return status;
}
