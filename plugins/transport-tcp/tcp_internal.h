/* transport-tcp's private header: the constants, the instance, listener and connection structs,
 * and what its files (tcp.c sockets and the plugin entry, tcp_frame.c framing, tcp_tls.c TLS,
 * crc32c.c checksums) call across each other. Symbols are hidden: only rlx_plugin_entry leaves
 * the plugin. */
#ifndef RLX_PLUGINS_TCP_INTERNAL_H
#define RLX_PLUGINS_TCP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <openssl/ssl.h>

#include "rlx/transport_iface.h"

#define TCP_MAGIC0 'R'
#define TCP_MAGIC1 'L'
#define TCP_MAGIC2 'X'
#define TCP_MAGIC3 'T'
#define TCP_VERSION 1
#define TCP_HEADER_SIZE 24
#define TCP_FLAG_NO_CRC 0x0001u
#define TCP_KNOWN_FLAGS TCP_FLAG_NO_CRC
/* Read-ahead buffer: a small message and its header arrive with one recv(). */
#define TCP_RBUF_SIZE (64 * 1024)
/* Largest single recv() into a payload, so the checksum runs over cache-warm bytes. */
#define TCP_READ_CHUNK (1024 * 1024)
/* A full payload buffer grows this many times over (see tcp_grow_payload). */
#define TCP_GROWTH 8
#define TCP_ADDR_MAX 320
#define TCP_ALIGN 64
#define TCP_DEFAULT_MAX_MESSAGE (4ull << 30)
/* Connect retries: first pause, and the cap the doubling stops at. */
#define TCP_BACKOFF_FIRST_MS 10
#define TCP_BACKOFF_MAX_MS 500
/* Worded as the grpc transport words it: a stage's commonest start-up failure reads the same. */
#define TCP_IN_USE "the port is in use (another process listens there, perhaps another rlx stage)"
/* A TLS message up to this size goes out as one SSL_write with its header (one record). */
#define TCP_TLS_COALESCE (16 * 1024 - TCP_HEADER_SIZE)
/* How many of the peer's first bytes a TLS connection keeps, to name what it spoke. */
#define TCP_FIRST_BYTES 8

/* A raw CRC32C update, without the pre- and post-inversion (crc32c.c). */
typedef uint32_t (*tcp_crc_fn)(uint32_t crc, const uint8_t *p, size_t n);

/* Listeners and connections sit in one list per instance so close() can release what the
 * application left open. */
typedef struct tcp_node {
    struct tcp_node *prev, *next;
} tcp_node;

typedef struct tcp {
    const rlx_host *host;
    uint64_t max_message;
    bool checksum;             /* option checksum: send a payload CRC, and require one on receive */
    bool checksum_given;       /* the option was given, not defaulted from TLS */
    tcp_crc_fn crc;            /* crc32c.c's fastest for this CPU */
    pthread_mutex_t mu;        /* guards the lists */
    tcp_node listeners, conns; /* circular, with these as heads */
    /* TLS: NULL without the tls_* options. One context per role; an SSL per connection. */
    SSL_CTX *tls_server, *tls_client;
    BIO_METHOD *tls_bio; /* the socket BIO every connection's SSL reads and writes through */
    char tls_name[256];  /* option tls_name, "" for the host of the address */
} tcp;

typedef struct tcp_listener {
    tcp_node node; /* first: a tcp_node * is a tcp_listener * */
    int fd;
    char address[TCP_ADDR_MAX]; /* as given to listen */
} tcp_listener;

