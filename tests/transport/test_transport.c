/* Transport plugins through the core loader: the same cases run against each plugin (this file
 * is built once per plugin, TRANSPORT_PLUGIN naming it), plus wire-level cases for tcp that
 * write broken frames from a raw socket. Peers that must die abruptly are child processes
 * started with posix_spawn of this same executable (see child_main), so no gRPC state is ever
 * forked. cmocka assertions are only made on the main thread; helper threads record results. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "rlx/transport.h"

#ifndef TRANSPORT_PLUGIN
#error "build with -DTRANSPORT_PLUGIN=\"tcp\" or \"grpc\""
#endif
#define PLUGIN_PATH RLX_BUILD_PLUGIN_DIR "/rlx-transport-" TRANSPORT_PLUGIN ".so"
#define IS_TCP (strcmp(TRANSPORT_PLUGIN, "tcp") == 0)
#include "transport/transport_test.h"

static tr g_tr; /* the plugin under test, loaded and opened by group_setup */

/* RLX_TEST_VERBOSE=1 prints the error messages the cases provoke, to read them. */
static void show_error(const char *what) {
    if (getenv("RLX_TEST_VERBOSE"))
        printf("  [%s] %s: %s\n", TRANSPORT_PLUGIN, what, rlx_last_error());
}

static int group_setup(void **state) {
    (void)state;
    if (load(&g_tr, NULL) < 0) {
        fprintf(stderr, "cannot load %s: %s\n", PLUGIN_PATH, rlx_last_error());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    unload(&g_tr);
    return 0;
}

/* A round trip whose buffer from recv starts on 16 bytes, as the host's allocator gives it. */
static void roundtrip_aligned(tr *t, void *conn, size_t size, uint64_t seed) {
    void *back = echo_back(t, conn, size, seed);
    assert_true(((uintptr_t)back & 15) == 0);
    free(back);
}

// ---- cases for every transport ----

static void test_echo_small_and_odd_sizes(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *cli, *srv;
    char addr[128];
    make_pair(t, &l, &cli, &srv, addr, sizeof addr);
    echo e;
    echo_start(&e, t, srv);
    static const size_t sizes[] = {0, 1, 7, 23, 24, 25, 100, 4096, 65535, 65536, 65537, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        roundtrip_aligned(t, cli, sizes[i], i);
    t->it->conn_close(t->self, cli);
    echo_join(&e, sizeof sizes / sizeof sizes[0]);
    t->it->listener_close(t->self, l);
}

static void test_echo_64mib(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *cli, *srv;
    char addr[128];
    make_pair(t, &l, &cli, &srv, addr, sizeof addr);
    echo e;
    echo_start(&e, t, srv);
    roundtrip_aligned(t, cli, 64u << 20, 42);
    roundtrip_aligned(t, cli, 5, 43); /* the stream is still in step afterwards */
    t->it->conn_close(t->self, cli);
    echo_join(&e, 2);
    t->it->listener_close(t->self, l);
}

enum { ORDER_N = 1000 };

typedef struct order_peer {
    tr *t;
    void *conn;
    int bad_at; /* index of the first message out of order, -1 if none */
    int rc;
    char error[512];
} order_peer;

static void *order_server(void *arg) {
    order_peer *p = arg;
    p->bad_at = -1;
    for (int i = 0; i < ORDER_N && p->rc == 0; i++) {
        void *d;
        size_t n;
        if ((p->rc = p->t->it->recv(p->t->self, p->conn, &d, &n, LONG_MS)) < 0) {
            snprintf(p->error, sizeof p->error, "recv %d: %s", i, rlx_last_error());
            break;
        }
        uint32_t seq;
        if (p->bad_at < 0 && (n != 8 + (size_t)(i % 97) || (memcpy(&seq, d, 4), seq != (uint32_t)i)))
            p->bad_at = i;
        free(d);
    }
    /* then the other direction, while the client reads */
    for (uint32_t i = 0; i < ORDER_N && p->rc == 0; i++) {
        uint8_t msg[8];
        memcpy(msg, &i, 4);
        memcpy(msg + 4, &i, 4);
        if ((p->rc = p->t->it->send(p->t->self, p->conn, msg, sizeof msg, LONG_MS)) < 0)
            snprintf(p->error, sizeof p->error, "send %u: %s", i, rlx_last_error());
    }
    return NULL;
}

static void test_message_order(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *cli, *srv;
    char addr[128];
    make_pair(t, &l, &cli, &srv, addr, sizeof addr);
    order_peer p = {.t = t, .conn = srv};
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, order_server, &p), 0);
    uint8_t msg[8 + 97];
    for (uint32_t i = 0; i < ORDER_N; i++) {
        fill(msg, sizeof msg, i);
        memcpy(msg, &i, 4);
        assert_ok(t->it->send(t->self, cli, msg, 8 + i % 97, LONG_MS));
    }
    for (uint32_t i = 0; i < ORDER_N; i++) {
        void *d;
        size_t n;
        assert_ok(t->it->recv(t->self, cli, &d, &n, LONG_MS));
        uint32_t seq;
        memcpy(&seq, d, 4);
        free(d);
        assert_int_equal(n, 8);
        assert_int_equal(seq, i);
    }
    pthread_join(tid, NULL);
    if (p.rc < 0)
        fail_msg("server: %s", p.error);
    assert_int_equal(p.bad_at, -1);
    pair_close(t, l, cli, srv);
}

enum { CONC_CONNS = 4, CONC_ROUNDS = 50 };

typedef struct conc_client {
    tr *t;
    const char *addr;
    int id, ok_rounds, rc;
    char error[512];
} conc_client;

