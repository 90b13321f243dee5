/* The stage loop: accept one driver connection at a time, shake hands, then serve Activations,
 * Truncate and EndSession for the sessions of that connection until it closes or a stop is
 * asked for. Every wait polls the stop flag every poll_ms. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_internal.h"
#include "gen/gen_internal.h"
#include "rlx/engine.h"
#include "util/log.h"
#include "util/alloc.h"

typedef struct stage_session {
    uint64_t id;
    uint64_t last_step;
    rlx_session *s;
} stage_session;

typedef struct stage {
    const rlx_model *m;
    const rlx_model_config *cfg;
    rlx_stage_options o;
    rlx_block_spec spec;
    char model_id[RLX_MODEL_ID_SIZE];
    rlx__net net;
    void *listener;
    char bound[256];
    stage_session *sessions; /* [max_sessions], those of the current connection */
    uint32_t n_sessions;
    uint32_t kv_capacity; /* what the current connection's sessions get */
    int emit_hidden;      /* the current connection wants hidden rows with the logits */
    uint64_t conn_no;
    /* the current connection's slots (Hello.n_slots), or NULL */
    rlx__batch *batch;
    uint32_t n_slots;
    uint64_t rows_step; /* its last Rows or CopySlot step */
} stage;

rlx_stage_options rlx_stage_options_default(void) {
    return (rlx_stage_options){.session = {.size = sizeof(rlx_session_options)}, .prefetch = 1};
}

static int stopping(const stage *st) { return st->o.stop && *st->o.stop; }

