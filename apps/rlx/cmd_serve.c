/* rlx serve: the OpenAI-compatible HTTP server. Opens the model and its backends through the
 * runtime (without a session: the engine keeps its own KV cache for every slot) and creates the
 * batched engine over them; over a pipeline, the engine over the driver, whose stages keep the
 * slots; with a speculator, the engine over the runtime's lm (one slot); answers HTTP (serve/) until SIGTERM or SIGINT,
 * then stops accepting, drains the engine within --drain-timeout and exits 0.
 *
 * The HTTP daemon starts before the model is read, so /health says 503 while it loads, as
 * llama-server's does. SIGTERM and SIGINT write their number to a pipe that the main thread
 * reads; whichever thread the kernel picks runs only that write. Blocking them in every thread
 * for sigwait instead would leak the blocked mask into the stage processes a pipeline launches,
 * which could then not be stopped. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "serve/serve.h"

static const char usage[] =
    "usage: rlx serve [-m PATH] [--host ADDR] [--port N] [--parallel N] [-c N | --slot-ctx N]\n"
    "                 [--api-key KEY | --api-key-file FILE] [limits] [--config FILE | --spec NAME]\n"
    "                 [options]\n\n"
    "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (streamed as\n"
    "server-sent events with \"stream\": true), GET /v1/models, /health and /metrics (Prometheus);\n"
    "Anthropic's POST /v1/messages (and /v1/messages/count_tokens); llama-server's POST /completion,\n"
    "/tokenize, /detokenize, /apply-template and GET /props and /slots; with --embedding and\n"
    "--reranking, POST /v1/embeddings (and /embeddings) and /v1/rerank.\n"
    "Requests run together in --parallel slots of the batched engine; more wait in a queue of\n"
    "--queue requests, and beyond that get 503 with Retry-After. Sampling follows OpenAI's\n"
    "defaults (temperature 1, top_p 1), greedy at \"temperature\": 0; the sampling options below\n"
    "(--temp, --top-k, --seed, ...) set the defaults of requests that leave a field out, as\n"
    "llama-server's do. Its other common flags are taken where rlx does that anyway (--jinja,\n"
    "--metrics, -cb, ...) and refused by name where it does not. SIGTERM or SIGINT stops\n"
    "accepting, lets the requests running finish within --drain-timeout, and exits 0. Over a\n"
    "pipeline (--config, --stages) the stages keep the slots and compute groups of them at once;\n"
    "with --spec, requests take turns on one slot. An answer never depends on the requests beside\n"
    "it: cpu-blas runs in its batch_invariant=1 mode unless --backend-opts says\n"
    "batch_invariant=0 (faster F32/BF16 prefill, last bits may vary); stages that are not launched\n"
    "by this command need the same --backend-opts themselves.\n\n"
    "Without an API key the server listens on loopback only (unless --insecure-listen) and answers\n"
    "only requests whose Host is localhost, a loopback address or --host; a request whose Origin is\n"
    "not the server's own is refused unless --cors-origin allows it.\n\n";

/* The most --cors-origin options. */
#define MAX_CORS_ORIGINS 16

typedef struct serve_args {
    const char *host, *alias, *api_key, *api_key_file, *chat_template_file, *chat_template;
    uint32_t n_predict; /* --n-predict; APP_MAX_NEW_UNTIL_FULL for -1 */
    int n_predict_given;
    uint32_t port, parallel, total_ctx, slot_ctx, queue, max_tokens_limit, timeout_s, drain_s, max_connections;
    uint32_t request_timeout_s, max_connections_per_ip;
    uint64_t max_body;
    int total_ctx_given, parallel_given, api_key_given, insecure_listen, special_in_content;
    int reasoning_split; /* --reasoning-format: 1 auto/deepseek (the default), 0 none */
    int think;           /* --reasoning: 0 off, 1 on or auto (the default) */
    int no_slots;        /* --no-slots: GET /slots answers 501 (llama-server's default is to serve it) */
    int embedding, reranking;
    int pooling;        /* --pooling's serve_pooling, -1 when not given */
    int embd_normalize; /* --embd-normalize, 2 (Euclidean) by default */
    int no_webui;       /* --no-webui: no chat page at / */
    const char *cors_origins[MAX_CORS_ORIGINS];
    size_t n_cors_origins;
} serve_args;

/* Allows one more origin (or the word localhost) of option opt, up to MAX_CORS_ORIGINS. */
static int add_cors_origin(serve_args *a, const char *opt, const char *origin) {
    if (a->n_cors_origins == MAX_CORS_ORIGINS)
        return app_fail("serve: %s: at most %d origins (or '*' for any)", opt, MAX_CORS_ORIGINS), -1;
    a->cors_origins[a->n_cors_origins++] = origin;
    return 0;
}

