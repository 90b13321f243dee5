/* The pipeline driver: connections to the stages, the handshake, and an rlx_lm whose forward
 * sends rows through the stages in order. Any transport failure or protocol violation makes the
 * driver unusable (the stages no longer agree on the session) and closes every connection, so
 * the surviving stages free the session at once. This file creates and destroys it, keeps its
 * broken state and hands out its figures; driver_internal.h says where the rest lives. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "dist/driver_internal.h"
#include "model/arch.h"
#include "model/model_internal.h"
#include "util/alloc.h"

#include "util/clock.h"

rlx_driver_options rlx_driver_options_default(void) { return (rlx_driver_options){0}; }

static void close_all(rlx_driver *d) {
    for (uint32_t i = 0; i < d->n_stages; i++)
        if (d->stages[i].conn) {
            d->net.t->conn_close(d->net.self, d->stages[i].conn);
            d->stages[i].conn = NULL;
            d->stages[i].has_session = 0;
        }
}

/* Marks the driver unusable, keeping the first reason; 1 when this was the first. pipe_mu held. */
int rlx__drv_set_broken(rlx_driver *d, const char *why) {
    if (d->broken)
        return 0;
    d->broken = 1;
    snprintf(d->broken_msg, sizeof d->broken_msg, "%s", why);
    return 1;
}

/* The driver becomes unusable (the first message says why) and, unless stage threads still use
 * the connections (they close at destroy), hangs up on every stage. */
void rlx__drv_mark_broken(rlx_driver *d, const char *why) {
    pthread_mutex_lock(&d->pipe_mu);
    const int first = rlx__drv_set_broken(d, why);
    pthread_mutex_unlock(&d->pipe_mu);
    if (first && !d->n_threads)
        close_all(d);
}

/* A lost stage replaced and its streams replayed in `seconds`. */
void rlx__drv_count_recovery(rlx_driver *d, double seconds) {
    pthread_mutex_lock(&d->stats_mu);
    d->stats.recoveries++;
    d->stats.recovery_seconds += seconds;
    d->stats.last_recovery_seconds = seconds;
    pthread_mutex_unlock(&d->stats_mu);
}

rlx_status rlx__drv_check_usable(rlx_driver *d) {
    pthread_mutex_lock(&d->pipe_mu);
    rlx_status rc =
        d->broken ? rlx_error(RLX_E_PEER, "the pipeline is down after an earlier failure: %s", d->broken_msg) : RLX_OK;
    pthread_mutex_unlock(&d->pipe_mu);
    return rc;
}

int rlx__driver_recurrent(const rlx_driver *d) { return d->recurrent; }

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
        rc = rlx__model_config_and_id(model_dir, &d->cfg, d->model_id, &d->recurrent);
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
                rc = rlx__drv_stage_fail(d, i, 1, crc,
                                         "connection refused: no rlx stage is listening there (retried until "
                                         "the connect timeout, %u ms)",
                                         d->connect_ms);
            else
                rc =
                    rlx__drv_stage_fail(d, i, 1, crc, "%s", *rlx_last_error() ? rlx_last_error() : rlx_status_str(crc));
        } else {
            rc = rlx__drv_hello(d, i);
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
    if (rc != RLX_OK || (rc = d->n_slots ? rlx__drv_start_threads(d) : rlx__drv_start_keeper(d)) != RLX_OK) {
        rlx_driver_destroy(d);
        return rc;
    }
    *out = d;
    return RLX_OK;
}

int rlx__drv_closing(rlx_driver *d) {
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

uint32_t rlx_driver_n_slots(const rlx_driver *d) { return d ? d->n_slots : 0; }
uint32_t rlx_driver_capacity(const rlx_driver *d) { return d ? d->capacity : 0; }

void rlx_driver_destroy(rlx_driver *d) {
    if (!d)
        return;
    rlx__drv_stop_keeper(d);
    rlx__drv_stop_threads(d);
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

rlx_status rlx_driver_stage_info_of(const rlx_driver *d, uint32_t i, rlx_driver_stage_info *out) {
    if (!d || !out || i >= d->n_stages)
        return rlx_error(RLX_E_INVALID, "rlx_driver_stage_info_of: no stage %u", i);
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
void rlx_driver_stats_of(const rlx_driver *d, rlx_driver_stats *out) {
    if (!d || !out)
        return;
    pthread_mutex_t *mu = (pthread_mutex_t *)&d->stats_mu;
    pthread_mutex_lock(mu);
    *out = d->stats;
    pthread_mutex_unlock(mu);
}

rlx_status rlx_driver_stage_stats_of(const rlx_driver *d, uint32_t i, rlx_driver_stage_stats *out) {
    if (!d || !out || i >= d->n_stages)
        return rlx_error(RLX_E_INVALID, "rlx_driver_stage_stats_of: no stage %u", i);
    pthread_mutex_t *mu = (pthread_mutex_t *)&d->stats_mu;
    pthread_mutex_lock(mu);
    *out = d->stages[i].stats;
    pthread_mutex_unlock(mu);
    return RLX_OK;
}
