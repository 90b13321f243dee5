/* The pipeline driver: connections to the stages, the handshake, and an rlx_lm whose forward
 * sends rows through the stages in order. Any transport failure or protocol violation makes the
 * driver unusable (the stages no longer agree on the session) and closes every connection, so
 * the surviving stages free the session at once. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_internal.h"
#include "model/model_internal.h"
#include "util/alloc.h"
#include "util/log.h"

#include "util/clock.h"

#define MESSAGE_LIMIT ((size_t)1 << 30) /* what every transport must carry */

/* A step or a copy on its way through the stages (the slots' pipelined mode). */
typedef struct drv_job {
    struct drv_job *next;
    uint64_t ticket;
    int copy; /* CopySlot, else Rows */
    uint32_t n, n_out;
    int32_t *ids;                           /* [n] */
    uint32_t *positions, *slots, *out_rows; /* [n], [n], [n_out] */
    uint32_t from, to, n_copy;
    uint32_t bound_ms;    /* what the job may take at the most, all stages together */
    Rlx__Envelope *reply; /* the last stage's answer, whose rows the next stage takes */
    rlx_status status;
    char message[1024];
} drv_job;

typedef struct drv_stage {
    char *address;
    char *source; /* "deploy.yaml:7: " or NULL */
    rlx_layer_range layers;
    void *conn;
    int answered;    /* a message came on conn: it is a peer that speaks, so silence means stalled */
    int has_session; /* the stage holds our session (it answered an Activations) */
    char backend[64];
    uint64_t rss_bytes;
    uint32_t kv_capacity;
    rlx_driver_stage_stats stats; /* under the driver's stats_mu */
    uint64_t rows_step;           /* the connection's Rows and CopySlot steps, by its thread */
    char **standby;               /* [n_standby] addresses tried when the stage is lost */
    uint64_t generation;          /* replacements so far, under pipe_mu once stage threads run */
    uint32_t n_standby;
    uint32_t idle_ms;           /* the stage closes the connection after this long without a message */
    atomic_llong last_heard_ms; /* when the stage last answered (rlx__now_seconds, ms) */
    uint64_t pings;
} drv_stage;

struct rlx_driver {
    rlx_model_config cfg;
    char model_id[RLX_MODEL_ID_SIZE];
    rlx__auth auth;
    rlx__net net;
    drv_stage *stages;
    uint32_t n_stages;
    uint32_t connect_ms, timeout_ms, per_position_ms, kv_capacity;
    int emit_hidden; /* the last stage returns hidden rows with the logits */
    uint64_t session_id, step;
    uint32_t length, capacity;
    Rlx__Envelope *last; /* the last stage's reply: the logits handed out */
    int broken;          /* under pipe_mu once the stage threads run */
    char broken_msg[1024];
    /* slots: a thread per stage, each taking jobs from its queue and handing them to the next
     * stage's; queue n_stages holds the finished jobs. pipe_mu guards the queues, broken and
     * the counts below. */
    uint32_t n_slots;
    pthread_t *threads;
    uint32_t n_threads;
    pthread_mutex_t pipe_mu;
    pthread_cond_t *queue_cond; /* [n_stages + 1] */
    drv_job **queue_head, **queue_tail;
    int pipe_stop;
    uint64_t next_ticket;
    uint32_t n_queued;  /* jobs submitted and not yet waited for */
    uint64_t queued_ms; /* their bound_ms summed */
    drv_job *handed;    /* the job whose logits the last wait handed out */
    /* recovery */
    uint32_t recovery_ms;
    int no_recovery;
    rlx_driver_restart_fn restart;
    void *restart_ctx;
    int defer_failures; /* a failed stage may yet be replaced: stage_fail does not break the driver */
    int32_t *history;   /* lm: the session's ids by position, replayed into a replaced stage */
    /* slots: what each position holds, by slot: the id and the ticket of the job that wrote it
     * (0: never written), under pipe_mu; what a replaced stage is replayed from */
    int32_t *log_ids;
    uint64_t *log_tickets;
    pthread_cond_t recover_cond; /* recovering or n_active changed */
    int recovering;              /* a thread replaces a stage: the others start no job */
    int recovery_stopped;        /* rlx_driver_stop_recovery: no recovery goes on */
    uint32_t n_active;           /* stage threads in the middle of a job */
    char **retired;              /* addresses of replaced stages, still lent out */
    uint32_t n_retired;
    /* Another thread (a server's /metrics) may read the figures while this one drives. */
    pthread_mutex_t stats_mu;
    rlx_driver_stats stats;
    /* lm: the keeper pings idle stages between calls; lm_mu is held by every call and a ping */
    pthread_mutex_t lm_mu;
    pthread_cond_t keeper_cond;
    pthread_t keeper;
    int keeper_started, keeper_stop; /* under lm_mu */
};

rlx_driver_options rlx_driver_options_default(void) { return (rlx_driver_options){0}; }

static rlx_status start_threads(rlx_driver *d);
static void stop_threads(rlx_driver *d);
static rlx_status start_keeper(rlx_driver *d);
static void stop_keeper(rlx_driver *d);

static void close_all(rlx_driver *d) {
    for (uint32_t i = 0; i < d->n_stages; i++)
        if (d->stages[i].conn) {
            d->net.t->conn_close(d->net.self, d->stages[i].conn);
            d->stages[i].conn = NULL;
            d->stages[i].has_session = 0;
        }
}

/* Marks the driver unusable, keeping the first reason; 1 when this was the first. pipe_mu held. */
static int set_broken(rlx_driver *d, const char *why) {
    if (d->broken)
        return 0;
    d->broken = 1;
    snprintf(d->broken_msg, sizeof d->broken_msg, "%s", why);
    return 1;
}

/* The driver becomes unusable (the first message says why) and, unless stage threads still use
 * the connections (they close at destroy), hangs up on every stage. */
static void mark_broken(rlx_driver *d, const char *why) {
    pthread_mutex_lock(&d->pipe_mu);
    const int first = set_broken(d, why);
    pthread_mutex_unlock(&d->pipe_mu);
    if (first && !d->n_threads)
        close_all(d);
}

/* A lost stage replaced and its streams replayed in `seconds`. */
static void count_recovery(rlx_driver *d, double seconds) {
    pthread_mutex_lock(&d->stats_mu);
    d->stats.recoveries++;
    d->stats.recovery_seconds += seconds;
    d->stats.last_recovery_seconds = seconds;
    pthread_mutex_unlock(&d->stats_mu);
}

/* Records "[source: ]stage i (address): ..." as the error and returns code. With `fatal`, the
 * driver becomes unusable and hangs up on every stage, unless the caller may still replace the
 * stage (defer_failures) and decides itself. */
