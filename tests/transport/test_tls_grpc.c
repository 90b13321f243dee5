/* The grpc transport with TLS (mutual authentication from the tls_ options), per-connection
 * message limits, and what a message over max_message costs the receiver. The certificates come
 * from make_certs.sh, run into a fresh directory when the group starts and removed at its end.
 * Server and client are two instances of the plugin in this process, except where a peer's
 * memory must be kept apart (a child process spawned from this executable, see child_main) or a
 * peer must do what the plugin's options never let it (a raw socket, a gRPC client without a
 * certificate built here on the C core). */
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "testutil.h"

#include "rlx/transport.h"

#define PLUGIN_PATH RLX_BUILD_PLUGIN_DIR "/rlx-transport-grpc.so"
#include "transport/transport_test.h"

/* A connect refused for a TLS reason fails at once, well within its timeout: gRPC would retry
 * the handshake until then, to the same end. */
#define CONNECT_MS 10000
#define FAIL_FAST_MS 3000

static char g_dir[64]; /* the certificates */

static void log_quiet(void *ctx, int level, const char *message) {
    (void)ctx;
    if (level <= RLX_LOG_WARN)
        fprintf(stderr, "%s\n", message);
}

/* RLX_TEST_VERBOSE=1 prints the error messages the cases provoke, to read them. */
static void show_error(const char *what) {
    if (getenv("RLX_TEST_VERBOSE"))
        printf("  %s: %s\n", what, rlx_last_error());
}

static void assert_error_has(int rc, int want_rc, const char *text) {
    if (rc != want_rc)
        fail_msg("got %d (%s), want %d (%s): %s", rc, rlx_status_str(rc), want_rc, rlx_status_str(want_rc),
                 rlx_last_error());
    assert_error_mentions(text);
}

static int group_setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/rlx-tls-grpc-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "sh '%s' '%s'", MAKE_CERTS, g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* "tls_ca=DIR/ca.pem,tls_cert=DIR/NAME.pem,tls_key=DIR/NAME.key" and extra options after it. */
static const char *tls_options(char *buf, size_t size, const char *ca, const char *name, const char *extra) {
    snprintf(buf, size, "tls_ca=%s/%s.pem,tls_cert=%s/%s.pem,tls_key=%s/%s.key%s%s", g_dir, ca, g_dir, name, g_dir,
             name, extra ? "," : "", extra ? extra : "");
    return buf;
}

/* An instance with the certificate NAME trusting CA (NULL name: plaintext). */
static void load_as(tr *t, const char *ca, const char *name, const char *extra) {
    char options[1024];
    load_ok(t, name ? tls_options(options, sizeof options, ca, name, extra) : extra);
}

/* A server with the certificate srv_name (srv_extra options after it) listening on 127.0.0.1,
 * and a client with cli_name's; both trust the test CA. */
typedef struct peers {
    tr srv, cli;
    void *l;
    char addr[128];
} peers;

static void peers_open(peers *p, const char *srv_name, const char *srv_extra, const char *cli_name,
                       const char *cli_extra) {
    load_as(&p->srv, "ca", srv_name, srv_extra);
    load_as(&p->cli, "ca", cli_name, cli_extra);
    assert_ok(listen_local(&p->srv, &p->l, p->addr, sizeof p->addr));
}

static void peers_close(peers *p) {
    p->srv.it->listener_close(p->srv.self, p->l);
    unload(&p->cli);
    unload(&p->srv);
}

static void assert_failed_fast(double t0, const char *what) {
    const double dt = now_ms() - t0;
    if (dt >= FAIL_FAST_MS)
        fail_msg("%s: connect failed after %.0f ms, want under %d (its timeout: %d)", what, dt, FAIL_FAST_MS,
                 CONNECT_MS);
}

// ---- messages echoed over a connection ----

/* Connects cli to srv's listener at address, echoes messages of each size both ways, closes. */
static void echo_over(tr *srv, tr *cli, void *l, const char *address, const size_t *sizes, int n_sizes) {
    void *c, *s;
    connect_pair(srv, l, cli, address, &c, &s);
    echo e;
    echo_start(&e, srv, s);
    for (int i = 0; i < n_sizes; i++)
        roundtrip(cli, c, sizes[i], (uint64_t)i);
    cli->it->conn_close(cli->self, c);
    echo_join(&e, n_sizes);
}

