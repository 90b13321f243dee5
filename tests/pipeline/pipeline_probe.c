/* pipeline_probe: the parts of the pipeline tests that the rlx command line cannot reach.
 *
 *   pipeline_probe kv     COMMON            decode with the KV cache equals a full prefill, and a
 *                                           truncate (speculative rollback) recomputes the same rows
 *   pipeline_probe pause  COMMON [-n N]     prefill, print PREFILLED, wait for a line on stdin, then
 *                                           decode N tokens (the test breaks a stage meanwhile; the
 *                                           driver does not replace it, so the fault is reported)
 *   pipeline_probe bench  COMMON [-p P] [-n N]  per-token time and bytes over the pipeline
 *   pipeline_probe raw    ADDR A-B COMMON   speaks the protocol by hand to a real stage: unknown
 *                                           sessions, replayed steps, bad handshakes, garbage
 *   pipeline_probe fake   MODE COMMON       a stage that misbehaves (MODE: version, model, garbage,
 *                                           silent, rows, hangup); prints LISTENING ADDR
 *   pipeline_probe hold   ADDR A-B COMMON [--seconds S] [--nonce 1] [--hello 0]
 *                                           a Hello (with an auth nonce: then no AuthProof), its
 *                                           answer, then silence: prints CLOSED AFTER X (seconds)
 *                                           when the stage hangs up, or OPEN after S seconds;
 *                                           --hello 0: a connection (a gRPC call) that never
 *                                           says a word
 *   pipeline_probe abuse  ADDR A-B COMMON [-n N]   N short connections that each misbehave
 *                                           (garbage, a Hello without a token, another model's
 *                                           id, a silent hang-up); each is answered or closed
 *   pipeline_probe limits ADDR A-B COMMON   against a stage with --max-connections 2
 *                                           --max-sessions 2: the limits hold over connections
 *
 * COMMON: --model DIR --transport NAME [--plugin-dir DIR] [--stage ADDR=A-B ...] [--listen ADDR]
 *         [--timeout MS] [--transport-options OPTS] [--auth-token-file FILE (the driver's)]
 * Exit status: 0 pass, 1 failure (the message says what), 3 an expected pipeline error. */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlx.pb-c.h"
#include "rlx/dist.h"
#include "rlx/rlx.h"

#define MAX_STAGES 8

typedef struct probe {
    const char *model, *transport, *plugin_dir, *listen, *transport_options, *token_file;
    double seconds;
    int nonce, no_hello;
    rlx_driver_stage stages[MAX_STAGES];
    char addr[MAX_STAGES][256];
    uint32_t n_stages;
    uint32_t timeout_ms, n, p;
    int no_recovery; /* pause: a broken stage is the failure under test, not replaced */
    rlx_registry *reg;
    rlx_plugin_handle *tp;
    const rlx_transport_iface *t;
    void *self;
} probe;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pipeline_probe: FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_common(probe *p, int argc, char **argv, int first) {
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return fail("option %s needs a value", a);
        i++;
        if (strcmp(a, "--model") == 0) {
            p->model = v;
        } else if (strcmp(a, "--transport") == 0) {
            p->transport = v;
        } else if (strcmp(a, "--plugin-dir") == 0) {
            p->plugin_dir = v;
        } else if (strcmp(a, "--listen") == 0) {
            p->listen = v;
        } else if (strcmp(a, "--timeout") == 0) {
            p->timeout_ms = (uint32_t)atoi(v);
        } else if (strcmp(a, "--auth-token-file") == 0) {
            p->token_file = v;
        } else if (strcmp(a, "--transport-options") == 0) {
            p->transport_options = v;
        } else if (strcmp(a, "--seconds") == 0) {
            p->seconds = atof(v);
        } else if (strcmp(a, "--nonce") == 0) {
            p->nonce = atoi(v);
        } else if (strcmp(a, "--hello") == 0) {
            p->no_hello = atoi(v) == 0;
        } else if (strcmp(a, "-n") == 0) {
            p->n = (uint32_t)atoi(v);
        } else if (strcmp(a, "-p") == 0) {
            p->p = (uint32_t)atoi(v);
        } else if (strcmp(a, "--stage") == 0) {
            const char *eq = strrchr(v, '=');
            if (!eq || p->n_stages == MAX_STAGES)
                return fail("--stage wants ADDR=A-B");
            snprintf(p->addr[p->n_stages], sizeof p->addr[0], "%.*s", (int)(eq - v), v);
            if (rlx_dist_parse_range(eq + 1, &p->stages[p->n_stages].layers) != RLX_OK)
                return fail("--stage: %s", rlx_last_error());
            p->stages[p->n_stages].address = p->addr[p->n_stages];
            p->n_stages++;
        } else {
            return fail("unknown option %s", a);
        }
    }
    if (!p->model || !p->transport)
        return fail("--model and --transport are required");
    if (rlx_registry_create(p->plugin_dir, &p->reg) != RLX_OK ||
        rlx_registry_load(p->reg, RLX_PLUGIN_TRANSPORT, p->transport, &p->tp) != RLX_OK)
        return fail("transport %s: %s", p->transport, rlx_last_error());
    p->t = rlx_plugin_desc(p->tp)->iface;
    if (p->t->open(rlx_host_table(), p->transport_options, &p->self) < 0)
        return fail("transport open: %s", rlx_last_error());
    return 0;
}