static rlx_status stage_fail(rlx_driver *d, uint32_t i, int fatal, rlx_status code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static rlx_status stage_fail(rlx_driver *d, uint32_t i, int fatal, rlx_status code, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const drv_stage *s = &d->stages[i];
    rlx_error(code, "%sstage %u (%s): %s", s->source ? s->source : "", i, s->address, msg);
    if (fatal && !d->defer_failures)
        mark_broken(d, rlx_last_error());
    return code;
}

static rlx_status check_usable(rlx_driver *d) {
    pthread_mutex_lock(&d->pipe_mu);
    rlx_status rc =
        d->broken ? rlx_error(RLX_E_PEER, "the pipeline is down after an earlier failure: %s", d->broken_msg) : RLX_OK;
    pthread_mutex_unlock(&d->pipe_mu);
    return rc;
}

static rlx_status send_to(rlx_driver *d, uint32_t i, const Rlx__Envelope *e) {
    size_t bytes = 0;
    rlx_status rc = rlx__net_send(&d->net, d->stages[i].conn, e, (int)d->timeout_ms, &bytes);
    if (rc != RLX_OK)
        return stage_fail(d, i, 1, rc, "cannot send %s: %s", rlx__envelope_kind(e), rlx_last_error());
    pthread_mutex_lock(&d->stats_mu);
    d->stats.messages++;
    d->stats.bytes_sent += bytes;
    d->stages[i].stats.bytes_sent += bytes;
    pthread_mutex_unlock(&d->stats_mu);
    return RLX_OK;
}

/* Waits up to wait_ms for stage i's answer to a `what` request. */
static rlx_status recv_from(rlx_driver *d, uint32_t i, uint32_t wait_ms, const char *what, Rlx__Envelope **e) {
    size_t bytes = 0;
    double t0 = rlx__now_seconds();
    rlx_status rc = rlx__net_recv(&d->net, d->stages[i].conn, e, (int)wait_ms, &bytes);
    const double waited = rlx__now_seconds() - t0;
    pthread_mutex_lock(&d->stats_mu);
    d->stats.wait_seconds += waited;
    pthread_mutex_unlock(&d->stats_mu);
    if (rc == RLX_E_TIMEOUT && !d->stages[i].answered)
        return stage_fail(d, i, 1, rc,
                          "accepted the connection but never answered the handshake within %u ms (not "
                          "an rlx stage, or a stage that is stuck or busy computing for another driver)",
                          wait_ms);
    if (rc == RLX_E_TIMEOUT)
        return stage_fail(d, i, 1, rc,
                          "no answer to %s within %u ms (the stage is stalled, overloaded or "
                          "unreachable)",
                          what, wait_ms);
    if (rc == RLX_E_PEER)
        return stage_fail(d, i, 1, rc, "connection lost waiting for the answer to %s: %s", what, rlx_last_error());
    if (rc != RLX_OK)
        return stage_fail(d, i, 1, rc, "bad answer to %s: %s", what, rlx_last_error());
    d->stages[i].answered = 1;
    atomic_store(&d->stages[i].last_heard_ms, (long long)(rlx__now_seconds() * 1000));
    pthread_mutex_lock(&d->stats_mu);
    d->stats.messages++;
    d->stats.bytes_received += bytes;
    d->stages[i].stats.bytes_received += bytes;
    pthread_mutex_unlock(&d->stats_mu);
    return RLX_OK;
}

/* A forward step stage i answered, `seconds` from sending it to the answer. */
static void count_step(rlx_driver *d, uint32_t i, double seconds) {
    pthread_mutex_lock(&d->stats_mu);
    rlx_driver_stage_stats *s = &d->stages[i].stats;
    s->steps++;
    s->seconds += seconds;
    s->last_seconds = seconds;
    if (seconds > s->max_seconds)
        s->max_seconds = seconds;
    pthread_mutex_unlock(&d->stats_mu);
}

static rlx_status error_reply(rlx_driver *d, uint32_t i, int fatal, const char *what, const Rlx__Envelope *e) {
    const Rlx__Error *err = e->error;
    int code = err->code < 0 && err->code >= RLX_E_AUTH ? err->code : RLX_E_PEER;
    return stage_fail(d, i, fatal, code, "refused %s: %s", what, err->message ? err->message : "(no message)");
}

// ---- handshake ----

/* With a token: the stage's answer *r to a Hello carrying `nonce` must be an AuthChallenge whose
 * proof shows the stage holds the token; the driver then proves it holds it too and *r becomes
 * the stage's answer to that. An Error passes through to the caller. */
static rlx_status prove(rlx_driver *d, uint32_t i, const uint8_t *nonce, Rlx__Envelope **r) {
    if ((*r)->body_case == RLX__ENVELOPE__BODY_ERROR)
        return RLX_OK;
    if ((*r)->body_case != RLX__ENVELOPE__BODY_AUTH_CHALLENGE) {
        rlx__envelope_free(*r);
        return stage_fail(d, i, 1, RLX_E_AUTH,
                          "answered without authenticating: it has no auth token, and this driver accepts only stages "
                          "that prove they hold the deployment's (start the stage with the same --auth-token-file)");
    }
    const Rlx__AuthChallenge *ch = (*r)->auth_challenge;
    if (ch->nonce.len != RLX__AUTH_NONCE_BYTES ||
        !rlx__auth_proof_ok(&d->auth, RLX__AUTH_STAGE_LABEL, nonce, ch->nonce.data, ch->proof.data, ch->proof.len)) {
        rlx__envelope_free(*r);
        return stage_fail(d, i, 1, RLX_E_AUTH,
                          "wrong auth token: the stage's proof does not match this driver's token (a stage of another "
                          "deployment, or not a stage of ours)");
    }
    uint8_t stage_nonce[RLX__AUTH_NONCE_BYTES], proof[RLX__AUTH_PROOF_BYTES];
    memcpy(stage_nonce, ch->nonce.data, sizeof stage_nonce);
    rlx__envelope_free(*r);
    rlx__auth_proof(&d->auth, RLX__AUTH_DRIVER_LABEL, nonce, stage_nonce, proof);
    Rlx__AuthProof ap = RLX__AUTH_PROOF__INIT;
    ap.proof = (ProtobufCBinaryData){sizeof proof, proof};
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_AUTH_PROOF;
    e.auth_proof = &ap;
    rlx_status rc = send_to(d, i, &e);
    return rc == RLX_OK ? recv_from(d, i, d->timeout_ms, "the handshake", r) : rc;
}

static rlx_status hello(rlx_driver *d, uint32_t i) {
    drv_stage *s = &d->stages[i];
    Rlx__Hello h = RLX__HELLO__INIT;
    h.protocol_version = RLX_DIST_PROTOCOL_VERSION;
    h.model_id = d->model_id;
    h.layer_start = s->layers.start;
    h.layer_end = s->layers.end;
    h.stage_index = i;
    h.n_stages = d->n_stages;
    h.activation_dtype = RLX__DTYPE__DTYPE_F32;
    h.kv_capacity = d->kv_capacity;
    int want_hidden = d->emit_hidden && i + 1 == d->n_stages;
    h.emit_hidden = want_hidden;
    h.n_slots = d->n_slots;
    uint8_t nonce[RLX__AUTH_NONCE_BYTES];
    rlx_status rc = RLX_OK;
    if (d->auth.token && (rc = rlx__auth_nonce(nonce)) == RLX_OK)
        h.auth_nonce = (ProtobufCBinaryData){sizeof nonce, nonce};
    Rlx__Envelope e = RLX__ENVELOPE__INIT, *r;
    e.body_case = RLX__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    if (rc == RLX_OK)
        rc = send_to(d, i, &e);
    if (rc == RLX_OK)
        rc = recv_from(d, i, d->timeout_ms, "the handshake", &r);
    /* A stage that refuses says why (busy, a wrong token, a mismatch), and a TLS stage's alert
     * is named by the transport: a hang-up without a word has no cause to guess. */
    if (rc == RLX_E_PEER && !s->answered)
        return rlx_error(rc, "%s (before answering the handshake; the stage's log says why)", rlx_last_error());
    if (rc == RLX_OK && d->auth.token)
        rc = prove(d, i, nonce, &r);
    if (rc != RLX_OK)
        return rc;
    if (r->body_case == RLX__ENVELOPE__BODY_AUTH_CHALLENGE) {
        rc = stage_fail(d, i, 1, RLX_E_AUTH,
                        "requires an auth token: give this driver the deployment's token (--auth-token-file, or "
                        "auth: token_file in the deployment file)");
    } else if (r->body_case == RLX__ENVELOPE__BODY_ERROR) {
        rc = error_reply(d, i, 1, "the handshake", r);
    } else if (r->body_case != RLX__ENVELOPE__BODY_HELLO_REPLY) {
        rc = stage_fail(d, i, 1, RLX_E_FORMAT, "answered the handshake with %s, not HelloReply", rlx__envelope_kind(r));
    } else {
        const Rlx__HelloReply *hr = r->hello_reply;
        if (hr->protocol_version != RLX_DIST_PROTOCOL_VERSION)
            rc = stage_fail(d, i, 1, RLX_E_UNSUPPORTED, "speaks protocol version %u, this driver speaks version %d",
                            hr->protocol_version, RLX_DIST_PROTOCOL_VERSION);
        else if (!hr->model_id || strcmp(hr->model_id, d->model_id) != 0)
            rc = stage_fail(d, i, 1, RLX_E_INVALID, "serves another model (id %.16s..., the driver's is %.16s...)",
                            hr->model_id ? hr->model_id : "", d->model_id);
        else if (hr->layer_start != s->layers.start || hr->layer_end != s->layers.end)
            rc = stage_fail(d, i, 1, RLX_E_INVALID, "serves layers [%u, %u), the driver expects %u-%u", hr->layer_start,
                            hr->layer_end, s->layers.start, s->layers.end - 1);
        else if (hr->kv_capacity == 0)
            rc = stage_fail(d, i, 1, RLX_E_FORMAT, "granted no KV cache capacity");
        else if (want_hidden && !hr->emit_hidden)
            rc = stage_fail(d, i, 1, RLX_E_UNSUPPORTED,
                            "does not return hidden states, which the speculator needs "
                            "(a stage older than this driver?)");
        else if (hr->n_slots != d->n_slots)
            rc = stage_fail(d, i, 1, RLX_E_UNSUPPORTED,
                            "granted %u slots of the %u asked for (a stage older than this driver "
                            "keeps none)",
                            hr->n_slots, d->n_slots);
        else {
            pthread_mutex_lock(&d->stats_mu);
            snprintf(s->backend, sizeof s->backend, "%s", hr->backend ? hr->backend : "?");
            s->rss_bytes = hr->rss_bytes;
            s->kv_capacity = hr->kv_capacity;
            s->idle_ms = hr->idle_timeout_ms;
            pthread_mutex_unlock(&d->stats_mu);
        }
    }
    rlx__envelope_free(r);
    return rc;
}

rlx_status rlx_driver_create(const char *model_dir, const rlx_driver_options *o, rlx_driver **out) {
    if (!model_dir || !o || !out || !o->stages || !o->n_stages || !o->transport)
        return rlx_error(RLX_E_INVALID, "rlx_driver_create: NULL argument or no stages");
    *out = NULL;
    rlx_driver *d = rlx__calloc(1, sizeof *d);
    if (!d || !(d->stages = rlx__calloc(o->n_stages, sizeof *d->stages))) {
        free(d);
        return rlx_error(RLX_E_NOMEM, "driver: out of memory");
    }
    pthread_mutex_init(&d->stats_mu, NULL);
    pthread_mutex_init(&d->pipe_mu, NULL);
    pthread_mutex_init(&d->lm_mu, NULL);
    rlx__cond_init_monotonic(&d->keeper_cond);
    rlx__cond_init_monotonic(&d->recover_cond);
    d->n_stages = o->n_stages;
    d->n_slots = o->n_slots;
    d->recovery_ms = o->recovery_timeout_ms ? o->recovery_timeout_ms : RLX_DIST_RECOVERY_TIMEOUT_MS;
    d->no_recovery = o->no_recovery != 0;
    d->restart = o->restart;
    d->restart_ctx = o->restart_ctx;
    d->connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : RLX_DIST_CONNECT_TIMEOUT_MS;
    d->timeout_ms = o->timeout_ms ? o->timeout_ms : RLX_DIST_TIMEOUT_MS;
    d->per_position_ms = o->compute_ms_per_position ? o->compute_ms_per_position : RLX_DIST_COMPUTE_MS_PER_POSITION;
    d->kv_capacity = o->kv_capacity;
    d->emit_hidden = o->emit_hidden != 0;
    rlx_status rc = RLX_OK;
    for (uint32_t i = 0; i < o->n_stages && rc == RLX_OK; i++) {
        d->stages[i].layers = o->stages[i].layers;
        if (!o->stages[i].address || !(d->stages[i].address = rlx__strdup(o->stages[i].address))) {
            rc = rlx_error(o->stages[i].address ? RLX_E_NOMEM : RLX_E_INVALID, "stage %u: no address", i);
        } else if (o->stages[i].source_file &&
                   asprintf(&d->stages[i].source, "%s:%u: ", o->stages[i].source_file, o->stages[i].source_line) < 0) {
            d->stages[i].source = NULL; /* asprintf leaves it undefined */
            rc = rlx_error(RLX_E_NOMEM, "driver: out of memory");
        } else if (o->stages[i].n_standby > RLX_DIST_MAX_STANDBY || (o->stages[i].n_standby && !o->stages[i].standby)) {
            rc = rlx_error(RLX_E_INVALID, "stage %u: %u standby addresses (at most %d)", i, o->stages[i].n_standby,
                           RLX_DIST_MAX_STANDBY);
        } else if (o->stages[i].n_standby &&
                   !(d->stages[i].standby = rlx__calloc(o->stages[i].n_standby, sizeof *d->stages[i].standby))) {
            rc = rlx_error(RLX_E_NOMEM, "driver: out of memory");
        }
        for (uint32_t k = 0; rc == RLX_OK && k < o->stages[i].n_standby; k++) {
            if (!o->stages[i].standby[k] || !(d->stages[i].standby[k] = rlx__strdup(o->stages[i].standby[k])))
                rc = rlx_error(o->stages[i].standby[k] ? RLX_E_NOMEM : RLX_E_INVALID,
                               "stage %u: standby %u: no address", i, k);
            d->stages[i].n_standby = k + 1;
        }
    }
    if (rc == RLX_OK)
        rc = rlx__model_config_and_id(model_dir, &d->cfg, d->model_id);
    if (rc == RLX_OK) {
        rlx_layer_range *ranges = rlx__malloc(d->n_stages * sizeof *ranges);
        if (!ranges) {
            rc = rlx_error(RLX_E_NOMEM, "driver: out of memory");
        } else {
            for (uint32_t i = 0; i < d->n_stages; i++)
                ranges[i] = d->stages[i].layers;
            rc = rlx_dist_check_ranges((uint32_t)d->cfg.num_hidden_layers, ranges, d->n_stages);
            free(ranges);
        }
    }
    if (rc == RLX_OK)
        rc = rlx__auth_init(&d->auth, &o->security, o->transport_options, 0, 1);
    if (rc == RLX_OK)
        rc = rlx__net_open(o->transport, d->auth.options, &d->net);
    /* One deadline for connecting to all stages. A refused connection is retried until it:
     * the driver cannot tell a wrong address from a stage that is still reading its weights
     * (it listens only then), and retrying lets a deployment start in any order. Stages that
     * --launch or --stages start are connected to only once they reported listening. Each
     * stage gets its handshake as soon as it is connected: a stage waits timeout_ms for a Hello,
     * less than a later stage may take to come up. */
    double deadline = rlx__now_seconds() + d->connect_ms / 1000.0;
    for (uint32_t i = 0; rc == RLX_OK && i < d->n_stages; i++) {
        double left = deadline - rlx__now_seconds();
        int wait = left > 0.001 ? (int)(left * 1000 + 0.5) : 1;
        rlx_error_clear();
        int crc = d->net.t->connect(d->net.self, d->stages[i].address, wait, &d->stages[i].conn);
        if (crc < 0) {
            d->stages[i].conn = NULL;
            /* the transport's own words say enough, except that a refusal means no stage runs there */
            if (crc == RLX_E_PEER)
                rc = stage_fail(d, i, 1, crc,
                                "connection refused: no rlx stage is listening there (retried until "
                                "the connect timeout, %u ms)",
                                d->connect_ms);
            else
                rc = stage_fail(d, i, 1, crc, "%s", *rlx_last_error() ? rlx_last_error() : rlx_status_str(crc));
        } else {
            rc = hello(d, i);
        }
    }
    if (rc != RLX_OK) {
        rlx_driver_destroy(d);
        return rc;
    }
    d->capacity = UINT32_MAX;
    for (uint32_t i = 0; i < d->n_stages; i++)
        if (d->stages[i].kv_capacity < d->capacity)
            d->capacity = d->stages[i].kv_capacity;
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id)
        id = (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid();
    d->session_id = id ? id : 1;
    /* from here a failed stage may be replaced: whoever sees the failure decides */
    d->defer_failures = 1;
    if (!(d->history = rlx__malloc((size_t)d->capacity * sizeof *d->history)) ||
        (d->n_slots && (!(d->log_ids = rlx__calloc((size_t)d->n_slots * d->capacity, sizeof *d->log_ids)) ||
                        !(d->log_tickets = rlx__calloc((size_t)d->n_slots * d->capacity, sizeof *d->log_tickets)))))
        rc = rlx_error(RLX_E_NOMEM, "driver: out of memory for the replay log of %u slots of %u positions",
                       d->n_slots ? d->n_slots : 1, d->capacity);
    if (rc != RLX_OK || (rc = d->n_slots ? start_threads(d) : start_keeper(d)) != RLX_OK) {
        rlx_driver_destroy(d);
        return rc;
    }
    *out = d;
    return RLX_OK;
}

// ---- replacing a lost stage ----

/* The bound on a wait for one stage's answer to n rows. */
static uint32_t rows_wait_ms(const rlx_driver *d, uint32_t n) {
    const uint64_t ms = (uint64_t)d->timeout_ms + (uint64_t)n * d->per_position_ms;
    return ms > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)ms;
}

