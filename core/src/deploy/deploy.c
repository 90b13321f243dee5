/* Deployment files (YAML, read with libyaml's document API so every node keeps its line) into
 * an rlx_deploy. Every error is "FILE:LINE: what is wrong". */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include "rlx/deploy.h"
#include "rlx/transport_iface.h"
#include "util/alloc.h"

struct rlx_deploy {
    char *path;
    char *model;
    char *transport;
    rlx_deploy_stage *stages;
    uint32_t n_stages;
    int has_speculator;
    rlx_deploy_speculator speculator;
    rlx_deploy_generation generation;
    rlx_deploy_timeouts timeouts;
    rlx_deploy_limits limits;
    /* auth: and tls:; paths as written until rlx_deploy_open resolves them */
    char *token_file, *tls_ca, *tls_cert, *tls_key, *tls_name;
    uint32_t tls_line;         /* line of the top-level tls: (0: none) */
    uint32_t *stage_tls_lines; /* line of each stage's tls: (0: none), checked against tls: at the end */
    uint32_t layers_line;      /* line of the first explicit layers, for coverage errors */
    /* the line of each stage's standby addresses, for errors found once every stage is read */
    uint32_t (*standby_lines)[RLX_DIST_MAX_STANDBY];
};

typedef struct parse {
    rlx_deploy *d;
    yaml_document_t *doc;
} parse;

static unsigned line_of(const yaml_node_t *n) { return (unsigned)n->start_mark.line + 1; }

