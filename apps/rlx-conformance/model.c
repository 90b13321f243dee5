/* The whole-model checks: the tested backend's logits against the reference kernels' or NumPy's
 * golden file, its greedy ids against NumPy's, and a model planned with spans against the same
 * model node by node. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

typedef struct golden {
    int32_t *tokens;
    uint32_t n_tokens, n_prompt;
    double tol;
    float *logits; /* [n_tokens, vocab] */
} golden;

static void golden_free(golden *g) {
    free(g->tokens);
    free(g->logits);
    memset(g, 0, sizeof *g);
}

/* <dir>/rlx-golden.txt ("tokens 1,2,3", "prompt N", "tol X" lines) and rlx-golden.f32. */
static int golden_read(const char *dir, int64_t vocab, golden *g, char *why, size_t why_len) {
    memset(g, 0, sizeof *g);
    char path[4200], line[65536];
    snprintf(path, sizeof path, "%s/rlx-golden.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, why_len, "no %.900s (tests/conformance/write_golden.py writes one)", path);
        return 1;
    }
    g->tol = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "tokens ", 7) == 0) {
            for (char *p = line + 7, *end; *p && *p != '\n'; p = *end == ',' ? end + 1 : end) {
                long v = strtol(p, &end, 10);
                if (end == p)
                    break;
                int32_t *grown = realloc(g->tokens, (g->n_tokens + 1) * sizeof *grown);
                if (!grown)
                    break;
                g->tokens = grown;
                g->tokens[g->n_tokens++] = (int32_t)v;
            }
        } else if (strncmp(line, "prompt ", 7) == 0) {
            g->n_prompt = (uint32_t)strtoul(line + 7, NULL, 10);
        } else if (strncmp(line, "tol ", 4) == 0) {
            g->tol = strtod(line + 4, NULL);
        }
    }
    fclose(f);
    if (!g->n_tokens || !g->n_prompt || g->n_prompt > g->n_tokens) {
        snprintf(why, why_len, "%.900s: needs 'tokens' and 'prompt' lines", path);
        golden_free(g);
        return -1;
    }
    snprintf(path, sizeof path, "%s/rlx-golden.f32", dir);
    size_t count = (size_t)g->n_tokens * (size_t)vocab;
    if (!(f = fopen(path, "rb")) || !(g->logits = malloc(count * 4)) || fread(g->logits, 4, count, f) != count ||
        fgetc(f) != EOF) {
        snprintf(why, why_len, "%.900s: missing or not %u x %lld float32 logits", path, g->n_tokens, (long long)vocab);
        if (f)
            fclose(f);
        golden_free(g);
        return -1;
    }
    fclose(f);
    return 0;
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Largest |got - want| over rows x vocab, NaN as infinity; scale collects max(1, |want|). */
static double compare_rows(const float *got, const float *want, size_t count, double *scale, size_t *bad) {
    double worst = 0;
    for (size_t i = 0; i < count; i++) {
        *scale = fmax(*scale, fabs(want[i]));
        double d = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        if (d > worst) {
            worst = d;
            *bad = i;
        }
    }
    return worst;
}

/* One whole-model run: the model as an application opens it on the tested backend, its golden
 * file and prompt, and what the comparison allows. */
typedef struct model_run {
    rlx_model_config cfg;
    int64_t vocab;
    golden g;
    int grc; /* golden_read's: 0 read, 1 no golden file, -1 a bad one */
    int32_t prompt_ids[12];
    const int32_t *prompt;
    uint32_t n_prompt, decode_steps;
    uint32_t kv_capacity;
    rlx_runtime *rt;
    rlx_session *st; /* the tested backend's, the runtime's own */
    rlx_session *sr; /* the reference kernels' (KIT_MODEL_VS_REF) */
    float *keep;
    rlx_block_spec spec;
    int bf16;         /* the backend rounds matmul inputs to BF16 somewhere in the model */
    const char *mode; /* "bf16-act: " or "", to start a verdict with */
    double tol;
} model_run;

