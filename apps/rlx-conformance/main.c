/* rlx-conformance: checks a backend plugin against the core's reference kernels, against
 * NumPy-computed expectations and on whole models, and prints one line per check:
 *   PASS|FAIL|NOT CLAIMED|SKIPPED  source  case  max err (limit)  detail
 * then "N passed, M failed, K not claimed". Exit status 0 only when nothing failed.
 *
 * The checks run in a worker process. A worker that crashes or hangs fails the check it was
 * running; a new worker continues with the next check, so one bad kernel cannot hide the rest
 * of the report. The parent never loads the plugin, so forking it is safe. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kit.h"

#ifndef RLX_KIT_VERSION
#define RLX_KIT_VERSION "0"
#endif

static const char help[] =
    "usage: rlx-conformance --plugin NAME [options]\n"
    "\n"
    "Runs every op a backend plugin claims, over edge shapes and every weight dtype, and compares\n"
    "it with (a) the reference kernels of librlx, (b) expectations computed by NumPy and, with\n"
    "--model-dir, (c) whole models (logits and greedy ids, against the reference kernels and\n"
    "against NumPy golden logits when the directory has rlx-golden.txt). Ops the backend does not\n"
    "claim are reported NOT CLAIMED: the scheduler gives them to the reference kernels.\n"
    "\n"
    "options:\n"
    "  --plugin NAME      backend plugin name (or path to its .so); 'ref' checks the reference\n"
    "                     kernels against NumPy\n"
    "  --plugin-dir DIR   search DIR for plugins first (then RLX_PLUGIN_PATH, then the install)\n"
    "  --threads N        threads the backend may use (default: its own choice)\n"
    "  --backend-opts S   backend options, 'key=value,key=value' (rlx_backend_options.extra)\n"
    "  --model-dir DIR    also check the Qwen3 model in DIR (may be repeated)\n"
    "  --tolerance L      OP=X[,OP=X...]: bound on max|got - want| / max(1, max|want|) per op\n"
    "                     (embed matmul rms_norm rope attention swiglu add gather_last moe concat\n"
    "                     gather_rows sigmoid_mul ssm_conv gated_delta, 'model' for logits, 'all'\n"
    "                     for every op); may be repeated\n"
    "  --precision P      f32 (default) or bf16: a backend that rounds matmul activations to\n"
    "                     bf16 gets matmul=1e-2, moe=1e-2, model=5e-2 (--tolerance still wins)\n"
    "  --data DIR         NumPy expectation files (default: share/rlx/conformance of the install)\n"
    "  --filter TEXT      run only the checks whose name contains TEXT\n"
    "  --no-ref           skip the comparisons with the reference kernels\n"
    "  --no-numpy         skip the comparisons with NumPy expectations\n"
    "  --timeout SEC      a check that takes longer fails as hung (default 600)\n"
    "  --no-fork          run checks in this process (for debuggers; a crash ends the run)\n"
    "  --list             print the checks and exit\n"
    "  --version          the kit's version, the loaded librlx's and the plugin ABI\n"
    "  --verbose          print the plugin's log lines on stderr\n"
    "\n"
    "Exit status: 0 when no check failed, 1 when one did, 2 for a usage error.\n";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("rlx-conformance: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see rlx-conformance --help)\n", stderr);
    va_end(ap);
    return 2;
}

static const char *slot_name(int slot) { return slot == KIT_TOL_MODEL ? "model" : rlx_op_name(slot); }

/* "matmul=1e-2,moe=1e-2" */
static int parse_tolerance(kit_options *o, const char *text) {
    char spec[1024];
    if (snprintf(spec, sizeof spec, "%s", text) >= (int)sizeof spec)
        return usage_error("--tolerance: too long");
    for (char *save = NULL, *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *end;
        if (!eq)
            return usage_error("--tolerance: '%s' is not OP=X", item);
        *eq = '\0';
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (errno || end == eq + 1 || *end || !(v >= 0) || !isfinite(v))
            return usage_error("--tolerance: '%s' is not a non-negative number", eq + 1);
        int found = 0;
        for (int s = 1; s < KIT_N_TOL; s++)
            if (strcasecmp(item, "all") == 0 ? s != KIT_TOL_MODEL : strcasecmp(item, slot_name(s)) == 0) {
                o->tol[s] = v;
                o->tol_set[s] = 1;
                found = 1;
            }
        if (!found)
            return usage_error("--tolerance: unknown op '%s' (embed, matmul, rms_norm, rope, attention, swiglu, add, "
                               "gather_last, moe, concat, gather_rows, sigmoid_mul, ssm_conv, gated_delta, model, all)",
                               item);
    }
    return 0;
}