/* Tries to bring stage i back on one address within wait_ms: connect, then the handshake. */
static rlx_status reconnect(rlx_driver *d, uint32_t i, const char *address, uint32_t wait_ms) {
    drv_stage *s = &d->stages[i];
    rlx_error_clear();
    int crc = d->net.t->connect(d->net.self, address, (int)(wait_ms ? wait_ms : 1), &s->conn);
    if (crc < 0) {
        s->conn = NULL;
        return rlx_error(crc, "%s: %s", address,
                         crc == RLX_E_PEER   ? "connection refused"
                         : *rlx_last_error() ? rlx_last_error()
                                             : rlx_status_str(crc));
    }
    const uint32_t capacity = s->kv_capacity;
    rlx_status rc = hello(d, i);
    if (rc == RLX_OK && s->kv_capacity < capacity)
        rc = rlx_error(RLX_E_RANGE, "%s grants %u positions, fewer than the %u the streams hold", address,
                       s->kv_capacity, capacity);
    if (rc != RLX_OK) {
        char msg[700];
        snprintf(msg, sizeof msg, "%s", rlx_last_error());
        if (s->conn)
            d->net.t->conn_close(d->net.self, s->conn);
        s->conn = NULL;
        return rlx_error(rc, "%s", msg);
    }
    return RLX_OK;
}

/* Stage i listens at `address` now. rlx_driver_stage_info_get hands the old string out to other
 * threads (a server's /metrics), so it is kept until the driver is destroyed. */
static void set_address(rlx_driver *d, uint32_t i, const char *address) {
    char *copy = rlx__strdup(address);
    char **retired = copy ? realloc(d->retired, (d->n_retired + 1) * sizeof *retired) : NULL;
    if (!retired) {
        free(copy);
        return; /* the messages keep naming the old address */
    }
    d->retired = retired;
    pthread_mutex_lock(&d->stats_mu);
    d->retired[d->n_retired++] = d->stages[i].address;
    d->stages[i].address = copy;
    pthread_mutex_unlock(&d->stats_mu);
}

static int closing(rlx_driver *d) {
    pthread_mutex_lock(&d->pipe_mu);
    const int stop = d->pipe_stop || d->recovery_stopped;
    pthread_mutex_unlock(&d->pipe_mu);
    return stop;
}

void rlx_driver_stop_recovery(rlx_driver *d) {
    if (!d)
        return;
    pthread_mutex_lock(&d->pipe_mu);
    d->recovery_stopped = 1;
    pthread_mutex_unlock(&d->pipe_mu);
}

/* Replaces lost stage i before `deadline` (rlx__now_seconds): a launched stage is restarted
 * through d->restart (which says RLX_E_UNSUPPORTED for a stage it did not start); otherwise its
 * address and then its standby addresses are tried in turn until one answers the handshake (a
 * supervisor may restart the stage where it was). The caller holds every connection (no stage
 * thread runs a job). */
static rlx_status replace_stage(rlx_driver *d, uint32_t i, double deadline) {
    drv_stage *s = &d->stages[i];
    if (s->conn)
        d->net.t->conn_close(d->net.self, s->conn);
    s->conn = NULL;
    s->answered = 0;
    s->has_session = 0;
    s->rows_step = 0;
    char last[800] = "";
    int restartable = d->restart != NULL;
    for (;;) {
        const double left = deadline - rlx__now_seconds();
        if (left <= 0 || closing(d))
            break;
        const uint32_t left_ms = (uint32_t)(left * 1000) + 1;
        if (restartable) {
            char address[256] = "";
            rlx_error_clear();
            rlx_status rc = d->restart(d->restart_ctx, i, address, sizeof address, left_ms);
            if (rc == RLX_E_UNSUPPORTED) { /* not a stage the caller started: try its addresses */
                restartable = 0;
                continue;
            }
            if (rc == RLX_OK && (rc = reconnect(d, i, address, left_ms)) == RLX_OK) {
                set_address(d, i, address);
                return RLX_OK;
            }
            snprintf(last, sizeof last, "restarting it failed: %s", rlx_last_error());
            continue;
        }
        /* a short try at each address in turn, so a standby is reached while the address refuses;
         * an MPI rank that died never comes back in the same job, only its standbys can */
        const uint32_t first = strcasecmp(d->net.name, "mpi") == 0;
        if (first > s->n_standby)
            return rlx_error(RLX_E_PEER, "a lost MPI rank cannot come back, and the stage has no standby address");
        for (uint32_t k = first; k <= s->n_standby && deadline > rlx__now_seconds(); k++) {
            const char *address = k ? s->standby[k - 1] : s->address;
            const double try_left = deadline - rlx__now_seconds();
            const uint32_t try_ms = try_left > 1.0 ? 1000 : (uint32_t)(try_left * 1000) + 1;
            if (reconnect(d, i, address, try_ms) == RLX_OK) {
                if (k) { /* the standby is the stage now; the lost address becomes its standby */
                    pthread_mutex_lock(&d->stats_mu);
                    char *lost = s->address;
                    s->address = s->standby[k - 1];
                    s->standby[k - 1] = lost;
                    pthread_mutex_unlock(&d->stats_mu);
                }
                return RLX_OK;
            }
            snprintf(last, sizeof last, "%s", rlx_last_error());
        }
    }
    return rlx_error(RLX_E_PEER, "%s", *last ? last : "no time left to replace it");
}