static void model_run_free(model_run *m) {
    free(m->keep);
    golden_free(&m->g);
    rlx_session_destroy(m->sr);
    rlx_runtime_close(m->rt);
}

/* Opens the model on a fresh instance of the backend (its weights are unmapped when the runtime
 * closes, after that instance) with its golden file and prompt, and learns the precision the
 * backend plans it in. Returns 0, or -1 with res set (SKIPPED without a golden file the check
 * needs). */
static int model_open(kit_runner *r, const kit_check *c, model_run *m, kit_result *res) {
    char why[1024];
    char config_path[4200];
    snprintf(config_path, sizeof config_path, "%s/config.json", c->path);
    if (rlx_model_config_load(config_path, &m->cfg) != RLX_OK) {
        result(res, KIT_FAIL, "cannot open the model: %s", rlx_last_error());
        return -1;
    }
    const rlx_model_config *cfg = &m->cfg;
    const int64_t vocab = m->vocab = cfg->vocab_size;
    m->grc = golden_read(c->path, vocab, &m->g, why, sizeof why);
    if (m->grc != 0 && c->spec != KIT_MODEL_VS_REF) {
        if (m->grc > 0)
            result(res, KIT_SKIPPED, "%s", why);
        else
            result(res, KIT_FAIL, "%s", why);
        return -1;
    }
    /* default prompt: fixed ids below any special token */
    m->n_prompt = m->grc == 0 ? m->g.n_prompt : 12;
    m->prompt = m->grc == 0 ? m->g.tokens : m->prompt_ids;
    for (int i = 0; i < 12; i++)
        m->prompt_ids[i] = (int32_t)((i * 131 + 7) % (vocab > 8 ? vocab - 8 : vocab));
    m->decode_steps = 8;
    const rlx_runtime_backend tested = {
        .name = r->o->plugin, .n_threads = r->o->threads, .options = r->o->backend_opts};
    rlx_runtime_options ro = rlx_runtime_options_default();
    ro.model_dir = c->path;
    ro.plugin_dir = r->o->plugin_dir;
    ro.backends = &tested;
    ro.n_backends = 1;
    ro.kv_capacity = m->kv_capacity = (m->grc == 0 ? m->g.n_tokens : m->n_prompt) + m->decode_steps + 8;
    if (rlx_runtime_open(&ro, &m->rt) != RLX_OK) {
        result(res, KIT_FAIL, "cannot open the model on the backend: %s", rlx_last_error());
        return -1;
    }
    m->st = rlx_runtime_session(m->rt);
    m->spec = (rlx_block_spec){.size = sizeof(rlx_block_spec),
                               .layer_start = 0,
                               .layer_end = (uint32_t)cfg->num_hidden_layers,
                               .embed_input = 1,
                               .produce_logits = 1};
    /* a backend that rounds matmul inputs to BF16 is compared with the BF16-emulating
     * reference kernels and, loosely, with NumPy's exact logits (see KIT_BF16_UNIT). The
     * emulation rounds the inputs of every matmul, as a backend does on a model of one weight
     * dtype (the kit's models); tests/model/check_golden.py rounds exactly the declared nodes. */
    uint32_t prec = RLX_PRECISION_F32, prec_decode = RLX_PRECISION_F32;
    if (rlx_session_precision(m->st, m->n_prompt, &prec) != RLX_OK ||
        rlx_session_precision(m->st, 1, &prec_decode) != RLX_OK) {
        result(res, KIT_FAIL, "cannot plan the model on the backend: %s", rlx_last_error());
        return -1;
    }
    m->bf16 = prec == RLX_PRECISION_BF16_ACT || prec_decode == RLX_PRECISION_BF16_ACT;
    m->mode = m->bf16 ? "bf16-act: " : "";
    m->tol = r->o->tol[KIT_TOL_MODEL];
    if (m->bf16 && !r->o->tol_set[KIT_TOL_MODEL])
        m->tol = c->spec == KIT_MODEL_VS_REF ? KIT_BF16_MODEL_EMULATED : KIT_BF16_MODEL_EXACT;
    return 0;
}