/* --data, else $RLX_CONFORMANCE_DATA, else share/rlx/conformance beside the executable's bin/
 * (the installed layout, which the build tree mirrors). */
static const char *default_data_dir(void) {
    static char dir[4200];
    const char *env = getenv("RLX_CONFORMANCE_DATA");
    if (env && *env)
        return env;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(dir, sizeof dir, "%s/../share/rlx/conformance", exe);
    char *real = realpath(dir, NULL);
    if (real) {
        snprintf(dir, sizeof dir, "%s", real);
        free(real);
    }
    return dir;
}

static void log_to_stderr(void *ctx, int level, const char *message) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "[%s] %s\n", level >= 0 && level < 4 ? names[level] : "log", message);
}

// ---------------------------------------------------------------------------------------------
// Report

typedef struct report {
    const kit_options *o;
    const kit_check *checks;
    size_t n_checks;
    size_t counts[4]; /* by KIT_* status */
    long current;     /* check in progress, -1 between checks */
    char phase[96];   /* what the check in progress was doing */
    size_t next;      /* first check not reported yet */
    int have_header, load_failed, finished;
    char plugin[256];
} report;

static const char *status_text[] = {"PASS", "FAIL", "NOT CLAIMED", "SKIPPED"};
static const char *source_text[] = {"ref", "numpy", "model"};

static void print_result(report *rp, size_t i, const kit_result *res) {
    const kit_check *c = &rp->checks[i];
    char measure[96] = "", line[2048];
    if (res->err >= 0 && res->status != KIT_NOT_CLAIMED)
        snprintf(measure, sizeof measure, "  max err %.3g (limit %.3g)", res->err, res->limit);
    int n = snprintf(line, sizeof line, "%-11s %-5s  %-66s%s%s%s", status_text[res->status], source_text[c->source],
                     c->name, measure, res->detail[0] ? (res->status == KIT_PASS ? "  " : "  -- ") : "", res->detail);
    for (n = n < (int)sizeof line ? n : (int)sizeof line - 1; n > 0 && line[n - 1] == ' ';)
        line[--n] = '\0';
    printf("%s\n", line);
    fflush(stdout);
    rp->counts[res->status]++;
}

