/* The driver's messages to one stage (with the figures and the errors that name it), the
 * handshake, and replacing a lost stage on a new connection. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dist/driver_internal.h"
#include "util/alloc.h"

#include "util/clock.h"

rlx_status rlx__drv_stage_fail(rlx_driver *d, uint32_t i, int fatal, rlx_status code, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const drv_stage *s = &d->stages[i];
    rlx_error(code, "%sstage %u (%s): %s", s->source ? s->source : "", i, s->address, msg);
    if (fatal && !d->defer_failures)
        rlx__drv_mark_broken(d, rlx_last_error());
    return code;
}

rlx_status rlx__drv_send_to(rlx_driver *d, uint32_t i, const Rlx__Envelope *e) {
    size_t bytes = 0;
    rlx_status rc = rlx__net_send(&d->net, d->stages[i].conn, e, (int)d->timeout_ms, &bytes);
    if (rc != RLX_OK)
        return rlx__drv_stage_fail(d, i, 1, rc, "cannot send %s: %s", rlx__envelope_kind(e), rlx_last_error());
    pthread_mutex_lock(&d->stats_mu);
    d->stats.messages++;
    d->stats.bytes_sent += bytes;
    d->stages[i].stats.bytes_sent += bytes;
    pthread_mutex_unlock(&d->stats_mu);
    return RLX_OK;
}

/* Waits up to wait_ms for stage i's answer to a `what` request. */
rlx_status rlx__drv_recv_from(rlx_driver *d, uint32_t i, uint32_t wait_ms, const char *what, Rlx__Envelope **e) {
    size_t bytes = 0;
    double t0 = rlx__now_seconds();
    rlx_status rc = rlx__net_recv(&d->net, d->stages[i].conn, e, (int)wait_ms, &bytes);
    const double waited = rlx__now_seconds() - t0;
    pthread_mutex_lock(&d->stats_mu);
    d->stats.wait_seconds += waited;
    pthread_mutex_unlock(&d->stats_mu);
    if (rc == RLX_E_TIMEOUT && !d->stages[i].answered)
        return rlx__drv_stage_fail(d, i, 1, rc,
                                   "accepted the connection but never answered the handshake within %u ms (not "
                                   "an rlx stage, or a stage that is stuck or busy computing for another driver)",
                                   wait_ms);
    if (rc == RLX_E_TIMEOUT)
        return rlx__drv_stage_fail(d, i, 1, rc,
                                   "no answer to %s within %u ms (the stage is stalled, overloaded or "
                                   "unreachable)",
                                   what, wait_ms);
    if (rc == RLX_E_PEER)
        return rlx__drv_stage_fail(d, i, 1, rc, "connection lost waiting for the answer to %s: %s", what,
                                   rlx_last_error());
    if (rc != RLX_OK)
        return rlx__drv_stage_fail(d, i, 1, rc, "bad answer to %s: %s", what, rlx_last_error());
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
void rlx__drv_count_step(rlx_driver *d, uint32_t i, double seconds) {
    pthread_mutex_lock(&d->stats_mu);
    rlx_driver_stage_stats *s = &d->stages[i].stats;
    s->steps++;
    s->seconds += seconds;
    s->last_seconds = seconds;
    if (seconds > s->max_seconds)
        s->max_seconds = seconds;
    pthread_mutex_unlock(&d->stats_mu);
}

rlx_status rlx__drv_error_reply(rlx_driver *d, uint32_t i, int fatal, const char *what, const Rlx__Envelope *e) {
    const Rlx__Error *err = e->error;
    int code = err->code < 0 && err->code >= RLX_E_AUTH ? err->code : RLX_E_PEER;
    return rlx__drv_stage_fail(d, i, fatal, code, "refused %s: %s", what, err->message ? err->message : "(no message)");
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
        return rlx__drv_stage_fail(
            d, i, 1, RLX_E_AUTH,
            "answered without authenticating: it has no auth token, and this driver accepts only stages "
            "that prove they hold the deployment's (start the stage with the same --auth-token-file)");
    }
    const Rlx__AuthChallenge *ch = (*r)->auth_challenge;
    if (ch->nonce.len != RLX__AUTH_NONCE_BYTES ||
        !rlx__auth_proof_ok(&d->auth, RLX__AUTH_STAGE_LABEL, nonce, ch->nonce.data, ch->proof.data, ch->proof.len)) {
        rlx__envelope_free(*r);
        return rlx__drv_stage_fail(
            d, i, 1, RLX_E_AUTH,
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
    rlx_status rc = rlx__drv_send_to(d, i, &e);
    return rc == RLX_OK ? rlx__drv_recv_from(d, i, d->timeout_ms, "the handshake", r) : rc;
}

rlx_status rlx__drv_hello(rlx_driver *d, uint32_t i) {
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
        rc = rlx__drv_send_to(d, i, &e);
    if (rc == RLX_OK)
        rc = rlx__drv_recv_from(d, i, d->timeout_ms, "the handshake", &r);
    /* A stage that refuses says why (busy, a wrong token, a mismatch), and a TLS stage's alert
     * is named by the transport: a hang-up without a word has no cause to guess. */
    if (rc == RLX_E_PEER && !s->answered)
        return rlx_error(rc, "%s (before answering the handshake; the stage's log says why)", rlx_last_error());
    if (rc == RLX_OK && d->auth.token)
        rc = prove(d, i, nonce, &r);
    if (rc != RLX_OK)
        return rc;
    if (r->body_case == RLX__ENVELOPE__BODY_AUTH_CHALLENGE) {
        rc = rlx__drv_stage_fail(
            d, i, 1, RLX_E_AUTH,
            "requires an auth token: give this driver the deployment's token (--auth-token-file, or "
            "auth: token_file in the deployment file)");
    } else if (r->body_case == RLX__ENVELOPE__BODY_ERROR) {
        rc = rlx__drv_error_reply(d, i, 1, "the handshake", r);
    } else if (r->body_case != RLX__ENVELOPE__BODY_HELLO_REPLY) {
        rc = rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "answered the handshake with %s, not HelloReply",
                                 rlx__envelope_kind(r));
    } else {
        const Rlx__HelloReply *hr = r->hello_reply;
        if (hr->protocol_version != RLX_DIST_PROTOCOL_VERSION)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_UNSUPPORTED,
                                     "speaks protocol version %u, this driver speaks version %d", hr->protocol_version,
                                     RLX_DIST_PROTOCOL_VERSION);
        else if (!hr->model_id || strcmp(hr->model_id, d->model_id) != 0)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_INVALID,
                                     "serves another model (id %.16s..., the driver's is %.16s...)",
                                     hr->model_id ? hr->model_id : "", d->model_id);
        else if (hr->layer_start != s->layers.start || hr->layer_end != s->layers.end)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_INVALID, "serves layers [%u, %u), the driver expects %u-%u",
                                     hr->layer_start, hr->layer_end, s->layers.start, s->layers.end - 1);
        else if (hr->kv_capacity == 0)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "granted no KV cache capacity");
        else if (want_hidden && !hr->emit_hidden)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_UNSUPPORTED,
                                     "does not return hidden states, which the speculator needs "
                                     "(a stage older than this driver?)");
        else if (hr->n_slots != d->n_slots)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_UNSUPPORTED,
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

// ---- replacing a lost stage ----

/* The bound on a wait for one stage's answer to n rows. */
uint32_t rlx__drv_rows_wait_ms(const rlx_driver *d, uint32_t n) {
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
    rlx_status rc = rlx__drv_hello(d, i);
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

/* Stage i listens at `address` now. rlx_driver_stage_info_of hands the old string out to other
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

/* Replaces lost stage i before `deadline` (rlx__now_seconds): a launched stage is restarted
 * through d->restart (which says RLX_E_UNSUPPORTED for a stage it did not start); otherwise its
 * address and then its standby addresses are tried in turn until one answers the handshake (a
 * supervisor may restart the stage where it was). The caller holds every connection (no stage
 * thread runs a job). */
rlx_status rlx__drv_replace_stage(rlx_driver *d, uint32_t i, double deadline) {
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
        if (left <= 0 || rlx__drv_closing(d))
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
