/* The tcp transport's TLS (mutual authentication, the failures a person reads), its per-connection
 * message limit and its receive buffers that grow as bytes arrive. The certificates come from
 * make_certs.sh, run by the tls_tcp_certs fixture into TLS_CERT_DIR. Servers run on helper
 * threads that record what happened; cmocka assertions are made on the main thread only. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "testutil.h"

#include "rlx/transport.h"

#define PLUGIN_PATH RLX_BUILD_PLUGIN_DIR "/rlx-transport-tcp.so"
#include "transport/transport_test.h"

/* RLX_TEST_VERBOSE=1 prints the messages the cases provoke, to read them. */
static void show(const char *what, const char *message) {
    if (getenv("RLX_TEST_VERBOSE"))
        printf("  [tls] %s: %s\n", what, message);
}

/* Options for TLS as the certificate NAME (stage, driver, other, expired, wrongname), plus extra. */
static const char *tls_options(const char *name, const char *extra) {
    static char buf[4][1024];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "tls_ca=%s/ca.pem,tls_cert=%s/%s.pem,tls_key=%s/%s.key%s", TLS_CERT_DIR, TLS_CERT_DIR,
             name, TLS_CERT_DIR, name, extra ? extra : "");
    return b;
}

// ---- a server on its own thread ----

/* Accepts one connection and echoes it (saying hello first with send_first, so that its TLS
 * handshake runs inside a send); records how accept went. */
typedef struct server {
    tr *t;
    void *l;
    int accept_rc;
    double accept_ms; /* how long accept took */
    echo e;
} server;

static void *server_main(void *arg) {
    server *sv = arg;
    const double t0 = now_ms();
    sv->accept_rc = sv->t->it->accept(sv->t->self, sv->l, LONG_MS, &sv->e.conn);
    sv->accept_ms = now_ms() - t0;
    if (sv->accept_rc < 0) {
        snprintf(sv->e.error, sizeof sv->e.error, "%s", rlx_last_error());
        return NULL;
    }
    return echo_main(&sv->e);
}

static void server_start(server *sv, tr *t, void *l, bool send_first) {
    memset(sv, 0, sizeof *sv);
    sv->t = t;
    sv->l = l;
    sv->e.t = t;
    sv->e.hello = send_first ? "hello" : NULL;
    assert_int_equal(pthread_create(&sv->e.tid, NULL, server_main, sv), 0);
}

/* Joins the server, which must have ended with rc and a message mentioning text. */
static void server_join(server *sv, int rc, const char *text) {
    const echo *e = &sv->e;
    pthread_join(e->tid, NULL);
    show("server", e->error);
    assert_ok(sv->accept_rc);
    if (e->rc != rc)
        fail_msg("server ended with %d, want %d: %s", e->rc, rc, e->error);
    if (!strstr(e->error, text))
        fail_msg("server's error does not mention '%s': %s", text, e->error);
}

/* A stage listening on 127.0.0.1 with a server on its listener, and a driver to connect to it. */
typedef struct session {
    tr stage, driver;
    void *l;
    char addr[128];
    server sv;
} session;

/* Listens with the stage (loaded) and starts the server (saying hello first with send_first). */
static void session_listen(session *s, bool send_first) {
    assert_ok(listen_local(&s->stage, &s->l, s->addr, sizeof s->addr));
    server_start(&s->sv, &s->stage, s->l, send_first);
}

static void session_open(session *s, const char *stage_options, const char *driver_options, bool send_first) {
    load_ok(&s->stage, stage_options);
    load_ok(&s->driver, driver_options);
    session_listen(s, send_first);
}

/* A connection from the driver that must succeed. */
static void *session_connect(session *s) {
    void *cli;
    assert_ok(s->driver.it->connect(s->driver.self, s->addr, LONG_MS, &cli));
    return cli;
}

/* Once the server is joined: closes the listener and both instances (a driver never loaded is
 * all zero). */
static void session_close(session *s) {
    s->stage.it->listener_close(s->stage.self, s->l);
    unload(&s->driver);
    unload(&s->stage);
}

