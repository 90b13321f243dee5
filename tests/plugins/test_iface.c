/* The static inline helpers of the plugin-side headers (rlx/backend_iface.h,
 * rlx/transport_iface.h, rlx/plugin_iface.h), against expectations that do not come from them:
 * bit patterns worked out by hand, and a table NumPy writes (iface_ref.py). Only the iface
 * headers are included, as a plugin would. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rlx/backend_iface.h"
#include "rlx/transport_iface.h"

#define CASES RLX_TEST_DATA "/iface_cases.txt"

static uint32_t f32_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float bits_f32(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static void test_numel_rows_cols_and_dtype_size(void **state) {
    (void)state;
    const rlx_tensor t = {.dtype = RLX_DTYPE_F32, .n_dims = 3, .shape = {2, 3, 5, 7}};
    assert_int_equal(rlx_iface_numel(&t), 30); /* the unused 4th entry is not counted */
    assert_int_equal(rlx_iface_rows(&t), 6);
    assert_int_equal(rlx_iface_cols(&t), 5);
    const rlx_tensor v = {.n_dims = 1, .shape = {9, 1, 1, 1}};
    assert_int_equal(rlx_iface_numel(&v), 9);
    assert_int_equal(rlx_iface_rows(&v), 1);
    assert_int_equal(rlx_iface_dtype_size(RLX_DTYPE_F32), 4);
    assert_int_equal(rlx_iface_dtype_size(RLX_DTYPE_I32), 4);
    assert_int_equal(rlx_iface_dtype_size(RLX_DTYPE_BF16), 2);
    assert_int_equal(rlx_iface_dtype_size(RLX_DTYPE_F16), 2);
    assert_int_equal(rlx_iface_dtype_size(RLX_DTYPE_COUNT), 0);
    assert_int_equal(rlx_iface_dtype_size(0xffffffffu), 0);
}

static void test_bf16_by_hand(void **state) {
    (void)state;
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000, 0x3f80},                       /* 1.0 */
        {0x3f808000, 0x3f80},                       /* tie, lower neighbour even: stays */
        {0x3f818000, 0x3f82},                       /* tie, lower neighbour odd: up to even */
        {0x3f808001, 0x3f81},                       /* just past the tie: up */
        {0x3f807fff, 0x3f80},                       /* just below the tie: down */
        {0xbf818000, 0xbf82},                       /* negative ties go away from zero to even too */
        {0x7f7fffff, 0x7f80},                       /* past the largest BF16: infinity */
        {0x7f800000, 0x7f80},                       /* infinity */
        {0xff800000, 0xff80}, {0x80000000, 0x8000}, /* -0 keeps its sign */
        {0x00000001, 0x0000},                       /* F32 denormals round like any other value */
        {0x00008000, 0x0000}, {0x00018000, 0x0002}, {0x7fc00000, 0x7fc0}, /* quiet NaN */
        {0x7f800001, 0x7fc0}, /* signalling NaN whose payload is all below: NaN, not infinity */
        {0xff80ffff, 0xffc0}, /* a payload that would carry into the exponent: still NaN */
        {0x7fffffff, 0x7fff},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = rlx_iface_f32_to_bf16(bits_f32(cases[i].in));
        if (got != cases[i].out)
            fail_msg("bf16(%08x) = %04x, want %04x", cases[i].in, got, cases[i].out);
    }
    assert_int_equal(f32_bits(rlx_iface_bf16_to_f32(0x3f81)), 0x3f810000);
    assert_int_equal(f32_bits(rlx_iface_bf16_to_f32(0xffc1)), 0xffc10000);
}

