/* transport-tcp: rlx messages over TCP sockets, one frame per message, optionally inside TLS 1.3.
 *
 * A frame is a 24-byte little-endian header followed by the payload:
 *   0  magic "RLXT"           4 bytes
 *   4  protocol version       u16 (TCP_VERSION)
 *   6  flags                  u16 (TCP_FLAG_NO_CRC: the sender skipped the payload checksum)
 *   8  payload length         u64 (the receiver refuses more than its limit, from the header)
 *  16  CRC32C of the payload  u32 (0 with TCP_FLAG_NO_CRC)
 *  20  CRC32C of bytes 0..19  u32
 * Sockets are non-blocking and every wait is a poll() bounded by the caller's deadline, so
 * no call outlives its timeout_ms. A receive that times out mid-frame keeps its progress and
 * the next recv resumes it; a send that times out mid-frame shuts the socket down for writing
 * (the peer then sees the frame cut short) and the connection refuses further sends. Sends
 * use MSG_NOSIGNAL, so a vanished peer is RLX_E_PEER, never SIGPIPE.
 *
 * A receive grows its payload buffer as the bytes arrive (TCP_READ_CHUNK first, then TCP_GROWTH
 * times over whenever it is full, never past the length the header declares): a header
 * announcing 4 GiB followed by silence holds one chunk, and the copies on growth add up to a
 * seventh of the message.
 *
 * TLS: with tls_ca, tls_cert and tls_key every connection is TLS 1.3 with certificates checked
 * both ways (see rlx/transport_iface.h); the frames inside are the same bytes. The record layer
 * goes through a BIO of our own that sends with MSG_NOSIGNAL and remembers the peer's first
 * bytes, so a failed handshake can say what the peer spoke instead. accept never handshakes: an
 * accepted connection runs SSL_accept inside its first recv or send, within that call's timeout
 * and resumed by the next call if it runs out. Handshake failures are RLX_E_AUTH, and so is a
 * TLS ClientHello arriving at a listener without TLS (the two ends are configured differently,
 * which no retry mends). In TLS 1.3 the client finishes before the server has checked its
 * certificate, so a client whose certificate the stage refuses learns it from its first recv
 * (the stage's alert), not from connect. A send that times out after TLS took some of the frame
 * leaves the connection unable to send, as mid-frame in plaintext: a TLS record may be half out.
 *
 * Options ("key=value" pairs separated by commas, all optional):
 *   max_message=N[K|M|G]   largest payload accepted by recv (default 4G = 4 GiB); set_max_message
 *                          lowers it per connection
 *   checksum=on|off        compute the payload CRC32C on send (default on; frames without it
 *                          are accepted either way, the header is always checked)
 *   tls_ca=FILE, tls_cert=FILE, tls_key=FILE   PEM files: TLS with mutual authentication
 *   tls_name=NAME          connect: the name the server's certificate must carry (default: the
 *                          host of the address; an IP address is matched as one) */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

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

/* Listeners and connections sit in one list per instance so close() can release what the
 * application left open. */
typedef struct tcp_node {
    struct tcp_node *prev, *next;
} tcp_node;

typedef struct tcp {
    const rlx_host *host;
    uint64_t max_message;
    bool checksum;
    uint32_t (*crc)(uint32_t crc, const uint8_t *p, size_t n); /* raw update, no pre/post inversion */
    pthread_mutex_t mu;                                        /* guards the lists */
    tcp_node listeners, conns;                                 /* circular, with these as heads */
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

// ---- CRC32C (Castagnoli): SSE4.2 when the CPU has it, slicing-by-8 tables otherwise ----

static uint32_t tcp_crc_table[8][256];
static pthread_once_t tcp_crc_once = PTHREAD_ONCE_INIT;

static void tcp_crc_init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        tcp_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            tcp_crc_table[t][i] = (tcp_crc_table[t - 1][i] >> 8) ^ tcp_crc_table[0][tcp_crc_table[t - 1][i] & 0xff];
}

