/* The allocation wrappers and their fault injection (SQLite's malloc-failure testing, after
 * its sqlite3_test_control(SQLITE_TESTCTRL_FAULT_INSTALL)): a countdown to the allocation that
 * fails, and optionally every one after it. The countdown is atomic, so threads of a backend
 * can allocate while a test counts. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rlx/status.h"
#include "util/alloc.h"

static atomic_uint_fast64_t made;    /* allocations since the last rlx_debug_fail_alloc */
static atomic_uint_fast64_t fail_at; /* the ordinal that fails, 0 = none */
static atomic_int fail_after;        /* every one from fail_at on fails */

static int must_fail(void) {
    const uint64_t n = atomic_fetch_add(&made, 1) + 1, at = atomic_load(&fail_at);
    return at && (n == at || (n > at && atomic_load(&fail_after)));
}

uint64_t rlx_debug_fail_alloc(uint64_t nth, int persistent) {
    atomic_store(&fail_at, 0);
    const uint64_t before = atomic_exchange(&made, 0);
    atomic_store(&fail_after, persistent != 0);
    atomic_store(&fail_at, nth);
    return before;
}

void *rlx__malloc(size_t size) { return must_fail() ? NULL : malloc(size); }
void *rlx__calloc(size_t n, size_t size) { return must_fail() ? NULL : calloc(n, size); }
void *rlx__realloc(void *p, size_t size) { return must_fail() ? NULL : realloc(p, size); }
char *rlx__strdup(const char *s) { return must_fail() ? NULL : strdup(s); }
char *rlx__strndup(const char *s, size_t n) { return must_fail() ? NULL : strndup(s, n); }
void *rlx__aligned_alloc(size_t align, size_t size) { return must_fail() ? NULL : aligned_alloc(align, size); }

void *rlx__map_zeroed(size_t size) {
    if (must_fail())
        return NULL;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void rlx_free(void *p) { free(p); }