/* KIT_MODEL_VS_REF: the prompt's logits and decode_steps greedy steps', against the reference
 * kernels (BF16-emulating for a bf16 backend) fed the same ids. */
static void model_vs_ref(kit_runner *r, model_run *m, kit_result *res) {
    const int64_t vocab = m->vocab;
    const uint32_t n_prompt = m->n_prompt;
    const float *got, *want;
    double worst = 0, scale = 1;
    size_t bad = 0;
    const rlx_session_options so = {
        .size = sizeof so, .kv_capacity = m->kv_capacity, .backends = &r->ref_bf16, .n_backends = m->bf16 ? 1 : 0};
    if (rlx_session_create(rlx_runtime_model(m->rt), &m->spec, &so, &m->sr) != RLX_OK) {
        result(res, KIT_FAIL, "cannot create a session on the reference kernels: %s", rlx_last_error());
        return;
    }
    size_t rows = n_prompt * (size_t)vocab;
    if (!(m->keep = malloc(rows * 4))) {
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    float *keep = m->keep;
    if (rlx_session_forward(m->sr, m->prompt, n_prompt, 1, &want) != RLX_OK) {
        result(res, KIT_FAIL, "reference kernels: %s", rlx_last_error());
        return;
    }
    memcpy(keep, want, rows * 4);
    if (rlx_session_forward(m->st, m->prompt, n_prompt, 1, &got) != RLX_OK) {
        result(res, KIT_FAIL, "prefill of %u tokens: %s", n_prompt, rlx_last_error());
        return;
    }
    worst = compare_rows(got, keep, rows, &scale, &bad);
    const char *phase = "prefill";
    size_t bad_row = bad / (size_t)vocab;
    int32_t next = (int32_t)argmax(keep + rows - vocab, vocab);
    for (uint32_t step = 0; step < m->decode_steps && isfinite(worst); step++) {
        if (rlx_session_forward(m->sr, &next, 1, 0, &want) != RLX_OK) {
            result(res, KIT_FAIL, "reference kernels: %s", rlx_last_error());
            return;
        }
        memcpy(keep, want, (size_t)vocab * 4);
        if (rlx_session_forward(m->st, &next, 1, 0, &got) != RLX_OK) {
            result(res, KIT_FAIL, "decode step %u: %s", step, rlx_last_error());
            return;
        }
        double w = compare_rows(got, keep, (size_t)vocab, &scale, &bad);
        if (w > worst) {
            worst = w;
            phase = "decode";
            bad_row = step;
        }
        next = (int32_t)argmax(keep, vocab);
    }
    res->err = worst;
    res->limit = m->tol * scale;
    if (worst <= res->limit)
        result(res, KIT_PASS, "%s%u prompt tokens, %u decode steps", m->bf16 ? "bf16-act: vs BF16 emulation, " : "",
               n_prompt, m->decode_steps);
    else
        result(res, KIT_FAIL, "backend '%s': %s%s logits differ from the %sreference kernels (%s %zu, token %zu)%s",
               rlx_backend_name(r->tested), m->mode, phase, m->bf16 ? "BF16-emulating " : "",
               phase[0] == 'p' ? "position" : "step", bad_row, bad % (size_t)vocab,
               isfinite(worst) ? "" : ": NaN or Inf");
}

/* KIT_MODEL_VS_GOLDEN: the logits of every position of the golden tokens against NumPy's. */
static void model_vs_golden(kit_runner *r, model_run *m, kit_result *res) {
    const golden *g = &m->g;
    const int64_t vocab = m->vocab;
    const float *got;
    double worst = 0, scale = 1, tol = m->tol;
    size_t bad = 0;
    if (!r->o->tol_set[KIT_TOL_MODEL] && g->tol > 0 && !m->bf16)
        tol = g->tol;
    if (rlx_session_forward(m->st, g->tokens, g->n_tokens, 1, &got) != RLX_OK) {
        result(res, KIT_FAIL, "forward of %u tokens: %s", g->n_tokens, rlx_last_error());
        return;
    }
    worst = compare_rows(got, g->logits, (size_t)g->n_tokens * (size_t)vocab, &scale, &bad);
    res->err = worst;
    res->limit = tol * scale;
    if (worst <= res->limit)
        result(res, KIT_PASS, "%s%u positions", m->mode, g->n_tokens);
    else
        result(res, KIT_FAIL, "%slogits differ from NumPy's at position %zu, token %zu: %.7g, expected %.7g", m->mode,
               bad / (size_t)vocab, bad % (size_t)vocab, (double)got[bad], (double)g->logits[bad]);
}

/* The greedy check: from the golden prompt, each greedy id against NumPy's path. */
static void model_greedy(kit_runner *r, model_run *m, kit_result *res) {
    const golden *g = &m->g;
    const int64_t vocab = m->vocab;
    const int bf16 = m->bf16;
    const char *mode = m->mode;
    const float *got;
    if (rlx_session_forward(m->st, g->tokens, g->n_prompt, 0, &got) != RLX_OK) {
        result(res, KIT_FAIL, "prefill: %s", rlx_last_error());
        return;
    }
    /* A step whose NumPy top-1 margin is within twice the logits bound may flip in a correct
     * backend; from there on its ids are not comparable (bf16 mode only: the F32 bound
     * is far below the margins the golden prompts are chosen for). */
    const double bound = (bf16 ? (r->o->tol_set[KIT_TOL_MODEL] ? m->tol : KIT_BF16_MODEL_EXACT) : 0);
    for (uint32_t i = g->n_prompt; i < g->n_tokens; i++) {
        int32_t id = (int32_t)argmax(got, vocab);
        const float *row = g->logits + (size_t)(i - 1) * (size_t)vocab;
        double top = -INFINITY, second = -INFINITY, row_scale = 1;
        for (int64_t v = 0; v < vocab; v++) {
            row_scale = fmax(row_scale, fabs(row[v]));
            if (row[v] > top) {
                second = top;
                top = row[v];
            } else if (row[v] > second) {
                second = row[v];
            }
        }
        if (bf16 && top - second <= 2 * bound * row_scale) {
            result(res, KIT_PASS,
                   "%s%u of %u greedy ids match; the %u after are not checked: NumPy's top-1 margin "
                   "%.3g at step %u is within twice the bf16 logits bound %.3g",
                   mode, i - g->n_prompt, g->n_tokens - g->n_prompt, g->n_tokens - i, top - second, i - g->n_prompt,
                   bound * row_scale);
            return;
        }
        if (id != g->tokens[i]) {
            result(res, KIT_FAIL, "%sgreedy step %u: id %d, NumPy's greedy path has %d", mode, i - g->n_prompt, id,
                   g->tokens[i]);
            return;
        }
        if (rlx_session_forward(m->st, &id, 1, 0, &got) != RLX_OK) {
            result(res, KIT_FAIL, "decode step %u: %s", i - g->n_prompt, rlx_last_error());
            return;
        }
    }
    result(res, KIT_PASS, "%s%u of %u ids match", mode, g->n_tokens - g->n_prompt, g->n_tokens - g->n_prompt);
}

void kit_run_model(kit_runner *r, const kit_check *c, kit_result *res) {
    model_run m = {0};
    phase(r, "a whole-model run");
    if (model_open(r, c, &m, res) == 0) {
        if (c->spec == KIT_MODEL_VS_REF)
            model_vs_ref(r, &m, res);
        else if (c->spec == KIT_MODEL_VS_GOLDEN)
            model_vs_golden(r, &m, res);
        else
            model_greedy(r, &m, res);
    }
    model_run_free(&m);
}

/* One model block planned twice on the tested backend, with its spans and node by node. */
typedef struct span_pair {
    rlx_graph *g;
    rlx_block_io io;
    rlx_plan *plan[2]; /* [0] spans, [1] RLX_PLAN_PER_NODE */
    float *cache[2];   /* each plan's K and V caches, all layers back to back */
} span_pair;

static void span_pair_free(span_pair *s) {
    for (int i = 0; i < 2; i++) {
        rlx_plan_destroy(s->plan[i]);
        free(s->cache[i]);
    }
    rlx_graph_destroy(s->g);
}

static int span_pair_open(rlx_model *m, rlx_backend *b, uint32_t n, uint32_t capacity, span_pair *s, char *why,
                          size_t why_len) {
    const rlx_model_config *cfg = rlx_model_config_of(m);
    const rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                                 .layer_end = (uint32_t)cfg->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1,
                                 .all_logits = 1};
    const rlx_build_options bo = {.size = sizeof bo, .n_tokens = n, .kv_capacity = capacity};
    rlx_batch_io bio;
    if (rlx_model_build_block(m, &spec, &bo, &s->g, &bio) != RLX_OK) {
        snprintf(why, why_len, "cannot build the block: %s", rlx_last_error());
        return -1;
    }
    s->io = bio.block;
    /* every cache or recurrent state gets room for the largest of them (F32: the block's default) */
    size_t per_cache = 0;
    for (uint32_t l = 0; l < s->io.n_layers; l++)
        for (int v = 0; v < 2; v++) {
            const size_t numel =
                (size_t)rlx_tensor_numel(rlx_graph_tensor(s->g, v ? s->io.v_cache[l] : s->io.k_cache[l]));
            per_cache = numel > per_cache ? numel : per_cache;
        }
    for (int i = 0; i < 2; i++) {
        const rlx_plan_options o = {
            .size = sizeof o, .flags = i ? RLX_PLAN_PER_NODE : 0, .backends = &b, .n_backends = 1};
        if (rlx_plan_create(s->g, &o, &s->plan[i]) != RLX_OK) {
            snprintf(why, why_len, "cannot plan the model%s: %s", i ? " node by node" : "", rlx_last_error());
            return -1;
        }
        if (!(s->cache[i] = calloc(2 * s->io.n_layers * per_cache, sizeof(float)))) {
            snprintf(why, why_len, "kit: out of memory");
            return -1;
        }
        for (uint32_t l = 0; l < s->io.n_layers; l++)
            if (rlx_plan_bind(s->plan[i], s->io.k_cache[l], s->cache[i] + (2 * l) * per_cache) != RLX_OK ||
                rlx_plan_bind(s->plan[i], s->io.v_cache[l], s->cache[i] + (2 * l + 1) * per_cache) != RLX_OK) {
                snprintf(why, why_len, "kit: %s", rlx_last_error());
                return -1;
            }
    }
    return 0;
}

