/* rlx-conformance: the backend conformance kit. Shared types of its parts:
 *   main.c      options, the isolated worker process and the report
 *   checks.c    the list of checks: op cases with random inputs (compared with the reference
 *               kernels), NumPy fixtures, whole-model checks
 *   fixtures.c  reader of the NumPy expectation files (written by gen_expectations.py)
 *   node.c      a check's buffers and the kit's own dtype conversions (used by both above)
 *   run.c       runs one check against the backend under test (worker side), with
 *               judge.c, judge_calls.c, invariance.c and model.c behind runner.h
 * A check is one line of the report. Checks run in a worker process, so a backend that crashes
 * or hangs fails its check and the kit carries on with the next one in a new worker. */
#ifndef RLX_CONFORMANCE_KIT_H
#define RLX_CONFORMANCE_KIT_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/rlx.h"

enum { KIT_SRC_REF = 0, KIT_SRC_NUMPY = 1, KIT_SRC_MODEL = 2 };
enum { KIT_PASS = 0, KIT_FAIL = 1, KIT_NOT_CLAIMED = 2, KIT_SKIPPED = 3 };
/* What a model check compares. */
enum { KIT_MODEL_VS_REF = 0, KIT_MODEL_VS_GOLDEN = 1, KIT_MODEL_GREEDY = 2, KIT_MODEL_SPANS = 3 };

/* Bounds for backends that declare RLX_PRECISION_BF16_ACT (matmul inputs rounded to BF16).
 * A MATMUL is bounded elementwise: |got - exact| <= 2^-8 sum_k |x_k w_k| + the op's F32
 * tolerance, and must match the BF16-emulating reference kernels (act=bf16) within that F32
 * tolerance, since both round the same inputs. Where rounded values are themselves computed
 * (a MOE's expert intermediates, every layer of a model), two correct implementations round an
 * occasional value near a BF16 tie differently and the difference cascades: the stated relative
 * bounds below (x max(1, max|want|)) leave about 3x room over what F32 and F64 emulations of
 * the test models differ by (up to 4e-3 for whole models), and the exact ones 3-4x over the
 * measured BF16 error (MOE op up to 3e-3, whole models up to 1.3e-2). */
#define KIT_BF16_UNIT 0x1p-8
#define KIT_BF16_MOE_EXACT 1e-2
#define KIT_BF16_MOE_EMULATED 3e-3
#define KIT_BF16_MODEL_EXACT 5e-2
#define KIT_BF16_MODEL_EMULATED 1.2e-2

/* Backends that declare RLX_PRECISION_Q8_ACT on a quantized MATMUL quantize each block of x
 * (of the weight's block length) to int8 with d = max|x| / 127: an element moves by at most half
 * a step, d/2, plus 127 times the rounding of d where the block stores it as F16 (2^-11 d), so
 * |got - exact| <= 0.57 sum over blocks of d sum_k |w_k| (w dequantized exactly) + the op's F32
 * tolerance; for weights with a block minimum m (Q4_1, Q5_1) the F16 rounding of the block's sum
 * of x adds up to 2^-11 |m| |sum_k x_k|, which the kit allows twice over as 2^-10 |m| sum_k |x_k|. */
#define KIT_Q8_STEP 0.57
#define KIT_Q8_MIN_UNIT 0x1p-10

/* Tolerance slots: one per op (indexed by rlx_op) plus whole-model logits. */
#define KIT_TOL_MODEL RLX_OP_COUNT
#define KIT_N_TOL (RLX_OP_COUNT + 1)

typedef struct kit_check {
    int source;     /* KIT_SRC_* */
    uint32_t op;    /* rlx_op of an op check, 0 for a model check */
    int spec;       /* KIT_SRC_REF: index of the case in its op's table; model: KIT_MODEL_* */
    char *path;     /* KIT_SRC_NUMPY: fixture file; KIT_SRC_MODEL: model directory */
    char name[192]; /* also the node name the backend sees */
} kit_check;

typedef struct kit_result {
    int status;   /* KIT_* */
    double err;   /* max |got - want| (INFINITY for NaN), < 0 when not measured */
    double limit; /* tol * max(1, max |want|) */
    char detail[1024];
} kit_result;

