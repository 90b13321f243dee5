/* What the transport tests share: a transport plugin loaded from the build tree and one instance
 * of it opened, listeners on the loopback and connections to them, an echo server on its own
 * thread, round trips of bytes the receiver can check, raw sockets and tcp frame headers for the
 * cases that play a peer by hand, and peers spawned from the test's own executable. Include it
 * after testutil.h (its helpers assert with cmocka, on the main thread only; the threads they
 * start record what happened) and define PLUGIN_PATH (the plugin's file) first. */
#ifndef RLX_TRANSPORT_TEST_H
#define RLX_TRANSPORT_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rlx/transport.h"

extern char **environ;

#define LONG_MS 20000 /* waits that must succeed: generous for ASan on a busy machine */

typedef struct tr {
    rlx_plugin_handle *h;
    const rlx_transport_iface *it;
    void *self;
} tr;

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void sleep_ms(int ms) {
    const struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

// ---- the plugin ----

/* Loads PLUGIN_PATH and opens an instance with options; on failure nothing stays loaded. */
static inline int load(tr *t, const char *options) {
    memset(t, 0, sizeof *t);
    int rc = rlx_plugin_load(PLUGIN_PATH, &t->h);
    if (rc < 0)
        return rc;
    t->it = rlx_plugin_desc(t->h)->iface;
    rc = t->it->open(rlx_host_table(), options, &t->self);
    if (rc < 0) {
        rlx_plugin_unload(t->h);
        t->h = NULL;
    }
    return rc;
}

/* load, for an instance the case cannot do without. */
static inline void load_ok(tr *t, const char *options) {
    if (load(t, options) < 0)
        fail_msg("open with '%s' failed: %s", options ? options : "", rlx_last_error());
}

static inline void unload(tr *t) {
    if (t->self)
        t->it->close(t->self);
    rlx_plugin_unload(t->h);
    memset(t, 0, sizeof *t);
}

// ---- listeners and connections on the loopback ----

/* Listens on 127.0.0.1 at a port the kernel picks, and puts that address in addr. */
static inline int listen_local(tr *t, void **l, char *addr, size_t size) {
    const int rc = t->it->listen(t->self, "127.0.0.1:0", l);
    return rc < 0 ? rc : t->it->bound_address(t->self, *l, addr, size);
}

/* A connection from client to server's listener l at addr: the client's end and the accepted one. */
static inline void connect_pair(tr *server, void *l, tr *client, const char *addr, void **cli, void **srv) {
    assert_ok(client->it->connect(client->self, addr, LONG_MS, cli));
    assert_ok(server->it->accept(server->self, l, LONG_MS, srv));
}

/* A listener of t on 127.0.0.1, a client connection to it from t and the accepted server side. */
static inline void make_pair(tr *t, void **l, void **cli, void **srv, char *addr, size_t size) {
    assert_ok(listen_local(t, l, addr, size));
    connect_pair(t, *l, t, addr, cli, srv);
}

/* Closes both ends of a pair and its listener. */
static inline void pair_close(tr *t, void *l, void *cli, void *srv) {
    t->it->conn_close(t->self, cli);
    t->it->conn_close(t->self, srv);
    t->it->listener_close(t->self, l);
}

/* A loopback port nothing listens on (bound, read and released). */
static inline int free_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    const int ok =
        fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    if (fd >= 0)
        close(fd);
    return ok ? ntohs(a.sin_port) : -1;
}

/* Listens on addr (a port free_port found, say) after delay_ms, as a stage still loading its
 * weights would, and accepts one connection; run it on its own thread. */
typedef struct late_listener {
    tr *t;
    char addr[64];
    int delay_ms, rc;
    void *l, *conn;
} late_listener;

static inline void *late_listener_main(void *arg) {
    late_listener *ll = arg;
    sleep_ms(ll->delay_ms);
    if ((ll->rc = ll->t->it->listen(ll->t->self, ll->addr, &ll->l)) == RLX_OK)
        ll->rc = ll->t->it->accept(ll->t->self, ll->l, LONG_MS, &ll->conn);
    return NULL;
}

// ---- an echo server on its own thread ----

/* Sends hello first if set, then echoes each message on conn back until an error ends it;
 * records that error and how many went back, then closes conn. */
typedef struct echo {
    tr *t;
    void *conn;
    const char *hello;
    int n;  /* messages echoed */
    int rc; /* the status that ended it */
    char error[512];
    pthread_t tid;
} echo;