static uint64_t resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, resident = 0;
    if (!f)
        return 0;
    int ok = fscanf(f, "%llu %llu", &size, &resident) == 2;
    fclose(f);
    return ok ? (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

static void range_text(char *buf, size_t size, uint32_t start, uint32_t end) {
    if (end > start)
        snprintf(buf, size, "%u-%u", start, end - 1);
    else
        snprintf(buf, size, "[%u, %u)", start, end);
}

static void sessions_clear(stage *st) {
    for (uint32_t i = 0; i < st->n_sessions; i++)
        rlx_session_destroy(st->sessions[i].s);
    if (st->n_sessions)
        rlx__log(RLX_LOG_INFO, "freed %u session%s of driver connection %llu", st->n_sessions,
                 st->n_sessions == 1 ? "" : "s", (unsigned long long)st->conn_no);
    st->n_sessions = 0;
}

static void session_remove(stage *st, stage_session *ss) {
    rlx_session_destroy(ss->s);
    *ss = st->sessions[--st->n_sessions];
}

static stage_session *session_find(stage *st, uint64_t id) {
    for (uint32_t i = 0; i < st->n_sessions; i++)
        if (st->sessions[i].id == id)
            return &st->sessions[i];
    return NULL;
}

/* Answers a request with an Error (and logs it); the connection stays up. Returns the send's status. */
static rlx_status refuse(stage *st, void *conn, uint64_t session, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static rlx_status refuse(stage *st, void *conn, uint64_t session, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rlx__log(RLX_LOG_WARN, "driver connection %llu: refused: %s", (unsigned long long)st->conn_no, msg);
    return rlx__net_send_error(&st->net, conn, session, code, msg, (int)st->o.timeout_ms);
}

// ---- handshake ----

static uint32_t default_capacity(const stage *st) {
    int64_t max_pos = st->cfg->max_position_embeddings;
    uint32_t cap = st->o.session.kv_capacity;
    if (!cap)
        cap = max_pos > 0 && max_pos < 4096 ? (uint32_t)max_pos : 4096;
    return cap;
}

/* Checks a Hello against this stage; 0 and a HelloReply sent, or -1 after refusing. */
static int handshake(stage *st, void *conn, const Rlx__Envelope *e) {
    char mine[32], theirs[32];
    if (e->body_case != RLX__ENVELOPE__BODY_HELLO) {
        refuse(st, conn, 0, RLX_E_INVALID, "expected Hello first, got %s", rlx__envelope_kind(e));
        return -1;
    }
    const Rlx__Hello *h = e->hello;
    if (h->protocol_version != RLX_DIST_PROTOCOL_VERSION) {
        refuse(st, conn, 0, RLX_E_UNSUPPORTED, "driver speaks protocol version %u, this stage speaks version %d",
               h->protocol_version, RLX_DIST_PROTOCOL_VERSION);
        return -1;
    }
    if (!h->model_id || strcmp(h->model_id, st->model_id) != 0) {
        refuse(st, conn, 0, RLX_E_INVALID,
               "model mismatch: the driver's model has id %.16s..., this stage serves %s with id %.16s... "
               "(config.json, safetensors or GGUF headers differ)",
               h->model_id ? h->model_id : "", rlx_model_dir(st->m), st->model_id);
        return -1;
    }
    range_text(mine, sizeof mine, st->spec.layer_start, st->spec.layer_end);
    range_text(theirs, sizeof theirs, h->layer_start, h->layer_end);
    if (h->layer_start != st->spec.layer_start || h->layer_end != st->spec.layer_end) {
        refuse(st, conn, 0, RLX_E_INVALID,
               "layer mismatch: the driver expects layers %s from stage %u of %u, this "
               "stage serves layers %s",
               theirs, h->stage_index, h->n_stages, mine);
        return -1;
    }
    if (h->activation_dtype != RLX__DTYPE__DTYPE_F32) {
        refuse(st, conn, 0, RLX_E_UNSUPPORTED, "activation dtype %d is not supported (only F32)",
               (int)h->activation_dtype);
        return -1;
    }
    uint32_t cap = h->kv_capacity ? h->kv_capacity : default_capacity(st);
    int64_t max_pos = st->cfg->max_position_embeddings;
    if (max_pos > 0 && cap > max_pos) {
        refuse(st, conn, 0, RLX_E_RANGE, "a context of %u positions exceeds the model's max_position_embeddings %lld",
               cap, (long long)max_pos);
        return -1;
    }
    if (h->emit_hidden && !st->spec.produce_logits) {
        refuse(st, conn, 0, RLX_E_INVALID,
               "hidden states come from the last stage; this stage serves layers %s of "
               "%lld",
               mine, (long long)st->cfg->num_hidden_layers);
        return -1;
    }
    if (h->n_slots > RLX_ENGINE_MAX_SLOTS) { /* the engine that drives them has no more */
        refuse(st, conn, 0, RLX_E_RANGE, "%u slots asked for, at most %d", h->n_slots, RLX_ENGINE_MAX_SLOTS);
        return -1;
    }
    if (h->n_slots) {
        const rlx__batch_options bo = {.n_slots = h->n_slots,
                                       .capacity = cap,
                                       .kv_dtype = st->o.session.kv_dtype,
                                       .backends = st->o.session.backends,
                                       .n_backends = st->o.session.n_backends,
                                       .rules = st->o.session.rules,
                                       .n_rules = st->o.session.n_rules};
        if (rlx__batch_create(st->m, &st->spec, &bo, &st->batch) != RLX_OK) {
            refuse(st, conn, 0, RLX_E_NOMEM, "cannot keep %u slots of %u positions: %s", h->n_slots, cap,
                   rlx_last_error());
            return -1;
        }
        st->n_slots = h->n_slots;
        st->rows_step = 0;
    }
    st->kv_capacity = cap;
    st->emit_hidden = h->emit_hidden;
    Rlx__HelloReply r = RLX__HELLO_REPLY__INIT;
    r.protocol_version = RLX_DIST_PROTOCOL_VERSION;
    r.model_id = st->model_id;
    r.layer_start = st->spec.layer_start;
    r.layer_end = st->spec.layer_end;
    r.backend = (char *)(st->o.backend_name ? st->o.backend_name : "ref");
    r.rss_bytes = resident_bytes();
    r.kv_capacity = cap;
    r.emit_hidden = st->emit_hidden;
    r.n_slots = st->n_slots;
    Rlx__Envelope out = RLX__ENVELOPE__INIT;
    out.body_case = RLX__ENVELOPE__BODY_HELLO_REPLY;
    out.hello_reply = &r;
    if (rlx__net_send(&st->net, conn, &out, (int)st->o.timeout_ms, NULL) != RLX_OK) {
        rlx__log(RLX_LOG_WARN, "driver connection %llu: cannot answer the handshake: %s",
                 (unsigned long long)st->conn_no, rlx_last_error());
        return -1;
    }
    rlx__log(RLX_LOG_INFO, "driver connection %llu: stage %u of %u, layers %s, %u positions per session, %u slots",
             (unsigned long long)st->conn_no, h->stage_index, h->n_stages, mine, cap, st->n_slots);
    return 0;
}

// ---- requests ----

static rlx_status send_ack(stage *st, void *conn, uint64_t session, uint64_t step) {
    Rlx__Ack a = RLX__ACK__INIT;
    a.session_id = session;
    a.step = step;
    Rlx__Envelope out = RLX__ENVELOPE__INIT;
    out.body_case = RLX__ENVELOPE__BODY_ACK;
    out.ack = &a;
    return rlx__net_send(&st->net, conn, &out, (int)st->o.timeout_ms, NULL);
}

static rlx_status on_activations(stage *st, void *conn, const Rlx__Activations *a) {
    uint64_t id = a->session_id;
    stage_session *ss = session_find(st, id);
    int created = 0;
    if (!ss) {
        if (a->start_position != 0)
            return refuse(st, conn, id, RLX_E_NOT_FOUND,
                          "unknown session %016llx (a session starts at position 0, this one at %u)",
                          (unsigned long long)id, a->start_position);
        if (st->n_sessions == st->o.max_sessions)
            return refuse(st, conn, id, RLX_E_RANGE, "too many sessions (at most %u per driver)", st->o.max_sessions);
        rlx_session_options so = st->o.session;
        so.kv_capacity = st->kv_capacity;
        rlx_session *s;
        rlx_block_spec spec = st->spec;
        spec.emit_hidden = (uint32_t)st->emit_hidden;
        if (rlx_session_create(st->m, &spec, &so, &s) != RLX_OK)
            return refuse(st, conn, id, RLX_E_INTERNAL, "cannot create session %016llx: %s", (unsigned long long)id,
                          rlx_last_error());
        ss = &st->sessions[st->n_sessions++];
        *ss = (stage_session){.id = id, .s = s};
        created = 1;
        rlx__log(RLX_LOG_INFO, "session %016llx started", (unsigned long long)id);
    }
    if (a->step <= ss->last_step) {
        rlx_status rc = refuse(st, conn, id, RLX_E_INVALID,
                               "session %016llx: step %llu is out of order (the previous step was %llu)",
                               (unsigned long long)id, (unsigned long long)a->step, (unsigned long long)ss->last_step);
        if (created)
            session_remove(st, ss);
        return rc;
    }
    ss->last_step = a->step;
    uint32_t length = rlx_session_length(ss->s), n = a->n_positions;
    int embed = st->spec.embed_input != 0, logits = st->spec.produce_logits != 0;
    uint32_t in_width = embed ? 1 : (uint32_t)st->cfg->hidden_size;
    int in_dtype = embed ? RLX__DTYPE__DTYPE_I32 : RLX__DTYPE__DTYPE_F32;
    const char *problem = NULL;
    char detail[256];
    if (a->start_position != length) {
        snprintf(detail, sizeof detail, "starts at position %u, the session holds %u positions", a->start_position,
                 length);
        problem = detail;
    } else if (n == 0) {
        problem = "has no positions";
    } else if (a->width != in_width || (int)a->dtype != in_dtype) {
        snprintf(detail, sizeof detail, "has rows of %u %s values, this stage takes rows of %u %s values (%s)",
                 a->width, rlx__dtype_name(a->dtype), in_width, rlx__dtype_name((Rlx__DType)in_dtype),
                 embed ? "token ids" : "hidden states");
        problem = detail;
    } else if (a->data.len != (size_t)n * in_width * 4) {
        snprintf(detail, sizeof detail, "carries %zu bytes for %u rows of %u values", a->data.len, n, in_width);
        problem = detail;
    }
    if (problem) {
        rlx_status rc = refuse(st, conn, id, RLX_E_INVALID, "session %016llx step %llu: the request %s",
                               (unsigned long long)id, (unsigned long long)a->step, problem);
        if (created)
            session_remove(st, ss);
        return rc;
    }
    int all_rows = logits && a->all_rows;
    const float *out;
    if (rlx_session_forward(ss->s, a->data.data, n, all_rows, &out) != RLX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rlx_last_error());
        rlx_status rc = refuse(st, conn, id, RLX_E_INTERNAL, "session %016llx step %llu: %s", (unsigned long long)id,
                               (unsigned long long)a->step, msg);
        if (created)
            session_remove(st, ss);
        return rc;
    }
    uint32_t rows = logits && !all_rows ? 1 : n;
    uint32_t width = (uint32_t)(logits ? st->cfg->vocab_size : st->cfg->hidden_size);
    Rlx__Activations r = RLX__ACTIVATIONS__INIT;
    r.session_id = id;
    r.step = a->step;
    r.start_position = a->start_position;
    r.n_positions = rows;
    r.width = width;
    r.dtype = RLX__DTYPE__DTYPE_F32;
    r.all_rows = a->all_rows;
    r.data.len = (size_t)rows * width * sizeof(float);
    r.data.data = (uint8_t *)out;
    if (st->emit_hidden) {
        r.hidden.len = (size_t)n * (size_t)st->cfg->hidden_size * sizeof(float);
        r.hidden.data = (uint8_t *)rlx_session_hidden(ss->s);
    }
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &r;
    return rlx__net_send(&st->net, conn, &e, (int)st->o.timeout_ms, NULL);
}

static rlx_status on_truncate(stage *st, void *conn, const Rlx__Truncate *t) {
    stage_session *ss = session_find(st, t->session_id);
    unsigned long long id = (unsigned long long)t->session_id;
    if (!ss)
        return refuse(st, conn, t->session_id, RLX_E_NOT_FOUND, "Truncate for unknown session %016llx", id);
    if (t->step <= ss->last_step)
        return refuse(st, conn, t->session_id, RLX_E_INVALID,
                      "session %016llx: step %llu is out of order (the previous step was %llu)", id,
                      (unsigned long long)t->step, (unsigned long long)ss->last_step);
    ss->last_step = t->step;
    if (rlx_session_truncate(ss->s, t->length) != RLX_OK)
        return refuse(st, conn, t->session_id, RLX_E_RANGE, "session %016llx: %s", id, rlx_last_error());
    return send_ack(st, conn, t->session_id, t->step);
}

static rlx_status on_end(stage *st, void *conn, const Rlx__EndSession *e) {
    stage_session *ss = session_find(st, e->session_id);
    if (ss) {
        session_remove(st, ss);
        rlx__log(RLX_LOG_INFO, "session %016llx ended", (unsigned long long)e->session_id);
    }
    return send_ack(st, conn, e->session_id, 0);
}

/* A Rows or CopySlot (`what`) needs the slots of the Hello and a step after the previous one:
 * 1 and the step taken, or 0 after refusing (*rc the refusal's send status). */
static int slot_step_in_order(stage *st, void *conn, const char *what, uint64_t step, rlx_status *rc) {
    if (!st->batch) {
        *rc = refuse(st, conn, 0, RLX_E_INVALID, "%s from a driver that asked for no slots in its Hello", what);
        return 0;
    }
    if (step <= st->rows_step) {
        *rc = refuse(st, conn, 0, RLX_E_INVALID, "%s step %llu is out of order (the previous step was %llu)", what,
                     (unsigned long long)step, (unsigned long long)st->rows_step);
        return 0;
    }
    st->rows_step = step;
    return 1;
}

/* A step of the connection's slots: checks every row against the slots, runs them and answers
 * with the hidden rows (or the logits of out_rows from the last stage). */
static rlx_status on_rows(stage *st, void *conn, const Rlx__Rows *a) {
    rlx_status rc;
    if (!slot_step_in_order(st, conn, "Rows", a->step, &rc))
        return rc;
    const uint32_t n = a->n_rows;
    const int embed = st->spec.embed_input != 0, logits = st->spec.produce_logits != 0;
    const uint32_t in_width = embed ? 1 : (uint32_t)st->cfg->hidden_size;
    const int in_dtype = embed ? RLX__DTYPE__DTYPE_I32 : RLX__DTYPE__DTYPE_F32;
    const unsigned long long step = (unsigned long long)a->step;
    if (n == 0 || a->n_positions != n || a->n_slots != n)
        return refuse(st, conn, 0, RLX_E_INVALID, "Rows step %llu: %u rows with %zu positions and %zu slots", step, n,
                      a->n_positions, a->n_slots);
    if (a->width != in_width || (int)a->dtype != in_dtype || a->data.len != (size_t)n * in_width * 4)
        return refuse(st, conn, 0, RLX_E_INVALID,
                      "Rows step %llu: %zu bytes of %u %s values per row for %u rows, this stage takes rows of %u "
                      "%s values (%s)",
                      step, a->data.len, a->width, rlx__dtype_name(a->dtype), n, in_width,
                      rlx__dtype_name((Rlx__DType)in_dtype), embed ? "token ids" : "hidden states");
    if (logits ? a->n_out_rows == 0 || a->n_out_rows > n : a->n_out_rows != 0)
        return refuse(st, conn, 0, RLX_E_INVALID, "Rows step %llu: %zu logits rows of %u rows to a stage %s", step,
                      a->n_out_rows, n, logits ? "that returns logits (want 1 to the rows)" : "that returns no logits");
    for (uint32_t r = 0; r < n; r++) {
        if (a->slots[r] >= st->n_slots || a->positions[r] >= st->kv_capacity)
            return refuse(st, conn, 0, RLX_E_RANGE,
                          "Rows step %llu: row %u is position %u of slot %u, beyond %u slots of %u positions", step, r,
                          a->positions[r], a->slots[r], st->n_slots, st->kv_capacity);
        if (embed &&
            (((const int32_t *)a->data.data)[r] < 0 || ((const int32_t *)a->data.data)[r] >= st->cfg->vocab_size))
            return refuse(st, conn, 0, RLX_E_RANGE, "Rows step %llu: row %u: token id %d is outside the vocabulary",
                          step, r, ((const int32_t *)a->data.data)[r]);
    }
    for (size_t k = 0; k < a->n_out_rows; k++)
        if (a->out_rows[k] >= n)
            return refuse(st, conn, 0, RLX_E_RANGE, "Rows step %llu: logits row %zu names row %u of %u", step, k,
                          a->out_rows[k], n);
    /* the values were checked to fit: the uint32 arrays are the int32 the block reads */
    const float *out;
    if (rlx__batch_run(st->batch, a->data.data, (const int32_t *)a->positions, (const int32_t *)a->slots, n,
                       (const int32_t *)a->out_rows, (uint32_t)a->n_out_rows, &out) != RLX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rlx_last_error());
        return refuse(st, conn, 0, RLX_E_INTERNAL, "Rows step %llu: %s", step, msg);
    }
    const uint32_t rows = logits ? (uint32_t)a->n_out_rows : n;
    const uint32_t width = (uint32_t)(logits ? st->cfg->vocab_size : st->cfg->hidden_size);
    Rlx__Rows r = RLX__ROWS__INIT;
    r.step = a->step;
    r.n_rows = rows;
    r.width = width;
    r.dtype = RLX__DTYPE__DTYPE_F32;
    r.data.len = (size_t)rows * width * sizeof(float);
    r.data.data = (uint8_t *)out;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ROWS;
    e.rows = &r;
    return rlx__net_send(&st->net, conn, &e, (int)st->o.timeout_ms, NULL);
}