typedef struct tcp_conn {
    tcp_node node; /* first: a tcp_node * is a tcp_conn * */
    int fd;
    char peer[TCP_ADDR_MAX];
    uint64_t max_message; /* the instance's, or lower after set_max_message */
    /* TLS: ssl is NULL on a plaintext connection; tls_done once the handshake has finished. */
    SSL *ssl;
    bool tls_server, tls_done, peer_eof;
    uint8_t first[TCP_FIRST_BYTES]; /* the peer's first bytes, n_first of them */
    size_t n_first;
    /* A failed direction stays failed: the stream is out of step from then on. */
    int send_rc, recv_rc;
    char send_why[192], recv_why[256];
    /* The frame being received; kept across a timeout so the next recv resumes it. */
    uint8_t hdr[TCP_HEADER_SIZE];
    size_t hdr_got;
    uint8_t *payload;        /* host->alloc'd once the header is checked; NULL before */
    uint64_t want, got, cap; /* declared length, bytes received, bytes payload holds */
    uint32_t crc, crc_want;
    bool check_crc;
    uint8_t *rbuf; /* TCP_RBUF_SIZE bytes of read-ahead: [rpos, rlen) not consumed yet */
    size_t rpos, rlen;
} tcp_conn;

// ---- small helpers ----

static inline int64_t tcp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t tcp_deadline(int timeout_ms) {
    return tcp_now_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
}

/* Milliseconds left until deadline, rounded up so poll never wakes early; 0 once it passed. */
static inline int tcp_left_ms(int64_t deadline) {
    const int64_t left = deadline - tcp_now_ns();
    return left <= 0 ? 0 : (int)((left + 999999) / 1000000);
}

static inline void tcp_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void tcp_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tcp_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t tcp_get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline uint32_t tcp_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t tcp_get64(const uint8_t *p) { return (uint64_t)tcp_get32(p) | (uint64_t)tcp_get32(p + 4) << 32; }

// ---- crc32c.c ----

/* The fastest CRC32C update this CPU runs, its tables made once per process. */
tcp_crc_fn tcp_crc_pick(void);

static inline uint32_t tcp_crc32c(const tcp *s, const void *p, size_t n) { return ~s->crc(~0u, p, n); }

// ---- tcp.c: the plugin and its sockets ----

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host);

/* Waits until fd is ready for events or deadline passes: 1 ready, 0 timed out, -errno. */
int tcp_wait(int fd, short events, int64_t deadline);
/* A new connection on fd (which it owns from then on, closed on failure), linked into s. */
int tcp_conn_create(tcp *s, int fd, const char *peer, tcp_conn **out);

// ---- tcp_tls.c ----

/* Makes s's two TLS contexts from the PEM files; RLX_E_INVALID naming the option that is wrong. */
int tcp_tls_setup(tcp *s, const char *ca, const char *cert, const char *key);
void tcp_tls_free(tcp *s);
/* Gives c its SSL: the server side of an accepted connection, or the client side of one to
 * host (whose name or IP address the server's certificate must carry, or option tls_name). */
int tcp_tls_start(tcp *s, tcp_conn *c, bool server, const char *host);
/* Runs or resumes c's TLS handshake. RLX_OK once it is done; a failure leaves c unusable
 * (tcp_tls_broken); RLX_E_TIMEOUT, with no message, when deadline passes first: the caller
 * says what it was doing, and a later call resumes. */
int tcp_tls_handshake(tcp *s, tcp_conn *c, int64_t deadline);
/* An accepted connection's handshake, inside its first recv or send (doing is "receiving" or
 * "sending"): a silent peer costs only its own calls their timeout. */
int tcp_tls_accept(tcp *s, tcp_conn *c, int64_t deadline, int timeout_ms, const char *doing);
/* Records a TLS failure: both directions of c are unusable from then on. */
int tcp_tls_broken(tcp *s, tcp_conn *c, int rc, const char *what, int ssl_error, int err);
/* Whether b holds the start of an rlx frame: a plaintext peer. */
bool tcp_is_frame_start(const uint8_t *b, size_t n);

// ---- tcp_frame.c ----

int tcp_send(void *self, void *conn, const void *data, size_t len, int timeout_ms);
int tcp_recv(void *self, void *conn, void **data, size_t *len, int timeout_ms);
/* Records a failure that leaves the incoming stream out of step, and reports it. */
int tcp_recv_broken(tcp *s, tcp_conn *c, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