static void test_f16_by_hand(void **state) {
    (void)state;
    static const struct {
        uint32_t in;
        uint16_t out;
    } narrow[] = {
        {0x3f800000, 0x3c00},                       /* 1.0 */
        {0x3f801000, 0x3c00},                       /* 1 + 2^-11: tie, even stays */
        {0x3f803000, 0x3c02},                       /* 1 + 3 * 2^-11: tie, odd goes up */
        {0x3f801001, 0x3c01}, {0x477fe000, 0x7bff}, /* 65504, the largest F16 */
        {0x477fefff, 0x7bff},                       /* just below 65520 */
        {0x477ff000, 0x7c00},                       /* 65520: the tie with 65536 rounds to even, i.e. infinity */
        {0x7f7fffff, 0x7c00}, {0xc77ff000, 0xfc00}, {0x38800000, 0x0400}, /* 2^-14, the smallest normal */
        {0x387fc000, 0x03ff},                                             /* the largest subnormal */
        {0x387fe000, 0x0400}, /* halfway above it: rounds (to even) into the smallest normal */
        {0x33800000, 0x0001}, /* 2^-24, the smallest subnormal */
        {0x33000000, 0x0000}, /* 2^-25: the tie with zero goes to zero */
        {0x33000001, 0x0001}, /* just above it: up */
        {0x33c00000, 0x0002}, /* 1.5 * 2^-24: tie, odd goes up */
        {0x34200000, 0x0002}, /* 2.5 * 2^-24: tie, even stays */
        {0x00000001, 0x0000}, /* F32 denormal */
        {0x80000001, 0x8000}, /* keeps the sign */
        {0x7f800000, 0x7c00}, {0xff800000, 0xfc00}, {0x7fc00000, 0x7e00},
        {0x7f800001, 0x7e00}, /* signalling NaN: quiet, not infinity */
        {0xffc02000, 0xfe01}, /* sign and the top payload bits kept */
    };
    for (size_t i = 0; i < sizeof narrow / sizeof narrow[0]; i++) {
        const uint16_t got = rlx_iface_f32_to_f16(bits_f32(narrow[i].in));
        if (got != narrow[i].out)
            fail_msg("f16(%08x) = %04x, want %04x", narrow[i].in, got, narrow[i].out);
    }
    static const struct {
        uint16_t in;
        uint32_t out;
    } widen[] = {
        {0x0001, 0x33800000}, {0x03ff, 0x387fc000}, {0x0400, 0x38800000}, {0x3c00, 0x3f800000},
        {0x7bff, 0x477fe000}, {0x7c00, 0x7f800000}, {0xfc00, 0xff800000}, {0x7e00, 0x7fc00000},
        {0x7c01, 0x7f802000}, {0x8000, 0x80000000}, {0x8001, 0xb3800000},
    };
    for (size_t i = 0; i < sizeof widen / sizeof widen[0]; i++) {
        const uint32_t got = f32_bits(rlx_iface_f16_to_f32(widen[i].in));
        if (got != widen[i].out)
            fail_msg("f32(f16 %04x) = %08x, want %08x", widen[i].in, got, widen[i].out);
    }
    const uint16_t w[3] = {0x3c00, 0xc000, 0x3800};
    assert_true(rlx_iface_load_f32(RLX_DTYPE_F16, w, 1) == -2.0f);
    assert_true(rlx_iface_load_f32(RLX_DTYPE_BF16, w, 0) == bits_f32(0x3c000000));
    const float f[2] = {0.25f, 3.0f};
    assert_true(rlx_iface_load_f32(RLX_DTYPE_F32, f, 1) == 3.0f);
}

static void test_conversions_match_numpy(void **state) {
    (void)state;
    FILE *fp = fopen(CASES, "r");
    assert_non_null(fp);
    char kind;
    unsigned a, b, c;
    size_t n_widen = 0, n_narrow = 0, bad = 0;
    while (fscanf(fp, " %c", &kind) == 1) {
        if (kind == 'h' && fscanf(fp, "%x %x", &a, &b) == 2) {
            const uint32_t got = f32_bits(rlx_iface_f16_to_f32((uint16_t)a));
            if (got != b && bad++ < 10)
                print_error("f16 %04x -> %08x, numpy %08x\n", a, got, b);
            n_widen++;
        } else if (kind == 'f' && fscanf(fp, "%x %x %x", &a, &b, &c) == 3) {
            const uint16_t h = rlx_iface_f32_to_f16(bits_f32(a)), bf = rlx_iface_f32_to_bf16(bits_f32(a));
            if ((h != b || bf != c) && bad++ < 10)
                print_error("f32 %08x -> f16 %04x bf16 %04x, want %04x %04x\n", a, h, bf, b, c);
            n_narrow++;
        } else {
            fail_msg("malformed line in %s", CASES);
        }
    }
    fclose(fp);
    assert_int_equal(n_widen, 65536);
    assert_true(n_narrow > 10000);
    assert_int_equal(bad, 0);
}