static void *conc_client_main(void *arg) {
    conc_client *c = arg;
    void *conn;
    if ((c->rc = c->t->it->connect(c->t->self, c->addr, LONG_MS, &conn)) < 0) {
        snprintf(c->error, sizeof c->error, "connect: %s", rlx_last_error());
        return NULL;
    }
    uint8_t msg[3000];
    for (int r = 0; r < CONC_ROUNDS; r++) {
        const size_t size = 16 + (size_t)(r * 53 + c->id * 7) % (sizeof msg - 16);
        fill(msg, size, (uint64_t)c->id * 1000 + (uint64_t)r);
        void *d = NULL;
        size_t n;
        if ((c->rc = c->t->it->send(c->t->self, conn, msg, size, LONG_MS)) < 0 ||
            (c->rc = c->t->it->recv(c->t->self, conn, &d, &n, LONG_MS)) < 0) {
            snprintf(c->error, sizeof c->error, "round %d: %s", r, rlx_last_error());
            break;
        }
        c->ok_rounds += n == size && memcmp(d, msg, size) == 0;
        free(d);
    }
    c->t->it->conn_close(c->t->self, conn);
    return NULL;
}

static void test_concurrent_connections(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l;
    char addr[128];
    assert_ok(listen_local(t, &l, addr, sizeof addr));
    conc_client clients[CONC_CONNS];
    pthread_t tids[CONC_CONNS];
    for (int i = 0; i < CONC_CONNS; i++) {
        clients[i] = (conc_client){.t = t, .addr = addr, .id = i};
        assert_int_equal(pthread_create(&tids[i], NULL, conc_client_main, &clients[i]), 0);
    }
    echo servers[CONC_CONNS];
    for (int i = 0; i < CONC_CONNS; i++) {
        void *srv;
        assert_ok(t->it->accept(t->self, l, LONG_MS, &srv));
        echo_start(&servers[i], t, srv);
    }
    for (int i = 0; i < CONC_CONNS; i++) {
        pthread_join(tids[i], NULL);
        if (clients[i].rc < 0)
            fail_msg("client %d: %s", i, clients[i].error);
        assert_int_equal(clients[i].ok_rounds, CONC_ROUNDS);
    }
    for (int i = 0; i < CONC_CONNS; i++)
        echo_join(&servers[i], CONC_ROUNDS);
    t->it->listener_close(t->self, l);
}

static void test_accept_times_out(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *conn = (void *)&conn;
    char addr[128];
    assert_ok(listen_local(t, &l, addr, sizeof addr));
    const double t0 = now_ms();
    assert_int_equal(t->it->accept(t->self, l, 200, &conn), RLX_E_TIMEOUT);
    const double dt = now_ms() - t0;
    assert_null(conn);
    assert_true(dt >= 190 && dt < 2000);
    show_error("accept timeout");
    assert_error_mentions("127.0.0.1:0");
    t->it->listener_close(t->self, l);
}

static void test_recv_times_out_and_conn_survives(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *cli, *srv;
    char addr[128];
    make_pair(t, &l, &cli, &srv, addr, sizeof addr);
    void *d;
    size_t n;
    for (int side = 0; side < 2; side++) {
        void *me = side ? cli : srv, *other = side ? srv : cli;
        double t0 = now_ms();
        assert_int_equal(t->it->recv(t->self, me, &d, &n, 300), RLX_E_TIMEOUT);
        double dt = now_ms() - t0;
        assert_true(dt >= 290 && dt < 3000);
        show_error("recv timeout");
        assert_error_mentions("within 300 ms");
        /* nothing was lost or left dangling: the connection still works both ways */
        assert_ok(t->it->send(t->self, other, "after", 5, LONG_MS));
        assert_ok(t->it->recv(t->self, me, &d, &n, LONG_MS));
        assert_int_equal(n, 5);
        assert_memory_equal(d, "after", 5);
        free(d);
    }
    pair_close(t, l, cli, srv);
}

static void test_connect_to_nobody_fails_in_time(void **state) {
    (void)state;
    tr *t = &g_tr;
    const int port = free_port();
    assert_true(port > 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    void *conn = (void *)&conn;
    const double t0 = now_ms();
    /* refused to the end is a peer failure (nothing listens), not a silence */
    assert_int_equal(t->it->connect(t->self, addr, 700, &conn), RLX_E_PEER);
    const double dt = now_ms() - t0;
    assert_null(conn);
    if (dt < 650 || dt > 3000)
        fail_msg("connect gave up after %.0f ms, want about 700", dt);
    show_error("connect to nobody");
    assert_error_mentions(addr);
    if (!strcasestr(rlx_last_error(), "refused"))
        fail_msg("the error should say the connection was refused: %s", rlx_last_error());
}

static void test_connect_retries_until_listener_appears(void **state) {
    (void)state;
    tr *t = &g_tr;
    late_listener ll = {.t = t, .delay_ms = 600};
    snprintf(ll.addr, sizeof ll.addr, "127.0.0.1:%d", free_port());
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, late_listener_main, &ll), 0);
    void *cli;
    const double t0 = now_ms();
    assert_ok(t->it->connect(t->self, ll.addr, LONG_MS, &cli));
    const double dt = now_ms() - t0;
    pthread_join(tid, NULL);
    assert_ok(ll.rc);
    assert_true(dt >= 500 && dt < 5000);
    assert_ok(t->it->send(t->self, cli, "hi", 2, LONG_MS));
    void *d;
    size_t n;
    assert_ok(t->it->recv(t->self, ll.conn, &d, &n, LONG_MS));
    assert_int_equal(n, 2);
    free(d);
    t->it->conn_close(t->self, cli);
    t->it->conn_close(t->self, ll.conn);
    t->it->listener_close(t->self, ll.l);
}

