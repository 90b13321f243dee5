/* What the MTP golden test (check_mtp.py) compares with NumPy, computed through the public API:
 *
 *   rlx_mtp_probe --model DIR [--weights FILE] [--layer N] [--plugin NAME] --tokens 1,2,3,... --out PREFIX
 *
 * Writes little-endian float32 files:
 *   PREFIX.hidden.f32      [T, hidden]  the target's final-normed hidden rows (emit_hidden), from a
 *                                       prefill of T - 2 tokens then one forward of the last 2
 *   PREFIX.logits.f32      [3, vocab]   the target's logits of positions T-3 (the prefill's last
 *                                       row), T-2 and T-1 (the second forward's rows)
 *   PREFIX.mtp_logits.f32  [T-1, vocab] MTP layer N over the pairs (tokens[t+1], hidden[t])
 *   PREFIX.mtp_hidden.f32  [T-1, hidden] its output hidden rows
 * The MTP pairs run as a prefill of half of them and then one pair at a time, so the MTP layer's
 * KV cache is exercised as the speculator uses it. Errors print "rlx_mtp_probe: <message>" on
 * stderr and exit with status 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/rlx.h"

static int fail(const char *what) {
    fprintf(stderr, "rlx_mtp_probe: %s%s%s\n", what, what[0] ? ": " : "", rlx_last_error());
    return 1;
}

static int write_rows(const char *prefix, const char *suffix, const float *rows, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(rows, sizeof *rows, n, f) == n;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok)
        fprintf(stderr, "rlx_mtp_probe: cannot write %s\n", path);
    return ok ? 0 : 1;
}

static uint32_t parse_ids(const char *text, int32_t *ids, uint32_t cap) {
    uint32_t n = 0;
    for (const char *p = text; *p && n < cap;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            return 0;
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return 0;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *weights = NULL, *plugin_name = "cpu-blas", *tokens = NULL, *out = NULL;
    uint32_t layer = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--weights"))
            weights = argv[i + 1];
        else if (!strcmp(argv[i], "--layer"))
            layer = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--plugin"))
            plugin_name = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens"))
            tokens = argv[i + 1];
        else if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
    }
    enum { MAX_TOKENS = 256 };
    int32_t ids[MAX_TOKENS];
    uint32_t n = tokens ? parse_ids(tokens, ids, MAX_TOKENS) : 0;
    if (!model_dir || !out || n < 4) {
        fprintf(stderr, "usage: rlx_mtp_probe --model DIR [--weights FILE] [--layer N] [--plugin NAME] "
                        "--tokens ID,ID,ID,ID[,...] --out PREFIX\n");
        return 2;
    }

    int status = 1;
    rlx_registry *reg = NULL;
    rlx_plugin_handle *plugin = NULL;
    rlx_backend *backend = NULL;
    rlx_model *model = NULL;
    rlx_session *target = NULL, *mtp = NULL;
    float *hidden = NULL, *logits = NULL, *mtp_logits = NULL, *mtp_hidden = NULL;
    if (rlx_registry_create(NULL, &reg) != RLX_OK ||
        rlx_registry_load(reg, RLX_PLUGIN_BACKEND, plugin_name, &plugin) != RLX_OK ||
        rlx_backend_create(plugin, NULL, &backend) != RLX_OK) {
        fail("backend");
        goto done;
    }
    if (rlx_model_open(model_dir, &model) != RLX_OK || (weights && rlx_model_add_weights(model, weights) != RLX_OK)) {
        fail("");
        goto done;
    }
    const rlx_model_config *c = rlx_model_config_of(model);
    size_t h = (size_t)c->hidden_size, v = (size_t)c->vocab_size;
    rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = MAX_TOKENS, .backends = &backend, .n_backends = 1};
    rlx_block_spec target_spec = {.size = sizeof(rlx_block_spec),
                                  .layer_end = (uint32_t)c->num_hidden_layers,
                                  .embed_input = 1,
                                  .produce_logits = 1,
                                  .emit_hidden = 1};
    rlx_block_spec mtp_spec = {.size = sizeof(rlx_block_spec),
                               .layer_start = layer,
                               .layer_end = layer + 1,
                               .embed_input = 1,
                               .produce_logits = 1,
                               .emit_hidden = 1,
                               .mtp = 1};
    hidden = malloc(n * h * sizeof *hidden);
    logits = malloc(3 * v * sizeof *logits);
    mtp_logits = malloc((n - 1) * v * sizeof *mtp_logits);
    mtp_hidden = malloc((n - 1) * h * sizeof *mtp_hidden);
    if (!hidden || !logits || !mtp_logits || !mtp_hidden) {
        fprintf(stderr, "rlx_mtp_probe: out of memory\n");
        goto done;
    }
    if (rlx_session_create(model, &target_spec, &o, &target) != RLX_OK ||
        rlx_session_create(model, &mtp_spec, &o, &mtp) != RLX_OK) {
        fail("");
        goto done;
    }

    const float *rows;
    rlx_lm lm;
    if (rlx_session_lm(target, &lm) != RLX_OK || !lm.hidden || lm.hidden_size != (int64_t)h) {
        fprintf(stderr, "rlx_mtp_probe: the target's rlx_lm does not offer hidden rows\n");
        goto done;
    }
    if (lm.forward(lm.self, ids, n - 2, 0, &rows) != RLX_OK)
        goto target_failed;
    memcpy(logits, rows, v * sizeof *logits);
    memcpy(hidden, lm.hidden(lm.self), (n - 2) * h * sizeof *hidden);
    if (lm.forward(lm.self, ids + n - 2, 2, 1, &rows) != RLX_OK)
        goto target_failed;
    memcpy(logits + v, rows, 2 * v * sizeof *logits);
    memcpy(hidden + (n - 2) * h, rlx_session_hidden(target), 2 * h * sizeof *hidden);

    uint32_t pairs = n - 1, first = pairs / 2;
    if (rlx_session_forward_mtp(mtp, ids + 1, hidden, first, 1, &rows) != RLX_OK)
        goto mtp_failed;
    memcpy(mtp_logits, rows, first * v * sizeof *mtp_logits);
    memcpy(mtp_hidden, rlx_session_hidden(mtp), first * h * sizeof *mtp_hidden);
    for (uint32_t i = first; i < pairs; i++) {
        if (rlx_session_forward_mtp(mtp, ids + 1 + i, hidden + i * h, 1, 0, &rows) != RLX_OK)
            goto mtp_failed;
        memcpy(mtp_logits + i * v, rows, v * sizeof *mtp_logits);
        memcpy(mtp_hidden + i * h, rlx_session_hidden(mtp), h * sizeof *mtp_hidden);
    }
    status = write_rows(out, "hidden.f32", hidden, n * h) || write_rows(out, "logits.f32", logits, 3 * v) ||
             write_rows(out, "mtp_logits.f32", mtp_logits, pairs * v) ||
             write_rows(out, "mtp_hidden.f32", mtp_hidden, pairs * h);
    goto done;
target_failed:
    fail("target forward");
    goto done;
mtp_failed:
    fail("MTP forward");
done:
    free(hidden);
    free(logits);
    free(mtp_logits);
    free(mtp_hidden);
    rlx_session_destroy(mtp);
    rlx_session_destroy(target);
    rlx_model_close(model);
    rlx_backend_destroy(backend);
    rlx_plugin_unload(plugin);
    rlx_registry_destroy(reg);
    return status;
}