// ---- a peer in another process ----

enum { BIG_MESSAGE = 128 << 20 };

/* "send-big ADDRESS": sends one BIG_MESSAGE-byte message from an instance without a limit of
 * its own, and exits 0 once the stream reports the receiver's refusal (RLX_E_FORMAT, naming the
 * message's length and the receiver's 1 MiB limit). */
static int child_main(const char *mode, const char *arg) {
    alarm(60);
    if (strcmp(mode, "send-big") != 0)
        return 2;
    tr t;
    void *c;
    if (load(&t, NULL) < 0 || t.it->connect(t.self, arg, LONG_MS, &c) < 0) {
        fprintf(stderr, "send-big: %s\n", rlx_last_error());
        return 3;
    }
    uint8_t *msg = malloc(BIG_MESSAGE);
    memset(msg, 7, BIG_MESSAGE);
    int rc = t.it->send(t.self, c, msg, BIG_MESSAGE, LONG_MS);
    free(msg);
    void *d = NULL;
    size_t n;
    if (rc == RLX_OK)
        rc = t.it->recv(t.self, c, &d, &n, LONG_MS);
    const bool refused = rc == RLX_E_FORMAT && strstr(rlx_last_error(), "larger than max (134217728 vs. 1048576)");
    if (!refused || getenv("RLX_TEST_VERBOSE"))
        printf("  sender: %d %s\n", rc, rlx_last_error());
    free(d);
    t.it->conn_close(t.self, c);
    unload(&t);
    return refused ? 0 : 4;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

typedef struct rss_watch {
    long peak;
    volatile bool stop;
    pthread_t tid;
} rss_watch;

static void *rss_watch_main(void *arg) {
    rss_watch *w = arg;
    while (!w->stop) {
        const long kib = rss_kib();
        if (kib > w->peak)
            w->peak = kib;
        usleep(2000);
    }
    return NULL;
}

// ---- cases ----

/* First, while this process's heap is small: a 128 MiB message to a receiver whose max_message
 * is 1 MiB. gRPC refuses it (its max receive length is max_message) and the sender hears both
 * numbers. gRPC 1.51 checks that length only once the whole message is in (measured: the
 * receiver's RSS grows by the 128 MiB, with or without BDP probing), so what this bounds is one
 * copy of what the peer sent, not the 5-byte header's claim: nothing is allocated ahead of it. */
static void test_message_over_max_is_refused(void **state) {
    (void)state;
    tr srv;
    load_as(&srv, NULL, NULL, "max_message=1M");
    void *l, *s;
    char addr[128];
    assert_ok(listen_local(&srv, &l, addr, sizeof addr));
    rss_watch w = {.peak = rss_kib()};
    const long before = w.peak;
    assert_int_equal(pthread_create(&w.tid, NULL, rss_watch_main, &w), 0);
    const pid_t pid = spawn_child("send-big", addr, NULL);
    assert_true(pid > 0);
    assert_ok(srv.it->accept(srv.self, l, LONG_MS, &s));
    void *d = NULL;
    size_t n;
    const int rc = srv.it->recv(srv.self, s, &d, &n, LONG_MS);
    show_error("receiver of a message over max_message");
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    w.stop = true;
    pthread_join(w.tid, NULL);
    assert_null(d);
    assert_int_equal(rc, RLX_E_PEER);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (getenv("RLX_TEST_VERBOSE"))
        printf("  receiver RSS %ld KiB before, peak %ld KiB\n", before, w.peak);
#ifndef __SANITIZE_ADDRESS__ /* ASan's quarantine keeps what gRPC freed resident */
    assert_true(w.peak - before < (BIG_MESSAGE >> 10) + 32 * 1024);
#endif
    srv.it->conn_close(srv.self, s);
    srv.it->listener_close(srv.self, l);
    unload(&srv);
}

static void test_mutual_tls_roundtrip(void **state) {
    (void)state;
    peers p;
    peers_open(&p, "stage", NULL, "driver", NULL);
    char by_name[128];
    static const size_t sizes[] = {0, 1, 100, 65537, 64u << 20, 5};
    echo_over(&p.srv, &p.cli, p.l, p.addr, sizes, 6);
    /* the DNS name in the certificate works as well as its IP address */
    snprintf(by_name, sizeof by_name, "localhost:%s", strrchr(p.addr, ':') + 1);
    echo_over(&p.srv, &p.cli, p.l, by_name, sizes, 2);
    peers_close(&p);
}

/* A connect from cli_name's certificate to a server with srv_name's, both trusting the test CA,
 * fails with RLX_E_AUTH mentioning text; the server's accept sees nobody. */
static void expect_auth_failure(const char *srv_name, const char *cli_name, const char *cli_extra, const char *text) {
    peers p;
    peers_open(&p, srv_name, NULL, cli_name, cli_extra);
    void *c = NULL, *s = NULL;
    char want[256];
    const double t0 = now_ms();
    const int rc = p.cli.it->connect(p.cli.self, p.addr, CONNECT_MS, &c);
    show_error(text);
    assert_error_has(rc, RLX_E_AUTH, text);
    snprintf(want, sizeof want, "TLS handshake with %s failed", p.addr);
    assert_error_mentions(want);
    assert_failed_fast(t0, text);
    assert_null(c);
    assert_int_equal(p.srv.it->accept(p.srv.self, p.l, 200, &s), RLX_E_TIMEOUT);
    peers_close(&p);
}

static void test_client_cert_from_another_ca(void **state) {
    (void)state;
    expect_auth_failure("stage", "other", NULL, "refused this process's certificate");
}

static void test_server_cert_from_another_ca(void **state) {
    (void)state;
    expect_auth_failure("other", "driver", NULL, "certificate verify failed");
}

static void test_expired_server_cert(void **state) {
    (void)state;
    expect_auth_failure("expired", "driver", NULL, "certificate has expired");
}

static void test_expired_client_cert(void **state) {
    (void)state;
    expect_auth_failure("stage", "expired", NULL, "refused this process's certificate: tls_cert expired on Jan 31");
}

static void test_wrong_server_name(void **state) {
    (void)state;
    expect_auth_failure("wrongname", "driver", NULL, "127.0.0.1");
    /* the name the certificate carries, given as tls_name, is accepted */
    peers p;
    peers_open(&p, "wrongname", NULL, "driver", "tls_name=elsewhere.invalid");
    static const size_t sizes[] = {1000};
    echo_over(&p.srv, &p.cli, p.l, p.addr, sizes, 1);
    peers_close(&p);
}

/* Our options cannot make a TLS client without a certificate: this one is gRPC's own. */
static void test_client_without_certificate(void **state) {
    (void)state;
    tr srv;
    load_as(&srv, "ca", "stage", NULL);
    void *l, *s = NULL;
    char addr[128], path[128];
    assert_ok(listen_local(&srv, &l, addr, sizeof addr));
    snprintf(path, sizeof path, "%s/ca.pem", g_dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char ca[16384];
    ca[fread(ca, 1, sizeof ca - 1, f)] = '\0';
    fclose(f);
    grpc_init();
    grpc_channel_credentials *creds = grpc_ssl_credentials_create(ca, NULL, NULL, NULL);
    grpc_channel *ch = grpc_channel_create(addr, creds, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    /* the connection must never become READY: the server ends every handshake */
    const gpr_timespec end = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(2000, GPR_TIMESPAN));
    bool ready = false, failed = false;
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch, 1);
    while (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), end) < 0) {
        ready |= st == GRPC_CHANNEL_READY;
        failed |= st == GRPC_CHANNEL_TRANSIENT_FAILURE;
        grpc_channel_watch_connectivity_state(ch, st, end, cq, NULL);
        grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        st = grpc_channel_check_connectivity_state(ch, 1);
    }
    assert_false(ready);
    assert_true(failed);
    assert_int_equal(srv.it->accept(srv.self, l, 200, &s), RLX_E_TIMEOUT);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_channel_credentials_release(creds);
    grpc_shutdown_blocking();
    srv.it->listener_close(srv.self, l);
    unload(&srv);
}

