/* The repacked-weight table of a kern_ctx (kern_qrp.c) under threads: kern_prepare_qrp,
 * kern_qrp_find and kern_release_qrp called at once by THREADS threads on one context, as a
 * backend's prepare_weight and release_weight may be, on the same tensor and on different ones:
 *   - the threads that prepare one tensor at the same moment get one copy, the one
 *     kern_qrp_find gives them all;
 *   - while any use holds a tensor, every prepare and find of it gives that copy, and its bytes
 *     are those of a repack on one thread;
 *   - once every use is released kern_qrp_find finds nothing and every copy is freed: the
 *     host's live allocations are back to their count before (LSan sees the rest under ASan).
 * Without the table's lock the threads make a tensor's copy twice, lose counts and free copies
 * still in use. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "kern.h"
#include "quant_host.h"
#include "rlx/quant_iface.h"
#include "testutil.h"

enum { THREADS = 4, N_TENSORS = 4, K = 2048 };

static atomic_long live_allocs;

static void *counted_alloc(size_t size, size_t align) {
    void *p = quant_host_alloc(size, align);
    if (p)
        atomic_fetch_add(&live_allocs, 1);
    return p;
}

static void counted_free(void *p) {
    if (p)
        atomic_fetch_sub(&live_allocs, 1);
    free(p);
}

/* A tensor the threads share and the bytes of its copy repacked on one thread. */
typedef struct table_tensor {
    rlx_tensor t;
    rlx_weight_info info;
    void *want;
    size_t bytes;
} table_tensor;

typedef struct table_run {
    rlx_host host;
    kern_ctx c;
    table_tensor t[N_TENSORS];
    long baseline; /* live allocations with no copy alive (the table's array made) */
    pthread_barrier_t bar;
    void *got[THREADS]; /* same_tensor_at_once: each thread's handle of the round */
    int iterations;
    void *held; /* prepare_and_release_at_random: the main thread's use of tensor 0 */
} table_run;

typedef struct table_thread {
    table_run *run;
    int index;
    uint64_t rng; /* tu_rand's */
    int failures;
    char why[200];
} table_thread;

/* The first failure of a thread is kept; a thread goes on after one, so no barrier waits for it. */
static void failure(table_thread *a, const char *what, int tensor) {
    if (!a->failures++)
        snprintf(a->why, sizeof a->why, "thread %d, tensor %d: %s", a->index, tensor, what);
}

/* Checks h, a prepared use of tensor i: find gives it and it holds the single-thread bytes. */
static void check_use(table_thread *a, int i, const void *h) {
    const table_tensor *tt = &a->run->t[i];
    const kern_qrp_weight *w = h;
    if (!w) {
        failure(a, "no copy prepared", i);
        return;
    }
    if (kern_qrp_find(&a->run->c, &tt->t) != w)
        failure(a, "kern_qrp_find gives another copy than the use holds", i);
    if (w->src != tt->t.data || w->N != tt->t.shape[0] || memcmp(w->data, tt->want, tt->bytes))
        failure(a, "the copy differs from a repack on one thread", i);
}

static void run_init(table_run *r) {
    static const uint32_t types[N_TENSORS] = {RLX_DTYPE_Q8_0, RLX_DTYPE_Q4_0, RLX_DTYPE_Q4_K, RLX_DTYPE_Q6_K};
    static const int64_t rows[N_TENSORS] = {61, 48, 40, 19}; /* whole groups and native tails */
    memset(r, 0, sizeof *r);
    r->host = quant_host;
    r->host.alloc = counted_alloc;
    r->host.free = counted_free;
    assert_ok(kern_init(&r->c, &r->host, "test", NULL, (kern_par){.n_threads = 1}));
    uint64_t rng = 5;
    for (int i = 0; i < N_TENSORS; i++) {
        table_tensor *tt = &r->t[i];
        tt->bytes = (size_t)rows[i] * rlx_iface_row_bytes(types[i], K);
        uint8_t *w = malloc(tt->bytes); /* repacking moves bytes: any bytes do */
        for (size_t b = 0; b < tt->bytes; b++)
            w[b] = (uint8_t)tu_rand(&rng);
        tt->t = (rlx_tensor){.dtype = types[i], .n_dims = 2, .shape = {rows[i], K, 1, 1}, .data = w};
        tt->info =
            (rlx_weight_info){.size = sizeof tt->info, .tensor = &tt->t, .name = "w", .op = RLX_OP_MATMUL, .input = 1};
        assert_true(kern_qrp_use(&tt->info));
        void *h;
        assert_ok(kern_prepare_qrp(&r->c, &tt->info, false, &h));
        tt->want = malloc(tt->bytes);
        memcpy(tt->want, ((const kern_qrp_weight *)h)->data, tt->bytes);
        kern_release_qrp(&r->c, h);
        assert_null(kern_qrp_find(&r->c, &tt->t));
    }
    r->baseline = atomic_load(&live_allocs);
    assert_int_equal(pthread_barrier_init(&r->bar, NULL, THREADS), 0);
}