static rlx_status on_copy_slot(stage *st, void *conn, const Rlx__CopySlot *c) {
    rlx_status rc;
    if (!slot_step_in_order(st, conn, "CopySlot", c->step, &rc))
        return rc;
    if (c->from_slot >= st->n_slots || c->to_slot >= st->n_slots || c->from_slot == c->to_slot ||
        c->n_positions > st->kv_capacity)
        return refuse(st, conn, 0, RLX_E_RANGE, "CopySlot of %u positions from slot %u to slot %u of %u slots of %u",
                      c->n_positions, c->from_slot, c->to_slot, st->n_slots, st->kv_capacity);
    rlx__batch_copy(st->batch, c->from_slot, c->to_slot, c->n_positions);
    return send_ack(st, conn, 0, c->step);
}

// ---- connections ----

/* A second driver while one is served: read its Hello (so closing does not reset the answer
 * away) and tell it why it is turned down. */
static void turn_away(stage *st, void *conn) {
    Rlx__Envelope *e = NULL;
    int wait = st->o.timeout_ms < 1000 ? (int)st->o.timeout_ms : 1000;
    if (rlx__net_recv(&st->net, conn, &e, wait, NULL) == RLX_OK)
        rlx__envelope_free(e);
    rlx__log(RLX_LOG_WARN, "turned away a driver: serving driver connection %llu", (unsigned long long)st->conn_no);
    rlx__net_send_error(&st->net, conn, 0, RLX_E_UNSUPPORTED, "this stage is serving another driver (one at a time)",
                        (int)st->o.timeout_ms);
    st->net.t->conn_close(st->net.self, conn);
}