/* A connect from client to a listener of server fails fast with RLX_E_AUTH mentioning text (and,
 * with names_address, the listener's address); the server's accept sees nobody. */
static void expect_mismatch(tr *server, tr *client, const char *what, const char *text, bool names_address) {
    void *l, *c = NULL, *s = NULL;
    char addr[128];
    assert_ok(listen_local(server, &l, addr, sizeof addr));
    const double t0 = now_ms();
    const int rc = client->it->connect(client->self, addr, CONNECT_MS, &c);
    show_error(what);
    assert_failed_fast(t0, what);
    assert_null(c);
    assert_error_has(rc, RLX_E_AUTH, text);
    if (names_address)
        assert_error_mentions(addr);
    assert_int_equal(server->it->accept(server->self, l, 200, &s), RLX_E_TIMEOUT);
    server->it->listener_close(server->self, l);
}

static void test_plaintext_and_tls_mismatch(void **state) {
    (void)state;
    tr tls, plain;
    load_as(&tls, "ca", "stage", NULL);
    load_as(&plain, NULL, NULL, NULL);
    expect_mismatch(&tls, &plain, "plaintext client, TLS server", "the stage speaks TLS", true);
    expect_mismatch(&plain, &tls, "TLS client, plaintext server", "the stage does not speak TLS", false);
    unload(&plain);
    unload(&tls);
}