static int driver_open(probe *p, rlx_driver **d, rlx_lm *lm) {
    rlx_driver_options o = rlx_driver_options_default();
    o.transport = p->tp;
    o.stages = p->stages;
    o.n_stages = p->n_stages;
    o.timeout_ms = p->timeout_ms;
    o.connect_timeout_ms = 5000;
    o.no_recovery = (uint32_t)p->no_recovery;
    o.security.auth_token_file = p->token_file;
    if (rlx_driver_create(p->model, &o, d) != RLX_OK)
        return fail("driver: %s", rlx_last_error());
    rlx_driver_lm(*d, lm);
    return 0;
}

// ---- kv: decode equals prefill ----

static int compare_rows(const float *a, const float *b, int64_t vocab, const char *what, uint32_t row) {
    double worst = 0;
    for (int64_t v = 0; v < vocab; v++) {
        double diff = fabs((double)a[v] - (double)b[v]);
        if (!(diff <= worst))
            worst = isnan(diff) ? INFINITY : diff;
    }
    if (worst > 1e-4)
        return fail("%s: row %u differs by %g from the full prefill", what, row, worst);
    return 0;
}

static int run_kv(probe *p) {
    rlx_driver *d;
    rlx_lm lm;
    if (driver_open(p, &d, &lm))
        return 1;
    enum { N = 9, SPLIT = 4 };
    int32_t ids[N] = {1, 5, 3, 7, 9, 11, 2, 4, 8};
    int64_t vocab = lm.vocab;
    float *full = malloc((size_t)N * (size_t)vocab * sizeof *full);
    const float *out;
    int rc = 0;
    if (!full || lm.forward(lm.self, ids, N, 1, &out) != RLX_OK) {
        rc = fail("prefill: %s", rlx_last_error());
        goto done;
    }
    memcpy(full, out, (size_t)N * (size_t)vocab * sizeof *full);
    /* decode: prefill a prefix, then one token at a time from the cache */
    if (lm.truncate(lm.self, 0) != RLX_OK || lm.forward(lm.self, ids, SPLIT, 0, &out) != RLX_OK) {
        rc = fail("prefix: %s", rlx_last_error());
        goto done;
    }
    if ((rc = compare_rows(out, full + (SPLIT - 1) * vocab, vocab, "prefix prefill", SPLIT - 1)))
        goto done;
    for (uint32_t j = SPLIT; j < N; j++) {
        if (lm.forward(lm.self, &ids[j], 1, 0, &out) != RLX_OK) {
            rc = fail("decode %u: %s", j, rlx_last_error());
            goto done;
        }
        if ((rc = compare_rows(out, full + j * vocab, vocab, "decode", j)))
            goto done;
    }
    if (lm.length(lm.self) != N) {
        rc = fail("length %u after %d positions", lm.length(lm.self), N);
        goto done;
    }
    /* speculative rollback: drop 3 positions and verify them again in one pass */
    if (lm.truncate(lm.self, N - 3) != RLX_OK || lm.forward(lm.self, ids + N - 3, 3, 1, &out) != RLX_OK) {
        rc = fail("rollback: %s", rlx_last_error());
        goto done;
    }
    for (uint32_t j = 0; j < 3; j++)
        if ((rc = compare_rows(out + j * vocab, full + (N - 3 + j) * vocab, vocab, "after truncate", N - 3 + j)))
            goto done;
    /* a refused request leaves the pipeline usable: too many positions */
    if (lm.forward(lm.self, ids, lm.capacity(lm.self), 0, &out) == RLX_OK) {
        rc = fail("a forward past the capacity succeeded");
        goto done;
    }
    if (lm.forward(lm.self, ids, 1, 0, &out) != RLX_OK) {
        rc = fail("after a refused request: %s", rlx_last_error());
        goto done;
    }
    printf("kv: decode, rollback and refusal over %u stages match the full prefill\n", p->n_stages);
done:
    free(full);
    rlx_driver_destroy(d);
    return rc;
}

// ---- pause: a stage breaks between prefill and decode ----

