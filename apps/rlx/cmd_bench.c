/* rlx bench: prefill and decode throughput (median over repetitions, after one warm-up run
 * that faults the mapped weights in) and the process's peak RSS, with what it ran on: the CPU
 * and the backend's own description. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common.h"

static const char usage[] =
    "usage: rlx bench [-m PATH] [-p 128,512] [-n 64] [-d 0,4096] [-t 1,2] [-r 3] [-o md|json|jsonl | --json]\n"
    "                 [options]\n\n"
    "Measures, as llama-bench does, prefill of P-token prompts (test ppP) and N decode steps (test\n"
    "tgN), each from an empty context or after D tokens already in it (-d, untimed: test ppP @ dD),\n"
    "R times after a warm-up run, for every thread count T.\n"
    "Reports the median and standard deviation of tokens/s, the peak resident memory of the\n"
    "process and what it ran on (the CPU and the backend's own description). Over a pipeline\n"
    "(--config, --stages) it prints each stage's backend and memory on stderr first, and after\n"
    "the table each stage's milliseconds per step, the share of the time it worked, and the\n"
    "bytes per token each way (-o json: \"stages\", --json: \"pp_stages\" and \"tg_stages\"; with -d they\n"
    "include the depth's prefill).\n\n";

#define MAX_LIST 16

/* A comma list of -p, -n or -t values, as llama-bench takes them. */
typedef struct u32_list {
    uint32_t v[MAX_LIST];
    size_t n;
} u32_list;

static int parse_list(const char *opt, const char *value, void *target) {
    u32_list *l = target;
    l->n = 0;
    char copy[512];
    if (snprintf(copy, sizeof copy, "%s", value) >= (int)sizeof copy)
        return app_fail("%s: list too long", opt), -1;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (l->n == MAX_LIST)
            return app_fail("%s: at most %d values", opt, MAX_LIST), -1;
        if (app_parse_u32(opt, item, &l->v[l->n]) < 0)
            return -1;
        l->n++;
    }
    if (l->n == 0)
        return app_fail("%s: no value given", opt), -1;
    return 0;
}

typedef enum bench_output { OUT_MD, OUT_JSON, OUT_JSONL } bench_output;

static int parse_output(const char *opt, const char *value, void *target) {
    bench_output *out = target;
    if (strcmp(value, "md") == 0)
        *out = OUT_MD;
    else if (strcmp(value, "json") == 0)
        *out = OUT_JSON;
    else if (strcmp(value, "jsonl") == 0)
        *out = OUT_JSONL;
    else
        return app_fail("%s: '%s' is not one of md, json, jsonl", opt, value), -1;
    return 0;
}

/* The CPU a benchmark ran on, from /proc/cpuinfo (its first processor) and the scheduler. */
typedef struct host_info {
    char cpu[256], vendor[64];
    int family, model;
    char flags[512]; /* the ISA extensions rlx kernels or their libraries use, space-separated */
    uint32_t online, usable;
} host_info;

/* Whether `flag` is an extension some rlx kernel, OpenBLAS or oneDNN path depends on. */
static int relevant_flag(const char *flag) {
    static const char *const names[] = {"sse4_2",      "avx",         "avx2",     "fma",
                                        "f16c",        "avx512f",     "avx512bw", "avx512vl",
                                        "avx512_bf16", "avx512_fp16", "avx_vnni", "avx512_vnni"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(flag, names[i]) == 0)
            return 1;
    return strncmp(flag, "amx_", 4) == 0;
}

/* The value of a "key<tabs>: value" line of /proc/cpuinfo, or NULL. */
static char *cpuinfo_value(char *line, const char *key) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) != 0 || (line[n] != '\t' && line[n] != ' ' && line[n] != ':'))
        return NULL;
    char *colon = strchr(line + n, ':'), *end = line + strlen(line);
    if (!colon)
        return NULL;
    while (end > colon && (end[-1] == '\n' || end[-1] == ' '))
        *--end = '\0';
    return colon[1] == ' ' ? colon + 2 : colon + 1;
}