/* Runs fn on THREADS threads, then checks that no copy is left and frees the run. */
static void run_threads(table_run *r, void *(*fn)(void *)) {
    pthread_t tid[THREADS];
    table_thread args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (table_thread){.run = r, .index = i, .rng = 17u + (uint64_t)i};
        assert_int_equal(pthread_create(&tid[i], NULL, fn, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(tid[i], NULL), 0);
    for (int i = 0; i < THREADS; i++)
        if (args[i].failures)
            fail_msg("%s (%d failures)", args[i].why, args[i].failures);
    if (r->held) {
        assert_ptr_equal(kern_qrp_find(&r->c, &r->t[0].t), r->held);
        kern_release_qrp(&r->c, r->held);
    }
    for (int i = 0; i < N_TENSORS; i++)
        assert_null(kern_qrp_find(&r->c, &r->t[i].t));
    assert_int_equal(atomic_load(&live_allocs), r->baseline);
    pthread_barrier_destroy(&r->bar);
    kern_deinit(&r->c);
    assert_int_equal(atomic_load(&live_allocs), 0);
    for (int i = 0; i < N_TENSORS; i++) {
        free(r->t[i].t.data);
        free(r->t[i].want);
    }
}

/* Rounds of: all threads prepare one tensor the table lacks at the same moment, compare what
 * they got, release it at once; thread 0 then finds nothing left. */
static void *same_tensor_at_once(void *arg) {
    table_thread *a = arg;
    table_run *r = a->run;
    for (int round = 0; round < r->iterations; round++) {
        const int i = round % N_TENSORS;
        pthread_barrier_wait(&r->bar);
        void *h = NULL;
        if (kern_prepare_qrp(&r->c, &r->t[i].info, false, &h) < 0)
            failure(a, "kern_prepare_qrp failed", i);
        r->got[a->index] = h;
        check_use(a, i, h);
        pthread_barrier_wait(&r->bar);
        for (int j = 0; j < THREADS; j++)
            if (r->got[j] != h)
                failure(a, "threads preparing it at once got different copies", i);
        pthread_barrier_wait(&r->bar);
        if (h)
            kern_release_qrp(&r->c, h);
        pthread_barrier_wait(&r->bar);
        if (a->index == 0 && kern_qrp_find(&r->c, &r->t[i].t))
            failure(a, "a copy is left after every use was released", i);
    }
    return NULL;
}

/* Two uses at a time of random tensors (possibly one tensor twice), released in either order;
 * tensor 0 stays held by the main thread, so each of its uses must get that copy. */
static void *prepare_and_release_at_random(void *arg) {
    table_thread *a = arg;
    table_run *r = a->run;
    for (int it = 0; it < r->iterations; it++) {
        const int i[2] = {(int)(tu_rand(&a->rng) % N_TENSORS), (int)(tu_rand(&a->rng) % N_TENSORS)};
        void *h[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            if (kern_prepare_qrp(&r->c, &r->t[i[k]].info, false, &h[k]) < 0)
                failure(a, "kern_prepare_qrp failed", i[k]);
            if (i[k] == 0 && h[k] != r->held)
                failure(a, "a use of the held tensor got another copy", 0);
        }
        if (i[0] == i[1] && h[0] != h[1])
            failure(a, "two uses of one tensor got different copies", i[0]);
        for (int k = 0; k < 2; k++)
            check_use(a, i[k], h[k]);
        const int first = (int)(tu_rand(&a->rng) & 1);
        for (int k = 0; k < 2; k++)
            if (h[k ^ first])
                kern_release_qrp(&r->c, h[k ^ first]);
    }
    return NULL;
}

static void test_threads_preparing_one_tensor_at_once_share_a_copy(void **state) {
    (void)state;
    table_run r;
    run_init(&r);
    r.iterations = 400;
    run_threads(&r, same_tensor_at_once);
}

static void test_threads_preparing_and_releasing_at_random_share_copies(void **state) {
    (void)state;
    table_run r;
    run_init(&r);
    r.iterations = 4000;
    assert_ok(kern_prepare_qrp(&r.c, &r.t[0].info, false, &r.held));
    run_threads(&r, prepare_and_release_at_random);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_preparing_one_tensor_at_once_share_a_copy),
        cmocka_unit_test(test_threads_preparing_and_releasing_at_random_share_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