/* Runs both plans over ids at positions pos..pos+n-1; the largest difference of their logits
 * goes to *worst (relative to max(1, |per-node|) in *scale). */
static int span_pair_run(span_pair *s, int32_t *ids, int32_t *pos, uint32_t n, int64_t vocab, double *worst,
                         double *scale, char *why, size_t why_len) {
    const float *out[2];
    for (int i = 0; i < 2; i++) {
        if (rlx_plan_bind(s->plan[i], s->io.input, ids) != RLX_OK ||
            rlx_plan_bind(s->plan[i], s->io.positions, pos) != RLX_OK || rlx_plan_run(s->plan[i]) != RLX_OK) {
            snprintf(why, why_len, "%s: %s", i ? "node by node" : "with spans", rlx_last_error());
            return -1;
        }
        out[i] = rlx_plan_data(s->plan[i], s->io.output);
    }
    for (size_t k = 0; k < (size_t)n * (size_t)vocab; k++) {
        *scale = fmax(*scale, fabs(out[1][k]));
        const double d = fabs((double)out[0][k] - (double)out[1][k]);
        if (!(d <= *worst))
            *worst = isnan(d) ? INFINITY : d;
    }
    return 0;
}

/* A backend that runs spans must compute what its compute() gives node by node: a prefill
 * and a decode step of the model, each planned with spans and with RLX_PLAN_PER_NODE. */