static uint32_t tcp_crc_sw(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c; /* little-endian hosts only; rlx targets x86-64 and aarch64 Linux */
        c = tcp_crc_table[7][lo & 0xff] ^ tcp_crc_table[6][(lo >> 8) & 0xff] ^ tcp_crc_table[5][(lo >> 16) & 0xff] ^
            tcp_crc_table[4][lo >> 24] ^ tcp_crc_table[3][hi & 0xff] ^ tcp_crc_table[2][(hi >> 8) & 0xff] ^
            tcp_crc_table[1][(hi >> 16) & 0xff] ^ tcp_crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ tcp_crc_table[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__)
/* The crc32 instruction has a latency of 3 cycles and a throughput of 1, so three streams over
 * three adjacent blocks run faster than one (8 -> 12-15 GB/s on the probe host, where an 8 MiB
 * buffer is then bound by L3 bandwidth; a 4 KiB payload takes 0.3 us instead of 0.55). The
 * block CRCs are then joined: crc(A B) = shift(crc(A)) ^ crc0(B), where shift appends a block
 * of zero bytes, a linear map applied through a table built once from the images of the 32
 * basis vectors. Large blocks first, then small ones for what remains. */
static const size_t tcp_crc_blocks[2] = {8192, 512};
static uint32_t tcp_crc_shift[2][4][256];
static pthread_once_t tcp_crc_shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static uint32_t tcp_crc_hw1(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    for (; n && ((uintptr_t)p & 7); n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    for (; n; n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

static uint32_t tcp_crc_apply_shift(const uint32_t sh[4][256], uint32_t c) {
    return sh[0][c & 0xff] ^ sh[1][(c >> 8) & 0xff] ^ sh[2][(c >> 16) & 0xff] ^ sh[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t tcp_crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    for (int t = 0; t < 2; t++) {
        const size_t blk = tcp_crc_blocks[t];
        for (; n >= 3 * blk; n -= 3 * blk, p += 3 * blk) {
            uint64_t a = crc, b = 0, c = 0;
            for (size_t i = 0; i < blk; i += 8) {
                uint64_t va, vb, vc;
                memcpy(&va, p + i, 8);
                memcpy(&vb, p + blk + i, 8);
                memcpy(&vc, p + 2 * blk + i, 8);
                a = _mm_crc32_u64(a, va);
                b = _mm_crc32_u64(b, vb);
                c = _mm_crc32_u64(c, vc);
            }
            const uint32_t ab = tcp_crc_apply_shift(tcp_crc_shift[t], (uint32_t)a) ^ (uint32_t)b;
            crc = tcp_crc_apply_shift(tcp_crc_shift[t], ab) ^ (uint32_t)c;
        }
    }
    return tcp_crc_hw1(crc, p, n);
}

static void tcp_crc_init_shift(void) {
    static const uint8_t zeros[8192];
    for (int t = 0; t < 2; t++) {
        uint32_t basis[32];
        for (int k = 0; k < 32; k++)
            basis[k] = tcp_crc_hw1(1u << k, zeros, tcp_crc_blocks[t]);
        for (int j = 0; j < 4; j++)
            for (uint32_t v = 0; v < 256; v++) {
                uint32_t r = 0;
                for (int bit = 0; bit < 8; bit++)
                    if (v >> bit & 1)
                        r ^= basis[8 * j + bit];
                tcp_crc_shift[t][j][v] = r;
            }
    }
}
#endif

static uint32_t tcp_crc32c(const tcp *s, const void *p, size_t n) { return ~s->crc(~0u, p, n); }

// ---- small helpers ----

static int64_t tcp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t tcp_deadline(int timeout_ms) {
    return tcp_now_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
}

/* Milliseconds left until deadline, rounded up so poll never wakes early; 0 once it passed. */
static int tcp_left_ms(int64_t deadline) {
    const int64_t left = deadline - tcp_now_ns();
    return left <= 0 ? 0 : (int)((left + 999999) / 1000000);
}

static void tcp_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void tcp_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void tcp_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t tcp_get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t tcp_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t tcp_get64(const uint8_t *p) { return (uint64_t)tcp_get32(p) | (uint64_t)tcp_get32(p + 4) << 32; }

/* Waits until fd is ready for events or deadline passes: 1 ready, 0 timed out, -errno. */
static int tcp_wait(int fd, short events, int64_t deadline) {
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        const int n = poll(&pfd, 1, tcp_left_ms(deadline));
        if (n > 0)
            return 1; /* POLLERR/POLLHUP too: the next recv/send reports the cause */
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

/* rlx_iface_split_address with the port as text for getaddrinfo. */
static int tcp_split_address(const tcp *s, const char *address, char *host, size_t host_size, char *port) {
    char err[256];
    unsigned number;
    const int rc = rlx_iface_split_address(address, host, host_size, &number, err, sizeof err);
    if (rc < 0)
        return s->host->error(rc, "tcp: %s", err);
    snprintf(port, 6, "%u", number);
    return RLX_OK;
}

/* Formats a socket address as "a.b.c.d:port" or "[v6]:port" (IPv4-mapped IPv6 as IPv4). */
static int tcp_format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t size) {
    char ip[INET6_ADDRSTRLEN];
    int n;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        n = snprintf(buf, size, "%s:%u", ip, ntohs(a->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
            inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], ip, sizeof ip);
            n = snprintf(buf, size, "%s:%u", ip, ntohs(a->sin6_port));
        } else {
            inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
            n = snprintf(buf, size, "[%s]:%u", ip, ntohs(a->sin6_port));
        }
    } else {
        n = snprintf(buf, size, "?");
    }
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static void tcp_link(tcp *s, tcp_node *head, tcp_node *n) {
    pthread_mutex_lock(&s->mu);
    n->prev = head;
    n->next = head->next;
    head->next->prev = n;
    head->next = n;
    pthread_mutex_unlock(&s->mu);
}

static void tcp_unlink(tcp *s, tcp_node *n) {
    pthread_mutex_lock(&s->mu);
    n->prev->next = n->next;
    n->next->prev = n->prev;
    pthread_mutex_unlock(&s->mu);
}

// ---- TLS ----

/* The record layer's socket: send with MSG_NOSIGNAL (OpenSSL's own socket BIO uses write(), and
 * a vanished peer would raise SIGPIPE), and keep the peer's first bytes for tcp_tls_cause. */
static int tcp_bio_write(BIO *b, const char *buf, int len) {
    const tcp_conn *c = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    const ssize_t n = send(c->fd, buf, (size_t)len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)n;
}

static int tcp_bio_read(BIO *b, char *buf, int len) {
    tcp_conn *c = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    const ssize_t n = recv(c->fd, buf, (size_t)len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    c->peer_eof = n == 0;
    for (ssize_t i = 0; i < n && c->n_first < TCP_FIRST_BYTES; i++)
        c->first[c->n_first++] = (uint8_t)buf[i];
    return (int)n;
}

/* SSL asks a BIO to flush after writing; there is nothing else a plain socket needs to answer. */
static long tcp_bio_ctrl(BIO *b, int cmd, long num, void *ptr) { return cmd == BIO_CTRL_FLUSH; }

/* Appends OpenSSL error e to the "; "-separated list in buf. */
static void tcp_tls_append(char *buf, size_t size, unsigned long e) {
    size_t used = strlen(buf);
    if (used + 8 >= size)
        return;
    if (used)
        used += (size_t)snprintf(buf + used, size - used, "; ");
    ERR_error_string_n(e, buf + used, size - used);
}

/* Appends the thread's queued OpenSSL errors to buf and empties the queue. */
static void tcp_tls_drain(char *buf, size_t size) {
    unsigned long e;
    while ((e = ERR_get_error()) != 0)
        tcp_tls_append(buf, size, e);
}

/* Does the file exist and can this process read it? The message names the option and file. */
static int tcp_tls_readable(const tcp *s, const char *option, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return s->host->error(RLX_E_INVALID, "tcp: option %s: cannot read '%s': %s", option, path, strerror(errno));
    fclose(f);
    return RLX_OK;
}

/* One role's context: TLS 1.3 only, the peer's certificate required and checked against ca,
 * this process's certificate and key presented. */
static int tcp_tls_context(tcp *s, bool server, const char *ca, const char *cert, const char *key, SSL_CTX **out) {
    char why[512] = "";
    int rc = RLX_OK;
    EVP_PKEY *pkey = NULL;
    BIO *kb = NULL;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION)) {
        tcp_tls_drain(why, sizeof why);
        rc = s->host->error(RLX_E_NOMEM, "tcp: cannot make a TLS context: %s", why);
        goto done;
    }
    SSL_CTX_set_verify(ctx, server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER, NULL);
    /* A peer that closes without close_notify reads as end of stream: the frames' own lengths
     * and checksums already tell a cut message from a whole one. */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_read_ahead(ctx, 1);
    if (server) {
        /* Every connection is long-lived and new: no resumption, so no tickets to send. */
        SSL_CTX_set_num_tickets(ctx, 0);
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    }
    if (SSL_CTX_load_verify_file(ctx, ca) != 1) {
        tcp_tls_drain(why, sizeof why);
        rc = s->host->error(RLX_E_INVALID, "tcp: option tls_ca: '%s' holds no PEM certificate (%s)", ca, why);
        goto done;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        tcp_tls_drain(why, sizeof why);
        rc = s->host->error(RLX_E_INVALID, "tcp: option tls_cert: '%s' holds no PEM certificate (%s)", cert, why);
        goto done;
    }
    kb = BIO_new_file(key, "r");
    pkey = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
    if (!pkey) {
        tcp_tls_drain(why, sizeof why);
        rc = s->host->error(RLX_E_INVALID, "tcp: option tls_key: '%s' holds no PEM private key (%s)", key, why);
        goto done;
    }
    if (X509_check_private_key(SSL_CTX_get0_certificate(ctx), pkey) != 1) {
        ERR_clear_error();
        rc = s->host->error(RLX_E_INVALID,
                            "tcp: option tls_key: the key in '%s' does not belong to the certificate in '%s'", key,
                            cert);
        goto done;
    }
    if (SSL_CTX_use_PrivateKey(ctx, pkey) != 1) {
        tcp_tls_drain(why, sizeof why);
        rc = s->host->error(RLX_E_INVALID, "tcp: option tls_key: '%s': %s", key, why);
    }
done:
    EVP_PKEY_free(pkey);
    BIO_free(kb);
    if (rc < 0)
        SSL_CTX_free(ctx);
    else
        *out = ctx;
    return rc;
}

static void tcp_tls_free(tcp *s) {
    SSL_CTX_free(s->tls_server);
    SSL_CTX_free(s->tls_client);
    BIO_meth_free(s->tls_bio);
    s->tls_server = s->tls_client = NULL;
    s->tls_bio = NULL;
}

static int tcp_tls_setup(tcp *s, const char *ca, const char *cert, const char *key) {
    int rc;
    if ((rc = tcp_tls_readable(s, "tls_ca", ca)) < 0 || (rc = tcp_tls_readable(s, "tls_cert", cert)) < 0 ||
        (rc = tcp_tls_readable(s, "tls_key", key)) < 0)
        return rc;
    s->tls_bio = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "rlx tcp socket");
    if (!s->tls_bio || !BIO_meth_set_write(s->tls_bio, tcp_bio_write) || !BIO_meth_set_read(s->tls_bio, tcp_bio_read) ||
        !BIO_meth_set_ctrl(s->tls_bio, tcp_bio_ctrl)) {
        ERR_clear_error();
        tcp_tls_free(s);
        return s->host->error(RLX_E_NOMEM, "tcp: out of memory for TLS");
    }
    if ((rc = tcp_tls_context(s, true, ca, cert, key, &s->tls_server)) < 0 ||
        (rc = tcp_tls_context(s, false, ca, cert, key, &s->tls_client)) < 0)
        tcp_tls_free(s);
    return rc;
}

/* Whether b holds the start of an rlx frame: a plaintext peer. */
static bool tcp_is_frame_start(const uint8_t *b, size_t n) {
    static const char magic[4] = {TCP_MAGIC0, TCP_MAGIC1, TCP_MAGIC2, TCP_MAGIC3};
    return n > 0 && !memcmp(b, magic, n < 4 ? n : 4);
}

/* Words why TLS failed on c for a person, into why; returns the status (RLX_E_AUTH, or
 * RLX_E_PEER when the connection itself broke). ssl_error is SSL_get_error's answer, err the
 * errno right after the call. Empties the thread's OpenSSL error queue. */
static int tcp_tls_cause(const tcp_conn *c, int ssl_error, int err, char *why, size_t size) {
    char queue[384] = "", alert[128] = "";
    bool no_cert = false;
    unsigned long e;
    while ((e = ERR_get_error()) != 0) {
        const int reason = ERR_GET_REASON(e);
        if (ERR_GET_LIB(e) == ERR_LIB_SSL && reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)
            no_cert = true;
        if (ERR_GET_LIB(e) == ERR_LIB_SSL && reason >= SSL_AD_REASON_OFFSET && !alert[0])
            snprintf(alert, sizeof alert, "%s", ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "?");
        tcp_tls_append(queue, sizeof queue, e);
    }
    /* Any TLS record starts with a content type from 20 to 23, then the major version 3. */
    const uint8_t *f = c->first;
    const bool tls_bytes = c->n_first == 0 || (f[0] >= 0x14 && f[0] <= 0x17 && (c->n_first < 2 || f[1] == 0x03));
    char seen[64] = "";
    for (size_t i = 0, used = 0; i < c->n_first && used + 4 < sizeof seen; i++)
        used += (size_t)snprintf(seen + used, sizeof seen - used, "%s%02x", i ? " " : "", f[i]);
    if (c->tls_server && !tls_bytes) {
        if (tcp_is_frame_start(f, c->n_first))
            snprintf(why, size, "the peer speaks plaintext (rlx frames without TLS)");
        else
            snprintf(why, size, "the peer does not speak TLS (its first bytes: %s)", seen);
        return RLX_E_AUTH;
    }
    if (!c->tls_server && !tls_bytes) {
        snprintf(why, size, "the stage does not speak TLS (it answered with the bytes %s%s)", seen,
                 tcp_is_frame_start(f, c->n_first) ? ", \"RLXT\": rlx frames without TLS" : "");
        return RLX_E_AUTH;
    }
    if (!c->tls_server && c->n_first == 0 && (c->peer_eof || (ssl_error == SSL_ERROR_SYSCALL && err == ECONNRESET))) {
        snprintf(why, size, "the stage does not speak TLS (it closed the connection without a TLS answer)");
        return RLX_E_AUTH;
    }
    if (no_cert) {
        snprintf(why, size, "the peer presented no certificate");
        return RLX_E_AUTH;
    }
    const long verify = SSL_get_verify_result(c->ssl);
    if (verify != X509_V_OK) {
        const bool name = verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH;
        snprintf(why, size, "certificate verify failed: %s%s", X509_verify_cert_error_string(verify),
                 name ? " (the certificate does not name the host connected to; option tls_name sets the name to "
                        "expect)"
                      : "");
        return RLX_E_AUTH;
    }
    if (alert[0]) {
        snprintf(why, size, "the peer refused the connection (its alert: %s)", alert);
        return RLX_E_AUTH;
    }
    if (c->peer_eof) {
        snprintf(why, size, "the peer closed the connection");
        return RLX_E_PEER;
    }
    if (ssl_error == SSL_ERROR_SYSCALL) {
        snprintf(why, size, "the connection failed: %s", err ? strerror(err) : "unexpected end");
        return RLX_E_PEER;
    }
    snprintf(why, size, "%s", queue[0] ? queue : "an unknown TLS error");
    return RLX_E_AUTH;
}

static int tcp_recv_broken(tcp *s, tcp_conn *c, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Records a TLS failure: both directions of c are unusable from then on. */
static int tcp_tls_broken(tcp *s, tcp_conn *c, int rc, const char *what, int ssl_error, int err) {
    char why[320];
    const int cause_rc = tcp_tls_cause(c, ssl_error, err, why, sizeof why);
    if (c->tls_server && tcp_is_frame_start(c->first, c->n_first)) {
        /* A plaintext rlx peer: answer as TLS answers what it cannot read, with a fatal alert
         * record (protocol_version), which that peer's recv names (tcp_recv_eof). Best effort:
         * seven bytes into an empty socket buffer. */
        static const uint8_t alert[7] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46};
        (void)send(c->fd, alert, sizeof alert, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    rc = tcp_recv_broken(s, c, cause_rc != RLX_E_AUTH ? cause_rc : rc, "%s with %s failed: %s", what, c->peer, why);
    memcpy(c->send_why, c->recv_why, sizeof c->send_why - 1);
    c->send_why[sizeof c->send_why - 1] = '\0';
    c->send_rc = rc;
    return rc;
}

/* Gives c its SSL: the server side of an accepted connection, or the client side of one to
 * host (whose name or IP address the server's certificate must carry, or option tls_name). */
static int tcp_tls_start(tcp *s, tcp_conn *c, bool server, const char *host) {
    ERR_clear_error();
    c->ssl = SSL_new(server ? s->tls_server : s->tls_client);
    BIO *bio = c->ssl ? BIO_new(s->tls_bio) : NULL;
    if (!bio) {
        ERR_clear_error();
        return s->host->error(RLX_E_NOMEM, "tcp: out of memory for TLS with %s", c->peer);
    }
    BIO_set_data(bio, c);
    BIO_set_init(bio, 1);
    SSL_set_bio(c->ssl, bio, bio);
    c->tls_server = server;
    if (server) {
        SSL_set_accept_state(c->ssl);
        return RLX_OK;
    }
    SSL_set_connect_state(c->ssl);
    const char *name = s->tls_name[0] ? s->tls_name : host;
    uint8_t ip[16];
    const bool is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    X509_VERIFY_PARAM *vp = SSL_get0_param(c->ssl);
    const int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, name)
                         : X509_VERIFY_PARAM_set1_host(vp, name, 0) && SSL_set_tlsext_host_name(c->ssl, name);
    ERR_clear_error();
    if (!ok)
        return s->host->error(RLX_E_INVALID, "tcp: cannot connect to %s: '%s' is not a name a certificate can carry",
                              c->peer, name);
    return RLX_OK;
}

/* Runs or resumes c's TLS handshake. RLX_OK once it is done; a failure leaves c unusable
 * (tcp_tls_broken); RLX_E_TIMEOUT, with no message, when deadline passes first: the caller
 * says what it was doing, and a later call resumes. */
static int tcp_tls_handshake(tcp *s, tcp_conn *c, int64_t deadline) {
    for (;;) {
        ERR_clear_error();
        const int r = SSL_do_handshake(c->ssl), err = errno;
        if (r == 1) {
            c->tls_done = true;
            return RLX_OK;
        }
        const int e = SSL_get_error(c->ssl, r);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
            return tcp_tls_broken(s, c, RLX_E_AUTH, "TLS handshake", e, err);
        const int w = tcp_wait(c->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
        if (w == 0)
            return RLX_E_TIMEOUT;
        if (w < 0)
            return s->host->error(RLX_E_PEER, "tcp: TLS handshake with %s: poll failed: %s", c->peer, strerror(-w));
    }
}

/* An accepted connection's handshake, inside its first recv or send (doing is "receiving" or
 * "sending"): a silent peer costs only its own calls their timeout. */
static int tcp_tls_accept(tcp *s, tcp_conn *c, int64_t deadline, int timeout_ms, const char *doing) {
    const int rc = tcp_tls_handshake(s, c, deadline);
    if (rc != RLX_E_TIMEOUT)
        return rc;
    return s->host->error(RLX_E_TIMEOUT,
                          "tcp: %s %s: the TLS handshake did not finish within %d ms (%s; the next recv or send "
                          "resumes it)",
                          doing, c->peer, timeout_ms,
                          c->n_first ? "the peer sent part of it" : "the peer sent nothing");
}

// ---- options, open, close ----

/* The tls_* file options, gathered before the contexts are made from them. */
typedef struct tcp_tls_files {
    char ca[RLX_IFACE_OPTION_VALUE_MAX], cert[RLX_IFACE_OPTION_VALUE_MAX], key[RLX_IFACE_OPTION_VALUE_MAX];
} tcp_tls_files;

static int tcp_parse_options(tcp *s, const char *options) {
    const char *cursor = options;
    rlx_iface_option o;
    char err[256];
    unsigned long long size;
    int rc;
    tcp_tls_files files = {"", "", ""};
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&o, "max_message")) {
            if (!rlx_iface_option_size(&o, 1, 1ull << 40, &size))
                return s->host->error(RLX_E_INVALID, "tcp: option '%.*s': want a size from 1 to 1T", o.item_len,
                                      o.item);
            s->max_message = size;
        } else if (rlx_iface_option_is(&o, "checksum") && (!strcmp(o.value, "on") || !strcmp(o.value, "off"))) {
            s->checksum = !strcmp(o.value, "on");
        } else if (rlx_iface_option_is(&o, "tls_ca")) {
            snprintf(files.ca, sizeof files.ca, "%s", o.value);
        } else if (rlx_iface_option_is(&o, "tls_cert")) {
            snprintf(files.cert, sizeof files.cert, "%s", o.value);
        } else if (rlx_iface_option_is(&o, "tls_key")) {
            snprintf(files.key, sizeof files.key, "%s", o.value);
        } else if (rlx_iface_option_is(&o, "tls_name")) {
            if (o.value_len >= sizeof s->tls_name)
                return s->host->error(RLX_E_INVALID, "tcp: option tls_name: a name of %zu bytes is too long",
                                      o.value_len);
            memcpy(s->tls_name, o.value, o.value_len + 1);
        } else {
            return s->host->error(RLX_E_INVALID,
                                  "tcp: unknown option '%.*s' (known: max_message=N, checksum=on|off, tls_ca=FILE, "
                                  "tls_cert=FILE, tls_key=FILE, tls_name=NAME)",
                                  o.item_len, o.item);
        }
    }
    if (rc < 0)
        return s->host->error(rc, "tcp: %s", err);
    const bool ca = files.ca[0], cert = files.cert[0], key = files.key[0];
    if (ca != cert || cert != key)
        return s->host->error(RLX_E_INVALID, "tcp: TLS needs tls_ca, tls_cert and tls_key together; missing:%s%s%s",
                              ca ? "" : " tls_ca", cert ? "" : " tls_cert", key ? "" : " tls_key");
    if (s->tls_name[0] && !ca)
        return s->host->error(RLX_E_INVALID, "tcp: option tls_name needs TLS: give tls_ca, tls_cert and tls_key too");
    return ca ? tcp_tls_setup(s, files.ca, files.cert, files.key) : RLX_OK;
}

static void tcp_listener_close(void *self, void *listener);
static void tcp_conn_close(void *self, void *conn);

static void tcp_close(void *self) {
    tcp *s = self;
    if (!s)
        return;
    while (s->conns.next != &s->conns)
        tcp_conn_close(s, s->conns.next);
    while (s->listeners.next != &s->listeners)
        tcp_listener_close(s, s->listeners.next);
    tcp_tls_free(s);
    pthread_mutex_destroy(&s->mu);
    s->host->free(s);
}

static int tcp_open(const rlx_host *host, const char *options, void **self) {
    if (!host || !self)
        return host ? host->error(RLX_E_INVALID, "tcp: open: NULL argument") : RLX_E_INVALID;
    *self = NULL;
    tcp *s = host->alloc(sizeof *s, TCP_ALIGN);
    if (!s)
        return host->error(RLX_E_NOMEM, "tcp: out of memory");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->max_message = TCP_DEFAULT_MAX_MESSAGE;
    s->checksum = true;
    s->crc = tcp_crc_sw;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) {
        pthread_once(&tcp_crc_shift_once, tcp_crc_init_shift);
        s->crc = tcp_crc_hw;
    }
#endif
    if (s->crc == tcp_crc_sw)
        pthread_once(&tcp_crc_once, tcp_crc_init_tables);
    const int rc = tcp_parse_options(s, options);
    if (rc < 0) {
        host->free(s);
        return rc;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->listeners.prev = s->listeners.next = &s->listeners;
    s->conns.prev = s->conns.next = &s->conns;
    *self = s;
    return RLX_OK;
}

// ---- listeners ----

static int tcp_listen(void *self, const char *address, void **listener) {
    tcp *s = self;
    if (!s || !listener)
        return RLX_E_INVALID;
    *listener = NULL;
    char host[TCP_ADDR_MAX], port[6];
    int rc = tcp_split_address(s, address, host, sizeof host, port);
    if (rc < 0)
        return rc;
    const bool wildcard = !host[0] || !strcmp(host, "*");
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    const int gai = getaddrinfo(wildcard ? NULL : host, port, &hints, &res);
    if (gai)
        return s->host->error(RLX_E_NOT_FOUND, "tcp: cannot listen on %s: cannot resolve '%s': %s", address, host,
                              gai_strerror(gai));
    int fd = -1, err = EADDRNOTAVAIL;
    /* A wildcard binds the IPv6 "any" address as dual-stack when it can, to take both families. */
    for (int pass = wildcard ? 0 : 1; pass < 2 && fd < 0; pass++) {
        for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            if (pass == 0 && ai->ai_family != AF_INET6)
                continue;
            fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0) {
                err = errno;
                continue;
            }
            const int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (ai->ai_family == AF_INET6 && wildcard)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
                err = errno;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return s->host->error(RLX_E_IO, "tcp: cannot listen on %s: %s", address,
                              err == EADDRINUSE ? TCP_IN_USE : strerror(err));
    tcp_listener *l = s->host->alloc(sizeof *l, TCP_ALIGN);
    if (!l) {
        close(fd);
        return s->host->error(RLX_E_NOMEM, "tcp: out of memory");
    }
    l->fd = fd;
    snprintf(l->address, sizeof l->address, "%s", address);
    tcp_link(s, &s->listeners, &l->node);
    *listener = l;
    return RLX_OK;
}

static int tcp_bound_address(void *self, void *listener, char *buf, size_t size) {
    tcp *s = self;
    tcp_listener *l = listener;
    if (!s || !l || !buf || !size)
        return RLX_E_INVALID;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0)
        return s->host->error(RLX_E_IO, "tcp: listener %s: getsockname: %s", l->address, strerror(errno));
    if (tcp_format_sockaddr(&ss, buf, size) < 0)
        return s->host->error(RLX_E_RANGE, "tcp: listener %s: address does not fit in %zu bytes", l->address, size);
    return RLX_OK;
}