// ---- mutual TLS that works ----

static void test_mutual_tls_roundtrips(void **state) {
    (void)state;
    session s;
    session_open(&s, tls_options("stage", NULL), tls_options("driver", NULL), false);
    void *cli = session_connect(&s);
    static const size_t sizes[] = {0, 1, 24, 1000, 16360, 16361, 65536, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        roundtrip(&s.driver, cli, sizes[i], i);
    roundtrip(&s.driver, cli, 64u << 20, 42); /* 64 MiB each way, checked byte for byte */
    roundtrip(&s.driver, cli, 5, 43);         /* the stream is still in step */
    s.driver.it->conn_close(s.driver.self, cli);
    server_join(&s.sv, RLX_E_PEER, "closed the connection");
    assert_int_equal(s.sv.e.n, sizeof sizes / sizeof sizes[0] + 2);
    session_close(&s);
}

/* The stage speaks first: its handshake runs inside that send. */
/* Under TLS frames go without a payload checksum by default (TLS refuses a changed byte itself):
 * good data passes, and an end that asks for checksums (checksum=on) gets those it sends checked
 * and refuses the frames that come without, naming the option to align. */
static void test_tls_frames_without_checksum(void **state) {
    (void)state;
    session s;
    session_open(&s, tls_options("stage", NULL), tls_options("driver", ",checksum=on"), false);
    void *cli = session_connect(&s);
    uint8_t *msg = malloc(300001);
    assert_non_null(msg);
    /* small enough that the echo goes out whole before the driver hangs up on its header */
    fill(msg, 1000, 7);
    assert_ok(s.driver.it->send(s.driver.self, cli, msg, 1000, LONG_MS));
    void *d = (void *)&d;
    size_t n;
    assert_int_equal(s.driver.it->recv(s.driver.self, cli, &d, &n, LONG_MS), RLX_E_FORMAT);
    assert_null(d);
    show("checksum=on against the TLS default", rlx_last_error());
    assert_error_mentions("has no payload checksum, which this endpoint requires (option checksum=on)");
    s.driver.it->conn_close(s.driver.self, cli);
    server_join(&s.sv, RLX_E_PEER, "closed the connection");
    assert_int_equal(s.sv.e.n, 1); /* the stage took the checked frame and echoed it */
    session_close(&s);

    /* both ends on the TLS default: good data of every size passes unchanged */
    session_open(&s, tls_options("stage", NULL), tls_options("driver", NULL), false);
    cli = session_connect(&s);
    static const size_t sizes[] = {0, 1, 16361, 300001};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fill(msg, sizes[i], i);
        assert_ok(s.driver.it->send(s.driver.self, cli, msg, sizes[i], LONG_MS));
        assert_ok(s.driver.it->recv(s.driver.self, cli, &d, &n, LONG_MS));
        assert_int_equal(n, sizes[i]);
        assert_true(n == 0 || memcmp(d, msg, n) == 0);
        free(d);
    }
    free(msg);
    s.driver.it->conn_close(s.driver.self, cli);
    server_join(&s.sv, RLX_E_PEER, "closed the connection");
    session_close(&s);
}

static void test_handshake_inside_first_send(void **state) {
    (void)state;
    session s;
    session_open(&s, tls_options("stage", NULL), tls_options("driver", NULL), true);
    void *cli = session_connect(&s);
    void *d;
    size_t n;
    assert_ok(s.driver.it->recv(s.driver.self, cli, &d, &n, LONG_MS));
    assert_int_equal(n, 5);
    assert_memory_equal(d, "hello", 5);
    free(d);
    roundtrip(&s.driver, cli, 3000, 1);
    s.driver.it->conn_close(s.driver.self, cli);
    server_join(&s.sv, RLX_E_PEER, "closed the connection");
    session_close(&s);
}

// ---- certificates that must be refused ----

/* Where the driver learns of the refusal: its connect fails, or the connect succeeds (TLS 1.3:
 * the client finishes first) and its first recv fails. */
typedef enum { AT_CONNECT, AT_FIRST_RECV } refused_at;

