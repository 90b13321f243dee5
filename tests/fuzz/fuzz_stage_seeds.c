/* Writes the seed corpus of fuzz_stage for the model in MODEL_DIR (its id and shapes go into
 * the messages): conversations a driver holds with a stage, and ones that break each rule the
 * stage checks, in the input layout of fuzz_stage.h.
 * usage: fuzz_stage_seeds MODEL_DIR OUT_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_frame.h"
#include "fuzz_stage.h"
#include "rlx.pb-c.h"
#include "rlx/dist.h"
#include "rlx/model.h"

static char model_id[RLX_MODEL_ID_SIZE];
static rlx_model_config cfg;
static const char *out_dir;

/* One seed being written: the mode byte, then records or raw frames. */
static FILE *seed;
static unsigned seed_mode;

static void begin(const char *name, unsigned mode) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    seed = fopen(path, "wb");
    if (!seed) {
        perror(path);
        exit(1);
    }
    seed_mode = mode;
    fputc((int)mode, seed);
}

static void end(void) {
    if (fclose(seed) != 0) {
        perror("fuzz_stage_seeds");
        exit(1);
    }
}

static void bytes(const uint8_t *p, size_t len) {
    if (seed_mode & MODE_ENVELOPES) {
        const uint8_t n[2] = {(uint8_t)len, (uint8_t)(len >> 8)};
        fwrite(n, 1, 2, seed);
    } else {
        uint8_t h[FRAME_HEADER_SIZE];
        frame_header(h, p, len, 0);
        fwrite(h, 1, sizeof h, seed);
    }
    fwrite(p, 1, len, seed);
}

/* A frame header announcing len bytes that never come. It claims a payload checksum (0), as
 * the plaintext default requires one, so the stage waits for the payload rather than refusing
 * the header. */
static void announce(uint64_t len) {
    uint8_t h[FRAME_HEADER_SIZE];
    frame_header(h, NULL, len, FRAME_FLAG_NO_CRC);
    frame_put(h + 6, 0, 2);
    frame_put(h + 20, frame_crc32c(h, 20), 4);
    fwrite(h, 1, sizeof h, seed);
}

static void envelope(const Rlx__Envelope *e) {
    uint8_t *p = malloc(rlx__envelope__get_packed_size(e) + 1);
    if (!p)
        exit(1);
    bytes(p, rlx__envelope__pack(e, p));
    free(p);
}

static Rlx__Hello hello(unsigned mode, unsigned n_slots) {
    unsigned start, end_layer;
    stage_layers(mode, (unsigned)cfg.num_hidden_layers, &start, &end_layer);
    Rlx__Hello h = RLX__HELLO__INIT;
    h.protocol_version = RLX_DIST_PROTOCOL_VERSION;
    h.model_id = model_id;
    h.layer_start = start;
    h.layer_end = end_layer;
    h.stage_index = start ? 1 : 0;
    h.n_stages = start ? 2 : 1;
    h.activation_dtype = RLX__DTYPE__DTYPE_F32;
    h.n_slots = n_slots;
    return h;
}

static void send_hello(const Rlx__Hello *h) {
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_HELLO;
    e.hello = (Rlx__Hello *)h;
    envelope(&e);
}

/* The values of n rows as the stage of `mode` takes them: token ids, or hidden states. */
static ProtobufCBinaryData rows_data(unsigned mode, unsigned n, uint32_t *width, Rlx__DType *dtype) {
    static uint8_t buf[1 << 16];
    const int tail = (mode & MODE_TAIL) != 0;
    *width = tail ? (uint32_t)cfg.hidden_size : 1;
    *dtype = tail ? RLX__DTYPE__DTYPE_F32 : RLX__DTYPE__DTYPE_I32;
    const size_t len = (size_t)n * *width * 4;
    if (len > sizeof buf)
        exit(1);
    for (size_t i = 0; i < len / 4; i++) {
        const int32_t token = (int32_t)((i * 7 + 3) % (size_t)cfg.vocab_size);
        const float value = (float)((int)(i % 13) - 6) / 8.0f;
        memcpy(buf + 4 * i, tail ? (const void *)&value : (const void *)&token, 4);
    }
    return (ProtobufCBinaryData){.len = len, .data = buf};
}