static void test_send_times_out_when_peer_does_not_read(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *cli, *srv;
    char addr[128];
    make_pair(t, &l, &cli, &srv, addr, sizeof addr);
    const size_t size = 8u << 20;
    uint8_t *msg = calloc(1, size);
    int rc = RLX_OK, i = 0;
    double dt = 0;
    for (; i < 64 && rc == RLX_OK; i++) {
        const double t0 = now_ms();
        rc = t->it->send(t->self, cli, msg, size, 300);
        dt = now_ms() - t0;
    }
    free(msg);
    if (rc != RLX_E_TIMEOUT)
        fail_msg("send never timed out (%d after %d sends): %s", rc, i, rlx_last_error());
    show_error("send timeout");
    assert_true(dt >= 290 && dt < 3000);
    assert_error_mentions(addr);
    pair_close(t, l, cli, srv);
}

typedef struct reader {
    tr *t;
    void *conn;
    int n, rc;
    char error[512];
    pthread_t tid;
} reader;

static void *reader_main(void *arg) {
    reader *r = arg;
    for (;;) {
        void *d;
        size_t n;
        if ((r->rc = r->t->it->recv(r->t->self, r->conn, &d, &n, LONG_MS)) < 0) {
            snprintf(r->error, sizeof r->error, "%s", rlx_last_error());
            break;
        }
        r->n += n == 3 && memcmp(d, "msg", 3) == 0;
        free(d);
    }
    r->t->it->conn_close(r->t->self, r->conn);
    return NULL;
}

/* One side sends and closes at once; the reader on the other side (already reading, or
 * starting only after the close returned) still gets every message, then a clean end. */
static void test_close_delivers_what_was_sent(void **state) {
    (void)state;
    tr *t = &g_tr;
    for (int mode = 0; mode < 4; mode++) {
        const bool late = mode & 1, from_server = mode & 2;
        void *l, *cli, *srv;
        char addr[128];
        make_pair(t, &l, &cli, &srv, addr, sizeof addr);
        void *writer = from_server ? srv : cli;
        reader r = {.t = t, .conn = from_server ? cli : srv};
        if (!late)
            assert_int_equal(pthread_create(&r.tid, NULL, reader_main, &r), 0);
        for (int i = 0; i < 3; i++)
            assert_ok(t->it->send(t->self, writer, "msg", 3, LONG_MS));
        t->it->conn_close(t->self, writer);
        if (late) {
            sleep_ms(200);
            assert_int_equal(pthread_create(&r.tid, NULL, reader_main, &r), 0);
        }
        pthread_join(r.tid, NULL);
        if (r.rc != RLX_E_PEER || r.n != 3)
            fail_msg("%s reader of the %s got %d messages, then %d: %s", late ? "late" : "early",
                     from_server ? "server" : "client", r.n, r.rc, r.error);
        if (!strstr(r.error, "closed"))
            fail_msg("the end of the stream should read as a close: %s", r.error);
        if (getenv("RLX_TEST_VERBOSE"))
            printf("  [%s] end of stream: %s\n", TRANSPORT_PLUGIN, r.error);
        t->it->listener_close(t->self, l);
    }
}

typedef struct log_capture {
    int n_debug, n_above_debug, n_library;
    char above_debug[512];
} log_capture;

static void capture_log(void *ctx, int level, const char *message) {
    log_capture *c = ctx;
    if (level < RLX_LOG_DEBUG) {
        c->n_above_debug++;
        snprintf(c->above_debug, sizeof c->above_debug, "%s", message);
    } else {
        c->n_debug++;
    }
    c->n_library += !strncmp(message, "libgrpc ", 8);
}

static void log_to_stderr(void *ctx, int level, const char *message);

static void test_listen_twice_on_one_port_fails(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *l2 = (void *)&l2;
    char addr[128];
    assert_ok(listen_local(t, &l, addr, sizeof addr));
    log_capture logged = {0};
    rlx_log_set_handler(capture_log, &logged);
    const int rc = t->it->listen(t->self, addr, &l2);
    rlx_log_set_handler(log_to_stderr, NULL);
    assert_int_equal(rc, RLX_E_IO);
    show_error("port in use");
    assert_null(l2);
    assert_error_mentions(addr);
    assert_error_mentions("the port is in use");
    /* the failure is the returned error alone; what gRPC logs about it is detail for -v */
    if (logged.n_above_debug)
        fail_msg("listen logged %d lines above debug level, e.g. %s", logged.n_above_debug, logged.above_debug);
    if (!IS_TCP && !logged.n_library)
        fail_msg("gRPC's own log of the failed bind did not reach the host's log as a libgrpc line");
    t->it->listener_close(t->self, l);
}

static void test_bad_addresses_and_options(void **state) {
    (void)state;
    tr *t = &g_tr;
    static const char *const bad[] = {"nocolon",   "127.0.0.1:99999", "127.0.0.1:", "[::1",
                                      "[::1]7101", "::1:7101",        "host:port",  "127.0.0.1:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *x = (void *)&x;
        assert_int_equal(t->it->listen(t->self, bad[i], &x), RLX_E_INVALID);
        assert_null(x);
        assert_error_mentions(bad[i]);
        x = (void *)&x;
        assert_int_equal(t->it->connect(t->self, bad[i], 100, &x), RLX_E_INVALID);
        assert_null(x);
        assert_error_mentions(bad[i]);
        show_error("bad address");
    }
    void *x;
    assert_int_equal(t->it->connect(t->self, "127.0.0.1:0", 100, &x), RLX_E_INVALID);
    tr other;
    assert_int_equal(load(&other, "bogus=1"), RLX_E_INVALID);
    assert_error_mentions("bogus");
    assert_int_equal(load(&other, "max_message"), RLX_E_INVALID);
}

