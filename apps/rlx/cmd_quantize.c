/* rlx quantize IN OUT.gguf --type TYPE: a model directory or GGUF file written as a GGUF file
 * of one of llama.cpp's quantization types, with llama-quantize's per-tensor choices. */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "rlx/model.h"
#include "rlx/text.h"

static const char quantize_usage[] =
    "usage: rlx quantize IN OUT.gguf --type TYPE\n\n"
    "Writes the model IN (a Hugging Face model directory or a GGUF file) as the GGUF file OUT,\n"
    "its matrices quantized to TYPE: f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_s,\n"
    "q4_k_m, q5_k_s, q5_k_m, q6_k. Tensors get llama-quantize's types: norms, biases and a MoE\n"
    "router stay F32, the LM head (or tied embedding) gets Q6_K for the 4- and 5-bit types, the\n"
    "_m mixes give attn_v and ffn_down Q6_K in some layers; a row length that is not a whole\n"
    "number of blocks falls back (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, else F16). Prints\n"
    "each tensor and a summary.\n\n";

typedef struct summary {
    size_t count[RLX_DTYPE_COUNT];
    size_t bytes_in, bytes_out;
    int quiet;
} summary;

static void on_tensor(void *ctx, const rlx_quantize_event *ev) {
    summary *s = ctx;
    if (ev->dtype < RLX_DTYPE_COUNT)
        s->count[ev->dtype]++;
    s->bytes_in += ev->bytes_in;
    s->bytes_out += ev->bytes_out;
    if (!s->quiet)
        fprintf(stderr, "[%3zu/%3zu] %-32s %-5s -> %-5s %8.2f MiB%s\n", ev->index + 1, ev->count, ev->name,
                rlx_dtype_name((int)ev->src_dtype), rlx_dtype_name((int)ev->dtype),
                (double)ev->bytes_out / (1024.0 * 1024.0), ev->fallback ? " (fallback: row not whole blocks)" : "");
}

int cmd_quantize(int argc, char **argv, app_options *o) {
    const char *type = NULL;
    int quiet = 0;
    const app_opt own[] = {
        {0, "type", NULL, "TYPE", "the quantization type (see above)", APP_OPT_STRING, &type},
        {'q', "quiet", NULL, NULL, "print the summary only", APP_OPT_FLAG, &quiet},
    };
    const app_opt_group groups[] = {APP_OPT_GROUP("quantize:", own)};
    app_command_spec spec = {.name = "quantize", .usage = quantize_usage, .groups = groups, .n_groups = 1};
    int first;
    const int rc = app_opts_parse(&spec, argc, argv, 2, &first);
    if (rc)
        return rc == 2 ? 0 : 1;
    (void)o;
    if (argc - first != 2)
        return app_fail("quantize: give the input model and the output file (see rlx quantize --help)");
    if (!type)
        return app_fail("quantize: give --type TYPE (see rlx quantize --help)");
    if (!rlx_quant_type_known(type))
        return app_fail("quantize: unknown type '%s' (f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_s, q4_k_m, "
                        "q5_k_s, q5_k_m, q6_k)",
                        type);
    const char *in = argv[first], *out = argv[first + 1];
    rlx_model *m = NULL;
    rlx_tokenizer *tok = NULL;
    if (rlx_model_open(in, &m) != RLX_OK)
        return app_fail_rlx("quantize: cannot open the model");
    if (rlx_tokenizer_open(in, &tok) != RLX_OK) {
        rlx_model_close(m);
        return app_fail_rlx("quantize: cannot load the tokenizer");
    }
    summary s = {.quiet = quiet};
    int status = 0;
    if (rlx_model_write_gguf(m, tok, out, type, on_tensor, &s) != RLX_OK) {
        status = app_fail_rlx("quantize");
    } else {
        printf("%s: %s written as %s\n  tensors:", out, in, type);
        for (int d = 0; d < RLX_DTYPE_COUNT; d++)
            if (s.count[d])
                printf(" %zu %s", s.count[d], rlx_dtype_name(d));
        printf("\n  size: %.2f MiB -> %.2f MiB (%.1f%%)\n", (double)s.bytes_in / (1024.0 * 1024.0),
               (double)s.bytes_out / (1024.0 * 1024.0),
               s.bytes_in ? 100.0 * (double)s.bytes_out / (double)s.bytes_in : 0.0);
    }
    rlx_tokenizer_close(tok);
    rlx_model_close(m);
    return status;
}