static void activations(unsigned mode, uint64_t session, uint64_t step, uint32_t start, uint32_t n, int all_rows) {
    Rlx__Activations a = RLX__ACTIVATIONS__INIT;
    a.session_id = session;
    a.step = step;
    a.start_position = start;
    a.n_positions = n;
    a.all_rows = all_rows;
    a.data = rows_data(mode, n, &a.width, &a.dtype);
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &a;
    envelope(&e);
}

static void rows(unsigned mode, uint64_t step, uint32_t n, uint32_t *positions, uint32_t *slots) {
    Rlx__Rows r = RLX__ROWS__INIT;
    uint32_t out_rows[] = {0, 1, 2, 3};
    r.step = step;
    r.n_rows = n;
    r.n_positions = n;
    r.positions = positions;
    r.n_slots = n;
    r.slots = slots;
    r.n_out_rows = n < 4 ? n : 4;
    r.out_rows = out_rows;
    r.data = rows_data(mode, n, &r.width, &r.dtype);
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ROWS;
    e.rows = &r;
    envelope(&e);
}

static void truncate_session(uint64_t session, uint64_t step, uint32_t length) {
    Rlx__Truncate t = RLX__TRUNCATE__INIT;
    t.session_id = session;
    t.step = step;
    t.length = length;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_TRUNCATE;
    e.truncate = &t;
    envelope(&e);
}

static void end_session(uint64_t session) {
    Rlx__EndSession s = RLX__END_SESSION__INIT;
    s.session_id = session;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_END_SESSION;
    e.end_session = &s;
    envelope(&e);
}

static void copy_slot(uint64_t step, uint32_t from, uint32_t to, uint32_t n) {
    Rlx__CopySlot c = RLX__COPY_SLOT__INIT;
    c.step = step;
    c.from_slot = from;
    c.to_slot = to;
    c.n_positions = n;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_COPY_SLOT;
    e.copy_slot = &c;
    envelope(&e);
}

/* A session's life: prefill, decode steps, a rollback and its end; then a second session. */
static void sessions(unsigned mode) {
    activations(mode, 1, 1, 0, 3, 0);
    activations(mode, 1, 2, 3, 1, 0);
    truncate_session(1, 3, 2);
    activations(mode, 1, 4, 2, 2, 1);
    activations(mode, 2, 1, 0, 1, 0);
    end_session(1);
    end_session(2);
}

