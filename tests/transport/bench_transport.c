/* Transport micro-benchmark (not a test): for each transport plugin, a server in a second
 * process (this executable, spawned with --serve) and a client here measure
 *   - 4 KiB ping-pong: median and p99 round trip in microseconds;
 *   - 8 MiB one way plus an 8-byte ack: MB/s (MB = 1e6 bytes) from the median time;
 *   - 8 MiB echo: MB/s counting both directions.
 * Usage: rlx_transport_bench [--iters N] [--reps N] [--inproc] [plugin[:options]...]
 * (default plugins: tcp grpc). The machine notes in DEPENDENCIES.md apply: small-message
 * latency is lower when the VM is busy, so compare runs made under the same conditions. */
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rlx/rlx.h"
#include "rlx/transport.h"

extern char **environ;

typedef struct tr {
    rlx_plugin_handle *h;
    const rlx_transport_iface *it;
    void *self;
} tr;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* "grpc:poller=off" -> plugin "grpc", options "poller=off" */
static int load(tr *t, const char *spec) {
    char name[64], path[512];
    const char *colon = strchr(spec, ':');
    snprintf(name, sizeof name, "%.*s", colon ? (int)(colon - spec) : (int)strlen(spec), spec);
    snprintf(path, sizeof path, "%s/rlx-transport-%s.so", RLX_BUILD_PLUGIN_DIR, name);
    memset(t, 0, sizeof *t);
    if (rlx_plugin_load(path, &t->h) < 0)
        return -1;
    t->it = rlx_plugin_desc(t->h)->iface;
    return t->it->open(rlx_host_table(), colon ? colon + 1 : NULL, &t->self);
}

static void unload(tr *t) {
    t->it->close(t->self);
    rlx_plugin_unload(t->h);
}

/* Echoes every message, except that one starting with 'A' is answered with 8 bytes. */
static int serve(tr *t, void *conn) {
    for (;;) {
        void *d;
        size_t n;
        if (t->it->recv(t->self, conn, &d, &n, 60000) < 0)
            break;
        const int rc = n && ((char *)d)[0] == 'A' ? t->it->send(t->self, conn, "ack-ack!", 8, 60000)
                                                  : t->it->send(t->self, conn, d, n, 60000);
        free(d);
        if (rc < 0)
            break;
    }
    t->it->conn_close(t->self, conn);
    return 0;
}

static int serve_main(const char *spec) {
    tr t;
    void *l, *conn;
    char addr[128];
    if (load(&t, spec) < 0 || t.it->listen(t.self, "127.0.0.1:0", &l) < 0 ||
        t.it->bound_address(t.self, l, addr, sizeof addr) < 0) {
        fprintf(stderr, "server: %s\n", rlx_last_error());
        return 1;
    }
    printf("%s\n", addr);
    fflush(stdout);
    if (t.it->accept(t.self, l, 60000, &conn) < 0) {
        fprintf(stderr, "server: %s\n", rlx_last_error());
        return 1;
    }
    serve(&t, conn);
    t.it->listener_close(t.self, l);
    unload(&t);
    return 0;
}

typedef struct inproc {
    tr *t;
    void *l;
} inproc;

static void *inproc_main(void *arg) {
    inproc *p = arg;
    void *conn;
    if (p->t->it->accept(p->t->self, p->l, 60000, &conn) == 0)
        serve(p->t, conn);
    return NULL;
}

static int roundtrip(tr *t, void *conn, const void *msg, size_t n, size_t want) {
    void *d;
    size_t got;
    if (t->it->send(t->self, conn, msg, n, 60000) < 0 || t->it->recv(t->self, conn, &d, &got, 60000) < 0)
        return -1;
    free(d);
    return got == want ? 0 : -1;
}