static void tcp_listener_close(void *self, void *listener) {
    tcp *s = self;
    tcp_listener *l = listener;
    if (!s || !l)
        return;
    tcp_unlink(s, &l->node);
    close(l->fd);
    s->host->free(l);
}

// ---- connections ----

static int tcp_conn_create(tcp *s, int fd, const char *peer, tcp_conn **out) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Keepalive turns a peer that vanished without a FIN (power loss, partition) into an
     * error within about a minute instead of a connection that is silently dead forever. */
    const int idle = 30, intvl = 10, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    tcp_conn *c = s->host->alloc(sizeof *c, TCP_ALIGN);
    uint8_t *rbuf = s->host->alloc(TCP_RBUF_SIZE, TCP_ALIGN);
    if (!c || !rbuf) {
        s->host->free(c);
        s->host->free(rbuf);
        close(fd);
        return s->host->error(RLX_E_NOMEM, "tcp: out of memory for a connection with %s", peer);
    }
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->rbuf = rbuf;
    c->max_message = s->max_message;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    tcp_link(s, &s->conns, &c->node);
    *out = c;
    return RLX_OK;
}

static int tcp_accept(void *self, void *listener, int timeout_ms, void **conn) {
    tcp *s = self;
    tcp_listener *l = listener;
    if (!s || !l || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    const int64_t deadline = tcp_deadline(timeout_ms);
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        const int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            char peer[TCP_ADDR_MAX];
            if (tcp_format_sockaddr(&ss, peer, sizeof peer) < 0)
                snprintf(peer, sizeof peer, "?");
            tcp_conn *c;
            int rc = tcp_conn_create(s, fd, peer, &c);
            if (rc == RLX_OK && s->tls_server && (rc = tcp_tls_start(s, c, true, NULL)) < 0)
                tcp_conn_close(s, c);
            if (rc == RLX_OK)
                *conn = c;
            return rc;
        }
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED || err == EPROTO)
            continue;
        if (err != EAGAIN && err != EWOULDBLOCK)
            return s->host->error(RLX_E_IO, "tcp: accept on %s failed: %s", l->address, strerror(err));
        const int w = tcp_wait(l->fd, POLLIN, deadline);
        if (w == 0)
            return s->host->error(RLX_E_TIMEOUT, "tcp: no connection on %s within %d ms", l->address, timeout_ms);
        if (w < 0)
            return s->host->error(RLX_E_IO, "tcp: waiting for connections on %s: %s", l->address, strerror(-w));
    }
}