void kit_run_model_spans(kit_runner *r, const kit_check *c, kit_result *res) {
    rlx_model *m = NULL;
    rlx_backend *b = NULL;
    span_pair prefill = {0}, decode = {0};
    char why[1024];
    phase(r, "a whole model with spans and node by node");
    if (rlx_model_open(c->path, &m) != RLX_OK) {
        result(res, KIT_FAIL, "cannot open the model: %s", rlx_last_error());
        return;
    }
    /* a fresh instance: what it prepares for this model is released when the model closes */
    if (kit_open_tested(r, &b) != RLX_OK) {
        result(res, KIT_FAIL, "backend failed to open: %s", rlx_last_error());
        goto done;
    }
    if (!(rlx_backend_features(b) & RLX_BACKEND_RUNS_SPANS)) {
        result(res, KIT_SKIPPED, "the backend runs every node by itself (no compute_span)");
        goto done;
    }
    const int64_t vocab = rlx_model_config_of(m)->vocab_size;
    enum { N = 7, CAPACITY = 16 };
    int32_t ids[N + 1], pos[N + 1];
    for (int i = 0; i <= N; i++) {
        ids[i] = (int32_t)((i * 131 + 7) % (vocab > 8 ? vocab - 8 : vocab));
        pos[i] = i;
    }
    double worst = 0, scale = 1;
    if (span_pair_open(m, b, N, CAPACITY, &prefill, why, sizeof why) < 0 ||
        span_pair_open(m, b, 1, CAPACITY, &decode, why, sizeof why) < 0 ||
        span_pair_run(&prefill, ids, pos, N, vocab, &worst, &scale, why, sizeof why) < 0) {
        result(res, KIT_FAIL, "%s", why);
        goto done;
    }
    /* the decode plans continue from the caches their own prefill left */
    const rlx_model_config *cfg = rlx_model_config_of(m);
    const size_t cache_bytes =
        (size_t)2 * prefill.io.n_layers * CAPACITY * sizeof(float) * (size_t)(cfg->num_key_value_heads * cfg->head_dim);
    for (int i = 0; i < 2; i++)
        memcpy(decode.cache[i], prefill.cache[i], cache_bytes);
    if (span_pair_run(&decode, ids + N, pos + N, 1, vocab, &worst, &scale, why, sizeof why) < 0) {
        result(res, KIT_FAIL, "decode: %s", why);
        goto done;
    }
    uint32_t calls[2] = {rlx_plan_n_calls(prefill.plan[0]), rlx_plan_n_calls(decode.plan[0])};
    const uint32_t nodes = rlx_graph_n_nodes(prefill.g);
    const uint32_t prec = rlx_plan_node_precision(prefill.plan[0], 0);
    double tol = r->o->tol[KIT_TOL_MODEL];
    if (prec == RLX_PRECISION_BF16_ACT && !r->o->tol_set[KIT_TOL_MODEL])
        tol = KIT_BF16_MODEL_EMULATED;
    res->err = worst;
    res->limit = tol * scale;
    if (worst <= res->limit)
        result(res, KIT_PASS, "%u prompt tokens and a decode step; %u nodes in %u calls (prefill), %u (decode)", N,
               nodes, calls[0], calls[1]);
    else
        result(res, KIT_FAIL, "backend '%s': logits with spans differ from node-by-node ones by %.3g%s",
               rlx_backend_name(r->tested), worst, isfinite(worst) ? "" : " (NaN or Inf)");
done:
    span_pair_free(&prefill);
    span_pair_free(&decode);
    rlx_backend_destroy(b);
    rlx_model_close(m);
}