static void print_failure(report *rp, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void print_failure(report *rp, const char *what, const char *fmt, ...) {
    char detail[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("%-11s %-5s  %s  -- %s\n", "FAIL", "kit", what, detail);
    fflush(stdout);
    rp->counts[KIT_FAIL]++;
}

/* Handles one event line of a worker: H header, S check started, P phase within it, R result,
 * L load failure, E end. */
static void handle(report *rp, char *line) {
    for (char *p = line; *p; p++)
        if (*p == '\x1f')
            *p = '\n';
    char kind = line[0];
    char *rest = line[1] == '\t' ? line + 2 : line + 1;
    if (kind == 'H') {
        if (!rp->have_header) {
            printf("rlx-conformance %s: %s\n", RLX_KIT_VERSION, rest);
            printf("tolerances (max|got - want| <= tol * max(1, max|want|)):");
            for (int s = 1; s < KIT_N_TOL; s++)
                printf(" %s=%g", slot_name(s), rp->o->tol[s]);
            printf("\nNumPy expectations: %s\n", rp->o->data_dir ? rp->o->data_dir : "not used (--no-numpy)");
            fflush(stdout);
        }
        rp->have_header = 1;
    } else if (kind == 'S') {
        rp->current = strtol(rest, NULL, 10);
        snprintf(rp->phase, sizeof rp->phase, "?");
    } else if (kind == 'P') {
        snprintf(rp->phase, sizeof rp->phase, "%s", rest);
    } else if (kind == 'R') {
        kit_result res = {0};
        char *f[6] = {rest};
        int nf = 1;
        for (char *p = rest; *p && nf < 6; p++)
            if (*p == '\t') {
                *p = '\0';
                f[nf++] = p + 1;
            }
        if (nf < 5)
            return;
        size_t i = strtoul(f[0], NULL, 10);
        res.status = (int)strtol(f[1], NULL, 10);
        res.err = strtod(f[2], NULL);
        res.limit = strtod(f[3], NULL);
        snprintf(res.detail, sizeof res.detail, "%s", f[4]);
        if (i < rp->n_checks && res.status >= 0 && res.status <= KIT_SKIPPED) {
            print_result(rp, i, &res);
            rp->next = i + 1;
        }
        rp->current = -1;
    } else if (kind == 'L') {
        print_failure(rp, "load", "%s", rest);
        rp->load_failed = 1;
    } else if (kind == 'E') {
        rp->finished = 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Worker

typedef struct emitter {
    int fd; /* pipe to the parent, or -1 to call handle() directly */
    report *rp;
} emitter;

static void emit(emitter *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(emitter *e, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n >= (int)sizeof line) { /* truncated: keep the line's end */
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    /* one event per line: newlines inside travel as \x1f */
    for (int i = 0; i < n - 1; i++)
        if (line[i] == '\n')
            line[i] = '\x1f';
    if (e->fd < 0) {
        line[n - 1] = '\0';
        handle(e->rp, line);
        return;
    }
    for (int off = 0; off < n;) {
        ssize_t w = write(e->fd, line + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(4); /* the parent is gone */
        off += (int)w;
    }
}

static void on_phase(void *ctx, const char *phase) { emit(ctx, "P\t%s\n", phase); }

static void clean(char *s) {
    for (; *s; s++)
        if (*s == '\t' || *s == '\n' || *s == '\r')
            *s = ' ';
}

static int worker(const kit_options *o, const kit_check *checks, size_t n, size_t start, emitter *e) {
    kit_runner *r;
    char why[4096];
    if (kit_runner_open(o, &r, why, sizeof why) < 0) {
        emit(e, "L\t%s\n", why);
        return 3;
    }
    char desc[1400];
    snprintf(desc, sizeof desc, "%s", kit_runner_describe(r));
    clean(desc);
    emit(e, "H\t%s\n", desc);
    kit_runner_on_phase(r, on_phase, e);
    for (size_t i = start; i < n; i++) {
        emit(e, "S\t%zu\n", i);
        kit_result res;
        kit_run_check(r, &checks[i], &res);
        clean(res.detail);
        emit(e, "R\t%zu\t%d\t%.17g\t%.17g\t%s\n", i, res.status, res.err, res.limit, res.detail);
    }
    kit_runner_close(r);
    emit(e, "E\n");
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Parent: workers until every check has a result

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void describe_exit(int status, char *buf, size_t len) {
    if (WIFSIGNALED(status))
        snprintf(buf, len, "crashed with signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, len, "exited with status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* Runs one worker from check rp->next; returns 0 to go on with a new worker, 1 when done. */
static int run_worker(report *rp) {
    int fds[2];
    if (pipe(fds) != 0) {
        print_failure(rp, "kit", "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        print_failure(rp, "kit", "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        emitter e = {.fd = fds[1], .rp = rp};
        _exit(worker(rp->o, rp->checks, rp->n_checks, rp->next, &e));
    }
    close(fds[1]);
    rp->current = -1;
    char buf[8192];
    size_t len = 0;
    double since = now();
    int timed_out = 0;
    for (;;) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        double left = rp->o->timeout - (now() - since);
        int rc = left <= 0 ? 0 : poll(&p, 1, left > 3600 ? 3600000 : (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc == 0) {
            timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        ssize_t got = read(fds[0], buf + len, sizeof buf - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
        char *start = buf, *nl;
        while ((nl = memchr(start, '\n', (size_t)(buf + len - start)))) {
            *nl = '\0';
            long before = rp->current;
            handle(rp, start);
            if (rp->current != before)
                since = now(); /* each check gets the whole timeout */
            start = nl + 1;
        }
        len = (size_t)(buf + len - start);
        memmove(buf, start, len);
        if (len == sizeof buf - 1)
            len = 0; /* an overlong line: drop it */
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (rp->load_failed || rp->finished)
        return 1;
    char how[160];
    describe_exit(status, how, sizeof how);
    if (rp->current >= 0) {
        kit_result res = {.status = KIT_FAIL, .err = -1};
        if (timed_out)
            snprintf(res.detail, sizeof res.detail,
                     "backend '%s' gave no result for node '%s' within %g s (hung in %s?)", rp->plugin,
                     rp->checks[rp->current].name, rp->o->timeout, rp->phase);
        else
            snprintf(res.detail, sizeof res.detail, "the worker running backend '%s' %s in %s on node '%s'", rp->plugin,
                     how, rp->phase, rp->checks[rp->current].name);
        print_result(rp, (size_t)rp->current, &res);
        rp->next = (size_t)rp->current + 1;
        return rp->next >= rp->n_checks;
    }
    if (!rp->have_header) {
        print_failure(rp, "load", "the worker %s while loading or opening backend '%s'", timed_out ? "hung" : how,
                      rp->plugin);
        return 1;
    }
    if (rp->next >= rp->n_checks) {
        print_failure(rp, "close", "the worker %s while closing backend '%s'", timed_out ? "hung" : how, rp->plugin);
        return 1;
    }
    print_failure(rp, "kit", "the worker %s between checks", how);
    return 1;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    kit_options o = {.timeout = 600};
    const char *model_dirs[64];
    size_t n_models = 0;
    int list = 0, no_fork = 0, no_numpy = 0;
    const char *precision = "f32";
    const char *tolerances[32];
    size_t n_tol = 0;
    for (int s = 1; s < KIT_N_TOL; s++)
        o.tol[s] = kit_default_tol(s);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("rlx-conformance %s (librlx %s; plugin ABI %d.%d)\n", RLX_KIT_VERSION, rlx_version(), RLX_ABI_MAJOR,
                   RLX_ABI_MINOR);
            return 0;
        } else if (!strcmp(a, "--list")) {
            list = 1;
        } else if (!strcmp(a, "--no-fork")) {
            no_fork = 1;
        } else if (!strcmp(a, "--no-ref")) {
            o.no_ref = 1;
        } else if (!strcmp(a, "--no-numpy")) {
            no_numpy = 1;
        } else if (!strcmp(a, "--verbose")) {
            o.verbose = 1;
        } else {
            static const char *valued[] = {"--plugin",    "--plugin-dir", "--threads", "--backend-opts", "--model-dir",
                                           "--tolerance", "--precision",  "--data",    "--filter",       "--timeout"};
            int known = 0;
            for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
                known |= !strcmp(a, valued[k]);
            if (!known)
                return usage_error("unknown option '%s'", a);
            if (i + 1 >= argc)
                return usage_error("option %s needs a value", a);
            const char *v = argv[++i];
            char *end;
            if (!strcmp(a, "--plugin")) {
                o.plugin = v;
            } else if (!strcmp(a, "--plugin-dir")) {
                o.plugin_dir = v;
            } else if (!strcmp(a, "--backend-opts")) {
                o.backend_opts = v;
            } else if (!strcmp(a, "--data")) {
                o.data_dir = v;
            } else if (!strcmp(a, "--filter")) {
                o.filter = v;
            } else if (!strcmp(a, "--precision")) {
                precision = v;
            } else if (!strcmp(a, "--model-dir")) {
                if (n_models == sizeof model_dirs / sizeof model_dirs[0])
                    return usage_error("too many --model-dir");
                model_dirs[n_models++] = v;
            } else if (!strcmp(a, "--tolerance")) {
                if (n_tol == sizeof tolerances / sizeof tolerances[0])
                    return usage_error("too many --tolerance");
                tolerances[n_tol++] = v;
            } else if (!strcmp(a, "--threads")) {
                errno = 0;
                unsigned long t = strtoul(v, &end, 10);
                if (errno || end == v || *end || v[0] == '-' || t > 4096)
                    return usage_error("--threads: '%s' is not a thread count", v);
                o.threads = (uint32_t)t;
            } else {
                errno = 0;
                o.timeout = strtod(v, &end);
                if (errno || end == v || *end || !(o.timeout > 0))
                    return usage_error("--timeout: '%s' is not a positive number of seconds", v);
            }
        }
    }
    if (!o.plugin)
        return usage_error("--plugin NAME is required");
    o.builtin_ref = strcasecmp(o.plugin, "ref") == 0;
    o.is_ref = o.builtin_ref && !o.backend_opts;
    if (!strcmp(precision, "bf16")) {
        const int slots[] = {RLX_OP_MATMUL, RLX_OP_MOE, KIT_TOL_MODEL};
        const double tols[] = {1e-2, 1e-2, 5e-2};
        for (int k = 0; k < 3; k++) {
            o.tol[slots[k]] = tols[k];
            o.tol_set[slots[k]] = 1;
        }
    } else if (strcmp(precision, "f32") != 0) {
        return usage_error("--precision: '%s' is not f32 or bf16", precision);
    }
    for (size_t k = 0; k < n_tol; k++)
        if (parse_tolerance(&o, tolerances[k]))
            return 2;
    for (size_t k = 0; k < n_models; k++) {
        char config[4200];
        snprintf(config, sizeof config, "%s/config.json", model_dirs[k]);
        if (access(config, R_OK) != 0)
            return usage_error("--model-dir: %s has no config.json", model_dirs[k]);
    }
    o.model_dirs = model_dirs;
    o.n_model_dirs = n_models;
    if (no_numpy)
        o.data_dir = NULL;
    else if (!o.data_dir)
        o.data_dir = default_data_dir();
    if (o.verbose)
        rlx_log_set_handler(log_to_stderr, NULL);

    kit_check *checks;
    size_t n;
    if (kit_enumerate(&o, &checks, &n) < 0)
        return 2;
    int status = 0;
    if (list) {
        for (size_t i = 0; i < n; i++)
            printf("%-5s  %s\n", source_text[checks[i].source], checks[i].name);
    } else {
        report rp = {.o = &o, .checks = checks, .n_checks = n, .current = -1};
        const char *base = strrchr(o.plugin, '/') ? strrchr(o.plugin, '/') + 1 : o.plugin;
        snprintf(rp.plugin, sizeof rp.plugin, "%s", base);
        if (no_fork) {
            emitter e = {.fd = -1, .rp = &rp};
            worker(&o, checks, n, 0, &e);
        } else {
            while (!run_worker(&rp))
                ;
        }
        printf("%s: %zu passed, %zu failed, %zu not claimed", rp.plugin, rp.counts[KIT_PASS], rp.counts[KIT_FAIL],
               rp.counts[KIT_NOT_CLAIMED]);
        if (rp.counts[KIT_SKIPPED])
            printf(", %zu skipped", rp.counts[KIT_SKIPPED]);
        printf("\n");
        status = rp.counts[KIT_FAIL] ? 1 : 0;
    }
    for (size_t i = 0; i < n; i++)
        free(checks[i].path);
    free(checks);
    return status;
}
