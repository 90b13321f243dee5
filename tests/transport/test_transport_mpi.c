/* The mpi transport between two ranks of one job: run as `mpirun -n 2 test_transport_mpi`. Both
 * ranks run the same cases in order, rank 0 as the connecting side, rank 1 as the listening
 * one; a control connection opened by the group setup keeps the two in step (sync). Messages
 * are cut into pieces of 1000 bytes (option chunk), so a few kilobytes already take the path a
 * message of several GiB takes. Exit 77 (skip) when not started by mpirun. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define PLUGIN_PATH RLX_BUILD_PLUGIN_DIR "/rlx-transport-mpi.so"
#include "transport/transport_test.h"

static tr g_tr;
static int g_rank;
static void *g_listener; /* rank 1's */
static void *g_ctl;      /* the control connection */

/* Rank 0 connects to rank 1, rank 1 accepts. */
static void *pair(const tr *t) {
    void *c = NULL;
    if (g_rank == 0)
        assert_ok(t->it->connect(t->self, "rank:1", LONG_MS, &c));
    else
        assert_ok(g_tr.it->accept(g_tr.self, g_listener, LONG_MS, &c));
    assert_non_null(c);
    return c;
}

static void send_bytes(const tr *t, void *c, const void *data, size_t len) {
    assert_ok(t->it->send(t->self, c, data, len, LONG_MS));
}

/* Receives one message and checks it is want (len bytes). */
static void expect_bytes(const tr *t, void *c, const void *want, size_t len) {
    void *data = NULL;
    size_t got = 0;
    assert_ok(t->it->recv(t->self, c, &data, &got, LONG_MS));
    assert_int_equal(got, len);
    if (len)
        assert_memory_equal(data, want, len);
    rlx_host_table()->free(data);
}

/* Both ranks pass here before either goes on. */
static void sync_ranks(void) {
    static const char word[] = "sync";
    if (g_rank == 0) {
        send_bytes(&g_tr, g_ctl, word, sizeof word);
        expect_bytes(&g_tr, g_ctl, word, sizeof word);
    } else {
        expect_bytes(&g_tr, g_ctl, word, sizeof word);
        send_bytes(&g_tr, g_ctl, word, sizeof word);
    }
}

static uint8_t *pattern(size_t len, unsigned seed) {
    uint8_t *p = malloc(len ? len : 1);
    assert_non_null(p);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 131 + seed + (i >> 8));
    return p;
}

static int group_setup(void **state) {
    (void)state;
    if (load(&g_tr, "chunk=1000") < 0) {
        fprintf(stderr, "cannot open the mpi transport: %s\n", rlx_last_error());
        return -1;
    }
    if (g_rank == 1 && g_tr.it->listen(g_tr.self, "rank:1", &g_listener) < 0) {
        fprintf(stderr, "rank 1 cannot listen: %s\n", rlx_last_error());
        return -1;
    }
    g_ctl = pair(&g_tr);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    sync_ranks(); /* neither closes while the other still waits on the control connection */
    g_tr.it->conn_close(g_tr.self, g_ctl);
    if (g_listener)
        g_tr.it->listener_close(g_tr.self, g_listener);
    unload(&g_tr);
    return 0;
}

// ---- cases ----

static void test_echo_sizes_in_pieces(void **state) {
    (void)state;
    static const size_t sizes[] = {0, 1, 999, 1000, 1001, 4096, 3000007};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = pattern(sizes[i], (unsigned)i);
        if (g_rank == 0) {
            send_bytes(&g_tr, g_ctl, p, sizes[i]);
            expect_bytes(&g_tr, g_ctl, p, sizes[i]);
        } else {
            expect_bytes(&g_tr, g_ctl, p, sizes[i]);
            send_bytes(&g_tr, g_ctl, p, sizes[i]);
        }
        free(p);
    }
}

