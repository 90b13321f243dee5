/* The vector macro layers the ISA-generic kernels (kern_simd.inc) are compiled over, one per
 * instruction-set level, and the table of each level (kern_simd.h). */
#include "kern_simd.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "rlx/backend_iface.h"

/* Fully unrolls the loop that follows (all trip counts it is used on are at most 16). */
#define KS_UNROLL_ALL _Pragma("GCC unroll 16")
/* The block GEMV and the GEMM keep their accumulators in small local arrays that the Release
 * build holds in registers; AddressSanitizer puts them in memory and checks every access, which
 * made batch-invariant prefill about 50x slower than the Release build (a 482-token prompt took
 * 24 s in rlx serve: most of the serve tests' time). They are not instrumented, as the repacked
 * quantized kernels are not (CMakeLists.txt); UndefinedBehaviorSanitizer still covers them, and
 * test_kern runs them on buffers that end at a guard page and checks their bits. */
#define KS_NO_ASAN __attribute__((no_sanitize_address))
/* Bytes the stream GEMV prefetches ahead of the weight row it reads. */
#define KS_STREAM_AHEAD 1024

// ---------------------------------------------------------------------------------------------
// Portable C: VW = 1 and plain float arithmetic

static inline float kern_pow2i(int n) {
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define SFX(name) kern_##name##_c
#define KS_TARGET
#define KS_ISA_NAME "c"
#define KS_BLOCK_R(m) ((m) == 1 ? 4 : (m) == 2 ? 2 : 1)
#define KS_GEMM_M 2
#define KS_GEMM_R 2
#define KS_NREGS 16
#define KS_STREAM_U(m) ((m) <= 2 ? 4 : (m) <= 4 ? 2 : 1)
#define VW 1
#define VF float
#define VZERO() 0.0f
#define VSET1(s) (s)
#define VLD(p) (*(p))
#define VST(p, v) (*(p) = (v))
#define VADD(a, b) ((a) + (b))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VDIV(a, b) ((a) / (b))
#define VMAX(a, b) fmaxf(a, b)
#define VMIN(a, b) fminf(a, b)
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VHSUM(v) (v)
#define VHMAX(v) (v)
#define VLD_BF16(p) rlx_iface_bf16_to_f32(*(p))
#define VLD_F16(p) rlx_iface_f16_to_f32(*(p))
#define VLD_I8(p) ((float)*(p))
#define VSET1_F16(h) rlx_iface_f16_to_f32(h)
#define VST_BF16(p, v) (*(p) = rlx_iface_f32_to_bf16(v))
#define VST_F16(p, v) (*(p) = rlx_iface_f32_to_f16(v))
#define VROUND(v) rintf(v)
#define VPOW2I(n) kern_pow2i((int)(n))
#include "kern_simd.inc"

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C: 8 floats per vector, 16 registers

#define KS_TARGET __attribute__((target("avx2,fma,f16c")))

static inline __attribute__((always_inline)) KS_TARGET float kern_hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) KS_TARGET float kern_hmax_avx2(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 floats to BF16, as rlx_iface_f32_to_bf16 does one. */
static inline __attribute__((always_inline)) KS_TARGET void kern_st_bf16_avx2(uint16_t *p, __m256 v) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    /* every lane is below 0x10000, so the unsigned saturating pack is exact */
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)p, h);
}

#define SFX(name) kern_##name##_avx2
#define KS_ISA_NAME "avx2"
#define KS_BLOCK_R(m) ((m) == 1 ? 8 : (m) == 2 ? 4 : (m) <= 4 ? 2 : 1)
#define KS_GEMM_M 3
#define KS_GEMM_R 4
#define KS_NREGS 16
#define KS_STREAM_U(m) ((m) <= 2 ? 4 : (m) <= 4 ? 2 : 1)
#define VW 8
#define VF __m256
#define VZERO() _mm256_setzero_ps()
#define VSET1(s) _mm256_set1_ps(s)
#define VLD(p) _mm256_loadu_ps(p)
#define VST(p, v) _mm256_storeu_ps(p, v)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VHSUM(v) kern_hsum_avx2(v)
#define VHMAX(v) kern_hmax_avx2(v)
#define VLD_BF16(p)                                                                                                    \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VLD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VLD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VSET1_F16(h) _mm256_set1_ps(_cvtsh_ss(h))
#define VST_BF16(p, v) kern_st_bf16_avx2(p, v)
#define VST_F16(p, v)                                                                                                  \
    _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define VROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n)                                                                                                      \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#include "kern_simd.inc"

// ---------------------------------------------------------------------------------------------
// AVX-512 (F, BW, VL): 16 floats per vector, 32 registers

#define KS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

/* 16 floats to BF16, as rlx_iface_f32_to_bf16 does one. */
static inline __attribute__((always_inline)) KS_TARGET void kern_st_bf16_avx512(uint16_t *p, __m512 v) {
    const __m512i b = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), qnan);
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r)); /* lanes < 0x10000: exact */
}

#define SFX(name) kern_##name##_avx512
#define KS_ISA_NAME "avx512"
#define KS_BLOCK_R(m) ((m) == 1 ? 8 : (m) <= 4 ? 4 : 2)
#define KS_GEMM_M 4
#define KS_GEMM_R 6
#define KS_NREGS 32
#define KS_STREAM_U(m) ((m) <= 4 ? 4 : 2)
#define VW 16
#define VF __m512
#define VZERO() _mm512_setzero_ps()
#define VSET1(s) _mm512_set1_ps(s)
#define VLD(p) _mm512_loadu_ps(p)
#define VST(p, v) _mm512_storeu_ps(p, v)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VLD_BF16(p)                                                                                                    \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VLD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VLD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VSET1_F16(h) _mm512_set1_ps(_cvtsh_ss(h))
#define VST_BF16(p, v) kern_st_bf16_avx512(p, v)
#define VST_F16(p, v)                                                                                                  \
    _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define VROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n)                                                                                                      \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#include "kern_simd.inc"

const kern_simd *kern_simd_at(plugin_isa isa) {
    /* the levels above AVX-512 run its kernels, plus their BF16 matmuls (kern_bf16.h) */
    static const kern_simd *const by_isa[PLUGIN_ISA_COUNT] = {&kern_simd_c, &kern_simd_avx2, &kern_simd_avx512,
                                                              &kern_simd_avx512, &kern_simd_avx512};
    return isa < PLUGIN_ISA_COUNT ? by_isa[isa] : by_isa[PLUGIN_ISA_C];
}