static rlx_status fail(const parse *p, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static rlx_status fail(const parse *p, const yaml_node_t *n, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rlx_error(RLX_E_FORMAT, "%s:%u: %s", p->d->path, n ? line_of(n) : 1, msg);
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static rlx_status get_string(const parse *p, const char *key, const yaml_node_t *n, char **out) {
    const char *s = scalar(n);
    if (!s || !*s)
        return fail(p, n, "'%s' must be a non-empty string", key);
    if (*out)
        free(*out);
    if (!(*out = rlx__strdup(s)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", p->d->path);
    return RLX_OK;
}

static rlx_status get_u64(const parse *p, const char *key, const yaml_node_t *n, uint64_t max, uint64_t *out) {
    const char *s = scalar(n);
    char *end;
    if (!s || !isdigit((unsigned char)s[0]))
        return fail(p, n, "'%s' must be a non-negative integer", key);
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return fail(p, n, "'%s' must be an integer from 0 to %llu, not '%s'", key, (unsigned long long)max, s);
    *out = v;
    return RLX_OK;
}

static rlx_status get_u32(const parse *p, const char *key, const yaml_node_t *n, uint32_t min, uint32_t *out) {
    uint64_t v = 0;
    rlx_status rc = get_u64(p, key, n, UINT32_MAX, &v);
    if (rc != RLX_OK)
        return rc;
    if (v < min)
        return fail(p, n, "'%s' must be at least %u", key, min);
    *out = (uint32_t)v;
    return RLX_OK;
}

static rlx_status get_float(const parse *p, const char *key, const yaml_node_t *n, float *out) {
    const char *s = scalar(n);
    char *end;
    if (!s || !*s)
        return fail(p, n, "'%s' must be a number", key);
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || !isfinite(v))
        return fail(p, n, "'%s' must be a number, not '%s'", key, s);
    *out = v;
    return RLX_OK;
}

rlx_status rlx_deploy_check_address(const char *address, int allow_port_0) {
    if (!address || !*address)
        return rlx_error(RLX_E_INVALID, "empty address (expected host:port)");
    char host[256], err[512];
    unsigned port;
    if (rlx_iface_split_address(address, host, sizeof host, &port, err, sizeof err) < 0)
        return rlx_error(RLX_E_INVALID, "%s", err);
    /* the transports accept an empty host (any interface); a deployment names its stages */
    if (!*host)
        return rlx_error(RLX_E_INVALID, "'%s' has no host (want host:port)", address);
    const int v6 = address[0] == '[';
    for (const char *c = host; *c; c++) {
        if (v6 && !isxdigit((unsigned char)*c) && *c != ':' && *c != '.')
            return rlx_error(RLX_E_INVALID, "'%s': '%c' cannot appear in an IPv6 address", address, *c);
        if (!v6 && !isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_')
            return rlx_error(RLX_E_INVALID, "'%s': '%c' cannot appear in a host name (IPv6 needs [brackets])", address,
                             *c);
    }
    if (port == 0 && !allow_port_0)
        return rlx_error(RLX_E_INVALID, "'%s': the port must be a number from 1 to 65535", address);
    return RLX_OK;
}

/* Calls fn for every key/value pair of a mapping node, refusing repeated keys and non-scalar keys. */
typedef rlx_status (*pair_fn)(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v);

static rlx_status each_pair(parse *p, const yaml_node_t *map, void *ctx, pair_fn fn) {
    for (yaml_node_pair_t *a = map->data.mapping.pairs.start; a < map->data.mapping.pairs.top; a++) {
        const yaml_node_t *k = yaml_document_get_node(p->doc, a->key);
        const yaml_node_t *v = yaml_document_get_node(p->doc, a->value);
        const char *key = scalar(k);
        if (!key)
            return fail(p, k, "keys must be plain names");
        for (yaml_node_pair_t *b = map->data.mapping.pairs.start; b < a; b++) {
            const char *other = scalar(yaml_document_get_node(p->doc, b->key));
            if (other && strcmp(other, key) == 0)
                return fail(p, k, "'%s' is given twice", key);
        }
        rlx_status rc = fn(p, ctx, key, k, v);
        if (rc != RLX_OK)
            return rc;
    }
    return RLX_OK;
}

static rlx_status need_mapping(const parse *p, const char *what, const yaml_node_t *n) {
    if (!n || n->type != YAML_MAPPING_NODE)
        return fail(p, n, "%s must be a mapping of keys to values", what);
    return RLX_OK;
}

// ---- stages ----

/* standby: one address or a list of them; each is checked as `address` is, since the driver
 * connects to it the same way. Duplicates are found by check_standby once every stage is read. */
static rlx_status parse_standby(parse *p, rlx_deploy_stage *s, const yaml_node_t *v) {
    const int one = v && v->type == YAML_SCALAR_NODE && *v->data.scalar.value;
    if (!one && (!v || v->type != YAML_SEQUENCE_NODE))
        return fail(p, v, "'standby' must be an address (host:port) or a list of addresses");
    const size_t n = one ? 1 : (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return fail(p, v, "'standby' is empty: list at least one address, or leave the key out");
    if (n > RLX_DIST_MAX_STANDBY)
        return fail(p, v, "'standby' lists %zu addresses; a stage may have at most %d", n, RLX_DIST_MAX_STANDBY);
    char **list = rlx__calloc(n, sizeof *list);
    if (!list)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", p->d->path);
    s->standby = (const char *const *)list;
    uint32_t *lines = p->d->standby_lines[s - p->d->stages];
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *item = one ? v : yaml_document_get_node(p->doc, v->data.sequence.items.start[i]);
        const char *text = scalar(item);
        if (!text || !*text)
            return fail(p, item, "each 'standby' entry must be an address (host:port)");
        if (!(list[i] = rlx__strdup(text)))
            return rlx_error(RLX_E_NOMEM, "%s: out of memory", p->d->path);
        s->n_standby = (uint32_t)i + 1;
        lines[i] = line_of(item);
        if (rlx_deploy_check_address(text, 0) != RLX_OK)
            return fail(p, item, "standby: %s", rlx_last_error());
    }
    return RLX_OK;
}

static rlx_status stage_tls_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    rlx_deploy_stage *s = ctx;
    if (strcmp(key, "cert") == 0 || strcmp(key, "key") == 0) {
        char *path = NULL;
        rlx_status rc = get_string(p, key, v, &path);
        *(key[0] == 'c' ? &s->tls_cert : &s->tls_key) = path;
        return rc;
    }
    if (strcmp(key, "ca") == 0 || strcmp(key, "name") == 0)
        return fail(p, k, "'%s' belongs in the file's top-level tls: (a stage's tls: gives its own cert and key)", key);
    return fail(p, k, "unknown key '%s' in a stage's tls (known: cert, key)", key);
}

/* A stage's own certificate: cert and key together. Whether the file's tls: gives the authority
 * they chain to is checked once the whole file is read (tls: may come after the stages). */
static rlx_status parse_stage_tls(parse *p, rlx_deploy_stage *s, const yaml_node_t *v) {
    rlx_status rc = need_mapping(p, "a stage's 'tls'", v);
    if (rc == RLX_OK)
        rc = each_pair(p, v, s, stage_tls_pair);
    if (rc == RLX_OK && (!s->tls_cert || !s->tls_key))
        rc = fail(p, v, "a stage's tls: needs both cert and key (the stage's certificate and its private key)");
    if (rc == RLX_OK)
        p->d->stage_tls_lines[s - p->d->stages] = line_of(v);
    return rc;
}

static rlx_status stage_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    rlx_deploy_stage *s = ctx;
    rlx_status rc;
    if (strcmp(key, "address") == 0 || strcmp(key, "listen") == 0) {
        char *addr = NULL;
        if ((rc = get_string(p, key, v, &addr)) != RLX_OK)
            return rc;
        if (key[0] == 'a')
            s->address = addr;
        else
            s->listen = addr;
        if (rlx_deploy_check_address(addr, key[0] == 'l') != RLX_OK)
            return fail(p, v, "%s: %s", key, rlx_last_error());
        return RLX_OK;
    }
    if (strcmp(key, "backend") == 0 || strcmp(key, "backend_options") == 0) {
        char *b = NULL;
        rc = get_string(p, key, v, &b);
        *(key[7] ? &s->backend_options : &s->backend) = b;
        return rc;
    }
    if (strcmp(key, "threads") == 0)
        return get_u32(p, key, v, 1, &s->threads);
    if (strcmp(key, "layers") == 0) {
        const char *text = scalar(v);
        if (!text || rlx_dist_parse_range(text, &s->layers) != RLX_OK)
            return fail(p, v, "layers must look like 0-13 (first-last, inclusive)%s%s", text ? ": " : "",
                        text ? rlx_last_error() : "");
        s->has_layers = 1;
        return RLX_OK;
    }
    if (strcmp(key, "standby") == 0)
        return parse_standby(p, s, v);
    if (strcmp(key, "tls") == 0)
        return parse_stage_tls(p, s, v);
    return fail(p, k,
                "unknown key '%s' in a stage (known: address, backend, backend_options, layers, threads, listen, "
                "standby, tls)",
                key);
}

/* A standby must be a process of its own to take a lost stage's place: the driver tries the
 * stage's own address before its standbys anyway, a process at another stage's address serves
 * other layers (and this driver already), and one standby listed twice or for two stages is one
 * process counted as two. Addresses compare without case, as host names and IPv6 digits do. */
static rlx_status check_standby(const rlx_deploy *d) {
    for (uint32_t i = 0; i < d->n_stages; i++) {
        const rlx_deploy_stage *s = &d->stages[i];
        for (uint32_t k = 0; k < s->n_standby; k++) {
            const char *a = s->standby[k];
            const uint32_t line = d->standby_lines[i][k];
            for (uint32_t j = 0; j < d->n_stages; j++)
                if (strcasecmp(a, d->stages[j].address) == 0)
                    return j == i ? rlx_error(RLX_E_FORMAT,
                                              "%s:%u: stage %u: standby %s is the stage's own address (a standby "
                                              "must be another process, at another address)",
                                              d->path, line, i, a)
                                  : rlx_error(RLX_E_FORMAT,
                                              "%s:%u: stage %u: standby %s is the address of stage %u (line %u): "
                                              "a standby must be a process of its own",
                                              d->path, line, i, a, j, d->stages[j].line);
            /* against the standbys listed before this one, in file order */
            for (uint32_t j = 0; j <= i; j++)
                for (uint32_t m = 0; m < (j == i ? k : d->stages[j].n_standby); m++)
                    if (strcasecmp(a, d->stages[j].standby[m]) == 0)
                        return j == i ? rlx_error(RLX_E_FORMAT, "%s:%u: stage %u: standby %s is listed twice (line %u)",
                                                  d->path, line, i, a, d->standby_lines[j][m])
                                      : rlx_error(RLX_E_FORMAT,
                                                  "%s:%u: stage %u: standby %s is already a standby of stage %u (line "
                                                  "%u): a standby serves one stage",
                                                  d->path, line, i, a, j, d->standby_lines[j][m]);
        }
    }
    return RLX_OK;
}

static rlx_status parse_stages(parse *p, const yaml_node_t *v) {
    if (!v || v->type != YAML_SEQUENCE_NODE)
        return fail(p, v, "'stages' must be a list of stages, each with an address");
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return fail(p, v, "'stages' is empty: a pipeline needs at least one stage");
    if (n > RLX_MAX_LAYERS)
        return fail(p, v, "%zu stages is more than any model has layers", n);
    rlx_deploy *d = p->d;
    if (!(d->stages = rlx__calloc(n, sizeof *d->stages)) ||
        !(d->standby_lines = rlx__calloc(n, sizeof *d->standby_lines)) ||
        !(d->stage_tls_lines = rlx__calloc(n, sizeof *d->stage_tls_lines)))
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", d->path);
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *item = yaml_document_get_node(p->doc, v->data.sequence.items.start[i]);
        rlx_deploy_stage *s = &d->stages[i];
        d->n_stages = (uint32_t)i + 1;
        s->line = line_of(item);
        rlx_status rc = need_mapping(p, "a stage", item);
        if (rc == RLX_OK)
            rc = each_pair(p, item, s, stage_pair);
        if (rc != RLX_OK)
            return rc;
        if (!s->address)
            return fail(p, item, "stage %zu has no address", i);
    }
    rlx_status rc = check_standby(d);
    if (rc != RLX_OK)
        return rc;
    /* layers: on every stage or on none; consecutive ranges must meet exactly */
    for (uint32_t i = 0; i < d->n_stages; i++) {
        const rlx_deploy_stage *s = &d->stages[i], *prev = i ? &d->stages[i - 1] : NULL;
        if (s->has_layers != d->stages[0].has_layers)
            return rlx_error(RLX_E_FORMAT,
                             "%s:%u: stage %u %s layers but stage 0 %s: give layers for every stage or "
                             "for none (an even split)",
                             d->path, s->line, i, s->has_layers ? "gives" : "gives no",
                             d->stages[0].has_layers ? "does" : "does not");
        if (!s->has_layers)
            continue;
        if (!d->layers_line)
            d->layers_line = s->line;
        if (i == 0 && s->layers.start != 0)
            return rlx_error(RLX_E_FORMAT, "%s:%u: stage 0 starts at layer %u: layers 0-%u are run by no stage",
                             d->path, s->line, s->layers.start, s->layers.start - 1);
        if (prev && s->layers.start > prev->layers.end)
            return rlx_error(RLX_E_FORMAT,
                             "%s:%u: gap: layers %u-%u are run by no stage (stage %u ends at layer %u, "
                             "stage %u starts at %u)",
                             d->path, s->line, prev->layers.end, s->layers.start - 1, i - 1, prev->layers.end - 1, i,
                             s->layers.start);
        if (prev && s->layers.start < prev->layers.end)
            return rlx_error(RLX_E_FORMAT,
                             "%s:%u: overlap: stage %u starts at layer %u but stage %u runs up to layer "
                             "%u",
                             d->path, s->line, i, s->layers.start, i - 1, prev->layers.end - 1);
    }
    return RLX_OK;
}

// ---- optional sections ----

static rlx_status speculator_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    rlx_deploy_speculator *s = ctx;
    if (strcmp(key, "plugin") == 0) {
        char *name = NULL;
        rlx_status rc = get_string(p, key, v, &name);
        s->plugin = name;
        return rc;
    }
    if (strcmp(key, "draft_tokens") == 0)
        return get_u32(p, key, v, 1, &s->draft_tokens);
    if (strcmp(key, "draft_model") == 0 || strcmp(key, "options") == 0) {
        char *text = NULL;
        rlx_status rc = get_string(p, key, v, &text);
        *(key[0] == 'd' ? &s->draft_model : &s->options) = text;
        return rc;
    }
    return fail(p, k, "unknown key '%s' in speculator (known: plugin, draft_tokens, draft_model, options)", key);
}