/* --cors-origin: "*" or a scheme and authority, as a browser's Origin header says them. */
static int parse_cors_origin(const char *opt, const char *value, void *target) {
    serve_args *a = target;
    const char *authority = strncmp(value, "http://", 7) == 0    ? value + 7
                            : strncmp(value, "https://", 8) == 0 ? value + 8
                                                                 : NULL;
    if (strcmp(value, "*") != 0 && (!authority || !*authority || strchr(authority, '/')))
        return app_fail("serve: %s: '%s' is not an origin: give '*' or scheme://host[:port] with no path, as browsers "
                        "send it in Origin (e.g. http://localhost:3000)",
                        opt, value),
               -1;
    return add_cors_origin(a, opt, value);
}

/* --cors-origins A,B,..: llama-server's spelling, a comma-separated list of --cors-origin values
 * or the word localhost (any origin whose host is localhost, 127.0.0.1 or [::1]). The items are
 * cut in a copy that lives as long as the process, as argv does. */
static int parse_cors_origins(const char *opt, const char *value, void *target) {
    static char copies[4096];
    static size_t used;
    const size_t len = strlen(value);
    if (len >= sizeof copies - used)
        return app_fail("serve: %s: the lists are longer than %zu bytes", opt, sizeof copies - 1), -1;
    char *item = memcpy(copies + used, value, len + 1);
    used += len + 1;
    for (char *end; item; item = end) {
        if ((end = strchr(item, ',')))
            *end++ = '\0';
        item += strspn(item, " ");
        item[strcspn(item, " ")] = '\0';
        if ((strcmp(item, "localhost") == 0 ? add_cors_origin(target, opt, item)
                                            : parse_cors_origin(opt, item, target)) < 0)
            return -1;
    }
    return 0;
}

/* llama-server's flags for what rlx serve always does: taken, with a note when a script might
 * expect them to change something. */
static int parse_always(const char *opt, const char *value, void *target) {
    (void)value;
    const char *why = target;
    if (*why)
        fprintf(stderr, "rlx serve: note: %s has no effect: %s\n", opt, why);
    return 0;
}

/* --threads-http N: a number, which changes nothing (a thread per connection). */
static int parse_threads_http(const char *opt, const char *value, void *target) {
    uint32_t n;
    if (app_parse_u32(opt, value, &n) < 0)
        return -1;
    return parse_always(opt, value, target);
}

/* --slots and --no-slots, the last given winning as llama-server's. */
static int parse_slots(const char *opt, const char *value, void *target) {
    (void)opt, (void)value;
    *(int *)target = 0;
    return 0;
}

static int parse_no_slots(const char *opt, const char *value, void *target) {
    (void)opt, (void)value;
    *(int *)target = 1;
    return 0;
}

/* llama-server's flags for what rlx serve does not have: refused by name, saying what it does. */
static int parse_refused(const char *opt, const char *value, void *target) {
    (void)value;
    return app_fail("serve: %s: %s", opt, (const char *)target), -1;
}

/* --reasoning-format: where a thinking model's <think> block goes. llama-server's "auto" (its
 * default) and "deepseek" put it in reasoning_content, "none" leaves it in content;
 * "deepseek-legacy" (both at once) is not there. */
static int parse_reasoning_format(const char *opt, const char *value, void *target) {
    int *split = target;
    if (strcmp(value, "none") == 0 || strcmp(value, "auto") == 0 || strcmp(value, "deepseek") == 0) {
        *split = strcmp(value, "none") != 0;
        return 0;
    }
    if (strcmp(value, "deepseek-legacy") == 0)
        return app_fail("serve: %s %s: rlx serve puts the thinking either in reasoning_content (auto, deepseek) "
                        "or in content (none), not in both",
                        opt, value),
               -1;
    return app_fail("serve: %s: '%s' is not a reasoning format (llama-server's: none, auto, deepseek, "
                    "deepseek-legacy)",
                    opt, value),
           -1;
}

/* --reasoning on|off|auto (llama-server's -rea): whether a chat request that does not say
 * (chat_template_kwargs.enable_thinking) gets the template's thinking mode. auto leaves it to the
 * template, which is thinking where the template has a switch for it (Qwen3's). */
static int parse_reasoning(const char *opt, const char *value, void *target) {
    int *think = target;
    if (strcmp(value, "on") == 0 || strcmp(value, "auto") == 0 || strcmp(value, "off") == 0) {
        *think = strcmp(value, "off") != 0;
        return 0;
    }
    return app_fail("serve: %s: '%s' is not on, off or auto", opt, value), -1;
}

/* --chat-template TEXT: a Jinja template given inline. llama-server also takes the names of the
 * templates it carries in C++ (chatml, llama3, ...), which rlx does not have. */
static int parse_chat_template(const char *opt, const char *value, void *target) {
    if (!strstr(value, "{{") && !strstr(value, "{%"))
        return app_fail("serve: %s '%s': not a Jinja template; rlx has no built-in templates by name: give the "
                        "template's text, or its file with --chat-template-file",
                        opt, value),
               -1;
    *(const char **)target = value;
    return 0;
}