static void host_describe(host_info *h) {
    memset(h, 0, sizeof *h);
    h->family = h->model = -1;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    h->online = online > 0 ? (uint32_t)online : 1;
    h->usable = app_usable_cores();
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[8192];
    char *v;
    while (fgets(line, sizeof line, f) && line[0] != '\n') { /* the first processor's block */
        if ((v = cpuinfo_value(line, "model name")))
            snprintf(h->cpu, sizeof h->cpu, "%s", v);
        else if ((v = cpuinfo_value(line, "vendor_id")))
            snprintf(h->vendor, sizeof h->vendor, "%s", v);
        else if ((v = cpuinfo_value(line, "cpu family")))
            h->family = atoi(v);
        else if ((v = cpuinfo_value(line, "model")))
            h->model = atoi(v);
        else if ((v = cpuinfo_value(line, "flags"))) {
            size_t len = 0;
            char *save = NULL;
            for (char *flag = strtok_r(v, " ", &save); flag; flag = strtok_r(NULL, " ", &save))
                if (relevant_flag(flag) && len + strlen(flag) + 2 < sizeof h->flags)
                    len += (size_t)snprintf(h->flags + len, sizeof h->flags - len, "%s%s", len ? " " : "", flag);
        }
    }
    fclose(f);
}

/* The host and the backend's own description into a JSON object. */
static void add_host_json(cJSON *o, const host_info *h, const char *describe) {
    cJSON *host = cJSON_AddObjectToObject(o, "host");
    cJSON_AddStringToObject(host, "cpu", h->cpu);
    cJSON_AddStringToObject(host, "vendor", h->vendor);
    cJSON_AddNumberToObject(host, "family", h->family);
    cJSON_AddNumberToObject(host, "model", h->model);
    cJSON *flags = cJSON_AddArrayToObject(host, "flags");
    char copy[sizeof h->flags];
    memcpy(copy, h->flags, sizeof copy);
    for (char *save = NULL, *flag = strtok_r(copy, " ", &save); flag; flag = strtok_r(NULL, " ", &save))
        cJSON_AddItemToArray(flags, cJSON_CreateString(flag));
    cJSON_AddNumberToObject(host, "cores_online", h->online);
    cJSON_AddNumberToObject(host, "cores_usable", h->usable);
    cJSON_AddStringToObject(o, "backend_describe", describe);
}

