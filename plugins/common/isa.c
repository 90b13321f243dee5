/* Kernel ISA levels: see isa.h. */
#include "isa.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const names[PLUGIN_ISA_COUNT] = {"c", "avx2", "avx512", "avx512_bf16", "amx"};

/* Linux's arch_prctl request for an extended state component, and AMX's tile data component. */
#define ISA_ARCH_REQ_XCOMP_PERM 0x1023
#define ISA_XFEATURE_XTILEDATA 18

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

/* CPUID.(7,0):EDX bit 22 is AMX-BF16, bit 24 AMX-TILE and bit 25 AMX-INT8 (the level multiplies
 * BF16 and quantized weights on tiles); the kernel then has to grant the process the tile data
 * state, once for all its threads. */
static void amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return;
    amx_ok = syscall(SYS_arch_prctl, ISA_ARCH_REQ_XCOMP_PERM, ISA_XFEATURE_XTILEDATA) == 0;
}

plugin_isa plugin_isa_best(void) {
    __builtin_cpu_init();
    const bool fma = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
        if (!__builtin_cpu_supports("avx512bf16"))
            return PLUGIN_ISA_AVX512;
        pthread_once(&amx_once, amx_probe);
        return amx_ok ? PLUGIN_ISA_AMX : PLUGIN_ISA_AVX512_BF16;
    }
    return fma && __builtin_cpu_supports("avx2") ? PLUGIN_ISA_AVX2 : PLUGIN_ISA_C;
}

const char *plugin_isa_name(plugin_isa isa) { return isa < PLUGIN_ISA_COUNT ? names[isa] : "?"; }

static int lookup(const char *name) {
    for (int i = 0; i < PLUGIN_ISA_COUNT; i++)
        if (!strcmp(name, names[i]))
            return i;
    return -1;
}

int plugin_isa_choose(const rlx_host *host, const char *plugin, const char *want, plugin_isa *out) {
    const plugin_isa best = plugin_isa_best();
    if (want && strcmp(want, "auto") != 0) {
        const int level = lookup(want);
        if (level < 0 || (plugin_isa)level > best)
            return host->error(RLX_E_UNSUPPORTED, "%s: isa '%s' is unknown or not supported by this CPU (best: %s)",
                               plugin, want, names[best]);
        *out = (plugin_isa)level;
        return RLX_OK;
    }
    const char *cap = getenv("RLX_ISA");
    if (cap && *cap) {
        const int level = lookup(cap);
        if (level < 0)
            return host->error(RLX_E_INVALID, "%s: RLX_ISA='%s' is not one of c, avx2, avx512, avx512_bf16, amx",
                               plugin, cap);
        *out = (plugin_isa)level < best ? (plugin_isa)level : best;
        return RLX_OK;
    }
    *out = best;
    return RLX_OK;
}
