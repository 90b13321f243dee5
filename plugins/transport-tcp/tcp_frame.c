/* transport-tcp's frames: one per message, a 24-byte little-endian header and the payload.
 *   0  magic "RLXT"           4 bytes
 *   4  protocol version       u16 (TCP_VERSION)
 *   6  flags                  u16 (TCP_FLAG_NO_CRC: the sender skipped the payload checksum)
 *   8  payload length         u64 (the receiver refuses more than its limit, from the header)
 *  16  CRC32C of the payload  u32 (0 with TCP_FLAG_NO_CRC)
 *  20  CRC32C of bytes 0..19  u32
 * Sockets are non-blocking and every wait is a poll() bounded by the caller's deadline, so no
 * call outlives its timeout_ms. A receive that times out mid-frame keeps its progress and the
 * next recv resumes it; a send that times out mid-frame shuts the socket down for writing (the
 * peer then sees the frame cut short) and the connection refuses further sends. Sends use
 * MSG_NOSIGNAL, so a vanished peer is RLX_E_PEER, never SIGPIPE. Under TLS the same bytes go
 * through SSL_write/SSL_read; a send that times out after TLS took some of the frame leaves the
 * connection unable to send, as mid-frame in plaintext: a TLS record may be half out.
 *
 * A receive grows its payload buffer as the bytes arrive (TCP_READ_CHUNK first, then TCP_GROWTH
 * times over whenever it is full, never past the length the header declares): a header
 * announcing 4 GiB followed by silence holds one chunk, and the copies on growth add up to a
 * seventh of the message. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "tcp_internal.h"

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

int tcp_send(void *self, void *conn, const void *data, size_t len, int timeout_ms) {
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
int tcp_recv_broken(tcp *s, tcp_conn *c, int rc, const char *fmt, ...) {
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
    /* The flag is under the header's checksum, so only a peer configured otherwise sends it here. */
    if ((flags & TCP_FLAG_NO_CRC) && s->checksum)
        return tcp_recv_broken(s, c, RLX_E_FORMAT,
                               "frame from %s has no payload checksum, which this endpoint requires (%s): give both "
                               "ends the same option checksum=on|off",
                               c->peer, s->checksum_given ? "option checksum=on" : "the default without TLS");
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

int tcp_recv(void *self, void *conn, void **data, size_t *len, int timeout_ms) {
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