static int run_pause(probe *p) {
    rlx_driver *d;
    rlx_lm lm;
    p->no_recovery = 1;
    if (driver_open(p, &d, &lm))
        return 1;
    int32_t ids[4] = {1, 5, 3, 7};
    const float *out;
    if (lm.forward(lm.self, ids, 4, 0, &out) != RLX_OK) {
        rlx_driver_destroy(d);
        return fail("prefill: %s", rlx_last_error());
    }
    printf("PREFILLED\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        rlx_driver_destroy(d);
        return fail("no go-ahead on stdin");
    }
    double t0 = now();
    uint32_t n = p->n ? p->n : 8;
    int32_t tok = 2;
    for (uint32_t i = 0; i < n; i++) {
        if (lm.forward(lm.self, &tok, 1, 0, &out) != RLX_OK) {
            printf("ERROR after %.0f ms: %s\n", (now() - t0) * 1000, rlx_last_error());
            /* later calls fail at once with the same cause */
            double t1 = now();
            int again = lm.forward(lm.self, &tok, 1, 0, &out);
            printf("AGAIN %s after %.0f ms: %s\n", again == RLX_OK ? "ok" : "failed", (now() - t1) * 1000,
                   rlx_last_error());
            fflush(stdout);
            rlx_driver_destroy(d);
            return 3;
        }
    }
    printf("DECODED %u\n", n);
    rlx_driver_destroy(d);
    return 0;
}

// ---- bench: per-token cost of the pipeline ----

static int run_bench(probe *p) {
    rlx_driver *d;
    rlx_lm lm;
    if (driver_open(p, &d, &lm))
        return 1;
    uint32_t n = p->n ? p->n : 64, np = p->p ? p->p : 16;
    int32_t *ids = malloc(np * sizeof *ids);
    for (uint32_t i = 0; i < np; i++)
        ids[i] = (int32_t)((i * 2654435761u) % (uint32_t)lm.vocab);
    const float *out;
    int rc = 0;
    double best = INFINITY;
    rlx_driver_stats s0, s1;
    for (int rep = 0; rep < 4 && !rc; rep++) {
        lm.truncate(lm.self, 0);
        if (lm.forward(lm.self, ids, np, 0, &out) != RLX_OK) {
            rc = fail("prefill: %s", rlx_last_error());
            break;
        }
        rlx_driver_stats_of(d, &s0);
        double t0 = now();
        for (uint32_t i = 0; i < n; i++) {
            int32_t tok = (int32_t)(i % 100);
            if (lm.forward(lm.self, &tok, 1, 0, &out) != RLX_OK) {
                rc = fail("decode: %s", rlx_last_error());
                break;
            }
        }
        double per = (now() - t0) / n;
        rlx_driver_stats_of(d, &s1);
        if (per < best)
            best = per;
    }
    for (uint32_t i = 0; !rc && i < rlx_driver_n_stages(d); i++) {
        rlx_driver_stage_info info;
        rlx_driver_stage_info_of(d, i, &info);
        printf("stage %u at %s: layers %u-%u on %s, %.1f MiB resident after loading\n", i, info.address,
               info.layers.start, info.layers.end - 1, info.backend, (double)info.rss_bytes / 1048576.0);
    }
    if (!rc)
        printf("{\"stages\": %u, \"transport\": \"%s\", \"us_per_token\": %.1f, \"bytes_sent_per_token\": %.0f, "
               "\"bytes_received_per_token\": %.0f, \"messages_per_token\": %.1f}\n",
               p->n_stages, p->transport, best * 1e6, (double)(s1.bytes_sent - s0.bytes_sent) / n,
               (double)(s1.bytes_received - s0.bytes_received) / n, (double)(s1.messages - s0.messages) / n);
    free(ids);
    rlx_driver_destroy(d);
    return rc;
}

// ---- raw protocol ----

static int send_env(probe *p, void *conn, const Rlx__Envelope *e) {
    size_t len = rlx__envelope__get_packed_size(e);
    uint8_t *buf = malloc(len + 1);
    rlx__envelope__pack(e, buf);
    int rc = p->t->send(p->self, conn, buf, len, 2000);
    free(buf);
    return rc;
}

static Rlx__Envelope *recv_env(probe *p, void *conn, int timeout_ms) {
    void *data = NULL;
    size_t len = 0;
    if (p->t->recv(p->self, conn, &data, &len, timeout_ms) < 0)
        return NULL;
    Rlx__Envelope *e = rlx__envelope__unpack(NULL, len, data);
    rlx_host_table()->free(data);
    return e;
}