/* o printed on one line, then end, and freed; -1 when out of memory for the text. */
static int print_json(cJSON *o, const char *end) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return -1;
    fputs(text, stdout);
    fputs(end, stdout);
    free(text);
    return 0;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, uint32_t n) {
    qsort(v, n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double stddev(const double *v, uint32_t n) {
    if (n < 2)
        return 0;
    double mean = 0, ss = 0;
    for (uint32_t i = 0; i < n; i++)
        mean += v[i] / n;
    for (uint32_t i = 0; i < n; i++)
        ss += (v[i] - mean) * (v[i] - mean);
    return sqrt(ss / (n - 1));
}

/* One repetition of a test: the first d ids of prompt prefilled untimed (the depth), then a
 * timed prefill of the next p ids, or (p == 0) n decode steps, each feeding back the argmax, so
 * the work is that of a real decode. Its seconds. */
static int run_test(const rlx_lm *lm, const int32_t *prompt, uint32_t d, uint32_t p, uint32_t n, double *seconds) {
    const float *logits;
    int64_t vocab = lm->vocab;
    lm->truncate(lm->self, 0);
    if (d && lm->forward(lm->self, prompt, d, 0, &logits) != RLX_OK)
        return -1;
    double t0 = now_seconds();
    if (p)
        return lm->forward(lm->self, prompt + d, p, 0, &logits) == RLX_OK ? (*seconds = now_seconds() - t0, 0) : -1;
    int32_t token = prompt[d];
    for (uint32_t i = 0; i < n; i++) {
        if (lm->forward(lm->self, &token, 1, 0, &logits) != RLX_OK)
            return -1;
        token = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (logits[v] > logits[token])
                token = (int32_t)v;
    }
    *seconds = now_seconds() - t0;
    return 0;
}

/* What the table says of the model: "qwen3 34M BF16", its bytes and parameters. */
typedef struct model_info {
    char desc[96];
    double bytes, params;
} model_info;

static void model_describe(const app_runtime *rt, model_info *m) {
    memset(m, 0, sizeof *m);
    if (!rt->model) { /* a pipeline driver holds no weights */
        const char *slash = strrchr(rt->model_dir, '/');
        snprintf(m->desc, sizeof m->desc, "%s (pipeline)", slash && slash[1] ? slash + 1 : rt->model_dir);
        return;
    }
    /* named after the dtype holding most of the bytes (a Q4_K_M file is mostly Q4_K) */
    const rlx_weights *w = rlx_model_weights(rt->model);
    double dtype_bytes[RLX_DTYPE_COUNT] = {0};
    int main_dtype = -1;
    for (size_t i = 0; i < rlx_weights_count(w); i++) {
        const rlx_weight *x = rlx_weights_at(w, i);
        double numel = 1;
        for (uint32_t d = 0; d < x->n_dims; d++)
            numel *= (double)x->shape[d];
        m->params += numel;
        if (x->dtype < RLX_DTYPE_COUNT) {
            dtype_bytes[x->dtype] += (double)x->nbytes;
            if (main_dtype < 0 || dtype_bytes[x->dtype] > dtype_bytes[main_dtype])
                main_dtype = (int)x->dtype;
        }
    }
    m->bytes = (double)rlx_weights_total_bytes(w);
    char size[16];
    if (m->params >= 1e9)
        snprintf(size, sizeof size, "%.1fB", m->params / 1e9);
    else
        snprintf(size, sizeof size, "%.0fM", m->params / 1e6);
    char dtype[16] = "";
    for (const char *c = main_dtype >= 0 ? rlx_dtype_name(main_dtype) : ""; *c && strlen(dtype) < sizeof dtype - 1; c++)
        dtype[strlen(dtype)] = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
    snprintf(m->desc, sizeof m->desc, "%s %s %s", rlx_model_config_of(rt->model)->model_type, size, dtype);
}

#define MAX_REPS 64

/* One row of results: a test at a thread count. */
typedef struct bench_row {
    uint32_t threads, d, p, n;
    double samples[MAX_REPS]; /* tokens/s of each repetition */
    double seconds[MAX_REPS];
    double median, sd;
    /* over a pipeline: each stage's share of the repetitions (steps, seconds, bytes) */
    uint32_t n_stages;
    rlx_driver_stage_stats *stages;
} bench_row;

/* Snapshots every stage's figures into a malloc'd array (NULL without a pipeline). */
static rlx_driver_stage_stats *stage_snapshot(const rlx_runtime *rt, uint32_t *n) {
    const rlx_driver *d = rlx_runtime_driver(rt);
    *n = d ? rlx_driver_n_stages(d) : 0;
    rlx_driver_stage_stats *s = *n ? calloc(*n, sizeof *s) : NULL;
    for (uint32_t i = 0; s && i < *n; i++)
        rlx_driver_stage_stats_of(d, i, &s[i]);
    if (!s)
        *n = 0;
    return s;
}

/* What each stage took of a row's repetitions: after - before, into r->stages. */
static void stage_share(bench_row *r, const rlx_runtime *rt, rlx_driver_stage_stats *before, uint32_t n) {
    uint32_t n_after;
    rlx_driver_stage_stats *after = stage_snapshot(rt, &n_after);
    if (after && before && n_after == n) {
        for (uint32_t i = 0; i < n; i++) {
            after[i].steps -= before[i].steps;
            after[i].seconds -= before[i].seconds;
            after[i].bytes_sent -= before[i].bytes_sent;
            after[i].bytes_received -= before[i].bytes_received;
        }
        r->stages = after;
        r->n_stages = n;
    } else {
        free(after);
    }
    free(before);
}

/* Per stage of a row: milliseconds per forward step, the share of the wall time the stage
 * worked (its compute and transfers as the driver waited for them), and the bytes per token each
 * way. */
static void stage_figures(const bench_row *r, uint32_t reps, uint32_t i, double *ms, double *busy, double *sent,
                          double *received) {
    double wall = 0;
    for (uint32_t k = 0; k < reps; k++)
        wall += r->seconds[k];
    const rlx_driver_stage_stats *s = &r->stages[i];
    const double tokens = (double)reps * (r->p ? r->p : r->n);
    *ms = s->steps ? 1e3 * s->seconds / (double)s->steps : 0;
    *busy = wall > 0 ? s->seconds / wall : 0;
    *sent = (double)s->bytes_sent / tokens;
    *received = (double)s->bytes_received / tokens;
}

/* "key": [{"stage": i, ...}, ...] of a pipeline row into o; nothing without a pipeline. */
static void add_stages_json(cJSON *o, const bench_row *r, uint32_t reps, const char *key) {
    if (!r->n_stages)
        return;
    cJSON *stages = cJSON_AddArrayToObject(o, key);
    for (uint32_t i = 0; i < r->n_stages; i++) {
        double ms, busy, sent, received;
        stage_figures(r, reps, i, &ms, &busy, &sent, &received);
        cJSON *st = cJSON_CreateObject();
        cJSON_AddItemToArray(stages, st);
        cJSON_AddNumberToObject(st, "stage", i);
        cJSON_AddNumberToObject(st, "steps", (double)r->stages[i].steps);
        cJSON_AddNumberToObject(st, "ms_per_step", ms);
        cJSON_AddNumberToObject(st, "busy", busy);
        cJSON_AddNumberToObject(st, "bytes_sent_per_token", sent);
        cJSON_AddNumberToObject(st, "bytes_received_per_token", received);
    }
}

/* Under the markdown table: each pipeline stage's share of each test. */
static void print_md_stages(const bench_row *rows, size_t n_rows, uint32_t reps) {
    for (size_t k = 0; k < n_rows; k++)
        for (uint32_t i = 0; i < rows[k].n_stages; i++) {
            double ms, busy, sent, received;
            stage_figures(&rows[k], reps, i, &ms, &busy, &sent, &received);
            printf("%s%s%u t%u stage %u: %.2f ms per step, busy %.0f %% of the time, %.0f bytes per token sent, "
                   "%.0f received\n",
                   k == 0 && i == 0 ? "\n" : "", rows[k].p ? "pp" : "tg", rows[k].p ? rows[k].p : rows[k].n,
                   rows[k].threads, i, ms, 100 * busy, sent, received);
        }
}

/* One row in llama-bench's JSON fields, plus rlx's own (peak RSS, stages, host). */
static cJSON *json_row(const bench_row *r, uint32_t reps, const model_info *m, const char *model_dir,
                       const char *backend, const host_info *h, const char *describe, double rss_mb,
                       const char *test_time, const char *kv_type, uint64_t kv_bytes, uint64_t state_bytes) {
    double mean_s = 0, mean_ts = 0;
    for (uint32_t i = 0; i < reps; i++)
        mean_s += r->seconds[i] / reps, mean_ts += r->samples[i] / reps;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "cpu_info", h->cpu);
    cJSON_AddStringToObject(o, "backends", backend);
    cJSON_AddStringToObject(o, "model_filename", model_dir);
    cJSON_AddStringToObject(o, "model_type", m->desc);
    cJSON_AddNumberToObject(o, "model_size", m->bytes);
    cJSON_AddNumberToObject(o, "model_n_params", m->params);
    cJSON_AddNumberToObject(o, "n_threads", r->threads);
    cJSON_AddNumberToObject(o, "n_prompt", r->p);
    cJSON_AddNumberToObject(o, "n_gen", r->n);
    cJSON_AddNumberToObject(o, "n_depth", r->d);
    cJSON_AddStringToObject(o, "test_time", test_time);
    cJSON_AddNumberToObject(o, "avg_ns", round(mean_s * 1e9));
    cJSON_AddNumberToObject(o, "stddev_ns", round(stddev(r->seconds, reps) * 1e9));
    cJSON_AddNumberToObject(o, "avg_ts", mean_ts);
    cJSON_AddNumberToObject(o, "stddev_ts", r->sd);
    cJSON_AddNumberToObject(o, "median_ts", r->median);
    cJSON *ns = cJSON_AddArrayToObject(o, "samples_ns"), *ts = cJSON_AddArrayToObject(o, "samples_ts");
    for (uint32_t i = 0; i < reps; i++) {
        cJSON_AddItemToArray(ns, cJSON_CreateNumber(round(r->seconds[i] * 1e9)));
        cJSON_AddItemToArray(ts, cJSON_CreateNumber(r->samples[i]));
    }
    cJSON_AddStringToObject(o, "type_k", kv_type);
    cJSON_AddStringToObject(o, "type_v", kv_type);
    cJSON_AddNumberToObject(o, "peak_rss_mb", rss_mb);
    cJSON_AddNumberToObject(o, "kv_cache_bytes", (double)kv_bytes);
    cJSON_AddNumberToObject(o, "state_bytes", (double)state_bytes);
    add_stages_json(o, r, reps, "stages");
    add_host_json(o, h, describe);
    return o;
}

/* llama-bench's markdown table, with the median in the t/s column. */
static void print_md(const bench_row *rows, size_t n_rows, const model_info *m, const char *backend) {
    printf("| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s |\n", "model", "size", "params", "backend", "threads",
           "test", "t/s");
    printf("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | "
           "-------------------: |\n");
    char size[32] = "-", params[32] = "-";
    if (m->bytes > 0) {
        snprintf(size, sizeof size, "%.2f %s",
                 m->bytes >= 1073741824.0 ? m->bytes / 1073741824.0 : m->bytes / 1048576.0,
                 m->bytes >= 1073741824.0 ? "GiB" : "MiB");
        snprintf(params, sizeof params, "%.2f %s", m->params >= 1e9 ? m->params / 1e9 : m->params / 1e6,
                 m->params >= 1e9 ? "B" : "M");
    }
    for (size_t i = 0; i < n_rows; i++) {
        char test[40], ts[48];
        int len = snprintf(test, sizeof test, "%s%u", rows[i].p ? "pp" : "tg", rows[i].p ? rows[i].p : rows[i].n);
        if (rows[i].d) /* llama-bench's name of a test at depth */
            snprintf(test + len, sizeof test - (size_t)len, " @ d%u", rows[i].d);
        snprintf(ts, sizeof ts, "%.2f ± %.2f", rows[i].median, rows[i].sd);
        /* "±" is two bytes and one column: one more byte of padding keeps the table aligned */
        printf("| %-30s | %10s | %10s | %-10s | %7u | %15s | %21s |\n", m->desc, size, params, backend, rows[i].threads,
               test, ts);
    }
}

int cmd_bench(int argc, char **argv, app_options *o) {
    u32_list prompts = {{128}, 1}, gens = {{64}, 1}, depths = {{0}, 1}, threads = {{0}, 0};
    uint64_t kv_bytes = 0, state_bytes = 0; /* one sequence's, a local session's */
    uint32_t reps = 3;
    int json = 0;
    bench_output output = OUT_MD;
    int output_given = 0;
    const app_opt own[] = {
        {'p', "n-prompt", NULL, "P,..", "prompt lengths to prefill (default 128)", APP_OPT_CUSTOM, &prompts,
         .parse = parse_list},
        {'n', "n-gen", NULL, "N,..", "decode steps to time (default 64; 0 = no decode test)", APP_OPT_CUSTOM, &gens,
         .parse = parse_list},
        {'d', "n-depth", NULL, "D,..", "tokens in the context before each test, prefilled untimed (default 0)",
         APP_OPT_CUSTOM, &depths, .parse = parse_list},
        {'t', "threads", NULL, "T,..", "backend thread counts (default: all cores)", APP_OPT_CUSTOM, &threads,
         .parse = parse_list},
        {'r', "repetitions", NULL, "R", "repetitions of each test (default 3, at most 64)", APP_OPT_U32, &reps,
         .min = 1},
        {'o', "output", NULL, "FMT",
         "md: llama-bench's table (default); json: an array of one object per\n"
         "test (llama-bench's keys, plus median_ts, peak_rss_mb, host); jsonl: one per line",
         APP_OPT_CUSTOM, &output, &output_given, .parse = parse_output},
        {0, "json", NULL, NULL,
         "one JSON object for one -p, -n and -t: pp_tps, tg_tps (medians),\n"
         "peak_rss_mb, ..., host (cpu, vendor, family, model, flags, cores) and backend_describe",
         APP_OPT_FLAG, &json},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("bench:", own), app_common_group(o),
                                    app_pipeline_group(&o->pipeline)};
    int exit_status;
    if (app_parse_command("bench", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    if (reps > MAX_REPS)
        return app_fail("bench: -r: at most %d repetitions", MAX_REPS);
    if (json && (output_given || prompts.n > 1 || gens.n > 1 || depths.n > 1 || threads.n > 1))
        return app_fail("bench: --json describes one -p, -n, -d and -t; for lists use -o json or -o jsonl");
    uint32_t max_p = 0, max_n = 0, max_d = 0;
    for (size_t i = 0; i < depths.n; i++)
        max_d = depths.v[i] > max_d ? depths.v[i] : max_d;
    for (size_t i = 0; i < prompts.n; i++)
        max_p = prompts.v[i] > max_p ? prompts.v[i] : max_p;
    for (size_t i = 0; i < gens.n; i++)
        max_n = gens.v[i] > max_n ? gens.v[i] : max_n;
    for (size_t i = 0; i < threads.n; i++)
        if (threads.v[i] == 0)
            return app_fail("bench: -t: thread counts must be at least 1");
    if (max_p == 0)
        return app_fail("bench: -p must be at least 1");
    if (threads.n == 0) /* the --threads of the shared options (or the backend's default) */
        threads.v[threads.n++] = o->threads;
    /* the context must hold the deepest test (a prompt id per position, decode's first included) */
    const uint64_t need = (uint64_t)max_d + (max_p > max_n ? max_p : max_n);
    if (need > INT32_MAX)
        return app_fail("bench: -d plus -p or -n is %llu positions, more than a context can hold",
                        (unsigned long long)need);
    if (o->ctx == 0)
        o->ctx = (uint32_t)need;
    size_t n_rows = 0, max_rows = threads.n * depths.n * (prompts.n + gens.n);
    bench_row *rows = calloc(max_rows, sizeof *rows);
    int32_t *prompt = malloc((size_t)(max_d + max_p + 1) * sizeof *prompt);
    int status = 0;
    app_runtime rt = {0};
    model_info model;
    char describe[1024] = "", backend[64] = "";
    if (!rows || !prompt) {
        status = app_fail("bench: out of memory");
        goto done;
    }
    for (size_t t = 0; t < threads.n && !status; t++) {
        o->threads = threads.v[t];
        if (app_runtime_open(&rt, o, NULL)) {
            status = 1;
            break;
        }
        for (uint32_t i = 0; i < max_d + max_p + 1; i++) /* arbitrary ids spread over the vocabulary */
            prompt[i] = (int32_t)((i * 2654435761u) % (uint32_t)rt.lm.vocab);
        model_describe(&rt, &model);
        snprintf(backend, sizeof backend, "%s",
                 rt.pipeline  ? "pipeline"
                 : rt.backend ? rlx_backend_name(rt.backend)
                              : "ref");
        /* the backend's own account of its kernels, library cores and threads (stages' are on stderr) */
        snprintf(describe, sizeof describe, "%s",
                 rt.backend    ? rlx_backend_describe(rt.backend)
                 : rt.pipeline ? ""
                               : "reference kernels");
        if (rt.pipeline && t == 0)
            app_pipeline_describe(rt.runtime);
        for (size_t k = 0; k < depths.n * (prompts.n + gens.n) && !status; k++) {
            bench_row *r = &rows[n_rows];
            const size_t test = k % (prompts.n + gens.n);
            r->threads = threads.v[t] ? threads.v[t] : app_usable_cores(); /* the backends' default */
            r->d = depths.v[k / (prompts.n + gens.n)];
            r->p = test < prompts.n ? prompts.v[test] : 0;
            r->n = test < prompts.n ? 0 : gens.v[test - prompts.n];
            if (!r->p && !r->n)
                continue;
            double warm;
            if (run_test(&rt.lm, prompt, r->d, r->p, r->n < 2 ? r->n : 2, &warm) < 0) {
                status = app_fail_rlx("bench");
                break;
            }
            uint32_t n_stages;
            rlx_driver_stage_stats *before = stage_snapshot(rt.runtime, &n_stages);
            for (uint32_t i = 0; i < reps; i++) {
                if (run_test(&rt.lm, prompt, r->d, r->p, r->n, &r->seconds[i]) < 0) {
                    status = app_fail_rlx("bench");
                    break;
                }
                r->samples[i] = (r->p ? r->p : r->n) / r->seconds[i];
            }
            stage_share(r, rt.runtime, before, n_stages);
            if (rlx_runtime_session(rt.runtime))
                rlx_session_memory(rlx_runtime_session(rt.runtime), &kv_bytes, &state_bytes);
            double sorted[MAX_REPS];
            memcpy(sorted, r->samples, reps * sizeof *sorted);
            r->median = median(sorted, reps);
            r->sd = stddev(r->samples, reps);
            n_rows++;
        }
        app_runtime_close(&rt);
    }
    if (status)
        goto done;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_mb = (double)ru.ru_maxrss / 1024.0;
    host_info host;
    host_describe(&host);
    const char *kv_type = rlx_dtype_name((int)o->cache_type_k); /* llama-bench's names: f16, q8_0, ... */
    if (json) {
        double pp_tps = 0, tg_tps = 0;
        for (size_t i = 0; i < n_rows; i++)
            *(rows[i].p ? &pp_tps : &tg_tps) = rows[i].median;
        cJSON *summary = cJSON_CreateObject();
        cJSON_AddStringToObject(summary, "backend", backend);
        cJSON_AddNumberToObject(summary, "threads", threads.v[0]);
        cJSON_AddNumberToObject(summary, "prompt", prompts.v[0]);
        cJSON_AddNumberToObject(summary, "decode", gens.v[0]);
        cJSON_AddNumberToObject(summary, "depth", depths.v[0]);
        cJSON_AddNumberToObject(summary, "repetitions", reps);
        cJSON_AddNumberToObject(summary, "pp_tps", pp_tps);
        cJSON_AddNumberToObject(summary, "tg_tps", tg_tps);
        cJSON_AddNumberToObject(summary, "peak_rss_mb", rss_mb);
        cJSON_AddNumberToObject(summary, "weights_mb", model.bytes / 1048576.0);
        cJSON_AddStringToObject(summary, "type_k", kv_type);
        cJSON_AddStringToObject(summary, "type_v", kv_type);
        cJSON_AddNumberToObject(summary, "kv_cache_bytes", (double)kv_bytes);
        cJSON_AddNumberToObject(summary, "state_bytes", (double)state_bytes);
        for (size_t i = 0; i < n_rows; i++)
            add_stages_json(summary, &rows[i], reps, rows[i].p ? "pp_stages" : "tg_stages");
        add_host_json(summary, &host, describe);
        if (print_json(summary, "\n") < 0)
            status = app_fail("bench: out of memory");
    } else if (output == OUT_MD) {
        print_md(rows, n_rows, &model, backend);
        print_md_stages(rows, n_rows, reps);
        printf("\nhost: %s (%s family %d model %d), %u of %u cores usable, %s%s%s; peak RSS %.1f MiB; t/s is the "
               "median ± standard deviation of %u runs\n",
               host.cpu, host.vendor, host.family, host.model, host.usable, host.online, host.flags,
               *describe ? "; backend: " : "", describe, rss_mb, reps);
        if (kv_bytes + state_bytes)
            printf("per sequence: KV cache %.1f MiB, recurrent state %.2f MiB\n", (double)kv_bytes / 1048576.0,
                   (double)state_bytes / 1048576.0);
    } else {
        char test_time[32];
        time_t now = time(NULL);
        strftime(test_time, sizeof test_time, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        if (output == OUT_JSON)
            printf("[\n");
        for (size_t i = 0; i < n_rows && !status; i++)
            if (print_json(json_row(&rows[i], reps, &model, o->model ? o->model : "", backend, &host, describe, rss_mb,
                                    test_time, kv_type, kv_bytes, state_bytes),
                           output == OUT_JSON && i + 1 < n_rows ? ",\n" : "\n") < 0)
                status = app_fail("bench: out of memory");
        if (output == OUT_JSON)
            printf("]\n");
    }
    if (fflush(stdout) != 0)
        status = app_fail("bench: cannot write to stdout");
done:
    for (size_t i = 0; rows && i < n_rows; i++)
        free(rows[i].stages);
    free(rows);
    free(prompt);
    return status;
}
