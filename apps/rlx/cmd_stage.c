/* rlx stage: serves one layer range of a model to pipeline drivers until SIGINT or SIGTERM. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"
#include "rlx/deploy.h"
#include "rlx/dist.h"

static const char usage[] =
    "usage: rlx stage --config FILE --stage I [--standby K] [options]\n"
    "       rlx stage --listen HOST:PORT --model PATH --layers A-B [--plugin P] [--transport T] [options]\n\n"
    "Runs layers A-B (inclusive) of the model for pipeline drivers (rlx generate --config ...) and\n"
    "keeps their KV caches, until interrupted (SIGINT/SIGTERM: a clean exit with status 0). The\n"
    "stage that holds layer 0 embeds token ids; the one holding the last layer computes logits.\n"
    "With --config, the stage's address, backend, backend options, threads and layers come from\n"
    "the deployment file; options given here override them. --standby K instead listens on the\n"
    "stage's standby address K (0 = first), a stand-by stage the driver falls back on when the\n"
    "stage is lost. --place pins ops of the stage's block to other backends, as for a model run in\n"
    "one process. Without credentials (--auth-token-file, --tls-*, or the file's auth: and tls:)\n"
    "a stage listens on loopback only, unless --insecure-listen.\n\n";

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

typedef struct stage_log {
    char label[300];
    int verbose;
} stage_log;

static void print_log(void *ctx, int level, const char *message) {
    const stage_log *l = ctx;
    if (level <= RLX_LOG_WARN || l->verbose)
        fprintf(stderr, "rlx stage %s: %s\n", l->label, message);
}

/* What the start line says, and where the log's label is relabelled with the bound address. */
typedef struct stage_start {
    stage_log *log;
    int *ready_fd;
    uint32_t index, standby;
    int has_index, has_standby;
    const char *transport;
    rlx_layer_range layers;
    const rlx_dist_security *security;
} stage_start;

static void label_stage(stage_log *log, const stage_start *s, const char *address) {
    if (s->has_standby)
        snprintf(log->label, sizeof log->label, "%u standby %u (%s)", s->index, s->standby, address);
    else if (s->has_index)
        snprintf(log->label, sizeof log->label, "%u (%s)", s->index, address);
    else
        snprintf(log->label, sizeof log->label, "%s", address);
}

/* Once listening (no connection thread logs yet): one line on stderr with the address the kernel
 * bound (port 0 asked: the port it chose) and who may connect, unless a launcher reads the address
 * from --ready-fd (its driver prints the stages it reached); then the --ready-fd line. */
static void report_ready(void *ctx, const char *address) {
    const stage_start *s = ctx;
    label_stage(s->log, s, address);
    int fd = *s->ready_fd;
    if (fd < 0 || s->log->verbose)
        fprintf(stderr, "rlx stage %s: listening (%s, layers %u-%u); %s\n", s->log->label, s->transport,
                s->layers.start, s->layers.end - 1, rlx_dist_security_mode(s->security, address, s->transport));
    if (fd < 0)
        return;
    char line[300];
    int len = snprintf(line, sizeof line, "%s\n", address);
    if (len > 0 && len < (int)sizeof line && write(fd, line, (size_t)len) != len)
        fprintf(stderr, "rlx stage: cannot report readiness on descriptor %d: %s\n", fd, strerror(errno));
    close(fd);
    *s->ready_fd = -1;
}

typedef struct stage_args {
    const char *config, *listen, *layers, *transport;
    uint32_t index, standby, timeout_ms;
    int has_index, has_standby, first, last, ready_fd, no_prefetch, once;
    rlx_dist_security security; /* the command line's; the file's fill what it leaves out */
    uint32_t idle_timeout_ms, max_connections, max_sessions;
    uint64_t max_positions;
} stage_args;

static int parse_ready_fd(const char *opt, const char *value, void *target) {
    uint32_t fd;
    if (app_parse_u32(opt, value, &fd) < 0)
        return -1;
    if (fd > 1024)
        return app_fail("%s: %u is not a descriptor", opt, fd), -1;
    *(int *)target = (int)fd;
    return 0;
}