/* Failing fast is for a peer that answered: a port nothing listens on is retried to the deadline
 * (RLX_E_PEER, refused), and a stage that starts listening meanwhile is reached. */
static void test_nobody_listening_is_retried(void **state) {
    (void)state;
    tr srv, cli;
    load_as(&srv, "ca", "stage", NULL);
    load_as(&cli, "ca", "driver", NULL);
    late_listener ll = {.t = &srv, .delay_ms = 600};
    snprintf(ll.addr, sizeof ll.addr, "127.0.0.1:%d", free_port());
    void *c = NULL;
    double t0 = now_ms();
    const int rc = cli.it->connect(cli.self, ll.addr, 1500, &c);
    double dt = now_ms() - t0;
    show_error("TLS client, nobody listening");
    assert_error_has(rc, RLX_E_PEER, "refused");
    assert_error_mentions(ll.addr);
    assert_null(c);
    if (dt < 1400 || dt > 1500 + FAIL_FAST_MS)
        fail_msg("connect to nobody gave up after %.0f ms, want its timeout (1500)", dt);
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, late_listener_main, &ll), 0);
    t0 = now_ms();
    assert_ok(cli.it->connect(cli.self, ll.addr, LONG_MS, &c));
    dt = now_ms() - t0;
    pthread_join(tid, NULL);
    assert_ok(ll.rc);
    assert_true(dt >= 500);
    assert_ok(cli.it->send(cli.self, c, "hi", 2, LONG_MS));
    void *d;
    size_t n;
    assert_ok(srv.it->recv(srv.self, ll.conn, &d, &n, LONG_MS));
    assert_int_equal(n, 2);
    free(d);
    cli.it->conn_close(cli.self, c);
    srv.it->conn_close(srv.self, ll.conn);
    srv.it->listener_close(srv.self, ll.l);
    unload(&cli);
    unload(&srv);
}

/* A TLS record header announcing a 512-byte ClientHello, and its first bytes. */
static const uint8_t half_hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03};

/* A TCP connection to addr that sends prefix (len bytes) and then nothing; returns its socket. */
static int silent_peer(const char *addr, const void *prefix, size_t len) {
    const int fd = raw_connect(addr);
    if (fd >= 0 && len && write(fd, prefix, len) != (ssize_t)len) {
        close(fd);
        return -1;
    }
    return fd;
}