static int ipv6_loopback_works(void) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    const int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void echo_once_at(tr *t, const char *listen_addr, const char *connect_host) {
    void *l, *cli, *srv;
    char bound[128], addr[160];
    assert_ok(t->it->listen(t->self, listen_addr, &l));
    assert_ok(t->it->bound_address(t->self, l, bound, sizeof bound));
    const char *port = strrchr(bound, ':');
    assert_non_null(port);
    snprintf(addr, sizeof addr, "%s%s", connect_host, port);
    connect_pair(t, l, t, addr, &cli, &srv);
    echo e;
    echo_start(&e, t, srv);
    roundtrip_aligned(t, cli, 1000, 1);
    t->it->conn_close(t->self, cli);
    echo_join(&e, 1);
    t->it->listener_close(t->self, l);
}

static void test_ipv6_and_host_names(void **state) {
    (void)state;
    tr *t = &g_tr;
    echo_once_at(t, "localhost:0", "localhost");
    echo_once_at(t, "0.0.0.0:0", "127.0.0.1");
    if (!ipv6_loopback_works()) {
        skip();
        return;
    }
    echo_once_at(t, "[::1]:0", "[::1]");
    echo_once_at(t, "[::]:0", "127.0.0.1"); /* the IPv6 wildcard also takes IPv4 */
    echo_once_at(t, "[::]:0", "[::1]");
}

static void test_open_close_many_instances(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) {
        tr a, b;
        assert_ok(load(&a, NULL));
        assert_ok(load(&b, NULL));
        void *l, *cli, *srv;
        char addr[128];
        make_pair(&a, &l, &cli, &srv, addr, sizeof addr);
        void *cli_b;
        assert_ok(b.it->connect(b.self, addr, LONG_MS, &cli_b));
        unload(&b); /* close with a connection still open: the plugin releases it */
        assert_ok(a.it->send(a.self, srv, "x", 1, LONG_MS));
        pair_close(&a, l, cli, srv);
        unload(&a);
    }
}

/* A receiver with max_message=1K: a bigger message fails the receiver (tcp: RLX_E_FORMAT,
 * the frame is refused; grpc: the stream is cancelled) and no one hangs. */
static void test_receiver_limit_max_message(void **state) {
    (void)state;
    tr small, *t = &g_tr;
    assert_ok(load(&small, "max_message=1K"));
    void *l, *srv, *cli;
    char addr[128];
    assert_ok(listen_local(&small, &l, addr, sizeof addr));
    connect_pair(&small, l, t, addr, &cli, &srv);
    static uint8_t msg[2048];
    assert_ok(t->it->send(t->self, cli, msg, 1024, LONG_MS));
    void *d;
    size_t n;
    assert_ok(small.it->recv(small.self, srv, &d, &n, LONG_MS));
    assert_int_equal(n, 1024);
    free(d);
    assert_ok(t->it->send(t->self, cli, msg, 1025, LONG_MS));
    const int rc = small.it->recv(small.self, srv, &d, &n, LONG_MS);
    show_error("message over the receiver's max_message");
    assert_int_equal(rc, IS_TCP ? RLX_E_FORMAT : RLX_E_PEER);
    if (!IS_TCP) {
        /* the sender learns it from the stream's status; a message over its own limit is refused */
        assert_int_equal(t->it->recv(t->self, cli, &d, &n, LONG_MS), RLX_E_FORMAT);
        show_error("sender of an oversized message");
        assert_error_mentions("larger than max");
        assert_int_equal(small.it->send(small.self, srv, msg, 1025, LONG_MS), RLX_E_INVALID);
        assert_error_mentions("max_message");
    }
    t->it->conn_close(t->self, cli);
    small.it->conn_close(small.self, srv);
    small.it->listener_close(small.self, l);
    unload(&small);
}

static void test_plugin_unload_and_reload(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        unload(&g_tr);
        assert_ok(load(&g_tr, NULL));
        void *l, *cli, *srv;
        char addr[128];
        make_pair(&g_tr, &l, &cli, &srv, addr, sizeof addr);
        assert_ok(g_tr.it->send(g_tr.self, srv, "x", 1, LONG_MS));
        void *d;
        size_t n;
        assert_ok(g_tr.it->recv(g_tr.self, cli, &d, &n, LONG_MS));
        free(d);
        pair_close(&g_tr, l, cli, srv);
    }
}

/* Each transport meets a peer of the other kind: a clear error within the timeout, no hang.
 * Both directions run in the grpc binary: loading gRPC into the tcp binary would expose it to
 * LeakSanitizer's tracer crashing at exit while gRPC's threads wind down (seen once in CI). */
static void test_mismatched_transports_fail_cleanly(void **state) {
    (void)state;
    if (IS_TCP)
        skip();
    tr *t = &g_tr, other;
    memset(&other, 0, sizeof other);
    const char *other_path =
        IS_TCP ? RLX_BUILD_PLUGIN_DIR "/rlx-transport-grpc.so" : RLX_BUILD_PLUGIN_DIR "/rlx-transport-tcp.so";
    assert_ok(rlx_plugin_load(other_path, &other.h));
    other.it = rlx_plugin_desc(other.h)->iface;
    assert_ok(other.it->open(rlx_host_table(), NULL, &other.self));
    tr *tcp = IS_TCP ? t : &other, *grpc = IS_TCP ? &other : t;
    void *l, *conn, *d;
    size_t n;
    char addr[128];
    /* a tcp client at a grpc server: the HTTP/2 bytes are not an rlx frame */
    assert_ok(listen_local(grpc, &l, addr, sizeof addr));
    assert_ok(tcp->it->connect(tcp->self, addr, LONG_MS, &conn));
    assert_ok(tcp->it->send(tcp->self, conn, "hello", 5, LONG_MS));
    const int rc = tcp->it->recv(tcp->self, conn, &d, &n, LONG_MS);
    if (rc != RLX_E_FORMAT && rc != RLX_E_PEER)
        fail_msg("tcp client at a grpc server: %d %s", rc, rlx_last_error());
    show_error("tcp client at a grpc server");
    if (rc == RLX_E_FORMAT) /* the server's SETTINGS frame came first */
        assert_error_mentions("an HTTP/2 server");
    tcp->it->conn_close(tcp->self, conn);
    grpc->it->listener_close(grpc->self, l);
    /* a grpc client at a tcp server: the handshake never completes */
    assert_ok(listen_local(tcp, &l, addr, sizeof addr));
    const double t0 = now_ms();
    assert_int_equal(grpc->it->connect(grpc->self, addr, 1000, &conn), RLX_E_TIMEOUT);
    assert_true(now_ms() - t0 < 4000);
    show_error("grpc client at a tcp server");
    assert_error_mentions(addr);
    assert_error_mentions("accepted the connection but never answered the HTTP/2 handshake");
    tcp->it->listener_close(tcp->self, l);
    unload(&other);
}