/* Sends e and expects an Error whose message contains `needle` (NULL: expects no Error). */
static int expect(probe *p, void *conn, const Rlx__Envelope *e, const char *needle, const char *what) {
    if (send_env(p, conn, e) < 0)
        return fail("%s: send: %s", what, rlx_last_error());
    Rlx__Envelope *r = recv_env(p, conn, 5000);
    if (!r)
        return fail("%s: no answer: %s", what, rlx_last_error());
    int rc = 0;
    if (needle && (r->body_case != RLX__ENVELOPE__BODY_ERROR || !strstr(r->error->message, needle)))
        rc = fail("%s: expected an Error containing '%s', got %s", what, needle,
                  r->body_case == RLX__ENVELOPE__BODY_ERROR ? r->error->message : "another message");
    else if (!needle && r->body_case == RLX__ENVELOPE__BODY_ERROR)
        rc = fail("%s: refused: %s", what, r->error->message);
    else
        printf("ok: %s%s%s\n", what, needle ? ": " : "", needle ? r->error->message : "");
    rlx__envelope__free_unpacked(r, NULL);
    return rc;
}

static int raw_connect(probe *p, const char *addr, void **conn) {
    if (p->t->connect(p->self, addr, 3000, conn) < 0)
        return fail("connect %s: %s", addr, rlx_last_error());
    return 0;
}

static void hello_init(Rlx__Hello *h, char *model_id, rlx_layer_range r) {
    rlx__hello__init(h);
    h->protocol_version = RLX_DIST_PROTOCOL_VERSION;
    h->model_id = model_id;
    h->layer_start = r.start;
    h->layer_end = r.end;
    h->n_stages = 1;
}

/* Rows and CopySlot on a connection whose Hello asked for n_slots slots (to a first stage that
 * does not make logits): every misuse is an Error naming it, a good step is answered. */
static int raw_slots(probe *p, void *conn, const rlx_model_config *cfg, uint32_t n_slots) {
    uint32_t positions[2] = {0, 1}, slots[2] = {0, 0}, out_rows[1] = {1};
    int32_t ids[2] = {1, 2};
    Rlx__Rows rows = RLX__ROWS__INIT;
    rows.step = 1;
    rows.n_rows = 2;
    rows.n_positions = rows.n_slots = 2;
    rows.positions = positions;
    rows.slots = slots;
    rows.width = 1;
    rows.dtype = RLX__DTYPE__DTYPE_I32;
    rows.data.len = sizeof ids;
    rows.data.data = (uint8_t *)ids;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_ROWS;
    e.rows = &rows;
    if (!n_slots)
        return expect(p, conn, &e, "asked for no slots", "Rows from a driver without slots");
    int rc = expect(p, conn, &e, NULL, "a step of two rows in slot 0");
    if (!rc)
        rc = expect(p, conn, &e, "out of order", "a replayed Rows step");
    rows.step = 2;
    slots[1] = n_slots;
    if (!rc)
        rc = expect(p, conn, &e, "beyond 2 slots", "a row in a slot past the slots");
    slots[1] = 0;
    positions[1] = 1u << 30;
    rows.step = 3;
    if (!rc)
        rc = expect(p, conn, &e, "beyond 2 slots of", "a row past the slot's positions");
    positions[1] = 1;
    ids[1] = (int32_t)cfg->vocab_size;
    rows.step = 4;
    if (!rc)
        rc = expect(p, conn, &e, "outside the vocabulary", "a row's token outside the vocabulary");
    ids[1] = 2;
    rows.n_positions = 1;
    rows.step = 5;
    if (!rc)
        rc = expect(p, conn, &e, "with 1 positions", "rows without a position each");
    rows.n_positions = 2;
    rows.data.len = 4;
    rows.step = 6;
    if (!rc)
        rc = expect(p, conn, &e, "this stage takes rows of 1 I32", "rows whose bytes do not match");
    rows.data.len = sizeof ids;
    rows.n_out_rows = 1;
    rows.out_rows = out_rows;
    rows.step = 7;
    if (!rc)
        rc = expect(p, conn, &e, "that returns no logits", "logits rows asked of a stage without logits");
    rows.n_out_rows = 0;
    Rlx__CopySlot copy = RLX__COPY_SLOT__INIT;
    copy.step = 8;
    copy.from_slot = 0;
    copy.to_slot = 0;
    copy.n_positions = 2;
    e.body_case = RLX__ENVELOPE__BODY_COPY_SLOT;
    e.copy_slot = &copy;
    if (!rc)
        rc = expect(p, conn, &e, "CopySlot of 2 positions", "a copy of a slot onto itself");
    copy.step = 9;
    copy.to_slot = 1;
    if (!rc)
        rc = expect(p, conn, &e, NULL, "a copy of slot 0 into slot 1");
    e.body_case = RLX__ENVELOPE__BODY_ROWS;
    e.rows = &rows; /* the body is a union */
    rows.step = 10;
    positions[0] = 2;
    positions[1] = 3;
    slots[0] = slots[1] = 1;
    if (!rc)
        rc = expect(p, conn, &e, NULL, "the copied slot goes on");
    return rc;
}

