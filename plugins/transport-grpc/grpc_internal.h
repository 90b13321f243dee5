/* transport-grpc's private header: constants, the instance, listener and connection structs,
 * and what its files call across each other (grpc_transport.c the plugin entry, options, send
 * and recv; grpc_conn.c completion queues, ops and the progress thread; grpc_server.c
 * listeners; grpc_client.c connect; grpc_diagnose.c why a connect failed). Each function's
 * contract is the comment at its definition. Symbols are hidden: only rlx_plugin_entry leaves
 * the plugin. */
#ifndef RLX_PLUGINS_GRPC_INTERNAL_H
#define RLX_PLUGINS_GRPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <openssl/ssl.h>

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

// ---- grpc_transport.c ----

/* The latest gRPC error logged on this thread: the only place some failures explain themselves. */
extern _Thread_local char grpct_last_log[1024];
/* The cause in a gRPC error log line (grpct_last_log). */
void grpct_log_cause(const char *log, char *out, size_t size);
size_t grpct_common_args(const grpct *t, grpc_arg *a, bool server);

// ---- grpc_conn.c ----

gpr_timespec grpct_deadline(int timeout_ms);
bool grpct_passed(gpr_timespec deadline);
const char *grpct_status_name(int code);
const char *grpct_state_name(grpc_connectivity_state st);
int grpct_split_address(const grpct *t, const char *address, char *host, size_t host_size, unsigned *port);
void grpct_peer_name(grpc_call *call, char *buf, size_t size);
int grpct_pump(grpct_conn *c, gpr_timespec deadline);
int grpct_start(grpct_conn *c, const grpc_op *ops, size_t n, int kind);
int grpct_post_recv(grpct_conn *c);
grpct_conn *grpct_conn_new(grpct *t, bool is_server);
void grpct_conn_link(grpct_conn *c, bool link);
bool grpct_conn_advance(grpct_conn *c);
void grpct_conn_destroy(grpct_conn *c);
void grpct_pump_ready(grpct_conn *c);
int grpct_stream_error(grpct_conn *c, const char *doing, gpr_timespec deadline);
int grpct_refused_error(const grpct_conn *c);
void *grpct_poller_main(void *arg);
void grpct_enter(grpct *t);
void grpct_leave(grpct *t);

// ---- grpc_server.c ----

void grpct_listener_destroy(grpct_listener *l);
void grpct_listener_unref(grpct_listener *l);
int grpct_listen(void *self, const char *address, void **listener);
int grpct_bound_address(void *self, void *listener, char *buf, size_t size);
void grpct_listener_close(void *self, void *listener);
int grpct_accept(void *self, void *listener, int timeout_ms, void **conn);

// ---- grpc_client.c, grpc_diagnose.c ----

int grpct_connect(void *self, const char *address, int timeout_ms, void **conn);
void grpct_probe(grpct_conn *c, gpr_timespec deadline, char *why, size_t size);
bool grpct_tcp_accepts(const char *host, unsigned port);
const char *grpct_tls_cause(grpct *t, const char *why, const char *host, unsigned port, char *out, size_t size);

#endif
