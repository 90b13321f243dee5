/* quant_probe TYPE IN.f32 OUT: the little-endian float32 values of IN quantized by
 * rlx_quantize_row as TYPE (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, f16, bf16), for the
 * Python checks against gguf_ref.quantize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "read_file.h"
#include "rlx/model.h"
#include "rlx/quant_iface.h"

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        uint32_t dtype;
    } types[] = {{"q4_0", RLX_DTYPE_Q4_0}, {"q4_1", RLX_DTYPE_Q4_1}, {"q5_0", RLX_DTYPE_Q5_0}, {"q5_1", RLX_DTYPE_Q5_1},
                 {"q8_0", RLX_DTYPE_Q8_0}, {"q4_k", RLX_DTYPE_Q4_K}, {"q5_k", RLX_DTYPE_Q5_K}, {"q6_k", RLX_DTYPE_Q6_K},
                 {"f16", RLX_DTYPE_F16},   {"bf16", RLX_DTYPE_BF16}};
    if (argc != 4) {
        fprintf(stderr, "usage: quant_probe TYPE IN.f32 OUT\n");
        return 2;
    }
    int dtype = -1;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(argv[1], types[i].name) == 0)
            dtype = (int)types[i].dtype;
    size_t size = 0;
    float *x = dtype < 0 ? NULL : (float *)test_read_file(argv[2], &size);
    if (!x) {
        fprintf(stderr, "quant_probe: bad type or input\n");
        return 2;
    }
    const int64_t n = (int64_t)(size / 4);
    uint8_t *out = malloc((size_t)n * 4 + 4);
    if (!out) {
        fprintf(stderr, "quant_probe: out of memory\n");
        return 2;
    }
    const size_t bytes = rlx_iface_row_bytes((uint32_t)dtype, n);
    if (!bytes || rlx_quantize_row((uint32_t)dtype, x, out, n) != 0) {
        fprintf(stderr, "quant_probe: %lld values are not whole blocks of %s\n", (long long)n, argv[1]);
        return 1;
    }
    FILE *o = fopen(argv[3], "wb");
    if (!o || fwrite(out, 1, bytes, o) != bytes || fclose(o) != 0) {
        fprintf(stderr, "quant_probe: cannot write %s\n", argv[3]);
        return 1;
    }
    free(x);
    free(out);
    return 0;
}