static void test_option_scanner_reads_items(void **state) {
    (void)state;
    const char *cursor = "isa=avx2,tile_kb=64,path=/a=b,";
    rlx_iface_option o;
    char err[128] = "";
    assert_int_equal(rlx_iface_option_next(&cursor, &o, err, sizeof err), 1);
    assert_true(rlx_iface_option_is(&o, "isa"));
    assert_false(rlx_iface_option_is(&o, "is"));
    assert_string_equal(o.value, "avx2");
    assert_int_equal(o.item_len, 8);
    assert_int_equal(rlx_iface_option_next(&cursor, &o, err, sizeof err), 1);
    long long n = -1;
    assert_true(rlx_iface_option_is(&o, "tile_kb") && rlx_iface_option_int(&o, 16, 65536, &n));
    assert_int_equal(n, 64);
    assert_int_equal(rlx_iface_option_next(&cursor, &o, err, sizeof err), 1);
    assert_string_equal(o.value, "/a=b");                                     /* only the first '=' splits */
    assert_int_equal(rlx_iface_option_next(&cursor, &o, err, sizeof err), 0); /* a trailing comma ends it */
    cursor = NULL;
    assert_int_equal(rlx_iface_option_next(&cursor, &o, err, sizeof err), 0);
    cursor = "";
    assert_int_equal(rlx_iface_option_next(&cursor, &o, err, sizeof err), 0);
}

static void expect_option_error(const char *options, const char *message) {
    const char *cursor = options;
    rlx_iface_option o;
    char err[128] = "";
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0)
        ;
    if (rc != RLX_E_INVALID || !strstr(err, message))
        fail_msg("'%s': rc %d, message '%s', want '%s'", options, rc, err, message);
}

static void test_option_scanner_rejects_malformed_items(void **state) {
    (void)state;
    expect_option_error("bogus", "option 'bogus' is not key=value");
    expect_option_error("a=1,bogus,b=2", "option 'bogus' is not key=value");
    expect_option_error("=x", "option '=x' is not key=value");
    expect_option_error("a=1,,b=2", "option '' is not key=value");
    expect_option_error("a=", "option 'a' needs a value of 1 to 4095 bytes");
    char long_value[RLX_IFACE_OPTION_VALUE_MAX + 8] = "k=";
    memset(long_value + 2, 'v', RLX_IFACE_OPTION_VALUE_MAX);
    expect_option_error(long_value, "option 'k' needs a value of 1 to 4095 bytes");
    /* a short buffer still gets a terminated, truncated message */
    const char *cursor = "bogus";
    rlx_iface_option o;
    char tiny[8];
    assert_int_equal(rlx_iface_option_next(&cursor, &o, tiny, sizeof tiny), RLX_E_INVALID);
    assert_string_equal(tiny, "option ");
}

static bool option_int(const char *value, long long min, long long max, long long *out) {
    rlx_iface_option o;
    snprintf(o.value, sizeof o.value, "%s", value);
    o.value_len = strlen(o.value);
    return rlx_iface_option_int(&o, min, max, out);
}

static bool option_size(const char *value, unsigned long long max, unsigned long long *out) {
    rlx_iface_option o;
    snprintf(o.value, sizeof o.value, "%s", value);
    o.value_len = strlen(o.value);
    return rlx_iface_option_size(&o, 1, max, out);
}

