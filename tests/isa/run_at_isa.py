#!/usr/bin/python3
"""Runs a command with every kernel library forced down to one ISA level.

  run_at_isa.py LEVEL -- COMMAND [ARGS...]

LEVEL is c, avx2, avx512, avx512_bf16 or amx. The command runs with rlx's own kernels capped by
RLX_ISA, oneDNN's by DNNL_MAX_CPU_ISA and OpenBLAS's core set by OPENBLAS_CORETYPE, so the paths
a better CPU would never take are tested on it. A level this CPU lacks prints why and exits 77,
which ctest reports as skipped (never as passed).
"""
import os
import sys

SKIP = 77
# level: (CPU flags it needs, RLX_ISA, DNNL_MAX_CPU_ISA, OPENBLAS_CORETYPE)
LEVELS = {
    "c": ((), "c", "SSE41", "Prescott"),
    "avx2": (("avx2", "fma", "f16c"), "avx2", "AVX2", "Haswell"),
    "avx512": (("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"),
               "avx512", "AVX512_CORE", "SkylakeX"),
    "avx512_bf16": (("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
                     "avx512_bf16"), "avx512_bf16", "AVX512_CORE_BF16", "Cooperlake"),
    # rlx's BF16 matmuls on AMX tiles (cpu-blas) and oneDNN's AMX kernels; the process must also
    # be granted the tile state, which the backends ask for and refuse the level without (the
    # level below keeps cpu-blas on AVX512-BF16 dot products, oneDNN on AVX512_CORE_BF16)
    "amx": (("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
             "avx512_bf16", "amx_tile", "amx_bf16"), "amx", "AVX512_CORE_AMX", "Cooperlake"),
}


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def main(argv):
    if len(argv) < 3 or argv[1] != "--" or argv[0] not in LEVELS:
        print(f"usage: run_at_isa.py {{{'|'.join(LEVELS)}}} -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    needs, rlx_isa, dnnl_isa, blas_core = LEVELS[argv[0]]
    flags = cpu_flags()
    missing = [f for f in needs if f not in flags]
    if missing:
        print(f"SKIPPED: ISA level {argv[0]}: this CPU lacks {' '.join(missing)}")
        return SKIP
    os.environ.update(RLX_ISA=rlx_isa, DNNL_MAX_CPU_ISA=dnnl_isa, OPENBLAS_CORETYPE=blas_core)
    sys.stdout.flush()
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