// ---- peers in another process ----

static pid_t spawn_server_child(const char *mode, char *addr, size_t size) {
    int fd;
    const pid_t pid = spawn_child(mode, NULL, &fd);
    if (pid <= 0)
        return -1;
    FILE *f = fdopen(fd, "r");
    if (!f || !fgets(addr, (int)size, f))
        return -1;
    fclose(f);
    addr[strcspn(addr, "\n")] = '\0';
    return pid;
}

/* Waits until the process has slept (state S in /proc/PID/stat) for stable_ms on end: a process
 * that is only starved of CPU shows R, so a long sleep means it is blocked in a call. */
static bool wait_until_blocked(pid_t pid, int stable_ms, int deadline_ms) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    const double t0 = now_ms();
    double asleep_since = -1;
    while (now_ms() - t0 < deadline_ms) {
        char buf[512] = "";
        FILE *f = fopen(path, "r");
        if (!f)
            return false;
        const size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *close_paren = strrchr(buf, ')'); /* the command name may hold spaces */
        const bool asleep = close_paren && close_paren[1] == ' ' && close_paren[2] == 'S';
        if (!asleep)
            asleep_since = -1;
        else if (asleep_since < 0)
            asleep_since = now_ms();
        else if (now_ms() - asleep_since >= stable_ms)
            return true;
        sleep_ms(10);
    }
    return false;
}

/* The child connects, says hello, then streams 64 MiB messages until killed. */
static void test_peer_killed_mid_message(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *srv;
    char addr[128];
    assert_ok(listen_local(t, &l, addr, sizeof addr));
    const pid_t pid = spawn_child("stream-forever", addr, NULL);
    assert_true(pid > 0);
    assert_ok(t->it->accept(t->self, l, LONG_MS, &srv));
    void *d;
    size_t n;
    assert_ok(t->it->recv(t->self, srv, &d, &n, LONG_MS));
    assert_int_equal(n, 5);
    free(d);
    /* After the hello the child only runs until the buffers and windows are full: once it sleeps,
     * it is blocked mid-message. Under load it may take long to get there, so no fixed sleep. */
    assert_true(wait_until_blocked(pid, 300, 30000));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    /* Whole messages that arrived before the kill are delivered (gRPC may have read one while
     * this thread slept); the one cut short is an error. */
    const double t0 = now_ms();
    int rc, n_whole = 0;
    while ((rc = t->it->recv(t->self, srv, &d, &n, LONG_MS)) == RLX_OK) {
        assert_int_equal(n, 64u << 20);
        free(d);
        assert_true(++n_whole < 3);
    }
    if (rc != RLX_E_PEER)
        fail_msg("recv after the peer died: %d %s", rc, rlx_last_error());
    show_error("peer killed mid-message");
    assert_true(now_ms() - t0 < 5000);
    assert_error_mentions("127.0.0.1:");
    if (IS_TCP)
        assert_error_mentions("mid-frame");
    assert_int_equal(t->it->recv(t->self, srv, &d, &n, 1000), RLX_E_PEER); /* and stays failed */
    t->it->conn_close(t->self, srv);
    t->it->listener_close(t->self, l);
}

/* The child listens, then computes (sleeps) for 1.5 s before it accepts: connecting must not
 * depend on the listener's process being inside a transport call. */