/* --pooling: llama-server's names; "rank" is its way of asking for reranking. */
static int parse_pooling(const char *opt, const char *value, void *target) {
    serve_args *a = target;
    if (strcmp(value, "rank") == 0) {
        a->reranking = 1;
        return 0;
    }
    if ((a->pooling = serve_pooling_parse(value)) < 0)
        return app_fail("serve: %s: '%s' is not a pooling (none, mean, cls, last, or rank for --reranking)", opt,
                        value),
               -1;
    return 0;
}

/* --embd-normalize N: llama-server's numbers (-1 none, 0 max-abs int16, 1 taxicab, 2 Euclidean,
 * p > 2 the p-norm), bounded as a request's embd_normalize is. */
static int parse_embd_normalize(const char *opt, const char *value, void *target) {
    char *end;
    errno = 0;
    const long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < -1 || v > SERVE_MAX_NORM_P)
        return app_fail("serve: %s '%s': want an integer from -1 to %d (-1 none, 0 max-abs int16, 1 taxicab, "
                        "2 Euclidean, p > 2 the p-norm)",
                        opt, value, SERVE_MAX_NORM_P),
               -1;
    *(int *)target = (int)v;
    return 0;
}

/* The session of --embedding and --reranking, on the engine's model and backends (its positions
 * a slot's), and the pooling: --pooling, else the model's sentence-transformers config, else the
 * last position's (a causal model's, as Qwen3-Embedding's). */
static int open_embedder(serve_server *s, const app_runtime *rt, const serve_args *a, const rlx_session_options *so) {
    if (!a->embedding && !a->reranking)
        return 0;
    if (!rt->model)
        return app_fail("serve: --embedding and --reranking run on a local model, not over a pipeline");
    char why[600];
    s->pooling = a->pooling;
    s->embd_normalize = a->embd_normalize;
    if (s->pooling < 0 && (s->pooling = serve_pooling_of_model(rt->model_dir, why, sizeof why)) == -2)
        return app_fail("serve: %s", why);
    if (s->pooling < 0)
        s->pooling = SERVE_POOL_LAST;
    if (serve_embedder_create(rt->model, so, s->tok, a->reranking, &s->embedder) != RLX_OK)
        return app_fail_rlx("serve: cannot open the session of --embedding/--reranking");
    s->embedding = a->embedding;
    s->reranking = a->reranking;
    if (a->embedding)
        fprintf(stderr, "rlx serve: embeddings pooled by %s (%s)\n", serve_pooling_name(s->pooling),
                a->pooling >= 0 ? "--pooling" : "the model's config, or last by default");
    return 0;
}

/* A request's max_tokens default for --n-predict N: N, or 0 (the end of the slot) for -1. */
static uint32_t max_tokens_default(uint32_t n_predict) { return n_predict == APP_MAX_NEW_UNTIL_FULL ? 0 : n_predict; }

/* The id /v1/models lists: --alias, else the model's file or directory name. */
static const char *model_id(const serve_args *a, const char *model, char *buf, size_t size) {
    if (a->alias)
        return a->alias;
    snprintf(buf, size, "%s", model ? model : "rlx");
    for (size_t n = strlen(buf); n > 1 && buf[n - 1] == '/'; n--)
        buf[n - 1] = '\0';
    const char *slash = strrchr(buf, '/');
    return slash && slash[1] ? slash + 1 : buf;
}

/* With a speculator (--spec, or the deployment file's) the engine runs the runtime's lm:
 * requests take turns on one slot. A deployment file's speculator is known only once the file
 * is read, so open_engine checks again. */
static int over_lm(const app_options *o, const app_spec_options *spec) {
    (void)o;
    return spec->name != NULL;
}

/* The bounds of serve's numbers, each named in its error: a value past them would wrap or
 * overflow where it is used (a connection limit plus the overflow, seconds into milliseconds). */
static const struct {
    const char *flag;
    size_t offset;
    uint32_t min, max;
} u32_ranges[] = {
    {"--port", offsetof(serve_args, port), 0, 65535},
    {"--parallel", offsetof(serve_args, parallel), 1, RLX_ENGINE_MAX_SLOTS},
    {"-c/--ctx-size", offsetof(serve_args, total_ctx), 0, 1u << 24},
    {"--slot-ctx", offsetof(serve_args, slot_ctx), 0, 1u << 24},
    {"--queue", offsetof(serve_args, queue), 0, 65536},
    {"--max-tokens-limit", offsetof(serve_args, max_tokens_limit), 0, 1u << 24},
    {"--timeout", offsetof(serve_args, timeout_s), 1, 86400},
    {"--request-timeout", offsetof(serve_args, request_timeout_s), 1, 86400},
    {"--drain-timeout", offsetof(serve_args, drain_s), 0, 86400},
    {"--max-connections", offsetof(serve_args, max_connections), 1, 65536},
    {"--max-connections-per-ip", offsetof(serve_args, max_connections_per_ip), 0, 65536},
};

/* The most bytes --max-body allows: a body is held whole in memory. */
#define MAX_BODY_LIMIT (1ull << 30)