static void test_option_numbers(void **state) {
    (void)state;
    long long n = 7;
    assert_true(option_int("-5", -10, 10, &n) && n == -5);
    assert_true(option_int("0", 0, 0, &n) && n == 0);
    assert_true(option_int("9223372036854775807", 0, INT64_MAX, &n) && n == INT64_MAX);
    assert_true(option_int("-9223372036854775808", INT64_MIN, 0, &n) && n == INT64_MIN);
    n = 7;
    const char *bad[] = {"+5", " 5", "5 ", "5x", "", "-", "0x10", "9223372036854775808", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (option_int(bad[i], INT64_MIN, INT64_MAX, &n))
            fail_msg("'%s' read as an integer", bad[i]);
    assert_false(option_int("11", 0, 10, &n));
    assert_false(option_int("-1", 0, 10, &n));
    assert_int_equal(n, 7); /* untouched by a failure */

    unsigned long long v = 0;
    assert_true(option_size("64M", 1ull << 40, &v) && v == 64ull << 20);
    assert_true(option_size("3k", 1ull << 40, &v) && v == 3072);
    assert_true(option_size("1024G", 1ull << 40, &v) && v == 1ull << 40);
    assert_false(option_size("1025G", 1ull << 40, &v));
    assert_true(option_size("2G", (unsigned long long)INT32_MAX + 1, &v) && v == 1ull << 31);
    assert_true(option_size("18446744073709551615", ~0ull, &v) && v == ~0ull);
    assert_false(option_size("18446744073709551616", ~0ull, &v));
    assert_false(option_size("3G", (unsigned long long)INT32_MAX + 1, &v));
    const char *bad_sizes[] = {"0", "1T", "K", "-1", "1KK", "1 K", "18446744073709551615K"};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++)
        if (option_size(bad_sizes[i], ~0ull, &v))
            fail_msg("'%s' read as a size", bad_sizes[i]);
}

static void test_split_address_accepts(void **state) {
    (void)state;
    static const struct {
        const char *address, *host;
        unsigned port;
    } good[] = {
        {"127.0.0.1:7101", "127.0.0.1", 7101},
        {"localhost:0", "localhost", 0},
        {"node-3.example:65535", "node-3.example", 65535},
        {":80", "", 80},
        {"[::1]:7101", "::1", 7101},
        {"[fe80::1%eth0]:1", "fe80::1%eth0", 1},
        {"[]:5", "", 5},
        {"h:080", "h", 80},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char host[64] = "x", err[128] = "";
        unsigned port = 1234567;
        if (rlx_iface_split_address(good[i].address, host, sizeof host, &port, err, sizeof err) != RLX_OK)
            fail_msg("'%s' refused: %s", good[i].address, err);
        assert_string_equal(host, good[i].host);
        assert_int_equal(port, good[i].port);
    }
}

static void test_split_address_rejects(void **state) {
    (void)state;
    static const struct {
        const char *address, *message;
    } bad[] = {
        {"localhost", "address 'localhost' has no port (want host:port)"},
        {"[::1]", "address '[::1]' is not [IPv6]:port"},
        {"[::1:80", "is not [IPv6]:port"},
        {"::1:80", "address '::1:80': write IPv6 addresses as [addr]:port"},
        {"h:65536", "address 'h:65536': port must be a number from 0 to 65535"},
        {"h:", "port must be"},
        {"h:-1", "port must be"},
        {"h:+1", "port must be"},
        {"h: 1", "port must be"},
        {"h:1x", "port must be"},
        {"h:000001", "port must be"},
        {"h:99999999999999999999", "port must be"},
        {"a-rather-long-host-name:1", "address 'a-rather-long-host-name:1': host name too long"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[16] = "x", err[128] = "";
        unsigned port = 42;
        const int rc = rlx_iface_split_address(bad[i].address, host, sizeof host, &port, err, sizeof err);
        if (rc != RLX_E_INVALID || !strstr(err, bad[i].message))
            fail_msg("'%s': rc %d, message '%s', want '%s'", bad[i].address, rc, err, bad[i].message);
        assert_int_equal(port, 42);
    }
    char host[16], err[64];
    unsigned port;
    assert_int_equal(rlx_iface_split_address(NULL, host, sizeof host, &port, err, sizeof err), RLX_E_INVALID);
    assert_string_equal(err, "address is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numel_rows_cols_and_dtype_size),
        cmocka_unit_test(test_bf16_by_hand),
        cmocka_unit_test(test_f16_by_hand),
        cmocka_unit_test(test_conversions_match_numpy),
        cmocka_unit_test(test_option_scanner_reads_items),
        cmocka_unit_test(test_option_scanner_rejects_malformed_items),
        cmocka_unit_test(test_option_numbers),
        cmocka_unit_test(test_split_address_accepts),
        cmocka_unit_test(test_split_address_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