// ---- the session ----

/* Sends Truncate(length) to stages [0, n) that hold the session and collects the Acks. On a
 * failure the other stages' Acks are still read, so no stale answer waits on a connection;
 * *failed names the first stage that failed and *refused says it answered with an Error. */
static rlx_status truncate_stages(rlx_driver *d, uint32_t n, uint32_t length, uint32_t *failed, int *refused) {
    uint64_t step = ++d->step;
    Rlx__Truncate t = RLX__TRUNCATE__INIT;
    t.session_id = d->session_id;
    t.step = step;
    t.length = length;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_TRUNCATE;
    e.truncate = &t;
    int sent[n ? n : 1];
    rlx_status first = RLX_OK;
    char msg[1024] = "";
    for (uint32_t i = 0; i < n; i++) {
        rlx_status rc = RLX_OK;
        sent[i] = 0;
        if (d->stages[i].has_session && first == RLX_OK) {
            rc = send_to(d, i, &e);
            sent[i] = rc == RLX_OK;
        }
        if (rc != RLX_OK) {
            first = rc;
            *failed = i;
            *refused = 0;
            snprintf(msg, sizeof msg, "%s", rlx_last_error());
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!sent[i])
            continue;
        Rlx__Envelope *r;
        int refusal = 0;
        rlx_status rc = recv_from(d, i, d->timeout_ms, "Truncate", &r);
        if (rc == RLX_OK) {
            if ((refusal = r->body_case == RLX__ENVELOPE__BODY_ERROR))
                rc = error_reply(d, i, 1, "Truncate", r);
            else if (r->body_case != RLX__ENVELOPE__BODY_ACK || r->ack->session_id != d->session_id ||
                     r->ack->step != step)
                rc = stage_fail(d, i, 1, RLX_E_FORMAT, "answered Truncate with %s for another session or step",
                                rlx__envelope_kind(r));
            rlx__envelope_free(r);
        }
        if (rc != RLX_OK && first == RLX_OK) {
            first = rc;
            *failed = i;
            *refused = refusal;
            snprintf(msg, sizeof msg, "%s", rlx_last_error());
        }
    }
    return first == RLX_OK ? RLX_OK : rlx_error(first, "%s", msg);
}

/* hidden_rows: the hidden rows the reply must carry (0: none may come). */
static rlx_status check_rows(rlx_driver *d, uint32_t i, const Rlx__Envelope *r, uint64_t step, uint32_t rows,
                             uint32_t width, uint32_t hidden_rows) {
    if (r->body_case != RLX__ENVELOPE__BODY_ACTIVATIONS)
        return stage_fail(d, i, 1, RLX_E_FORMAT, "answered Activations with %s", rlx__envelope_kind(r));
    const Rlx__Activations *a = r->activations;
    if (a->session_id != d->session_id || a->step != step)
        return stage_fail(d, i, 1, RLX_E_FORMAT,
                          "answered step %llu of session %016llx with step %llu of session "
                          "%016llx",
                          (unsigned long long)step, (unsigned long long)d->session_id, (unsigned long long)a->step,
                          (unsigned long long)a->session_id);
    if (a->n_positions != rows || a->width != width || a->dtype != RLX__DTYPE__DTYPE_F32 ||
        a->data.len != (size_t)rows * width * sizeof(float))
        return stage_fail(d, i, 1, RLX_E_FORMAT,
                          "answered with %u rows of %u %s values in %zu bytes, expected %u rows "
                          "of %u F32 values",
                          a->n_positions, a->width, rlx__dtype_name(a->dtype), a->data.len, rows, width);
    size_t hidden_bytes = (size_t)hidden_rows * (size_t)d->cfg.hidden_size * sizeof(float);
    if (a->hidden.len != hidden_bytes)
        return stage_fail(d, i, 1, RLX_E_FORMAT,
                          "answered with %zu bytes of hidden states, expected %u rows of %lld "
                          "F32 values",
                          a->hidden.len, hidden_rows, (long long)d->cfg.hidden_size);
    return RLX_OK;
}

/* Sends ids[0..n) at position `start` of the session through every stage, one step each; *out
 * is the last stage's reply. On a failure *failed names the stage, and *refused says it answered
 * with an Error (it is fine and kept its cache as it was). */
static rlx_status session_rows(rlx_driver *d, const int32_t *ids, uint32_t n, uint32_t start, int all_rows,
                               Rlx__Envelope **out, uint32_t *failed, int *refused) {
    *out = NULL;
    *refused = 0;
    const int64_t vocab = d->cfg.vocab_size, hidden = d->cfg.hidden_size;
    const uint32_t rows = all_rows ? n : 1;
    const uint64_t step = ++d->step;
    const uint32_t wait = rows_wait_ms(d, n);
    Rlx__Activations a = RLX__ACTIVATIONS__INIT;
    a.session_id = d->session_id;
    a.step = step;
    a.start_position = start;
    a.n_positions = n;
    a.width = 1;
    a.dtype = RLX__DTYPE__DTYPE_I32;
    a.all_rows = all_rows ? 1 : 0;
    a.data.len = (size_t)n * sizeof(int32_t);
    a.data.data = (uint8_t *)ids;
    Rlx__Envelope req = RLX__ENVELOPE__INIT, *prev = NULL;
    req.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    req.activations = &a;
    for (uint32_t i = 0; i < d->n_stages; i++) {
        const int last = i + 1 == d->n_stages;
        Rlx__Envelope *r = NULL;
        const double t0 = rlx__now_seconds();
        rlx_status rc = send_to(d, i, &req);
        if (rc == RLX_OK)
            rc = recv_from(d, i, wait, "Activations", &r);
        if (rc == RLX_OK && r->body_case == RLX__ENVELOPE__BODY_ACTIVATIONS)
            count_step(d, i, rlx__now_seconds() - t0);
        if (rc == RLX_OK && r->body_case == RLX__ENVELOPE__BODY_ERROR) {
            *refused = 1;
            rc = error_reply(d, i, 0, "Activations", r);
        } else if (rc == RLX_OK) {
            rc = check_rows(d, i, r, step, last ? rows : n, (uint32_t)(last ? vocab : hidden),
                            last && d->emit_hidden ? n : 0);
        }
        rlx__envelope_free(prev);
        prev = r;
        if (rc != RLX_OK) {
            rlx__envelope_free(prev);
            *failed = i;
            return rc;
        }
        d->stages[i].has_session = 1;
        a.width = (uint32_t)hidden;
        a.dtype = RLX__DTYPE__DTYPE_F32;
        a.data = r->activations->data;
    }
    *out = prev;
    return RLX_OK;
}

/* Positions a replay sends through the stages per step. */
#define REPLAY_CHUNK 256

/* Stage `lost` failed (the error is the last one) while d->length positions are the session:
 * replaces it and brings every stage back to those positions (the live ones truncated to none,
 * then all fed the session's ids again), so the session goes on as if nothing happened. A
 * stage lost meanwhile is replaced the same way. Without recovery, or when no replacement
 * answers within recovery_ms, the driver is broken with a message naming the stage. */
static rlx_status recover_session(rlx_driver *d, uint32_t lost, rlx_status why) {
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", rlx_last_error());
    if (d->no_recovery) {
        mark_broken(d, cause);
        return rlx_error(why, "%s", cause);
    }
    const double t0 = rlx__now_seconds(), deadline = t0 + d->recovery_ms / 1000.0;
    rlx_status rc = RLX_OK;
    for (;;) {
        if (closing(d)) {
            rc = rlx_error(RLX_E_PEER, "%s; the driver is closing", cause);
            break;
        }
        rlx__log(RLX_LOG_WARN, "%s; replacing stage %u and replaying %u positions", cause, lost, d->length);
        if ((rc = replace_stage(d, lost, deadline)) != RLX_OK) {
            rlx_error(rc, "%s; not replaced within %u ms: %s", cause, d->recovery_ms, rlx_last_error());
            break;
        }
        uint32_t failed = 0;
        int refused = 0;
        rc = truncate_stages(d, d->n_stages, 0, &failed, &refused);
        for (uint32_t at = 0; rc == RLX_OK && at < d->length; at += REPLAY_CHUNK) {
            const uint32_t m = d->length - at < REPLAY_CHUNK ? d->length - at : REPLAY_CHUNK;
            Rlx__Envelope *r;
            if ((rc = session_rows(d, d->history + at, m, at, 0, &r, &failed, &refused)) == RLX_OK)
                rlx__envelope_free(r);
        }
        if (rc == RLX_OK)
            break;
        if (refused || rlx__now_seconds() >= deadline) {
            rlx_error(rc, "%s; replaying the session failed: %s", cause, rlx_last_error());
            break;
        }
        snprintf(cause, sizeof cause, "%s", rlx_last_error());
        lost = failed;
    }
    if (rc != RLX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rlx_last_error());
        mark_broken(d, msg);
        return rlx_error(rc, "%s", msg);
    }
    const double took = rlx__now_seconds() - t0;
    count_recovery(d, took);
    rlx__log(RLX_LOG_WARN, "stage %u (%s) replaced and %u positions replayed in %.3f s", lost, d->stages[lost].address,
             d->length, took);
    return RLX_OK;
}