static rlx_status generation_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    rlx_deploy_generation *g = ctx;
    rlx_status rc;
    if (strcmp(key, "max_tokens") == 0) {
        g->has_max_tokens = 1;
        return get_u32(p, key, v, 0, &g->max_tokens);
    }
    if (strcmp(key, "temperature") == 0) {
        g->has_temperature = 1;
        if ((rc = get_float(p, key, v, &g->temperature)) == RLX_OK && !(g->temperature >= 0))
            rc = fail(p, v, "temperature must be >= 0 (0 = greedy)");
        return rc;
    }
    if (strcmp(key, "top_k") == 0) {
        uint32_t k32 = 0;
        g->has_top_k = 1;
        if ((rc = get_u32(p, key, v, 0, &k32)) == RLX_OK && k32 > INT32_MAX)
            rc = fail(p, v, "top_k is too large");
        g->top_k = (int32_t)k32;
        return rc;
    }
    if (strcmp(key, "top_p") == 0) {
        g->has_top_p = 1;
        if ((rc = get_float(p, key, v, &g->top_p)) == RLX_OK && !(g->top_p > 0 && g->top_p <= 1))
            rc = fail(p, v, "top_p must be in (0, 1]");
        return rc;
    }
    if (strcmp(key, "seed") == 0) {
        g->has_seed = 1;
        return get_u64(p, key, v, UINT64_MAX, &g->seed);
    }
    if (strcmp(key, "min_p") == 0) {
        g->has_min_p = 1;
        if ((rc = get_float(p, key, v, &g->min_p)) == RLX_OK && !(g->min_p >= 0 && g->min_p <= 1))
            rc = fail(p, v, "min_p must be in [0, 1] (0 = off)");
        return rc;
    }
    if (strcmp(key, "repeat_penalty") == 0) {
        g->has_repeat_penalty = 1;
        if ((rc = get_float(p, key, v, &g->repeat_penalty)) == RLX_OK && !(g->repeat_penalty > 0))
            rc = fail(p, v, "repeat_penalty must be > 0 (1 = off)");
        return rc;
    }
    if (strcmp(key, "repeat_last_n") == 0) {
        g->has_repeat_last_n = 1;
        const char *text = scalar(v);
        if (text && strcmp(text, "-1") == 0) { /* the whole context: the one negative value */
            g->repeat_last_n = -1;
            return RLX_OK;
        }
        uint32_t n = 0;
        if (get_u32(p, key, v, 0, &n) != RLX_OK || n > INT32_MAX)
            return fail(p, v, "repeat_last_n must be a number of tokens up to %d, or -1 for the whole context",
                        INT32_MAX);
        g->repeat_last_n = (int32_t)n;
        return RLX_OK;
    }
    if (strcmp(key, "presence_penalty") == 0) {
        g->has_presence_penalty = 1;
        return get_float(p, key, v, &g->presence_penalty);
    }
    if (strcmp(key, "frequency_penalty") == 0) {
        g->has_frequency_penalty = 1;
        return get_float(p, key, v, &g->frequency_penalty);
    }
    return fail(p, k,
                "unknown key '%s' in generation (known: max_tokens, temperature, top_k, top_p, seed, min_p, "
                "repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty)",
                key);
}