/* One connection attempt to one address: 1 connected (*fd_out set), 0 failed (*err set). */
static int tcp_try_connect(const struct addrinfo *ai, int64_t deadline, int *fd_out, int *err) {
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return 0;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
        const int w = tcp_wait(fd, POLLOUT, deadline);
        if (w <= 0) {
            *err = w == 0 ? ETIMEDOUT : -w;
            close(fd);
            return 0;
        }
        socklen_t len = sizeof *err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, err, &len) != 0)
            *err = errno;
        rc = *err ? -1 : 0;
    } else if (rc != 0) {
        *err = errno;
    }
    if (rc == 0) {
        /* Retrying towards a local port nobody listens on can connect the socket to itself
         * (TCP simultaneous open, when the kernel picks that very port as the source). */
        struct sockaddr_storage me, peer;
        socklen_t me_len = sizeof me, peer_len = sizeof peer;
        if (getsockname(fd, (struct sockaddr *)&me, &me_len) == 0 &&
            getpeername(fd, (struct sockaddr *)&peer, &peer_len) == 0 && me_len == peer_len &&
            memcmp(&me, &peer, me_len) == 0) {
            *err = ECONNREFUSED;
            rc = -1;
        }
    }
    if (rc != 0) {
        close(fd);
        return 0;
    }
    *fd_out = fd;
    return 1;
}