static void test_connect_while_listener_process_is_busy(void **state) {
    (void)state;
    tr *t = &g_tr;
    char addr[128];
    const pid_t pid = spawn_server_child("busy-listener", addr, sizeof addr);
    assert_true(pid > 0);
    void *cli, *d;
    size_t n;
    const double t0 = now_ms();
    assert_ok(t->it->connect(t->self, addr, 1000, &cli));
    assert_true(now_ms() - t0 < 1000);
    assert_ok(t->it->send(t->self, cli, "ping", 4, LONG_MS));
    assert_ok(t->it->recv(t->self, cli, &d, &n, LONG_MS));
    assert_int_equal(n, 4);
    free(d);
    t->it->conn_close(t->self, cli);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* grpc only: a peer that freezes (SIGSTOP: its sockets stay open, nothing answers) is found
 * by keepalive pings while this side waits in recv with a long timeout. */
static void test_grpc_keepalive_detects_frozen_peer(void **state) {
    (void)state;
    tr t;
    assert_ok(load(&t, "keepalive_ms=300,keepalive_timeout_ms=700"));
    char addr[128];
    const pid_t pid = spawn_server_child("serve-then-freeze", addr, sizeof addr);
    assert_true(pid > 0);
    void *cli, *d;
    size_t n;
    assert_ok(t.it->connect(t.self, addr, LONG_MS, &cli));
    assert_ok(t.it->send(t.self, cli, "ping", 4, LONG_MS));
    assert_ok(t.it->recv(t.self, cli, &d, &n, LONG_MS));
    free(d);
    kill(pid, SIGSTOP);
    const double t0 = now_ms();
    const int rc = t.it->recv(t.self, cli, &d, &n, LONG_MS);
    const double dt = now_ms() - t0;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (rc != RLX_E_PEER)
        fail_msg("recv from a frozen peer: %d %s", rc, rlx_last_error());
    show_error("frozen peer");
    if (dt > 8000)
        fail_msg("the frozen peer was noticed only after %.0f ms", dt);
    t.it->conn_close(t.self, cli);
    unload(&t);
}

/* The child listens, receives one message and exits without closing anything. */
static void test_server_dies_client_sees_peer_error(void **state) {
    (void)state;
    tr *t = &g_tr;
    char addr[128];
    const pid_t pid = spawn_server_child("serve-once", addr, sizeof addr);
    assert_true(pid > 0);
    void *cli;
    assert_ok(t->it->connect(t->self, addr, LONG_MS, &cli));
    assert_ok(t->it->send(t->self, cli, "bye", 3, LONG_MS));
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    void *d;
    size_t n;
    const double t0 = now_ms();
    int rc = t->it->recv(t->self, cli, &d, &n, LONG_MS);
    if (rc != RLX_E_PEER)
        fail_msg("recv after the server died: %d %s", rc, rlx_last_error());
    show_error("server died");
    assert_true(now_ms() - t0 < 5000);
    assert_error_mentions(addr);
    /* a send may still be taken by the kernel (tcp) until the peer's reset comes back */
    for (int i = 0; i < 50 && (rc = t->it->send(t->self, cli, "more", 4, 2000)) == RLX_OK; i++)
        sleep_ms(10);
    assert_int_equal(rc, RLX_E_PEER);
    t->it->conn_close(t->self, cli);
}

/* Listens on 127.0.0.1 and tells the parent where, on stdout (spawn_server_child reads it). */
static int listen_and_tell(tr *t, void **l) {
    char bound[128];
    const int rc = listen_local(t, l, bound, sizeof bound);
    if (rc < 0)
        return rc;
    printf("%s\n", bound);
    fflush(stdout);
    return rc;
}

static int child_main(const char *mode, const char *addr) {
    alarm(60);
    tr t;
    if (load(&t, NULL) < 0) {
        fprintf(stderr, "child: %s\n", rlx_last_error());
        return 2;
    }
    if (!strcmp(mode, "stream-forever")) {
        void *conn;
        if (t.it->connect(t.self, addr, LONG_MS, &conn) < 0 || t.it->send(t.self, conn, "hello", 5, LONG_MS) < 0) {
            fprintf(stderr, "child: %s\n", rlx_last_error());
            return 3;
        }
        const size_t size = 64u << 20;
        uint8_t *msg = calloc(1, size);
        for (;;)
            if (t.it->send(t.self, conn, msg, size, LONG_MS) < 0) {
                fprintf(stderr, "child: %s\n", rlx_last_error());
                return 4;
            }
    }
    if (!strcmp(mode, "serve-once")) {
        void *l, *conn, *d;
        size_t n;
        if (listen_and_tell(&t, &l) < 0)
            return 5;
        if (t.it->accept(t.self, l, LONG_MS, &conn) < 0 || t.it->recv(t.self, conn, &d, &n, LONG_MS) < 0) {
            fprintf(stderr, "child: %s\n", rlx_last_error());
            return 6;
        }
        _exit(0); /* no close, no cleanup: the process just vanishes */
    }
    if (!strcmp(mode, "serve-then-freeze")) {
        void *l, *conn, *d;
        size_t n;
        if (listen_and_tell(&t, &l) < 0)
            return 5;
        if (t.it->accept(t.self, l, LONG_MS, &conn) < 0 || t.it->recv(t.self, conn, &d, &n, LONG_MS) < 0 ||
            t.it->send(t.self, conn, d, n, LONG_MS) < 0)
            return 6;
        free(d);
        sleep_ms(60000); /* the parent stops, then kills this process */
        return 7;
    }
    if (!strcmp(mode, "busy-listener")) {
        void *l, *conn, *d;
        size_t n;
        if (listen_and_tell(&t, &l) < 0)
            return 5;
        sleep_ms(1500);
        if (t.it->accept(t.self, l, LONG_MS, &conn) < 0 || t.it->recv(t.self, conn, &d, &n, LONG_MS) < 0 ||
            t.it->send(t.self, conn, d, n, LONG_MS) < 0) {
            fprintf(stderr, "child: %s\n", rlx_last_error());
            return 6;
        }
        free(d);
        void *d2;
        if (t.it->recv(t.self, conn, &d2, &n, LONG_MS) != RLX_E_PEER) /* the parent closes */
            return 7;
        t.it->conn_close(t.self, conn);
        t.it->listener_close(t.self, l);
        unload(&t);
        return 0;
    }
    return 1;
}

// ---- tcp wire format, from a raw socket ----

static void raw_name(int fd, char *buf, size_t size) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    snprintf(buf, size, "127.0.0.1:%u", ntohs(a.sin_port));
}

/* Accepts a raw connection, writes bytes on it, and expects recv to fail with rc. */
static void expect_bad_frame(tr *t, const void *bytes, size_t n, int rc, const char *cause) {
    void *l, *srv;
    char addr[128], peer[64];
    const int fd = raw_pair(t, &l, addr, sizeof addr, &srv);
    raw_name(fd, peer, sizeof peer);
    assert_int_equal(send(fd, bytes, n, MSG_NOSIGNAL), (ssize_t)n);
    void *d = (void *)&d;
    size_t len;
    const int got = t->it->recv(t->self, srv, &d, &len, LONG_MS);
    if (got != rc)
        fail_msg("want %d, got %d: %s", rc, got, rlx_last_error());
    show_error("bad frame");
    assert_null(d);
    assert_error_mentions(peer);
    assert_error_mentions(cause);
    assert_int_equal(t->it->recv(t->self, srv, &d, &len, 100), rc); /* the stream stays unusable */
    close(fd);
    t->it->conn_close(t->self, srv);
    t->it->listener_close(t->self, l);
}