static rlx_status forward_locked(rlx_driver *d, const int32_t *ids, uint32_t n, int all_rows, const float **logits) {
    if (!ids || !logits || n == 0)
        return rlx_error(RLX_E_INVALID, "pipeline forward: NULL input or no positions");
    *logits = NULL;
    rlx_status rc = check_usable(d);
    if (rc != RLX_OK)
        return rc;
    if (n > d->capacity - d->length)
        return rlx_error(RLX_E_RANGE, "%u new positions after %u exceed the context of %u positions", n, d->length,
                         d->capacity);
    int64_t vocab = d->cfg.vocab_size, hidden = d->cfg.hidden_size;
    uint32_t rows = all_rows ? n : 1;
    size_t hidden_reply = d->emit_hidden ? (size_t)n * (size_t)hidden * sizeof(float) : 0;
    if ((size_t)rows * (size_t)vocab * sizeof(float) + hidden_reply > MESSAGE_LIMIT - 4096 ||
        (size_t)n * (size_t)hidden * sizeof(float) > MESSAGE_LIMIT - 4096)
        return rlx_error(RLX_E_RANGE,
                         "%u positions make a message over the transports' 1 GiB limit; send fewer at "
                         "a time",
                         n);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return rlx_error(RLX_E_RANGE, "token id %d (input %u) is outside the vocabulary [0, %lld)", ids[i], i,
                             (long long)vocab);
    rlx__envelope_free(d->last);
    d->last = NULL;
    /* each try that fails on a lost stage replaces it; a stage that keeps failing ends this */
    for (uint32_t attempt = 0;; attempt++) {
        Rlx__Envelope *r;
        uint32_t failed = 0;
        int refused = 0;
        rc = session_rows(d, ids, n, d->length, all_rows, &r, &failed, &refused);
        if (rc == RLX_OK) {
            memcpy(d->history + d->length, ids, n * sizeof *ids);
            d->last = r;
            d->length += n;
            *logits = (const float *)r->activations->data.data;
            return RLX_OK;
        }
        if (refused) {
            /* the stage refused but is fine: roll the earlier stages back and stay usable */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", rlx_last_error());
            uint32_t f2 = 0;
            int r2 = 0;
            rlx_status trc = truncate_stages(d, failed, d->length, &f2, &r2);
            if (trc != RLX_OK && r2) { /* a stage that refuses its own rollback is no longer in step */
                mark_broken(d, rlx_last_error());
                return trc;
            }
            if (trc != RLX_OK && (trc = recover_session(d, f2, trc)) != RLX_OK)
                return trc;
            return rlx_error(rc, "%s", msg);
        }
        if (attempt > d->n_stages) {
            mark_broken(d, rlx_last_error());
            return rc;
        }
        if ((rc = recover_session(d, failed, rc)) != RLX_OK)
            return rc;
    }
}

static rlx_status drv_forward(void *self, const int32_t *ids, uint32_t n, int all_rows, const float **logits) {
    rlx_driver *d = self;
    pthread_mutex_lock(&d->lm_mu);
    const rlx_status rc = forward_locked(d, ids, n, all_rows, logits);
    pthread_mutex_unlock(&d->lm_mu);
    return rc;
}

static rlx_status truncate_locked(rlx_driver *d, uint32_t length) {
    rlx_status rc = check_usable(d);
    if (rc != RLX_OK)
        return rc;
    if (length > d->length)
        return rlx_error(RLX_E_RANGE, "cannot truncate a session of %u positions to %u", d->length, length);
    if (length == d->length)
        return RLX_OK;
    uint32_t failed = 0;
    int refused = 0;
    rc = truncate_stages(d, d->n_stages, length, &failed, &refused);
    if (rc == RLX_OK || !refused) {
        /* a lost stage is rebuilt at the new length */
        const uint32_t was = d->length;
        d->length = length;
        if (rc != RLX_OK && (rc = recover_session(d, failed, rc)) != RLX_OK)
            d->length = was;
        return rc;
    }
    mark_broken(d, rlx_last_error());
    return rc;
}

static rlx_status drv_truncate(void *self, uint32_t length) {
    rlx_driver *d = self;
    pthread_mutex_lock(&d->lm_mu);
    const rlx_status rc = truncate_locked(d, length);
    pthread_mutex_unlock(&d->lm_mu);
    return rc;
}

static uint32_t drv_length(const void *self) { return ((const rlx_driver *)self)->length; }
/* The rows stay with the last reply, so they outlive a truncate as a session's do. */
static const float *drv_hidden(void *self) {
    const rlx_driver *d = self;
    return d->last ? (const float *)d->last->activations->hidden.data : NULL;
}
static uint32_t drv_capacity(const void *self) { return ((const rlx_driver *)self)->capacity; }

rlx_status rlx_driver_lm(rlx_driver *d, rlx_lm *out) {
    if (!d || !out)
        return rlx_error(RLX_E_INVALID, "rlx_driver_lm: NULL argument");
    *out = (rlx_lm){.self = d,
                    .forward = drv_forward,
                    .truncate = drv_truncate,
                    .length = drv_length,
                    .capacity = drv_capacity,
                    .vocab = d->cfg.vocab_size,
                    .eos_ids = d->cfg.eos_ids,
                    .n_eos = d->cfg.n_eos,
                    .hidden = d->emit_hidden ? drv_hidden : NULL,
                    .hidden_size = d->cfg.hidden_size};
    return RLX_OK;
}

// ---- keepalive ----

/* Whether stage i has been silent for a third of its idle timeout (so it is time to ping it). */
static int ping_due(const rlx_driver *d, uint32_t i, double now) {
    const drv_stage *s = &d->stages[i];
    return s->idle_ms && s->conn && now * 1000 - (double)atomic_load(&s->last_heard_ms) >= s->idle_ms / 3.0;
}

/* Keeps stage i from closing the connection as idle: a Ping, answered by an Ack echoing it. */
static rlx_status ping(rlx_driver *d, uint32_t i) {
    Rlx__Ping p = RLX__PING__INIT;
    p.nonce = ++d->stages[i].pings;
    Rlx__Envelope e = RLX__ENVELOPE__INIT, *r;
    e.body_case = RLX__ENVELOPE__BODY_PING;
    e.ping = &p;
    rlx_status rc = send_to(d, i, &e);
    if (rc == RLX_OK)
        rc = recv_from(d, i, d->timeout_ms, "a keepalive Ping", &r);
    if (rc != RLX_OK)
        return rc;
    if (r->body_case == RLX__ENVELOPE__BODY_ERROR)
        rc = error_reply(d, i, 1, "a keepalive Ping", r);
    else if (r->body_case != RLX__ENVELOPE__BODY_ACK || r->ack->step != p.nonce)
        rc = stage_fail(d, i, 1, RLX_E_FORMAT, "answered a keepalive Ping with %s", rlx__envelope_kind(r));
    rlx__envelope_free(r);
    return rc;
}

/* The lm's keeper: between calls, pings every stage due (a lost one is replaced as a forward
 * would replace it). A call in progress is traffic enough, so the keeper never waits for one. */
static void *keeper_thread(void *arg) {
    rlx_driver *d = arg;
    pthread_mutex_lock(&d->lm_mu);
    while (!d->keeper_stop) {
        struct timespec until = rlx__deadline_in(250);
        pthread_cond_timedwait(&d->keeper_cond, &d->lm_mu, &until);
        for (uint32_t i = 0; i < d->n_stages && !d->keeper_stop && check_usable(d) == RLX_OK; i++) {
            if (!ping_due(d, i, rlx__now_seconds()))
                continue;
            const rlx_status rc = ping(d, i);
            if (rc != RLX_OK && recover_session(d, i, rc) != RLX_OK)
                rlx__log(RLX_LOG_WARN, "%s", rlx_last_error());
        }
    }
    pthread_mutex_unlock(&d->lm_mu);
    return NULL;
}

static rlx_status start_keeper(rlx_driver *d) {
    uint32_t idle = 0;
    for (uint32_t i = 0; i < d->n_stages; i++)
        idle |= d->stages[i].idle_ms;
    if (!idle) /* stages that never close an idle connection */
        return RLX_OK;
    const int err = pthread_create(&d->keeper, NULL, keeper_thread, d);
    if (err)
        return rlx_error(RLX_E_NOMEM, "driver: cannot start the keepalive thread: %s", strerror(err));
    d->keeper_started = 1;
    return RLX_OK;
}

static void stop_keeper(rlx_driver *d) {
    if (!d->keeper_started)
        return;
    rlx_driver_stop_recovery(d); /* a recovery the keeper runs gives up rather than holding destroy */
    pthread_mutex_lock(&d->lm_mu);
    d->keeper_stop = 1;
    pthread_cond_broadcast(&d->keeper_cond);
    pthread_mutex_unlock(&d->lm_mu);
    pthread_join(d->keeper, NULL);
    d->keeper_started = 0;
}

// ---- slots: the pipelined steps ----

static void job_free(drv_job *j) {
    if (!j)
        return;
    rlx__envelope_free(j->reply);
    free(j->ids);
    free(j);
}

