/* Commands over a pipeline: reads a deployment (or --stages N), launches local stage processes
 * when asked (fork/exec of this program's `stage` command, each reporting its bound address on
 * a pipe once it listens), and puts a pipeline driver behind app_runtime's rlx_lm. Launched
 * stages are stopped (SIGTERM, then SIGKILL after a grace period) and reaped on every path.
 *
 * Under a launcher (mpirun, srun) with --config, every rank runs the same command line: rank 0
 * drives, and rank k execs this program's `stage` command for stage k-1 of the file with the
 * arguments a launched stage would get, plus --once, so the job ends with its driver. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pipeline.h"
#include "rlx/deploy.h"
#include "rlx/dist.h"
#include "rlx/private.h"

#define LAUNCH_TIMEOUT_MS 300000 /* a stage reads its weights in before it listens */
#define STOP_GRACE_MS 5000

#define MAX_STAGES 64

struct app_pipeline {
    rlx_deploy *deploy;
    rlx_driver_stage stages[MAX_STAGES]; /* what the runtime drives */
    pid_t pids[MAX_STAGES];
    uint32_t n_pids;
    char *model_dir;
    rlx_model *model;                /* opened for its metadata: the driver reads none of its weights */
    char addresses[MAX_STAGES][300]; /* what launched stages reported */
    int rank;                        /* under a launcher with --config: this process's rank; else 0 */
    /* a launched stage's entry in pids (-1: not launched) and its command line, to restart it */
    char **launch_args[MAX_STAGES];
    int child[MAX_STAGES];
};

static int parse_stages(const char *opt, const char *value, void *target) {
    uint32_t *n = target;
    if (app_parse_u32(opt, value, n) < 0)
        return -1;
    if (*n < 1 || *n > MAX_STAGES)
        return app_fail("%s must be from 1 to %d (got %u)", opt, MAX_STAGES, *n), -1;
    return 0;
}

app_opt_group app_pipeline_group(app_pipeline_options *po) {
    static app_opt opts[14];
    app_opt list[] = {
        {0, "config", NULL, "FILE", "run over the stages of a deployment file (YAML; see README.md)", APP_OPT_STRING,
         &po->config},
        {0, "launch", NULL, NULL, "with --config: start the file's local stages as child processes", APP_OPT_FLAG,
         &po->launch},
        {0, "stages", NULL, "N", "split the model over N stage processes launched on loopback ports", APP_OPT_CUSTOM,
         &po->stages, .parse = parse_stages},
        {0, "transport", NULL, "NAME", "transport plugin between driver and stages (tcp, grpc, mpi; default tcp)",
         APP_OPT_STRING, &po->transport},
        {0, "timeout", NULL, "MS", "how long to wait for a stage's control answers (default 5000)", APP_OPT_U32,
         &po->timeout_ms, .min = 1},
        {0, "connect-timeout", NULL, "MS", "how long to wait for the stages to accept connections (default 10000)",
         APP_OPT_U32, &po->connect_timeout_ms, .min = 1},
        {0, "compute-timeout", NULL, "MS", "extra wait per position a stage computes (default 100)", APP_OPT_U32,
         &po->per_position_ms, .min = 1},
        {0, "recovery-timeout", NULL, "MS",
         "how long to spend replacing a lost stage and replaying into it (default 30000)", APP_OPT_U32,
         &po->recovery_timeout_ms, .min = 1},
        {0, "no-recovery", NULL, NULL, "end the command when a stage is lost instead of replacing it", APP_OPT_FLAG,
         &po->no_recovery},
        {0, "auth-token-file", NULL, "FILE",
         "prove to the stages that this driver holds the shared token read from\n"
         "FILE's first line (kept out of ps; default: the file's auth: token_file)",
         APP_OPT_STRING, &po->auth_token_file},
        {0, "tls-ca", NULL, "FILE",
         "run TLS to the stages, whose certificates must chain to this authority\n"
         "(PEM; with --tls-cert and --tls-key; default: the file's tls: ca)",
         APP_OPT_STRING, &po->tls_ca},
        {0, "tls-cert", NULL, "FILE", "the certificate (PEM) this driver shows the stages (default: the file's)",
         APP_OPT_STRING, &po->tls_cert},
        {0, "tls-key", NULL, "FILE", "the private key (PEM) of --tls-cert (default: the file's)", APP_OPT_STRING,
         &po->tls_key},
        {0, "tls-name", NULL, "NAME",
         "the name the stages' certificates must carry, if not the host of their\n"
         "address (default: the file's tls: name)",
         APP_OPT_STRING, &po->tls_name},
    };
    memcpy(opts, list, sizeof opts);
    return APP_OPT_GROUP("pipeline options (run the model over stage processes):", opts);
}