static int bench(const char *spec, int iters, int reps, int in_process) {
    tr t;
    if (load(&t, spec) < 0) {
        fprintf(stderr, "%s: %s\n", spec, rlx_last_error());
        return 1;
    }
    char addr[128] = "";
    pid_t pid = -1;
    pthread_t tid;
    inproc ip = {.t = &t};
    if (in_process) {
        if (t.it->listen(t.self, "127.0.0.1:0", &ip.l) < 0 || t.it->bound_address(t.self, ip.l, addr, sizeof addr) < 0)
            return 1;
        pthread_create(&tid, NULL, inproc_main, &ip);
    } else {
        int pfd[2];
        char self[4096];
        const ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k <= 0 || pipe(pfd) != 0)
            return 1;
        self[k] = '\0';
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, pfd[1], STDOUT_FILENO);
        posix_spawn_file_actions_addclose(&fa, pfd[0]);
        char *argv[] = {self, "--serve", (char *)spec, NULL};
        if (posix_spawn(&pid, self, &fa, NULL, argv, environ) != 0)
            return 1;
        posix_spawn_file_actions_destroy(&fa);
        close(pfd[1]);
        FILE *f = fdopen(pfd[0], "r");
        if (!f || !fgets(addr, sizeof addr, f))
            return 1;
        fclose(f);
        addr[strcspn(addr, "\n")] = '\0';
    }
    void *conn;
    if (t.it->connect(t.self, addr, 10000, &conn) < 0) {
        fprintf(stderr, "%s: %s\n", spec, rlx_last_error());
        return 1;
    }
    const size_t small = 4096, big = 8u << 20;
    uint8_t *buf = calloc(1, big);
    double *rtt = calloc((size_t)(iters > reps ? iters : reps), sizeof *rtt);
    int rc = 0;
    for (int i = 0; i < iters / 10 + 10 && !rc; i++) /* warm-up */
        rc = roundtrip(&t, conn, buf, small, small);
    for (int i = 0; i < iters && !rc; i++) {
        const double t0 = now_us();
        rc = roundtrip(&t, conn, buf, small, small);
        rtt[i] = now_us() - t0;
    }
    qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
    const double med4k = rtt[iters / 2], p99 = rtt[(int)(iters * 0.99)];
    buf[0] = 'A';
    for (int i = 0; i < 2 && !rc; i++)
        rc = roundtrip(&t, conn, buf, big, 8);
    for (int i = 0; i < reps && !rc; i++) {
        const double t0 = now_us();
        rc = roundtrip(&t, conn, buf, big, 8);
        rtt[i] = now_us() - t0;
    }
    qsort(rtt, (size_t)reps, sizeof *rtt, cmp_double);
    const double oneway = big / rtt[reps / 2]; /* bytes per us = MB/s */
    buf[0] = 'E';
    for (int i = 0; i < reps && !rc; i++) {
        const double t0 = now_us();
        rc = roundtrip(&t, conn, buf, big, big);
        rtt[i] = now_us() - t0;
    }
    qsort(rtt, (size_t)reps, sizeof *rtt, cmp_double);
    const double echo = 2.0 * big / rtt[reps / 2];
    if (rc)
        fprintf(stderr, "%s: %s\n", spec, rlx_last_error());
    else
        printf("%-24s 4KiB rtt median %7.1f us  p99 %7.1f us | 8MiB+ack %7.0f MB/s | 8MiB echo %7.0f MB/s\n", spec,
               med4k, p99, oneway, echo);
    fflush(stdout);
    t.it->conn_close(t.self, conn);
    if (in_process) {
        pthread_join(tid, NULL);
        t.it->listener_close(t.self, ip.l);
    } else {
        waitpid(pid, NULL, 0);
    }
    unload(&t);
    free(buf);
    free(rtt);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[1], "--serve"))
        return serve_main(argv[2]);
    int iters = 2000, reps = 20, in_process = 0, failed = 0, n_plugins = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--inproc"))
            in_process = 1;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--iters N] [--reps N] [--inproc] [plugin[:options]...]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 10 || reps < 1)
        return 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") || !strcmp(argv[i], "--reps")) {
            i++;
            continue;
        }
        if (argv[i][0] == '-')
            continue;
        failed += bench(argv[i], iters, reps, in_process);
        n_plugins++;
    }
    if (!n_plugins)
        failed = bench("tcp", iters, reps, in_process) + bench("grpc", iters, reps, in_process);
    return failed ? 1 : 0;
}