static void test_tcp_rejects_corrupt_frames(void **state) {
    (void)state;
    tr *t = &g_tr;
    uint8_t f[24 + 4];
    memcpy(f + 24, "data", 4);
    const uint32_t good = crc32c("data", 4);

    make_header(f, 1, 0, 4, good);
    memcpy(f, "HTTP", 4);
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT, "magic");

    make_header(f, 2, 0, 4, good);
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT, "version 2");

    make_header(f, 1, 0, 4, good);
    f[12] ^= 1; /* the length's high bytes change: only the header checksum catches it */
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT, "header checksum");

    make_header(f, 1, 0, 4, good);
    f[25] ^= 0x20;
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT, "payload checksum");
    f[25] ^= 0x20;

    make_header(f, 1, 0x8000, 4, good);
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT, "flags");

    make_header(f, 1, 0, 1ull << 40, good);
    expect_bad_frame(t, f, 24, RLX_E_FORMAT, "exceeds the limit of 4294967296");

    /* without TLS a frame must carry its payload checksum: a peer that left it out is refused */
    make_header(f, 1, 1 /* no payload checksum */, 4, 0);
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT,
                     "has no payload checksum, which this endpoint requires (the default without TLS)");
}

static void test_tcp_max_message_option(void **state) {
    (void)state;
    tr small, *t = &g_tr;
    assert_ok(load(&small, "max_message=1K,checksum=off"));
    void *l, *srv, *cli;
    char addr[128];
    assert_ok(listen_local(&small, &l, addr, sizeof addr));
    connect_pair(&small, l, t, addr, &cli, &srv);
    uint8_t msg[2048] = {1};
    assert_ok(t->it->send(t->self, cli, msg, 1024, LONG_MS));
    assert_ok(t->it->send(t->self, cli, msg, 1025, LONG_MS));
    void *d;
    size_t n;
    assert_ok(small.it->recv(small.self, srv, &d, &n, LONG_MS));
    assert_int_equal(n, 1024);
    free(d);
    assert_int_equal(small.it->recv(small.self, srv, &d, &n, LONG_MS), RLX_E_FORMAT);
    assert_error_mentions("1025 bytes exceeds the limit of 1024");
    /* the other way: a frame without a payload checksum is refused by an endpoint that checks
     * every one, with what to change */
    assert_ok(small.it->send(small.self, srv, "nocrc", 5, LONG_MS));
    assert_int_equal(t->it->recv(t->self, cli, &d, &n, LONG_MS), RLX_E_FORMAT);
    assert_error_mentions("has no payload checksum, which this endpoint requires (the default without TLS): give "
                          "both ends the same option checksum=on|off");
    t->it->conn_close(t->self, cli);
    small.it->conn_close(small.self, srv);
    small.it->listener_close(small.self, l);
    /* checksum=off still checks a payload checksum that a frame carries */
    uint8_t f[24 + 4];
    memcpy(f + 24, "data", 4);
    make_header(f, 1, 0, 4, crc32c("data", 4));
    f[26] ^= 0x01;
    expect_bad_frame(&small, f, sizeof f, RLX_E_FORMAT, "payload checksum");
    unload(&small);
}

static void test_tcp_peer_closes_mid_frame(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *srv;
    char addr[128], peer[64];
    const int fd = raw_pair(t, &l, addr, sizeof addr, &srv);
    raw_name(fd, peer, sizeof peer);
    uint8_t f[24 + 10] = {0};
    make_header(f, 1, 0, 1000, 0);
    assert_int_equal(send(fd, f, sizeof f, MSG_NOSIGNAL), (ssize_t)sizeof f);
    /* the frame is incomplete: recv times out, keeps what it has, and the next recv resumes */
    void *d;
    size_t n;
    assert_int_equal(t->it->recv(t->self, srv, &d, &n, 200), RLX_E_TIMEOUT);
    assert_error_mentions("10 of 1000");
    close(fd);
    assert_int_equal(t->it->recv(t->self, srv, &d, &n, LONG_MS), RLX_E_PEER);
    char want[128];
    snprintf(want, sizeof want, "peer %s closed the connection mid-frame", peer);
    assert_error_mentions(want);
    show_error("closed mid-frame");
    t->it->conn_close(t->self, srv);
    t->it->listener_close(t->self, l);
}

static void test_tcp_frame_resumes_after_timeout(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *srv;
    char addr[128];
    const int fd = raw_pair(t, &l, addr, sizeof addr, &srv);
    uint8_t payload[300000];
    fill(payload, sizeof payload, 9);
    uint8_t h[24];
    make_header(h, 1, 0, sizeof payload, crc32c(payload, sizeof payload));
    void *d;
    size_t n;
    /* header in two pieces, then the payload in three, with a timed-out recv between each */
    const size_t cuts[] = {0, 11, 24, 24 + 70000, 24 + 200000, 24 + sizeof payload};
    for (int i = 0; i + 1 < 6; i++) {
        size_t from = cuts[i], to = cuts[i + 1];
        while (from < to) {
            const size_t k = from < 24 ? (to < 24 ? to : 24) - from : to - from;
            const void *src = from < 24 ? (const void *)(h + from) : (const void *)(payload + from - 24);
            assert_int_equal(send(fd, src, k, MSG_NOSIGNAL), (ssize_t)k);
            from += k;
        }
        if (i + 2 < 6)
            assert_int_equal(t->it->recv(t->self, srv, &d, &n, 100), RLX_E_TIMEOUT);
    }
    assert_ok(t->it->recv(t->self, srv, &d, &n, LONG_MS));
    assert_int_equal(n, sizeof payload);
    assert_memory_equal(d, payload, sizeof payload);
    free(d);
    close(fd);
    t->it->conn_close(t->self, srv);
    t->it->listener_close(t->self, l);
}