/* A stage with certificate stage_cert and a driver with driver_cert (extra options for the
 * driver): the driver's connect or first recv (at) must end with RLX_E_AUTH and a message with
 * driver_text, and the stage's first recv with RLX_E_AUTH and server_text. */
static void expect_refusal(const char *stage_cert, const char *driver_cert, const char *driver_extra, refused_at at,
                           const char *driver_text, const char *server_text) {
    session s;
    session_open(&s, tls_options(stage_cert, NULL), tls_options(driver_cert, driver_extra), false);
    void *cli = NULL;
    const int connect_rc = at == AT_CONNECT ? RLX_E_AUTH : RLX_OK;
    const int rc = s.driver.it->connect(s.driver.self, s.addr, LONG_MS, &cli);
    if (rc != connect_rc)
        fail_msg("connect: want %d, got %d: %s", connect_rc, rc, rlx_last_error());
    if (rc == RLX_OK) {
        void *d = (void *)&d;
        size_t n;
        const int got = s.driver.it->recv(s.driver.self, cli, &d, &n, LONG_MS);
        if (got != RLX_E_AUTH)
            fail_msg("recv: want %d, got %d: %s", RLX_E_AUTH, got, rlx_last_error());
        assert_null(d);
        show("driver recv", rlx_last_error());
        assert_error_mentions(driver_text);
        assert_error_mentions(s.addr);
        /* the connection stays unusable: no half-trusted stream carries on */
        assert_int_equal(s.driver.it->send(s.driver.self, cli, "x", 1, 1000), got);
        s.driver.it->conn_close(s.driver.self, cli);
    } else {
        assert_null(cli);
        show("driver connect", rlx_last_error());
        assert_error_mentions(driver_text);
        assert_error_mentions(s.addr);
    }
    server_join(&s.sv, RLX_E_AUTH, server_text);
    assert_int_equal(s.sv.e.n, 0);
    session_close(&s);
}

static void test_client_cert_from_wrong_ca(void **state) {
    (void)state;
    expect_refusal("stage", "other", NULL, AT_FIRST_RECV,
                   "the peer refused the connection (its alert: tlsv1 alert unknown ca)",
                   "failed: certificate verify failed: unable to get local issuer certificate");
}

static void test_server_cert_from_wrong_ca(void **state) {
    (void)state;
    expect_refusal("other", "driver", NULL, AT_CONNECT, "TLS handshake with 127.0.0.1:",
                   "the peer refused the connection (its alert: tlsv1 alert unknown ca)");
    expect_refusal("other", "driver", NULL, AT_CONNECT,
                   "failed: certificate verify failed: unable to get local issuer certificate", "alert");
}

static void test_expired_certificates(void **state) {
    (void)state;
    /* the stage's certificate expired */
    expect_refusal("expired", "driver", NULL, AT_CONNECT, "failed: certificate verify failed: certificate has expired",
                   "its alert: sslv3 alert certificate expired");
    /* the driver's */
    expect_refusal("stage", "expired", NULL, AT_FIRST_RECV, "its alert: sslv3 alert certificate expired",
                   "failed: certificate verify failed: certificate has expired");
}

static void test_server_cert_for_another_name(void **state) {
    (void)state;
    expect_refusal("wrongname", "driver", NULL, AT_CONNECT,
                   "certificate verify failed: IP address mismatch (the certificate does not name the host "
                   "connected to; option tls_name",
                   "TLS handshake with 127.0.0.1:");
    /* tls_name says which name to expect instead of the address: the same stage then passes */
    session s;
    session_open(&s, tls_options("wrongname", NULL), tls_options("driver", ",tls_name=elsewhere.invalid"), false);
    void *cli = session_connect(&s);
    roundtrip(&s.driver, cli, 100, 7);
    s.driver.it->conn_close(s.driver.self, cli);
    server_join(&s.sv, RLX_E_PEER, "closed the connection");
    session_close(&s);
    /* and a name the certificate lacks fails by name, not by IP */
    expect_refusal("stage", "driver", ",tls_name=elsewhere.invalid", AT_CONNECT,
                   "certificate verify failed: hostname mismatch", "alert");
}