/* The receiver cuts its receives by the sender's piece size, whatever its own option says. */
static void test_pieces_of_the_senders_size(void **state) {
    (void)state;
    tr other;
    const tr *t = &g_tr;
    if (g_rank == 0) {
        assert_ok(load(&other, "chunk=333"));
        t = &other;
    }
    void *c = pair(t);
    uint8_t *p = pattern(10000, 7);
    if (g_rank == 0)
        send_bytes(t, c, p, 10000);
    else
        expect_bytes(t, c, p, 10000);
    free(p);
    sync_ranks();
    t->it->conn_close(t->self, c);
    if (g_rank == 0)
        unload(&other);
}

static void test_recv_times_out_and_conn_survives(void **state) {
    (void)state;
    if (g_rank == 0) {
        void *data = NULL;
        size_t len = 0;
        const double t0 = now_ms();
        assert_int_equal(g_tr.it->recv(g_tr.self, g_ctl, &data, &len, 300), RLX_E_TIMEOUT);
        const double took = now_ms() - t0;
        assert_true(took >= 290 && took < 3000);
        assert_null(data);
        assert_error_mentions("no message from rank 1 within 300 ms");
    }
    sync_ranks();
    test_echo_sizes_in_pieces(state);
}

static void test_accept_times_out(void **state) {
    (void)state;
    if (g_rank == 1) {
        void *c = (void *)&c;
        const double t0 = now_ms();
        assert_int_equal(g_tr.it->accept(g_tr.self, g_listener, 200, &c), RLX_E_TIMEOUT);
        assert_true(now_ms() - t0 < 3000);
        assert_null(c);
    }
    sync_ranks();
}

/* A connect that nobody accepts in time fails by its deadline; when the request is accepted
 * later after all, that connection reads as closed. */
static void test_connect_times_out_then_reads_closed(void **state) {
    (void)state;
    void *c = (void *)&c;
    if (g_rank == 0) {
        const double t0 = now_ms();
        assert_int_equal(g_tr.it->connect(g_tr.self, "rank:1", 300, &c), RLX_E_TIMEOUT);
        assert_true(now_ms() - t0 < 3000);
        assert_null(c);
        assert_error_mentions("did not accept the connection within 300 ms");
    }
    sync_ranks();
    if (g_rank == 1) {
        assert_ok(g_tr.it->accept(g_tr.self, g_listener, LONG_MS, &c));
        void *data = NULL;
        size_t len = 0;
        assert_int_equal(g_tr.it->recv(g_tr.self, c, &data, &len, LONG_MS), RLX_E_PEER);
        assert_error_mentions("closed the connection");
        g_tr.it->conn_close(g_tr.self, c);
    }
    sync_ranks();
}

static void test_close_delivers_what_was_sent(void **state) {
    (void)state;
    void *c = pair(&g_tr);
    static const char last[] = "last words";
    if (g_rank == 0) {
        send_bytes(&g_tr, c, last, sizeof last);
        g_tr.it->conn_close(g_tr.self, c);
    } else {
        expect_bytes(&g_tr, c, last, sizeof last);
        void *data = NULL;
        size_t len = 0;
        assert_int_equal(g_tr.it->recv(g_tr.self, c, &data, &len, LONG_MS), RLX_E_PEER);
        assert_error_mentions("peer rank 0 closed the connection");
        /* and it stays closed */
        assert_int_equal(g_tr.it->recv(g_tr.self, c, &data, &len, 10), RLX_E_PEER);
        g_tr.it->conn_close(g_tr.self, c);
    }
    sync_ranks();
}

