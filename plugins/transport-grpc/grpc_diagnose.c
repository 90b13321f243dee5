/* Why a gRPC connect failed, where gRPC says little ("Socket closed"): a fail-fast probe call
 * for gRPC's own reason, a plain TCP connection to tell a peer that never answered HTTP/2 from
 * none at all, and, when the connection was not refused, a TLS handshake of our own with
 * OpenSSL that tells whether the stage speaks TLS, why its certificate fails, and whether it
 * takes this process's certificate. */
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

#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "grpc_internal.h"

/* A call that fails fast on a channel in TRANSIENT_FAILURE: its status says why. */
void grpct_probe(grpct_conn *c, gpr_timespec deadline, char *why, size_t size) {
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
bool grpct_tcp_accepts(const char *host, unsigned port) {
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
const char *grpct_tls_cause(grpct *t, const char *why, const char *host, unsigned port, char *out, size_t size) {
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