static int run_raw(probe *p, const char *addr, rlx_layer_range r) {
    char id[RLX_MODEL_ID_SIZE];
    if (rlx_model_id(p->model, id) != RLX_OK)
        return fail("model id: %s", rlx_last_error());
    rlx_model_config cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", p->model);
    if (rlx_model_config_load(path, &cfg) != RLX_OK)
        return fail("config: %s", rlx_last_error());
    if (r.start != 0)
        return fail("raw wants the first stage (layers from 0)");
    Rlx__Hello h;
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    void *conn;
    int rc = 0;
    /* bad handshakes: each is refused and the connection closed; the stage keeps listening */
    const char *bad[] = {"protocol version 99", "model mismatch", "layer mismatch"};
    for (int k = 0; k < 3 && !rc; k++) {
        hello_init(&h, id, r);
        char other[] = "0000000000000000000000000000000000000000000000000000000000000000";
        if (k == 0)
            h.protocol_version = 99;
        if (k == 1)
            h.model_id = other;
        if (k == 2)
            h.layer_end = r.end + 1;
        if ((rc = raw_connect(p, addr, &conn)) == 0) {
            rc = expect(p, conn, &e, k == 0 ? "protocol version 99" : bad[k], bad[k]);
            p->t->conn_close(p->self, conn);
        }
    }
    if (rc || (rc = raw_connect(p, addr, &conn)))
        return rc;
    hello_init(&h, id, r);
    rc = expect(p, conn, &e, NULL, "handshake");
    Rlx__Activations a = RLX__ACTIVATIONS__INIT;
    int32_t ids[3] = {1, 2, 3};
    a.session_id = 0x1234;
    a.step = 1;
    a.start_position = 5;
    a.n_positions = 1;
    a.width = 1;
    a.dtype = RLX__DTYPE__DTYPE_I32;
    a.data.len = 4;
    a.data.data = (uint8_t *)ids;
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &a;
    if (!rc)
        rc = expect(p, conn, &e, "unknown session", "a message for an unknown session");
    a.start_position = 0;
    a.n_positions = 3;
    a.data.len = 12;
    if (!rc)
        rc = expect(p, conn, &e, NULL, "a new session");
    a.start_position = 3;
    a.n_positions = 1;
    a.data.len = 4;
    if (!rc)
        rc = expect(p, conn, &e, "out of order", "a replayed step");
    a.step = 2;
    a.start_position = 2;
    if (!rc)
        rc = expect(p, conn, &e, "the session holds 3 positions", "a wrong start position");
    a.step = 3;
    a.start_position = 3;
    a.width = 7;
    if (!rc)
        rc = expect(p, conn, &e, "rows of 7 I32 values", "a wrong row width");
    a.step = 4;
    a.width = 1;
    ids[0] = (int32_t)cfg.vocab_size;
    if (!rc)
        rc = expect(p, conn, &e, "outside the vocabulary", "a token outside the vocabulary");
    ids[0] = 1;
    a.step = 5;
    if (!rc)
        rc = expect(p, conn, &e, NULL, "the session goes on");
    Rlx__Truncate t = RLX__TRUNCATE__INIT;
    t.session_id = 0x9999;
    t.step = 1;
    e.body_case = RLX__ENVELOPE__BODY_TRUNCATE;
    e.truncate = &t;
    if (!rc)
        rc = expect(p, conn, &e, "unknown session", "Truncate for an unknown session");
    t.session_id = 0x1234;
    t.step = 6;
    t.length = 2;
    if (!rc)
        rc = expect(p, conn, &e, NULL, "Truncate");
    /* a second driver is served alongside this one, and the first one's session is not its own */
    void *other;
    if (!rc && (rc = raw_connect(p, addr, &other)) == 0) {
        e.body_case = RLX__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        rc = expect(p, other, &e, NULL, "a second driver alongside the first");
        t.step = 100;
        e.body_case = RLX__ENVELOPE__BODY_TRUNCATE;
        e.truncate = &t;
        if (!rc)
            rc = expect(p, other, &e, "unknown session", "another connection's session");
        p->t->conn_close(p->self, other);
    }
    Rlx__EndSession end = RLX__END_SESSION__INIT;
    end.session_id = 0x1234;
    e.body_case = RLX__ENVELOPE__BODY_END_SESSION;
    e.end_session = &end;
    if (!rc)
        rc = expect(p, conn, &e, NULL, "EndSession");
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &a; /* the body is a union */
    a.step = 7;
    if (!rc)
        rc = expect(p, conn, &e, "unknown session", "a message for an ended session");
    /* garbage that is not an Envelope: an Error, then the stage hangs up */
    if (!rc) {
        const char junk[] = "\xff\xff\xff\xff garbage, not protobuf";
        if (p->t->send(p->self, conn, junk, sizeof junk, 2000) < 0)
            rc = fail("send garbage: %s", rlx_last_error());
        Rlx__Envelope *ans = rc ? NULL : recv_env(p, conn, 5000);
        if (!rc && (!ans || ans->body_case != RLX__ENVELOPE__BODY_ERROR || !strstr(ans->error->message, "not an rlx")))
            rc = fail("garbage: expected an Error saying it is not an rlx message");
        else if (!rc)
            printf("ok: garbage: %s\n", ans->error->message);
        if (ans)
            rlx__envelope__free_unpacked(ans, NULL);
    }
    p->t->conn_close(p->self, conn);
    /* and the stage serves the next driver */
    if (!rc && (rc = raw_connect(p, addr, &conn)) == 0) {
        e.body_case = RLX__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        rc = expect(p, conn, &e, NULL, "a new driver after the garbage");
        if (!rc)
            rc = raw_slots(p, conn, &cfg, 0);
        p->t->conn_close(p->self, conn);
    }
    /* slots: a driver that asked for two; each misuse is refused and the stage serves on */
    if (!rc && (rc = raw_connect(p, addr, &conn)) == 0) {
        e.body_case = RLX__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        h.n_slots = 100000;
        rc = expect(p, conn, &e, "100000 slots asked for", "a Hello asking for too many slots");
        p->t->conn_close(p->self, conn);
    }
    if (!rc && (rc = raw_connect(p, addr, &conn)) == 0) {
        h.n_slots = 2;
        rc = expect(p, conn, &e, NULL, "a Hello with 2 slots");
        if (!rc)
            rc = raw_slots(p, conn, &cfg, 2);
        p->t->conn_close(p->self, conn);
    }
    if (!rc)
        printf("raw: all protocol checks passed\n");
    return rc;
}