static void test_bad_addresses_and_options(void **state) {
    (void)state;
    void *x = NULL;
    char other[32];
    snprintf(other, sizeof other, "rank:%d", 1 - g_rank);
    assert_int_equal(g_tr.it->listen(g_tr.self, other, &x), RLX_E_INVALID);
    assert_error_mentions("this process is rank");
    assert_int_equal(g_tr.it->listen(g_tr.self, "127.0.0.1:7101", &x), RLX_E_INVALID);
    assert_error_mentions("want rank:K");
    assert_int_equal(g_tr.it->connect(g_tr.self, "rank:7", 100, &x), RLX_E_NOT_FOUND);
    assert_error_mentions("the MPI job has 2 ranks");
    assert_int_equal(g_tr.it->connect(g_tr.self, "host:7101", 100, &x), RLX_E_INVALID);
    if (g_rank == 1) {
        assert_int_equal(g_tr.it->listen(g_tr.self, "rank:1", &x), RLX_E_IO);
        assert_error_mentions("in use");
        char bound[32];
        assert_ok(g_tr.it->bound_address(g_tr.self, g_listener, bound, sizeof bound));
        assert_string_equal(bound, "rank:1");
    }
    void *self = (void *)&self;
    assert_int_equal(g_tr.it->open(rlx_host_table(), "chunk=0", &self), RLX_E_INVALID);
    assert_null(self);
    assert_int_equal(g_tr.it->open(rlx_host_table(), "bogus=1", &self), RLX_E_INVALID);
    assert_error_mentions("unknown option");
    sync_ranks();
}

/* The connecting end of test_connection_to_self, on its own thread: a send completes only
 * while its receiver receives, as between two ranks. Results are checked on the main thread. */
typedef struct self_client {
    const uint8_t *p, *q;
    int rc_connect, rc_send, rc_recv, q_ok;
} self_client;

static void *self_client_run(void *arg) {
    self_client *sc = arg;
    void *c = NULL, *data = NULL;
    size_t len = 0;
    if ((sc->rc_connect = g_tr.it->connect(g_tr.self, "rank:0", LONG_MS, &c)) < 0)
        return NULL;
    sc->rc_send = g_tr.it->send(g_tr.self, c, sc->p, 5000, LONG_MS);
    sc->rc_recv = g_tr.it->recv(g_tr.self, c, &data, &len, LONG_MS);
    sc->q_ok = sc->rc_recv == RLX_OK && len == 2500 && memcmp(data, sc->q, len) == 0;
    rlx_host_table()->free(data);
    g_tr.it->conn_close(g_tr.self, c);
    return NULL;
}

/* A rank connects to itself: the two ends of one connection in one process stay apart. */
static void test_connection_to_self(void **state) {
    (void)state;
    if (g_rank == 0) {
        void *l = NULL, *server = NULL;
        assert_ok(g_tr.it->listen(g_tr.self, "rank:0", &l));
        uint8_t *p = pattern(5000, 3), *q = pattern(2500, 4);
        self_client sc = {.p = p, .q = q};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, self_client_run, &sc), 0);
        const int rc = g_tr.it->accept(g_tr.self, l, LONG_MS, &server);
        if (rc == RLX_OK) {
            expect_bytes(&g_tr, server, p, 5000);
            send_bytes(&g_tr, server, q, 2500);
        }
        pthread_join(th, NULL);
        assert_ok(rc);
        assert_ok(sc.rc_connect);
        assert_ok(sc.rc_send);
        assert_true(sc.q_ok);
        free(p);
        free(q);
        g_tr.it->conn_close(g_tr.self, server);
        g_tr.it->listener_close(g_tr.self, l);
    }
    sync_ranks();
}

int main(void) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK"), *size = getenv("OMPI_COMM_WORLD_SIZE");
    if (!rank || !size || strcmp(size, "2") != 0) {
        printf("SKIP: run under mpirun -n 2 (OMPI_COMM_WORLD_RANK/SIZE are not set for 2 ranks)\n");
        return 77;
    }
    g_rank = atoi(rank);
    alarm(280); /* a hang ends the run (ctest's TIMEOUT is the outer guard) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_echo_sizes_in_pieces),
        cmocka_unit_test(test_pieces_of_the_senders_size),
        cmocka_unit_test(test_recv_times_out_and_conn_survives),
        cmocka_unit_test(test_accept_times_out),
        cmocka_unit_test(test_connect_times_out_then_reads_closed),
        cmocka_unit_test(test_close_delivers_what_was_sent),
        cmocka_unit_test(test_bad_addresses_and_options),
        cmocka_unit_test(test_connection_to_self),
    };
    char name[32];
    snprintf(name, sizeof name, "mpi rank %d", g_rank);
    return cmocka_run_group_tests_name(name, tests, group_setup, group_teardown);
}
