/* The stage: a thread per driver connection. Each shakes hands (authenticating the peer first
 * when the stage has credentials), then serves Activations, Truncate, EndSession, Rows, CopySlot
 * and Ping for its connection until it closes, stays silent past the idle timeout, or a stop is
 * asked for. The forwards of all connections take turns on one lock; limits on connections,
 * sessions and KV positions hold over all of them. Every wait polls the stop flag every poll_ms. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_internal.h"
#include "model/model_internal.h"
#include "gen/gen_internal.h"
#include "rlx/engine.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

/* What a peer may send before its handshake is done: a Hello or an AuthProof is a few hundred
 * bytes. */
#define PRE_HANDSHAKE_MAX_MESSAGE (64u * 1024u)
/* Protobuf framing of a request beyond its rows: the fixed fields, and per row its position
 * and slot as varints of at most 5 bytes each. */
#define REQUEST_OVERHEAD (64u * 1024u)
#define ROW_OVERHEAD 16u
/* No transport carries more in one message (gRPC counts lengths in an int). */
#define TRANSPORT_MAX_MESSAGE ((1ull << 31) - 1)
/* A connection turned away for being busy gets this long (or the handshake timeout, if shorter)
 * to finish sending its Hello and to read why; so a turned-away peer holds its thread briefly. */
#define BUSY_ANSWER_MS 1000u

typedef struct stage_session {
    uint64_t id;
    uint64_t last_step;
    rlx_session *s;
} stage_session;

typedef struct stage stage;

/* One driver connection, owned by its thread (the accepting thread joins it and frees it). While it awaits its handshake it is also in the
 * stage's list of pending connections (under stage.mu), where a newer connection may evict it. */
typedef struct stage_conn {
    stage *st;
    void *conn;
    uint64_t no;
    char peer[128];      /* "host:port", or "" when the transport cannot say */
    char peer_host[128]; /* what counts as one peer: the host (an IPv6 host's /64 network) */
    double accepted_at;  /* rlx__now_seconds() at the accept */
    struct stage_conn *pending_prev, *pending_next;
    int pending;            /* in the list (under stage.mu) */
    atomic_int turned_away; /* evicted, or refused at the accept: say busy and close */
    /* set with turned_away: why, for the peer; `quiet`: close without a word (too many are
     * being told already); `refused`: turned away at its accept, its Hello perhaps on its way */
    char busy[320];
    int quiet, refused;
    int authenticated; /* the peer proved the stage's credentials (so refusals may say more) */
    int served;        /* past the handshake: counts against max_connections */
    stage_session *sessions;
    uint32_t n_sessions, cap_sessions;
    uint32_t kv_capacity; /* what this connection's sessions and slots get */
    int emit_hidden;      /* the driver wants hidden rows with the logits */
    rlx__batch *batch;    /* the connection's slots (Hello.n_slots), or NULL */
    uint32_t n_slots;
    uint64_t rows_step; /* its last Rows or CopySlot step */
    uint64_t reserved;  /* KV positions held against max_positions */
    pthread_t thread;
    struct stage_conn *next_ended; /* on stage.ended */
} stage_conn;

struct stage {
    const rlx_model *m;
    const rlx_model_config *cfg;
    rlx_stage_options o;
    rlx_block_spec spec;
    char model_id[RLX_MODEL_ID_SIZE];
    rlx__auth auth;
    rlx__net net;
    void *listener;
    char bound[256];
    atomic_int quit; /* max_drivers reached: the connections end as on a stop */
    /* the forwards (and every other use of the model's sessions) take turns */
    pthread_mutex_t compute_mu;
    /* mu guards the counts below; `changed` is signalled when a connection ends */
    pthread_mutex_t mu;
    pthread_cond_t changed;
    uint32_t n_open;       /* connection threads alive */
    uint32_t n_handshakes; /* of them, not yet past the handshake: the pending list */
    uint32_t n_served;     /* of them, past it */
    uint32_t n_leaving;    /* of them, turned away: saying "busy" (n_told of them) before they close */
    uint32_t n_told;
    uint32_t n_sessions;  /* over all connections */
    uint64_t n_positions; /* KV positions granted over all connections */
    uint32_t n_drivers;   /* connections that completed a handshake and ended */
    uint64_t conn_no;
    stage_conn *pending_first, *pending_last; /* awaiting their handshake, oldest first */
    /* Connections whose thread has ended, for the accepting thread to join: a thread still on its
     * way out when the stage returns would run beside the process's exit (its handlers, MPI_Finalize,
     * LeakSanitizer's stop-the-world check) and touch this stage after it is gone. */
    stage_conn *ended;
};

rlx_stage_options rlx_stage_options_default(void) {
    return (rlx_stage_options){.session = {.size = sizeof(rlx_session_options)}, .prefetch = 1};
}

static int stopping(stage *st) { return (st->o.stop && *st->o.stop) || atomic_load(&st->quit); }

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

/* Takes n KV positions (and a session when `session`) from the stage's budget: 0 when they are
 * not there. */
static int reserve(stage *st, stage_conn *c, uint64_t n, int session) {
    pthread_mutex_lock(&st->mu);
    int ok = st->n_positions + n <= st->o.max_positions && (!session || st->n_sessions < st->o.max_sessions);
    if (ok) {
        st->n_positions += n;
        st->n_sessions += (uint32_t)session;
        c->reserved += n;
    }
    pthread_mutex_unlock(&st->mu);
    return ok;
}

static void release(stage *st, stage_conn *c, uint64_t n, int session) {
    pthread_mutex_lock(&st->mu);
    st->n_positions -= n;
    st->n_sessions -= (uint32_t)session;
    c->reserved -= n;
    pthread_mutex_unlock(&st->mu);
}

static void session_remove(stage_conn *c, stage_session *ss) {
    pthread_mutex_lock(&c->st->compute_mu);
    rlx_session_destroy(ss->s);
    pthread_mutex_unlock(&c->st->compute_mu);
    release(c->st, c, c->kv_capacity, 1);
    *ss = c->sessions[--c->n_sessions];
}