/* The client handshake, within what is left of connect's deadline. */
static int tcp_connect_tls(tcp *s, tcp_conn *c, const char *host, int64_t deadline, int timeout_ms) {
    int rc = tcp_tls_start(s, c, false, host);
    if (rc == RLX_OK && (rc = tcp_tls_handshake(s, c, deadline)) == RLX_E_TIMEOUT)
        rc = s->host->error(RLX_E_TIMEOUT,
                            "tcp: cannot connect to %s within %d ms: the TLS handshake did not finish (%s)", c->peer,
                            timeout_ms,
                            c->n_first ? "the stage answered part of it"
                                       : "the peer accepted the connection but never answered: a stage that is not "
                                         "receiving yet, or not a TLS stage");
    return rc;
}

static int tcp_connect(void *self, const char *address, int timeout_ms, void **conn) {
    tcp *s = self;
    if (!s || !conn)
        return RLX_E_INVALID;
    *conn = NULL;
    char host[TCP_ADDR_MAX], port[6];
    int rc = tcp_split_address(s, address, host, sizeof host, port);
    if (rc < 0)
        return rc;
    if (!host[0] || !strcmp(host, "*"))
        return s->host->error(RLX_E_INVALID, "tcp: cannot connect to '%s': no host", address);
    if (!strcmp(port, "0"))
        return s->host->error(RLX_E_INVALID, "tcp: cannot connect to '%s': port 0", address);
    const int64_t start = tcp_now_ns(), deadline = tcp_deadline(timeout_ms);
    int backoff_ms = TCP_BACKOFF_FIRST_MS, attempts = 0, err = 0;
    char why[160] = "";
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
        struct addrinfo *res = NULL;
        /* getaddrinfo has no timeout of its own; numeric hosts and /etc/hosts names return at once. */
        const int gai = getaddrinfo(host, port, &hints, &res);
        if (gai == EAI_AGAIN) {
            err = 0;
            snprintf(why, sizeof why, "cannot resolve the host name: %s", gai_strerror(gai));
        } else if (gai) {
            return s->host->error(RLX_E_NOT_FOUND, "tcp: cannot connect to %s: cannot resolve '%s': %s", address, host,
                                  gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
        } else {
            int n_ai = 0;
            for (const struct addrinfo *ai = res; ai; ai = ai->ai_next)
                n_ai++;
            for (const struct addrinfo *ai = res; ai; ai = ai->ai_next, n_ai--) {
                /* Several addresses (localhost: ::1 and 127.0.0.1) share the time left, so
                 * one that swallows SYNs cannot use it all. */
                const int64_t now = tcp_now_ns(), slice = (deadline - now) / (n_ai > 0 ? n_ai : 1);
                int fd = -1;
                attempts++;
                if (tcp_try_connect(ai, now + (slice > 0 ? slice : 0), &fd, &err)) {
                    freeaddrinfo(res);
                    tcp_conn *c;
                    if ((rc = tcp_conn_create(s, fd, address, &c)) < 0)
                        return rc;
                    if (s->tls_client && (rc = tcp_connect_tls(s, c, host, deadline, timeout_ms)) < 0) {
                        tcp_conn_close(s, c);
                        return rc;
                    }
                    *conn = c;
                    return RLX_OK;
                }
                snprintf(why, sizeof why, "%s",
                         err == ETIMEDOUT ? "no answer from the host (down, unreachable, or a firewall drops the "
                                            "connection)"
                                          : strerror(err));
            }
            freeaddrinfo(res);
        }
        const int left = tcp_left_ms(deadline);
        if (left <= 0)
            break;
        const struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(backoff_ms < left ? backoff_ms : left) * 1000000};
        nanosleep(&ts, NULL);
        backoff_ms = backoff_ms * 2 < TCP_BACKOFF_MAX_MS ? backoff_ms * 2 : TCP_BACKOFF_MAX_MS;
    }
    /* Refused to the end means nothing listens there (the host answered): a peer failure, not a
     * silence. */
    return s->host->error(err == ECONNREFUSED ? RLX_E_PEER : RLX_E_TIMEOUT,
                          "tcp: cannot connect to %s within %d ms (%d attempt%s over %lld ms): %s", address, timeout_ms,
                          attempts, attempts == 1 ? "" : "s", (long long)((tcp_now_ns() - start) / 1000000), why);
}

