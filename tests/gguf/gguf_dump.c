/* Every tensor of a model file as rlx sees it, widened to F32 through the public API only:
 *
 *   gguf_dump FILE OUTDIR
 *
 * Opens FILE with rlx_weights_open (a GGUF file or a safetensors model directory), and for each
 * tensor it lists writes OUTDIR/<Hugging Face name>.f32 (raw little-endian float32, row-major in
 * the listed shape) dequantized by rlx_iface_dequant_row, plus OUTDIR/index.json:
 *   [{"name": ..., "dtype": rlx_dtype_name, "shape": [...], "file": "<name>.f32"}, ...]
 * test_gguf_tensors.py compares these with the independent NumPy reader (gguf_ref.py). Going
 * through the public header and listing only, not the reader's internals, is the point: what is
 * checked is what a plugin or an embedding program gets. Errors print "gguf_dump: <message>" on
 * stderr and exit with status 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/model.h"
#include "rlx/quant_iface.h"
#include "rlx/rlx.h"

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "gguf_dump: %s%s%s\n", what, detail[0] ? ": " : "", detail);
    return 1;
}

/* The names are rlx's Hugging Face names ("model.layers.0.mlp.up_proj.weight"): plain ASCII
 * without quotes or backslashes, which this refuses rather than escapes, so that the index is
 * valid JSON whatever the file holds. */
static int json_safe(const char *s) {
    for (; *s; s++)
        if (*s == '"' || *s == '\\' || *s == '/' || (unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return 0;
    return 1;
}

static int dump_tensor(const rlx_weight *t, const char *outdir, FILE *index, int first) {
    int64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        n *= t->shape[d];
    const int64_t block = rlx_iface_dtype_block(t->dtype);
    if (block <= 0 || n % block)
        return fail(t->name, "element count is not a whole number of blocks of its dtype");
    /* the listing's byte count must be what the dtype needs for the shape, else dequantizing
     * would read past the tensor */
    if ((size_t)(n / block) * rlx_iface_dtype_block_bytes(t->dtype) != t->nbytes)
        return fail(t->name, "byte size does not match dtype and shape");
    float *y = malloc((size_t)n * sizeof *y);
    if (!y)
        return fail(t->name, "out of memory");
    if (rlx_iface_dequant_row(t->dtype, t->data, y, n) != 0) {
        free(y);
        return fail(t->name, "rlx_iface_dequant_row does not know its dtype");
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", outdir, t->name);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(y, sizeof *y, (size_t)n, f) == (size_t)n;
    if (f && fclose(f) != 0)
        ok = 0;
    free(y);
    if (!ok)
        return fail(path, strerror(errno));
    fprintf(index, "%s\n {\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": [", first ? "" : ",", t->name,
            rlx_dtype_name((int)t->dtype));
    for (uint32_t d = 0; d < t->n_dims; d++)
        fprintf(index, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    fprintf(index, "], \"file\": \"%s.f32\"}", t->name);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gguf_dump FILE OUTDIR\n");
        return 2;
    }
    rlx_weights *w;
    if (rlx_weights_open(argv[1], &w) != RLX_OK)
        return fail(argv[1], rlx_last_error());
    char path[4096];
    snprintf(path, sizeof path, "%s/index.json", argv[2]);
    FILE *index = fopen(path, "w");
    if (!index) {
        rlx_weights_close(w);
        return fail(path, strerror(errno));
    }
    int status = 0;
    fprintf(index, "[");
    for (size_t i = 0; i < rlx_weights_count(w) && status == 0; i++) {
        const rlx_weight *t = rlx_weights_at(w, i);
        if (!json_safe(t->name))
            status = fail(t->name, "tensor name this probe cannot write as a file name");
        else
            status = dump_tensor(t, argv[2], index, i == 0);
    }
    fprintf(index, "\n]\n");
    if (fclose(index) != 0 && status == 0)
        status = fail(path, strerror(errno));
    rlx_weights_close(w);
    return status;
}
