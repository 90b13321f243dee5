/* The x86 levels of the quantized kernels (kern_quant.h): kern_qsimd.inc compiled for AVX2,
 * for AVX-512 (F, BW, VL: the same 256-bit kernels with EVEX's 32 registers) and for AVX-512
 * with VNNI, which kern_qsimd_at picks at run time inside the AVX-512 level. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kern_qblock.h"

/* Fully unrolls the loop that follows (trip counts of at most 8 here). */
#define KS_UNROLL_ALL _Pragma("GCC unroll 16")
/* Bytes prefetched ahead of the weight block being read. */
#define KQ_AHEAD 1024

#define SFX(name) kern_q_##name##_avx2
#define KQ_TARGET __attribute__((target("avx2,fma,f16c")))
#define KQ_ISA_NAME "avx2"
#define KQ_DPBUSD(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#include "kern_qsimd.inc"

#define SFX(name) kern_q_##name##_avx512
#define KQ_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define KQ_ISA_NAME "avx512"
#define KQ_DPBUSD(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#include "kern_qsimd.inc"

#define SFX(name) kern_q_##name##_avx512_vnni
#define KQ_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define KQ_ISA_NAME "avx512-vnni"
#define KQ_DPBUSD(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#include "kern_qsimd.inc"