static rlx_status timeouts_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    rlx_deploy_timeouts *t = ctx;
    if (strcmp(key, "connect_ms") == 0)
        return get_u32(p, key, v, 1, &t->connect_ms);
    if (strcmp(key, "control_ms") == 0)
        return get_u32(p, key, v, 1, &t->control_ms);
    if (strcmp(key, "per_position_ms") == 0)
        return get_u32(p, key, v, 1, &t->per_position_ms);
    if (strcmp(key, "recovery_ms") == 0)
        return get_u32(p, key, v, 1, &t->recovery_ms);
    if (strcmp(key, "idle_ms") == 0)
        return get_u32(p, key, v, 1, &t->idle_ms);
    return fail(p, k,
                "unknown key '%s' in timeouts (known: connect_ms, control_ms, per_position_ms, recovery_ms, idle_ms)",
                key);
}

static rlx_status limits_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    rlx_deploy_limits *l = ctx;
    if (strcmp(key, "connections") == 0)
        return get_u32(p, key, v, 1, &l->connections);
    if (strcmp(key, "sessions") == 0)
        return get_u32(p, key, v, 1, &l->sessions);
    if (strcmp(key, "positions") == 0) {
        rlx_status rc = get_u64(p, key, v, UINT64_MAX, &l->positions);
        if (rc == RLX_OK && l->positions == 0)
            rc = fail(p, v, "'positions' must be at least 1");
        return rc;
    }
    return fail(p, k, "unknown key '%s' in limits (known: connections, sessions, positions)", key);
}