/* Stage i's part of job j, on stage i's thread: the step's rows (token ids into stage 0, the
 * previous stage's hidden rows into the others) out, the stage's rows back. */
static rlx_status run_job(rlx_driver *d, uint32_t i, drv_job *j, int *refused) {
    drv_stage *st = &d->stages[i];
    const int last = i + 1 == d->n_stages;
    const uint64_t step = ++st->rows_step;
    Rlx__Envelope req = RLX__ENVELOPE__INIT, *r = NULL;
    Rlx__Rows rows = RLX__ROWS__INIT;
    Rlx__CopySlot copy = RLX__COPY_SLOT__INIT;
    if (j->copy) {
        copy.step = step;
        copy.from_slot = j->from;
        copy.to_slot = j->to;
        copy.n_positions = j->n_copy;
        req.body_case = RLX__ENVELOPE__BODY_COPY_SLOT;
        req.copy_slot = &copy;
    } else {
        rows.step = step;
        rows.n_rows = j->n;
        rows.n_positions = rows.n_slots = j->n;
        rows.positions = j->positions;
        rows.slots = j->slots;
        if (last) {
            rows.n_out_rows = j->n_out;
            rows.out_rows = j->out_rows;
        }
        if (i == 0) {
            rows.width = 1;
            rows.dtype = RLX__DTYPE__DTYPE_I32;
            rows.data.len = (size_t)j->n * sizeof(int32_t);
            rows.data.data = (uint8_t *)j->ids;
        } else {
            rows.width = (uint32_t)d->cfg.hidden_size;
            rows.dtype = RLX__DTYPE__DTYPE_F32;
            rows.data = j->reply->rows->data;
        }
        req.body_case = RLX__ENVELOPE__BODY_ROWS;
        req.rows = &rows;
    }
    const double t0 = rlx__now_seconds();
    const char *what = j->copy ? "CopySlot" : "Rows";
    rlx_status rc = send_to(d, i, &req);
    if (rc == RLX_OK)
        rc = recv_from(d, i, j->copy ? d->timeout_ms : rows_wait_ms(d, j->n), what, &r);
    if (rc != RLX_OK)
        return rc;
    const uint32_t want_rows = last ? j->n_out : j->n;
    const uint32_t want_width = (uint32_t)(last ? d->cfg.vocab_size : d->cfg.hidden_size);
    if ((*refused = r->body_case == RLX__ENVELOPE__BODY_ERROR)) {
        rc = error_reply(d, i, 1, what, r);
    } else if (j->copy) {
        if (r->body_case != RLX__ENVELOPE__BODY_ACK || r->ack->step != step)
            rc = stage_fail(d, i, 1, RLX_E_FORMAT, "answered CopySlot step %llu with %s (step %llu)",
                            (unsigned long long)step, rlx__envelope_kind(r),
                            (unsigned long long)(r->body_case == RLX__ENVELOPE__BODY_ACK ? r->ack->step : 0));
    } else if (r->body_case != RLX__ENVELOPE__BODY_ROWS || r->rows->step != step) {
        rc = stage_fail(d, i, 1, RLX_E_FORMAT, "answered Rows step %llu with %s (step %llu)", (unsigned long long)step,
                        rlx__envelope_kind(r),
                        (unsigned long long)(r->body_case == RLX__ENVELOPE__BODY_ROWS ? r->rows->step : 0));
    } else if (r->rows->n_rows != want_rows || r->rows->width != want_width ||
               r->rows->dtype != RLX__DTYPE__DTYPE_F32 ||
               r->rows->data.len != (size_t)want_rows * want_width * sizeof(float)) {
        rc = stage_fail(d, i, 1, RLX_E_FORMAT,
                        "answered with %u rows of %u %s values in %zu bytes, expected %u rows of %u F32 values",
                        r->rows->n_rows, r->rows->width, rlx__dtype_name(r->rows->dtype), r->rows->data.len, want_rows,
                        want_width);
    }
    if (rc != RLX_OK) {
        rlx__envelope_free(r);
        return rc;
    }
    if (!j->copy)
        count_step(d, i, rlx__now_seconds() - t0);
    /* the previous stage's rows were this request's data: they are sent now */
    rlx__envelope_free(j->reply);
    j->reply = j->copy ? NULL : r;
    if (j->copy)
        rlx__envelope_free(r);
    return RLX_OK;
}

/* Brings replaced stage k up to date: every slot's positions that stage k had been sent before
 * the jobs still queued for it, fed again through stages 0..k (the others rewrite what they
 * hold with the same bits, their kernels being batch invariant). Per slot that is the run of
 * positions from 0 whose last writer came before those jobs: a later writer is itself queued
 * and rewrites the position, and nothing reads past a slot's run before it is rewritten. Called
 * with no job in flight; *bad names the stage that failed, UINT32_MAX when a stage refused. */
/* How many positions of slot s, from 0, were last written by jobs before ticket `before`. */
static size_t slot_run(const rlx_driver *d, uint32_t s, uint64_t before) {
    const uint64_t *tickets = d->log_tickets + (size_t)s * d->capacity;
    size_t p = 0;
    while (p < d->capacity && tickets[p] && tickets[p] < before)
        p++;
    return p;
}

static rlx_status replay_slots(rlx_driver *d, uint32_t k, uint32_t *bad) {
    pthread_mutex_lock(&d->pipe_mu);
    uint64_t before = d->next_ticket + 1;
    for (uint32_t q = 0; q <= k; q++)
        if (d->queue_head[q] && d->queue_head[q]->ticket < before)
            before = d->queue_head[q]->ticket;
    size_t total = 0;
    for (uint32_t s = 0; s < d->n_slots; s++)
        total += slot_run(d, s, before);
    int32_t *rows = total ? rlx__malloc(total * 3 * sizeof *rows) : NULL;
    size_t n = 0;
    for (uint32_t s = 0; rows && s < d->n_slots; s++)
        for (size_t p = 0, run = slot_run(d, s, before); p < run; p++, n++) {
            rows[n] = d->log_ids[(size_t)s * d->capacity + p];
            rows[total + n] = (int32_t)p;
            rows[2 * total + n] = (int32_t)s;
        }
    pthread_mutex_unlock(&d->pipe_mu);
    *bad = UINT32_MAX;
    if (total && !rows)
        return rlx_error(RLX_E_NOMEM, "driver: out of memory replaying %zu positions", total);
    rlx__log(RLX_LOG_INFO, "replaying %zu positions into stage %u", total, k);
    rlx_status rc = RLX_OK;
    for (size_t at = 0; rc == RLX_OK && at < total; at += REPLAY_CHUNK) {
        uint32_t m = total - at < REPLAY_CHUNK ? (uint32_t)(total - at) : REPLAY_CHUNK, last_row = m - 1;
        drv_job job = {.n = m,
                       .n_out = 1,
                       .ids = rows + at,
                       .positions = (uint32_t *)(rows + total + at),
                       .slots = (uint32_t *)(rows + 2 * total + at),
                       .out_rows = &last_row};
        for (uint32_t j = 0; rc == RLX_OK && j <= k; j++) {
            int refused = 0;
            if ((rc = run_job(d, j, &job, &refused)) != RLX_OK)
                *bad = refused ? UINT32_MAX : j;
        }
        rlx__envelope_free(job.reply);
    }
    free(rows);
    return rc;
}

/* Called by lost stage's thread with pipe_mu held (and returns with it held), the job that
 * failed back at the head of its queue: waits until no other thread is in the middle of a job
 * (each ends within its own deadline, and starts no other while this runs), replaces the stage,
 * replays the slots into it (a stage lost meanwhile is replaced the same way) and lets the
 * threads go on, within recovery_ms. `generation` is the stage's when the job began: a stage
 * another thread replaced since is not replaced again. */
static rlx_status recover_slots(rlx_driver *d, uint32_t lost, uint64_t generation) {
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", rlx_last_error());
    const double t0 = rlx__now_seconds(), deadline = t0 + d->recovery_ms / 1000.0;
    while (d->recovering && !d->broken) {
        struct timespec until = rlx__deadline_in(100);
        pthread_cond_timedwait(&d->recover_cond, &d->pipe_mu, &until);
    }
    if (d->broken)
        return rlx_error(RLX_E_PEER, "%s", d->broken_msg);
    if (d->stages[lost].generation != generation)
        return RLX_OK;
    d->recovering = 1;
    while (d->n_active > 0) {
        struct timespec until = rlx__deadline_in(100);
        pthread_cond_timedwait(&d->recover_cond, &d->pipe_mu, &until);
    }
    pthread_mutex_unlock(&d->pipe_mu);
    uint8_t need[d->n_stages], dead[d->n_stages];
    memset(need, 0, sizeof need);
    memset(dead, 0, sizeof dead);
    need[lost] = dead[lost] = 1;
    rlx_status rc = RLX_OK;
    for (;;) {
        uint32_t k = 0;
        while (k < d->n_stages && !need[k])
            k++;
        if (k == d->n_stages)
            break;
        if (closing(d)) {
            rc = rlx_error(RLX_E_PEER, "%s; the driver is closing", cause);
            break;
        }
        if (dead[k]) {
            rlx__log(RLX_LOG_WARN, "%s; replacing stage %u", cause, k);
            if ((rc = replace_stage(d, k, deadline)) != RLX_OK) {
                rlx_error(rc, "%s; not replaced within %u ms: %s", cause, d->recovery_ms, rlx_last_error());
                break;
            }
            dead[k] = 0;
            pthread_mutex_lock(&d->pipe_mu);
            d->stages[k].generation++;
            pthread_mutex_unlock(&d->pipe_mu);
        }
        uint32_t bad;
        if ((rc = replay_slots(d, k, &bad)) == RLX_OK) {
            need[k] = 0;
            continue;
        }
        if (bad == UINT32_MAX || rlx__now_seconds() >= deadline) {
            rlx_error(rc, "%s; replaying the streams into stage %u failed: %s", cause, k, rlx_last_error());
            break;
        }
        snprintf(cause, sizeof cause, "%s", rlx_last_error());
        need[bad] = dead[bad] = 1;
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rlx_last_error());
    const double took = rlx__now_seconds() - t0;
    if (rc == RLX_OK) {
        count_recovery(d, took);
        rlx__log(RLX_LOG_WARN, "stage %u (%s) replaced and its streams replayed in %.3f s", lost,
                 d->stages[lost].address, took);
    }
    pthread_mutex_lock(&d->pipe_mu);
    d->recovering = 0;
    if (rc != RLX_OK)
        set_broken(d, msg);
    pthread_cond_broadcast(&d->recover_cond);
    for (uint32_t q = 0; q <= d->n_stages; q++)
        pthread_cond_broadcast(&d->queue_cond[q]);
    return rc == RLX_OK ? RLX_OK : rlx_error(rc, "%s", msg);
}

