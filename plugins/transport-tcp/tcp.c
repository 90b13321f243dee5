/* transport-tcp: rlx messages over plain TCP sockets, one frame per message.
 *
 * A frame is a 24-byte little-endian header followed by the payload:
 *   0  magic "RLXT"           4 bytes
 *   4  protocol version       u16 (TCP_VERSION)
 *   6  flags                  u16 (TCP_FLAG_NO_CRC: the sender skipped the payload checksum)
 *   8  payload length         u64 (the receiver refuses more than its max_message)
 *  16  CRC32C of the payload  u32 (0 with TCP_FLAG_NO_CRC)
 *  20  CRC32C of bytes 0..19  u32
 * Sockets are non-blocking and every wait is a poll() bounded by the caller's deadline, so
 * no call outlives its timeout_ms. A receive that times out mid-frame keeps its progress and
 * the next recv resumes it; a send that times out mid-frame shuts the socket down for writing
 * (the peer then sees the frame cut short) and the connection refuses further sends. Sends
 * use MSG_NOSIGNAL, so a vanished peer is RLX_E_PEER, never SIGPIPE.
 *
 * Options ("key=value" pairs separated by commas, all optional):
 *   max_message=N[K|M|G]   largest payload accepted by recv (default 4G = 4 GiB)
 *   checksum=on|off        compute the payload CRC32C on send (default on; frames without it
 *                          are accepted either way, the header is always checked) */
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
#define TCP_ADDR_MAX 320
#define TCP_ALIGN 64
#define TCP_DEFAULT_MAX_MESSAGE (4ull << 30)
/* Connect retries: first pause, and the cap the doubling stops at. */
#define TCP_BACKOFF_FIRST_MS 10
#define TCP_BACKOFF_MAX_MS 500
/* Worded as the grpc transport words it: a stage's commonest start-up failure reads the same. */
#define TCP_IN_USE "the port is in use (another process listens there, perhaps another rlx stage)"

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
    /* A failed direction stays failed: the stream is out of step from then on. */
    int send_rc, recv_rc;
    char send_why[192], recv_why[256];
    /* The frame being received; kept across a timeout so the next recv resumes it. */
    uint8_t hdr[TCP_HEADER_SIZE];
    size_t hdr_got;
    uint8_t *payload; /* host->alloc'd once the header is checked; NULL before */
    uint64_t want, got;
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

// ---- options, open, close ----

static int tcp_parse_options(tcp *s, const char *options) {
    const char *cursor = options;
    rlx_iface_option o;
    char err[256];
    unsigned long long size;
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&o, "max_message")) {
            if (!rlx_iface_option_size(&o, 1, 1ull << 40, &size))
                return s->host->error(RLX_E_INVALID, "tcp: option '%.*s': want a size from 1 to 1T", o.item_len,
                                      o.item);
            s->max_message = size;
        } else if (rlx_iface_option_is(&o, "checksum") && (!strcmp(o.value, "on") || !strcmp(o.value, "off"))) {
            s->checksum = !strcmp(o.value, "on");
        } else {
            return s->host->error(RLX_E_INVALID, "tcp: unknown option '%.*s' (known: max_message=N, checksum=on|off)",
                                  o.item_len, o.item);
        }
    }
    return rc < 0 ? s->host->error(rc, "tcp: %s", err) : RLX_OK;
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
            return tcp_conn_create(s, fd, peer, (tcp_conn **)conn);
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
    close(c->fd);
    s->host->free(c->payload);
    s->host->free(c->rbuf);
    s->host->free(c);
}

// ---- send ----

/* Records why sending stopped working (the outgoing stream is out of step after a partial
 * frame) and reports it. */
static int tcp_send_fail(tcp *s, tcp_conn *c, int rc, const char *why, uint64_t sent, uint64_t total) {
    snprintf(c->send_why, sizeof c->send_why, "%s", why);
    c->send_rc = rc;
    if (sent > 0 && sent < total) {
        /* The peer must not wait for the rest of a frame that will never come. */
        shutdown(c->fd, SHUT_WR);
        return s->host->error(rc,
                              "tcp: sending to %s: %s with %llu of %llu bytes of the frame sent (the connection "
                              "sends no more)",
                              c->peer, why, (unsigned long long)sent, (unsigned long long)total);
    }
    return s->host->error(rc, "tcp: sending to %s: %s", c->peer, why);
}

static int tcp_send(void *self, void *conn, const void *data, size_t len, int timeout_ms) {
    tcp *s = self;
    tcp_conn *c = conn;
    if (!s || !c || (len && !data))
        return s ? s->host->error(RLX_E_INVALID, "tcp: send: NULL argument") : RLX_E_INVALID;
    if (c->send_rc)
        return s->host->error(RLX_E_PEER, "tcp: connection to %s cannot send any more: an earlier send failed (%s)",
                              c->peer, c->send_why);
    const int64_t deadline = tcp_deadline(timeout_ms);
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
            return tcp_send_fail(s, c, RLX_E_PEER, why, sent, total);
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
            return tcp_send_fail(s, c, w == 0 ? RLX_E_TIMEOUT : RLX_E_PEER, why, sent, total);
        }
    }
    return RLX_OK;
}

// ---- recv ----

static int tcp_recv_broken(tcp *s, tcp_conn *c, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Records a failure that leaves the incoming stream out of step, and reports it. */
static int tcp_recv_broken(tcp *s, tcp_conn *c, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->recv_why, sizeof c->recv_why, fmt, ap);
    va_end(ap);
    c->recv_rc = rc;
    return s->host->error(rc, "tcp: %s", c->recv_why);
}

static int tcp_recv_eof(tcp *s, tcp_conn *c) {
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
        if (err != EAGAIN && err != EWOULDBLOCK)
            return s->host->error(RLX_E_PEER, "tcp: receiving from %s failed%s: %s", c->peer,
                                  c->hdr_got ? " mid-frame" : "", strerror(err));
        const int w = tcp_wait(c->fd, POLLIN, deadline);
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

/* Checks a complete header and allocates the payload buffer. */
static int tcp_start_payload(tcp *s, tcp_conn *c) {
    const uint8_t *h = c->hdr;
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
    if (len > s->max_message || len > SIZE_MAX - TCP_ALIGN)
        return tcp_recv_broken(
            s, c, RLX_E_FORMAT,
            "bad frame from %s: a message of %llu bytes exceeds the limit of %llu (option max_message)", c->peer,
            (unsigned long long)len, (unsigned long long)s->max_message);
    c->payload = s->host->alloc(len ? (size_t)len : 1, TCP_ALIGN);
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
        const uint64_t need = c->want - c->got;
        uint8_t *dst = c->payload + c->got;
        size_t k;
        if (c->rpos < c->rlen) {
            k = c->rlen - c->rpos < need ? c->rlen - c->rpos : (size_t)need;
            memcpy(dst, c->rbuf + c->rpos, k);
            c->rpos += k;
        } else if (need >= TCP_RBUF_SIZE) {
            if ((rc = tcp_read_some(s, c, dst, need < TCP_READ_CHUNK ? (size_t)need : TCP_READ_CHUNK, deadline,
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
    c->want = c->got = 0;
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
};

static const rlx_plugin tcp_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_TRANSPORT,
    .name = "tcp",
    .version = "0.1.0",
    .summary = "TCP transport: CRC32C-checked frames over non-blocking sockets, IPv4/IPv6/host names",
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