static rlx_status auth_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    (void)ctx;
    if (strcmp(key, "token_file") == 0)
        return get_string(p, key, v, &p->d->token_file);
    return fail(p, k, "unknown key '%s' in auth (known: token_file)", key);
}

static rlx_status tls_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    (void)ctx;
    rlx_deploy *d = p->d;
    char **field = strcmp(key, "ca") == 0     ? &d->tls_ca
                   : strcmp(key, "cert") == 0 ? &d->tls_cert
                   : strcmp(key, "key") == 0  ? &d->tls_key
                   : strcmp(key, "name") == 0 ? &d->tls_name
                                              : NULL;
    if (!field)
        return fail(p, k, "unknown key '%s' in tls (known: ca, cert, key, name)", key);
    return get_string(p, key, v, field);
}

/* Mutual TLS needs all three files on every side: the authority to check the peer against, and
 * a certificate with its key to show. A stage's entry may replace the last two. */
static rlx_status parse_tls(parse *p, const yaml_node_t *v) {
    rlx_deploy *d = p->d;
    rlx_status rc = need_mapping(p, "'tls'", v);
    if (rc == RLX_OK)
        rc = each_pair(p, v, NULL, tls_pair);
    if (rc == RLX_OK && (!d->tls_ca || !d->tls_cert || !d->tls_key)) {
        char missing[32] = "";
        const char *names[] = {d->tls_ca ? NULL : "ca", d->tls_cert ? NULL : "cert", d->tls_key ? NULL : "key"};
        for (size_t i = 0; i < 3; i++)
            if (names[i])
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", *missing ? ", " : "",
                         names[i]);
        rc = fail(p, v,
                  "tls: needs ca, cert and key together (the authority the peers' certificates chain to, a "
                  "certificate and its private key); missing: %s",
                  missing);
    }
    if (rc == RLX_OK)
        d->tls_line = line_of(v);
    return rc;
}