typedef struct drv_thread {
    rlx_driver *d;
    uint32_t i;
} drv_thread;

static void push_job(rlx_driver *d, uint32_t q, drv_job *j) {
    j->next = NULL;
    if (d->queue_tail[q])
        d->queue_tail[q]->next = j;
    else
        d->queue_head[q] = j;
    d->queue_tail[q] = j;
    pthread_cond_signal(&d->queue_cond[q]);
}

static drv_job *pop_job(rlx_driver *d, uint32_t q) {
    drv_job *j = d->queue_head[q];
    if (j && !(d->queue_head[q] = j->next))
        d->queue_tail[q] = NULL;
    return j;
}

/* Stage i's thread: runs each job of queue i on its stage and hands it to queue i + 1. Once the
 * pipeline is down, jobs pass through unsent with its message. */
static void *stage_thread(void *arg) {
    const drv_thread *t = arg;
    rlx_driver *d = t->d;
    const uint32_t i = t->i;
    pthread_mutex_lock(&d->pipe_mu);
    for (;;) {
        /* a recovery holds every connection until it ends, even when the driver is closing */
        int due = 0;
        while (d->recovering || (!d->queue_head[i] && !d->pipe_stop)) {
            if ((due = !d->recovering && !d->broken && ping_due(d, i, rlx__now_seconds())))
                break;
            /* idle: woken by a job, the end of a recovery or destroy; the timeout bounds a lost
             * wake-up and how late a ping may be */
            struct timespec until = rlx__deadline_in(250);
            pthread_cond_timedwait(&d->queue_cond[i], &d->pipe_mu, &until);
        }
        if (due) { /* an idle connection is kept as a job would keep it, and lost the same way */
            const uint64_t generation = d->stages[i].generation;
            d->n_active++;
            pthread_mutex_unlock(&d->pipe_mu);
            const rlx_status rc = ping(d, i);
            pthread_mutex_lock(&d->pipe_mu);
            d->n_active--;
            pthread_cond_broadcast(&d->recover_cond);
            if (rc != RLX_OK && !d->pipe_stop && !d->broken &&
                (d->no_recovery || recover_slots(d, i, generation) != RLX_OK))
                set_broken(d, rlx_last_error());
            continue;
        }
        drv_job *j = pop_job(d, i);
        if (!j)
            break; /* stopping, nothing left */
        if (j->status == RLX_OK && (d->broken || d->pipe_stop)) {
            j->status = RLX_E_PEER;
            snprintf(j->message, sizeof j->message,
                     d->broken ? "the pipeline is down after an earlier failure: %s" : "%s",
                     d->broken ? d->broken_msg : "the pipeline driver is closing");
        }
        if (j->status == RLX_OK) {
            const uint64_t generation = d->stages[i].generation;
            d->n_active++;
            pthread_mutex_unlock(&d->pipe_mu);
            int refused = 0;
            rlx_status rc = run_job(d, i, j, &refused);
            pthread_mutex_lock(&d->pipe_mu);
            d->n_active--;
            pthread_cond_broadcast(&d->recover_cond);
            if (rc != RLX_OK && !refused && !d->no_recovery && !d->pipe_stop && !d->broken) {
                /* the job goes back to the head of its queue: the replaced stage runs it next */
                j->next = d->queue_head[i];
                d->queue_head[i] = j;
                if (!d->queue_tail[i])
                    d->queue_tail[i] = j;
                if (recover_slots(d, i, generation) == RLX_OK)
                    continue;
                j = pop_job(d, i);
            }
            if (rc != RLX_OK) {
                j->status = rc;
                snprintf(j->message, sizeof j->message, "%s", d->broken ? d->broken_msg : rlx_last_error());
                set_broken(d, j->message);
            }
        }
        push_job(d, i + 1, j);
    }
    pthread_mutex_unlock(&d->pipe_mu);
    return NULL;
}

static drv_thread *thread_args(rlx_driver *d) { return (drv_thread *)(d->threads + d->n_stages); }

static rlx_status start_threads(rlx_driver *d) {
    const uint32_t nq = d->n_stages + 1;
    /* the threads' arguments live after their handles, in the same block */
    d->threads = rlx__calloc(1, d->n_stages * (sizeof(pthread_t) + sizeof(drv_thread)));
    d->queue_cond = rlx__calloc(nq, sizeof *d->queue_cond);
    d->queue_head = rlx__calloc(nq, sizeof *d->queue_head);
    d->queue_tail = rlx__calloc(nq, sizeof *d->queue_tail);
    if (!d->threads || !d->queue_cond || !d->queue_head || !d->queue_tail)
        return rlx_error(RLX_E_NOMEM, "driver: out of memory");
    for (uint32_t q = 0; q < nq; q++)
        rlx__cond_init_monotonic(&d->queue_cond[q]);
    for (uint32_t i = 0; i < d->n_stages; i++) {
        drv_thread *t = &thread_args(d)[i];
        *t = (drv_thread){.d = d, .i = i};
        int err = pthread_create(&d->threads[i], NULL, stage_thread, t);
        if (err)
            return rlx_error(RLX_E_NOMEM, "driver: cannot start the thread of stage %u: %s", i, strerror(err));
        d->n_threads++;
    }
    return RLX_OK;
}

/* Joins the stage threads (each ends its job in flight within its deadline and passes the rest
 * on unsent) and frees every job. */
static void stop_threads(rlx_driver *d) {
    if (d->queue_cond) {
        pthread_mutex_lock(&d->pipe_mu);
        d->pipe_stop = 1;
        for (uint32_t q = 0; q <= d->n_stages; q++)
            pthread_cond_broadcast(&d->queue_cond[q]);
        pthread_mutex_unlock(&d->pipe_mu);
    }
    for (uint32_t i = 0; i < d->n_threads; i++)
        pthread_join(d->threads[i], NULL);
    d->n_threads = 0;
    if (d->queue_head)
        for (uint32_t q = 0; q <= d->n_stages; q++)
            for (drv_job *j; (j = pop_job(d, q));)
                job_free(j);
    job_free(d->handed);
    d->handed = NULL;
    if (d->queue_cond)
        for (uint32_t q = 0; q <= d->n_stages; q++)
            pthread_cond_destroy(&d->queue_cond[q]);
    free(d->threads);
    free(d->queue_cond);
    free(d->queue_head);
    free(d->queue_tail);
    d->threads = NULL;
    d->queue_cond = NULL;
    d->queue_head = d->queue_tail = NULL;
}

uint32_t rlx_driver_n_slots(const rlx_driver *d) { return d ? d->n_slots : 0; }
uint32_t rlx_driver_capacity(const rlx_driver *d) { return d ? d->capacity : 0; }

/* Queues job j (its bound set here) for stage 0, notes what it writes in the replay log and
 * returns its ticket. */
static uint64_t enqueue(rlx_driver *d, drv_job *j) {
    j->bound_ms = 0;
    for (uint32_t i = 0; i < d->n_stages; i++)
        j->bound_ms += j->copy ? d->timeout_ms : rows_wait_ms(d, j->n);
    pthread_mutex_lock(&d->pipe_mu);
    const uint64_t ticket = j->ticket = ++d->next_ticket;
    const size_t cap = d->capacity;
    if (j->copy) {
        memcpy(d->log_ids + j->to * cap, d->log_ids + j->from * cap, j->n_copy * sizeof *d->log_ids);
        for (uint32_t p = 0; p < j->n_copy; p++)
            d->log_tickets[j->to * cap + p] = ticket;
    } else {
        for (uint32_t r = 0; r < j->n; r++) {
            d->log_ids[j->slots[r] * cap + j->positions[r]] = j->ids[r];
            d->log_tickets[j->slots[r] * cap + j->positions[r]] = ticket;
        }
    }
    d->n_queued++;
    d->queued_ms += j->bound_ms;
    push_job(d, 0, j);
    pthread_mutex_unlock(&d->pipe_mu);
    return ticket;
}

static rlx_status slots_usable(rlx_driver *d, const char *what) {
    if (!d->n_slots || !d->n_threads)
        return rlx_error(RLX_E_INVALID, "%s: the driver was created without slots", what);
    return check_usable(d);
}

