/* transport-grpc: rlx messages over gRPC (the C core API of grpc 1.51, no C++).
 *
 * A connection is one long-lived bidirectional streaming call "/rlx.Pipeline/Link" on its own
 * channel (so its own TCP connection); each transport message is one gRPC message whose bytes
 * are the opaque payload. Every connection owns a `next` completion queue, and every operation
 * posted on its call has a tag struct (grpct_op) inside the connection that records whether it
 * is still in flight. The thread that calls send/recv drives that queue itself until what it
 * waits for arrives or its deadline passes: no hand-off to another thread on the message path.
 * Invariants per connection:
 *   - one RECV_MESSAGE is in flight whenever the stream is open and no received message is
 *     waiting (at most one message is buffered, so a slow reader back-pressures the sender);
 *   - at most one SEND_MESSAGE is in flight: send copies the payload, posts it and returns;
 *     the next send first waits (within its own timeout) for the previous one to complete;
 *   - a timeout never leaves an untracked operation: the posted ops stay in flight, tracked,
 *     and the connection stays usable. Nothing is destroyed before every op has completed
 *     (after a cancel if need be).
 * The client posts RECV_INITIAL_METADATA in its first batch (without it RECV_MESSAGE never
 * completes); the server sends its initial metadata when the call is accepted. connect waits
 * for the channel to be READY (so a missing server fails within the timeout, with gRPC's
 * reason obtained from a fail-fast probe call) before it starts the stream. A connection that
 * was refused until the deadline is RLX_E_PEER; a channel still CONNECTING then is RLX_E_TIMEOUT,
 * and a plain TCP connection (up to GRPCT_TCP_CHECK_MS past the deadline) tells whether
 * something accepted but never answered HTTP/2 or nothing answered at all. A peer that accepted
 * the connection and failed the handshake for a TLS reason fails connect at once (see TLS).
 *
 * Closing is graceful, like closing a socket: conn_close hands the connection to the progress
 * thread, which lets the last send complete, half-closes (client) or sends an OK status
 * (server), and waits up to linger_ms for the peer to end its side before it cancels. The peer
 * reads every message sent before the close, then RLX_E_PEER "the peer closed the stream".
 *
 * A listener is a grpc_server with its own notification queue and GRPCT_BACKLOG request_call
 * slots posted at all times, each bound to the queue its connection will use, so several
 * streams can be accepted and served concurrently. The server lives until the listener and
 * every connection accepted from it are closed.
 *
 * gRPC C core makes progress only inside completion-queue waits. The progress thread (one per
 * transport instance) waits on a private queue whenever the application has made no call for
 * a couple of milliseconds, so the process accepts connections and answers HTTP/2 handshakes,
 * keepalive pings and window updates while the application computes; it also finishes closed
 * connections. With poller=off there is no thread: a peer's connect then completes only while
 * this process is inside a transport call, and conn_close blocks for up to linger_ms.
 *
 * TLS (tls_ca, tls_cert, tls_key, tls_name; see transport_iface.h): the files are read and checked
 * at open (a key that is not the certificate's fails there) and become one set of gRPC SSL
 * credentials per instance. A listener requires and verifies a client certificate chaining to
 * tls_ca; gRPC finishes every handshake before the call reaches a request_call slot, so a peer
 * that fails it, or stays silent, is never accepted and holds no slot (gRPC runs handshakes
 * concurrently: it delays no other client). connect verifies the server's certificate against
 * tls_ca and the host of the address (IP literals match IP SANs) or tls_name. gRPC 1.51's C API
 * cannot set a minimum TLS version: both ends offer TLS 1.2 and 1.3, and two rlx processes
 * negotiate 1.3. When a handshake fails, gRPC says little ("Socket closed"); each time the
 * channel fails with the connection not refused, connect runs a TLS handshake of its own with
 * OpenSSL to tell why (grpct_tls_cause). A certain TLS cause ends connect at once, within a
 * second, rather than at its deadline (gRPC would fail every retry alike): RLX_E_AUTH "TLS
 * handshake with HOST:PORT failed: certificate verify failed: certificate has expired", "...the
 * stage refused this process's certificate: tls_cert expired on ...", "...the stage's
 * certificate does not name 127.0.0.1 ...", "...the stage does not speak TLS ...", "...the stage
 * speaks TLS and this process plaintext ...". A refused connection (nothing listens yet: a stage
 * still loading its weights), a stage that took our own handshake, or one that went silent is
 * retried until the deadline as before.
 *
 * Receive limits: gRPC's (GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, from max_message) is fixed per
 * channel or server, so set_max_message's lower limit per connection is checked in recv once the
 * message is in; a longer message is RLX_E_FORMAT and ends the stream with RESOURCE_EXHAUSTED,
 * which the peer reports as RLX_E_FORMAT too. gRPC 1.51 buffers a message as its bytes arrive
 * (never by its 5-byte header's claim) but applies its own limit only when the whole message is
 * in: a peer can make a receiver hold one message of up to 4 GiB before it is refused.
 *
 * gRPC's own log lines reach the host's log at RLX_LOG_DEBUG, prefixed "libgrpc" (see grpct_log);
 * nothing of gRPC is written to stderr directly.
 *
 * Options ("key=value" separated by commas, all optional):
 *   max_message=N[K|M|G]  largest message either way (default and maximum 2G-1; gRPC counts
 *                         message lengths in an int)
 *   linger_ms=N           how long a closed connection may take to deliver its last messages
 *                         and see the peer's end of the stream (default 5000); after that the
 *                         call is cancelled and messages the peer has not read are lost.
 *                         close() waits for connections still lingering.
 *   keepalive_ms=N        HTTP/2 keepalive ping interval; 0 disables (default 30000)
 *   keepalive_timeout_ms=N  how long a ping may go unanswered (default 20000): a peer that
 *                         vanished or froze without closing its socket is an error after about
 *                         keepalive_ms + keepalive_timeout_ms
 *   handshake_ms=N        listeners: how long an accepted socket may take to finish its TLS
 *                         handshake and send its HTTP/2 settings before it is closed (default
 *                         5000; gRPC's own 120 s would let idle sockets hold descriptors)
 *   poller=on|off         the progress thread (default on)
 *   tls_ca=FILE, tls_cert=FILE, tls_key=FILE  mutual TLS, all three or none (PEM files)
 *   tls_name=NAME         connect: the name the server's certificate must carry instead of the
 *                         address's host */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "rlx/transport_iface.h"

#define GRPCT_METHOD "/rlx.Pipeline/Link"
/* What connect sends to learn why a channel cannot connect; servers refuse it (UNIMPLEMENTED). */
#define GRPCT_PROBE_METHOD "/rlx.Pipeline/Probe"
#define GRPCT_BACKLOG 8
/* How long connect, once its deadline has passed, lets a plain TCP connection take to find out
 * whether a peer that never answered gRPC's handshake is there at all. */
#define GRPCT_TCP_CHECK_MS 500
/* Worded as the tcp transport words it: a stage's commonest start-up failure reads the same. */
#define GRPCT_IN_USE "the port is in use (another process listens there, perhaps another rlx stage)"
#define GRPCT_ADDR_MAX 320
#define GRPCT_ALIGN 64
#define GRPCT_DEFAULT_LINGER_MS 5000
#define GRPCT_DEFAULT_KEEPALIVE_MS 30000
#define GRPCT_DEFAULT_KEEPALIVE_TIMEOUT_MS 20000
#define GRPCT_DEFAULT_HANDSHAKE_MS 5000
/* The progress thread polls in slices of GRPCT_POLL_MS, and only after GRPCT_QUIET_MS without
 * any call from the application. */
#define GRPCT_POLL_MS 10
#define GRPCT_QUIET_MS 2
/* Bound on waiting for ops to finish after a cancel; they normally finish at once. */
#define GRPCT_DRAIN_MS 10000
/* Largest TLS file read at open: a certificate chain is a few KiB. */
#define GRPCT_PEM_MAX (1 << 20)

/* The TLS files, in the order their options are listed. */
enum { GRPCT_TLS_CA, GRPCT_TLS_CERT, GRPCT_TLS_KEY, GRPCT_TLS_N };
static const char *const grpct_tls_keys[GRPCT_TLS_N] = {"tls_ca", "tls_cert", "tls_key"};

typedef enum grpct_op_kind {
    GRPCT_OP_INIT,   /* client: SEND+RECV_INITIAL_METADATA; server: SEND_INITIAL_METADATA */
    GRPCT_OP_RECV,   /* RECV_MESSAGE */
    GRPCT_OP_SEND,   /* SEND_MESSAGE */
    GRPCT_OP_STATUS, /* client: RECV_STATUS_ON_CLIENT; server: RECV_CLOSE_ON_SERVER */
    GRPCT_OP_CLOSE,  /* client: SEND_CLOSE_FROM_CLIENT; server: SEND_STATUS_FROM_SERVER */
    GRPCT_OP_WATCH,  /* client: channel connectivity watch during connect */
    GRPCT_OP_PROBE,  /* client: the probe call during connect */
    GRPCT_OP_ACCEPT, /* server: this slot's request_call matched (on the listener's queue) */
    GRPCT_N_OPS
} grpct_op_kind;

struct grpct_conn;

typedef struct grpct_op {
    struct grpct_conn *c;
    int kind;
    bool pending;
    bool success; /* of the latest completion */
} grpct_op;

typedef struct grpct grpct;
typedef struct grpct_listener grpct_listener;

