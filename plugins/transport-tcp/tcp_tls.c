/* transport-tcp's TLS: the contexts made from the tls_* options, the socket BIO the record layer
 * runs over, the handshake, and the words for why one failed.
 *
 * With tls_ca, tls_cert and tls_key every connection is TLS 1.3 with certificates checked both
 * ways (see rlx/transport_iface.h); the frames inside are the same bytes. The record layer goes
 * through a BIO of our own that sends with MSG_NOSIGNAL and remembers the peer's first bytes, so
 * a failed handshake can say what the peer spoke instead. accept never handshakes: an accepted
 * connection runs SSL_accept inside its first recv or send, within that call's timeout and
 * resumed by the next call if it runs out. Handshake failures are RLX_E_AUTH, and so is a TLS
 * ClientHello arriving at a listener without TLS (the two ends are configured differently, which
 * no retry mends). In TLS 1.3 the client finishes before the server has checked its certificate,
 * so a client whose certificate the stage refuses learns it from its first recv (the stage's
 * alert), not from connect. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "tcp_internal.h"

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
     * already tell a cut message from a whole one. */
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

void tcp_tls_free(tcp *s) {
    SSL_CTX_free(s->tls_server);
    SSL_CTX_free(s->tls_client);
    BIO_meth_free(s->tls_bio);
    s->tls_server = s->tls_client = NULL;
    s->tls_bio = NULL;
}

int tcp_tls_setup(tcp *s, const char *ca, const char *cert, const char *key) {
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
bool tcp_is_frame_start(const uint8_t *b, size_t n) {
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

/* Records a TLS failure: both directions of c are unusable from then on. */
int tcp_tls_broken(tcp *s, tcp_conn *c, int rc, const char *what, int ssl_error, int err) {
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
int tcp_tls_start(tcp *s, tcp_conn *c, bool server, const char *host) {
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
int tcp_tls_handshake(tcp *s, tcp_conn *c, int64_t deadline) {
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
int tcp_tls_accept(tcp *s, tcp_conn *c, int64_t deadline, int timeout_ms, const char *doing) {
    const int rc = tcp_tls_handshake(s, c, deadline);
    if (rc != RLX_E_TIMEOUT)
        return rc;
    return s->host->error(RLX_E_TIMEOUT,
                          "tcp: %s %s: the TLS handshake did not finish within %d ms (%s; the next recv or send "
                          "resumes it)",
                          doing, c->peer, timeout_ms,
                          c->n_first ? "the peer sent part of it" : "the peer sent nothing");
}