// ---- raw sockets and a raw OpenSSL client ----

/* A connect on its own thread, for a peer the main thread plays by hand. */
typedef struct connector {
    tr *t;
    const char *addr;
    void *conn;
    int rc;
    char error[512];
    pthread_t tid;
} connector;

static void *connector_main(void *arg) {
    connector *cn = arg;
    cn->rc = cn->t->it->connect(cn->t->self, cn->addr, LONG_MS, &cn->conn);
    snprintf(cn->error, sizeof cn->error, "%s", rlx_last_error());
    if (cn->rc == RLX_OK)
        cn->t->it->conn_close(cn->t->self, cn->conn);
    return NULL;
}

static void connector_start(connector *cn, tr *t, const char *addr) {
    memset(cn, 0, sizeof *cn);
    cn->t = t;
    cn->addr = addr;
    assert_int_equal(pthread_create(&cn->tid, NULL, connector_main, cn), 0);
}

/* A TLS 1.3 client that trusts the test CA but has no certificate of its own. */
static void test_client_without_certificate(void **state) {
    (void)state;
    session s = {0};
    load_ok(&s.stage, tls_options("stage", NULL));
    session_listen(&s, false);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(ctx);
    assert_int_equal(SSL_CTX_load_verify_file(ctx, TLS_CERT_DIR "/ca.pem"), 1);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    const int fd = raw_connect(s.addr);
    assert_true(fd >= 0);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    /* TLS 1.3: the client finishes first, then learns from the stage's alert */
    assert_int_equal(SSL_connect(ssl), 1);
    char byte;
    assert_true(SSL_read(ssl, &byte, 1) <= 0);
    char reason[256];
    ERR_error_string_n(ERR_get_error(), reason, sizeof reason);
    ERR_clear_error();
    show("raw client", reason);
    assert_non_null(strstr(reason, "certificate required"));
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    server_join(&s.sv, RLX_E_AUTH, "failed: the peer presented no certificate");
    session_close(&s);
}

static void test_plaintext_client_to_tls_listener(void **state) {
    (void)state;
    session s; /* its driver speaks plaintext */
    session_open(&s, tls_options("stage", NULL), NULL, false);
    void *cli = session_connect(&s);
    assert_ok(s.driver.it->send(s.driver.self, cli, "hello", 5, LONG_MS));
    server_join(&s.sv, RLX_E_AUTH, "failed: the peer speaks plaintext (rlx frames without TLS)");
    void *d;
    size_t n;
    /* the listener's TLS alert tells the plaintext side what the stage speaks */
    assert_int_equal(s.driver.it->recv(s.driver.self, cli, &d, &n, LONG_MS), RLX_E_AUTH);
    assert_error_mentions("speaks TLS (it answered with a TLS alert and hung up)");
    s.driver.it->conn_close(s.driver.self, cli);
    session_close(&s);
}