/* Receives the next message, polling the stop flag (and turning away other drivers when
 * `serving`); gives up after limit_ms (0 = never). */
static rlx_status recv_polling(stage *st, void *conn, int serving, uint32_t limit_ms, Rlx__Envelope **e) {
    uint32_t waited = 0;
    for (;;) {
        if (stopping(st))
            return RLX_E_TIMEOUT;
        rlx_status rc = rlx__net_recv(&st->net, conn, e, (int)st->o.poll_ms, NULL);
        if (rc != RLX_E_TIMEOUT)
            return rc;
        waited += st->o.poll_ms;
        if (limit_ms && waited >= limit_ms)
            return rlx_error(RLX_E_TIMEOUT, "no message within %u ms", limit_ms);
        void *other = NULL;
        if (serving && st->net.t->accept(st->net.self, st->listener, 0, &other) == RLX_OK && other)
            turn_away(st, other);
    }
}

/* Serves one connection until it ends; 1 when a driver spoke on it (sent any message). */
static int serve_connection(stage *st, void *conn) {
    Rlx__Envelope *e = NULL;
    rlx_status rc = recv_polling(st, conn, 0, st->o.timeout_ms, &e);
    if (rc != RLX_OK) {
        if (!stopping(st))
            rlx__log(RLX_LOG_WARN, "driver connection %llu: no handshake: %s", (unsigned long long)st->conn_no,
                     rlx_last_error());
        if (rc == RLX_E_FORMAT)
            rlx__net_send_error(&st->net, conn, 0, RLX_E_FORMAT, rlx_last_error(), (int)st->o.timeout_ms);
        return rc == RLX_E_FORMAT;
    }
    int ok = handshake(st, conn, e) == 0;
    rlx__envelope_free(e);
    while (ok && !stopping(st)) {
        rc = recv_polling(st, conn, 1, 0, &e);
        if (rc != RLX_OK) {
            if (stopping(st))
                break;
            if (rc == RLX_E_PEER)
                rlx__log(RLX_LOG_INFO, "driver connection %llu closed: %s", (unsigned long long)st->conn_no,
                         rlx_last_error());
            else
                rlx__log(RLX_LOG_WARN, "driver connection %llu dropped: %s", (unsigned long long)st->conn_no,
                         rlx_last_error());
            if (rc == RLX_E_FORMAT) /* the framing may be lost: say why, then hang up */
                rlx__net_send_error(&st->net, conn, 0, RLX_E_FORMAT, rlx_last_error(), (int)st->o.timeout_ms);
            break;
        }
        switch (e->body_case) {
        case RLX__ENVELOPE__BODY_ACTIVATIONS:
            rc = on_activations(st, conn, e->activations);
            break;
        case RLX__ENVELOPE__BODY_TRUNCATE:
            rc = on_truncate(st, conn, e->truncate);
            break;
        case RLX__ENVELOPE__BODY_END_SESSION:
            rc = on_end(st, conn, e->end_session);
            break;
        case RLX__ENVELOPE__BODY_ROWS:
            rc = on_rows(st, conn, e->rows);
            break;
        case RLX__ENVELOPE__BODY_COPY_SLOT:
            rc = on_copy_slot(st, conn, e->copy_slot);
            break;
        default:
            rc = refuse(st, conn, 0, RLX_E_INVALID, "unexpected %s after the handshake", rlx__envelope_kind(e));
            break;
        }
        rlx__envelope_free(e);
        if (rc != RLX_OK) {
            rlx__log(RLX_LOG_WARN, "driver connection %llu: cannot answer: %s", (unsigned long long)st->conn_no,
                     rlx_last_error());
            break;
        }
    }
    sessions_clear(st);
    rlx__batch_destroy(st->batch);
    st->batch = NULL;
    st->n_slots = 0;
    return 1;
}

