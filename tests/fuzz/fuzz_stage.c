/* libFuzzer target: a pipeline stage's message handling end to end. Two real stages
 * (rlx_stage_serve, the ref backend, the tcp transport plugin loaded from
 * RLX_FUZZ_TCP_PLUGIN) serve the model in RLX_FUZZ_MODEL on loopback for the process's lifetime:
 * one every layer, one layers 1 to the last. Each input is one driver connection, laid out as
 * fuzz_stage.h says; everything the stage answers is read until it closes the connection, which
 * it must do within DEADLINE_MS of the input's end (the input is followed by a shutdown). A
 * crash, a sanitizer report or a stage that hangs fails the target. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fuzz_frame.h"
#include "fuzz_stage.h"
#include "rlx.pb-c.h"
#include "rlx/dist.h"
#include "rlx/model.h"
#include "rlx/plugin.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { DEADLINE_MS = 4000, STAGE_TIMEOUT_MS = 500, KV_CAPACITY = 64 };

typedef struct stage_run {
    rlx_layer_range layers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port; /* once listening; -1 when rlx_stage_serve returned */
} stage_run;

static rlx_model *model;
static rlx_plugin_handle *tcp;
static char model_id[RLX_MODEL_ID_SIZE];
static uint32_t n_layers;
static stage_run stages[2];
static volatile sig_atomic_t never;

static void quiet(void *ctx, int level, const char *message) {}

static void on_listening(void *ctx, const char *bound) {
    stage_run *s = ctx;
    const char *colon = strrchr(bound, ':');
    pthread_mutex_lock(&s->mu);
    s->port = colon ? atoi(colon + 1) : -1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *serve(void *arg) {
    stage_run *s = arg;
    rlx_stage_options o = rlx_stage_options_default();
    o.address = "127.0.0.1:0";
    o.transport = tcp;
    o.layers = s->layers;
    o.session = (rlx_session_options){.size = sizeof(rlx_session_options), .kv_capacity = KV_CAPACITY};
    o.backend_name = "ref";
    o.timeout_ms = STAGE_TIMEOUT_MS;
    o.poll_ms = 50;
    o.stop = &never;
    o.on_listening = on_listening;
    o.ctx = s;
    const rlx_status rc = rlx_stage_serve(model, &o);
    fprintf(stderr, "fuzz_stage: the stage for layers %u-%u returned: %s\n", s->layers.start, s->layers.end - 1,
            rc == RLX_OK ? "ok" : rlx_last_error());
    abort();
}

static void fail(const char *what, const char *why) {
    fprintf(stderr, "fuzz_stage: %s: %s\n", what, why);
    exit(2);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("RLX_FUZZ_MODEL"), *plugin = getenv("RLX_FUZZ_TCP_PLUGIN");
    if (!dir || !plugin)
        fail("set RLX_FUZZ_MODEL and RLX_FUZZ_TCP_PLUGIN", "a model folder and the tcp plugin built with clang");
    rlx_log_set_handler(quiet, NULL); /* every refused input is logged: millions of lines */
    if (rlx_model_open(dir, &model) != RLX_OK || rlx_model_id(dir, model_id) != RLX_OK)
        fail(dir, rlx_last_error());
    if (rlx_plugin_load(plugin, &tcp) != RLX_OK)
        fail(plugin, rlx_last_error());
    n_layers = (uint32_t)rlx_model_config_of(model)->num_hidden_layers;
    if (n_layers < 2)
        fail(dir, "the model needs two layers or more for the tail stage");
    for (unsigned i = 0; i < 2; i++) {
        stage_run *s = &stages[i];
        unsigned start, end;
        stage_layers(i ? MODE_TAIL : 0, n_layers, &start, &end);
        s->layers = (rlx_layer_range){start, end};
        s->port = 0;
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cv, NULL);
        pthread_t thread;
        if (pthread_create(&thread, NULL, serve, s) != 0)
            fail("pthread_create", strerror(errno));
        pthread_detach(thread);
        pthread_mutex_lock(&s->mu);
        while (s->port == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        if (s->port < 0)
            fail("a stage did not listen", rlx_last_error());
    }
    return 0;
}

// ---- the bytes of one connection

typedef struct buffer {
    uint8_t *p;
    size_t len, cap;
} buffer;

static void append(buffer *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void append_frame(buffer *b, const uint8_t *payload, size_t len) {
    uint8_t h[FRAME_HEADER_SIZE];
    frame_header(h, payload, len, 0);
    append(b, h, sizeof h);
    append(b, payload, len);
}

static void append_hello(buffer *b, unsigned mode) {
    unsigned start, end;
    stage_layers(mode, n_layers, &start, &end);
    Rlx__Hello h = RLX__HELLO__INIT;
    h.protocol_version = RLX_DIST_PROTOCOL_VERSION;
    h.model_id = model_id;
    h.layer_start = start;
    h.layer_end = end;
    h.stage_index = start ? 1 : 0;
    h.n_stages = start ? 2 : 1;
    h.activation_dtype = RLX__DTYPE__DTYPE_F32;
    h.n_slots = MODE_SLOTS(mode);
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    uint8_t packed[512];
    const size_t len = rlx__envelope__get_packed_size(&e);
    if (len > sizeof packed)
        abort();
    rlx__envelope__pack(&e, packed);
    append_frame(b, packed, len);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends out[] to the stage while reading what it answers (so neither side blocks on a full
 * socket), shuts the sending side, and reads until the stage closes. */
static void talk(int port, const buffer *out) {
    const int64_t deadline = now_ms() + DEADLINE_MS;
    /* Non-blocking, since libFuzzer's timer signal interrupts a blocking connect. */
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int err = fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int64_t left;
        while ((left = deadline - now_ms()) > 0 && poll(&p, 1, (int)left) <= 0)
            ;
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || (!err && !p.revents))
            err = ETIMEDOUT;
    }
    if (fd < 0 || err) {
        fprintf(stderr, "fuzz_stage: connecting to the stage: %s\n", strerror(fd < 0 ? errno : err));
        abort();
    }
    size_t sent = 0;
    int shut = 0;
    uint8_t sink[65536];
    for (;;) {
        if (sent == out->len && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT)};
        const int64_t left = deadline - now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) == 0) {
            fprintf(stderr, "fuzz_stage: the stage did not close the connection within %d ms (%zu of %zu bytes sent)\n",
                    DEADLINE_MS, sent, out->len);
            abort();
        }
        if (p.revents & POLLIN) {
            const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                break; /* closed (or reset: the stage dropped the connection with input unread) */
        }
        if (!shut && (p.revents & POLLOUT)) {
            const ssize_t n = send(fd, out->p + sent, out->len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR)
                shut = 1; /* the stage closed first: read what it said */
        } else if (p.revents & (POLLERR | POLLHUP) && !(p.revents & POLLIN)) {
            break;
        }
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    const unsigned mode = data[0];
    buffer out = {0};
    if (mode & MODE_ENVELOPES) {
        for (size_t at = 1; at + 2 <= size;) {
            size_t len = (size_t)data[at] | (size_t)data[at + 1] << 8;
            at += 2;
            if (len > size - at)
                len = size - at;
            append_frame(&out, data + at, len);
            at += len;
        }
    } else {
        append_hello(&out, mode);
        const size_t hello_len = out.len;
        append(&out, data + 1, size - 1);
        if (mode & MODE_FIX_CHECKSUMS)
            frame_fix_checksums(out.p + hello_len, out.len - hello_len);
    }
    if (out.len)
        talk(stages[mode & MODE_TAIL ? 1 : 0].port, &out);
    free(out.p);
    return 0;
}
