/* Files for the fuzz targets whose parsers take a path: a folder of this process's own (under
 * TMPDIR, removed at exit) that each input is written into, whole, before the parser opens it. */
#ifndef RLX_FUZZ_FILES_H
#define RLX_FUZZ_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[256];
static char fuzz_dir_files[8][64]; /* what fuzz_write created, removed at exit */
static int fuzz_dir_n;

static inline void fuzz_dir_remove(void) {
    char path[512];
    for (int i = 0; i < fuzz_dir_n; i++) {
        snprintf(path, sizeof path, "%s/%s", fuzz_dir, fuzz_dir_files[i]);
        unlink(path);
    }
    rmdir(fuzz_dir);
}

/* The folder, made on first use. A fuzz target cannot run without it, so failing is fatal. */
static inline const char *fuzz_dir_path(void) {
    if (fuzz_dir[0])
        return fuzz_dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/rlx-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir)) {
        perror(fuzz_dir);
        abort();
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir;
}

/* Writes size bytes as the folder's file `name` (at most 8 distinct names), replacing it. */
static inline void fuzz_write(const char *name, const void *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir_path(), name);
    int known = 0;
    for (int i = 0; i < fuzz_dir_n; i++)
        known |= strcmp(fuzz_dir_files[i], name) == 0;
    if (!known && fuzz_dir_n < 8)
        snprintf(fuzz_dir_files[fuzz_dir_n++], sizeof fuzz_dir_files[0], "%s", name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* The path of the folder's file `name`, in a static buffer. */
static inline const char *fuzz_path(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir_path(), name);
    return path;
}

#endif