rlx_status rlx_stage_serve(const rlx_model *m, const rlx_stage_options *opts) {
    if (!m || !opts || !opts->address || !opts->transport)
        return rlx_error(RLX_E_INVALID, "rlx_stage_serve: NULL model, options, address or transport");
    stage st = {.m = m, .cfg = rlx_model_config_of(m), .o = *opts};
    if (!st.o.timeout_ms)
        st.o.timeout_ms = RLX_DIST_TIMEOUT_MS;
    if (!st.o.poll_ms)
        st.o.poll_ms = RLX_DIST_POLL_MS;
    if (!st.o.max_sessions)
        st.o.max_sessions = 64;
    uint32_t n_layers = (uint32_t)st.cfg->num_hidden_layers;
    rlx_layer_range r = st.o.layers;
    if (r.start >= r.end || r.end > n_layers)
        return rlx_error(RLX_E_RANGE, "stage layers [%u, %u) are not a non-empty range inside the model's %u layers",
                         r.start, r.end, n_layers);
    st.spec = (rlx_block_spec){.size = sizeof(rlx_block_spec),
                               .layer_start = r.start,
                               .layer_end = r.end,
                               .embed_input = r.start == 0,
                               .produce_logits = r.end == n_layers};
    rlx_status rc = rlx_model_check_block(m, &st.spec);
    if (rc == RLX_OK)
        rc = rlx__model_id_of(m, st.model_id);
    if (rc == RLX_OK && st.o.prefetch)
        rc = rlx_model_prefetch(m, &st.spec, NULL, NULL);
    if (rc != RLX_OK)
        return rc;
    if (!(st.sessions = rlx__calloc(st.o.max_sessions, sizeof *st.sessions)))
        return rlx_error(RLX_E_NOMEM, "stage: out of memory");
    if ((rc = rlx__net_open(st.o.transport, st.o.transport_options, &st.net)) != RLX_OK)
        goto done;
    rlx_error_clear();
    if ((rc = st.net.t->listen(st.net.self, st.o.address, &st.listener)) < 0) {
        /* a transport's message names the address already (transport.h) */
        if (!*rlx_last_error())
            rlx_error(rc, "cannot listen on %s: %s", st.o.address, rlx_status_str(rc));
        st.listener = NULL;
        goto done;
    }
    if (st.net.t->bound_address(st.net.self, st.listener, st.bound, sizeof st.bound) < 0)
        snprintf(st.bound, sizeof st.bound, "%s", st.o.address);
    rlx__log(RLX_LOG_INFO, "serving layers %u-%u%s%s on %s (%s)", r.start, r.end - 1,
             st.spec.embed_input ? ", embedding" : "", st.spec.produce_logits ? ", logits" : "", st.bound, st.net.name);
    if (st.o.on_listening)
        st.o.on_listening(st.o.ctx, st.bound);
    uint32_t n_drivers = 0;
    while (!stopping(&st) && (!st.o.max_drivers || n_drivers < st.o.max_drivers)) {
        void *conn = NULL;
        int arc = st.net.t->accept(st.net.self, st.listener, (int)st.o.poll_ms, &conn);
        if (arc == RLX_E_TIMEOUT || (arc == RLX_OK && !conn))
            continue;
        if (arc < 0) { /* e.g. out of descriptors: keep serving, but do not spin */
            rlx__log(RLX_LOG_WARN, "accept on %s failed: %s", st.bound, rlx_last_error());
            struct timespec ts = {0, (long)st.o.poll_ms * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        st.conn_no++;
        rlx__log(RLX_LOG_INFO, "driver connection %llu accepted", (unsigned long long)st.conn_no);
        n_drivers += (uint32_t)serve_connection(&st, conn);
        st.net.t->conn_close(st.net.self, conn);
    }
    rlx__log(RLX_LOG_INFO, "stopping");
    rc = RLX_OK;
done:
    sessions_clear(&st);
    free(st.sessions);
    if (st.listener)
        st.net.t->listener_close(st.net.self, st.listener);
    rlx__net_close(&st.net);
    return rc;
}