static void test_silent_peers_do_not_delay_accept(void **state) {
    (void)state;
    peers p;
    peers_open(&p, "stage", NULL, "driver", NULL);
    tr *srv = &p.srv, *cli = &p.cli;
    void *s = NULL, *c = NULL;
    const int quiet = silent_peer(p.addr, NULL, 0), half = silent_peer(p.addr, half_hello, sizeof half_hello);
    assert_true(quiet >= 0 && half >= 0);
    assert_int_equal(srv->it->accept(srv->self, p.l, 300, &s), RLX_E_TIMEOUT);
    const double t0 = now_ms();
    connect_pair(srv, p.l, cli, p.addr, &c, &s);
    /* gRPC's own handshake timeout is 120 s: a wait for either silent peer would show */
    assert_true(now_ms() - t0 < 5000);
    assert_ok(cli->it->send(cli->self, c, "hello", 5, LONG_MS));
    void *d;
    size_t n;
    assert_ok(srv->it->recv(srv->self, s, &d, &n, LONG_MS));
    assert_int_equal(n, 5);
    free(d);
    close(quiet);
    close(half);
    cli->it->conn_close(cli->self, c);
    srv->it->conn_close(srv->self, s);
    peers_close(&p);
}

/* Milliseconds until the peer of fd closes it (a read gives 0 or an error), or -1 if it is still
 * open after timeout_ms. */
static double ms_until_closed(int fd, int timeout_ms) {
    const double t0 = now_ms();
    for (;;) {
        const int left = timeout_ms - (int)(now_ms() - t0);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        char buf[4096];
        if (read(fd, buf, sizeof buf) <= 0)
            return now_ms() - t0;
    }
}

/* A socket that never finishes its handshake (TLS, or HTTP/2 settings on a plaintext listener)
 * is closed after handshake_ms, not after gRPC's own 120 s: idle sockets hold no descriptor long. */
static void test_unfinished_handshakes_closed_after_handshake_ms(void **state) {
    (void)state;
    /* the first 16 bytes of the 24-byte HTTP/2 client preface */
    static const char half_preface[] = "PRI * HTTP/2.0\r\n";
    for (int tls = 0; tls < 2; tls++) {
        tr srv;
        load_as(&srv, "ca", tls ? "stage" : NULL, "handshake_ms=500");
        void *l;
        char addr[128];
        assert_ok(listen_local(&srv, &l, addr, sizeof addr));
        const int quiet = silent_peer(addr, NULL, 0);
        const int half = tls ? silent_peer(addr, half_hello, sizeof half_hello)
                             : silent_peer(addr, half_preface, sizeof half_preface - 1);
        assert_true(quiet >= 0 && half >= 0);
        const double quiet_ms = ms_until_closed(quiet, 5000), half_ms = ms_until_closed(half, 5000);
        if (getenv("RLX_TEST_VERBOSE"))
            printf("  %s listener, handshake_ms=500: silent socket closed after %.0f ms, half handshake %.0f ms\n",
                   tls ? "TLS" : "plaintext", quiet_ms, half_ms);
        if (quiet_ms < 400 || quiet_ms > 3000 || half_ms < 0 || half_ms > 3000)
            fail_msg("%s listener: sockets closed after %.0f and %.0f ms, want about 500 (handshake_ms)",
                     tls ? "TLS" : "plaintext", quiet_ms, half_ms);
        close(quiet);
        close(half);
        srv.it->listener_close(srv.self, l);
        unload(&srv);
    }
    tr t;
    assert_error_has(load(&t, "handshake_ms=50"), RLX_E_INVALID, "handshake_ms=50");
}

static void test_set_max_message(void **state) {
    (void)state;
    peers p;
    peers_open(&p, "stage", "max_message=1M", "driver", NULL);
    tr *srv = &p.srv, *cli = &p.cli;
    void *s, *c;
    connect_pair(srv, p.l, cli, p.addr, &c, &s);
    assert_non_null(srv->it->set_max_message);
    /* not above the instance's own limit */
    assert_error_has(srv->it->set_max_message(srv->self, s, 2u << 20), RLX_E_INVALID, "1048576");
    assert_ok(srv->it->set_max_message(srv->self, s, 1000));
    uint8_t msg[2000];
    fill(msg, sizeof msg, 1);
    void *d = NULL;
    size_t n;
    /* up to the limit passes */
    assert_ok(cli->it->send(cli->self, c, msg, 1000, LONG_MS));
    assert_ok(srv->it->recv(srv->self, s, &d, &n, LONG_MS));
    assert_int_equal(n, 1000);
    free(d);
    d = NULL;
    assert_ok(cli->it->send(cli->self, c, msg, 1001, LONG_MS));
    int rc = srv->it->recv(srv->self, s, &d, &n, LONG_MS);
    show_error("receiver over set_max_message");
    assert_error_has(rc, RLX_E_FORMAT, "1001 bytes exceeds this connection's max_message (1000)");
    assert_null(d);
    /* the connection stays refused, and the sender hears why */
    assert_error_has(srv->it->recv(srv->self, s, &d, &n, LONG_MS), RLX_E_FORMAT, "(1000)");
    rc = cli->it->recv(cli->self, c, &d, &n, LONG_MS);
    show_error("sender over set_max_message");
    assert_error_has(rc, RLX_E_FORMAT, "larger than max (1001 vs. 1000)");
    cli->it->conn_close(cli->self, c);
    srv->it->conn_close(srv->self, s);
    peers_close(&p);
}