static void test_tcp_wire_format(void **state) {
    (void)state;
    tr *t = &g_tr;
    void *l, *cli;
    char addr[128];
    assert_ok(listen_local(t, &l, addr, sizeof addr));
    /* a raw server: accept with the plain socket API */
    char raddr[64];
    const int lfd = raw_listen(raddr, sizeof raddr);
    assert_true(lfd >= 0);
    assert_ok(t->it->connect(t->self, raddr, LONG_MS, &cli));
    const int fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    assert_ok(t->it->send(t->self, cli, "123456789", 9, LONG_MS));
    uint8_t f[33];
    size_t got = 0;
    while (got < sizeof f) {
        const ssize_t k = recv(fd, f + got, sizeof f - got, 0);
        assert_true(k > 0);
        got += (size_t)k;
    }
    uint16_t version, flags;
    uint64_t len;
    uint32_t pcrc, hcrc;
    memcpy(&version, f + 4, 2);
    memcpy(&flags, f + 6, 2);
    memcpy(&len, f + 8, 8);
    memcpy(&pcrc, f + 16, 4);
    memcpy(&hcrc, f + 20, 4);
    assert_memory_equal(f, "RLXT", 4);
    assert_int_equal(version, 1);
    assert_int_equal(flags, 0);
    assert_int_equal(len, 9);
    assert_int_equal(pcrc, 0xE3069283u); /* the CRC32C check value of "123456789" */
    assert_int_equal(hcrc, crc32c(f, 20));
    assert_memory_equal(f + 24, "123456789", 9);
    /* that very frame with one payload byte flipped is refused */
    f[24 + 4] ^= 0x04;
    expect_bad_frame(t, f, sizeof f, RLX_E_FORMAT, "payload checksum");
    /* a payload long enough for the multi-stream CRC, checked against the bitwise one here */
    const size_t big = 300001;
    uint8_t *msg = malloc(big), *in = malloc(24 + big);
    fill(msg, big, 5);
    assert_ok(t->it->send(t->self, cli, msg, big, LONG_MS));
    for (got = 0; got < 24 + big;) {
        const ssize_t k = recv(fd, in + got, 24 + big - got, 0);
        assert_true(k > 0);
        got += (size_t)k;
    }
    memcpy(&len, in + 8, 8);
    memcpy(&pcrc, in + 16, 4);
    assert_int_equal(len, big);
    assert_int_equal(pcrc, crc32c(msg, big));
    assert_memory_equal(in + 24, msg, big);
    free(msg);
    free(in);
    close(fd);
    close(lfd);
    t->it->conn_close(t->self, cli);
    t->it->listener_close(t->self, l);
}

/* Warnings and errors the plugins log (gRPC's own included) show in the test output. */
static void log_to_stderr(void *ctx, int level, const char *message) {
    (void)ctx;
    if (level <= RLX_LOG_WARN || getenv("RLX_TEST_VERBOSE"))
        fprintf(stderr, "  log[%d] %s\n", level, message);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child"))
        return child_main(argv[2], argv[3]);
    /* SIGPIPE keeps its default action: a plugin that let one through would kill the test. */
    rlx_log_set_handler(log_to_stderr, NULL);
    alarm(280); /* a hang ends the run (ctest's TIMEOUT is the outer guard) */
    const struct CMUnitTest common[] = {
        cmocka_unit_test(test_echo_small_and_odd_sizes),
        cmocka_unit_test(test_echo_64mib),
        cmocka_unit_test(test_message_order),
        cmocka_unit_test(test_concurrent_connections),
        cmocka_unit_test(test_accept_times_out),
        cmocka_unit_test(test_recv_times_out_and_conn_survives),
        cmocka_unit_test(test_connect_to_nobody_fails_in_time),
        cmocka_unit_test(test_connect_retries_until_listener_appears),
        cmocka_unit_test(test_send_times_out_when_peer_does_not_read),
        cmocka_unit_test(test_close_delivers_what_was_sent),
        cmocka_unit_test(test_listen_twice_on_one_port_fails),
        cmocka_unit_test(test_bad_addresses_and_options),
        cmocka_unit_test(test_ipv6_and_host_names),
        cmocka_unit_test(test_open_close_many_instances),
        cmocka_unit_test(test_receiver_limit_max_message),
        cmocka_unit_test(test_plugin_unload_and_reload),
        cmocka_unit_test(test_mismatched_transports_fail_cleanly),
        cmocka_unit_test(test_peer_killed_mid_message),
        cmocka_unit_test(test_connect_while_listener_process_is_busy),
        cmocka_unit_test(test_server_dies_client_sees_peer_error),
    };
    const struct CMUnitTest tcp_only[] = {
        cmocka_unit_test(test_tcp_rejects_corrupt_frames),
        cmocka_unit_test(test_tcp_max_message_option),
        cmocka_unit_test(test_tcp_peer_closes_mid_frame),
        cmocka_unit_test(test_tcp_frame_resumes_after_timeout),
        cmocka_unit_test(test_tcp_wire_format),
    };
    const struct CMUnitTest grpc_only[] = {
        cmocka_unit_test(test_grpc_keepalive_detects_frozen_peer),
    };
    int failed = cmocka_run_group_tests_name(TRANSPORT_PLUGIN, common, group_setup, group_teardown);
    if (IS_TCP)
        failed += cmocka_run_group_tests_name("tcp wire format", tcp_only, group_setup, group_teardown);
    else
        failed += cmocka_run_group_tests_name("grpc keepalive", grpc_only, NULL, NULL);
    return failed;
}
