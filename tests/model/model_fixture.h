/* Scratch directories and files for the model tests, which write every fixture they read.
 * Include after <cmocka.h>; the helpers fail the running test when the file system does. */
#ifndef RLX_TEST_MODEL_FIXTURE_H
#define RLX_TEST_MODEL_FIXTURE_H

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rlx/status.h"

/* A new empty directory under $TMPDIR (or /tmp); free() the name after fixture_dir_remove(). */
static inline char *fixture_dir_create(void) {
    const char *tmp = getenv("TMPDIR");
    char templ[PATH_MAX];
    snprintf(templ, sizeof templ, "%s/rlx_test_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    assert_non_null(mkdtemp(templ));
    return strdup(templ);
}

static inline int fixture_remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static inline void fixture_dir_remove(const char *dir) {
    assert_int_equal(nftw(dir, fixture_remove_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* dir/name in a static buffer that the next call overwrites. */
static inline const char *fixture_path(const char *dir, const char *name) {
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* Writes n bytes to dir/name, replacing the file. */
static inline void fixture_write(const char *dir, const char *name, const void *data, size_t n) {
    FILE *f = fopen(fixture_path(dir, name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static inline void fixture_write_text(const char *dir, const char *name, const char *text) {
    fixture_write(dir, name, text, strlen(text));
}

/* Fails the test unless rlx_last_error() contains each of the NULL-terminated strings. */
#define fixture_assert_error_has(...) fixture_error_has_(__FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)

static inline void fixture_error_has_(const char *file, int line, const char *first, ...) {
    va_list ap;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) {
        if (!strstr(rlx_last_error(), s)) {
            va_end(ap);
            print_error("expected \"%s\" in the error \"%s\"\n", s, rlx_last_error());
            _fail(file, line);
            return;
        }
    }
    va_end(ap);
}

#endif
