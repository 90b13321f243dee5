/* Recovery of the slots: a lost stage replaced while the stage threads stand still, and the
 * slots' logged positions replayed into it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/driver_internal.h"
#include "util/alloc.h"
#include "util/log.h"

#include "util/clock.h"

/* How many positions of slot s, from 0, were last written by jobs before ticket `before`. A job
 * marks the position after its last row of a slot as unwritten (rlx_driver_submit), so the run
 * ends where the slot ended after the last of those jobs, never in older rows beyond. */
static size_t slot_run(const rlx_driver *d, uint32_t s, uint64_t before) {
    const uint64_t *tickets = d->log_tickets + (size_t)s * d->capacity;
    size_t p = 0;
    while (p < d->capacity && tickets[p] && tickets[p] < before)
        p++;
    return p;
}

/* The ticket of the first job stage u has not run, with no job in flight: the oldest in the
 * queues of stages 0..u (each holds its jobs in ticket order). pipe_mu held. */
static uint64_t first_unrun(const rlx_driver *d, uint32_t u) {
    uint64_t before = d->next_ticket + 1;
    for (uint32_t q = 0; q <= u; q++)
        if (d->queue_head[q] && d->queue_head[q]->ticket < before)
            before = d->queue_head[q]->ticket;
    return before;
}

/* Sends rows [0, n) of the replay (ids, then positions, then slots, `total` each) through
 * stages 0..u in steps of REPLAY_CHUNK; *bad names the stage that failed. */
static rlx_status replay_through(rlx_driver *d, uint32_t u, int32_t *rows, size_t total, size_t n, uint32_t *bad) {
    rlx_status rc = RLX_OK;
    for (size_t at = 0; rc == RLX_OK && at < n; at += REPLAY_CHUNK) {
        uint32_t m = n - at < REPLAY_CHUNK ? (uint32_t)(n - at) : REPLAY_CHUNK, last_row = m - 1;
        drv_job job = {.n = m,
                       .n_out = 1,
                       .ids = rows + at,
                       .positions = (uint32_t *)(rows + total + at),
                       .slots = (uint32_t *)(rows + 2 * total + at),
                       .out_rows = &last_row};
        for (uint32_t j = 0; rc == RLX_OK && j <= u; j++) {
            int refused = 0;
            if ((rc = rlx__drv_run_job(d, j, &job, &refused)) != RLX_OK)
                *bad = refused ? UINT32_MAX : j;
        }
        rlx__envelope_free(job.reply);
    }
    return rc;
}

/* Brings replaced stage k up to date, and every stage before it back to where it was. Stage k
 * gets every slot's positions it had been sent before the jobs still queued for it: per slot
 * the run of positions from 0 whose last writer came before those jobs (a later writer is
 * itself queued and rewrites the position, and nothing reads past a slot's run before it is
 * rewritten). They go through stages 0..k, as stage k takes its inputs from stage k - 1. A
 * replay from position 0 restarts a slot's recurrent state, so each stage u < k is then fed the
 * positions of its own longer run (the jobs it had run that stage k had not yet), through
 * stages 0..u, until its state is where its next job expects it; the KV rows all rewrite hold
 * the same bits, the kernels being batch invariant. Feeding stage k alone would need the hidden
 * rows of every position logged, and snapshots of the earlier stages' states a protocol
 * message; this needs neither. Called with no job in flight; *bad names the stage that
 * failed, UINT32_MAX when a stage refused. */
static rlx_status replay_slots(rlx_driver *d, uint32_t k, uint32_t *bad) {
    *bad = UINT32_MAX;
    const uint32_t n_slots = d->n_slots;
    /* run[u][s]: slot s's run for stage u; rows u of the replay: [run[u + 1][s], run[u][s]) */
    size_t *run = rlx__calloc((size_t)(k + 2) * n_slots, sizeof *run);
    if (!run)
        return rlx_error(RLX_E_NOMEM, "driver: out of memory replaying into stage %u", k);
    size_t count[k + 1], total = 0;
    pthread_mutex_lock(&d->pipe_mu);
    for (uint32_t u = 0; u <= k; u++) {
        const uint64_t before = first_unrun(d, u);
        for (uint32_t s = 0; s < n_slots; s++)
            run[(size_t)u * n_slots + s] = slot_run(d, s, before);
    }
    for (uint32_t u = 0; u <= k; u++) {
        count[u] = 0;
        for (uint32_t s = 0; s < n_slots; s++)
            count[u] += run[(size_t)u * n_slots + s] - run[(size_t)(u + 1) * n_slots + s];
        total += count[u];
    }
    int32_t *rows = total ? rlx__malloc(total * 3 * sizeof *rows) : NULL;
    size_t n = 0; /* stage k's rows first, then those of stages k - 1 down to 0 */
    for (uint32_t u = k + 1; rows && u-- > 0;)
        for (uint32_t s = 0; s < n_slots; s++)
            for (size_t p = run[(size_t)(u + 1) * n_slots + s]; p < run[(size_t)u * n_slots + s]; p++, n++) {
                rows[n] = d->log_ids[(size_t)s * d->capacity + p];
                rows[total + n] = (int32_t)p;
                rows[2 * total + n] = (int32_t)s;
            }
    pthread_mutex_unlock(&d->pipe_mu);
    free(run);
    if (total && !rows)
        return rlx_error(RLX_E_NOMEM, "driver: out of memory replaying %zu positions", total);
    rlx__log(RLX_LOG_INFO, "replaying %zu positions into stage %u (%zu into the stages before it)", count[k], k,
             total - count[k]);
    rlx_status rc = RLX_OK;
    size_t at = 0; /* stage u's rows start there in each of the three arrays */
    for (uint32_t u = k + 1; rc == RLX_OK && u-- > 0;) {
        rc = replay_through(d, u, rows + at, total, count[u], bad);
        at += count[u];
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
rlx_status rlx__drv_recover_slots(rlx_driver *d, uint32_t lost, uint64_t generation) {
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
        if (rlx__drv_closing(d)) {
            rc = rlx_error(RLX_E_PEER, "%s; the driver is closing", cause);
            break;
        }
        if (dead[k]) {
            rlx__log(RLX_LOG_WARN, "%s; replacing stage %u", cause, k);
            if ((rc = rlx__drv_replace_stage(d, k, deadline)) != RLX_OK) {
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
        rlx__drv_count_recovery(d, took);
        rlx__log(RLX_LOG_WARN, "stage %u (%s) replaced and its streams replayed in %.3f s", lost,
                 d->stages[lost].address, took);
    }
    pthread_mutex_lock(&d->pipe_mu);
    d->recovering = 0;
    if (rc != RLX_OK)
        rlx__drv_set_broken(d, msg);
    pthread_cond_broadcast(&d->recover_cond);
    for (uint32_t q = 0; q <= d->n_stages; q++)
        pthread_cond_broadcast(&d->queue_cond[q]);
    return rc == RLX_OK ? RLX_OK : rlx_error(rc, "%s", msg);
}