typedef struct grpct_conn {
    grpct *t;
    bool is_server;
    grpc_completion_queue *cq;
    grpc_channel *channel; /* client: owned */
    grpc_call *call;
    grpct_listener *listener; /* server: holds a reference */
    char peer[GRPCT_ADDR_MAX];
    grpct_op ops[GRPCT_N_OPS];
    int n_pending;             /* ops of this connection still in flight, on cq (ACCEPT excluded) */
    grpc_byte_buffer *recv_bb; /* target of the RECV_MESSAGE in flight */
    grpc_byte_buffer *ready;   /* a received message the application has not taken yet */
    grpc_byte_buffer *send_bb; /* the SEND_MESSAGE in flight */
    bool eof;                  /* RECV_MESSAGE gave no message: the stream is over */
    bool recv_failed;          /* ...and not by a graceful end of stream */
    bool send_failed, init_failed;
    /* client: initial and trailing metadata, final status */
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice status_details;
    /* server: what request_call filled in, and RECV_CLOSE_ON_SERVER's result */
    grpc_call_details details;
    grpc_metadata_array md_request;
    int cancelled;
    grpc_slice status_text;         /* SEND_STATUS_FROM_SERVER details */
    uint64_t max_message;           /* the largest message recv accepts (set_max_message) */
    size_t refused;                 /* the length of a message refused as over max_message, else 0 */
    bool close_posted;              /* conn_close sent our end of the stream */
    gpr_timespec expiry;            /* a closing connection is cancelled after this */
    bool linked;                    /* in t->conns (open connections) */
    struct grpct_conn *prev, *next; /* in t->conns; next also chains t->zombies */
} grpct_conn;

struct grpct_listener {
    grpct *t;
    grpc_server *server;
    grpc_completion_queue *cq; /* registered with the server: new calls and the shutdown tag */
    char address[GRPCT_ADDR_MAX], bound[GRPCT_ADDR_MAX];
    pthread_mutex_t accept_mu;        /* one accept at a time; held while it waits, guards slots */
    pthread_mutex_t mu;               /* refs (taken briefly, also by conn_close on any thread) */
    int refs;                         /* the handle plus each accepted connection still open */
    grpct_conn *slots[GRPCT_BACKLOG]; /* request_call posted, not yet accepted (NULL: free) */
    grpct_op shutdown_op;
    struct grpct_listener *prev, *next; /* in t->listeners */
};

struct grpct {
    const rlx_host *host;
    int max_message, linger_ms, keepalive_ms, keepalive_timeout_ms, handshake_ms;
    bool use_poller;
    /* TLS (NULL when plaintext): made once at open from the tls_ files, shared by every
     * listener and connection of the instance */
    grpc_server_credentials *tls_server;
    grpc_channel_credentials *tls_channel;
    SSL_CTX *tls_probe;  /* this process's certificate, for grpct_tls_probe */
    char tls_name[256];  /* tls_name, or "" to check the host of the address */
    pthread_mutex_t mu;  /* the lists */
    grpct_conn *conns;   /* open connections (connected or accepted, not closed yet) */
    grpct_conn *zombies; /* closed by the application, finished by the progress thread */
    grpct_listener *listeners;
    /* the progress thread */
    pthread_t poller;
    bool poller_started;
    grpc_completion_queue *poller_cq;
    atomic_int active;    /* application threads inside a call of this instance */
    atomic_uint calls;    /* calls made so far, so the thread notices activity between looks */
    atomic_bool stopping; /* close() asks the thread to finish */
};

// ---- logging: gRPC's own log lines go to the host, never to stderr ----

static const rlx_host *_Atomic grpct_log_host;
static pthread_mutex_t grpct_global_mu = PTHREAD_MUTEX_INITIALIZER;
static int grpct_n_instances; /* under grpct_global_mu */
/* The latest gRPC error logged on this thread: the only place some failures explain themselves. */
static _Thread_local char grpct_last_log[1024];

/* Every line is RLX_LOG_DEBUG, even gRPC's errors: each failure that matters comes back from the
 * call as this plugin's own one-line error (its cause taken from grpct_last_log when gRPC says it
 * nowhere else), so gRPC's nested detail is for whoever asked for verbose output. The
 * exception is a failed assertion, after which gRPC aborts: that line is the only explanation.
 * The "libgrpc" prefix and gRPC's source position set these lines apart from the plugin's own. */
static void grpct_log(gpr_log_func_args *args) {
    if (args->severity == GPR_LOG_SEVERITY_ERROR)
        snprintf(grpct_last_log, sizeof grpct_last_log, "%s", args->message);
    const rlx_host *h = atomic_load(&grpct_log_host);
    if (!h)
        return;
    const char *file = args->file ? strrchr(args->file, '/') : NULL;
    const int level = !strncmp(args->message, "assertion failed", 16) ? RLX_LOG_ERROR : RLX_LOG_DEBUG;
    h->log(level, "libgrpc %s %s:%d: %s", gpr_log_severity_string(args->severity),
           file         ? file + 1
           : args->file ? args->file
                        : "?",
           args->line, args->message);
}

/* The cause in a gRPC error log line: its innermost os_error, else the top description
 * ("UNKNOWN:Name or service not known {...}" -> "Name or service not known"). */
static void grpct_log_cause(const char *log, char *out, size_t size) {
    const char *p = NULL, *q;
    for (const char *k = strstr(log, "os_error:\""); k; k = strstr(k + 1, "os_error:\""))
        p = k + 10;
    if (p) {
        q = strchr(p, '"');
    } else {
        p = strchr(log, ':');
        p = p && p - log < 24 ? p + 1 : log;
        q = strstr(p, " {");
    }
    const size_t n = q ? (size_t)(q - p) : strlen(p);
    snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), p);
}

// ---- small helpers ----

static gpr_timespec grpct_deadline(int timeout_ms) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms > 0 ? timeout_ms : 0, GPR_TIMESPAN));
}

static bool grpct_passed(gpr_timespec deadline) { return gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline) >= 0; }

static const char *grpct_status_name(int code) {
    static const char *const names[] = {
        "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
        "DATA_LOSS", "UNAUTHENTICATED"};
    return code >= 0 && code < (int)(sizeof names / sizeof names[0]) ? names[code] : "?";
}

static const char *grpct_state_name(grpc_connectivity_state st) {
    switch (st) {
    case GRPC_CHANNEL_IDLE:
        return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
        return "CONNECTING";
    case GRPC_CHANNEL_READY:
        return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
        return "TRANSIENT_FAILURE";
    default:
        return "SHUTDOWN";
    }
}

/* rlx_iface_split_address, with room left for the "ipv6:[...]:port" target gRPC is given. */
static int grpct_split_address(const grpct *t, const char *address, char *host, size_t host_size, unsigned *port) {
    char err[256];
    const int rc = rlx_iface_split_address(address, host, host_size, port, err, sizeof err);
    if (rc < 0)
        return t->host->error(rc, "grpc: %s", err);
    if (strlen(host) + 16 >= GRPCT_ADDR_MAX)
        return t->host->error(RLX_E_INVALID, "grpc: address '%s': host name too long", address);
    return RLX_OK;
}

/* "ipv4:127.0.0.1:5000" or "ipv6:%5B::1%5D:5000" (from grpc_call_get_peer) -> "127.0.0.1:5000", "[::1]:5000". */
static void grpct_peer_name(grpc_call *call, char *buf, size_t size) {
    char *p = grpc_call_get_peer(call);
    const char *s = p ? p : "?";
    if (!strncmp(s, "ipv4:", 5) || !strncmp(s, "ipv6:", 5))
        s += 5;
    size_t n = 0;
    for (; *s && n + 1 < size; s++) {
        if (!strncmp(s, "%5B", 3) || !strncmp(s, "%5D", 3)) {
            buf[n++] = s[2] == 'B' ? '[' : ']';
            s += 2;
        } else {
            buf[n++] = *s;
        }
    }
    buf[n] = '\0';
    gpr_free(p);
}

// ---- completion queues and ops ----

/* Waits for one completion on c's queue until deadline and records it: 1 got one, 0 timed out. */
static int grpct_pump(grpct_conn *c, gpr_timespec deadline) {
    const grpc_event ev = grpc_completion_queue_next(c->cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return 0;
    grpct_op *op = ev.tag;
    op->pending = false;
    op->success = ev.success != 0;
    c->n_pending--;
    switch (op->kind) {
    case GRPCT_OP_INIT:
        c->init_failed = !ev.success;
        break;
    case GRPCT_OP_RECV:
        if (ev.success && c->recv_bb) {
            c->ready = c->recv_bb;
        } else {
            if (c->recv_bb)
                grpc_byte_buffer_destroy(c->recv_bb);
            c->eof = true;
            c->recv_failed = !ev.success || grpc_call_failed_before_recv_message(c->call);
        }
        c->recv_bb = NULL;
        break;
    case GRPCT_OP_SEND:
        grpc_byte_buffer_destroy(c->send_bb);
        c->send_bb = NULL;
        c->send_failed |= !ev.success;
        break;
    default:
        break;
    }
    return 1;
}

/* Starts a batch on c's call tagged with c->ops[kind]. */
static int grpct_start(grpct_conn *c, const grpc_op *ops, size_t n, int kind) {
    const grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->ops[kind], NULL);
    if (e != GRPC_CALL_OK)
        return c->t->host->error(RLX_E_INTERNAL, "grpc: stream with %s: starting an operation failed: %s", c->peer,
                                 grpc_call_error_to_string(e));
    c->ops[kind].pending = true;
    c->n_pending++;
    return RLX_OK;
}

static int grpct_post_recv(grpct_conn *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    return grpct_start(c, &op, 1, GRPCT_OP_RECV);
}

static grpct_conn *grpct_conn_new(grpct *t, bool is_server) {
    grpct_conn *c = t->host->alloc(sizeof *c, GRPCT_ALIGN);
    if (!c)
        return NULL;
    memset(c, 0, sizeof *c);
    c->t = t;
    c->is_server = is_server;
    c->cq = grpc_completion_queue_create_for_next(NULL);
    if (!c->cq) {
        t->host->free(c);
        return NULL;
    }
    for (int k = 0; k < GRPCT_N_OPS; k++) {
        c->ops[k].c = c;
        c->ops[k].kind = k;
    }
    grpc_metadata_array_init(&c->md_initial);
    grpc_metadata_array_init(&c->md_trailing);
    grpc_metadata_array_init(&c->md_request);
    grpc_call_details_init(&c->details);
    c->status_details = grpc_empty_slice();
    c->status_text = grpc_empty_slice();
    c->max_message = (uint64_t)t->max_message;
    return c;
}

