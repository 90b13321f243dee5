/* The instruction-set levels of the in-tree backends' own kernels, and the one switch that
 * forces them down on any machine: the environment variable RLX_ISA (c, avx2, avx512, avx512_bf16 or amx), a
 * ceiling for every backend whose isa option is auto. A backend's explicit isa=... option
 * wins over it. Both exist so that every kernel path can be tested on a CPU that has a
 * better one (the suite runs the kit and the golden models at each level, tests/isa). */
#ifndef RLX_PLUGINS_ISA_H
#define RLX_PLUGINS_ISA_H

#include "rlx/plugin_iface.h"

/* The two levels above AVX-512 add BF16 matmuls with BF16 dot products, activations rounded to
 * BF16 (kern_bf16.h; cpu-blas uses them): PLUGIN_ISA_AVX512_BF16 on AVX512-BF16's VDPBF16PS
 * (AMD Zen 4 and 5, Intel Xeon), PLUGIN_ISA_AMX on Intel's AMX tiles (Xeon from Sapphire Rapids on),
 * which also take the integer sums of the 32-value quantized types' prefill (kern_qrp32.c, the
 * same bits as AVX-512). Every other kernel of both is the AVX-512 level's. */
typedef enum plugin_isa {
    PLUGIN_ISA_C = 0,
    PLUGIN_ISA_AVX2 = 1,
    PLUGIN_ISA_AVX512 = 2,
    PLUGIN_ISA_AVX512_BF16 = 3,
    PLUGIN_ISA_AMX = 4,
    PLUGIN_ISA_COUNT
} plugin_isa;

/* The best level this CPU runs: AVX-512 needs F, BW and VL (plus FMA and F16C), AVX2 needs
 * FMA and F16C; AVX512-BF16 needs AVX-512 and AVX512_BF16; AMX needs AVX512-BF16 plus AMX-TILE,
 * AMX-BF16 and AMX-INT8 and the kernel's leave to use the tile state (Linux grants it per process on
 * request: a CPU listing AMX in a VM whose host withholds the state is refused here, not met
 * with SIGILL later). */
plugin_isa plugin_isa_best(void);
/* "c", "avx2", "avx512", "avx512_bf16", "amx". */
const char *plugin_isa_name(plugin_isa isa);
/* The level for a backend's isa option `want` (NULL or "auto": the best one, capped by
 * $RLX_ISA; else that level, which the CPU must have). Returns RLX_OK with *out set, or a
 * negative status after host->error naming `plugin`, the value and where it came from. */
int plugin_isa_choose(const rlx_host *host, const char *plugin, const char *want, plugin_isa *out);

#endif