static rlx_status top_pair(parse *p, void *ctx, const char *key, const yaml_node_t *k, const yaml_node_t *v) {
    (void)ctx;
    rlx_deploy *d = p->d;
    rlx_status rc;
    if (strcmp(key, "model") == 0)
        return get_string(p, key, v, &d->model);
    if (strcmp(key, "transport") == 0)
        return get_string(p, key, v, &d->transport);
    if (strcmp(key, "stages") == 0)
        return parse_stages(p, v);
    if (strcmp(key, "speculator") == 0) {
        d->has_speculator = 1;
        if ((rc = need_mapping(p, "'speculator'", v)) == RLX_OK)
            rc = each_pair(p, v, &d->speculator, speculator_pair);
        if (rc == RLX_OK && !d->speculator.plugin)
            rc = fail(p, v, "speculator needs a plugin");
        return rc;
    }
    if (strcmp(key, "generation") == 0) {
        if ((rc = need_mapping(p, "'generation'", v)) == RLX_OK)
            rc = each_pair(p, v, &d->generation, generation_pair);
        return rc;
    }
    if (strcmp(key, "timeouts") == 0) {
        if ((rc = need_mapping(p, "'timeouts'", v)) == RLX_OK)
            rc = each_pair(p, v, &d->timeouts, timeouts_pair);
        return rc;
    }
    if (strcmp(key, "limits") == 0) {
        if ((rc = need_mapping(p, "'limits'", v)) == RLX_OK)
            rc = each_pair(p, v, &d->limits, limits_pair);
        return rc;
    }
    if (strcmp(key, "auth") == 0) {
        if ((rc = need_mapping(p, "'auth'", v)) == RLX_OK)
            rc = each_pair(p, v, NULL, auth_pair);
        if (rc == RLX_OK && !d->token_file)
            rc = fail(p, v, "auth: needs token_file (the file whose first line is the shared token)");
        return rc;
    }
    if (strcmp(key, "tls") == 0)
        return parse_tls(p, v);
    return fail(p, k,
                "unknown key '%s' (known: model, transport, stages, speculator, generation, timeouts, limits, auth, "
                "tls)",
                key);
}

/* Makes a relative path (the model's, the draft model's) relative to the deployment file's folder. */
static rlx_status resolve_path(rlx_deploy *d, char **path) {
    if (!*path || (*path)[0] == '/')
        return RLX_OK;
    const char *slash = strrchr(d->path, '/');
    if (!slash)
        return RLX_OK;
    size_t dir = (size_t)(slash - d->path);
    char *full = rlx__malloc(dir + 1 + strlen(*path) + 1);
    if (!full)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", d->path);
    sprintf(full, "%.*s/%s", (int)dir, d->path, *path);
    free(*path);
    *path = full;
    return RLX_OK;
}

/* resolve_path for the members the header declares const (the strings are d's own). */
static rlx_status resolve_member(rlx_deploy *d, const char **path) {
    char *owned = (char *)*path;
    rlx_status rc = resolve_path(d, &owned);
    *path = owned;
    return rc;
}

