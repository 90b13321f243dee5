/* cpu-blas's choice of OpenBLAS core (plugins/backend-cpu-blas/openblas.c): it overrides
 * OpenBLAS only where OpenBLAS would fall back to kernels without AVX2 on a CPU that has it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "openblas.h"

static const char *pick(bool avx2_fma, bool avx512, bool bf16, bool amd, const char *detected) {
    const cpu_blas_cpu cpu = {.avx2_fma = avx2_fma, .avx512 = avx512, .avx512_bf16 = bf16, .amd = amd};
    return cpu_blas_openblas_core(&cpu, detected);
}

static void test_generic_core_on_a_newer_cpu_is_replaced(void **state) {
    (void)state;
    /* Intel family 6 model 207 under OpenBLAS 0.3.21: Prescott, though it has AVX-512 (and BF16) */
    assert_string_equal(pick(true, true, true, false, "Prescott"), "Cooperlake");
    assert_string_equal(pick(true, true, false, false, "Prescott"), "SkylakeX");
    assert_string_equal(pick(true, false, false, false, "Prescott"), "Haswell");
    assert_string_equal(pick(true, false, false, true, "Prescott"), "Zen");
    assert_string_equal(pick(true, false, false, false, "Sandybridge"), "Haswell");
    assert_string_equal(pick(true, false, false, true, "Core2"), "Zen");
}

static void test_a_core_with_avx2_kernels_is_kept(void **state) {
    (void)state;
    assert_null(pick(true, false, false, true, "Zen")); /* this machine: AMD Zen 3 */
    assert_null(pick(true, true, false, false, "SkylakeX"));
    assert_null(pick(true, true, true, false, "Cooperlake"));
    assert_null(pick(true, true, false, false, "Haswell")); /* OpenBLAS saw no OS support for AVX-512 */
    assert_null(pick(true, false, false, false, "haswell"));
}

static void test_no_avx2_or_unknown_detection_keeps_openblas(void **state) {
    (void)state;
    assert_null(pick(false, false, false, false, "Prescott")); /* the right core for such a CPU */
    assert_null(pick(false, false, false, false, "Nehalem"));
    assert_null(pick(true, true, false, false, NULL)); /* the probe gave no answer */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generic_core_on_a_newer_cpu_is_replaced),
        cmocka_unit_test(test_a_core_with_avx2_kernels_is_kept),
        cmocka_unit_test(test_no_avx2_or_unknown_detection_keeps_openblas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
