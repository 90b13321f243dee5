/* Whole-file reading for the test programs that are not cmocka tests (parity checks, probes,
 * benchmarks): one helper instead of one per program. */
#ifndef RLX_TEST_READ_FILE_H
#define RLX_TEST_READ_FILE_H

#include <stdio.h>
#include <stdlib.h>

/* The file's bytes with a NUL after them (so text can be used as a string), its length in *len
 * when len is not NULL; NULL when the file cannot be opened or read. */
static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

#endif