/* Adds or removes an open connection in t->conns, the list close() cleans up after. */
static void grpct_conn_link(grpct_conn *c, bool link) {
    grpct *t = c->t;
    pthread_mutex_lock(&t->mu);
    if (link && !c->linked) {
        c->prev = NULL;
        c->next = t->conns;
        if (t->conns)
            t->conns->prev = c;
        t->conns = c;
    } else if (!link && c->linked) {
        if (c->prev)
            c->prev->next = c->next;
        else
            t->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        c->prev = c->next = NULL;
    }
    c->linked = link;
    pthread_mutex_unlock(&t->mu);
}

static void grpct_listener_unref(grpct_listener *l);

/* Moves a closed connection towards the end of its stream without waiting: lets the send in
 * flight finish, then half-closes (client) or sends an OK status (server), and discards what
 * still arrives. True once nothing is left to wait for (or the call failed). */
static bool grpct_conn_advance(grpct_conn *c) {
    if (!c->call)
        return true;
    if (c->ready) {
        grpc_byte_buffer_destroy(c->ready);
        c->ready = NULL;
        if (!c->eof && grpct_post_recv(c) < 0)
            return true;
    }
    if (c->send_failed || c->init_failed)
        return true;
    if (c->ops[GRPCT_OP_SEND].pending)
        return false;
    grpc_op op;
    memset(&op, 0, sizeof op);
    if (!c->is_server) {
        if (!c->ops[GRPCT_OP_STATUS].pending)
            return true; /* the server ended the call */
        if (!c->close_posted) {
            c->close_posted = true;
            op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
            if (grpct_start(c, &op, 1, GRPCT_OP_CLOSE) < 0)
                return true;
        }
        return false;
    }
    if (!c->ops[GRPCT_OP_STATUS].pending && c->cancelled)
        return true;
    if (!c->close_posted) {
        c->close_posted = true;
        op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        op.data.send_status_from_server.status = GRPC_STATUS_OK;
        op.data.send_status_from_server.status_details = &c->status_text;
        if (grpct_start(c, &op, 1, GRPCT_OP_CLOSE) < 0)
            return true;
    }
    return !c->ops[GRPCT_OP_CLOSE].pending && !c->ops[GRPCT_OP_STATUS].pending;
}

/* Releases everything c holds, cancelling its call first if it is not complete. */
static void grpct_conn_destroy(grpct_conn *c) {
    grpct *t = c->t;
    grpct_conn_link(c, false);
    if (c->call)
        grpc_call_cancel(c->call, NULL); /* a no-op once the call is complete */
    if (c->channel) {
        grpc_channel_destroy(c->channel); /* also ends a connectivity watch */
        c->channel = NULL;
    }
    const gpr_timespec deadline = grpct_deadline(GRPCT_DRAIN_MS);
    while (c->n_pending > 0 && grpct_pump(c, deadline))
        ;
    if (c->n_pending > 0) {
        /* Never seen; destroying a queue with ops in flight would crash, so leak instead. */
        t->host->log(RLX_LOG_ERROR, "grpc: stream with %s: %d operations did not finish after cancel; leaking it",
                     c->peer, c->n_pending);
        return;
    }
    if (c->call)
        grpc_call_unref(c->call);
    if (c->ready)
        grpc_byte_buffer_destroy(c->ready);
    grpc_metadata_array_destroy(&c->md_initial);
    grpc_metadata_array_destroy(&c->md_trailing);
    grpc_metadata_array_destroy(&c->md_request);
    grpc_call_details_destroy(&c->details);
    grpc_slice_unref(c->status_details);
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(c->cq);
    grpct_listener *l = c->listener;
    t->host->free(c);
    if (l)
        grpct_listener_unref(l);
}

/* Processes whatever already completed on c's queue, without waiting. */
static void grpct_pump_ready(grpct_conn *c) {
    while (grpct_pump(c, gpr_inf_past(GPR_CLOCK_MONOTONIC)))
        ;
}

/* The error for a stream that ended or failed; waits briefly for the client's final status. */
static int grpct_stream_error(grpct_conn *c, const char *doing, gpr_timespec deadline) {
    const rlx_host *h = c->t->host;
    if (!c->is_server) {
        const gpr_timespec soon = grpct_deadline(1000);
        const gpr_timespec until = gpr_time_cmp(deadline, soon) < 0 ? deadline : soon;
        while (c->ops[GRPCT_OP_STATUS].pending && grpct_pump(c, until))
            ;
        if (c->ops[GRPCT_OP_STATUS].pending)
            return h->error(RLX_E_PEER, "grpc: %s %s: the stream failed (no status from the peer yet)", doing, c->peer);
        char *details = grpc_slice_to_c_string(c->status_details);
        /* A message over one side's max_message is a malformed message, not a dead peer. */
        const int code = c->status == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(details, "larger than max")
                             ? RLX_E_FORMAT
                             : RLX_E_PEER;
        int rc;
        if (c->status == GRPC_STATUS_OK)
            rc = h->error(RLX_E_PEER, "grpc: %s %s: the peer closed the stream", doing, c->peer);
        else
            rc = h->error(code, "grpc: %s %s: status %d %s: %s", doing, c->peer, (int)c->status,
                          grpct_status_name(c->status), details);
        gpr_free(details);
        return rc;
    }
    if (c->eof && !c->recv_failed)
        return h->error(RLX_E_PEER, "grpc: %s %s: the peer closed the stream", doing, c->peer);
    return h->error(RLX_E_PEER,
                    "grpc: %s %s: the stream broke off (peer gone, connection lost, or a message over "
                    "max_message)",
                    doing, c->peer);
}

/* The error for every call on a connection that refused a message over its max_message. */
static int grpct_refused_error(const grpct_conn *c) {
    return c->t->host->error(RLX_E_FORMAT,
                             "grpc: receiving from %s: a message of %zu bytes exceeds this connection's max_message "
                             "(%llu); the stream was ended",
                             c->peer, c->refused, (unsigned long long)c->max_message);
}

// ---- the progress thread ----

/* Advances every closed connection; destroys those that finished or ran out of time. */
static void grpct_reap(grpct *t) {
    pthread_mutex_lock(&t->mu);
    grpct_conn *z = t->zombies, *keep = NULL;
    t->zombies = NULL;
    pthread_mutex_unlock(&t->mu);
    while (z) {
        grpct_conn *next = z->next;
        grpct_pump_ready(z);
        if (grpct_conn_advance(z) || grpct_passed(z->expiry)) {
            grpct_conn_destroy(z);
        } else {
            z->next = keep;
            keep = z;
        }
        z = next;
    }
    if (!keep)
        return;
    pthread_mutex_lock(&t->mu);
    grpct_conn *last = keep;
    while (last->next)
        last = last->next;
    last->next = t->zombies;
    t->zombies = keep;
    pthread_mutex_unlock(&t->mu);
}

static bool grpct_has_zombies(grpct *t) {
    pthread_mutex_lock(&t->mu);
    const bool any = t->zombies != NULL;
    pthread_mutex_unlock(&t->mu);
    return any;
}

/* The progress thread. Waiting on any completion queue lets a thread take its turn as gRPC's
 * poller: it reads the sockets and runs gRPC's work for every queue of the process. It does so
 * only while the application has been out of this transport for a while (no call for one
 * look, GRPCT_QUIET_MS): during a burst of calls the calling threads poll themselves, and a
 * second poller would only add a wake-up hand-off to every message (measured: about +40 %
 * round-trip time, half the echo bandwidth on 2 vCPUs). */