static void test_tls_client_to_plaintext_listener(void **state) {
    (void)state;
    session s; /* its stage speaks plaintext */
    session_open(&s, NULL, tls_options("driver", NULL), false);
    tr *driver = &s.driver;
    void *cli = NULL;
    char raddr[64];
    /* the plaintext stage reads a ClientHello where a frame belongs, says so and hangs up */
    assert_int_equal(driver->it->connect(driver->self, s.addr, LONG_MS, &cli), RLX_E_AUTH);
    show("driver connect", rlx_last_error());
    assert_error_mentions("the stage does not speak TLS (it closed the connection without a TLS answer)");
    assert_null(cli);
    server_join(&s.sv, RLX_E_AUTH, "speaks TLS but this endpoint has no TLS configured");
    s.stage.it->listener_close(s.stage.self, s.l);

    /* a peer that accepts and never answers: connect ends at its deadline, saying why */
    const int lfd = raw_listen(raddr, sizeof raddr);
    assert_true(lfd >= 0);
    const double t0 = now_ms();
    assert_int_equal(driver->it->connect(driver->self, raddr, 300, &cli), RLX_E_TIMEOUT);
    assert_true(now_ms() - t0 < 3000);
    show("driver connect to a silent peer", rlx_last_error());
    assert_error_mentions("the TLS handshake did not finish (the peer accepted the connection but never answered");
    int fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    close(fd);

    /* a plaintext peer that answers with an rlx frame (an Error, say) is named as such */
    connector cn;
    connector_start(&cn, driver, raddr);
    fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    static const uint8_t frame[24] = {'R', 'L', 'X', 'T', 1, 0, 0, 0, 5};
    assert_int_equal(send(fd, frame, sizeof frame, MSG_NOSIGNAL), (ssize_t)sizeof frame);
    pthread_join(cn.tid, NULL);
    show("driver connect to a plaintext frame", cn.error);
    assert_int_equal(cn.rc, RLX_E_AUTH);
    assert_null(cn.conn);
    assert_non_null_msg(strstr(cn.error, "the stage does not speak TLS (it answered with the bytes 52 4c 58 54 01 00 "
                                         "00 00, \"RLXT\": rlx frames without TLS)"),
                        cn.error);
    close(fd);
    close(lfd);
    unload(&s.driver);
    unload(&s.stage);
}

/* A peer that connects and says nothing holds up neither accept nor the next client. */
static void test_silent_peer_delays_nobody(void **state) {
    (void)state;
    tr stage, driver;
    load_ok(&stage, tls_options("stage", NULL));
    load_ok(&driver, tls_options("driver", NULL));
    void *l, *silent, *cli;
    char addr[128];
    assert_ok(listen_local(&stage, &l, addr, sizeof addr));
    const int fd = raw_connect(addr);
    assert_true(fd >= 0);
    double t0 = now_ms();
    assert_ok(stage.it->accept(stage.self, l, LONG_MS, &silent));
    assert_true(now_ms() - t0 < 1000); /* no handshake inside accept */
    server sv;
    server_start(&sv, &stage, l, false);
    t0 = now_ms();
    assert_ok(driver.it->connect(driver.self, addr, 5000, &cli));
    roundtrip(&driver, cli, 100000, 3);
    assert_true(now_ms() - t0 < 5000);
    assert_true(sv.accept_ms < 5000);
    /* the silent one's handshake waits inside its own recv, and resumes there */
    void *d;
    size_t n;
    assert_int_equal(stage.it->recv(stage.self, silent, &d, &n, 200), RLX_E_TIMEOUT);
    show("recv from a silent peer", rlx_last_error());
    assert_error_mentions("the TLS handshake did not finish within 200 ms (the peer sent nothing");
    assert_int_equal(stage.it->send(stage.self, silent, "x", 1, 100), RLX_E_TIMEOUT);
    assert_error_mentions("sending to");
    close(fd);
    assert_int_equal(stage.it->recv(stage.self, silent, &d, &n, LONG_MS), RLX_E_PEER);
    assert_error_mentions("the peer closed the connection");
    stage.it->conn_close(stage.self, silent);
    driver.it->conn_close(driver.self, cli);
    server_join(&sv, RLX_E_PEER, "closed the connection");
    stage.it->listener_close(stage.self, l);
    unload(&driver);
    unload(&stage);
}

// ---- frame limits and allocation, from a raw socket ----

/* A frame header without a payload checksum, as a tcp endpoint with checksum=off writes it. */
static void make_header_no_crc(uint8_t h[24], uint64_t len) { make_header(h, 1, 1 /* TCP_FLAG_NO_CRC */, len, 0); }