/* Every path the file gives: the models, the token file and the certificates. */
static rlx_status resolve_paths(rlx_deploy *d) {
    char **own[] = {&d->model, &d->token_file, &d->tls_ca, &d->tls_cert, &d->tls_key};
    rlx_status rc = resolve_member(d, &d->speculator.draft_model);
    for (size_t i = 0; rc == RLX_OK && i < sizeof own / sizeof own[0]; i++)
        rc = resolve_path(d, own[i]);
    for (uint32_t i = 0; rc == RLX_OK && i < d->n_stages; i++)
        if ((rc = resolve_member(d, &d->stages[i].tls_cert)) == RLX_OK)
            rc = resolve_member(d, &d->stages[i].tls_key);
    return rc;
}

rlx_status rlx_deploy_open(const char *path, rlx_deploy **out) {
    if (!path || !out)
        return rlx_error(RLX_E_INVALID, "rlx_deploy_open: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return rlx_error(RLX_E_IO, "%s: cannot open: %s", path, strerror(errno));
    rlx_deploy *d = rlx__calloc(1, sizeof *d);
    if (!d || !(d->path = rlx__strdup(path))) {
        free(d);
        fclose(f);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    int have_doc = 0;
    rlx_status rc = RLX_OK;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        rlx_deploy_close(d);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    }
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = rlx_error(RLX_E_FORMAT, "%s:%zu: not valid YAML: %s%s%s", path, parser.problem_mark.line + 1,
                       parser.problem ? parser.problem : "syntax error", parser.context ? " " : "",
                       parser.context ? parser.context : "");
        goto done;
    }
    have_doc = 1;
    parse p = {.d = d, .doc = &doc};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        rc = rlx_error(RLX_E_FORMAT, "%s:1: the file is empty (a deployment needs at least 'stages')", path);
        goto done;
    }
    if ((rc = need_mapping(&p, "the deployment", root)) != RLX_OK ||
        (rc = each_pair(&p, root, NULL, top_pair)) != RLX_OK)
        goto done;
    if (!d->n_stages) {
        rc = fail(&p, root, "no 'stages': a deployment lists its stages in pipeline order");
        goto done;
    }
    if (!d->transport && !(d->transport = rlx__strdup("tcp"))) {
        rc = rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (uint32_t i = 0; i < d->n_stages; i++)
        if (d->stage_tls_lines[i] && !d->tls_line) {
            rc = rlx_error(RLX_E_FORMAT,
                           "%s:%u: stage %u's tls: gives its certificate, but the file has no top-level tls: "
                           "with the ca the peers' certificates chain to",
                           path, d->stage_tls_lines[i], i);
            goto done;
        }
    if ((rc = resolve_paths(d)) != RLX_OK)
        goto done;
done:
    if (have_doc)
        yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    if (rc != RLX_OK) {
        rlx_deploy_close(d);
        return rc;
    }
    *out = d;
    return RLX_OK;
}

void rlx_deploy_close(rlx_deploy *d) {
    if (!d)
        return;
    for (uint32_t i = 0; i < d->n_stages; i++) {
        free((char *)d->stages[i].address);
        free((char *)d->stages[i].listen);
        free((char *)d->stages[i].backend);
        free((char *)d->stages[i].backend_options);
        for (uint32_t k = 0; k < d->stages[i].n_standby; k++)
            free((char *)d->stages[i].standby[k]);
        free((void *)d->stages[i].standby);
        free((char *)d->stages[i].tls_cert);
        free((char *)d->stages[i].tls_key);
    }
    free(d->stages);
    free(d->standby_lines);
    free(d->stage_tls_lines);
    free(d->token_file);
    free(d->tls_ca);
    free(d->tls_cert);
    free(d->tls_key);
    free(d->tls_name);
    free((char *)d->speculator.plugin);
    free((char *)d->speculator.draft_model);
    free((char *)d->speculator.options);
    free(d->model);
    free(d->transport);
    free(d->path);
    free(d);
}

const char *rlx_deploy_path(const rlx_deploy *d) { return d->path; }
const char *rlx_deploy_model(const rlx_deploy *d) { return d->model; }
const char *rlx_deploy_transport(const rlx_deploy *d) { return d->transport; }
uint32_t rlx_deploy_n_stages(const rlx_deploy *d) { return d->n_stages; }

