/* The driver's sequential session: an rlx_lm whose forward sends rows through every stage in
 * turn, and its recovery (a lost stage replaced and the session's ids replayed). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dist/driver_internal.h"
#include "util/log.h"

#include "util/clock.h"

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
            rc = rlx__drv_send_to(d, i, &e);
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
        rlx_status rc = rlx__drv_recv_from(d, i, d->timeout_ms, "Truncate", &r);
        if (rc == RLX_OK) {
            if ((refusal = r->body_case == RLX__ENVELOPE__BODY_ERROR))
                rc = rlx__drv_error_reply(d, i, 1, "Truncate", r);
            else if (r->body_case != RLX__ENVELOPE__BODY_ACK || r->ack->session_id != d->session_id ||
                     r->ack->step != step)
                rc = rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "answered Truncate with %s for another session or step",
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
        return rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "answered Activations with %s", rlx__envelope_kind(r));
    const Rlx__Activations *a = r->activations;
    if (a->session_id != d->session_id || a->step != step)
        return rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT,
                                   "answered step %llu of session %016llx with step %llu of session "
                                   "%016llx",
                                   (unsigned long long)step, (unsigned long long)d->session_id,
                                   (unsigned long long)a->step, (unsigned long long)a->session_id);
    if (a->n_positions != rows || a->width != width || a->dtype != RLX__DTYPE__DTYPE_F32 ||
        a->data.len != (size_t)rows * width * sizeof(float))
        return rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT,
                                   "answered with %u rows of %u %s values in %zu bytes, expected %u rows "
                                   "of %u F32 values",
                                   a->n_positions, a->width, rlx__dtype_name(a->dtype), a->data.len, rows, width);
    size_t hidden_bytes = (size_t)hidden_rows * (size_t)d->cfg.hidden_size * sizeof(float);
    if (a->hidden.len != hidden_bytes)
        return rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT,
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
    const uint32_t wait = rlx__drv_rows_wait_ms(d, n);
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
        rlx_status rc = rlx__drv_send_to(d, i, &req);
        if (rc == RLX_OK)
            rc = rlx__drv_recv_from(d, i, wait, "Activations", &r);
        if (rc == RLX_OK && r->body_case == RLX__ENVELOPE__BODY_ACTIVATIONS)
            rlx__drv_count_step(d, i, rlx__now_seconds() - t0);
        if (rc == RLX_OK && r->body_case == RLX__ENVELOPE__BODY_ERROR) {
            *refused = 1;
            rc = rlx__drv_error_reply(d, i, 0, "Activations", r);
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

/* Stage `lost` failed (the error is the last one) while d->length positions are the session:
 * replaces it and brings every stage back to those positions (the live ones truncated to none,
 * then all fed the session's ids again), so the session goes on as if nothing happened. A
 * stage lost meanwhile is replaced the same way. Without recovery, or when no replacement
 * answers within recovery_ms, the driver is broken with a message naming the stage. */
rlx_status rlx__drv_recover_session(rlx_driver *d, uint32_t lost, rlx_status why) {
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", rlx_last_error());
    if (d->no_recovery) {
        rlx__drv_mark_broken(d, cause);
        return rlx_error(why, "%s", cause);
    }
    const double t0 = rlx__now_seconds(), deadline = t0 + d->recovery_ms / 1000.0;
    rlx_status rc = RLX_OK;
    for (;;) {
        if (rlx__drv_closing(d)) {
            rc = rlx_error(RLX_E_PEER, "%s; the driver is closing", cause);
            break;
        }
        rlx__log(RLX_LOG_WARN, "%s; replacing stage %u and replaying %u positions", cause, lost, d->length);
        if ((rc = rlx__drv_replace_stage(d, lost, deadline)) != RLX_OK) {
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
        rlx__drv_mark_broken(d, msg);
        return rlx_error(rc, "%s", msg);
    }
    const double took = rlx__now_seconds() - t0;
    rlx__drv_count_recovery(d, took);
    rlx__log(RLX_LOG_WARN, "stage %u (%s) replaced and %u positions replayed in %.3f s", lost, d->stages[lost].address,
             d->length, took);
    return RLX_OK;
}

static rlx_status forward_locked(rlx_driver *d, const int32_t *ids, uint32_t n, int all_rows, const float **logits) {
    if (!ids || !logits || n == 0)
        return rlx_error(RLX_E_INVALID, "pipeline forward: NULL input or no positions");
    *logits = NULL;
    rlx_status rc = rlx__drv_check_usable(d);
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
                rlx__drv_mark_broken(d, rlx_last_error());
                return trc;
            }
            if (trc != RLX_OK && (trc = rlx__drv_recover_session(d, f2, trc)) != RLX_OK)
                return trc;
            return rlx_error(rc, "%s", msg);
        }
        if (attempt > d->n_stages) {
            rlx__drv_mark_broken(d, rlx_last_error());
            return rc;
        }
        if ((rc = rlx__drv_recover_session(d, failed, rc)) != RLX_OK)
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
    rlx_status rc = rlx__drv_check_usable(d);
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
        if (rc != RLX_OK && (rc = rlx__drv_recover_session(d, failed, rc)) != RLX_OK)
            d->length = was;
        return rc;
    }
    rlx__drv_mark_broken(d, rlx_last_error());
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
