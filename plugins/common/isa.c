/* Kernel ISA levels: see isa.h. */
#include "isa.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[PLUGIN_ISA_COUNT] = {"c", "avx2", "avx512"};

plugin_isa plugin_isa_best(void) {
    __builtin_cpu_init();
    const bool fma = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return PLUGIN_ISA_AVX512;
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
            return host->error(RLX_E_INVALID, "%s: RLX_ISA='%s' is not one of c, avx2, avx512", plugin, cap);
        *out = (plugin_isa)level < best ? (plugin_isa)level : best;
        return RLX_OK;
    }
    *out = best;
    return RLX_OK;
}
