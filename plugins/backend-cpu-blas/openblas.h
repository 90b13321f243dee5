/* OpenBLAS for cpu-blas, loaded at run time rather than linked, so that the plugin can choose
 * OpenBLAS's kernels (OPENBLAS_CORETYPE) before OpenBLAS's load-time constructor reads it. The
 * reason: a DYNAMIC_ARCH OpenBLAS (Debian 12 ships 0.3.21) that does not know a CPU model falls
 * back to its generic Prescott kernels, several times slower than the AVX2/AVX-512 ones the CPU
 * could run. A user's own OPENBLAS_CORETYPE always wins. */
#ifndef RLX_CPU_BLAS_OPENBLAS_H
#define RLX_CPU_BLAS_OPENBLAS_H

#include <stdbool.h>

#include <cblas.h>

#include "rlx/plugin_iface.h"

/* What of the CPU decides OpenBLAS's core. */
typedef struct cpu_blas_cpu {
    bool avx2_fma;    /* AVX2 and FMA */
    bool avx512;      /* AVX-512 F, BW, VL, DQ and CD (what OpenBLAS's SkylakeX kernels use) */
    bool avx512_bf16; /* AVX512_BF16 too (Cooperlake kernels) */
    bool amd;
} cpu_blas_cpu;

cpu_blas_cpu cpu_blas_cpu_detect(void);

/* The OPENBLAS_CORETYPE to set for `cpu` when OpenBLAS left alone picks `detected`: the best
 * core OpenBLAS 0.3.21 has for the CPU when `detected` is one without AVX2 kernels on a CPU
 * that has AVX2 (its fallback for models it does not know), else NULL: keep OpenBLAS's choice,
 * also when `detected` is unknown (NULL). */
const char *cpu_blas_openblas_core(const cpu_blas_cpu *cpu, const char *detected);

/* The OpenBLAS functions cpu-blas calls, and how its core was chosen. */
typedef struct cpu_blas_openblas {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    __typeof__(openblas_set_num_threads) *set_num_threads;
    __typeof__(openblas_get_num_threads) *get_num_threads;
    __typeof__(openblas_get_config) *get_config;
    __typeof__(openblas_get_corename) *get_corename;
    char origin[512]; /* "chosen by OpenBLAS", "OPENBLAS_CORETYPE set by the user", ... */
} cpu_blas_openblas;

/* Loads OpenBLAS once per process (it is never unloaded: its threads outlive any instance).
 * Returns the table, or NULL after host->error when the library or a function is missing. */
const cpu_blas_openblas *cpu_blas_openblas_load(const rlx_host *host);

#endif