static void sessions_clear(stage_conn *c) {
    const uint32_t n = c->n_sessions;
    while (c->n_sessions)
        session_remove(c, &c->sessions[c->n_sessions - 1]);
    if (n)
        rlx__log(RLX_LOG_INFO, "freed %u session%s of driver connection %llu", n, n == 1 ? "" : "s",
                 (unsigned long long)c->no);
}

static stage_session *session_find(stage_conn *c, uint64_t id) {
    for (uint32_t i = 0; i < c->n_sessions; i++)
        if (c->sessions[i].id == id)
            return &c->sessions[i];
    return NULL;
}

// ---- connections awaiting their handshake ----

/* Caller holds st->mu. */
static void pending_link(stage *st, stage_conn *c) {
    c->pending_prev = st->pending_last;
    c->pending_next = NULL;
    if (st->pending_last)
        st->pending_last->pending_next = c;
    else
        st->pending_first = c;
    st->pending_last = c;
    c->pending = 1;
    st->n_handshakes++;
}

/* Caller holds st->mu. */
static void pending_unlink(stage *st, stage_conn *c) {
    if (c->pending_prev)
        c->pending_prev->pending_next = c->pending_next;
    else
        st->pending_first = c->pending_next;
    if (c->pending_next)
        c->pending_next->pending_prev = c->pending_prev;
    else
        st->pending_last = c->pending_prev;
    c->pending_prev = c->pending_next = NULL;
    c->pending = 0;
    st->n_handshakes--;
}

/* What counts as one peer: its host, or for IPv6 its /64 network (one machine's usual share). */
static void peer_host_of(const char *peer, char *out, size_t size) {
    char host[128], err[8];
    unsigned port;
    struct in6_addr a6;
    if (rlx_iface_split_address(peer, host, sizeof host, &port, err, sizeof err) != RLX_OK) {
        snprintf(out, size, "%s", peer);
    } else if (inet_pton(AF_INET6, host, &a6) == 1 && !IN6_IS_ADDR_V4MAPPED(&a6)) {
        memset(a6.s6_addr + 8, 0, 8);
        char net[INET6_ADDRSTRLEN];
        if (inet_ntop(AF_INET6, &a6, net, sizeof net))
            snprintf(out, size, "%s/64", net);
        else
            snprintf(out, size, "%s", host);
    } else {
        snprintf(out, size, "%s", host);
    }
}

/* Caller holds st->mu. The pending connection to evict so that a new one from `host` gets its
 * place, or NULL with *fits set when there is room, or NULL alone when no one may be evicted.
 * The new connection's own host gives up its oldest when it holds its share; when the table is
 * full, the host holding the most places gives up its oldest; and when every host holds one, the
 * oldest connection goes once it has waited half the handshake timeout (one that came just now
 * may be a driver in the middle of its handshake). */
static stage_conn *choose_eviction(stage *st, const char *host, int *fits, uint32_t *from_host) {
    uint32_t same = 0, most = 0;
    stage_conn *oldest_same = NULL, *oldest_of_most = NULL;
    for (stage_conn *p = st->pending_first; p; p = p->pending_next) {
        if (!strcmp(p->peer_host, host) && !same++)
            oldest_same = p;
        uint32_t n = 0;
        stage_conn *oldest = NULL;
        for (stage_conn *q = st->pending_first; q; q = q->pending_next)
            if (!strcmp(q->peer_host, p->peer_host) && !n++)
                oldest = q;
        if (oldest == p && n > most) {
            most = n;
            oldest_of_most = p;
        }
    }
    *fits = 0;
    *from_host = same;
    if (same >= RLX_DIST_MAX_HANDSHAKES_PER_HOST)
        return oldest_same;
    if (st->n_handshakes < RLX_DIST_MAX_HANDSHAKES) {
        *fits = 1;
        return NULL;
    }
    *from_host = 0;
    if (most >= 2)
        return oldest_of_most;
    stage_conn *first = st->pending_first;
    if (first && (rlx__now_seconds() - first->accepted_at) * 1000.0 >= st->o.timeout_ms / 2.0)
        return first;
    return NULL;
}

/* Caller holds st->mu: c (pending, or just accepted) says "busy" and closes on its thread; without
 * a word once RLX_DIST_MAX_HANDSHAKES others are saying it (each may wait on its peer a moment). */
static void turn_away(stage *st, stage_conn *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void turn_away(stage *st, stage_conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->busy, sizeof c->busy, fmt, ap);
    va_end(ap);
    c->refused = !c->pending;
    if (c->pending)
        pending_unlink(st, c);
    c->quiet = st->n_told >= RLX_DIST_MAX_HANDSHAKES;
    st->n_told += !c->quiet;
    st->n_leaving++;
    atomic_store(&c->turned_away, 1);
}

/* Tells a connection that was turned away why, then lets it close. One refused at its accept
 * may have its Hello on the way: it is read first, as closing a socket with bytes unread resets
 * it and the peer might lose the answer. */
static void say_busy(stage_conn *c) {
    stage *st = c->st;
    const uint32_t ms = st->o.timeout_ms < BUSY_ANSWER_MS ? st->o.timeout_ms : BUSY_ANSWER_MS;
    rlx__log(RLX_LOG_WARN, "driver connection %llu (%s): turned away%s: %s", (unsigned long long)c->no,
             *c->peer ? c->peer : "?", c->quiet ? " without a word" : "", c->busy);
    if (c->quiet)
        return;
    Rlx__Envelope *e = NULL;
    if (c->refused && rlx__net_recv(&st->net, c->conn, &e, (int)ms, NULL) == RLX_OK)
        rlx__envelope_free(e);
    rlx__net_send_error(&st->net, c->conn, 0, RLX_E_BUSY, c->busy, (int)ms);
}

