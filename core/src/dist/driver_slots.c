/* The driver's slots: pipelined steps and copies, each a job passed from stage thread to stage
 * thread through one queue per stage, submitted and waited for in order. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/driver_internal.h"
#include "util/alloc.h"

#include "util/clock.h"

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
rlx_status rlx__drv_run_job(rlx_driver *d, uint32_t i, drv_job *j, int *refused) {
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
    rlx_status rc = rlx__drv_send_to(d, i, &req);
    if (rc == RLX_OK)
        rc = rlx__drv_recv_from(d, i, j->copy ? d->timeout_ms : rlx__drv_rows_wait_ms(d, j->n), what, &r);
    if (rc != RLX_OK)
        return rc;
    const uint32_t want_rows = last ? j->n_out : j->n;
    const uint32_t want_width = (uint32_t)(last ? d->cfg.vocab_size : d->cfg.hidden_size);
    if ((*refused = r->body_case == RLX__ENVELOPE__BODY_ERROR)) {
        rc = rlx__drv_error_reply(d, i, 1, what, r);
    } else if (j->copy) {
        if (r->body_case != RLX__ENVELOPE__BODY_ACK || r->ack->step != step)
            rc = rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "answered CopySlot step %llu with %s (step %llu)",
                                     (unsigned long long)step, rlx__envelope_kind(r),
                                     (unsigned long long)(r->body_case == RLX__ENVELOPE__BODY_ACK ? r->ack->step : 0));
    } else if (r->body_case != RLX__ENVELOPE__BODY_ROWS || r->rows->step != step) {
        rc = rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "answered Rows step %llu with %s (step %llu)",
                                 (unsigned long long)step, rlx__envelope_kind(r),
                                 (unsigned long long)(r->body_case == RLX__ENVELOPE__BODY_ROWS ? r->rows->step : 0));
    } else if (r->rows->n_rows != want_rows || r->rows->width != want_width ||
               r->rows->dtype != RLX__DTYPE__DTYPE_F32 ||
               r->rows->data.len != (size_t)want_rows * want_width * sizeof(float)) {
        rc = rlx__drv_stage_fail(
            d, i, 1, RLX_E_FORMAT,
            "answered with %u rows of %u %s values in %zu bytes, expected %u rows of %u F32 values", r->rows->n_rows,
            r->rows->width, rlx__dtype_name(r->rows->dtype), r->rows->data.len, want_rows, want_width);
    }
    if (rc != RLX_OK) {
        rlx__envelope_free(r);
        return rc;
    }
    if (!j->copy)
        rlx__drv_count_step(d, i, rlx__now_seconds() - t0);
    /* the previous stage's rows were this request's data: they are sent now */
    rlx__envelope_free(j->reply);
    j->reply = j->copy ? NULL : r;
    if (j->copy)
        rlx__envelope_free(r);
    return RLX_OK;
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
            if ((due = !d->recovering && !d->broken && rlx__drv_ping_due(d, i, rlx__now_seconds())))
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
            const rlx_status rc = rlx__drv_ping(d, i);
            pthread_mutex_lock(&d->pipe_mu);
            d->n_active--;
            pthread_cond_broadcast(&d->recover_cond);
            if (rc != RLX_OK && !d->pipe_stop && !d->broken &&
                (d->no_recovery || rlx__drv_recover_slots(d, i, generation) != RLX_OK))
                rlx__drv_set_broken(d, rlx_last_error());
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
            rlx_status rc = rlx__drv_run_job(d, i, j, &refused);
            pthread_mutex_lock(&d->pipe_mu);
            d->n_active--;
            pthread_cond_broadcast(&d->recover_cond);
            if (rc != RLX_OK && !refused && !d->no_recovery && !d->pipe_stop && !d->broken) {
                /* the job goes back to the head of its queue: the replaced stage runs it next */
                j->next = d->queue_head[i];
                d->queue_head[i] = j;
                if (!d->queue_tail[i])
                    d->queue_tail[i] = j;
                if (rlx__drv_recover_slots(d, i, generation) == RLX_OK)
                    continue;
                j = pop_job(d, i);
            }
            if (rc != RLX_OK) {
                j->status = rc;
                snprintf(j->message, sizeof j->message, "%s", d->broken ? d->broken_msg : rlx_last_error());
                rlx__drv_set_broken(d, j->message);
            }
        }
        push_job(d, i + 1, j);
    }
    pthread_mutex_unlock(&d->pipe_mu);
    return NULL;
}

static drv_thread *thread_args(rlx_driver *d) { return (drv_thread *)(d->threads + d->n_stages); }

rlx_status rlx__drv_start_threads(rlx_driver *d) {
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
void rlx__drv_stop_threads(rlx_driver *d) {
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

/* Queues job j (its bound set here) for stage 0, notes what it writes in the replay log and
 * returns its ticket. */
static uint64_t enqueue(rlx_driver *d, drv_job *j) {
    j->bound_ms = 0;
    for (uint32_t i = 0; i < d->n_stages; i++)
        j->bound_ms += j->copy ? d->timeout_ms : rlx__drv_rows_wait_ms(d, j->n);
    pthread_mutex_lock(&d->pipe_mu);
    const uint64_t ticket = j->ticket = ++d->next_ticket;
    const size_t cap = d->capacity;
    /* the slot ends after what the job writes: a replay must not feed a recurrent state the
     * rows an earlier, longer sequence left beyond (a KV row there is only never read) */
    if (j->copy) {
        memcpy(d->log_ids + j->to * cap, d->log_ids + j->from * cap, j->n_copy * sizeof *d->log_ids);
        for (uint32_t p = 0; p < j->n_copy; p++)
            d->log_tickets[j->to * cap + p] = ticket;
        if (j->n_copy < cap)
            d->log_tickets[j->to * cap + j->n_copy] = 0;
    } else {
        for (uint32_t r = 0; r < j->n; r++) {
            d->log_ids[j->slots[r] * cap + j->positions[r]] = j->ids[r];
            d->log_tickets[j->slots[r] * cap + j->positions[r]] = ticket;
        }
        for (uint32_t r = 0; r < j->n; r++) {
            const size_t next = j->slots[r] * cap + j->positions[r] + 1;
            if (j->positions[r] + 1 < cap && d->log_tickets[next] != ticket)
                d->log_tickets[next] = 0;
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
    return rlx__drv_check_usable(d);
}

/* Whether the rows of each slot are at consecutive positions: the last then ends the slot
 * (rlx/dist.h), and the replay log records no gap a stage would not hold. */
static rlx_status consecutive_rows(const rlx_driver *d, const rlx_driver_rows *rows) {
    int32_t *next = rlx__malloc(d->n_slots * sizeof *next); /* the position a slot's next row takes */
    if (!next)
        return rlx_error(RLX_E_NOMEM, "driver: out of memory for a step of %u rows", rows->n);
    for (uint32_t s = 0; s < d->n_slots; s++)
        next[s] = -1;
    rlx_status rc = RLX_OK;
    for (uint32_t r = 0; r < rows->n && rc == RLX_OK; r++) {
        const int32_t s = rows->slots[r], p = rows->positions[r];
        if (next[s] >= 0 && p != next[s])
            rc = rlx_error(RLX_E_INVALID,
                           "row %u: position %d of slot %d follows its position %d in the step (a "
                           "slot's rows are consecutive positions)",
                           r, p, s, next[s] - 1);
        next[s] = p + 1;
    }
    free(next);
    return rc;
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
    if ((rc = consecutive_rows(d, rows)) != RLX_OK)
        return rc;
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
        rlx__drv_set_broken(d, rlx_last_error());
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