static int check_ranges(const serve_args *a) {
    for (size_t i = 0; i < sizeof u32_ranges / sizeof u32_ranges[0]; i++) {
        const uint32_t v = *(const uint32_t *)((const char *)a + u32_ranges[i].offset);
        if (v < u32_ranges[i].min || v > u32_ranges[i].max)
            return app_fail("serve: %s %u is out of range (%u-%u)", u32_ranges[i].flag, v, u32_ranges[i].min,
                            u32_ranges[i].max);
    }
    if (a->max_body < 1 || a->max_body > MAX_BODY_LIMIT)
        return app_fail("serve: --max-body %llu is out of range (1-%llu)", (unsigned long long)a->max_body,
                        MAX_BODY_LIMIT);
    return 0;
}

/* Whether host is a loopback name or address: only this machine reaches it. */
static int loopback_host(const char *host) {
    struct in_addr v4;
    struct in6_addr v6;
    if (strcasecmp(host, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return ntohl(v4.s_addr) >> 24 == 127;
    return inet_pton(AF_INET6, host, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

/* A server without a key listens on loopback only unless told otherwise, as a stage does. */
static int check_listen(const serve_args *a) {
    if (a->api_key || a->api_key_file || loopback_host(a->host))
        return 0;
    if (!a->insecure_listen)
        return app_fail("serve: will not listen on %s without an API key: anyone who reaches it could run this "
                        "server. Give an API key (--api-key-file), listen on 127.0.0.1, or accept the risk with "
                        "--insecure-listen",
                        a->host);
    fprintf(stderr,
            "rlx serve: warning: listening on %s without an API key (--insecure-listen): anyone who reaches it can "
            "use this server\n",
            a->host);
    return 0;
}

static int check_args(const serve_args *a, const app_options *o, const app_spec_options *spec) {
    if (check_ranges(a))
        return 1;
    if (over_lm(o, spec) && a->parallel_given && a->parallel > 1)
        return app_fail("serve: with --spec requests take turns on one slot: --parallel %u "
                        "cannot be (give --parallel 1 or leave it out)",
                        a->parallel);
    if (a->api_key && a->api_key_file)
        return app_fail("serve: give --api-key or --api-key-file, not both");
    if (a->api_key_given && !*a->api_key)
        return app_fail("serve: --api-key is empty: an empty key would let every request in (give a key, or leave "
                        "the option out for a server without one)");
    if (a->chat_template && a->chat_template_file)
        return app_fail("serve: give --chat-template or --chat-template-file, not both");
    if (a->total_ctx_given && a->slot_ctx)
        return app_fail("serve: give -c/--ctx-size (all slots together) or --slot-ctx (each slot), not both");
    if (a->total_ctx_given && a->total_ctx / a->parallel == 0)
        return app_fail("serve: -c %u over --parallel %u slots leaves no position per slot", a->total_ctx, a->parallel);
    return check_listen(a);
}

/* --api-key-file: the key is its first line. The file must be the owner's alone, as a stage's
 * token file. */
static char *read_key(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        app_fail("serve: --api-key-file %s: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        app_fail("serve: --api-key-file %s is not a regular file", path);
        return NULL;
    }
    if (sb.st_mode & 077) {
        app_fail("serve: --api-key-file %s may be read or written by other users (mode %03o): chmod 600 it, the key "
                 "is a password",
                 path, (unsigned)(sb.st_mode & 0777));
        return NULL;
    }
    size_t len;
    char *text = app_read_file("serve: --api-key-file", path, 0, &len);
    if (!text)
        return NULL;
    text[strcspn(text, "\r\n")] = '\0';
    if (!*text) {
        free(text);
        app_fail("serve: --api-key-file %s: the first line is empty", path);
        return NULL;
    }
    return text;
}

static int stop_pipe[2] = {-1, -1};

static void on_stop_signal(int sig) {
    const unsigned char c = (unsigned char)sig;
    const ssize_t written = write(stop_pipe[1], &c, 1); /* a full pipe has a signal pending already */
    (void)written;
}

static int catch_stop_signals(void) {
    if (pipe2(stop_pipe, O_CLOEXEC) != 0)
        return app_fail("serve: pipe: %s", strerror(errno));
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return 0;
}

/* The stop signal that came, waiting for one when wait. 0 when none came (without wait). */
static int stop_signal(int wait) {
    struct pollfd p = {.fd = stop_pipe[0], .events = POLLIN};
    unsigned char c = 0;
    for (;;) {
        int n = poll(&p, 1, wait ? -1 : 0);
        if (n > 0 && read(stop_pipe[0], &c, 1) == 1)
            return c;
        if (n == 0 || (n < 0 && errno != EINTR))
            return 0;
    }
}

static int open_engine(serve_server *s, app_runtime *rt, rlx_tokenizer **tok, serve_args *a, const app_options *o) {
    const int kv_dtype = app_kv_dtype(o);
    if (kv_dtype < 0)
        return 1;
    if (app_tokenizer_open(rt, tok) != RLX_OK)
        return app_fail_rlx("serve: cannot load the tokenizer");
    rlx_backend *backends[RLX_RUNTIME_MAX_BACKENDS];
    size_t n_backends = 0;
    for (rlx_backend *b;
         n_backends < RLX_RUNTIME_MAX_BACKENDS && (b = rlx_runtime_backend_at(rt->runtime, n_backends)) != NULL;)
        backends[n_backends++] = b;
    rlx_driver *driver = rlx_runtime_driver(rt->runtime);
    /* a speculator reads every prompt whole on the runtime's lm: requests take turns there */
    const int lm = rt->spec != NULL;
    if (lm && a->parallel_given && a->parallel > 1)
        return app_fail("serve: with a speculator requests take turns on one slot: --parallel %u cannot be "
                        "(give --parallel 1 or leave it out)",
                        a->parallel);
    if (lm)
        a->parallel = 1;
    rlx_engine_options eo = rlx_engine_options_default();
    eo.n_slots = a->parallel;
    /* over a pipeline the stages granted the slots' positions already */
    eo.slot_positions = driver ? 0 : a->total_ctx_given ? a->total_ctx / a->parallel : a->slot_ctx;
    eo.max_queue = a->queue ? a->queue : 512;
    eo.kv_dtype = (uint32_t)kv_dtype;
    eo.backends = backends;
    eo.n_backends = n_backends;
    eo.rules = rlx_runtime_rules(rt->runtime, &eo.n_rules);
    eo.check_finite = (uint32_t)o->check_finite;
    eo.beyond_trained = eo.slot_positions != 0; /* asked for (-c, --slot-ctx): warned about below */
    rlx_status rc = lm       ? rlx_engine_create_lm(&rt->lm, rt->spec, rt->draft_tokens, &eo, &s->engine)
                    : driver ? rlx_engine_create_pipeline(driver, &eo, &s->engine)
                             : rlx_engine_create(rt->model, &eo, &s->engine);
    if (rc != RLX_OK)
        return app_fail_rlx("serve: cannot create the engine");
    rlx_engine_stats st;
    rlx_engine_stats_of(s->engine, &st);
    s->tok = *tok;
    s->vocab = rlx_runtime_config(rt->runtime)->vocab_size;
    rlx_grammar_vocab *gvocab = NULL;
    if (rlx_grammar_vocab_create(*tok, &gvocab) != RLX_OK)
        return app_fail_rlx("serve: cannot index the vocabulary for constrained replies");
    s->gvocab = gvocab;
    s->slot_positions = st.slot_positions;
    s->driver = driver;
    const rlx_session_options so = {.size = sizeof so,
                                    .kv_capacity = st.slot_positions,
                                    .backends = backends,
                                    .n_backends = n_backends,
                                    .rules = eo.rules,
                                    .n_rules = eo.n_rules,
                                    .kv_dtype = eo.kv_dtype,
                                    .check_finite = eo.check_finite,
                                    .beyond_trained = 1};
    if (open_embedder(s, rt, a, &so))
        return 1;
    app_warn_beyond_trained(rt, st.slot_positions);
    return 0;
}

int cmd_serve(int argc, char **argv, app_options *o) {
    serve_args a = {.host = "127.0.0.1",
                    .port = 8080,
                    .parallel = 4,
                    .max_body = 1 << 20,
                    .timeout_s = 600,
                    .request_timeout_s = 30,
                    .drain_s = 10,
                    .max_connections = 1024,
                    .max_connections_per_ip = 128,
                    .reasoning_split = 1,
                    .think = 1,
                    .pooling = -1,
                    .embd_normalize = 2};
    app_spec_options spec = {0};
    app_sampling sampling = {0};
    const app_opt own[] = {
        {0, "host", NULL, "ADDR",
         "address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface,\n"
         "which needs an API key or --insecure-listen)",
         APP_OPT_STRING, &a.host},
        {0, "insecure-listen", NULL, NULL,
         "listen beyond loopback without an API key (anyone who reaches the port may\n"
         "use the server; a warning on start)",
         APP_OPT_FLAG, &a.insecure_listen},
        {0, "port", NULL, "N", "TCP port (default 8080; 0 picks a free one, printed at start)", APP_OPT_U32, &a.port},
        {0, "parallel", NULL, "N", "slots: requests generated at once, batched together (default 4)", APP_OPT_U32,
         &a.parallel, &a.parallel_given, .min = 1},
        {'c', "ctx-size", "ctx", "N",
         "KV cache positions of all slots together, split evenly between them, as\n"
         "llama-server's -c (default: each slot min(max_position_embeddings, 4096); a\n"
         "slot past max_position_embeddings runs with a warning, as llama-server's)",
         APP_OPT_U32, &a.total_ctx, &a.total_ctx_given, .min = 1},
        {0, "slot-ctx", NULL, "N", "KV cache positions of each slot (instead of -c)", APP_OPT_U32, &a.slot_ctx,
         .min = 1},
        {0, "queue", NULL, "N",
         "requests that may wait for a slot, each holding its connection and prompt\n"
         "(default 512); more get 503",
         APP_OPT_U32, &a.queue, .min = 1},
        {0, "api-key", NULL, "KEY", "require 'Authorization: Bearer KEY' on every endpoint but /health", APP_OPT_STRING,
         &a.api_key, &a.api_key_given},
        {0, "api-key-file", NULL, "FILE",
         "the same with the key read from FILE's first line (kept out of ps; the file\n"
         "must be mode 600 or stricter)",
         APP_OPT_STRING, &a.api_key_file},
        {0, "cors-origins", NULL, "LIST",
         "llama-server's form: --cors-origin values separated by commas, or localhost\n"
         "for any origin on localhost, 127.0.0.1 or [::1] (any scheme and port)",
         APP_OPT_CUSTOM, &a, .parse = parse_cors_origins},
        {0, "cors-origin", NULL, "ORIGIN",
         "serve cross-origin requests of browser pages from ORIGIN (scheme://host[:port],\n"
         "or * for any), with CORS headers and OPTIONS preflights; repeatable, up to 16",
         APP_OPT_CUSTOM, &a, .parse = parse_cors_origin},
        {0, "alias", NULL, "NAME", "the model id /v1/models lists (default: the model's file or directory name)",
         APP_OPT_STRING, &a.alias},
        {0, "max-body", NULL, "BYTES", "largest request body (default 1048576, at most 1 GiB); larger ones get 413",
         APP_OPT_U64, &a.max_body, .min = 1},
        {0, "max-tokens-limit", NULL, "N",
         "the most max_tokens a request may ask for (default 0: up to the end of\n"
         "its slot; at most 16777216); also the default of chat requests that give none",
         APP_OPT_U32, &a.max_tokens_limit},
        {0, "timeout", NULL, "S",
         "seconds a request's engine may go without progress (its tokens, or while it\n"
         "waits in the queue, the steps of the requests ahead) before a 504, and an\n"
         "idle connection stays open while an answer is sent (default 600, at most 86400)",
         APP_OPT_U32, &a.timeout_s, .min = 1},
        {0, "request-timeout", NULL, "S",
         "seconds a connection has, from its start or its previous answer, to send a\n"
         "whole request, headers and body (default 30, at most 86400); then it is closed",
         APP_OPT_U32, &a.request_timeout_s, .min = 1},
        {0, "drain-timeout", NULL, "S",
         "on SIGTERM/SIGINT, seconds the running requests get to finish before they\n"
         "are cancelled (default 10, at most 86400)",
         APP_OPT_U32, &a.drain_s},
        {0, "max-connections", NULL, "N",
         "connections served at once, one thread each (default 1024, at most 65536); up\n"
         "to 256 more get 503 with Retry-After, beyond that the connection is refused",
         APP_OPT_U32, &a.max_connections, .min = 1},
        {0, "max-connections-per-ip", NULL, "N",
         "connections one client address may hold open (default 128; 0: no limit, as\n"
         "behind a proxy, whose address every client has); more are closed at once",
         APP_OPT_U32, &a.max_connections_per_ip},
        {0, "special-in-content", NULL, NULL, APP_SPECIAL_IN_CONTENT_HELP, APP_OPT_FLAG, &a.special_in_content},
        {0, "chat-template-file", NULL, "FILE", APP_CHAT_TEMPLATE_FILE_HELP, APP_OPT_STRING, &a.chat_template_file},
        {0, "chat-template", NULL, "TEXT", "the same with the Jinja template given as TEXT (llama-server's)",
         APP_OPT_CUSTOM, &a.chat_template, .parse = parse_chat_template},
        {'n', "n-predict", "predict", "N",
         "max_tokens of the requests that give none (llama-server's; default: 16 for\n"
         "completions, as OpenAI's, the end of the slot for chat; -1: the end of the slot)",
         APP_OPT_CUSTOM, &a.n_predict, &a.n_predict_given, .parse = app_parse_max_new},
    };
    /* llama-server's flags (tools/server's README) for what rlx serve always does or lacks */
    const app_opt llama[] = {
        {0, "jinja", NULL, NULL, "taken: chat templates are always rendered with rlx's Jinja engine", APP_OPT_CUSTOM,
         (void *)"", .parse = parse_always},
        {0, "no-jinja", NULL, NULL, "taken, with a note: rlx has no other template engine", APP_OPT_CUSTOM,
         (void *)"rlx renders the model's Jinja template with its own engine, the only one it has",
         .parse = parse_always},
        {0, "cont-batching", NULL, NULL, "taken: requests are always batched as they come and go", APP_OPT_CUSTOM,
         (void *)"", .parse = parse_always},
        {0, "no-cont-batching", NULL, NULL, "refused: the engine always batches", APP_OPT_CUSTOM,
         (void *)"the batched engine cannot be turned off (give --parallel 1 for one request at a time)",
         .parse = parse_refused},
        {0, "metrics", NULL, NULL, "taken: GET /metrics is always served", APP_OPT_CUSTOM, (void *)"",
         .parse = parse_always},
        {0, "no-webui", "no-ui", NULL, "no chat page at / (a 404; the API is served as before)", APP_OPT_FLAG,
         &a.no_webui},
        {0, "slots", NULL, NULL, "serve GET /slots, each slot's request and progress (the default)", APP_OPT_CUSTOM,
         &a.no_slots, .parse = parse_slots},
        {0, "no-slots", NULL, NULL, "GET /slots answers 501", APP_OPT_CUSTOM, &a.no_slots, .parse = parse_no_slots},
        {0, "embedding", "embeddings", NULL,
         "serve POST /v1/embeddings and /embeddings (else 501): an input's final hidden\n"
         "states pooled (--pooling) and normalized",
         APP_OPT_FLAG, &a.embedding},
        {0, "reranking", "rerank", NULL,
         "serve POST /v1/rerank (else 501): documents scored as Qwen3-Reranker scores\n"
         "them, by the logits of 'yes' and 'no'",
         APP_OPT_FLAG, &a.reranking},
        {0, "pooling", NULL, "NAME",
         "how embeddings pool the positions: last, mean, cls or none (/embeddings\n"
         "only); default: the model's 1_Pooling/config.json, else last; rank: --reranking",
         APP_OPT_CUSTOM, &a, .parse = parse_pooling},
        {0, "embd-normalize", NULL, "N",
         "how embeddings are normalized when a request's embd_normalize does not say:\n"
         "-1 none, 0 max-abs to int16's range, 1 taxicab, 2 Euclidean (default), p > 2\n"
         "the p-norm",
         APP_OPT_CUSTOM, &a.embd_normalize, .parse = parse_embd_normalize},
        {0, "threads-http", NULL, "N", "taken, with a note: each connection has a thread of its own", APP_OPT_CUSTOM,
         (void *)"each connection has a thread of its own, up to --max-connections", .parse = parse_threads_http},
        {0, "reasoning-format", NULL, "FMT",
         "auto (default) or deepseek: a thinking model's <think> block goes to\n"
         "reasoning_content; none: it stays in content (a request's reasoning_format wins)",
         APP_OPT_CUSTOM, &a.reasoning_split, .parse = parse_reasoning_format},
        {0, "reasoning", NULL, "on|off|auto",
         "whether chat requests that do not say (chat_template_kwargs.enable_thinking)\n"
         "get the template's thinking mode: auto (default) and on leave it on, off\n"
         "turns it off",
         APP_OPT_CUSTOM, &a.think, .parse = parse_reasoning},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("serve:", own), APP_OPT_GROUP("llama-server's flags:", llama),
                                    app_common_group(o),          app_sampling_group(&sampling),
                                    app_spec_group(&spec),        app_pipeline_group(&o->pipeline)};
    int exit_status;
    if (app_parse_command("serve", usage, groups, sizeof groups / sizeof groups[0], argc, argv, &exit_status))
        return exit_status;
    if (check_args(&a, o, &spec) || app_sampling_finish(&sampling) ||
        (!app_pipeline_wanted(&o->pipeline) && app_resolve_model(o)))
        return 1;
    if (sampling.n_stops || sampling.n_biases)
        return app_fail("serve: %s sets nothing server-wide: give \"%s\" in each request",
                        sampling.n_stops ? "--stop" : "--logit-bias", sampling.n_stops ? "stop" : "logit_bias");
    const int lm = over_lm(o, &spec), pipeline = app_pipeline_wanted(&o->pipeline);
    if (lm) { /* the session or the stages hold the one slot's cache */
        a.parallel = 1;
        o->ctx = a.total_ctx_given ? a.total_ctx : a.slot_ctx;
    } else if (pipeline) { /* the stages hold every slot's cache */
        o->slots = a.parallel;
        o->ctx = a.total_ctx_given ? a.total_ctx / a.parallel : a.slot_ctx;
    }
    /* A request's answer must not depend on what runs beside it: cpu-blas keeps every row's bits
     * only in its batch-invariant mode (quantized weights cost nothing there, F32/BF16 prefill
     * some speed), so the server asks for it unless the options say otherwise. */
    static char opts_buf[512]; /* o outlives this call: the command runs once per process */
    const int cpu_blas = !o->plugin || strcasecmp(o->plugin, "cpu-blas") == 0;
    if (!lm && cpu_blas && !(o->backend_opts && strstr(o->backend_opts, "batch_invariant"))) {
        if (snprintf(opts_buf, sizeof opts_buf, "%s%sbatch_invariant=1", o->backend_opts ? o->backend_opts : "",
                     o->backend_opts && *o->backend_opts ? "," : "") >= (int)sizeof opts_buf)
            return app_fail("serve: --backend-opts is longer than %zu bytes", sizeof opts_buf - 32);
        o->backend_opts = opts_buf;
    }
    char *key_file_text = a.api_key_file ? read_key(a.api_key_file) : NULL;
    if (a.api_key_file && !key_file_text)
        return 1;
    char *template_text = NULL;
    if (a.chat_template && !(template_text = strdup(a.chat_template))) {
        free(key_file_text);
        return app_fail("serve: out of memory");
    }
    if (!a.chat_template && app_chat_template_file("serve", a.chat_template_file, &template_text)) {
        free(key_file_text);
        return 1;
    }
    char id_buf[4096];
    serve_server s = {.api_key = key_file_text ? key_file_text : a.api_key,
                      .max_body = (size_t)a.max_body,
                      .max_tokens_limit = a.max_tokens_limit,
                      .timeout_s = a.timeout_s,
                      .request_timeout_s = a.request_timeout_s,
                      .max_connections = a.max_connections,
                      .max_connections_per_ip = a.max_connections_per_ip,
                      .listen_host = a.host,
                      .cors_origins = a.cors_origins,
                      .n_cors_origins = a.n_cors_origins,
                      .completion_default = a.n_predict_given ? max_tokens_default(a.n_predict) : 16,
                      .chat_default = a.n_predict_given ? max_tokens_default(a.n_predict) : 0,
                      .special_in_content = a.special_in_content,
                      .reasoning_split = a.reasoning_split,
                      .think = a.think,
                      .no_slots = a.no_slots,
                      .no_webui = a.no_webui,
                      .chat_template = template_text};
    s.api_key_len = s.api_key ? strlen(s.api_key) : 0;
    /* the requests' sampling defaults: OpenAI's, under the sampling flags given */
    s.sampling = rlx_sampler_params_default();
    app_sampling_apply_flags(&sampling, &s.sampling);
    s.has_seed = sampling.has_seed && !sampling.random_seed;
    s.sampling.seed = sampling.seed;
    atomic_init(&s.phase, SERVE_LOADING);
    if (catch_stop_signals()) {
        free(key_file_text);
        free(template_text);
        return 1;
    }
    pthread_mutex_init(&s.latency_mu, NULL);
    serve_http *http = NULL;
    app_runtime rt = {0};
    rlx_tokenizer *tok = NULL;
    int status = 1;
    char err[256];
    /* under mpirun every rank runs this command, and all but rank 0 become stages while the
     * runtime opens: only the driver listens for HTTP */
    const int stage_rank = app_pipeline_stage_rank(&o->pipeline);
    if (!stage_rank && serve_http_start(&s, a.host, (uint16_t)a.port, o->verbose, &http, err, sizeof err) < 0) {
        app_fail("serve: %s", err);
        goto done;
    }
    const int v6 = strchr(a.host, ':') != NULL;
    if (!stage_rank)
        fprintf(stderr, "rlx serve: listening on http://%s%s%s:%u (loading %s)\n", v6 ? "[" : "", a.host, v6 ? "]" : "",
                serve_http_port(http),
                o->model             ? o->model
                : o->pipeline.config ? o->pipeline.config
                                     : "the default model");
    if (app_runtime_open_flags(&rt, o, &spec, lm || pipeline ? 0 : RLX_RUNTIME_STAGE) ||
        open_engine(&s, &rt, &tok, &a, o))
        goto done;
    s.model_id = model_id(&a, rt.model_dir, id_buf, sizeof id_buf);
    s.model_path = rt.model_dir;
    s.build_info = "rlx " RLX_APP_VERSION;
    s.n_slots = a.parallel;
    if (stop_signal(0)) {
        status = 0;
        goto done;
    }
    atomic_store(&s.phase, SERVE_READY);
    fprintf(stderr, "rlx serve: ready: model %s, %u slots of %u positions\n", s.model_id, a.parallel, s.slot_positions);
    int sig = stop_signal(1);
    atomic_store(&s.phase, SERVE_DRAINING);
    serve_http_quiesce(http);
    fprintf(stderr, "rlx serve: %s: draining (up to %u s)\n",
            sig == SIGTERM  ? "SIGTERM"
            : sig == SIGINT ? "SIGINT"
                            : "stopping",
            a.drain_s);
    uint32_t cancelled = rlx_engine_drain(s.engine, a.drain_s * 1000u); /* at most 86400 s: no overflow */
    /* the answers of the requests that finished are still on their way out */
    serve_http_settle(http, 2000);
    fprintf(stderr, "rlx serve: stopped (%u request%s cancelled)\n", cancelled, cancelled == 1 ? "" : "s");
    status = 0;
done:
    serve_http_stop(http);
    rlx_engine_destroy(s.engine);
    serve_embedder_destroy(s.embedder); /* after the engine, whose worker ran its tasks */
    rlx_grammar_vocab_destroy(s.gvocab);
    rlx_tokenizer_close(tok);
    app_runtime_close(&rt);
    pthread_mutex_destroy(&s.latency_mu);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    close(stop_pipe[0]);
    close(stop_pipe[1]);
    free(key_file_text);
    free(template_text);
    return status;
}