rlx_status rlx_driver_submit(rlx_driver *d, const rlx_driver_rows *rows, uint64_t *ticket) {
    if (!d || !rows || !ticket || !rows->ids || !rows->positions || !rows->slots || !rows->out_rows)
        return rlx_error(RLX_E_INVALID, "rlx_driver_submit: NULL argument");
    *ticket = 0;
    rlx_status rc = slots_usable(d, "rlx_driver_submit");
    if (rc != RLX_OK)
        return rc;
    const uint32_t n = rows->n, n_out = rows->n_out;
    const int64_t vocab = d->cfg.vocab_size, hidden = d->cfg.hidden_size;
    if (n == 0 || n_out == 0 || n_out > n)
        return rlx_error(RLX_E_INVALID, "a step of %u rows with %u logits rows (want 1 <= logits rows <= rows)", n,
                         n_out);
    if ((size_t)n * (size_t)hidden * sizeof(float) > MESSAGE_LIMIT - 4096 ||
        (size_t)n_out * (size_t)vocab * sizeof(float) > MESSAGE_LIMIT - 4096)
        return rlx_error(RLX_E_RANGE, "a step of %u rows makes a message over the transports' 1 GiB limit", n);
    for (uint32_t r = 0; r < n; r++) {
        if (rows->ids[r] < 0 || rows->ids[r] >= vocab)
            return rlx_error(RLX_E_RANGE, "row %u: token id %d is outside the vocabulary [0, %lld)", r, rows->ids[r],
                             (long long)vocab);
        if (rows->slots[r] < 0 || (uint32_t)rows->slots[r] >= d->n_slots)
            return rlx_error(RLX_E_RANGE, "row %u: slot %d is not one of the %u slots", r, rows->slots[r], d->n_slots);
        if (rows->positions[r] < 0 || (uint32_t)rows->positions[r] >= d->capacity)
            return rlx_error(RLX_E_RANGE, "row %u: position %d is outside a slot of %u positions", r,
                             rows->positions[r], d->capacity);
    }
    for (uint32_t k = 0; k < n_out; k++)
        if (rows->out_rows[k] < 0 || (uint32_t)rows->out_rows[k] >= n)
            return rlx_error(RLX_E_RANGE, "logits row %u names row %d of %u", k, rows->out_rows[k], n);
    drv_job *j = rlx__calloc(1, sizeof *j);
    /* ids, then positions, slots and out_rows, in one block */
    if (j)
        j->ids = rlx__malloc(((size_t)3 * n + n_out) * sizeof(int32_t));
    if (!j || !j->ids) {
        free(j);
        return rlx_error(RLX_E_NOMEM, "driver: out of memory for a step of %u rows", n);
    }
    j->n = n;
    j->n_out = n_out;
    j->positions = (uint32_t *)(j->ids + n);
    j->slots = j->positions + n;
    j->out_rows = j->slots + n;
    memcpy(j->ids, rows->ids, n * sizeof(int32_t));
    memcpy(j->positions, rows->positions, n * sizeof(int32_t));
    memcpy(j->slots, rows->slots, n * sizeof(int32_t));
    memcpy(j->out_rows, rows->out_rows, n_out * sizeof(int32_t));
    *ticket = enqueue(d, j);
    return RLX_OK;
}

rlx_status rlx_driver_copy_slot(rlx_driver *d, uint32_t from, uint32_t to, uint32_t n, uint64_t *ticket) {
    if (!d || !ticket)
        return rlx_error(RLX_E_INVALID, "rlx_driver_copy_slot: NULL argument");
    *ticket = 0;
    rlx_status rc = slots_usable(d, "rlx_driver_copy_slot");
    if (rc != RLX_OK)
        return rc;
    if (from >= d->n_slots || to >= d->n_slots || from == to || n == 0 || n > d->capacity)
        return rlx_error(RLX_E_RANGE, "copying %u positions from slot %u to slot %u of %u slots of %u positions", n,
                         from, to, d->n_slots, d->capacity);
    drv_job *j = rlx__calloc(1, sizeof *j);
    if (!j)
        return rlx_error(RLX_E_NOMEM, "driver: out of memory");
    j->copy = 1;
    j->from = from;
    j->to = to;
    j->n_copy = n;
    *ticket = enqueue(d, j);
    return RLX_OK;
}

rlx_status rlx_driver_wait(rlx_driver *d, uint64_t *ticket, const float **logits) {
    if (!d || !ticket || !logits)
        return rlx_error(RLX_E_INVALID, "rlx_driver_wait: NULL argument");
    *ticket = 0;
    *logits = NULL;
    if (!d->n_threads)
        return rlx_error(RLX_E_INVALID, "rlx_driver_wait: the driver was created without slots");
    const uint32_t q = d->n_stages;
    pthread_mutex_lock(&d->pipe_mu);
    job_free(d->handed);
    d->handed = NULL;
    if (d->n_queued == 0) {
        pthread_mutex_unlock(&d->pipe_mu);
        return rlx_error(RLX_E_INVALID, "rlx_driver_wait: no step is in flight");
    }
    /* every job ahead answers within its bound, so this one is late only if a thread is stuck */
    const uint64_t limit_ms = d->queued_ms + 5000 + (d->no_recovery ? 0 : d->recovery_ms);
    struct timespec until = rlx__deadline_in(limit_ms);
    int late = 0;
    while (!d->queue_head[q] && !late)
        late = pthread_cond_timedwait(&d->queue_cond[q], &d->pipe_mu, &until) == ETIMEDOUT;
    if (late) {
        rlx_error(RLX_E_TIMEOUT, "the pipeline gave no answer within %llu ms", (unsigned long long)limit_ms);
        set_broken(d, rlx_last_error());
        pthread_mutex_unlock(&d->pipe_mu);
        return RLX_E_TIMEOUT;
    }
    drv_job *j = pop_job(d, q);
    d->n_queued--;
    d->queued_ms -= j->bound_ms;
    rlx_status rc = j->status;
    if (rc != RLX_OK) {
        rlx_error(rc, "%s", j->message);
        job_free(j);
    } else {
        *ticket = j->ticket;
        *logits = j->copy ? NULL : (const float *)j->reply->rows->data.data;
        d->handed = j;
    }
    pthread_mutex_unlock(&d->pipe_mu);
    return rc;
}

void rlx_driver_destroy(rlx_driver *d) {
    if (!d)
        return;
    stop_keeper(d);
    stop_threads(d);
    if (!d->broken && d->net.t) {
        Rlx__EndSession end = RLX__END_SESSION__INIT;
        end.session_id = d->session_id;
        Rlx__Envelope e = RLX__ENVELOPE__INIT;
        e.body_case = RLX__ENVELOPE__BODY_END_SESSION;
        e.end_session = &end;
        int sent[d->n_stages ? d->n_stages : 1];
        for (uint32_t i = 0; i < d->n_stages; i++)
            sent[i] = d->stages[i].conn && d->stages[i].has_session &&
                      rlx__net_send(&d->net, d->stages[i].conn, &e, (int)d->timeout_ms, NULL) == RLX_OK;
        for (uint32_t i = 0; i < d->n_stages; i++) {
            Rlx__Envelope *r = NULL;
            if (sent[i] && rlx__net_recv(&d->net, d->stages[i].conn, &r, (int)d->timeout_ms, NULL) == RLX_OK)
                rlx__envelope_free(r);
        }
    }
    if (d->net.t)
        close_all(d);
    rlx__envelope_free(d->last);
    rlx__net_close(&d->net);
    rlx__auth_free(&d->auth);
    for (uint32_t i = 0; i < d->n_stages; i++) {
        free(d->stages[i].address);
        free(d->stages[i].source);
        for (uint32_t k = 0; k < d->stages[i].n_standby; k++)
            free(d->stages[i].standby[k]);
        free(d->stages[i].standby);
    }
    for (uint32_t k = 0; k < d->n_retired; k++)
        free(d->retired[k]);
    free(d->retired);
    free(d->history);
    free(d->log_ids);
    free(d->log_tickets);
    free(d->stages);
    pthread_mutex_destroy(&d->stats_mu);
    pthread_mutex_destroy(&d->pipe_mu);
    pthread_mutex_destroy(&d->lm_mu);
    pthread_cond_destroy(&d->recover_cond);
    pthread_cond_destroy(&d->keeper_cond);
    free(d);
}

const rlx_model_config *rlx_driver_config(const rlx_driver *d) { return &d->cfg; }
uint32_t rlx_driver_n_stages(const rlx_driver *d) { return d->n_stages; }

rlx_status rlx_driver_stage_info_get(const rlx_driver *d, uint32_t i, rlx_driver_stage_info *out) {
    if (!d || !out || i >= d->n_stages)
        return rlx_error(RLX_E_INVALID, "rlx_driver_stage_info_get: no stage %u", i);
    const drv_stage *s = &d->stages[i];
    /* a replaced stage's figures change on a driver thread (the strings lent stay valid) */
    pthread_mutex_t *mu = (pthread_mutex_t *)&d->stats_mu;
    pthread_mutex_lock(mu);
    *out = (rlx_driver_stage_info){.address = s->address,
                                   .layers = s->layers,
                                   .backend = s->backend,
                                   .rss_bytes = s->rss_bytes,
                                   .kv_capacity = s->kv_capacity};
    pthread_mutex_unlock(mu);
    return RLX_OK;
}

/* The figures are written under stats_mu by the driving thread; reading them through a const
 * driver still takes the lock, the one part of *d that is not read-only here. */
void rlx_driver_stats_get(const rlx_driver *d, rlx_driver_stats *out) {
    if (!d || !out)
        return;
    pthread_mutex_t *mu = (pthread_mutex_t *)&d->stats_mu;
    pthread_mutex_lock(mu);
    *out = d->stats;
    pthread_mutex_unlock(mu);
}

rlx_status rlx_driver_stage_stats_get(const rlx_driver *d, uint32_t i, rlx_driver_stage_stats *out) {
    if (!d || !out || i >= d->n_stages)
        return rlx_error(RLX_E_INVALID, "rlx_driver_stage_stats_get: no stage %u", i);
    pthread_mutex_t *mu = (pthread_mutex_t *)&d->stats_mu;
    pthread_mutex_lock(mu);
    *out = d->stages[i].stats;
    pthread_mutex_unlock(mu);
    return RLX_OK;
}