static inline void *echo_main(void *arg) {
    echo *e = arg;
    tr *t = e->t;
    int rc = e->hello ? t->it->send(t->self, e->conn, e->hello, strlen(e->hello), LONG_MS) : RLX_OK;
    while (rc == RLX_OK) {
        void *d;
        size_t n;
        rc = t->it->recv(t->self, e->conn, &d, &n, LONG_MS);
        if (rc == RLX_OK) {
            rc = t->it->send(t->self, e->conn, d, n, LONG_MS);
            free(d);
            e->n += rc == RLX_OK;
        }
    }
    e->rc = rc;
    snprintf(e->error, sizeof e->error, "%s", rlx_last_error());
    t->it->conn_close(t->self, e->conn);
    return NULL;
}

static inline void echo_start(echo *e, tr *t, void *conn) {
    memset(e, 0, sizeof *e);
    e->t = t;
    e->conn = conn;
    assert_int_equal(pthread_create(&e->tid, NULL, echo_main, e), 0);
}

/* Joins the echo thread, which must have ended because the client closed its side. */
static inline void echo_join(echo *e, int want_n) {
    pthread_join(e->tid, NULL);
    if (e->rc != RLX_E_PEER)
        fail_msg("echo server ended with %d: %s", e->rc, e->error);
    assert_int_equal(e->n, want_n);
}

// ---- bytes the receiver can check ----

/* Deterministic bytes for message seed (xorshift), so the receiver can check them. */
static inline void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)(i * 31 + seed);
}

/* Sends size bytes made by fill(seed) on conn to an echo server and receives them back, the same
 * bytes; returns the buffer recv handed over, which the caller frees. */
static inline void *echo_back(tr *t, void *conn, size_t size, uint64_t seed) {
    uint8_t *msg = malloc(size ? size : 1);
    assert_non_null(msg);
    fill(msg, size, seed);
    assert_ok(t->it->send(t->self, conn, msg, size, LONG_MS));
    void *back;
    size_t n;
    assert_ok(t->it->recv(t->self, conn, &back, &n, 60000));
    assert_int_equal(n, size);
    assert_true(size == 0 || memcmp(back, msg, size) == 0);
    free(msg);
    return back;
}

static inline void roundtrip(tr *t, void *conn, size_t size, uint64_t seed) { free(echo_back(t, conn, size, seed)); }

// ---- raw sockets and tcp frames, for a peer played by hand ----

/* A plain TCP connection to the loopback at addr's port, or -1. */
static inline int raw_connect(const char *addr) {
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* A listener of t on 127.0.0.1, a raw socket connected to it and the accepted end; returns the
 * socket. */
static inline int raw_pair(tr *t, void **l, char *addr, size_t size, void **srv) {
    assert_ok(listen_local(t, l, addr, size));
    const int fd = raw_connect(addr);
    assert_true(fd >= 0);
    assert_ok(t->it->accept(t->self, *l, LONG_MS, srv));
    return fd;
}

/* A raw listening socket on 127.0.0.1, or -1; its address goes to addr. */
static inline int raw_listen(char *addr, size_t size) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    snprintf(addr, size, "127.0.0.1:%u", ntohs(a.sin_port));
    return fd;
}

static inline uint32_t crc32c(const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t c = ~0u;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

/* A frame header as the tcp plugin writes it (little-endian; these tests run on x86-64/aarch64). */
static inline void make_header(uint8_t h[24], uint16_t version, uint16_t flags, uint64_t len, uint32_t pcrc) {
    memcpy(h, "RLXT", 4);
    memcpy(h + 4, &version, 2);
    memcpy(h + 6, &flags, 2);
    memcpy(h + 8, &len, 8);
    memcpy(h + 16, &pcrc, 4);
    const uint32_t hcrc = crc32c(h, 20);
    memcpy(h + 20, &hcrc, 4);
}

// ---- a peer in another process ----

/* Runs this executable again as `--child MODE ARG` (ARG "-" for NULL); with out_fd, the child's
 * stdout is readable from *out_fd. Returns the child's pid, or -1. */
static inline pid_t spawn_child(const char *mode, const char *arg, int *out_fd) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    int pfd[2] = {-1, -1};
    if (out_fd && pipe(pfd) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (out_fd) {
        posix_spawn_file_actions_adddup2(&fa, pfd[1], STDOUT_FILENO);
        posix_spawn_file_actions_addclose(&fa, pfd[0]);
    }
    char *argv[] = {self, "--child", (char *)mode, (char *)(arg ? arg : "-"), NULL};
    pid_t pid;
    const int rc = posix_spawn(&pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (out_fd) {
        close(pfd[1]);
        *out_fd = pfd[0];
    }
    return rc == 0 ? pid : -1;
}

#endif