// ---- fake stage ----

static int run_fake(probe *p, const char *mode) {
    void *listener, *conn = NULL;
    if (p->t->listen(p->self, p->listen ? p->listen : "127.0.0.1:0", &listener) < 0)
        return fail("listen: %s", rlx_last_error());
    char bound[256];
    p->t->bound_address(p->self, listener, bound, sizeof bound);
    printf("LISTENING %s\n", bound);
    fflush(stdout);
    char id[RLX_MODEL_ID_SIZE];
    if (rlx_model_id(p->model, id) != RLX_OK)
        return fail("model id: %s", rlx_last_error());
    for (;;) { /* serve until killed */
        while (p->t->accept(p->self, listener, 200, &conn) < 0)
            ;
        Rlx__Envelope *e = recv_env(p, conn, 5000);
        if (!e || e->body_case != RLX__ENVELOPE__BODY_HELLO) {
            p->t->conn_close(p->self, conn);
            continue;
        }
        Rlx__HelloReply hr = RLX__HELLO_REPLY__INIT;
        hr.protocol_version = RLX_DIST_PROTOCOL_VERSION;
        hr.model_id = id;
        hr.layer_start = e->hello->layer_start;
        hr.layer_end = e->hello->layer_end;
        hr.backend = "fake";
        hr.kv_capacity = 64;
        rlx__envelope__free_unpacked(e, NULL);
        char other[] = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
        if (strcmp(mode, "version") == 0)
            hr.protocol_version = 99;
        if (strcmp(mode, "model") == 0)
            hr.model_id = other;
        Rlx__Envelope out = RLX__ENVELOPE__INIT;
        out.body_case = RLX__ENVELOPE__BODY_HELLO_REPLY;
        out.hello_reply = &hr;
        if (strcmp(mode, "hangup") == 0) {
            p->t->conn_close(p->self, conn);
            continue;
        }
        if (strcmp(mode, "silent") == 0) {
            sleep(30);
            p->t->conn_close(p->self, conn);
            continue;
        }
        if (strcmp(mode, "garbage") == 0) {
            const char junk[] = "\x0a\xff\xff\xff\xff\xff\x01 this is not an envelope";
            p->t->send(p->self, conn, junk, sizeof junk, 2000);
            sleep(1);
            p->t->conn_close(p->self, conn);
            continue;
        }
        send_env(p, conn, &out);
        /* rows: answers the first Activations with rows of the wrong width */
        while ((e = recv_env(p, conn, 10000)) != NULL) {
            if (e->body_case == RLX__ENVELOPE__BODY_ACTIVATIONS) {
                Rlx__Activations a = RLX__ACTIVATIONS__INIT;
                float junk[3] = {0};
                a.session_id = e->activations->session_id;
                a.step = e->activations->step;
                a.n_positions = 1;
                a.width = 3;
                a.data.len = sizeof junk;
                a.data.data = (uint8_t *)junk;
                out.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
                out.activations = &a;
                send_env(p, conn, &out);
            }
            rlx__envelope__free_unpacked(e, NULL);
        }
        p->t->conn_close(p->self, conn);
    }
}

