/* transport-tcp: rlx messages over TCP sockets, one frame per message (tcp_frame.c), optionally
 * inside TLS 1.3 (tcp_tls.c). This file holds the plugin entry, its options, and the sockets:
 * listening, accepting, connecting with retries, and the lists close() releases.
 *
 * Options ("key=value" pairs separated by commas, all optional):
 *   max_message=N[K|M|G]   largest payload accepted by recv (default 4G = 4 GiB); set_max_message
 *                          lowers it per connection
 *   checksum=on|off        on: every frame sent carries a CRC32C of its payload, and a frame
 *                          received without one is refused (the two ends' options differ);
 *                          off: frames go without, and a received frame's checksum is still
 *                          checked when it has one. Default: on without TLS, off with TLS (whose
 *                          records already carry a MAC). The header's own CRC32C is always
 *                          checked, so no flipped bit turns a checked frame into an unchecked one.
 *   tls_ca=FILE, tls_cert=FILE, tls_key=FILE   PEM files: TLS with mutual authentication
 *   tls_name=NAME          connect: the name the server's certificate must carry (default: the
 *                          host of the address; an IP address is matched as one) */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "plugin_entry.h"
#include "tcp_internal.h"

// ---- small helpers ----

int tcp_wait(int fd, short events, int64_t deadline) {
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
    int checksum = -1; /* not given */
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&o, "max_message")) {
            if (!rlx_iface_option_size(&o, 1, 1ull << 40, &size))
                return s->host->error(RLX_E_INVALID, "tcp: option '%.*s': want a size from 1 to 1T", o.item_len,
                                      o.item);
            s->max_message = size;
        } else if (rlx_iface_option_is(&o, "checksum")) {
            if (strcmp(o.value, "on") && strcmp(o.value, "off"))
                return s->host->error(RLX_E_INVALID, "tcp: option checksum: want on or off, not '%s'", o.value);
            checksum = !strcmp(o.value, "on");
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
    /* TLS records carry a MAC that already refuses a changed byte, so by default a frame's own
     * CRC32C, a pass over every payload byte on both ends, is left to plaintext. */
    s->checksum = checksum < 0 ? !ca : checksum;
    s->checksum_given = checksum >= 0;
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
    s->crc = tcp_crc_pick();
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

int tcp_conn_create(tcp *s, int fd, const char *peer, tcp_conn **out) {
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

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return plugin_entry(host, &tcp_plugin); }
