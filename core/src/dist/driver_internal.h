/* The pipeline driver's state, shared by its sources: driver.c (create, destroy, the figures and
 * the broken state), driver_conn.c (messages to one stage, the handshake, replacing a lost
 * stage), driver_session.c (the sequential rlx_lm and its recovery), driver_keepalive.c (the
 * lm's pings between calls), driver_slots.c (the pipelined jobs, one thread per stage) and
 * driver_replay.c (rebuilding a replaced stage's slots). */
#ifndef RLX_DIST_DRIVER_INTERNAL_H
#define RLX_DIST_DRIVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/dist_internal.h"
#include "rlx/dist.h"

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
    int recurrent;   /* the model has linear-attention layers (rlx__driver_recurrent) */
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

/* Positions a replay sends through the stages per step. */
#define REPLAY_CHUNK 256

// ---- driver.c ----
int rlx__drv_set_broken(rlx_driver *d, const char *why);
void rlx__drv_mark_broken(rlx_driver *d, const char *why);
void rlx__drv_count_recovery(rlx_driver *d, double seconds);
rlx_status rlx__drv_check_usable(rlx_driver *d);
int rlx__drv_closing(rlx_driver *d);

// ---- driver_conn.c ----
/* Records "[source: ]stage i (address): ..." as the error and returns code. With `fatal`, the
 * driver becomes unusable and hangs up on every stage, unless the caller may still replace the
 * stage (defer_failures) and decides itself. */
rlx_status rlx__drv_stage_fail(rlx_driver *d, uint32_t i, int fatal, rlx_status code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
rlx_status rlx__drv_send_to(rlx_driver *d, uint32_t i, const Rlx__Envelope *e);
rlx_status rlx__drv_recv_from(rlx_driver *d, uint32_t i, uint32_t wait_ms, const char *what, Rlx__Envelope **e);
void rlx__drv_count_step(rlx_driver *d, uint32_t i, double seconds);
rlx_status rlx__drv_error_reply(rlx_driver *d, uint32_t i, int fatal, const char *what, const Rlx__Envelope *e);
rlx_status rlx__drv_hello(rlx_driver *d, uint32_t i);
uint32_t rlx__drv_rows_wait_ms(const rlx_driver *d, uint32_t n);
rlx_status rlx__drv_replace_stage(rlx_driver *d, uint32_t i, double deadline);

// ---- driver_session.c ----
rlx_status rlx__drv_recover_session(rlx_driver *d, uint32_t lost, rlx_status why);

// ---- driver_keepalive.c ----
int rlx__drv_ping_due(const rlx_driver *d, uint32_t i, double now);
rlx_status rlx__drv_ping(rlx_driver *d, uint32_t i);
rlx_status rlx__drv_start_keeper(rlx_driver *d);
void rlx__drv_stop_keeper(rlx_driver *d);

// ---- driver_slots.c ----
rlx_status rlx__drv_run_job(rlx_driver *d, uint32_t i, drv_job *j, int *refused);
rlx_status rlx__drv_start_threads(rlx_driver *d);
void rlx__drv_stop_threads(rlx_driver *d);

// ---- driver_replay.c ----
rlx_status rlx__drv_recover_slots(rlx_driver *d, uint32_t lost, uint64_t generation);

#endif