static void tcp_conn_close(void *self, void *conn) {
    tcp *s = self;
    tcp_conn *c = conn;
    if (!s || !c)
        return;
    tcp_unlink(s, &c->node);
    if (c->ssl) {
        /* close_notify if it fits in the socket now; nobody waits for the peer's. */
        ERR_clear_error();
        if (c->tls_done && !c->send_rc)
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        ERR_clear_error();
    }
    close(c->fd);
    s->host->free(c->payload);
    s->host->free(c->rbuf);
    s->host->free(c);
}

// ---- send ----

/* Records why sending stopped working (the outgoing stream is out of step after a partial
 * frame) and reports it. */
static int tcp_send_fail(tcp *s, tcp_conn *c, int rc, const char *why, bool mid_frame, uint64_t sent, uint64_t total) {
    snprintf(c->send_why, sizeof c->send_why, "%s", why);
    c->send_rc = rc;
    if (mid_frame) {
        /* The peer must not wait for the rest of a frame that will never come. */
        shutdown(c->fd, SHUT_WR);
        return s->host->error(rc,
                              "tcp: sending to %s: %s with %llu of %llu bytes of the frame sent (the connection "
                              "sends no more)",
                              c->peer, why, (unsigned long long)sent, (unsigned long long)total);
    }
    return s->host->error(rc, "tcp: sending to %s: %s", c->peer, why);
}

/* Sends a frame through TLS: one SSL_write for a small message and its header, else the header
 * and then the whole payload in one SSL_write_ex (OpenSSL cuts it into records itself). A
 * write that must wait is retried with the same arguments, as OpenSSL requires. */
static int tcp_send_tls(tcp *s, tcp_conn *c, const uint8_t *hdr, const void *data, size_t len, int64_t deadline,
                        int timeout_ms) {
    uint8_t small[TCP_HEADER_SIZE + TCP_TLS_COALESCE];
    struct {
        const uint8_t *p;
        size_t n;
    } piece[2] = {{hdr, TCP_HEADER_SIZE}, {data, len}};
    int n_pieces = len ? 2 : 1;
    if (len && len <= TCP_TLS_COALESCE) {
        memcpy(small, hdr, TCP_HEADER_SIZE);
        memcpy(small + TCP_HEADER_SIZE, data, len);
        piece[0].p = small;
        piece[0].n = TCP_HEADER_SIZE + len;
        n_pieces = 1;
    }
    const uint64_t total = TCP_HEADER_SIZE + (uint64_t)len;
    uint64_t sent = 0;
    for (int i = 0; i < n_pieces; i++) {
        while (piece[i].n) {
            ERR_clear_error();
            size_t k = 0;
            const int ok = SSL_write_ex(c->ssl, piece[i].p, piece[i].n, &k), err = errno;
            if (ok) {
                piece[i].p += k;
                piece[i].n -= k;
                sent += k;
                continue;
            }
            const int e = SSL_get_error(c->ssl, ok);
            char why[192];
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                const int w = tcp_wait(c->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
                if (w > 0)
                    continue;
                if (w == 0)
                    snprintf(why, sizeof why, "timed out after %d ms", timeout_ms);
                else
                    snprintf(why, sizeof why, "poll failed: %s", strerror(-w));
                /* Part of a record may be out, or held by OpenSSL for this very retry. */
                return tcp_send_fail(s, c, w == 0 ? RLX_E_TIMEOUT : RLX_E_PEER, why, true, sent, total);
            }
            if (e == SSL_ERROR_SYSCALL && err) {
                ERR_clear_error();
                snprintf(why, sizeof why, "the connection failed: %s", strerror(err));
                return tcp_send_fail(s, c, RLX_E_PEER, why, sent > 0, sent, total);
            }
            return tcp_tls_broken(s, c, RLX_E_AUTH, "TLS", e, err);
        }
    }
    return RLX_OK;
}