// ---- hold, abuse, limits: what a stage owes peers that do not play along ----

static void fill_random(uint8_t *buf, size_t n) {
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)rand();
}

/* Sends a Hello (with a nonce, as a driver holding a token would, and then no proof), reads its
 * answer and stays silent until the stage hangs up or `seconds` pass. */
static int run_hold(probe *p, const char *addr, rlx_layer_range r) {
    char id[RLX_MODEL_ID_SIZE];
    if (rlx_model_id(p->model, id) != RLX_OK)
        return fail("model id: %s", rlx_last_error());
    Rlx__Hello h;
    hello_init(&h, id, r);
    uint8_t nonce[32];
    fill_random(nonce, sizeof nonce);
    if (p->nonce)
        h.auth_nonce = (ProtobufCBinaryData){sizeof nonce, nonce};
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    void *conn;
    if (raw_connect(p, addr, &conn))
        return 1;
    const double t0 = now();
    if (!p->no_hello) {
        if (send_env(p, conn, &e) < 0)
            return fail("send Hello: %s", rlx_last_error());
        Rlx__Envelope *ans = recv_env(p, conn, 5000);
        if (!ans)
            return fail("no answer to the Hello: %s", rlx_last_error());
        printf("ANSWER %s\n", ans->body_case == RLX__ENVELOPE__BODY_HELLO_REPLY      ? "HelloReply"
                              : ans->body_case == RLX__ENVELOPE__BODY_AUTH_CHALLENGE ? "AuthChallenge"
                                                                                     : "other");
        rlx__envelope__free_unpacked(ans, NULL);
        fflush(stdout);
    }
    int rc = 0;
    for (;;) {
        void *data = NULL;
        size_t len = 0;
        const int got = p->t->recv(p->self, conn, &data, &len, 200);
        if (got == RLX_OK) {
            rlx_host_table()->free(data); /* an Error saying why, before the hang-up */
            continue;
        }
        if (got != RLX_E_TIMEOUT) {
            printf("CLOSED AFTER %.2f\n", now() - t0);
            break;
        }
        if (now() - t0 >= p->seconds) {
            printf("OPEN after %.2f\n", now() - t0);
            break;
        }
    }
    p->t->conn_close(p->self, conn);
    return rc;
}

/* n connections, each misbehaving in one of four ways; every one must be answered (an Error) or
 * closed by the stage within the timeout, never left hanging. */
static int run_abuse(probe *p, const char *addr, rlx_layer_range r) {
    char id[RLX_MODEL_ID_SIZE], other[RLX_MODEL_ID_SIZE];
    if (rlx_model_id(p->model, id) != RLX_OK)
        return fail("model id: %s", rlx_last_error());
    memset(other, 'f', RLX_MODEL_ID_SIZE - 1);
    other[RLX_MODEL_ID_SIZE - 1] = '\0';
    uint32_t answered = 0, closed = 0;
    for (uint32_t k = 0; k < p->n; k++) {
        void *conn;
        if (raw_connect(p, addr, &conn))
            return 1;
        Rlx__Hello h;
        hello_init(&h, k % 4 == 2 ? other : id, r);
        Rlx__Envelope e = RLX__ENVELOPE__INIT;
        e.body_case = RLX__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        uint8_t junk[512];
        fill_random(junk, sizeof junk);
        int sent = 0;
        switch (k % 4) {
        case 0:
            sent = p->t->send(p->self, conn, junk, 1 + (size_t)rand() % sizeof junk, 2000) == RLX_OK;
            break;
        case 1:
        case 2:
            sent = send_env(p, conn, &e) == 0;
            break;
        default: /* connect and hang up at once */
            break;
        }
        if (sent) {
            Rlx__Envelope *ans = recv_env(p, conn, (int)(p->timeout_ms ? p->timeout_ms : 10000));
            if (ans && ans->body_case == RLX__ENVELOPE__BODY_ERROR) {
                if (strstr(ans->error->message, p->model))
                    return fail("connection %u: the refusal names the stage's model directory: %s", k,
                                ans->error->message);
                answered++;
            } else if (ans) {
                /* a stage without a token accepts a Hello of its model: not abuse, but fine */
                answered++;
            } else {
                closed++;
            }
            if (ans)
                rlx__envelope__free_unpacked(ans, NULL);
        }
        p->t->conn_close(p->self, conn);
    }
    printf("ABUSE %u connections: %u answered, %u closed\n", p->n, answered, closed);
    return 0;
}