const rlx_deploy_stage *rlx_deploy_stage_at(const rlx_deploy *d, uint32_t i) {
    return i < d->n_stages ? &d->stages[i] : NULL;
}

const rlx_deploy_speculator *rlx_deploy_speculator_of(const rlx_deploy *d) {
    return d->has_speculator ? &d->speculator : NULL;
}

const rlx_deploy_generation *rlx_deploy_generation_of(const rlx_deploy *d) { return &d->generation; }
const rlx_deploy_timeouts *rlx_deploy_timeouts_of(const rlx_deploy *d) { return &d->timeouts; }
const rlx_deploy_limits *rlx_deploy_limits_of(const rlx_deploy *d) { return &d->limits; }

rlx_status rlx_deploy_security(const rlx_deploy *d, int stage, rlx_dist_security *out) {
    if (!d || !out)
        return rlx_error(RLX_E_INVALID, "rlx_deploy_security: NULL argument");
    if (stage >= 0 && (uint32_t)stage >= d->n_stages)
        return rlx_error(RLX_E_INVALID, "%s has %u stages; stage %d is not one of them", d->path, d->n_stages, stage);
    const rlx_deploy_stage *s = stage >= 0 ? &d->stages[stage] : NULL;
    const int own = s && s->tls_cert; /* parsing gave the stage's cert and key together */
    *out = (rlx_dist_security){.tls_ca = d->tls_ca,
                               .tls_cert = own ? s->tls_cert : d->tls_cert,
                               .tls_key = own ? s->tls_key : d->tls_key,
                               .tls_name = s ? NULL : d->tls_name,
                               .auth_token_file = d->token_file};
    return RLX_OK;
}

rlx_status rlx_deploy_layers(const rlx_deploy *d, const rlx_model_config *cfg, rlx_layer_range *out) {
    if (!d || !cfg || !out)
        return rlx_error(RLX_E_INVALID, "rlx_deploy_layers: NULL argument");
    const uint32_t n_layers = cfg->num_hidden_layers > 0 ? (uint32_t)cfg->num_hidden_layers : 0;
    if (!d->stages[0].has_layers) {
        if (rlx_dist_split_balanced(cfg, d->n_stages, out) != RLX_OK)
            return rlx_error(RLX_E_RANGE, "%s:%u: %s", d->path, d->stages[0].line, rlx_last_error());
        return RLX_OK;
    }
    for (uint32_t i = 0; i < d->n_stages; i++) {
        const rlx_deploy_stage *s = &d->stages[i];
        if (s->layers.end > n_layers)
            return rlx_error(RLX_E_RANGE, "%s:%u: stage %u: layers %u-%u run past the model's %u layers (0-%u)",
                             d->path, s->line, i, s->layers.start, s->layers.end - 1, n_layers, n_layers - 1);
        out[i] = s->layers;
    }
    const rlx_deploy_stage *last = &d->stages[d->n_stages - 1];
    if (last->layers.end < n_layers)
        return rlx_error(RLX_E_RANGE,
                         "%s:%u: layers %u-%u are run by no stage (the last stage ends at layer %u of "
                         "the model's %u)",
                         d->path, last->line, last->layers.end, n_layers - 1, last->layers.end - 1, n_layers);
    rlx_status rc = rlx_dist_check_ranges(n_layers, out, d->n_stages);
    return rc == RLX_OK ? rc : rlx_error(rc, "%s:%u: %s", d->path, d->layers_line, rlx_last_error());
}

rlx_status rlx_deploy_driver_stages(const rlx_deploy *d, const rlx_model_config *cfg, rlx_driver_stage *out) {
    if (!d || !out)
        return rlx_error(RLX_E_INVALID, "rlx_deploy_driver_stages: NULL argument");
    rlx_layer_range *ranges = rlx__calloc(d->n_stages, sizeof *ranges);
    if (!ranges)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", d->path);
    rlx_status rc = rlx_deploy_layers(d, cfg, ranges);
    for (uint32_t i = 0; rc == RLX_OK && i < d->n_stages; i++)
        out[i] = (rlx_driver_stage){.address = d->stages[i].address,
                                    .layers = ranges[i],
                                    .source_file = d->path,
                                    .source_line = d->stages[i].line,
                                    .standby = d->stages[i].standby,
                                    .n_standby = d->stages[i].n_standby};
    free(ranges);
    return rc;
}