static void *grpct_poller_main(void *arg) {
    grpct *t = arg;
    unsigned seen = atomic_load(&t->calls) - 1;
    while (!atomic_load(&t->stopping)) {
        const unsigned calls = atomic_load(&t->calls);
        if (atomic_load(&t->active) == 0 && calls == seen) {
            grpc_completion_queue_next(t->poller_cq, grpct_deadline(GRPCT_POLL_MS), NULL);
        } else {
            const struct timespec ts = {.tv_sec = 0, .tv_nsec = GRPCT_QUIET_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        seen = calls;
        grpct_reap(t);
    }
    /* The transport is closing: closed connections get the rest of their linger time. */
    while (grpct_has_zombies(t)) {
        grpc_completion_queue_next(t->poller_cq, grpct_deadline(5), NULL);
        grpct_reap(t);
    }
    return NULL;
}

/* Brackets every entry point, so the progress thread knows when the application polls. */
static void grpct_enter(grpct *t) {
    atomic_fetch_add(&t->active, 1);
    atomic_fetch_add(&t->calls, 1);
}

static void grpct_leave(grpct *t) { atomic_fetch_sub(&t->active, 1); }

// ---- open, close ----

/* Parses options into t, and the tls_ files' paths into tls_paths ("" when not given). */
static int grpct_parse_options(grpct *t, const char *options, char tls_paths[GRPCT_TLS_N][RLX_IFACE_OPTION_VALUE_MAX]) {
    const char *cursor = options;
    rlx_iface_option o;
    char err[256];
    unsigned long long v;
    long long n;
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        int tls_file = GRPCT_TLS_N;
        for (int k = 0; k < GRPCT_TLS_N; k++)
            if (rlx_iface_option_is(&o, grpct_tls_keys[k]))
                tls_file = k;
        if (tls_file < GRPCT_TLS_N) {
            memcpy(tls_paths[tls_file], o.value, o.value_len + 1);
        } else if (rlx_iface_option_is(&o, "tls_name") && o.value_len < sizeof t->tls_name) {
            memcpy(t->tls_name, o.value, o.value_len + 1);
        } else if (rlx_iface_option_is(&o, "max_message") &&
                   rlx_iface_option_size(&o, 1, (unsigned long long)INT_MAX + 1, &v)) {
            t->max_message = v > INT_MAX ? INT_MAX : (int)v; /* "2G" means the largest gRPC allows */
        } else if (rlx_iface_option_is(&o, "linger_ms") && rlx_iface_option_int(&o, 0, 600000, &n)) {
            t->linger_ms = (int)n;
        } else if (rlx_iface_option_is(&o, "keepalive_ms") && rlx_iface_option_int(&o, 0, 86400000, &n)) {
            t->keepalive_ms = (int)n;
        } else if (rlx_iface_option_is(&o, "keepalive_timeout_ms") && rlx_iface_option_int(&o, 100, 3600000, &n)) {
            t->keepalive_timeout_ms = (int)n;
        } else if (rlx_iface_option_is(&o, "handshake_ms") && rlx_iface_option_int(&o, 100, 600000, &n)) {
            t->handshake_ms = (int)n;
        } else if (rlx_iface_option_is(&o, "poller") && (!strcmp(o.value, "on") || !strcmp(o.value, "off"))) {
            t->use_poller = !strcmp(o.value, "on");
        } else {
            return t->host->error(RLX_E_INVALID,
                                  "grpc: unknown or out-of-range option '%.*s' (known: max_message=N (max 2G), "
                                  "linger_ms=N, keepalive_ms=N, keepalive_timeout_ms=N, handshake_ms=N, poller=on|off, "
                                  "tls_ca=FILE, tls_cert=FILE, tls_key=FILE, tls_name=NAME)",
                                  o.item_len, o.item);
        }
    }
    return rc < 0 ? t->host->error(rc, "grpc: %s", err) : RLX_OK;
}

/* Reads the PEM file at path (option key) into a terminated buffer from host->alloc. */
static int grpct_read_pem(const grpct *t, const char *key, const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return t->host->error(RLX_E_IO, "grpc: %s '%s': cannot open it: %s", key, path, strerror(errno));
    char *buf = t->host->alloc(GRPCT_PEM_MAX + 1, GRPCT_ALIGN);
    if (!buf) {
        fclose(f);
        return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
    }
    const size_t n = fread(buf, 1, GRPCT_PEM_MAX + 1, f);
    const int read_errno = ferror(f) ? errno : 0;
    fclose(f);
    buf[n < GRPCT_PEM_MAX ? n : GRPCT_PEM_MAX] = '\0';
    int rc = RLX_OK;
    if (read_errno)
        rc = t->host->error(RLX_E_IO, "grpc: %s '%s': cannot read it: %s", key, path, strerror(read_errno));
    else if (n == 0)
        rc = t->host->error(RLX_E_IO, "grpc: %s '%s' is empty", key, path);
    else if (n > GRPCT_PEM_MAX)
        rc =
            t->host->error(RLX_E_IO, "grpc: %s '%s' is larger than %d bytes: not a PEM file", key, path, GRPCT_PEM_MAX);
    if (rc < 0) {
        OPENSSL_cleanse(buf, n < GRPCT_PEM_MAX ? n : GRPCT_PEM_MAX);
        t->host->free(buf);
        return rc;
    }
    *out = buf;
    return RLX_OK;
}

/* A passphrase callback that has none: an encrypted key fails instead of prompting on a tty. */
static int grpct_no_passphrase(char *buf, int size, int rwflag, void *u) {
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

/* Checks what gRPC would only find at the first handshake: that each file holds what its option
 * names, and that the key belongs to the certificate. */
static int grpct_tls_check(const grpct *t, char *const pem[GRPCT_TLS_N],
                           const char tls_paths[GRPCT_TLS_N][RLX_IFACE_OPTION_VALUE_MAX]) {
    BIO *bio[GRPCT_TLS_N];
    for (int k = 0; k < GRPCT_TLS_N; k++)
        bio[k] = BIO_new_mem_buf(pem[k], -1);
    X509 *ca = bio[GRPCT_TLS_CA] ? PEM_read_bio_X509(bio[GRPCT_TLS_CA], NULL, grpct_no_passphrase, NULL) : NULL;
    X509 *cert = bio[GRPCT_TLS_CERT] ? PEM_read_bio_X509(bio[GRPCT_TLS_CERT], NULL, grpct_no_passphrase, NULL) : NULL;
    EVP_PKEY *key =
        bio[GRPCT_TLS_KEY] ? PEM_read_bio_PrivateKey(bio[GRPCT_TLS_KEY], NULL, grpct_no_passphrase, NULL) : NULL;
    int rc = RLX_OK;
    if (!ca || !cert) {
        const int k = ca ? GRPCT_TLS_CERT : GRPCT_TLS_CA;
        rc = t->host->error(RLX_E_FORMAT, "grpc: %s '%s' holds no PEM certificate", grpct_tls_keys[k], tls_paths[k]);
    } else if (!key) {
        rc = t->host->error(RLX_E_FORMAT,
                            "grpc: tls_key '%s' holds no PEM private key (or one encrypted with a passphrase)",
                            tls_paths[GRPCT_TLS_KEY]);
    } else if (X509_check_private_key(cert, key) != 1) {
        rc = t->host->error(RLX_E_INVALID, "grpc: tls_key '%s' is not the private key of tls_cert '%s'",
                            tls_paths[GRPCT_TLS_KEY], tls_paths[GRPCT_TLS_CERT]);
    }
    ERR_clear_error();
    EVP_PKEY_free(key);
    X509_free(cert);
    X509_free(ca);
    for (int k = 0; k < GRPCT_TLS_N; k++)
        BIO_free(bio[k]);
    return rc;
}

/* With the tls_ files given: reads and checks them and makes the instance's credentials (after
 * grpc_init). gRPC 1.51's C API cannot raise the minimum TLS version (grpc_ssl_credentials keeps
 * set_min_tls_version in C++ only): both ends offer TLS 1.2 and 1.3, and two rlx processes, both
 * on OpenSSL 3, negotiate 1.3. */
static int grpct_tls_setup(grpct *t, const char tls_paths[GRPCT_TLS_N][RLX_IFACE_OPTION_VALUE_MAX]) {
    char *pem[GRPCT_TLS_N] = {NULL};
    int rc = RLX_OK;
    for (int k = 0; k < GRPCT_TLS_N && rc == RLX_OK; k++)
        rc = grpct_read_pem(t, grpct_tls_keys[k], tls_paths[k], &pem[k]);
    if (rc == RLX_OK)
        rc = grpct_tls_check(t, pem, tls_paths);
    if (rc == RLX_OK) {
        /* gRPC copies the PEM text into the credentials. */
        grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[GRPCT_TLS_KEY], .cert_chain = pem[GRPCT_TLS_CERT]};
        t->tls_server = grpc_ssl_server_credentials_create_ex(
            pem[GRPCT_TLS_CA], &pair, 1, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, NULL);
        t->tls_channel = grpc_ssl_credentials_create_ex(pem[GRPCT_TLS_CA], &pair, NULL, NULL);
        t->tls_probe = SSL_CTX_new(TLS_client_method());
        if (t->tls_probe &&
            (SSL_CTX_load_verify_locations(t->tls_probe, tls_paths[GRPCT_TLS_CA], NULL) != 1 ||
             SSL_CTX_use_certificate_chain_file(t->tls_probe, tls_paths[GRPCT_TLS_CERT]) != 1 ||
             SSL_CTX_use_PrivateKey_file(t->tls_probe, tls_paths[GRPCT_TLS_KEY], SSL_FILETYPE_PEM) != 1)) {
            SSL_CTX_free(t->tls_probe);
            t->tls_probe = NULL;
        }
        ERR_clear_error();
        if (!t->tls_server || !t->tls_channel || !t->tls_probe)
            rc = t->host->error(RLX_E_INTERNAL, "grpc: cannot make TLS credentials from tls_cert '%s'",
                                tls_paths[GRPCT_TLS_CERT]);
    }
    for (int k = 0; k < GRPCT_TLS_N; k++) {
        if (pem[k])
            OPENSSL_cleanse(pem[k], strlen(pem[k]));
        t->host->free(pem[k]);
    }
    return rc;
}

static void grpct_listener_destroy(grpct_listener *l);

static void grpct_close(void *self) {
    grpct *t = self;
    if (!t)
        return;
    /* Connections the application left open are cancelled; closed ones finish (within their
     * linger time) on the progress thread, which then ends. */
    while (t->conns)
        grpct_conn_destroy(t->conns);
    if (t->poller_started) {
        atomic_store(&t->stopping, true);
        pthread_join(t->poller, NULL);
        t->poller_started = false;
    }
    while (t->listeners) {
        grpct_listener *l = t->listeners;
        pthread_mutex_lock(&l->mu);
        const bool last = --l->refs == 0;
        pthread_mutex_unlock(&l->mu);
        if (last)
            grpct_listener_destroy(l);
        else
            break; /* unreachable: every connection is gone, so the handle was the last ref */
    }
    if (t->poller_cq) {
        grpc_completion_queue_shutdown(t->poller_cq);
        while (grpc_completion_queue_next(t->poller_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(t->poller_cq);
    }
    if (t->tls_server)
        grpc_server_credentials_release(t->tls_server);
    if (t->tls_channel)
        grpc_channel_credentials_release(t->tls_channel);
    SSL_CTX_free(t->tls_probe);
    pthread_mutex_destroy(&t->mu);
    t->host->free(t);
    pthread_mutex_lock(&grpct_global_mu);
    /* The last instance waits for gRPC's teardown: grpc_shutdown() alone finishes it on a thread
     * of its own, which may still run when the process exits (LeakSanitizer's exit-time check
     * then crashes on it). */
    if (grpct_n_instances == 1)
        grpc_shutdown_blocking();
    else
        grpc_shutdown();
    /* grpct_log stays gRPC's log function: gRPC's threads outlive grpc_shutdown_blocking (a
     * handshake the application gave up on still fails after it) and gRPC's default would write
     * their lines to stderr. Without a host, grpct_log drops them; the plugin is never unmapped
     * (-z nodelete), so the function stays valid. */
    if (--grpct_n_instances == 0)
        atomic_store(&grpct_log_host, NULL);
    pthread_mutex_unlock(&grpct_global_mu);
}

static int grpct_open(const rlx_host *host, const char *options, void **self) {
    if (!host || !self)
        return host ? host->error(RLX_E_INVALID, "grpc: open: NULL argument") : RLX_E_INVALID;
    *self = NULL;
    grpct *t = host->alloc(sizeof *t, GRPCT_ALIGN);
    if (!t)
        return host->error(RLX_E_NOMEM, "grpc: out of memory");
    memset(t, 0, sizeof *t);
    t->host = host;
    t->max_message = INT_MAX;
    t->linger_ms = GRPCT_DEFAULT_LINGER_MS;
    t->keepalive_ms = GRPCT_DEFAULT_KEEPALIVE_MS;
    t->keepalive_timeout_ms = GRPCT_DEFAULT_KEEPALIVE_TIMEOUT_MS;
    t->handshake_ms = GRPCT_DEFAULT_HANDSHAKE_MS;
    t->use_poller = true;
    /* A path as long as an option value: the files are read below, after the checks. */
    char(*tls_paths)[RLX_IFACE_OPTION_VALUE_MAX] = host->alloc(GRPCT_TLS_N * sizeof *tls_paths, GRPCT_ALIGN);
    if (!tls_paths) {
        host->free(t);
        return host->error(RLX_E_NOMEM, "grpc: out of memory");
    }
    memset(tls_paths, 0, GRPCT_TLS_N * sizeof *tls_paths);
    int rc = grpct_parse_options(t, options, tls_paths);
    int n_tls = 0;
    char missing[64] = "";
    for (int k = 0; k < GRPCT_TLS_N; k++) {
        if (tls_paths[k][0])
            n_tls++;
        else
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "",
                     grpct_tls_keys[k]);
    }
    if (rc == RLX_OK && n_tls > 0 && n_tls < GRPCT_TLS_N)
        rc = host->error(RLX_E_INVALID, "grpc: TLS needs tls_ca, tls_cert and tls_key together: %s missing", missing);
    else if (rc == RLX_OK && n_tls == 0 && t->tls_name[0])
        rc = host->error(RLX_E_INVALID, "grpc: tls_name=%s without TLS: give tls_ca, tls_cert and tls_key too",
                         t->tls_name);
    if (rc < 0) {
        host->free(tls_paths);
        host->free(t);
        return rc;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_lock(&grpct_global_mu);
    if (grpct_n_instances++ == 0) {
        atomic_store(&grpct_log_host, host);
        gpr_set_log_function(grpct_log);
    }
    grpc_init();
    pthread_mutex_unlock(&grpct_global_mu);
    rc = n_tls ? grpct_tls_setup(t, (const char(*)[RLX_IFACE_OPTION_VALUE_MAX])tls_paths) : RLX_OK;
    host->free(tls_paths);
    if (rc < 0) {
        grpct_close(t);
        return rc;
    }
    if (t->use_poller) {
        t->poller_cq = grpc_completion_queue_create_for_next(NULL);
        if (!t->poller_cq || pthread_create(&t->poller, NULL, grpct_poller_main, t) != 0) {
            rc = host->error(RLX_E_INTERNAL, "grpc: cannot start the progress thread");
            grpct_close(t);
            return rc;
        }
        t->poller_started = true;
    }
    *self = t;
    return RLX_OK;
}

/* Channel or server arguments shared by both ends; returns how many were filled. */
static size_t grpct_common_args(const grpct *t, grpc_arg *a, bool server) {
    size_t n = 0;
    a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, a[n++].value.integer = t->max_message;
    a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, a[n++].value.integer = t->max_message;
    if (t->keepalive_ms > 0) {
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_KEEPALIVE_TIME_MS, a[n++].value.integer = t->keepalive_ms;
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
        a[n++].value.integer = t->keepalive_timeout_ms;
        /* keep pinging an idle stream (the default stops after 2 pings without data) */
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, a[n++].value.integer = 0;
    }
    if (server) {
        /* Pings from a peer with a shorter keepalive than ours must not count as abuse. */
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS;
        a[n++].value.integer = 1000;
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_HTTP2_MAX_PING_STRIKES, a[n++].value.integer = 0;
        /* gRPC sets SO_REUSEPORT by default: two stages could then bind one port silently. */
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_ALLOW_REUSEPORT, a[n++].value.integer = 0;
        /* A socket that never finishes TLS or never sends its HTTP/2 settings is closed then. */
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS;
        a[n++].value.integer = t->handshake_ms;
    } else {
        /* Each connection gets its own subchannel (own TCP connection and backoff state),
         * retries buffer every message of a stream (useless here), and reconnect attempts
         * come every 0.1-1 s rather than the default 1-120 s. */
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, a[n++].value.integer = 1;
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_ENABLE_RETRIES, a[n++].value.integer = 0;
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, a[n++].value.integer = 100;
        a[n].type = GRPC_ARG_INTEGER, a[n].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, a[n++].value.integer = 1000;
    }
    return n;
}

// ---- listeners ----

/* Posts request_call for every free slot. Caller holds l->accept_mu (or owns l alone). */
static int grpct_fill_slots(grpct_listener *l) {
    grpct *t = l->t;
    for (int i = 0; i < GRPCT_BACKLOG; i++) {
        if (l->slots[i])
            continue;
        grpct_conn *c = grpct_conn_new(t, true);
        if (!c)
            return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
        c->ops[GRPCT_OP_ACCEPT].pending = true;
        const grpc_call_error e = grpc_server_request_call(l->server, &c->call, &c->details, &c->md_request, c->cq,
                                                           l->cq, &c->ops[GRPCT_OP_ACCEPT]);
        if (e != GRPC_CALL_OK) {
            grpct_conn_destroy(c);
            return t->host->error(RLX_E_INTERNAL, "grpc: listener %s: request_call failed: %s", l->address,
                                  grpc_call_error_to_string(e));
        }
        l->slots[i] = c;
    }
    return RLX_OK;
}

/* Frees a slot whose request_call completed; a call it got while shutting down is refused. */
static void grpct_slot_release(grpct_listener *l, grpct_conn *c, bool got_call) {
    for (int i = 0; i < GRPCT_BACKLOG; i++)
        if (l->slots[i] == c)
            l->slots[i] = NULL;
    c->ops[GRPCT_OP_ACCEPT].pending = false;
    if (got_call && c->call)
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, "rlx listener closed", NULL);
    else
        c->call = NULL;
    grpct_conn_destroy(c);
}

static void grpct_listener_destroy(grpct_listener *l) {
    grpct *t = l->t;
    if (l->server) {
        l->shutdown_op.pending = true;
        grpc_server_shutdown_and_notify(l->server, l->cq, &l->shutdown_op);
        grpc_server_cancel_all_calls(l->server);
        const gpr_timespec deadline = grpct_deadline(GRPCT_DRAIN_MS);
        for (;;) {
            bool slots_left = false;
            for (int i = 0; i < GRPCT_BACKLOG; i++)
                slots_left |= l->slots[i] != NULL;
            if (!l->shutdown_op.pending && !slots_left)
                break;
            const grpc_event ev = grpc_completion_queue_next(l->cq, deadline, NULL);
            if (ev.type != GRPC_OP_COMPLETE)
                break;
            grpct_op *op = ev.tag;
            if (op == &l->shutdown_op)
                l->shutdown_op.pending = false;
            else
                grpct_slot_release(l, op->c, ev.success);
        }
        if (l->shutdown_op.pending) {
            t->host->log(RLX_LOG_ERROR, "grpc: listener %s did not shut down; leaking it", l->address);
            return;
        }
        grpc_server_destroy(l->server);
    }
    if (l->cq) {
        grpc_completion_queue_shutdown(l->cq);
        while (grpc_completion_queue_next(l->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(l->cq);
    }
    pthread_mutex_lock(&t->mu);
    if (l->prev)
        l->prev->next = l->next;
    else if (t->listeners == l)
        t->listeners = l->next;
    if (l->next)
        l->next->prev = l->prev;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_destroy(&l->mu);
    pthread_mutex_destroy(&l->accept_mu);
    t->host->free(l);
}

static void grpct_listener_unref(grpct_listener *l) {
    pthread_mutex_lock(&l->mu);
    const bool last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (last)
        grpct_listener_destroy(l);
}

static int grpct_listen(void *self, const char *address, void **listener) {
    grpct *t = self;
    if (!t || !listener)
        return RLX_E_INVALID;
    *listener = NULL;
    char host[GRPCT_ADDR_MAX], target[GRPCT_ADDR_MAX + 8];
    unsigned port;
    int rc = grpct_split_address(t, address, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    const bool wildcard = !host[0] || !strcmp(host, "*");
    const bool v6 = strchr(host, ':') != NULL;
    if (wildcard)
        snprintf(target, sizeof target, "[::]:%u", port);
    else
        snprintf(target, sizeof target, v6 ? "[%s]:%u" : "%s:%u", host, port);
    grpct_listener *l = t->host->alloc(sizeof *l, GRPCT_ALIGN);
    if (!l)
        return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
    memset(l, 0, sizeof *l);
    l->t = t;
    l->refs = 1;
    l->shutdown_op.kind = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_mutex_init(&l->accept_mu, NULL);
    snprintf(l->address, sizeof l->address, "%s", address);
    grpc_arg args[16];
    const grpc_channel_args ch_args = {.num_args = grpct_common_args(t, args, true), .args = args};
    l->server = grpc_server_create(&ch_args, NULL);
    l->cq = grpc_completion_queue_create_for_next(NULL);
    if (!l->server || !l->cq) {
        rc = t->host->error(RLX_E_INTERNAL, "grpc: cannot create a server for %s", address);
        goto fail;
    }
    grpc_server_register_completion_queue(l->server, l->cq, NULL);
    /* With TLS, gRPC completes the handshake (and verifies the client's certificate) before the
     * first call: a peer that fails it or stays silent never reaches a request_call slot. */
    grpc_server_credentials *creds = t->tls_server ? t->tls_server : grpc_insecure_server_credentials_create();
    grpct_last_log[0] = '\0';
    const int bound = grpc_server_add_http2_port(l->server, target, creds);
    if (!t->tls_server)
        grpc_server_credentials_release(creds);
    if (bound <= 0) {
        char cause[256] = "address in use, not local, or not resolvable";
        if (strstr(grpct_last_log, strerror(EADDRINUSE)))
            snprintf(cause, sizeof cause, "%s", GRPCT_IN_USE);
        else if (grpct_last_log[0])
            grpct_log_cause(grpct_last_log, cause, sizeof cause);
        rc = t->host->error(RLX_E_IO, "grpc: cannot listen on %s: %s", address, cause);
        grpc_server_destroy(l->server); /* never started: no shutdown needed */
        l->server = NULL;
        goto fail;
    }
    if (wildcard)
        snprintf(l->bound, sizeof l->bound, "[::]:%d", bound);
    else
        snprintf(l->bound, sizeof l->bound, v6 ? "[%s]:%d" : "%s:%d", host, bound);
    grpc_server_start(l->server);
    pthread_mutex_lock(&t->mu);
    l->next = t->listeners;
    if (t->listeners)
        t->listeners->prev = l;
    t->listeners = l;
    pthread_mutex_unlock(&t->mu);
    rc = grpct_fill_slots(l); /* not published yet: no accept can run */
    if (rc < 0) {
        grpct_listener_unref(l);
        return rc;
    }
    *listener = l;
    return RLX_OK;
fail:
    grpct_listener_destroy(l);
    return rc;
}

static int grpct_bound_address(void *self, void *listener, char *buf, size_t size) {
    grpct *t = self;
    grpct_listener *l = listener;
    if (!t || !l || !buf || !size)
        return RLX_E_INVALID;
    if ((size_t)snprintf(buf, size, "%s", l->bound) >= size)
        return t->host->error(RLX_E_RANGE, "grpc: listener %s: address does not fit in %zu bytes", l->address, size);
    return RLX_OK;
}

static void grpct_listener_close(void *self, void *listener) {
    grpct_listener *l = listener;
    if (self && l)
        grpct_listener_unref(l); /* the server stays until its accepted connections close */
}

/* Makes an accepted slot a connection: initial metadata out, the first receive posted. */
static int grpct_conn_start_server(grpct_conn *c) {
    grpct_peer_name(c->call, c->peer, sizeof c->peer);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    int rc = grpct_start(c, &op, 1, GRPCT_OP_INIT);
    if (rc < 0)
        return rc;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if ((rc = grpct_start(c, &op, 1, GRPCT_OP_STATUS)) < 0)
        return rc;
    return grpct_post_recv(c);
}

static int grpct_accept(void *self, void *listener, int timeout_ms, void **conn) {
    grpct *t = self;
    grpct_listener *l = listener;
    if (!t || !l || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    const gpr_timespec deadline = grpct_deadline(timeout_ms);
    pthread_mutex_lock(&l->accept_mu);
    int rc;
    for (;;) {
        const grpc_event ev = grpc_completion_queue_next(l->cq, deadline, NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            rc = t->host->error(RLX_E_TIMEOUT, "grpc: no connection on %s within %d ms", l->address, timeout_ms);
            break;
        }
        grpct_op *op = ev.tag;
        grpct_conn *c = op->c;
        if (op == &l->shutdown_op || !c) {
            l->shutdown_op.pending = false;
            continue;
        }
        for (int i = 0; i < GRPCT_BACKLOG; i++)
            if (l->slots[i] == c)
                l->slots[i] = NULL;
        c->ops[GRPCT_OP_ACCEPT].pending = false;
        if (!ev.success) {
            c->call = NULL;
            grpct_conn_destroy(c);
            continue;
        }
        if ((rc = grpct_fill_slots(l)) < 0) {
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, "rlx listener out of resources", NULL);
            grpct_conn_destroy(c);
            break;
        }
        if (grpc_slice_str_cmp(c->details.method, GRPCT_METHOD) != 0) {
            /* A connect probe or a stranger: answer it without bothering the application. */
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNIMPLEMENTED, "rlx serves only " GRPCT_METHOD, NULL);
            grpct_conn_destroy(c);
            continue;
        }
        if ((rc = grpct_conn_start_server(c)) < 0) {
            grpct_conn_destroy(c);
            break;
        }
        c->listener = l;
        grpct_conn_link(c, true);
        pthread_mutex_lock(&l->mu);
        l->refs++;
        pthread_mutex_unlock(&l->mu);
        *conn = c;
        rc = RLX_OK;
        break;
    }
    pthread_mutex_unlock(&l->accept_mu);
    return rc;
}

// ---- connect ----

/* A call that fails fast on a channel in TRANSIENT_FAILURE: its status says why. */
static void grpct_probe(grpct_conn *c, gpr_timespec deadline, char *why, size_t size) {
    const gpr_timespec soon = grpct_deadline(1000);
    grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                               grpc_slice_from_static_string(GRPCT_PROBE_METHOD), NULL,
                                               gpr_time_cmp(deadline, soon) < 0 ? deadline : soon, NULL);
    if (!call)
        return;
    grpc_metadata_array md;
    grpc_metadata_array_init(&md);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &md;
    ops[2].data.recv_status_on_client.status = &code;
    ops[2].data.recv_status_on_client.status_details = &details;
    grpct_op *op = &c->ops[GRPCT_OP_PROBE];
    if (grpc_call_start_batch(call, ops, 3, op, NULL) == GRPC_CALL_OK) {
        op->pending = true;
        c->n_pending++;
        const gpr_timespec limit = gpr_time_add(deadline, gpr_time_from_millis(2000, GPR_TIMESPAN));
        while (op->pending && grpct_pump(c, limit))
            ;
        if (op->pending) {
            grpc_call_cancel(call, NULL);
            while (op->pending && grpct_pump(c, gpr_inf_future(GPR_CLOCK_MONOTONIC)))
                ;
        }
        if (op->success && code != GRPC_STATUS_OK) {
            char *text = grpc_slice_to_c_string(details);
            snprintf(why, size, "%s: %s", grpct_status_name(code), text);
            gpr_free(text);
        }
    }
    grpc_call_unref(call);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md);
}

/* Whether host:port accepts a TCP connection within GRPCT_TCP_CHECK_MS. */
static bool grpct_tcp_accepts(const char *host, unsigned port) {
    char service[16];
    snprintf(service, sizeof service, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return false;
    bool accepted = false;
    for (const struct addrinfo *ai = res; ai && !accepted; ai = ai->ai_next) {
        const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            accepted = true;
        } else if (errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t len = sizeof err;
            accepted = poll(&pfd, 1, GRPCT_TCP_CHECK_MS) == 1 &&
                       getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return accepted;
}

/* What a TLS handshake of our own (grpct_tls_probe) found at a peer, from least to most TLS. */
typedef enum grpct_tls_peer {
    GRPCT_PEER_UNREACHED, /* no TCP connection: nothing listens (yet) */
    GRPCT_PEER_MUTE,      /* it hung up or stayed silent without answering the ClientHello */
    GRPCT_PEER_PLAIN,     /* it answered the ClientHello with bytes that are not TLS */
    GRPCT_PEER_TLS_MUTE,  /* TLS: after the handshake it neither sent anything nor hung up */
    GRPCT_PEER_REFUSED,   /* TLS: it ended the connection in or right after the handshake */
    GRPCT_PEER_ACCEPTED   /* TLS: it sent its HTTP/2 settings: it took this process's certificate */
} grpct_tls_peer;

/* Whether an SSL call that returned r failed because the peer ended the connection (a close, a
 * reset, or an alert) rather than by staying silent past the socket's timeout. */
static bool grpct_tls_peer_ended(SSL *ssl, int r, int io_errno) {
    const int err = SSL_get_error(ssl, r);
    if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SSL)
        return true; /* OpenSSL 3 reports an EOF inside a record as SSL_ERROR_SSL too */
    return err == SSL_ERROR_SYSCALL && io_errno != EAGAIN && io_errno != EWOULDBLOCK && io_errno != EINTR;
}

/* What gRPC's handshake errors hide ("Socket closed", "certificate verify failed"): a TLS
 * handshake of our own with host:port, certificate and CA from ctx (or none), offering HTTP/2
 * (ALPN h2) as gRPC does, tells whether the peer speaks TLS at all, why its certificate fails
 * verification (*verify, an X509_V_ERR_ code), and whether it then takes this process's
 * certificate: a gRPC server that does sends its HTTP/2 settings at once, one that refuses it
 * ends the connection, perhaps with an alert ("tlsv1 alert unknown ca", written to alert; ""
 * when none came). Each wait is bounded by GRPCT_TCP_CHECK_MS. */
static grpct_tls_peer grpct_tls_probe(SSL_CTX *ctx, const char *host, unsigned port, long *verify, char *alert,
                                      size_t size) {
    static const unsigned char alpn_h2[] = {2, 'h', '2'};
    alert[0] = '\0';
    *verify = X509_V_OK;
    char service[16];
    snprintf(service, sizeof service, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return GRPCT_PEER_UNREACHED;
    int fd = -1;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const struct timeval tv = {.tv_sec = 0, .tv_usec = GRPCT_TCP_CHECK_MS * 1000};
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
                        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
                        connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return GRPCT_PEER_UNREACHED;
    SSL *ssl = SSL_new(ctx);
    grpct_tls_peer found = GRPCT_PEER_MUTE;
    if (ssl && SSL_set_fd(ssl, fd) == 1 && SSL_set_alpn_protos(ssl, alpn_h2, sizeof alpn_h2) == 0) {
        SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(ssl);
        int io_errno = errno;
        /* TLS 1.3 finishes the client's side before the server checks its certificate: the
         * refusal (or the server's settings) arrives on the first read. */
        const bool tls = r == 1 || SSL_get_state(ssl) != TLS_ST_CW_CLNT_HELLO;
        if (tls)
            *verify = SSL_get_verify_result(ssl); /* computed even without SSL_VERIFY_PEER */
        if (r == 1) {
            char byte;
            errno = 0;
            r = SSL_read(ssl, &byte, 1);
            io_errno = errno;
        }
        const bool ended = r <= 0 && grpct_tls_peer_ended(ssl, r, io_errno);
        if (tls)
            found = r > 0 ? GRPCT_PEER_ACCEPTED : ended ? GRPCT_PEER_REFUSED : GRPCT_PEER_TLS_MUTE;
        else if (SSL_get_error(ssl, r) == SSL_ERROR_SSL &&
                 ERR_GET_REASON(ERR_peek_last_error()) != SSL_R_UNEXPECTED_EOF_WHILE_READING)
            found = GRPCT_PEER_PLAIN; /* "wrong version number": it answered, not in TLS */
        const unsigned long e = ERR_peek_last_error();
        const char *reason = e ? ERR_reason_error_string(e) : NULL;
        if (r <= 0 && reason && strstr(reason, "alert"))
            snprintf(alert, size, "%s", reason);
    }
    ERR_clear_error();
    SSL_free(ssl);
    close(fd);
    return found;
}

/* Why a stage that ended the handshake without an alert (gRPC closes the socket) would refuse
 * this process's certificate: it expired, or the stage does not trust the CA that signed it. */
static void grpct_own_cert_cause(const grpct *t, char *out, size_t size) {
    const X509 *own = SSL_CTX_get0_certificate(t->tls_probe);
    const ASN1_TIME *not_after = own ? X509_get0_notAfter(own) : NULL;
    BIO *bio = BIO_new(BIO_s_mem());
    char date[64] = "";
    if (not_after && X509_cmp_current_time(not_after) < 0 && bio && ASN1_TIME_print(bio, not_after) == 1) {
        const int n = BIO_read(bio, date, sizeof date - 1);
        date[n > 0 ? n : 0] = '\0';
    }
    BIO_free(bio);
    if (date[0])
        snprintf(out, size, "the stage refused this process's certificate: tls_cert expired on %s", date);
    else
        snprintf(out, size,
                 "the stage closed the connection after the handshake: it refused this process's certificate "
                 "(tls_cert is not signed by a CA the stage trusts?)");
}

/* The cause of a failed handshake with host:port when it lies in TLS (or its absence), else
 * NULL; why holds gRPC's reason from the probe call. A cause is returned only when it is
 * certain, so connect can fail on it at once: gRPC's own verdict on the stage's certificate, or
 * what a handshake of our own (grpct_tls_probe) saw the stage do. A stage that took our
 * handshake, went silent, or no longer listens leaves connect to retry. */
static const char *grpct_tls_cause(grpct *t, const char *why, const char *host, unsigned port, char *out, size_t size) {
    const char *peer_name = strstr(why, "Peer name ");
    if (t->tls_channel && peer_name) {
        snprintf(out, size,
                 "the stage's certificate does not name %s (%s); if the certificate is right, give its name as "
                 "tls_name",
                 host, peer_name);
        return out;
    }
    const bool verify_failed = strstr(why, "certificate verify failed") != NULL;
    if (!verify_failed && !strstr(why, "Socket closed") && !strstr(why, "andshake"))
        return NULL;
    SSL_CTX *plain = t->tls_probe ? NULL : SSL_CTX_new(TLS_client_method());
    char alert[128] = "";
    long verify = X509_V_OK;
    const grpct_tls_peer peer = t->tls_probe || plain ? grpct_tls_probe(t->tls_probe ? t->tls_probe : plain, host, port,
                                                                        &verify, alert, sizeof alert)
                                                      : GRPCT_PEER_UNREACHED;
    SSL_CTX_free(plain);
    if (t->tls_probe && verify_failed) {
        snprintf(out, size, "certificate verify failed: %s (the stage's certificate, checked against tls_ca)",
                 verify != X509_V_OK ? X509_verify_cert_error_string(verify) : "see the libgrpc log lines");
        return out;
    }
    if (!t->tls_probe) {
        if (peer < GRPCT_PEER_TLS_MUTE)
            return NULL; /* plaintext both ends, or nobody: not a TLS matter */
        snprintf(out, size, "the stage speaks TLS and this process plaintext (give tls_ca, tls_cert and tls_key)");
    } else if (peer == GRPCT_PEER_PLAIN) {
        snprintf(out, size, "the stage does not speak TLS (a plaintext stage, without tls_ options?)");
    } else if (peer != GRPCT_PEER_REFUSED) {
        return NULL;
    } else if (alert[0]) {
        snprintf(out, size, "the stage refused this process's certificate (tls_cert): %s", alert);
    } else {
        grpct_own_cert_cause(t, out, size);
    }
    return out;
}

static int grpct_connect(void *self, const char *address, int timeout_ms, void **conn) {
    grpct *t = self;
    if (!t || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    char host[GRPCT_ADDR_MAX];
    unsigned port;
    int rc = grpct_split_address(t, address, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    if (!host[0] || !strcmp(host, "*") || port == 0)
        return t->host->error(RLX_E_INVALID, "grpc: cannot connect to '%s': need a host and a non-zero port", address);
    grpct_conn *c = grpct_conn_new(t, false);
    if (!c)
        return t->host->error(RLX_E_NOMEM, "grpc: out of memory");
    snprintf(c->peer, sizeof c->peer, "%s", address);
    grpc_arg args[16];
    grpc_channel_args ch_args = {.num_args = grpct_common_args(t, args, false), .args = args};
    if (t->tls_name[0]) {
        args[ch_args.num_args].type = GRPC_ARG_STRING;
        args[ch_args.num_args].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[ch_args.num_args++].value.string = t->tls_name;
    }
    /* gRPC checks the server's certificate against the host of address (a DNS or IP SAN), or
     * against tls_name. */
    grpc_channel_credentials *creds = t->tls_channel ? t->tls_channel : grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(address, creds, &ch_args);
    if (!t->tls_channel)
        grpc_channel_credentials_release(creds);
    if (!c->channel) {
        grpct_conn_destroy(c);
        return t->host->error(RLX_E_INTERNAL, "grpc: cannot create a channel to %s", address);
    }
    /* Wait for READY: the connection is up and the server answered the HTTP/2 handshake. */
    const gpr_timespec deadline = grpct_deadline(timeout_ms);
    const gpr_timespec limit = gpr_time_add(deadline, gpr_time_from_millis(2000, GPR_TIMESPAN));
    char why[320] = "no HTTP/2 answer (nothing listening there yet, or not an rlx grpc server)";
    char tls_why[512];
    const char *tls_cause = NULL;
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(c->channel, 1);
    bool probed = false;
    while (st != GRPC_CHANNEL_READY && st != GRPC_CHANNEL_SHUTDOWN) {
        if (st == GRPC_CHANNEL_TRANSIENT_FAILURE && !probed) {
            grpct_probe(c, deadline, why, sizeof why);
            /* Something listens and the handshake failed: when TLS is why, every retry until the
             * deadline would fail alike. A refused connection (a stage still loading its
             * weights) is retried. */
            if (!strstr(why, strerror(ECONNREFUSED)) &&
                (tls_cause = grpct_tls_cause(t, why, host, port, tls_why, sizeof tls_why)))
                break;
        }
        probed = st == GRPC_CHANNEL_TRANSIENT_FAILURE;
        if (grpct_passed(deadline))
            break;
        grpct_op *w = &c->ops[GRPCT_OP_WATCH];
        grpc_channel_watch_connectivity_state(c->channel, st, deadline, c->cq, w);
        w->pending = true;
        c->n_pending++;
        while (w->pending && grpct_pump(c, limit))
            ;
        if (w->pending || !w->success)
            break; /* the deadline passed; conn_destroy ends a watch still pending */
        st = grpc_channel_check_connectivity_state(c->channel, 1);
    }
    if (tls_cause) {
        rc = t->host->error(RLX_E_AUTH, "grpc: TLS handshake with %s failed: %s", address, tls_cause);
        grpct_conn_destroy(c);
        return rc;
    }
    if (st != GRPC_CHANNEL_READY) {
        if (st == GRPC_CHANNEL_TRANSIENT_FAILURE && strstr(why, strerror(ECONNREFUSED))) {
            rc = t->host->error(RLX_E_PEER,
                                "grpc: cannot connect to %s: connection refused for %d ms (nothing "
                                "listens there)",
                                address, timeout_ms);
        } else {
            /* gRPC shows a silent peer and a host that never answers alike: a channel that stays
             * CONNECTING. Only a plain TCP connection tells them apart. */
            if (st == GRPC_CHANNEL_CONNECTING)
                snprintf(why, sizeof why, "%s",
                         grpct_tcp_accepts(host, port)
                             ? "it accepted the connection but never answered the HTTP/2 handshake (not an rlx "
                               "grpc stage: perhaps one started with --transport tcp, or another program)"
                             : "no answer from the host (down, unreachable, or a firewall drops the connection)");
            else if (strstr(why, "Failed parsing HTTP/2")) /* what an rlx tcp stage's error frame gives */
                snprintf(why + strlen(why), sizeof why - strlen(why),
                         " (the peer does not speak HTTP/2: perhaps a stage started with --transport tcp)");
            rc = t->host->error(RLX_E_TIMEOUT, "grpc: cannot connect to %s within %d ms (channel %s): %s", address,
                                timeout_ms, grpct_state_name(st), why);
        }
        grpct_conn_destroy(c);
        return rc;
    }
    c->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                       grpc_slice_from_static_string(GRPCT_METHOD), NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!c->call) {
        grpct_conn_destroy(c);
        return t->host->error(RLX_E_INTERNAL, "grpc: cannot create a call to %s", address);
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &c->md_initial;
    if ((rc = grpct_start(c, ops, 2, GRPCT_OP_INIT)) < 0)
        goto fail;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &c->md_trailing;
    ops[0].data.recv_status_on_client.status = &c->status;
    ops[0].data.recv_status_on_client.status_details = &c->status_details;
    if ((rc = grpct_start(c, ops, 1, GRPCT_OP_STATUS)) < 0 || (rc = grpct_post_recv(c)) < 0)
        goto fail;
    grpct_conn_link(c, true);
    *conn = c;
    return RLX_OK;
fail:
    grpct_conn_destroy(c);
    return rc;
}

// ---- send, recv, close ----

static int grpct_send(void *self, void *conn, const void *data, size_t len, int timeout_ms) {
    grpct *t = self;
    grpct_conn *c = conn;
    if (!t || !c || (len && !data))
        return t ? t->host->error(RLX_E_INVALID, "grpc: send: NULL argument") : RLX_E_INVALID;
    if (len > (size_t)t->max_message)
        return t->host->error(RLX_E_INVALID, "grpc: sending to %s: a message of %zu bytes exceeds max_message (%d)",
                              c->peer, len, t->max_message);
    const gpr_timespec deadline = grpct_deadline(timeout_ms);
    while (c->ops[GRPCT_OP_SEND].pending) {
        if (!grpct_pump(c, deadline))
            return t->host->error(RLX_E_TIMEOUT,
                                  "grpc: sending to %s: the previous message is still in flight after %d ms (peer "
                                  "not reading?)",
                                  c->peer, timeout_ms);
    }
    /* A server may still send after the client half-closed; a client's stream is over once its
     * status arrived. */
    const bool over = !c->ops[GRPCT_OP_STATUS].pending && (!c->is_server || c->cancelled);
    if (c->refused)
        return grpct_refused_error(c);
    if (c->send_failed || c->init_failed || over)
        return grpct_stream_error(c, "sending to", deadline);
    /* The payload is copied: gRPC may hold its slices after the send completes. */
    grpc_slice slice = len ? grpc_slice_from_copied_buffer(data, len) : grpc_empty_slice();
    c->send_bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = c->send_bb;
    const int rc = grpct_start(c, &op, 1, GRPCT_OP_SEND);
    if (rc < 0) {
        grpc_byte_buffer_destroy(c->send_bb);
        c->send_bb = NULL;
    }
    return rc;
}

static int grpct_recv(void *self, void *conn, void **data, size_t *len, int timeout_ms) {
    grpct *t = self;
    grpct_conn *c = conn;
    if (!t || !c || !data || !len)
        return t ? t->host->error(RLX_E_INVALID, "grpc: recv: NULL argument") : RLX_E_INVALID;
    *data = NULL;
    *len = 0;
    if (c->refused)
        return grpct_refused_error(c);
    const gpr_timespec deadline = grpct_deadline(timeout_ms);
    while (!c->ready && !c->eof) {
        if (!grpct_pump(c, deadline))
            return t->host->error(RLX_E_TIMEOUT, "grpc: no message from %s within %d ms", c->peer, timeout_ms);
    }
    if (!c->ready)
        return grpct_stream_error(c, "receiving from", deadline);
    grpc_byte_buffer *bb = c->ready;
    c->ready = NULL;
    const size_t n = grpc_byte_buffer_length(bb);
    if (n > c->max_message) {
        /* gRPC's own limit is the instance's max_message, fixed when the channel or server was
         * made; a lower one set on the connection is checked here, once the message is in. The
         * stream ends: the peer's next call reports it (RESOURCE_EXHAUSTED, as gRPC's limit). */
        grpc_byte_buffer_destroy(bb);
        c->refused = n;
        char why[160];
        snprintf(why, sizeof why, "received message larger than max (%zu vs. %llu)", n,
                 (unsigned long long)c->max_message);
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_RESOURCE_EXHAUSTED, why, NULL);
        return grpct_refused_error(c);
    }
    /* The next message may arrive while this one is copied out and processed. */
    int rc = grpct_post_recv(c);
    uint8_t *buf = rc < 0 ? NULL : t->host->alloc(n ? n : 1, GRPCT_ALIGN);
    if (rc >= 0 && !buf)
        rc = t->host->error(RLX_E_NOMEM, "grpc: cannot allocate %zu bytes for a message from %s", n, c->peer);
    if (buf) {
        grpc_byte_buffer_reader reader;
        size_t off = 0;
        if (!grpc_byte_buffer_reader_init(&reader, bb)) {
            rc = t->host->error(RLX_E_FORMAT, "grpc: message from %s cannot be read (compressed?)", c->peer);
        } else {
            grpc_slice s;
            while (grpc_byte_buffer_reader_next(&reader, &s)) {
                const size_t k = GRPC_SLICE_LENGTH(s);
                if (k && off + k <= n)
                    memcpy(buf + off, GRPC_SLICE_START_PTR(s), k);
                off += k;
                grpc_slice_unref(s);
            }
            grpc_byte_buffer_reader_destroy(&reader);
            if (off != n)
                rc = t->host->error(RLX_E_INTERNAL, "grpc: message from %s: %zu bytes announced, %zu read", c->peer, n,
                                    off);
        }
    }
    grpc_byte_buffer_destroy(bb);
    if (rc < 0) {
        t->host->free(buf);
        return rc;
    }
    *data = buf;
    *len = n;
    return RLX_OK;
}

static int grpct_set_max_message(void *self, void *conn, uint64_t max_message) {
    grpct *t = self;
    grpct_conn *c = conn;
    if (!t || !c)
        return t ? t->host->error(RLX_E_INVALID, "grpc: set_max_message: NULL argument") : RLX_E_INVALID;
    if (max_message > (uint64_t)t->max_message)
        return t->host->error(RLX_E_INVALID,
                              "grpc: set_max_message on the stream with %s: %llu exceeds the transport's max_message "
                              "(%d)",
                              c->peer, (unsigned long long)max_message, t->max_message);
    c->max_message = max_message;
    return RLX_OK;
}

static int grpct_peer_address(void *self, void *conn, char *buf, size_t size) {
    grpct *t = self;
    grpct_conn *c = conn;
    if (!t || !c || !buf || !size)
        return t ? t->host->error(RLX_E_INVALID, "grpc: peer_address: NULL argument") : RLX_E_INVALID;
    if ((size_t)snprintf(buf, size, "%s", c->peer) >= size)
        return t->host->error(RLX_E_RANGE, "grpc: peer address %s does not fit in %zu bytes", c->peer, size);
    return RLX_OK;
}

static void grpct_conn_close(void *self, void *conn) {
    grpct *t = self;
    grpct_conn *c = conn;
    if (!t || !c)
        return;
    grpct_conn_link(c, false);
    grpct_pump_ready(c);
    const bool done = grpct_conn_advance(c); /* sends our end of the stream now, not at the next reap */
    if (done && !t->poller_started) {
        grpct_conn_destroy(c);
        return;
    }
    c->expiry = grpct_deadline(t->linger_ms);
    if (t->poller_started) {
        /* The progress thread finishes the stream and destroys the connection: gRPC's teardown of
         * a finished call and its channel takes a few hundred microseconds, which a client
         * closing after the server's status (or a peer that already left) need not wait for. */
        pthread_mutex_lock(&t->mu);
        c->next = t->zombies;
        t->zombies = c;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    while (!grpct_conn_advance(c) && grpct_pump(c, c->expiry))
        ;
    grpct_conn_destroy(c);
}

// ---- plugin ----

/* The table's entry points: each call is bracketed for the progress thread (see grpct_enter). */
static int grpct_api_listen(void *self, const char *address, void **listener) {
    if (!self)
        return RLX_E_INVALID;
    grpct_enter(self);
    const int rc = grpct_listen(self, address, listener);
    grpct_leave(self);
    return rc;
}

static int grpct_api_accept(void *self, void *listener, int timeout_ms, void **conn) {
    if (!self)
        return RLX_E_INVALID;
    grpct_enter(self);
    const int rc = grpct_accept(self, listener, timeout_ms, conn);
    grpct_leave(self);
    return rc;
}

static void grpct_api_listener_close(void *self, void *listener) {
    if (!self)
        return;
    grpct_enter(self);
    grpct_listener_close(self, listener);
    grpct_leave(self);
}

static int grpct_api_connect(void *self, const char *address, int timeout_ms, void **conn) {
    if (!self)
        return RLX_E_INVALID;
    grpct_enter(self);
    const int rc = grpct_connect(self, address, timeout_ms, conn);
    grpct_leave(self);
    return rc;
}

static int grpct_api_send(void *self, void *conn, const void *data, size_t len, int timeout_ms) {
    if (!self)
        return RLX_E_INVALID;
    grpct_enter(self);
    const int rc = grpct_send(self, conn, data, len, timeout_ms);
    grpct_leave(self);
    return rc;
}

static int grpct_api_recv(void *self, void *conn, void **data, size_t *len, int timeout_ms) {
    if (!self)
        return RLX_E_INVALID;
    grpct_enter(self);
    const int rc = grpct_recv(self, conn, data, len, timeout_ms);
    grpct_leave(self);
    return rc;
}

static void grpct_api_conn_close(void *self, void *conn) {
    if (!self)
        return;
    grpct_enter(self);
    grpct_conn_close(self, conn);
    grpct_leave(self);
}

static const rlx_transport_iface grpct_iface = {
    .size = sizeof(rlx_transport_iface),
    .open = grpct_open,
    .close = grpct_close,
    .listen = grpct_api_listen,
    .accept = grpct_api_accept,
    .bound_address = grpct_bound_address,
    .listener_close = grpct_api_listener_close,
    .connect = grpct_api_connect,
    .send = grpct_api_send,
    .recv = grpct_api_recv,
    .conn_close = grpct_api_conn_close,
    .set_max_message = grpct_set_max_message,
    .peer_address = grpct_peer_address,
};

static const rlx_plugin grpct_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_TRANSPORT,
    .name = "grpc",
    .version = "0.1.0",
    .summary = "gRPC transport (C core): one bidirectional stream /rlx.Pipeline/Link per connection",
    .iface = &grpct_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    if (!host || host->abi_major != RLX_ABI_MAJOR) {
        if (host && host->error)
            host->error(RLX_E_ABI, "grpc: built for ABI %d, host has %u", RLX_ABI_MAJOR, host->abi_major);
        return NULL;
    }
    return &grpct_plugin;
}