static void test_tls_option_errors(void **state) {
    (void)state;
    tr t;
    char o[1024];
    snprintf(o, sizeof o, "tls_ca=%s/ca.pem", g_dir);
    assert_error_has(load(&t, o), RLX_E_INVALID, "tls_cert, tls_key missing");
    snprintf(o, sizeof o, "tls_ca=%s/ca.pem,tls_key=%s/stage.key", g_dir, g_dir);
    assert_error_has(load(&t, o), RLX_E_INVALID, "tls_cert missing");
    assert_error_has(load(&t, "tls_name=stage.example"), RLX_E_INVALID, "tls_name=stage.example without TLS");
    snprintf(o, sizeof o, "tls_ca=%s/ca.pem,tls_cert=%s/nosuch.pem,tls_key=%s/stage.key", g_dir, g_dir, g_dir);
    assert_error_has(load(&t, o), RLX_E_IO, "nosuch.pem': cannot open it: No such file or directory");
    /* a key that is not the certificate's */
    snprintf(o, sizeof o, "tls_ca=%s/ca.pem,tls_cert=%s/stage.pem,tls_key=%s/driver.key", g_dir, g_dir, g_dir);
    assert_error_has(load(&t, o), RLX_E_INVALID, "driver.key' is not the private key of tls_cert");
    /* files swapped: a key where a certificate belongs */
    snprintf(o, sizeof o, "tls_ca=%s/ca.key,tls_cert=%s/stage.pem,tls_key=%s/stage.key", g_dir, g_dir, g_dir);
    assert_error_has(load(&t, o), RLX_E_FORMAT, "ca.key' holds no PEM certificate");
    snprintf(o, sizeof o, "tls_ca=%s,tls_cert=%s/stage.pem,tls_key=%s/stage.key", g_dir, g_dir, g_dir);
    assert_error_has(load(&t, o), RLX_E_IO, "cannot read it: Is a directory");
    snprintf(o, sizeof o, "%s/empty.pem", g_dir);
    fclose(fopen(o, "w"));
    snprintf(o, sizeof o, "tls_ca=%s/empty.pem,tls_cert=%s/stage.pem,tls_key=%s/stage.key", g_dir, g_dir, g_dir);
    assert_error_has(load(&t, o), RLX_E_IO, "empty.pem' is empty");
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child"))
        return child_main(argv[2], argv[3]);
    rlx_log_set_handler(log_quiet, NULL);
    alarm(280);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_over_max_is_refused),
        cmocka_unit_test(test_mutual_tls_roundtrip),
        cmocka_unit_test(test_client_cert_from_another_ca),
        cmocka_unit_test(test_server_cert_from_another_ca),
        cmocka_unit_test(test_expired_server_cert),
        cmocka_unit_test(test_expired_client_cert),
        cmocka_unit_test(test_wrong_server_name),
        cmocka_unit_test(test_client_without_certificate),
        cmocka_unit_test(test_plaintext_and_tls_mismatch),
        cmocka_unit_test(test_nobody_listening_is_retried),
        cmocka_unit_test(test_silent_peers_do_not_delay_accept),
        cmocka_unit_test(test_unfinished_handshakes_closed_after_handshake_ms),
        cmocka_unit_test(test_set_max_message),
        cmocka_unit_test(test_tls_option_errors),
    };
    return cmocka_run_group_tests_name("grpc tls", tests, group_setup, group_teardown);
}