/* One node ready to run: tensors with data, params, and what the output should be. */
typedef struct kit_node {
    uint32_t op;
    uint32_t n_inputs;
    rlx_tensor *in;     /* n_inputs */
    uint8_t *is_weight; /* n_inputs flags: WEIGHT role (the backend may keep the pointer) */
    rlx_tensor out;     /* F32; data NULL until run */
    rlx_op_params p;
    float *want;         /* expected output (NumPy), NULL: compare with the reference kernels */
    void *want_cache[2]; /* ATTENTION: expected k_cache and v_cache after the call (NumPy), in their dtype */
    double max_pos;      /* largest position the node reads (informational) */
    /* A recurrent op (SSM_CONV, GATED_DELTA; ABI 1.6) runs as n_calls calls over one state,
     * which each call updates: call k's inputs are calls[k * n_inputs + i], except its weights
     * and its state (data NULL there), which are in[i] for every call; in[] has call 0's shapes.
     * call_status[k] is RLX_OK or the error the contract makes call k return, leaving the state
     * as it was. n_calls 0: one call of in[]. */
    uint32_t n_calls;
    rlx_tensor *calls;
    int *call_status;
} kit_node;

typedef struct kit_options {
    const char *plugin;
    const char *plugin_dir;
    const char *backend_opts; /* rlx_backend_options.extra */
    const char *data_dir;     /* NumPy fixtures */
    const char *filter;       /* run checks whose name contains this */
    const char **model_dirs;
    size_t n_model_dirs;
    uint32_t threads;
    double timeout;         /* seconds per check */
    double tol[KIT_N_TOL];  /* in effect: defaults with the overrides applied */
    int tol_set[KIT_N_TOL]; /* overridden on the command line */
    int is_ref;             /* --plugin ref without options: the reference kernels against NumPy only */
    int builtin_ref;        /* --plugin ref, with or without --backend-opts (act=bf16) */
    int no_ref;             /* skip the comparisons with the reference kernels */
    int verbose;
} kit_options;

/* ---- checks.c ---- */
/* Default tolerance of op (relative to max(1, max |want|)). */
double kit_default_tol(int slot);
/* Appends every check to *list (grown with realloc). Returns 0, or -1 after printing why. */
int kit_enumerate(const kit_options *o, kit_check **list, size_t *n);
/* Fills node with the random inputs of a KIT_SRC_REF check; shapes only when with_data is 0. */
int kit_ref_node(const kit_check *c, kit_node *node, int with_data);
/* Whether a KIT_SRC_REF check is an ATTENTION invariance check: its node computed as one batch,
 * row by row, on one thread, and with slot 0's rows in other calls must give the same bits. */
int kit_ref_invariance(const kit_check *c);
/* Whether input i of an op node is state it updates (ATTENTION's caches, SSM_CONV's and
 * GATED_DELTA's states) rather than read-only. */
int kit_is_state(uint32_t op, uint32_t i);
/* Whether input i of node n is its state rows (ABI 1.7: a recurrent op's last input with
 * params.state_rows), which the op writes. */
int kit_is_state_rows(const kit_node *n, uint32_t i);
/* Tolerance for the node's op in effect (default or --tolerance / --precision). */
double kit_node_tol(const kit_options *o, const kit_node *node);

/* ---- fixtures.c ---- */
/* Reads a NumPy fixture: name (may be NULL) and, with with_data, inputs and expectations. */
int kit_fixture_read(const char *path, kit_node *node, char *name, size_t name_len, int with_data, char *why,
                     size_t why_len);

/* ---- run.c ---- */
typedef struct kit_runner kit_runner;
/* Loads the plugin and opens the backend (and the reference backend). On failure *out is NULL
 * and why says what happened. */
int kit_runner_open(const kit_options *o, kit_runner **out, char *why, size_t why_len);
void kit_runner_close(kit_runner *r);
/* One line describing the backend under test. */
const char *kit_runner_describe(const kit_runner *r);
void kit_run_check(kit_runner *r, const kit_check *c, kit_result *res);
/* Called with "supports", "compute", ... as a check moves on, so a crash can be placed. */
void kit_runner_on_phase(kit_runner *r, void (*fn)(void *ctx, const char *phase), void *ctx);

/* ---- node.c ---- */
/* Frees the buffers of node (inputs, output, expectations; run.c has set the data of the
 * weights it keeps to NULL) and its arrays. */
void kit_node_free(kit_node *node);
uint16_t kit_f32_to_bf16(float f);
uint16_t kit_f32_to_f16(float f);
float kit_bf16_to_f32(uint16_t h);
float kit_f16_to_f32(uint16_t h);
float kit_load(const void *data, uint32_t dtype, size_t i);
void *kit_alloc(size_t bytes); /* 64-byte aligned, zeroed; NULL on failure */

#endif