/* Batched slots: rows of two slots, a copy of one slot's cache to the other, more rows. */
static void batch(unsigned mode) {
    uint32_t pos0[] = {0, 0}, slots[] = {0, 1}, pos1[] = {1, 1}, pos2[] = {2, 1};
    rows(mode, 1, 2, pos0, slots);
    rows(mode, 2, 2, pos1, slots);
    copy_slot(3, 0, 1, 2);
    rows(mode, 4, 2, pos2, slots);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fuzz_stage_seeds MODEL_DIR OUT_DIR\n");
        return 2;
    }
    out_dir = argv[2];
    if (rlx_model_id(argv[1], model_id) != RLX_OK || rlx_model_config_load_model(argv[1], &cfg) != RLX_OK) {
        fprintf(stderr, "fuzz_stage_seeds: %s\n", rlx_last_error());
        return 1;
    }
    for (unsigned tail = 0; tail <= MODE_TAIL; tail += MODE_TAIL) {
        const unsigned m = MODE_ENVELOPES | tail;
        char name[64];
        Rlx__Hello h = hello(tail, 0);
        snprintf(name, sizeof name, "sessions-%s", tail ? "tail" : "all");
        begin(name, m), send_hello(&h), sessions(m), end();
        h = hello(tail, 2);
        snprintf(name, sizeof name, "batch-%s", tail ? "tail" : "all");
        begin(name, m), send_hello(&h), batch(m), end();
        /* the same after the target's own Hello, as raw frames */
        snprintf(name, sizeof name, "raw-sessions-%s", tail ? "tail" : "all");
        begin(name, tail), sessions(tail), end();
        snprintf(name, sizeof name, "raw-batch-%s", tail ? "tail" : "all");
        begin(name, tail | MODE_WITH_SLOTS(2)), batch(tail), end();
    }

    /* handshakes the stage refuses */
    static const struct {
        const char *name;
        uint32_t version, layer_start, kv_capacity, n_slots;
        int dtype, emit_hidden, wrong_id;
    } bad[] = {
        {"hello-version", 2, 0, 0, 0, RLX__DTYPE__DTYPE_F32, 0, 0},
        {"hello-model-id", 1, 0, 0, 0, RLX__DTYPE__DTYPE_F32, 0, 1},
        {"hello-layers", 1, 1, 0, 0, RLX__DTYPE__DTYPE_F32, 0, 0},
        {"hello-dtype", 1, 0, 0, 0, RLX__DTYPE__DTYPE_BF16, 0, 0},
        {"hello-capacity", 1, 0, 1u << 30, 0, RLX__DTYPE__DTYPE_F32, 0, 0},
        {"hello-slots", 1, 0, 0, 100000, RLX__DTYPE__DTYPE_F32, 0, 0},
        {"hello-emit-hidden", 1, 0, 0, 0, RLX__DTYPE__DTYPE_F32, 1, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Rlx__Hello h = hello(0, bad[i].n_slots);
        h.protocol_version = bad[i].version;
        h.layer_start = bad[i].layer_start;
        h.kv_capacity = bad[i].kv_capacity;
        h.activation_dtype = (Rlx__DType)bad[i].dtype;
        h.emit_hidden = bad[i].emit_hidden;
        if (bad[i].wrong_id)
            h.model_id = "0000000000000000000000000000000000000000000000000000000000000000";
        begin(bad[i].name, MODE_ENVELOPES), send_hello(&h), sessions(MODE_ENVELOPES), end();
    }
    /* messages the stage refuses after a good handshake */
    begin("no-hello", MODE_ENVELOPES), sessions(MODE_ENVELOPES), end();
    begin("steps-out-of-order", 0), activations(0, 1, 2, 0, 1, 0), activations(0, 1, 1, 0, 1, 0), end();
    begin("position-gap", 0), activations(0, 1, 1, 5, 1, 0), end();
    begin("past-capacity", 0), activations(0, 1, 1, 0, 200, 0), end();
    begin("wrong-width", MODE_TAIL), activations(0, 1, 1, 0, 2, 0), end();
    begin("truncate-unknown", 0), truncate_session(9, 1, 0), end_session(9), end();
    begin("rows-without-slots", 0), batch(0), end();
    {
        uint32_t pos[] = {0, 0}, slots[] = {0, 7};
        begin("rows-bad-slot", MODE_WITH_SLOTS(2)), rows(0, 1, 2, pos, slots), copy_slot(2, 3, 0, 1), end();
    }
    {
        Rlx__Ack a = RLX__ACK__INIT;
        Rlx__Envelope e = RLX__ENVELOPE__INIT;
        e.body_case = RLX__ENVELOPE__BODY_ACK;
        e.ack = &a;
        begin("unexpected-ack", 0), envelope(&e), end();
    }
    {
        const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
        begin("not-protobuf", 0), bytes(garbage, sizeof garbage), end();
        begin("empty-envelope", MODE_ENVELOPES), bytes(garbage, 0), end();
    }
    begin("fix-checksums", MODE_FIX_CHECKSUMS), activations(0, 1, 1, 0, 2, 0), end();
    /* A receive allocates as the bytes arrive, not what a header claims (transport_iface.h):
     * announcing almost 4 GiB (under the default max_message) and sending nothing costs nothing. */
    begin("announces-4g", 0), announce((4ull << 30) - 64), end();
    return 0;
}