static int tcp_send(void *self, void *conn, const void *data, size_t len, int timeout_ms) {
    tcp *s = self;
    tcp_conn *c = conn;
    if (!s || !c || (len && !data))
        return s ? s->host->error(RLX_E_INVALID, "tcp: send: NULL argument") : RLX_E_INVALID;
    if (c->send_rc) /* a refused peer stays refused; any other failure leaves nothing to send to */
        return s->host->error(c->send_rc == RLX_E_AUTH ? RLX_E_AUTH : RLX_E_PEER,
                              "tcp: connection to %s cannot send any more: an earlier failure (%s)", c->peer,
                              c->send_why);
    const int64_t deadline = tcp_deadline(timeout_ms);
    int rc;
    if (c->ssl && !c->tls_done && (rc = tcp_tls_accept(s, c, deadline, timeout_ms, "sending to")) < 0)
        return rc;
    uint8_t hdr[TCP_HEADER_SIZE];
    hdr[0] = TCP_MAGIC0;
    hdr[1] = TCP_MAGIC1;
    hdr[2] = TCP_MAGIC2;
    hdr[3] = TCP_MAGIC3;
    tcp_put16(hdr + 4, TCP_VERSION);
    tcp_put16(hdr + 6, s->checksum ? 0 : TCP_FLAG_NO_CRC);
    tcp_put64(hdr + 8, len);
    tcp_put32(hdr + 16, s->checksum ? tcp_crc32c(s, data, len) : 0);
    tcp_put32(hdr + 20, tcp_crc32c(s, hdr, 20));
    if (c->ssl)
        return tcp_send_tls(s, c, hdr, data, len, deadline, timeout_ms);
    struct iovec iov[2] = {{.iov_base = hdr, .iov_len = sizeof hdr}, {.iov_base = (void *)data, .iov_len = len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
    const uint64_t total = sizeof hdr + (uint64_t)len;
    uint64_t sent = 0;
    while (sent < total) {
        const ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (n >= 0) {
            sent += (uint64_t)n;
            size_t k = (size_t)n;
            while (mh.msg_iovlen && k >= mh.msg_iov[0].iov_len) {
                k -= mh.msg_iov[0].iov_len;
                mh.msg_iov++;
                mh.msg_iovlen--;
            }
            if (mh.msg_iovlen) {
                mh.msg_iov[0].iov_base = (uint8_t *)mh.msg_iov[0].iov_base + k;
                mh.msg_iov[0].iov_len -= k;
            }
            continue;
        }
        const int err = errno;
        if (err == EINTR)
            continue;
        char why[96];
        if (err != EAGAIN && err != EWOULDBLOCK) {
            snprintf(why, sizeof why, "the connection failed: %s", strerror(err));
            return tcp_send_fail(s, c, RLX_E_PEER, why, sent > 0, sent, total);
        }
        const int w = tcp_wait(c->fd, POLLOUT, deadline);
        if (w == 0 && sent == 0) /* nothing of this frame went out: the connection stays usable */
            return s->host->error(RLX_E_TIMEOUT, "tcp: sending to %s: peer took nothing within %d ms", c->peer,
                                  timeout_ms);
        if (w <= 0) {
            if (w == 0)
                snprintf(why, sizeof why, "timed out after %d ms", timeout_ms);
            else
                snprintf(why, sizeof why, "poll failed: %s", strerror(-w));
            return tcp_send_fail(s, c, w == 0 ? RLX_E_TIMEOUT : RLX_E_PEER, why, sent > 0, sent, total);
        }
    }
    return RLX_OK;
}

// ---- recv ----

/* Records a failure that leaves the incoming stream out of step, and reports it. */
static int tcp_recv_broken(tcp *s, tcp_conn *c, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->recv_why, sizeof c->recv_why, fmt, ap);
    va_end(ap);
    c->recv_rc = rc;
    return s->host->error(rc, "tcp: %s", c->recv_why);
}

/* A TLS endpoint answers a plaintext frame with an alert record (type 21, version 3.x) and hangs
 * up: whether the torn header c holds is one. */
static bool tcp_got_tls_alert(const tcp_conn *c) {
    return !c->ssl && c->hdr_got >= 2 && c->hdr_got < TCP_HEADER_SIZE && c->hdr[0] == 0x15 && c->hdr[1] == 0x03;
}

static int tcp_tls_alert_error(tcp *s, tcp_conn *c) {
    return tcp_recv_broken(s, c, RLX_E_AUTH,
                           "peer %s speaks TLS (it answered with a TLS alert and hung up) but this endpoint has no TLS "
                           "configured (options tls_ca, tls_cert, tls_key)",
                           c->peer);
}

static int tcp_recv_eof(tcp *s, tcp_conn *c) {
    if (tcp_got_tls_alert(c))
        return tcp_tls_alert_error(s, c);
    if (c->hdr_got == 0)
        return s->host->error(RLX_E_PEER, "tcp: peer %s closed the connection", c->peer);
    if (c->hdr_got < TCP_HEADER_SIZE)
        return s->host->error(RLX_E_PEER, "tcp: peer %s closed the connection mid-frame (%zu of %d header bytes)",
                              c->peer, c->hdr_got, TCP_HEADER_SIZE);
    return s->host->error(RLX_E_PEER, "tcp: peer %s closed the connection mid-frame (%llu of %llu payload bytes)",
                          c->peer, (unsigned long long)c->got, (unsigned long long)c->want);
}

/* Receives at least one byte into dst (up to cap) before deadline. */
static int tcp_read_some(tcp *s, tcp_conn *c, void *dst, size_t cap, int64_t deadline, int timeout_ms, size_t *n_out) {
    for (;;) {
        short events = POLLIN;
        if (c->ssl) {
            /* SSL_read first, poll only when it wants more: what OpenSSL already holds (decrypted
             * or read ahead) never waits on a socket that has nothing more to give. */
            ERR_clear_error();
            const int ok = SSL_read_ex(c->ssl, dst, cap, n_out), err = errno;
            if (ok)
                return RLX_OK;
            const int e = SSL_get_error(c->ssl, ok);
            if (e == SSL_ERROR_ZERO_RETURN) {
                ERR_clear_error();
                return tcp_recv_eof(s, c);
            }
            if (e == SSL_ERROR_SYSCALL && err) {
                ERR_clear_error();
                return s->host->error(RLX_E_PEER, "tcp: receiving from %s failed%s: %s", c->peer,
                                      c->hdr_got ? " mid-frame" : "", strerror(err));
            }
            if (e == SSL_ERROR_WANT_WRITE)
                events = POLLOUT;
            else if (e != SSL_ERROR_WANT_READ)
                return tcp_tls_broken(s, c, RLX_E_AUTH, "TLS", e, err);
        } else {
            const ssize_t n = recv(c->fd, dst, cap, 0);
            if (n > 0) {
                *n_out = (size_t)n;
                return RLX_OK;
            }
            if (n == 0)
                return tcp_recv_eof(s, c);
            const int err = errno;
            if (err == EINTR)
                continue;
            if (err == ECONNRESET && tcp_got_tls_alert(c)) /* it hung up with our frame unread */
                return tcp_tls_alert_error(s, c);
            if (err != EAGAIN && err != EWOULDBLOCK)
                return s->host->error(RLX_E_PEER, "tcp: receiving from %s failed%s: %s", c->peer,
                                      c->hdr_got ? " mid-frame" : "", strerror(err));
        }
        const int w = tcp_wait(c->fd, events, deadline);
        if (w < 0)
            return s->host->error(RLX_E_PEER, "tcp: receiving from %s: poll failed: %s", c->peer, strerror(-w));
        if (w == 0 && c->hdr_got == 0)
            return s->host->error(RLX_E_TIMEOUT, "tcp: no message from %s within %d ms", c->peer, timeout_ms);
        if (w == 0)
            return s->host->error(RLX_E_TIMEOUT,
                                  "tcp: message from %s still incomplete after %d ms (%llu of %llu payload bytes); "
                                  "the next recv resumes it",
                                  c->peer, timeout_ms, (unsigned long long)c->got, (unsigned long long)c->want);
    }
}

static int tcp_fill(tcp *s, tcp_conn *c, int64_t deadline, int timeout_ms) {
    size_t n;
    const int rc = tcp_read_some(s, c, c->rbuf, TCP_RBUF_SIZE, deadline, timeout_ms, &n);
    if (rc < 0)
        return rc;
    c->rpos = 0;
    c->rlen = n;
    return RLX_OK;
}

/* What a peer that does not speak this framing might be, from its first bytes. The likeliest
 * one is the other rlx transport: an HTTP/2 client opens with "PRI * HTTP/2.0", a server with a
 * SETTINGS frame (a 24-bit length, small, so byte 0 is 0; then type 4). */
static const char *tcp_guess_peer(const uint8_t *h) {
    if (!memcmp(h, "PRI ", 4))
        return "an HTTP/2 client: perhaps a driver using --transport grpc";
    if (h[0] == 0 && h[3] == 4)
        return "an HTTP/2 server: perhaps a stage started with --transport grpc";
    return "not an rlx tcp peer?";
}

/* Checks a complete header and allocates the payload buffer's first chunk. */
static int tcp_start_payload(tcp *s, tcp_conn *c) {
    const uint8_t *h = c->hdr;
    if (!c->ssl && h[0] == 0x16 && h[1] == 0x03) /* a TLS handshake record: a ClientHello */
        return tcp_recv_broken(s, c, RLX_E_AUTH,
                               "peer %s speaks TLS but this endpoint has no TLS configured (options tls_ca, tls_cert, "
                               "tls_key)",
                               c->peer);
    if (h[0] != TCP_MAGIC0 || h[1] != TCP_MAGIC1 || h[2] != TCP_MAGIC2 || h[3] != TCP_MAGIC3)
        return tcp_recv_broken(s, c, RLX_E_FORMAT, "bad frame from %s: magic %02x %02x %02x %02x is not \"RLXT\" (%s)",
                               c->peer, h[0], h[1], h[2], h[3], tcp_guess_peer(h));
    const uint16_t version = tcp_get16(h + 4), flags = tcp_get16(h + 6);
    if (version != TCP_VERSION)
        return tcp_recv_broken(s, c, RLX_E_FORMAT, "bad frame from %s: protocol version %u, this rlx speaks %d",
                               c->peer, version, TCP_VERSION);
    const uint32_t hcrc = tcp_crc32c(s, h, 20);
    if (hcrc != tcp_get32(h + 20))
        return tcp_recv_broken(s, c, RLX_E_FORMAT, "bad frame from %s: header checksum %08x, computed %08x", c->peer,
                               tcp_get32(h + 20), hcrc);
    if (flags & ~TCP_KNOWN_FLAGS)
        return tcp_recv_broken(s, c, RLX_E_FORMAT, "bad frame from %s: unknown flags 0x%04x", c->peer, flags);
    const uint64_t len = tcp_get64(h + 8);
    if (len > c->max_message || len > SIZE_MAX - TCP_ALIGN)
        return tcp_recv_broken(
            s, c, RLX_E_FORMAT, "bad frame from %s: a message of %llu bytes exceeds the limit of %llu (%s)", c->peer,
            (unsigned long long)len, (unsigned long long)c->max_message,
            c->max_message < s->max_message ? "this connection's, from set_max_message" : "option max_message");
    c->cap = len < TCP_READ_CHUNK ? len : TCP_READ_CHUNK;
    c->payload = s->host->alloc(c->cap ? (size_t)c->cap : 1, TCP_ALIGN);
    if (!c->payload)
        return tcp_recv_broken(s, c, RLX_E_NOMEM, "cannot allocate %llu bytes for a message from %s",
                               (unsigned long long)len, c->peer);
    c->want = len;
    c->got = 0;
    c->check_crc = !(flags & TCP_FLAG_NO_CRC);
    c->crc_want = tcp_get32(h + 16);
    c->crc = ~0u;
    return RLX_OK;
}

/* Grows a full payload buffer TCP_GROWTH times, up to the declared length: memory stays within
 * that factor of the bytes that came, whatever the header claims, and the copies on the way add
 * up to a seventh of the message. (Doubling copied the whole message again and faulted in twice
 * its pages: 8 MiB messages ran 10-20% slower than with one allocation.) */
static int tcp_grow_payload(tcp *s, tcp_conn *c) {
    const uint64_t cap = c->cap * TCP_GROWTH < c->want ? c->cap * TCP_GROWTH : c->want;
    uint8_t *p = s->host->alloc((size_t)cap, TCP_ALIGN);
    if (!p)
        return tcp_recv_broken(s, c, RLX_E_NOMEM, "cannot allocate %llu bytes for a message of %llu from %s",
                               (unsigned long long)cap, (unsigned long long)c->want, c->peer);
    memcpy(p, c->payload, (size_t)c->got);
    s->host->free(c->payload);
    c->payload = p;
    c->cap = cap;
    return RLX_OK;
}

static int tcp_recv(void *self, void *conn, void **data, size_t *len, int timeout_ms) {
    tcp *s = self;
    tcp_conn *c = conn;
    if (!s || !c || !data || !len)
        return s ? s->host->error(RLX_E_INVALID, "tcp: recv: NULL argument") : RLX_E_INVALID;
    *data = NULL;
    *len = 0;
    if (c->recv_rc)
        return s->host->error(c->recv_rc, "tcp: connection with %s is unusable after an earlier error: %s", c->peer,
                              c->recv_why);
    const int64_t deadline = tcp_deadline(timeout_ms);
    int rc;
    if (c->ssl && !c->tls_done && (rc = tcp_tls_accept(s, c, deadline, timeout_ms, "receiving from")) < 0)
        return rc;
    while (c->hdr_got < TCP_HEADER_SIZE) {
        if (c->rpos == c->rlen && (rc = tcp_fill(s, c, deadline, timeout_ms)) < 0)
            return rc;
        size_t k = TCP_HEADER_SIZE - c->hdr_got;
        if (k > c->rlen - c->rpos)
            k = c->rlen - c->rpos;
        memcpy(c->hdr + c->hdr_got, c->rbuf + c->rpos, k);
        c->hdr_got += k;
        c->rpos += k;
    }
    if (!c->payload && (rc = tcp_start_payload(s, c)) < 0)
        return rc;
    while (c->got < c->want) {
        if (c->got == c->cap && (rc = tcp_grow_payload(s, c)) < 0)
            return rc;
        /* room is what fits before the buffer must grow; reads straight into it stop there and
         * so never take bytes past this frame, which only the read-ahead buffer may hold. */
        const uint64_t room = c->cap - c->got;
        uint8_t *dst = c->payload + c->got;
        size_t k;
        if (c->rpos < c->rlen) {
            k = c->rlen - c->rpos < room ? c->rlen - c->rpos : (size_t)room;
            memcpy(dst, c->rbuf + c->rpos, k);
            c->rpos += k;
        } else if (c->want - c->got >= TCP_RBUF_SIZE) {
            if ((rc = tcp_read_some(s, c, dst, room < TCP_READ_CHUNK ? (size_t)room : TCP_READ_CHUNK, deadline,
                                    timeout_ms, &k)) < 0)
                return rc;
        } else {
            if ((rc = tcp_fill(s, c, deadline, timeout_ms)) < 0)
                return rc;
            continue;
        }
        if (c->check_crc)
            c->crc = s->crc(c->crc, dst, k);
        c->got += k;
    }
    if (c->check_crc && ~c->crc != c->crc_want)
        return tcp_recv_broken(s, c, RLX_E_FORMAT,
                               "bad frame from %s: payload checksum %08x, header says %08x (%llu bytes)", c->peer,
                               ~c->crc, c->crc_want, (unsigned long long)c->want);
    *data = c->payload;
    *len = (size_t)c->want;
    c->payload = NULL;
    c->hdr_got = 0;
    c->want = c->got = c->cap = 0;
    return RLX_OK;
}

/* Takes effect from the next frame's header; the instance's max_message stays the ceiling. */
static int tcp_set_max_message(void *self, void *conn, uint64_t max_message) {
    tcp *s = self;
    tcp_conn *c = conn;
    if (!s || !c)
        return s ? s->host->error(RLX_E_INVALID, "tcp: set_max_message: NULL argument") : RLX_E_INVALID;
    c->max_message = max_message < s->max_message ? max_message : s->max_message;
    return RLX_OK;
}

static int tcp_peer_address(void *self, void *conn, char *buf, size_t size) {
    tcp *s = self;
    tcp_conn *c = conn;
    if (!s || !c || !buf || !size)
        return s ? s->host->error(RLX_E_INVALID, "tcp: peer_address: NULL argument") : RLX_E_INVALID;
    if ((size_t)snprintf(buf, size, "%s", c->peer) >= size)
        return s->host->error(RLX_E_RANGE, "tcp: peer address %s does not fit in %zu bytes", c->peer, size);
    return RLX_OK;
}

// ---- plugin ----

static const rlx_transport_iface tcp_iface = {
    .size = sizeof(rlx_transport_iface),
    .open = tcp_open,
    .close = tcp_close,
    .listen = tcp_listen,
    .accept = tcp_accept,
    .bound_address = tcp_bound_address,
    .listener_close = tcp_listener_close,
    .connect = tcp_connect,
    .send = tcp_send,
    .recv = tcp_recv,
    .conn_close = tcp_conn_close,
    .set_max_message = tcp_set_max_message,
    .peer_address = tcp_peer_address,
};

static const rlx_plugin tcp_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_TRANSPORT,
    .name = "tcp",
    .version = "0.1.0",
    .summary = "TCP transport: CRC32C-checked frames over non-blocking sockets, optional mutual TLS 1.3",
    .iface = &tcp_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    if (!host || host->abi_major != RLX_ABI_MAJOR) {
        if (host && host->error)
            host->error(RLX_E_ABI, "tcp: built for ABI %d, host has %u", RLX_ABI_MAJOR, host->abi_major);
        return NULL;
    }
    return &tcp_plugin;
}