static void test_set_max_message(void **state) {
    (void)state;
    tr t;
    load_ok(&t, "max_message=1M,checksum=off");
    void *l, *srv;
    char addr[128];
    const int fd = raw_pair(&t, &l, addr, sizeof addr, &srv);
    assert_ok(t.it->set_max_message(t.self, srv, 1000));
    uint8_t h[24];
    /* a frame at the limit passes */
    make_header_no_crc(h, 1000);
    static uint8_t payload[1000];
    assert_int_equal(send(fd, h, 24, MSG_NOSIGNAL), 24);
    assert_int_equal(send(fd, payload, sizeof payload, MSG_NOSIGNAL), (ssize_t)sizeof payload);
    void *d;
    size_t n;
    assert_ok(t.it->recv(t.self, srv, &d, &n, LONG_MS));
    assert_int_equal(n, 1000);
    free(d);
    /* one over is refused from its header alone: no payload follows, yet recv answers at once */
    make_header_no_crc(h, 1001);
    assert_int_equal(send(fd, h, 24, MSG_NOSIGNAL), 24);
    const double t0 = now_ms();
    assert_int_equal(t.it->recv(t.self, srv, &d, &n, LONG_MS), RLX_E_FORMAT);
    assert_true(now_ms() - t0 < LONG_MS / 2);
    show("over set_max_message", rlx_last_error());
    assert_error_mentions(
        "a message of 1001 bytes exceeds the limit of 1000 (this connection's, from set_max_message)");
    t.it->conn_close(t.self, srv);
    close(fd);

    /* a limit above the instance's leaves the instance's in force */
    const int fd2 = raw_connect(addr);
    assert_true(fd2 >= 0);
    assert_ok(t.it->accept(t.self, l, LONG_MS, &srv));
    assert_ok(t.it->set_max_message(t.self, srv, 1ull << 30));
    make_header_no_crc(h, (1u << 20) + 1);
    assert_int_equal(send(fd2, h, 24, MSG_NOSIGNAL), 24);
    assert_int_equal(t.it->recv(t.self, srv, &d, &n, LONG_MS), RLX_E_FORMAT);
    assert_error_mentions("a message of 1048577 bytes exceeds the limit of 1048576 (option max_message)");
    t.it->conn_close(t.self, srv);
    close(fd2);
    t.it->listener_close(t.self, l);
    unload(&t);
}

