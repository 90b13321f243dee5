/* Keepalive: pings that keep a stage from closing an idle connection, and the lm's thread that
 * sends them between calls (the slots' stage threads ping their own stage). */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "dist/driver_internal.h"
#include "util/log.h"

#include "util/clock.h"

// ---- keepalive ----

/* Whether stage i has been silent for a third of its idle timeout (so it is time to ping it). */
int rlx__drv_ping_due(const rlx_driver *d, uint32_t i, double now) {
    const drv_stage *s = &d->stages[i];
    return s->idle_ms && s->conn && now * 1000 - (double)atomic_load(&s->last_heard_ms) >= s->idle_ms / 3.0;
}

/* Keeps stage i from closing the connection as idle: a Ping, answered by an Ack echoing it. */
rlx_status rlx__drv_ping(rlx_driver *d, uint32_t i) {
    Rlx__Ping p = RLX__PING__INIT;
    p.nonce = ++d->stages[i].pings;
    Rlx__Envelope e = RLX__ENVELOPE__INIT, *r;
    e.body_case = RLX__ENVELOPE__BODY_PING;
    e.ping = &p;
    rlx_status rc = rlx__drv_send_to(d, i, &e);
    if (rc == RLX_OK)
        rc = rlx__drv_recv_from(d, i, d->timeout_ms, "a keepalive Ping", &r);
    if (rc != RLX_OK)
        return rc;
    if (r->body_case == RLX__ENVELOPE__BODY_ERROR)
        rc = rlx__drv_error_reply(d, i, 1, "a keepalive Ping", r);
    else if (r->body_case != RLX__ENVELOPE__BODY_ACK || r->ack->step != p.nonce)
        rc = rlx__drv_stage_fail(d, i, 1, RLX_E_FORMAT, "answered a keepalive Ping with %s", rlx__envelope_kind(r));
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
        for (uint32_t i = 0; i < d->n_stages && !d->keeper_stop && rlx__drv_check_usable(d) == RLX_OK; i++) {
            if (!rlx__drv_ping_due(d, i, rlx__now_seconds()))
                continue;
            const rlx_status rc = rlx__drv_ping(d, i);
            if (rc != RLX_OK && rlx__drv_recover_session(d, i, rc) != RLX_OK)
                rlx__log(RLX_LOG_WARN, "%s", rlx_last_error());
        }
    }
    pthread_mutex_unlock(&d->lm_mu);
    return NULL;
}

rlx_status rlx__drv_start_keeper(rlx_driver *d) {
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

void rlx__drv_stop_keeper(rlx_driver *d) {
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
