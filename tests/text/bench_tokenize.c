/* Tokenizer benchmark (not a test): load time, encode and decode speed on a text file.
 *
 * usage: bench_tokenize MODEL_DIR FILE [MiB]
 * The file's text is repeated or cut (at a character boundary) to MiB mebibytes (default 1).
 * The first encode runs with an empty word cache, the later ones with the cache warm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "read_file.h"
#include "rlx/text.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenize MODEL_DIR FILE [MiB]\n");
        return 2;
    }
    double mib = argc > 3 ? atof(argv[3]) : 1.0;
    size_t n;
    char *src = test_read_file(argv[2], &n);
    if (!src || n == 0) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    size_t len = (size_t)(mib * 1024 * 1024);
    char *text = malloc(len + 4);
    for (size_t i = 0; i < len; i += n)
        memcpy(text + i, src, len - i < n ? len - i : n);
    while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80) /* end on a character boundary */
        len--;
    free(src);

    double t0 = now();
    rlx_tokenizer *tok;
    if (rlx_tokenizer_open(argv[1], &tok) != RLX_OK) {
        fprintf(stderr, "cannot load the tokenizer: %s\n", rlx_last_error());
        return 1;
    }
    double t_load = now() - t0;
    printf("load: %.3f s (%d tokens)\n", t_load, rlx_tokenizer_vocab_size(tok));
    size_t n_ids = 0;
    for (int run = 0; run < 4; run++) {
        int32_t *ids;
        t0 = now();
        if (rlx_tokenizer_encode(tok, text, len, 1, &ids, &n_ids) != RLX_OK) {
            fprintf(stderr, "encode: %s\n", rlx_last_error());
            return 1;
        }
        double t = now() - t0;
        printf("encode %s: %.2f MiB in %.3f s = %.2f MB/s (%zu ids, %.2f bytes/id)\n",
               run == 0 ? "(cold cache)" : "(warm cache)", len / 1048576.0, t, len / t / 1e6, n_ids,
               (double)len / (double)n_ids);
        if (run == 3) {
            char *out;
            size_t out_len;
            t0 = now();
            if (rlx_tokenizer_decode(tok, ids, n_ids, 0, &out, &out_len) != RLX_OK) {
                fprintf(stderr, "decode: %s\n", rlx_last_error());
                return 1;
            }
            t = now() - t0;
            printf("decode: %zu ids in %.3f s = %.2f MB/s\n", n_ids, t, out_len / t / 1e6);
            free(out);
        }
        free(ids);
    }
    rlx_tokenizer_close(tok);
    free(text);
    return 0;
}