static int parse_args(stage_args *a, app_options *o, int argc, char **argv) {
    const app_opt own[] = {
        {0, "config", NULL, "FILE", "deployment file (YAML)", APP_OPT_STRING, &a->config},
        {0, "stage", NULL, "I", "which stage of the file to run (0 = first)", APP_OPT_U32, &a->index, &a->has_index},
        {0, "standby", NULL, "K", "with --config and --stage: serve that stage at its standby address K (0 = first)",
         APP_OPT_U32, &a->standby, &a->has_standby},
        {0, "listen", NULL, "ADDR", "address to listen on (port 0 picks a free one; it is logged)", APP_OPT_STRING,
         &a->listen},
        {0, "layers", NULL, "A-B", "the layer range, inclusive", APP_OPT_STRING, &a->layers},
        {0, "transport", NULL, "NAME", "transport plugin (tcp, grpc, mpi; default tcp or the file's)", APP_OPT_STRING,
         &a->transport},
        {0, "first", NULL, NULL, "assert that the range starts at layer 0", APP_OPT_FLAG, &a->first},
        {0, "last", NULL, NULL, "assert that the range ends at the model's last layer", APP_OPT_FLAG, &a->last},
        {0, "timeout", NULL, "MS", "bound on sending an answer and on waiting for a handshake (default 5000)",
         APP_OPT_U32, &a->timeout_ms, .min = 1},
        {0, "no-prefetch", NULL, NULL, "do not read the stage's weights in before listening", APP_OPT_FLAG,
         &a->no_prefetch},
        {0, "ready-fd", NULL, "N",
         "write the bound address and a newline to descriptor N once listening\n"
         "(a launcher's way; the start line on stderr is then left out unless -v)",
         APP_OPT_CUSTOM, &a->ready_fd, .parse = parse_ready_fd},
        {0, "once", NULL, NULL, "exit after serving one driver (what a stage mpirun or srun started does)",
         APP_OPT_FLAG, &a->once},
        {'v', "verbose", NULL, NULL, "log connections and sessions, not only problems", APP_OPT_FLAG, &o->verbose},
        {0, "auth-token-file", NULL, "FILE",
         "serve only drivers that prove they hold the shared token read from\n"
         "FILE's first line (kept out of ps; default: the file's auth: token_file)",
         APP_OPT_STRING, &a->security.auth_token_file},
        {0, "tls-ca", NULL, "FILE",
         "run TLS, serving only drivers whose certificates chain to this\n"
         "authority (PEM; with --tls-cert and --tls-key; default: the file's)",
         APP_OPT_STRING, &a->security.tls_ca},
        {0, "tls-cert", NULL, "FILE",
         "the certificate (PEM) this stage shows drivers (default: its entry's\n"
         "tls: cert, else the file's)",
         APP_OPT_STRING, &a->security.tls_cert},
        {0, "tls-key", NULL, "FILE", "the private key (PEM) of --tls-cert (default: as --tls-cert)", APP_OPT_STRING,
         &a->security.tls_key},
        {0, "insecure-listen", NULL, NULL,
         "listen beyond loopback with no credentials: anyone who reaches the\n"
         "address may run the model and fill its memory",
         APP_OPT_FLAG, &a->security.insecure_listen},
        {0, "idle-timeout", NULL, "MS",
         "close a driver connection that sent nothing for this long (default\n"
         "120000, or the file's timeouts: idle_ms)",
         APP_OPT_U32, &a->idle_timeout_ms, .min = 1},
        {0, "max-connections", NULL, "N",
         "driver connections served at once (default 16, or the file's limits:\n"
         "connections)",
         APP_OPT_U32, &a->max_connections, .min = 1},
        {0, "max-sessions", NULL, "N",
         "sessions held at once, all connections together (default 64, or the\n"
         "file's limits: sessions)",
         APP_OPT_U32, &a->max_sessions, .min = 1},
        {0, "max-positions", NULL, "N",
         "KV positions granted at once, all sessions together (default: what\n"
         "half the memory holds for the stage's layers, or the file's limits:\n"
         "positions)",
         APP_OPT_U64, &a->max_positions, .min = 1},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("stage:", own), app_common_group(o)};
    int exit_status;
    if (app_parse_command("stage", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status ? 1 : 2;
    /* options given before the command land in the pipeline options */
    if (!a->config)
        a->config = o->pipeline.config;
    if (!a->transport)
        a->transport = o->pipeline.transport;
    if (!a->timeout_ms)
        a->timeout_ms = o->pipeline.timeout_ms;
    rlx_dist_security *sec = &a->security;
    if (!sec->auth_token_file)
        sec->auth_token_file = o->pipeline.auth_token_file;
    if (!sec->tls_ca)
        sec->tls_ca = o->pipeline.tls_ca;
    if (!sec->tls_cert)
        sec->tls_cert = o->pipeline.tls_cert;
    if (!sec->tls_key)
        sec->tls_key = o->pipeline.tls_key;
    if (o->pipeline.stages || o->pipeline.launch || o->pipeline.recovery_timeout_ms || o->pipeline.no_recovery ||
        o->pipeline.tls_name)
        return app_fail("stage: --stages, --launch, --recovery-timeout, --no-recovery and --tls-name are for drivers "
                        "(rlx generate ...), not for a stage");
    if (a->has_standby && (!a->config || !a->has_index))
        return app_fail("stage: --standby K needs --config FILE --stage I (it serves stage I's layers at the K-th "
                        "address of its standby list)");
    if (a->config && !a->has_index)
        return app_fail("stage: --config needs --stage I (which stage of the file to run)");
    if (!a->config && (a->has_index || !a->listen || !a->layers))
        return app_fail("stage: give --config FILE --stage I, or --listen ADDR --layers A-B (see rlx stage --help)");
    return 0;
}

/* The credentials of stage `index` of the file (its own certificate, else the file's) where the
 * command line gave none. */
static void file_security(rlx_dist_security *s, const rlx_deploy *dep, uint32_t index) {
    rlx_dist_security file;
    if (rlx_deploy_security(dep, (int)index, &file) != RLX_OK) /* index was checked against the file */
        return;
    const char **mine[] = {&s->tls_ca, &s->tls_cert, &s->tls_key, &s->auth_token_file};
    const char *const theirs[] = {file.tls_ca, file.tls_cert, file.tls_key, file.auth_token_file};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++)
        if (!*mine[i])
            *mine[i] = theirs[i];
}

int cmd_stage(int argc, char **argv, app_options *o) {
    stage_args a = {.ready_fd = -1};
    int status = parse_args(&a, o, argc, argv);
    if (status)
        return status == 2 ? 0 : status;
    rlx_deploy *dep = NULL;
    rlx_runtime *rt = NULL;
    const char *backend_name = o->plugin, *backend_opts = o->backend_opts, *listen = a.listen, *transport = a.transport;
    uint32_t threads = o->threads;
    stage_log log = {.verbose = o->verbose};
    rlx_layer_range range = {0, 0};
    const rlx_deploy_stage *ds = NULL;
    if (a.config) {
        if (rlx_deploy_open(a.config, &dep) != RLX_OK)
            return app_fail_rlx("stage");
        if (a.index >= rlx_deploy_n_stages(dep)) {
            status = app_fail("stage: %s has %u stages; --stage %u is not one of them (0-%u)", a.config,
                              rlx_deploy_n_stages(dep), a.index, rlx_deploy_n_stages(dep) - 1);
            goto done;
        }
        ds = rlx_deploy_stage_at(dep, a.index);
        if (!o->model)
            o->model = rlx_deploy_model(dep);
        if (!o->model) {
            status = app_fail("stage: %s names no model and no --model was given", a.config);
            goto done;
        }
        if (a.has_standby && a.standby >= ds->n_standby) {
            if (ds->n_standby)
                status = app_fail("stage: %s:%u: stage %u has %u standby address%s; --standby %u is not one of them "
                                  "(0-%u)",
                                  a.config, ds->line, a.index, ds->n_standby, ds->n_standby == 1 ? "" : "es", a.standby,
                                  ds->n_standby - 1);
            else
                status = app_fail("stage: %s:%u: stage %u has no standby addresses (list them under its 'standby' "
                                  "key); --standby %u needs one",
                                  a.config, ds->line, a.index, a.standby);
            goto done;
        }
        /* a standby binds the address the driver will try, as a stage without listen does;
         * --listen still wins, for a machine the driver knows by another name */
        if (!listen)
            listen = a.has_standby ? ds->standby[a.standby] : ds->listen ? ds->listen : ds->address;
        if (!backend_name)
            backend_name = ds->backend;
        if (!backend_opts)
            backend_opts = ds->backend_options;
        if (!threads)
            threads = ds->threads;
        if (!transport)
            transport = rlx_deploy_transport(dep);
        if (!a.timeout_ms)
            a.timeout_ms = rlx_deploy_timeouts_of(dep)->control_ms;
        if (!a.idle_timeout_ms)
            a.idle_timeout_ms = rlx_deploy_timeouts_of(dep)->idle_ms;
        const rlx_deploy_limits *limits = rlx_deploy_limits_of(dep);
        if (!a.max_connections)
            a.max_connections = limits->connections;
        if (!a.max_sessions)
            a.max_sessions = limits->sessions;
        if (!a.max_positions)
            a.max_positions = limits->positions;
        file_security(&a.security, dep, a.index);
    } else if (app_resolve_model(o)) {
        return 1;
    }
    if (rlx_deploy_check_address(listen, 1) != RLX_OK) {
        status = app_fail_rlx("stage: --listen");
        goto done;
    }
    stage_start start = {.log = &log,
                         .ready_fd = &a.ready_fd,
                         .index = a.index,
                         .standby = a.standby,
                         .has_index = a.config != NULL,
                         .has_standby = a.has_standby,
                         .security = &a.security};
    label_stage(&log, &start, listen);
    rlx_log_set_handler(print_log, &log); /* with -v, the runtime's line per backend it opens */
    rlx_runtime_options ro = rlx_runtime_options_default();
    const rlx_runtime_backend backend = {.name = backend_name ? backend_name : "cpu-blas", .options = backend_opts};
    ro.flags = RLX_RUNTIME_STAGE;
    ro.model_dir = o->model;
    ro.plugin_dir = o->plugin_dir;
    ro.backends = &backend;
    ro.n_backends = 1;
    ro.place = o->place;
    ro.n_threads = threads;
    ro.kv_capacity = o->ctx;
    ro.quant = o->quant;
    const int kv_dtype = app_kv_dtype(o);
    if (kv_dtype < 0) {
        status = 1;
        goto done;
    }
    ro.kv_dtype = (uint32_t)kv_dtype;
    ro.check_finite = (uint32_t)o->check_finite;
    if (rlx_runtime_open(&ro, &rt) != RLX_OK) {
        status = app_fail("stage: %s", rlx_last_error());
        goto done;
    }
    if (log.verbose && !rlx_runtime_main_backend(rt))
        fprintf(stderr, "rlx stage %s: backend ref: reference kernels\n", log.label);
    uint32_t n_layers = (uint32_t)rlx_runtime_config(rt)->num_hidden_layers;
    if (dep) {
        rlx_layer_range *ranges = calloc(rlx_deploy_n_stages(dep), sizeof *ranges);
        if (!ranges || rlx_deploy_layers(dep, rlx_runtime_config(rt), ranges) != RLX_OK) {
            status = ranges ? app_fail_rlx("stage") : app_fail("out of memory");
            free(ranges);
            goto done;
        }
        range = ranges[a.index];
        free(ranges);
        if (a.layers) {
            rlx_layer_range given;
            if (rlx_dist_parse_range(a.layers, &given) != RLX_OK) {
                status = app_fail_rlx("stage: --layers");
                goto done;
            }
            if (given.start != range.start || given.end != range.end) {
                status = app_fail("stage: --layers %s contradicts %s, which gives stage %u layers %u-%u", a.layers,
                                  a.config, a.index, range.start, range.end - 1);
                goto done;
            }
        }
    } else if (rlx_dist_parse_range(a.layers, &range) != RLX_OK) {
        status = app_fail_rlx("stage: --layers");
        goto done;
    }
    if (range.end > n_layers) {
        status = app_fail("stage: layers %u-%u run past the model's %u layers (0-%u)", range.start, range.end - 1,
                          n_layers, n_layers - 1);
        goto done;
    }
    if (a.first && range.start != 0) {
        status = app_fail("stage: --first, but layers %u-%u do not start at layer 0", range.start, range.end - 1);
        goto done;
    }
    if (a.last && range.end != n_layers) {
        status = app_fail("stage: --last, but layers %u-%u do not end at the model's last layer %u", range.start,
                          range.end - 1, n_layers - 1);
        goto done;
    }
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rlx_stage_options so = rlx_stage_options_default();
    so.address = listen;
    so.layers = range;
    so.prefetch = !a.no_prefetch;
    so.timeout_ms = a.timeout_ms;
    so.stop = &stop_requested;
    start.transport = transport ? transport : "tcp";
    start.layers = range;
    so.on_listening = report_ready;
    so.ctx = &start;
    so.max_drivers = a.once ? 1 : 0;
    so.idle_timeout_ms = a.idle_timeout_ms;
    so.max_connections = a.max_connections;
    so.max_sessions = a.max_sessions;
    so.max_positions = a.max_positions;
    so.security = a.security;
    if (rlx_runtime_serve_stage(rt, transport, &so) != RLX_OK)
        status = app_fail("stage: %s", rlx_last_error());
done:
    rlx_log_set_handler(NULL, NULL);
    if (a.ready_fd >= 0)
        close(a.ready_fd);
    rlx_runtime_close(rt);
    rlx_deploy_close(dep);
    return status;
}