/* The process's virtual size in bytes, from /proc/self/statm. */
static uint64_t process_size(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

typedef struct writer {
    int fd;
    const void *p;
    size_t n;
    ssize_t sent;
    pthread_t tid;
} writer;

static void *writer_main(void *arg) {
    writer *w = arg;
    size_t done = 0;
    while (done < w->n) {
        const ssize_t k = send(w->fd, (const uint8_t *)w->p + done, w->n - done, MSG_NOSIGNAL);
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    w->sent = (ssize_t)done;
    return NULL;
}

/* A header announcing 3 GiB and 1 MiB after it: the receiver holds about what came. */
static void test_allocates_as_bytes_arrive(void **state) {
    (void)state;
    tr t;
    load_ok(&t, "checksum=off");
    void *l, *srv;
    char addr[128];
    const int fd = raw_pair(&t, &l, addr, sizeof addr, &srv);
    const size_t part = 1u << 20;
    uint8_t *bytes = calloc(1, 24 + part);
    assert_non_null(bytes);
    make_header_no_crc(bytes, 3ull << 30);
    writer w = {.fd = fd, .p = bytes, .n = 24 + part};
    assert_int_equal(pthread_create(&w.tid, NULL, writer_main, &w), 0);
    const uint64_t before = process_size();
    void *d;
    size_t n;
    /* the recv may need a few tries to take the whole megabyte on a busy machine */
    int rc;
    double t0 = now_ms();
    do
        rc = t.it->recv(t.self, srv, &d, &n, 300);
    while (rc == RLX_E_TIMEOUT && !strstr(rlx_last_error(), "(1048576 of 3221225472 payload bytes)") &&
           now_ms() - t0 < LONG_MS);
    assert_int_equal(rc, RLX_E_TIMEOUT);
    show("3 GiB announced, 1 MiB sent", rlx_last_error());
    assert_error_mentions("still incomplete after 300 ms (1048576 of 3221225472 payload bytes)");
    const uint64_t grown = process_size() - before;
    if (grown >= 64u << 20)
        fail_msg("the process grew by %llu bytes for 1 MiB received", (unsigned long long)grown);
    pthread_join(w.tid, NULL);
    assert_int_equal(w.sent, (ssize_t)(24 + part));
    free(bytes);
    t.it->conn_close(t.self, srv);
    close(fd);
    t.it->listener_close(t.self, l);
    unload(&t);
}

// ---- options ----

static void expect_open_fails(const char *options, const char *text) {
    tr t;
    const int rc = load(&t, options);
    if (rc != RLX_E_INVALID)
        fail_msg("open with '%s': want RLX_E_INVALID, got %d: %s", options, rc, rlx_last_error());
    show("open", rlx_last_error());
    assert_error_mentions(text);
}

static void test_tls_option_errors(void **state) {
    (void)state;
    expect_open_fails("tls_ca=" TLS_CERT_DIR "/ca.pem", "TLS needs tls_ca, tls_cert and tls_key together; missing: "
                                                        "tls_cert tls_key");
    expect_open_fails("tls_cert=" TLS_CERT_DIR "/stage.pem,tls_key=" TLS_CERT_DIR "/stage.key", "missing: tls_ca");
    expect_open_fails("tls_name=localhost", "option tls_name needs TLS");
    expect_open_fails("tls_ca=/nonexistent/ca.pem,tls_cert=" TLS_CERT_DIR "/stage.pem,tls_key=" TLS_CERT_DIR
                      "/stage.key",
                      "option tls_ca: cannot read '/nonexistent/ca.pem': No such file or directory");
    expect_open_fails("tls_ca=" TLS_CERT_DIR "/ca.pem,tls_cert=" TLS_CERT_DIR "/stage.pem,tls_key=" TLS_CERT_DIR
                      "/driver.key",
                      "option tls_key: the key in '" TLS_CERT_DIR "/driver.key' does not belong to the certificate "
                      "in '" TLS_CERT_DIR "/stage.pem'");
    expect_open_fails("tls_ca=" TLS_CERT_DIR "/ca.key,tls_cert=" TLS_CERT_DIR "/stage.pem,tls_key=" TLS_CERT_DIR
                      "/stage.key",
                      "option tls_ca: '" TLS_CERT_DIR "/ca.key' holds no PEM certificate");
    expect_open_fails("tls_ca=" TLS_CERT_DIR "/ca.pem,tls_cert=" TLS_CERT_DIR "/stage.key,tls_key=" TLS_CERT_DIR
                      "/stage.key",
                      "option tls_cert: '" TLS_CERT_DIR "/stage.key' holds no PEM certificate");
    expect_open_fails("tls_ca=" TLS_CERT_DIR "/ca.pem,tls_cert=" TLS_CERT_DIR "/stage.pem,tls_key=" TLS_CERT_DIR
                      "/stage.pem",
                      "option tls_key: '" TLS_CERT_DIR "/stage.pem' holds no PEM private key");
    expect_open_fails("tls_ca=" TLS_CERT_DIR "/ca.pem,bogus=1", "known: max_message=N, checksum=on|off, tls_ca=FILE");
    expect_open_fails("checksum=yes", "option checksum: want on or off, not 'yes'");
    expect_open_fails("checksum=", "option 'checksum' needs a value");
}

int main(void) {
    alarm(280); /* a hang ends the run (ctest's TIMEOUT is the outer guard) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_tls_roundtrips),
        cmocka_unit_test(test_handshake_inside_first_send),
        cmocka_unit_test(test_tls_frames_without_checksum),
        cmocka_unit_test(test_client_cert_from_wrong_ca),
        cmocka_unit_test(test_server_cert_from_wrong_ca),
        cmocka_unit_test(test_expired_certificates),
        cmocka_unit_test(test_server_cert_for_another_name),
        cmocka_unit_test(test_client_without_certificate),
        cmocka_unit_test(test_plaintext_client_to_tls_listener),
        cmocka_unit_test(test_tls_client_to_plaintext_listener),
        cmocka_unit_test(test_silent_peer_delays_nobody),
        cmocka_unit_test(test_set_max_message),
        cmocka_unit_test(test_allocates_as_bytes_arrive),
        cmocka_unit_test(test_tls_option_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