/* Answers a request with an Error (and logs it); the connection stays up. Returns the send's status. */
static rlx_status refuse(stage_conn *c, uint64_t session, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static rlx_status refuse(stage_conn *c, uint64_t session, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rlx__log(RLX_LOG_WARN, "driver connection %llu: refused: %s", (unsigned long long)c->no, msg);
    stage *st = c->st;
    return rlx__net_send_error(&st->net, c->conn, session, code, msg, (int)st->o.timeout_ms);
}

/* The largest message a connection can legitimately send once its Hello is granted: a request of
 * as many rows as its sessions or slots hold positions, each a row of the stage's input. */
static uint64_t max_request_bytes(const stage *st, uint64_t rows) {
    const uint64_t in_width = st->spec.embed_input ? 1 : (uint64_t)st->cfg->hidden_size;
    const uint64_t bytes = rows * (in_width * 4 + ROW_OVERHEAD) + REQUEST_OVERHEAD;
    return bytes < TRANSPORT_MAX_MESSAGE ? bytes : TRANSPORT_MAX_MESSAGE;
}

static void set_max_message(stage *st, void *conn, uint64_t bytes) {
    if (RLX_HAS(rlx_transport_iface, st->net.t, set_max_message) && st->net.t->set_max_message)
        st->net.t->set_max_message(st->net.self, conn, bytes);
}

/* Receives the next message within limit_ms, polling the stop flag. */
static rlx_status recv_within(stage_conn *c, uint32_t limit_ms, Rlx__Envelope **e) {
    stage *st = c->st;
    const double deadline = rlx__now_seconds() + limit_ms / 1000.0;
    for (;;) {
        if (stopping(st))
            return RLX_E_TIMEOUT;
        if (atomic_load(&c->turned_away))
            return rlx_error(RLX_E_BUSY, "%s", c->busy);
        const double left_ms = (deadline - rlx__now_seconds()) * 1000.0;
        if (left_ms <= 0)
            return rlx_error(RLX_E_TIMEOUT, "no message within %u ms", limit_ms);
        const int wait = left_ms < st->o.poll_ms ? (int)left_ms + 1 : (int)st->o.poll_ms;
        rlx_status rc = rlx__net_recv(&st->net, c->conn, e, wait, NULL);
        if (rc != RLX_E_TIMEOUT)
            return rc;
    }
}

// ---- handshake ----

static uint32_t default_capacity(const stage *st) {
    int64_t max_pos = st->cfg->max_position_embeddings;
    uint32_t cap = st->o.session.kv_capacity;
    if (!cap)
        cap = max_pos > 0 && max_pos < 4096 ? (uint32_t)max_pos : 4096;
    return cap;
}

/* With a token: the challenge to the driver's Hello and the check of its proof. 0 when the peer
 * proved it holds the token, -1 after refusing it. Nothing of the Hello is looked at before. */
static int authenticate(stage_conn *c, const Rlx__Hello *h) {
    stage *st = c->st;
    if (h->auth_nonce.len != RLX__AUTH_NONCE_BYTES) {
        refuse(c, 0, RLX_E_AUTH,
               "this stage requires an auth token: give the driver the deployment's token "
               "(--auth-token-file, or auth: token_file in the deployment file)");
        return -1;
    }
    uint8_t nonce[RLX__AUTH_NONCE_BYTES], proof[RLX__AUTH_PROOF_BYTES];
    if (rlx__auth_nonce(nonce) != RLX_OK) {
        refuse(c, 0, RLX_E_INTERNAL, "the stage cannot authenticate now");
        return -1;
    }
    rlx__auth_proof(&st->auth, RLX__AUTH_STAGE_LABEL, h->auth_nonce.data, nonce, proof);
    Rlx__AuthChallenge ch = RLX__AUTH_CHALLENGE__INIT;
    ch.nonce = (ProtobufCBinaryData){sizeof nonce, nonce};
    ch.proof = (ProtobufCBinaryData){sizeof proof, proof};
    Rlx__Envelope out = RLX__ENVELOPE__INIT, *e = NULL;
    out.body_case = RLX__ENVELOPE__BODY_AUTH_CHALLENGE;
    out.auth_challenge = &ch;
    if (rlx__net_send(&st->net, c->conn, &out, (int)st->o.timeout_ms, NULL) != RLX_OK ||
        recv_within(c, st->o.timeout_ms, &e) != RLX_OK) {
        rlx__log(RLX_LOG_WARN, "driver connection %llu: authentication broke off: %s", (unsigned long long)c->no,
                 stopping(st) ? "stopping" : rlx_last_error());
        return -1;
    }
    int ok = e->body_case == RLX__ENVELOPE__BODY_AUTH_PROOF &&
             rlx__auth_proof_ok(&st->auth, RLX__AUTH_DRIVER_LABEL, h->auth_nonce.data, nonce, e->auth_proof->proof.data,
                                e->auth_proof->proof.len);
    if (!ok)
        refuse(c, 0, RLX_E_AUTH, "%s",
               e->body_case == RLX__ENVELOPE__BODY_AUTH_PROOF ? "wrong auth token (the driver's proof does not match)"
                                                              : "expected AuthProof");
    rlx__envelope_free(e);
    return ok ? 0 : -1;
}

/* Checks a Hello against this stage; 0 and a HelloReply sent, or -1 after refusing. */
static int handshake(stage_conn *c, const Rlx__Envelope *e) {
    stage *st = c->st;
    char mine[32], theirs[32];
    if (e->body_case != RLX__ENVELOPE__BODY_HELLO) {
        refuse(c, 0, RLX_E_INVALID, "expected Hello first, got %s", rlx__envelope_kind(e));
        return -1;
    }
    const Rlx__Hello *h = e->hello;
    if (st->auth.token && authenticate(c, h) != 0)
        return -1;
    c->authenticated = st->auth.token || st->auth.tls;
    if (h->protocol_version != RLX_DIST_PROTOCOL_VERSION) {
        refuse(c, 0, RLX_E_UNSUPPORTED, "driver speaks protocol version %u, this stage speaks version %d",
               h->protocol_version, RLX_DIST_PROTOCOL_VERSION);
        return -1;
    }
    if (!h->model_id || strcmp(h->model_id, st->model_id) != 0) {
        /* where the stage's files are is for its operator's log, not for the peer */
        rlx__log(RLX_LOG_WARN, "driver connection %llu: its model id %.16s... is not the id %.16s... of %s",
                 (unsigned long long)c->no, h->model_id ? h->model_id : "", st->model_id, rlx_model_dir(st->m));
        if (c->authenticated)
            refuse(c, 0, RLX_E_INVALID,
                   "model mismatch: the driver's model has id %.16s..., this stage's has id %.16s... "
                   "(config.json, safetensors or GGUF headers differ)",
                   h->model_id ? h->model_id : "", st->model_id);
        else
            refuse(c, 0, RLX_E_INVALID,
                   "model mismatch: the driver's model has id %.16s..., which this stage does not serve "
                   "(config.json, safetensors or GGUF headers differ)",
                   h->model_id ? h->model_id : "");
        return -1;
    }
    range_text(mine, sizeof mine, st->spec.layer_start, st->spec.layer_end);
    range_text(theirs, sizeof theirs, h->layer_start, h->layer_end);
    if (h->layer_start != st->spec.layer_start || h->layer_end != st->spec.layer_end) {
        refuse(c, 0, RLX_E_INVALID,
               "layer mismatch: the driver expects layers %s from stage %u of %u, this "
               "stage serves layers %s",
               theirs, h->stage_index, h->n_stages, mine);
        return -1;
    }
    if (h->activation_dtype != RLX__DTYPE__DTYPE_F32) {
        refuse(c, 0, RLX_E_UNSUPPORTED, "activation dtype %d is not supported (only F32)", (int)h->activation_dtype);
        return -1;
    }
    uint32_t cap = h->kv_capacity ? h->kv_capacity : default_capacity(st);
    int64_t max_pos = st->cfg->max_position_embeddings;
    if (max_pos > 0 && cap > max_pos) {
        refuse(c, 0, RLX_E_RANGE, "a context of %u positions exceeds the model's max_position_embeddings %lld", cap,
               (long long)max_pos);
        return -1;
    }
    if (h->emit_hidden && !st->spec.produce_logits) {
        refuse(c, 0, RLX_E_INVALID,
               "hidden states come from the last stage; this stage serves layers %s of "
               "%lld",
               mine, (long long)st->cfg->num_hidden_layers);
        return -1;
    }
    if (h->n_slots > RLX_ENGINE_MAX_SLOTS) { /* the engine that drives them has no more */
        refuse(c, 0, RLX_E_RANGE, "%u slots asked for, at most %d", h->n_slots, RLX_ENGINE_MAX_SLOTS);
        return -1;
    }
    pthread_mutex_lock(&st->mu);
    const uint32_t n_served = st->n_served;
    const int evicted = atomic_load(&c->turned_away);
    if (!evicted && n_served < st->o.max_connections) {
        pending_unlink(st, c);
        st->n_served++;
        c->served = 1;
    }
    pthread_mutex_unlock(&st->mu);
    if (evicted)
        return -1; /* connection_thread says why */
    if (!c->served) {
        refuse(c, 0, RLX_E_BUSY, "this stage serves %u driver connections already, its limit", n_served);
        return -1;
    }
    const uint64_t slot_positions = (uint64_t)h->n_slots * cap;
    if (h->n_slots && !reserve(st, c, slot_positions, 0)) {
        refuse(c, 0, RLX_E_BUSY, "%u slots of %u positions are more KV positions than this stage has left (%llu)",
               h->n_slots, cap, (unsigned long long)st->o.max_positions);
        return -1;
    }
    if (h->n_slots) {
        const rlx__batch_options bo = {.n_slots = h->n_slots,
                                       .capacity = cap,
                                       .kv_dtype = st->o.session.kv_dtype,
                                       .backends = st->o.session.backends,
                                       .n_backends = st->o.session.n_backends,
                                       .rules = st->o.session.rules,
                                       .n_rules = st->o.session.n_rules,
                                       .check_finite = st->o.session.check_finite};
        pthread_mutex_lock(&st->compute_mu);
        rlx_status rc = rlx__batch_create(st->m, &st->spec, &bo, &c->batch);
        pthread_mutex_unlock(&st->compute_mu);
        if (rc != RLX_OK) {
            c->batch = NULL;
            release(st, c, slot_positions, 0);
            refuse(c, 0, RLX_E_NOMEM, "cannot keep %u slots of %u positions: %s", h->n_slots, cap, rlx_last_error());
            return -1;
        }
        c->n_slots = h->n_slots;
        c->rows_step = 0;
    }
    c->kv_capacity = cap;
    c->emit_hidden = h->emit_hidden;
    /* a step carries at most the positions a session or all the slots hold */
    set_max_message(st, c->conn, max_request_bytes(st, c->n_slots ? slot_positions : cap));
    Rlx__HelloReply r = RLX__HELLO_REPLY__INIT;
    r.protocol_version = RLX_DIST_PROTOCOL_VERSION;
    r.model_id = st->model_id;
    r.layer_start = st->spec.layer_start;
    r.layer_end = st->spec.layer_end;
    r.backend = (char *)(st->o.backend_name ? st->o.backend_name : "ref");
    r.rss_bytes = resident_bytes();
    r.kv_capacity = cap;
    r.emit_hidden = c->emit_hidden;
    r.n_slots = c->n_slots;
    r.idle_timeout_ms = st->o.idle_timeout_ms;
    Rlx__Envelope out = RLX__ENVELOPE__INIT;
    out.body_case = RLX__ENVELOPE__BODY_HELLO_REPLY;
    out.hello_reply = &r;
    if (rlx__net_send(&st->net, c->conn, &out, (int)st->o.timeout_ms, NULL) != RLX_OK) {
        rlx__log(RLX_LOG_WARN, "driver connection %llu: cannot answer the handshake: %s", (unsigned long long)c->no,
                 rlx_last_error());
        return -1;
    }
    rlx__log(RLX_LOG_INFO, "driver connection %llu: stage %u of %u, layers %s, %u positions per session, %u slots",
             (unsigned long long)c->no, h->stage_index, h->n_stages, mine, cap, c->n_slots);
    return 0;
}

// ---- requests ----

static rlx_status send_ack(stage_conn *c, uint64_t session, uint64_t step) {
    Rlx__Ack a = RLX__ACK__INIT;
    a.session_id = session;
    a.step = step;
    Rlx__Envelope out = RLX__ENVELOPE__INIT;
    out.body_case = RLX__ENVELOPE__BODY_ACK;
    out.ack = &a;
    return rlx__net_send(&c->st->net, c->conn, &out, (int)c->st->o.timeout_ms, NULL);
}

static rlx_status on_activations(stage_conn *c, const Rlx__Activations *a) {
    stage *st = c->st;
    uint64_t id = a->session_id;
    stage_session *ss = session_find(c, id);
    int created = 0;
    if (!ss) {
        if (a->start_position != 0)
            return refuse(c, id, RLX_E_NOT_FOUND,
                          "unknown session %016llx (a session starts at position 0, this one at %u)",
                          (unsigned long long)id, a->start_position);
        if (c->n_sessions == c->cap_sessions) {
            const uint32_t cap = c->cap_sessions ? 2 * c->cap_sessions : 4;
            stage_session *grown = realloc(c->sessions, cap * sizeof *grown);
            if (!grown)
                return refuse(c, id, RLX_E_NOMEM, "out of memory for session %016llx", (unsigned long long)id);
            c->sessions = grown;
            c->cap_sessions = cap;
        }
        if (!reserve(st, c, c->kv_capacity, 1))
            return refuse(c, id, RLX_E_BUSY,
                          "session %016llx: this stage holds as many sessions (at most %u) or KV positions (at most "
                          "%llu) as it may",
                          (unsigned long long)id, st->o.max_sessions, (unsigned long long)st->o.max_positions);
        rlx_session_options so = st->o.session;
        so.kv_capacity = c->kv_capacity;
        rlx_session *s;
        rlx_block_spec spec = st->spec;
        spec.emit_hidden = (uint32_t)c->emit_hidden;
        pthread_mutex_lock(&st->compute_mu);
        rlx_status rc = rlx_session_create(st->m, &spec, &so, &s);
        pthread_mutex_unlock(&st->compute_mu);
        if (rc != RLX_OK) {
            release(st, c, c->kv_capacity, 1);
            return refuse(c, id, RLX_E_INTERNAL, "cannot create session %016llx: %s", (unsigned long long)id,
                          rlx_last_error());
        }
        ss = &c->sessions[c->n_sessions++];
        *ss = (stage_session){.id = id, .s = s};
        created = 1;
        rlx__log(RLX_LOG_INFO, "session %016llx started", (unsigned long long)id);
    }
    if (a->step <= ss->last_step) {
        rlx_status rc =
            refuse(c, id, RLX_E_INVALID, "session %016llx: step %llu is out of order (the previous step was %llu)",
                   (unsigned long long)id, (unsigned long long)a->step, (unsigned long long)ss->last_step);
        if (created)
            session_remove(c, ss);
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
        rlx_status rc = refuse(c, id, RLX_E_INVALID, "session %016llx step %llu: the request %s",
                               (unsigned long long)id, (unsigned long long)a->step, problem);
        if (created)
            session_remove(c, ss);
        return rc;
    }
    int all_rows = logits && a->all_rows;
    const float *out;
    pthread_mutex_lock(&st->compute_mu);
    rlx_status rc = rlx_session_forward(ss->s, a->data.data, n, all_rows, &out);
    pthread_mutex_unlock(&st->compute_mu);
    if (rc != RLX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rlx_last_error());
        rc = refuse(c, id, RLX_E_INTERNAL, "session %016llx step %llu: %s", (unsigned long long)id,
                    (unsigned long long)a->step, msg);
        if (created)
            session_remove(c, ss);
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
    if (c->emit_hidden) {
        r.hidden.len = (size_t)n * (size_t)st->cfg->hidden_size * sizeof(float);
        r.hidden.data = (uint8_t *)rlx_session_hidden(ss->s);
    }
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &r;
    return rlx__net_send(&st->net, c->conn, &e, (int)st->o.timeout_ms, NULL);
}

static rlx_status on_truncate(stage_conn *c, const Rlx__Truncate *t) {
    stage_session *ss = session_find(c, t->session_id);
    unsigned long long id = (unsigned long long)t->session_id;
    if (!ss)
        return refuse(c, t->session_id, RLX_E_NOT_FOUND, "Truncate for unknown session %016llx", id);
    if (t->step <= ss->last_step)
        return refuse(c, t->session_id, RLX_E_INVALID,
                      "session %016llx: step %llu is out of order (the previous step was %llu)", id,
                      (unsigned long long)t->step, (unsigned long long)ss->last_step);
    ss->last_step = t->step;
    pthread_mutex_lock(&c->st->compute_mu);
    rlx_status rc = rlx_session_truncate(ss->s, t->length);
    pthread_mutex_unlock(&c->st->compute_mu);
    if (rc != RLX_OK)
        return refuse(c, t->session_id, RLX_E_RANGE, "session %016llx: %s", id, rlx_last_error());
    return send_ack(c, t->session_id, t->step);
}

static rlx_status on_end(stage_conn *c, const Rlx__EndSession *e) {
    stage_session *ss = session_find(c, e->session_id);
    if (ss) {
        session_remove(c, ss);
        rlx__log(RLX_LOG_INFO, "session %016llx ended", (unsigned long long)e->session_id);
    }
    return send_ack(c, e->session_id, 0);
}

/* A Rows or CopySlot (`what`) needs the slots of the Hello and a step after the previous one:
 * 1 and the step taken, or 0 after refusing (*rc the refusal's send status). */
static int slot_step_in_order(stage_conn *c, const char *what, uint64_t step, rlx_status *rc) {
    if (!c->batch) {
        *rc = refuse(c, 0, RLX_E_INVALID, "%s from a driver that asked for no slots in its Hello", what);
        return 0;
    }
    if (step <= c->rows_step) {
        *rc = refuse(c, 0, RLX_E_INVALID, "%s step %llu is out of order (the previous step was %llu)", what,
                     (unsigned long long)step, (unsigned long long)c->rows_step);
        return 0;
    }
    c->rows_step = step;
    return 1;
}

/* A step of the connection's slots: checks every row against the slots, runs them and answers
 * with the hidden rows (or the logits of out_rows from the last stage). */
static rlx_status on_rows(stage_conn *c, const Rlx__Rows *a) {
    stage *st = c->st;
    rlx_status rc;
    if (!slot_step_in_order(c, "Rows", a->step, &rc))
        return rc;
    const uint32_t n = a->n_rows;
    const int embed = st->spec.embed_input != 0, logits = st->spec.produce_logits != 0;
    const uint32_t in_width = embed ? 1 : (uint32_t)st->cfg->hidden_size;
    const int in_dtype = embed ? RLX__DTYPE__DTYPE_I32 : RLX__DTYPE__DTYPE_F32;
    const unsigned long long step = (unsigned long long)a->step;
    if (n == 0 || a->n_positions != n || a->n_slots != n)
        return refuse(c, 0, RLX_E_INVALID, "Rows step %llu: %u rows with %zu positions and %zu slots", step, n,
                      a->n_positions, a->n_slots);
    if (a->width != in_width || (int)a->dtype != in_dtype || a->data.len != (size_t)n * in_width * 4)
        return refuse(c, 0, RLX_E_INVALID,
                      "Rows step %llu: %zu bytes of %u %s values per row for %u rows, this stage takes rows of %u "
                      "%s values (%s)",
                      step, a->data.len, a->width, rlx__dtype_name(a->dtype), n, in_width,
                      rlx__dtype_name((Rlx__DType)in_dtype), embed ? "token ids" : "hidden states");
    if (logits ? a->n_out_rows == 0 || a->n_out_rows > n : a->n_out_rows != 0)
        return refuse(c, 0, RLX_E_INVALID, "Rows step %llu: %zu logits rows of %u rows to a stage %s", step,
                      a->n_out_rows, n, logits ? "that returns logits (want 1 to the rows)" : "that returns no logits");
    for (uint32_t r = 0; r < n; r++) {
        if (a->slots[r] >= c->n_slots || a->positions[r] >= c->kv_capacity)
            return refuse(c, 0, RLX_E_RANGE,
                          "Rows step %llu: row %u is position %u of slot %u, beyond %u slots of %u positions", step, r,
                          a->positions[r], a->slots[r], c->n_slots, c->kv_capacity);
        if (embed &&
            (((const int32_t *)a->data.data)[r] < 0 || ((const int32_t *)a->data.data)[r] >= st->cfg->vocab_size))
            return refuse(c, 0, RLX_E_RANGE, "Rows step %llu: row %u: token id %d is outside the vocabulary", step, r,
                          ((const int32_t *)a->data.data)[r]);
    }
    for (size_t k = 0; k < a->n_out_rows; k++)
        if (a->out_rows[k] >= n)
            return refuse(c, 0, RLX_E_RANGE, "Rows step %llu: logits row %zu names row %u of %u", step, k,
                          a->out_rows[k], n);
    /* the values were checked to fit: the uint32 arrays are the int32 the block reads */
    const float *out;
    pthread_mutex_lock(&st->compute_mu);
    rc = rlx__batch_run(c->batch, a->data.data, (const int32_t *)a->positions, (const int32_t *)a->slots, n,
                        (const int32_t *)a->out_rows, (uint32_t)a->n_out_rows, &out);
    pthread_mutex_unlock(&st->compute_mu);
    if (rc != RLX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rlx_last_error());
        return refuse(c, 0, RLX_E_INTERNAL, "Rows step %llu: %s", step, msg);
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
    return rlx__net_send(&st->net, c->conn, &e, (int)st->o.timeout_ms, NULL);
}

static rlx_status on_copy_slot(stage_conn *c, const Rlx__CopySlot *cs) {
    rlx_status rc;
    if (!slot_step_in_order(c, "CopySlot", cs->step, &rc))
        return rc;
    if (cs->from_slot >= c->n_slots || cs->to_slot >= c->n_slots || cs->from_slot == cs->to_slot ||
        cs->n_positions > c->kv_capacity)
        return refuse(c, 0, RLX_E_RANGE, "CopySlot of %u positions from slot %u to slot %u of %u slots of %u",
                      cs->n_positions, cs->from_slot, cs->to_slot, c->n_slots, c->kv_capacity);
    pthread_mutex_lock(&c->st->compute_mu);
    rlx__batch_copy(c->batch, cs->from_slot, cs->to_slot, cs->n_positions);
    pthread_mutex_unlock(&c->st->compute_mu);
    return send_ack(c, 0, cs->step);
}

// ---- connections ----

static rlx_status on_ping(stage_conn *c, const Rlx__Ping *p) { return send_ack(c, 0, p->nonce); }

/* Serves one connection until it ends: the handshake within timeout_ms of the accept (pre-
 * handshake messages of a few kB at most), then requests, each within idle_timeout_ms of the
 * last. */
static void serve_connection(stage_conn *c) {
    stage *st = c->st;
    Rlx__Envelope *e = NULL;
    set_max_message(st, c->conn, PRE_HANDSHAKE_MAX_MESSAGE);
    rlx_status rc = recv_within(c, st->o.timeout_ms, &e);
    if (rc != RLX_OK) {
        if (!stopping(st) && rc != RLX_E_BUSY) /* turned away: connection_thread says why */
            rlx__log(RLX_LOG_WARN, "driver connection %llu: no handshake: %s", (unsigned long long)c->no,
                     rlx_last_error());
        if (rc == RLX_E_FORMAT)
            rlx__net_send_error(&st->net, c->conn, 0, RLX_E_FORMAT, rlx_last_error(), (int)st->o.timeout_ms);
        return;
    }
    int ok = handshake(c, e) == 0;
    rlx__envelope_free(e);
    while (ok && !stopping(st)) {
        rc = recv_within(c, st->o.idle_timeout_ms, &e);
        if (rc != RLX_OK) {
            if (stopping(st))
                break;
            if (rc == RLX_E_PEER)
                rlx__log(RLX_LOG_INFO, "driver connection %llu closed: %s", (unsigned long long)c->no,
                         rlx_last_error());
            else if (rc == RLX_E_TIMEOUT)
                rlx__log(RLX_LOG_WARN, "driver connection %llu: closed after %u ms without a message (idle timeout)",
                         (unsigned long long)c->no, st->o.idle_timeout_ms);
            else
                rlx__log(RLX_LOG_WARN, "driver connection %llu dropped: %s", (unsigned long long)c->no,
                         rlx_last_error());
            if (rc == RLX_E_FORMAT) /* the framing may be lost: say why, then hang up */
                rlx__net_send_error(&st->net, c->conn, 0, RLX_E_FORMAT, rlx_last_error(), (int)st->o.timeout_ms);
            break;
        }
        switch (e->body_case) {
        case RLX__ENVELOPE__BODY_ACTIVATIONS:
            rc = on_activations(c, e->activations);
            break;
        case RLX__ENVELOPE__BODY_TRUNCATE:
            rc = on_truncate(c, e->truncate);
            break;
        case RLX__ENVELOPE__BODY_END_SESSION:
            rc = on_end(c, e->end_session);
            break;
        case RLX__ENVELOPE__BODY_ROWS:
            rc = on_rows(c, e->rows);
            break;
        case RLX__ENVELOPE__BODY_COPY_SLOT:
            rc = on_copy_slot(c, e->copy_slot);
            break;
        case RLX__ENVELOPE__BODY_PING:
            rc = on_ping(c, e->ping);
            break;
        default:
            rc = refuse(c, 0, RLX_E_INVALID, "unexpected %s after the handshake", rlx__envelope_kind(e));
            break;
        }
        rlx__envelope_free(e);
        if (rc != RLX_OK) {
            rlx__log(RLX_LOG_WARN, "driver connection %llu: cannot answer: %s", (unsigned long long)c->no,
                     rlx_last_error());
            break;
        }
    }
}

static void *connection_thread(void *arg) {
    stage_conn *c = arg;
    stage *st = c->st;
    serve_connection(c);
    if (atomic_load(&c->turned_away) && !stopping(st))
        say_busy(c);
    sessions_clear(c);
    if (c->batch) {
        pthread_mutex_lock(&st->compute_mu);
        rlx__batch_destroy(c->batch);
        pthread_mutex_unlock(&st->compute_mu);
    }
    st->net.t->conn_close(st->net.self, c->conn);
    pthread_mutex_lock(&st->mu);
    st->n_positions -= c->reserved; /* the slots' positions; the sessions gave theirs back */
    if (c->served) {
        st->n_served--;
        st->n_drivers++;
        if (st->o.max_drivers && st->n_drivers >= st->o.max_drivers)
            atomic_store(&st->quit, 1);
    } else if (c->pending) {
        pending_unlink(st, c);
    } else {
        st->n_leaving--;
        st->n_told -= !c->quiet;
    }
    c->next_ended = st->ended;
    st->ended = c;
    st->n_open--;
    pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Joins the connection threads that have ended and frees their connections. */
static void join_ended(stage *st) {
    pthread_mutex_lock(&st->mu);
    stage_conn *c = st->ended;
    st->ended = NULL;
    pthread_mutex_unlock(&st->mu);
    while (c) {
        stage_conn *next = c->next_ended;
        pthread_join(c->thread, NULL);
        free(c->sessions);
        free(c);
        c = next;
    }
}

/* Hands an accepted connection to a thread of its own. When its host holds its share of the
 * places for connections awaiting their handshake, or every place is taken, an older pending
 * connection is evicted to make room (choose_eviction); when none may be, the new one is told
 * that the stage is busy. Those turned away leave on their own threads (turn_away); the threads
 * are bounded: beyond max_connections + 3 * RLX_DIST_MAX_HANDSHAKES (served, pending, saying
 * busy, and leaving without a word, which takes at most poll_ms) a new one is closed at once. */
static void start_connection(stage *st, void *conn) {
    stage_conn *c = rlx__calloc(1, sizeof *c);
    if (!c) {
        rlx__log(RLX_LOG_WARN, "a connection closed at once: no memory for it");
        st->net.t->conn_close(st->net.self, conn);
        return;
    }
    *c = (stage_conn){.st = st, .conn = conn, .accepted_at = rlx__now_seconds()};
    if (RLX_HAS(rlx_transport_iface, st->net.t, peer_address) && st->net.t->peer_address &&
        st->net.t->peer_address(st->net.self, conn, c->peer, sizeof c->peer) != RLX_OK)
        c->peer[0] = '\0';
    peer_host_of(c->peer, c->peer_host, sizeof c->peer_host);
    pthread_mutex_lock(&st->mu);
    c->no = ++st->conn_no;
    int fits = 0, admitted = 0;
    uint32_t from_host = 0;
    const uint32_t n_pending = st->n_handshakes;
    const int room = st->n_open < st->o.max_connections + 3u * RLX_DIST_MAX_HANDSHAKES;
    stage_conn *out = room ? choose_eviction(st, c->peer_host, &fits, &from_host) : NULL;
    if (out && from_host)
        turn_away(st, out,
                  "the stage is busy: %u connections from this host are awaiting their handshake (at most %d), and "
                  "this one, waiting longest, made room for a newer one; try again",
                  from_host, RLX_DIST_MAX_HANDSHAKES_PER_HOST);
    else if (out)
        turn_away(st, out,
                  "the stage is busy: %u connections are awaiting their handshake (at most %d), and this one, the "
                  "oldest of its host, made room for a newer one; try again",
                  n_pending, RLX_DIST_MAX_HANDSHAKES);
    if (out || fits) {
        pending_link(st, c);
        admitted = 1;
    } else if (room && st->n_told < RLX_DIST_MAX_HANDSHAKES) {
        turn_away(st, c,
                  "the stage is busy: %u connections are awaiting their handshake (at most %d), each from another "
                  "host and none waiting long enough to be dropped; try again in a few seconds",
                  n_pending, RLX_DIST_MAX_HANDSHAKES);
        admitted = 1;
    }
    if (admitted)
        st->n_open++;
    pthread_mutex_unlock(&st->mu);
    if (admitted) {
        /* logged first: once started, the thread owns c */
        rlx__log(RLX_LOG_INFO, "driver connection %llu accepted from %s", (unsigned long long)c->no,
                 *c->peer ? c->peer : "?");
        if (pthread_create(&c->thread, NULL, connection_thread, c) == 0)
            return;
        pthread_mutex_lock(&st->mu);
        if (c->pending)
            pending_unlink(st, c);
        else
            st->n_leaving--, st->n_told -= !c->quiet;
        st->n_open--;
        pthread_mutex_unlock(&st->mu);
    }
    rlx__log(RLX_LOG_WARN, "connection %llu from %s closed at once: %s", (unsigned long long)c->no,
             *c->peer ? c->peer : "?",
             admitted ? "no thread for it" : "too many connections are open, awaiting their handshake or leaving");
    st->net.t->conn_close(st->net.self, conn);
    free(c);
}

/* KV positions whose cache takes half the machine's memory, for this stage's layers. */
static uint64_t default_max_positions(const stage *st) {
    const rlx_model_config *cfg = st->cfg;
    const uint64_t head_dim =
        cfg->head_dim > 0
            ? (uint64_t)cfg->head_dim
            : (uint64_t)(cfg->hidden_size / (cfg->num_attention_heads > 0 ? cfg->num_attention_heads : 1));
    const int64_t kv_cols = (int64_t)(cfg->num_key_value_heads > 0 ? cfg->num_key_value_heads : 1) * (int64_t)head_dim;
    const size_t row = rlx_iface_row_bytes(st->o.session.kv_dtype, kv_cols); /* 0: a type the session refuses */
    const uint64_t per_position =
        (uint64_t)(st->spec.layer_end - st->spec.layer_start) * 2 * (row ? row : (size_t)kv_cols * sizeof(float));
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (8ull << 30);
    const uint64_t n = memory / 2 / (per_position ? per_position : 1);
    return n > 0 ? n : 1;
}

/* A stage without credentials listens on loopback only, unless told otherwise; says which. */
static rlx_status check_listen_address(const stage *st) {
    const int credentials = st->auth.token || st->auth.tls;
    /* MPI ranks are reached through the job's own fabric, not an address a stranger can dial */
    const int network = strcmp(st->net.name, "mpi") != 0;
    if (credentials || !network || rlx__address_is_loopback(st->o.address)) {
        /* the credentials in force, the transport options' TLS files included */
        const rlx_dist_security in_force = {.tls_ca = st->auth.tls ? "" : NULL,
                                            .auth_token_file = st->auth.token ? "" : NULL};
        rlx__log(RLX_LOG_INFO, "%s", rlx_dist_security_mode(&in_force, st->o.address, st->net.name));
        return RLX_OK;
    }
    if (!st->o.security.insecure_listen)
        return rlx_error(RLX_E_INVALID,
                         "will not listen on %s without credentials: anyone who reaches it could run this stage. "
                         "Give an auth token (--auth-token-file) or TLS (--tls-ca, --tls-cert, --tls-key), listen on "
                         "127.0.0.1, or accept the risk with --insecure-listen",
                         st->o.address);
    rlx__log(RLX_LOG_WARN,
             "listening on %s without authentication (--insecure-listen): anyone who reaches it can use this stage",
             st->o.address);
    return RLX_OK;
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
        st.o.max_sessions = RLX_DIST_MAX_SESSIONS;
    if (!st.o.max_connections)
        st.o.max_connections = RLX_DIST_MAX_CONNECTIONS;
    if (!st.o.idle_timeout_ms)
        st.o.idle_timeout_ms = RLX_DIST_IDLE_TIMEOUT_MS;
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
    if (!st.o.max_positions)
        st.o.max_positions = default_max_positions(&st);
    rlx_status rc = rlx_model_check_block(m, &st.spec);
    if (rc == RLX_OK)
        rc = rlx__model_id_of(m, st.model_id);
    /* the transport refuses anything larger than the largest request this stage may grant */
    if (rc == RLX_OK)
        rc = rlx__auth_init(&st.auth, &st.o.security, st.o.transport_options,
                            max_request_bytes(&st, st.o.max_positions), 0);
    if (rc != RLX_OK)
        return rc;
    if (st.o.prefetch && (rc = rlx_model_prefetch(m, &st.spec, NULL, NULL)) != RLX_OK) {
        rlx__auth_free(&st.auth);
        return rc;
    }
    pthread_mutex_init(&st.compute_mu, NULL);
    pthread_mutex_init(&st.mu, NULL);
    rlx__cond_init_monotonic(&st.changed);
    if ((rc = rlx__net_open(st.o.transport, st.auth.options, &st.net)) != RLX_OK)
        goto done;
    if ((rc = check_listen_address(&st)) != RLX_OK)
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
    while (!stopping(&st)) {
        void *conn = NULL;
        int arc = st.net.t->accept(st.net.self, st.listener, (int)st.o.poll_ms, &conn);
        join_ended(&st);
        if (arc == RLX_E_TIMEOUT || (arc == RLX_OK && !conn))
            continue;
        if (arc < 0) { /* e.g. out of descriptors: keep serving, but do not spin */
            rlx__log(RLX_LOG_WARN, "accept on %s failed: %s", st.bound, rlx_last_error());
            struct timespec ts = {0, (long)st.o.poll_ms * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        start_connection(&st, conn);
    }
    rlx__log(RLX_LOG_INFO, "stopping");
    rc = RLX_OK;
done:
    /* the connections see the stop within poll_ms (a forward in progress finishes first) */
    atomic_store(&st.quit, 1);
    pthread_mutex_lock(&st.mu);
    while (st.n_open)
        pthread_cond_wait(&st.changed, &st.mu);
    pthread_mutex_unlock(&st.mu);
    join_ended(&st);
    if (st.listener)
        st.net.t->listener_close(st.net.self, st.listener);
    rlx__net_close(&st.net);
    rlx__auth_free(&st.auth);
    pthread_cond_destroy(&st.changed);
    pthread_mutex_destroy(&st.mu);
    pthread_mutex_destroy(&st.compute_mu);
    return rc;
}