int app_pipeline_wanted(const app_pipeline_options *po) {
    return po->config || po->stages || po->launch || po->transport || po->timeout_ms || po->connect_timeout_ms ||
           po->per_position_ms || po->recovery_timeout_ms || po->no_recovery || po->auth_token_file || po->tls_ca ||
           po->tls_cert || po->tls_key || po->tls_name;
}

// ---- child processes ----

static int elapsed_ms(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int)((t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000);
}

static void stop_children(app_pipeline *p) {
    for (uint32_t i = 0; i < p->n_pids; i++)
        if (p->pids[i] > 0)
            kill(p->pids[i], SIGTERM);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int alive = 0;
        for (uint32_t i = 0; i < p->n_pids; i++) {
            if (p->pids[i] <= 0)
                continue;
            pid_t r = waitpid(p->pids[i], NULL, WNOHANG);
            if (r == p->pids[i] || (r < 0 && errno == ECHILD))
                p->pids[i] = 0;
            else
                alive++;
        }
        if (!alive)
            break;
        if (elapsed_ms(&t0) > STOP_GRACE_MS) {
            for (uint32_t i = 0; i < p->n_pids; i++)
                if (p->pids[i] > 0) {
                    fprintf(stderr, "rlx: stage process %d did not stop on SIGTERM; killing it\n", (int)p->pids[i]);
                    kill(p->pids[i], SIGKILL);
                    waitpid(p->pids[i], NULL, 0);
                    p->pids[i] = 0;
                }
            break;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    p->n_pids = 0;
}

/* Starts `rlx ... stage ARGS --ready-fd 3` as child `child` (its entry in pids); *ready_fd is the
 * read end of its readiness pipe. */
static int spawn_stage(app_pipeline *p, uint32_t child, char **args, int *ready_fd) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return app_fail("cannot create a pipe: %s", strerror(errno));
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return app_fail("cannot start a stage process: %s", strerror(errno));
    }
    if (pid == 0) {
        /* the stage must not outlive the driver that launched it */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        if (fds[1] == 3)
            fcntl(3, F_SETFD, 0);
        else if (dup2(fds[1], 3) < 0)
            _exit(127);
        signal(SIGPIPE, SIG_DFL);
        execv("/proc/self/exe", args);
        fprintf(stderr, "rlx: cannot run /proc/self/exe stage: %s\n", strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    p->pids[child] = pid;
    *ready_fd = fds[0];
    return 0;
}

/* Waits up to limit_ms for the stage's "address\n" line (copied to addr) or its exit. */
static int wait_ready(app_pipeline *p, uint32_t child, uint32_t stage, int fd, char *addr, size_t size, int limit_ms) {
    size_t len = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (len + 1 < size) {
        int left = limit_ms - elapsed_ms(&t0);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = left > 0 ? poll(&pfd, 1, left) : 0;
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            return app_fail("stage %u (pid %d) did not start listening within %.1f s", stage, (int)p->pids[child],
                            limit_ms / 1000.0);
        ssize_t got = read(fd, addr + len, size - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int st = 0;
            pid_t pid = p->pids[child];
            if (waitpid(pid, &st, 0) == pid)
                p->pids[child] = 0;
            if (WIFEXITED(st))
                return app_fail("stage %u (pid %d) exited with status %d before listening (its error is above)", stage,
                                (int)pid, WEXITSTATUS(st));
            return app_fail("stage %u (pid %d) died of signal %d before listening", stage, (int)pid,
                            WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        }
        len += (size_t)got;
        addr[len] = '\0';
        char *nl = strchr(addr, '\n');
        if (nl) {
            *nl = '\0';
            return 0;
        }
    }
    return app_fail("stage %u reported an address that is too long", stage);
}

/* Loopback and this-host names: the stages --launch starts itself. */
static int is_local(const char *address) {
    return strncmp(address, "127.", 4) == 0 || strncmp(address, "localhost:", 10) == 0 ||
           strncmp(address, "[::1]:", 6) == 0 || strncmp(address, "0.0.0.0:", 8) == 0;
}

typedef struct argv_builder {
    char *v[48];
    int n;
    char buf[8][32];
    int nbuf;
} argv_builder;

static void arg(argv_builder *b, const char *s) { b->v[b->n++] = (char *)s; }

static void arg_u32(argv_builder *b, const char *opt, uint32_t value) {
    arg(b, opt);
    snprintf(b->buf[b->nbuf], sizeof b->buf[0], "%u", value);
    arg(b, b->buf[b->nbuf++]);
}

/* The options a launched stage inherits from this command line; threads is its share of the
 * cores, 0 to leave the count to the stage (its deployment file entry says it). */
static void common_args(argv_builder *b, const app_options *o, const char *transport, const app_pipeline_options *po,
                        uint32_t threads) {
    arg(b, "rlx");
    if (o->plugin_dir) {
        arg(b, "--plugin-dir");
        arg(b, o->plugin_dir);
    }
    arg(b, "stage");
    if (o->plugin) {
        arg(b, "--plugin");
        arg(b, o->plugin);
    }
    if (o->backend_opts) {
        arg(b, "--backend-opts");
        arg(b, o->backend_opts);
    }
    if (o->place) {
        arg(b, "--place");
        arg(b, o->place);
    }
    if (o->quant) {
        arg(b, "--quant");
        arg(b, o->quant);
    }
    /* the stages hold the cache, in the driver's type */
    arg(b, "--cache-type-k");
    arg(b, rlx_dtype_name((int)o->cache_type_k));
    arg(b, "--cache-type-v");
    arg(b, rlx_dtype_name((int)o->cache_type_v));
    if (o->check_finite) /* the stages compute */
        arg(b, "--check-finite");
    if (threads)
        arg_u32(b, "--threads", threads);
    if (o->verbose)
        arg(b, "-v");
    if (transport) {
        arg(b, "--transport");
        arg(b, transport);
    }
    if (po->timeout_ms)
        arg_u32(b, "--timeout", po->timeout_ms);
    /* the stages require what the driver shows (--tls-name is only the driver's check of them);
     * never --insecure-listen: --stages binds loopback, and a file's stage that binds beyond it
     * needs credentials as it would started by hand */
    const char *const security[][2] = {{"--auth-token-file", po->auth_token_file},
                                       {"--tls-ca", po->tls_ca},
                                       {"--tls-cert", po->tls_cert},
                                       {"--tls-key", po->tls_key}};
    for (size_t i = 0; i < sizeof security / sizeof security[0]; i++)
        if (security[i][1]) {
            arg(b, security[i][0]);
            arg(b, security[i][1]);
        }
}

// ---- launchers ----

/* The rank and size a launcher gave this process: Open MPI's mpirun, MPICH's (PMI) or a Slurm
 * job step's srun (not a batch script, whose SLURM_PROCID is set too). The launcher's name, or
 * NULL when the process was not started by one. */
static const char *launcher_rank(int *rank, int *size) {
    static const struct {
        const char *name, *rank, *size;
    } known[] = {
        {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"the MPI launcher", "PMI_RANK", "PMI_SIZE"},
        {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const char *r = getenv(known[i].rank), *n = getenv(known[i].size);
        char *end_r, *end_n;
        if (!r || !n)
            continue;
        long rv = strtol(r, &end_r, 10), nv = strtol(n, &end_n, 10);
        if (*r && *n && !*end_r && !*end_n && nv >= 1 && rv >= 0 && rv < nv && nv <= INT32_MAX) {
            *rank = (int)rv;
            *size = (int)nv;
            return known[i].name;
        }
    }
    return NULL;
}

int app_pipeline_stage_rank(const app_pipeline_options *po) {
    int rank, size;
    return po->config && launcher_rank(&rank, &size) && rank > 0;
}

/* Checks a deployment run under a launcher (every rank reaches the same verdict) and records
 * this process's rank. */
static int check_launched(app_pipeline *p, const app_pipeline_options *po) {
    int rank, size;
    const char *launcher = launcher_rank(&rank, &size);
    if (!launcher || !po->config)
        return 0;
    uint32_t n = rlx_deploy_n_stages(p->deploy);
    if ((uint32_t)size != n + 1)
        return app_fail("%s: %s started %d process%s; the file's %u stage%s need %u (rank 0 drives, rank k runs "
                        "stage k-1): start it with -n %u",
                        po->config, launcher, size, size == 1 ? "" : "es", n, n == 1 ? "" : "s", n + 1, n + 1);
    if (po->launch)
        return app_fail("%s starts the stages itself: drop --launch", launcher);
    const char *transport = po->transport ? po->transport : rlx_deploy_transport(p->deploy);
    for (uint32_t i = 0; strcasecmp(transport, "mpi") == 0 && i < n; i++) {
        char want[32];
        const rlx_deploy_stage *ds = rlx_deploy_stage_at(p->deploy, i);
        snprintf(want, sizeof want, "rank:%u", i + 1);
        if (strcasecmp(ds->address, want) != 0)
            return app_fail("%s:%u: stage %u has address %s, but under %s it runs as rank %u: write %s", po->config,
                            ds->line, i, ds->address, launcher, i + 1, want);
    }
    p->rank = rank;
    return 0;
}

/* On rank k >= 1 of a launched deployment: becomes `rlx stage` for stage k-1 of the file, with
 * the options a stage the driver launched would inherit. Returns only on failure (1). */
static int exec_stage_rank(const app_pipeline *p, const app_options *o, const app_pipeline_options *po) {
    argv_builder b = {.n = 0};
    char index_text[16];
    snprintf(index_text, sizeof index_text, "%d", p->rank - 1);
    common_args(&b, o, po->transport, po, o->threads);
    arg(&b, "--config");
    arg(&b, po->config);
    arg(&b, "--stage");
    arg(&b, index_text);
    arg(&b, "--once");
    if (o->model) {
        arg(&b, "--model");
        arg(&b, o->model);
    }
    b.v[b.n] = NULL;
    fflush(NULL);
    execv("/proc/self/exe", b.v);
    return app_fail("rank %d: cannot run /proc/self/exe stage: %s", p->rank, strerror(errno));
}

// ---- restarting a lost stage ----

/* Keeps a copy of launched stage i's command line, to start it again. */
static int keep_args(app_pipeline *p, uint32_t i, const argv_builder *b) {
    char **copy = calloc((size_t)b->n + 1, sizeof *copy);
    for (int k = 0; copy && k < b->n; k++)
        if (!(copy[k] = strdup(b->v[k]))) {
            for (int j = 0; j < k; j++)
                free(copy[j]);
            free(copy);
            copy = NULL;
        }
    if (!copy)
        return app_fail("out of memory");
    p->launch_args[i] = copy;
    return 0;
}

/* rlx_driver_restart_fn for the stages this command launched: ends the lost process (it may be
 * stopped rather than dead) and starts it again with the same command line. Stages it did not
 * launch are left to the driver's other ways (RLX_E_UNSUPPORTED). Runs on a driver thread while
 * the main thread waits for the driver, so the children are not touched elsewhere meanwhile. */
static rlx_status restart_stage(void *ctx, uint32_t stage, char *address, size_t size, uint32_t timeout_ms) {
    app_pipeline *p = ctx;
    if (stage >= MAX_STAGES || !p->launch_args[stage] || p->child[stage] < 0)
        return rlx_error(RLX_E_UNSUPPORTED, "stage %u was not launched by this command", stage);
    const int c = p->child[stage];
    if (p->pids[c] > 0) {
        kill(p->pids[c], SIGKILL);
        waitpid(p->pids[c], NULL, 0);
        p->pids[c] = 0;
    }
    int fd = -1;
    int failed = spawn_stage(p, (uint32_t)c, p->launch_args[stage], &fd); /* in the old one's entry */
    if (!failed) {
        failed = wait_ready(p, (uint32_t)c, stage, fd, p->addresses[stage], sizeof p->addresses[stage],
                            timeout_ms < LAUNCH_TIMEOUT_MS ? (int)timeout_ms : LAUNCH_TIMEOUT_MS);
        close(fd);
    }
    if (failed)
        return rlx_error(RLX_E_PEER, "stage %u could not be restarted (the reason is above)", stage);
    snprintf(address, size, "%s", p->addresses[stage]);
    fprintf(stderr, "rlx: restarted stage %u (pid %d) on %s\n", stage, (int)p->pids[c], address);
    return RLX_OK;
}

// ---- open and close ----

int app_pipeline_load(app_pipeline **out, const app_pipeline_options *po) {
    *out = NULL;
    if (po->config && po->stages)
        return app_fail("give --config or --stages, not both");
    if (po->launch && !po->config)
        return app_fail("--launch starts the stages of a --config file (--stages N launches its own)");
    if (!po->config && !po->stages)
        return app_fail("--transport, the timeouts, the credentials (--auth-token-file, --tls-*) and --no-recovery "
                        "apply to pipelines: add --config FILE or --stages N");
    if (po->recovery_timeout_ms && po->no_recovery)
        return app_fail("--recovery-timeout bounds the recovery --no-recovery turns off: give one of them");
    if (po->stages && po->transport && strcasecmp(po->transport, "mpi") == 0)
        return app_fail("--stages starts its own stage processes, which share no MPI job: with --transport mpi, "
                        "start the driver and the stages with mpirun -n N+1 ... --config FILE");
    app_pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return app_fail("out of memory");
    for (uint32_t i = 0; i < MAX_STAGES; i++)
        p->child[i] = -1;
    if (po->config && rlx_deploy_open(po->config, &p->deploy) != RLX_OK)
        return app_fail_rlx("pipeline"), app_pipeline_close(p), 1;
    if (check_launched(p, po))
        return app_pipeline_close(p), 1;
    *out = p;
    return 0;
}

/* The threads of each local process when n_local of them (launched stages, and the driver if it
 * computes too) share this machine: the usable cores divided evenly, at least 1 each. */
static uint32_t core_share(uint32_t n_local) {
    uint32_t cores = app_usable_cores();
    return n_local && cores > n_local ? cores / n_local : 1;
}

int app_pipeline_launch(app_pipeline *p, app_options *o, const app_pipeline_options *po, int driver_computes,
                        rlx_runtime_options *ro, uint32_t *threads_share) {
    if (p->rank > 0)
        return exec_stage_rank(p, o, po);
    const char *model = o->model, *transport = po->transport;
    uint32_t n = po->stages;
    if (p->deploy) {
        if (!model)
            model = rlx_deploy_model(p->deploy);
        if (!transport)
            transport = rlx_deploy_transport(p->deploy);
        n = rlx_deploy_n_stages(p->deploy);
        if (n > MAX_STAGES)
            return app_fail("%s: at most %d stages", po->config, MAX_STAGES);
    }
    if (!model) {
        if (p->deploy)
            return app_fail("%s names no model and no --model was given", po->config);
        if (app_resolve_model(o))
            return 1;
        model = o->model;
    }
    if (!transport)
        transport = "tcp";
    if (!(p->model_dir = strdup(model)))
        return app_fail("out of memory");
    /* the layer ranges are checked before any stage is started; the tokenizer and the sampling
     * defaults come from the same model later, a GGUF header parsed once for all three */
    if (rlx_model_open(p->model_dir, &p->model) != RLX_OK)
        return app_fail_rlx("cannot open model");
    rlx_layer_range ranges[MAX_STAGES];
    rlx_status rc = p->deploy ? rlx_deploy_driver_stages(p->deploy, rlx_model_config_of(p->model), p->stages)
                              : rlx_dist_split_balanced(rlx_model_config_of(p->model), n, ranges);
    if (rc != RLX_OK)
        return app_fail_rlx("pipeline");
    int ready[MAX_STAGES];
    for (uint32_t i = 0; i < n; i++) {
        ready[i] = -1;
        if (!p->deploy)
            p->stages[i] = (rlx_driver_stage){.layers = ranges[i]};
    }
    uint32_t n_local = 0;
    for (uint32_t i = 0; i < n; i++)
        n_local += !p->deploy || (po->launch && is_local(p->stages[i].address));
    uint32_t share = n_local ? core_share(n_local + (driver_computes ? 1 : 0)) : 0;
    *threads_share = driver_computes ? share : 0;
    int failed = 0;
    for (uint32_t i = 0; i < n && !failed; i++) {
        if (p->deploy && (!po->launch || !is_local(p->stages[i].address)))
            continue;
        /* --threads, then the stage's threads setting, win over the share */
        uint32_t threads = o->threads                                                ? o->threads
                           : p->deploy && rlx_deploy_stage_at(p->deploy, i)->threads ? 0
                                                                                     : share;
        argv_builder b = {.n = 0};
        char range_text[32], index_text[16];
        common_args(&b, o, po->transport || !p->deploy ? transport : NULL, po, threads);
        arg(&b, "--ready-fd");
        arg(&b, "3");
        if (p->deploy) {
            snprintf(index_text, sizeof index_text, "%u", i);
            arg(&b, "--config");
            arg(&b, po->config);
            arg(&b, "--stage");
            arg(&b, index_text);
        } else {
            snprintf(range_text, sizeof range_text, "%u-%u", ranges[i].start, ranges[i].end - 1);
            arg(&b, "--listen");
            arg(&b, "127.0.0.1:0");
            arg(&b, "--layers");
            arg(&b, range_text);
        }
        if (o->model || !p->deploy) {
            arg(&b, "--model");
            arg(&b, p->model_dir);
        }
        b.v[b.n] = NULL;
        p->child[i] = (int)p->n_pids++;
        failed = spawn_stage(p, (uint32_t)p->child[i], b.v, &ready[i]) || keep_args(p, i, &b);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (ready[i] < 0)
            continue;
        if (!failed) {
            if (wait_ready(p, (uint32_t)p->child[i], i, ready[i], p->addresses[i], sizeof p->addresses[i],
                           LAUNCH_TIMEOUT_MS))
                failed = 1;
            else if (!p->deploy)
                p->stages[i].address = p->addresses[i];
        }
        close(ready[i]);
    }
    if (failed)
        return 1;
    ro->model_dir = p->model_dir;
    ro->deploy = p->deploy;
    ro->stages = p->stages;
    ro->n_stages = n;
    ro->transport = transport;
    ro->connect_timeout_ms = po->connect_timeout_ms;
    ro->timeout_ms = po->timeout_ms;
    ro->compute_ms_per_position = po->per_position_ms;
    ro->security = (rlx_dist_security){.tls_ca = po->tls_ca,
                                       .tls_cert = po->tls_cert,
                                       .tls_key = po->tls_key,
                                       .tls_name = po->tls_name,
                                       .auth_token_file = po->auth_token_file};
    ro->stage_restart = restart_stage;
    ro->stage_restart_ctx = p;
    return 0;
}

void app_pipeline_close(app_pipeline *p) {
    if (!p)
        return;
    stop_children(p);
    for (uint32_t i = 0; i < MAX_STAGES; i++) {
        for (char **a = p->launch_args[i]; a && *a; a++)
            free(*a);
        free(p->launch_args[i]);
    }
    rlx_deploy_close(p->deploy);
    rlx_model_close(p->model);
    free(p->model_dir);
    free(p);
}

const rlx_deploy *app_pipeline_deploy(const app_pipeline *p) { return p ? p->deploy : NULL; }
const rlx_model *app_pipeline_model(const app_pipeline *p) { return p ? p->model : NULL; }

void app_pipeline_describe(const rlx_runtime *rt) {
    const rlx_driver *d = rt ? rlx_runtime_driver(rt) : NULL;
    if (!d)
        return;
    for (uint32_t i = 0; i < rlx_driver_n_stages(d); i++) {
        rlx_driver_stage_info info;
        if (rlx_driver_stage_info_of(d, i, &info) == RLX_OK)
            fprintf(stderr, "rlx: stage %u at %s: layers %u-%u on %s, %.1f MiB resident, %u positions\n", i,
                    info.address, info.layers.start, info.layers.end - 1, info.backend,
                    (double)info.rss_bytes / 1048576.0, info.kv_capacity);
    }
}
