/* transport-grpc: rlx messages over gRPC (the C core API of grpc 1.51, no C++). A connection is
 * one long-lived bidirectional streaming call "/rlx.Pipeline/Link" on its own channel (so its
 * own TCP connection); each transport message is one gRPC message whose bytes are the opaque
 * payload. This file holds the plugin entry, its options and TLS credentials, the routing of
 * gRPC's log, and send, recv and close; grpc_conn.c drives the completion queues and the
 * progress thread, grpc_server.c the listeners, grpc_client.c connect, and grpc_diagnose.c finds
 * out why a connect failed. docs/transport-grpc.md explains the design: the ops in flight and
 * their invariants, graceful close, the progress thread, TLS, and the receive limits.
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
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "grpc_internal.h"
#include "plugin_entry.h"

static const char *const grpct_tls_keys[GRPCT_TLS_N] = {"tls_ca", "tls_cert", "tls_key"};

// ---- logging: gRPC's own log lines go to the host, never to stderr ----

static const rlx_host *_Atomic grpct_log_host;
static pthread_mutex_t grpct_global_mu = PTHREAD_MUTEX_INITIALIZER;
static int grpct_n_instances; /* under grpct_global_mu */
/* The latest gRPC error logged on this thread: the only place some failures explain themselves. */
_Thread_local char grpct_last_log[1024];

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
void grpct_log_cause(const char *log, char *out, size_t size) {
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
size_t grpct_common_args(const grpct *t, grpc_arg *a, bool server) {
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

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return plugin_entry(host, &grpct_plugin); }
