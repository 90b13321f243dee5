/* rlx bench: prefill and decode throughput (median over repetitions, after one warm-up run
 * that faults the mapped weights in) and the process's peak RSS, with what it ran on: the CPU
 * and the backend's own description. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static const char help[] =
    "usage: rlx bench --model DIR [-p 128] [-n 64] [-r 3] [--json] [options]\n\n"
    "Measures prefill of a P-token prompt and N decode steps, R times after a warm-up run, and\n"
    "reports median tokens/s and the peak resident memory of the process. Over a pipeline\n"
    "(--config, --stages) it prints each stage's backend and memory on stderr first.\n\n"
    "  -p P     prompt tokens (default 128)\n"
    "  -n N     decode steps (default 64)\n"
    "  -r R     repetitions (default 3)\n"
    "  --json   print one JSON object: pp_tps, tg_tps, peak_rss_mb, ..., host (cpu, vendor,\n"
    "           family, model, flags, cores_online, cores_usable) and backend_describe\n\noptions:\n";

/* The CPU a benchmark ran on, from /proc/cpuinfo (its first processor) and the scheduler. */
typedef struct host_info {
    char cpu[256], vendor[64];
    int family, model;
    char flags[512]; /* the ISA extensions rlx kernels or their libraries use, space-separated */
    uint32_t online, usable;
} host_info;

/* Whether `flag` is an extension some rlx kernel, OpenBLAS or oneDNN path depends on. */
static int relevant_flag(const char *flag) {
    static const char *const names[] = {"sse4_2",   "avx",        "avx2",        "fma",         "f16c",
                                        "avx512f",  "avx512bw",   "avx512vl",    "avx512_bf16", "avx512_fp16",
                                        "avx_vnni", "avx512_vnni"};
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

/* s as a JSON string literal. */
static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void print_host_json(const host_info *h, const char *describe) {
    printf(", \"host\": {\"cpu\": ");
    json_string(h->cpu);
    printf(", \"vendor\": ");
    json_string(h->vendor);
    printf(", \"family\": %d, \"model\": %d, \"flags\": [", h->family, h->model);
    char flags[sizeof h->flags];
    memcpy(flags, h->flags, sizeof flags);
    int first = 1;
    for (char *save = NULL, *flag = strtok_r(flags, " ", &save); flag; flag = strtok_r(NULL, " ", &save), first = 0)
        printf("%s\"%s\"", first ? "" : ", ", flag);
    printf("], \"cores_online\": %u, \"cores_usable\": %u}, \"backend_describe\": ", h->online, h->usable);
    json_string(describe);
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

/* One repetition: prefill `prompt`, then decode n_decode tokens (greedy, so the work is the
 * same as a real decode). */
static int run_once(const rlx_lm *lm, const int32_t *prompt, uint32_t p, uint32_t n_decode, double *pp_seconds,
                    double *tg_seconds) {
    const float *logits;
    int64_t vocab = lm->vocab;
    lm->truncate(lm->self, 0);
    double t0 = now_seconds();
    if (lm->forward(lm->self, prompt, p, 0, &logits) != RLX_OK)
        return -1;
    double t1 = now_seconds();
    for (uint32_t i = 0; i < n_decode; i++) {
        int32_t best = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        if (lm->forward(lm->self, &best, 1, 0, &logits) != RLX_OK)
            return -1;
    }
    *pp_seconds = t1 - t0;
    *tg_seconds = now_seconds() - t1;
    return 0;
}

int cmd_bench(int argc, char **argv, app_options *o) {
    uint32_t p = 128, n = 64, reps = 3;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0) {
            printf("%s%s", help, app_common_help);
            return 0;
        }
        int rc = app_parse_common(o, argc, argv, &i);
        if (rc < 0)
            return 1;
        if (rc)
            continue;
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "-p") == 0 || strcmp(a, "-n") == 0 || strcmp(a, "-r") == 0) {
            uint32_t *dst = a[1] == 'p' ? &p : a[1] == 'n' ? &n : &reps;
            if (!(v = app_value(argc, argv, &i)) || app_parse_u32(a, v, dst) < 0)
                return 1;
        } else {
            return app_fail("bench: unknown option '%s' (see rlx bench --help)", a);
        }
    }
    if (p == 0 || reps == 0)
        return app_fail("bench: -p and -r must be at least 1");
    if (o->ctx == 0)
        o->ctx = p + n;
    app_runtime rt;
    if (app_runtime_open(&rt, o))
        return 1;
    int32_t *prompt = malloc(p * sizeof *prompt);
    double *pp = calloc(reps, sizeof *pp), *tg = calloc(reps, sizeof *tg);
    int status = 0;
    if (!prompt || !pp || !tg) {
        status = app_fail("bench: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < p; i++) /* arbitrary ids spread over the vocabulary */
        prompt[i] = (int32_t)((i * 2654435761u) % (uint32_t)rt.lm.vocab);
    double warm_pp, warm_tg;
    if (run_once(&rt.lm, prompt, p, n < 2 ? n : 2, &warm_pp, &warm_tg) < 0) {
        status = app_fail_rlx("bench");
        goto done;
    }
    for (uint32_t r = 0; r < reps; r++)
        if (run_once(&rt.lm, prompt, p, n, &pp[r], &tg[r]) < 0) {
            status = app_fail_rlx("bench");
            goto done;
        }
    for (uint32_t r = 0; r < reps; r++) {
        pp[r] = p / pp[r];
        tg[r] = n ? n / tg[r] : 0;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_mb = (double)ru.ru_maxrss / 1024.0;
    double weights_mb = rt.model ? (double)rlx_weights_total_bytes(rlx_model_weights(rt.model)) / 1048576.0 : 0;
    double pp_tps = median(pp, reps), tg_tps = median(tg, reps);
    const char *backend = rt.pipeline ? "pipeline" : rt.backend ? rlx_backend_name(rt.backend) : "ref";
    if (rt.pipeline) /* the stages' own memory and backends; the RSS below is the driver's */
        app_pipeline_describe(&rt);
    /* the backend's own account of its kernels, library cores and threads (stages' are on stderr) */
    const char *describe = rt.backend ? rlx_backend_describe(rt.backend) : rt.pipeline ? "" : "reference kernels";
    host_info host;
    host_describe(&host);
    if (json) {
        printf("{\"backend\": \"%s\", \"threads\": %u, \"prompt\": %u, \"decode\": %u, \"repetitions\": %u, "
               "\"pp_tps\": %.3f, \"tg_tps\": %.3f, \"peak_rss_mb\": %.1f, \"weights_mb\": %.1f",
               backend, o->threads, p, n, reps, pp_tps, tg_tps, rss_mb, weights_mb);
        print_host_json(&host, describe);
        printf("}\n");
    } else {
        printf("host: %s (%s family %d model %d), %u of %u cores usable, %s%s%s\n", host.cpu, host.vendor,
               host.family, host.model, host.usable, host.online, host.flags, *describe ? "; backend: " : "",
               describe);
        printf("backend %s, threads %u: pp%u %.2f tokens/s, tg%u %.2f tokens/s (median of %u), peak RSS %.1f MiB "
               "(weights %.1f MiB)\n",
               backend, o->threads, p, pp_tps, n, tg_tps, reps, rss_mb, weights_mb);
    }
    if (fflush(stdout) != 0)
        status = app_fail("bench: cannot write to stdout");
done:
    free(prompt);
    free(pp);
    free(tg);
    app_runtime_close(&rt);
    return status;
}