/* Two connections and two sessions at the most, over all connections together. */
static int run_limits(probe *p, const char *addr, rlx_layer_range r) {
    char id[RLX_MODEL_ID_SIZE];
    if (rlx_model_id(p->model, id) != RLX_OK)
        return fail("model id: %s", rlx_last_error());
    Rlx__Hello h;
    hello_init(&h, id, r);
    Rlx__Envelope e = RLX__ENVELOPE__INIT;
    e.body_case = RLX__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    void *c[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++)
        if (!(rc = raw_connect(p, addr, &c[k])))
            rc = expect(p, c[k], &e, k < 2 ? NULL : "driver connections already", "a third connection");
    if (c[2])
        p->t->conn_close(p->self, c[2]);
    int32_t ids[1] = {1};
    Rlx__Activations a = RLX__ACTIVATIONS__INIT;
    a.step = 1;
    a.n_positions = 1;
    a.width = 1;
    a.dtype = RLX__DTYPE__DTYPE_I32;
    a.data = (ProtobufCBinaryData){4, (uint8_t *)ids};
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &a;
    a.session_id = 1;
    if (!rc)
        rc = expect(p, c[0], &e, NULL, "session 1 on connection 1");
    a.session_id = 2;
    if (!rc)
        rc = expect(p, c[1], &e, NULL, "session 2 on connection 2");
    a.session_id = 3;
    if (!rc)
        rc = expect(p, c[1], &e, "as many sessions", "a third session, on connection 2");
    Rlx__EndSession end = RLX__END_SESSION__INIT;
    end.session_id = 1;
    e.body_case = RLX__ENVELOPE__BODY_END_SESSION;
    e.end_session = &end;
    if (!rc)
        rc = expect(p, c[0], &e, NULL, "session 1 ended");
    e.body_case = RLX__ENVELOPE__BODY_ACTIVATIONS;
    e.activations = &a;
    a.step = 2;
    if (!rc)
        rc = expect(p, c[1], &e, NULL, "the third session, once the first ended");
    for (int k = 0; k < 2; k++)
        if (c[k])
            p->t->conn_close(p->self, c[k]);
    /* a connection closed gives its place to the next */
    void *again;
    if (!rc && !(rc = raw_connect(p, addr, &again))) {
        e.body_case = RLX__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        for (int tries = 0; tries < 50; tries++) { /* the stage sees the close within its poll */
            rc = expect(p, again, &e, NULL, "a connection after two closed");
            if (!rc)
                break;
            p->t->conn_close(p->self, again);
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
            if ((rc = raw_connect(p, addr, &again)))
                break;
        }
        p->t->conn_close(p->self, again);
    }
    return rc;
}

int main(int argc, char **argv) {
    probe p = {0};
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return fail("usage: pipeline_probe kv|pause|bench|raw|fake ...");
    const char *cmd = argv[1];
    int rc;
    if (strcmp(cmd, "raw") == 0 || strcmp(cmd, "hold") == 0 || strcmp(cmd, "abuse") == 0 ||
        strcmp(cmd, "limits") == 0) {
        if (argc < 4)
            return fail("%s ADDR A-B COMMON", cmd);
        rlx_layer_range r;
        if (rlx_dist_parse_range(argv[3], &r) != RLX_OK || parse_common(&p, argc, argv, 4))
            return 1;
        rc = strcmp(cmd, "raw") == 0     ? run_raw(&p, argv[2], r)
             : strcmp(cmd, "hold") == 0  ? run_hold(&p, argv[2], r)
             : strcmp(cmd, "abuse") == 0 ? run_abuse(&p, argv[2], r)
                                         : run_limits(&p, argv[2], r);
    } else if (strcmp(cmd, "fake") == 0) {
        if (argc < 3 || parse_common(&p, argc, argv, 3))
            return 1;
        rc = run_fake(&p, argv[2]);
    } else {
        if (parse_common(&p, argc, argv, 2))
            return 1;
        if (!p.n_stages && strcmp(cmd, "fake") != 0)
            return fail("no --stage given");
        rc = strcmp(cmd, "kv") == 0      ? run_kv(&p)
             : strcmp(cmd, "pause") == 0 ? run_pause(&p)
             : strcmp(cmd, "bench") == 0 ? run_bench(&p)
                                         : fail("unknown command %s", cmd);
    }
    if (p.self)
        p.t->close(p.self);
    rlx_plugin_unload(p.tp);
    rlx_registry_destroy(p.reg);
    return rc;
}
