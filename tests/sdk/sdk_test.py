#!/usr/bin/python3
"""The rlx SDK used from outside: install, build an out-of-tree backend, load it, check it.

  sdk_test.py --build BUILD --source SRC --work DIR --cmake CMAKE --cc CC --version V [--sanitize]

Steps, each asserting:
  1. `cmake --install BUILD --prefix DIR/prefix` lays out bin/rlx, bin/rlx-conformance,
     lib/librlx.so, include/rlx/*.h, lib/pkgconfig/rlx.pc, lib/cmake/rlx/rlxConfig*.cmake,
     the installed cpu-blas plugin and the kit's NumPy expectations.
  2. The example backend, copied out of the source tree, configures and builds against the
     prefix alone: with find_package(rlx) (CMAKE_PREFIX_PATH) and with pkg-config.
  3. `rlx plugins --plugin-dir` lists it; `rlx graph` runs matmuls on it and attention on the
     reference kernels.
  4. `rlx generate --plugin example --plugin-dir ...` on a dense-tied model gives the same
     greedy ids as cpu-blas (on a prompt whose greedy path is well conditioned).
  5. `rlx-conformance --plugin example` passes with the ops it does not claim reported as
     NOT CLAIMED (attention, rope, ...), including the whole-model checks against NumPy.
  6. tests/model/check_golden.py passes with `-- --plugin example --plugin-dir ...`.
  7. pkg-config: --modversion, --variable=plugindir, and a C program compiled with
     `pkg-config --cflags --libs rlx` runs an ADD on the example backend.
  8. find_package(rlx): an application linking rlx::rlx runs an ADD on the installed cpu-blas;
     asking for rlx 9.0 fails at configure time.
  9. `cmake --install` of the example puts it in the plugin folder, where rlx finds it without
     --plugin-dir.
 10. The C example of docs/embedding.md, compiled with pkg-config against the prefix, opens the
     model through rlx_runtime_open with its matmuls placed on the example backend and prints
     the same greedy ids as `rlx generate`.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys


class Failure(Exception):
    pass


def run(cmd, env, cwd=None, expect=0, timeout=900):
    done = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=timeout)
    ok = done.returncode == expect if expect is not None else True
    if not ok:
        raise Failure(f"exit status {done.returncode} (expected {expect}): {shlex.join(cmd)}\n"
                      f"{done.stdout[-6000:]}")
    return done.stdout


def step(text):
    print(f"sdk: {text}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--version", required=True)
    ap.add_argument("--libdir", default="lib", help="CMAKE_INSTALL_LIBDIR of the build")
    ap.add_argument("--sanitize", action="store_true", help="the build uses ASan/UBSan")
    args = ap.parse_args()
    py = sys.executable
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prefix = os.path.join(work, "prefix")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RLX_PLUGIN_PATH", "RLX_MODEL", "RLX_CONFORMANCE_DATA", "PKG_CONFIG_PATH",
                        "CMAKE_PREFIX_PATH", "LD_LIBRARY_PATH")}
    san = ["-fsanitize=address,undefined"] if args.sanitize else []

    step("1. install the build tree to " + prefix)
    run([args.cmake, "--install", args.build, "--prefix", prefix], env)
    lib = args.libdir
    plugin_dir = os.path.join(prefix, lib, "rlx", "plugins")
    for rel in ["bin/rlx", "bin/rlx-conformance", f"{lib}/librlx.so", "include/rlx/rlx.h", "include/rlx/backend.h",
                f"{lib}/pkgconfig/rlx.pc", f"{lib}/cmake/rlx/rlxConfig.cmake", f"{lib}/cmake/rlx/rlxConfigVersion.cmake",
                f"{lib}/cmake/rlx/rlxTargets.cmake", f"{lib}/rlx/plugins/rlx-backend-cpu-blas.so",
                "share/rlx/conformance/MANIFEST"]:
        if not os.path.exists(os.path.join(prefix, rel)):
            raise Failure(f"install: {rel} missing from the prefix")
    # CMake searches <prefix>/lib/cmake by itself; another libdir (lib64 on Debian) needs rlx_DIR
    find_rlx = [f"-DCMAKE_PREFIX_PATH={prefix}"]
    if lib != "lib":
        find_rlx.append(f"-Drlx_DIR={os.path.join(prefix, lib, 'cmake', 'rlx')}")
    rlx = os.path.join(prefix, "bin", "rlx")
    kit = os.path.join(prefix, "bin", "rlx-conformance")

    step("2. build the example backend against the prefix (find_package, then pkg-config)")
    src = os.path.join(work, "example-src")  # a copy: the build cannot reach into our tree
    shutil.copytree(os.path.join(args.source, "share", "examples", "backend-example"), src)
    exb = os.path.join(work, "example-build")
    run([args.cmake, "-S", src, "-B", exb, *find_rlx, f"-DCMAKE_C_COMPILER={args.cc}",
         "-DCMAKE_BUILD_TYPE=Release"], env)
    run([args.cmake, "--build", exb], env)
    pc_env = dict(env, PKG_CONFIG_PATH=os.path.join(prefix, lib, "pkgconfig"))
    exb_pc = os.path.join(work, "example-build-pkgconfig")
    run([args.cmake, "-S", src, "-B", exb_pc, "-DEXAMPLE_USE_PKGCONFIG=ON", f"-DCMAKE_C_COMPILER={args.cc}"],
        pc_env)
    run([args.cmake, "--build", exb_pc], pc_env)
    for d in (exb, exb_pc):
        if not os.path.exists(os.path.join(d, "rlx-backend-example.so")):
            raise Failure(f"{d}: no rlx-backend-example.so")

    step("3. rlx finds the example and splits the graph between it and the reference kernels")
    out = run([rlx, "plugins", "--plugin-dir", exb], env)
    if not re.search(r"\bexample\b", out):
        raise Failure(f"rlx plugins --plugin-dir {exb} does not list 'example':\n{out}")
    model = os.path.join(work, "model")
    run([py, os.path.join(args.source, "tests", "model", "make_model.py"), "--kind", "dense-tied",
         "--seed", "1", "--out", model], env)
    run([py, os.path.join(args.source, "tests", "conformance", "write_golden.py"), "--model", model], env)
    with open(os.path.join(model, "rlx-golden.txt")) as f:
        golden = dict(line.split(" ", 1) for line in f.read().splitlines() if line and not line.startswith("#"))
    n_prompt = int(golden["prompt"])
    tokens = golden["tokens"].split(",")
    prompt = ",".join(tokens[:n_prompt])
    graph = run([rlx, "graph", "--model", model, "--plugin", "example", "--plugin-dir", exb], env)
    if not re.search(r"= matmul\(.*@example$", graph, re.M) or not re.search(r"= attention\(.*@ref$", graph, re.M):
        raise Failure(f"rlx graph: expected matmul nodes @example and attention @ref:\n{graph}")

    step("4. greedy ids on the example backend equal cpu-blas's")
    gen = [rlx, "generate", "--model", model, "--tokens", prompt, "-n", "12", "--greedy"]
    ids_example = run(gen + ["--plugin", "example", "--plugin-dir", exb], env).split()
    ids_cpu = run(gen + ["--plugin", "cpu-blas"], env).split()
    if ids_example != ids_cpu or len(ids_cpu) != 12:
        raise Failure(f"generate: example {ids_example} != cpu-blas {ids_cpu}")
    if ids_cpu != tokens[n_prompt:n_prompt + 12]:
        raise Failure(f"generate: cpu-blas {ids_cpu} differs from NumPy's greedy path {tokens[n_prompt:]}")

    step("5. rlx-conformance passes on the example backend")
    out = run([kit, "--plugin", "example", "--plugin-dir", exb, "--model-dir", model], env, expect=None)
    # the one skipped check is the model's fused spans: the example runs every node by itself
    summary = re.search(r"^example: (\d+) passed, (\d+) failed, (\d+) not claimed(?:, 1 skipped)?$", out, re.M)
    if not summary or int(summary.group(2)) != 0 or "FAIL" in out:
        raise Failure(f"rlx-conformance on the example failed:\n{out[-8000:]}")
    passed, claimed_not = int(summary.group(1)), int(summary.group(3))
    # float weights only: the example's supports() refuses the block-quantized ones (ABI 1.3)
    float_case = r"(?!.* (?:w|table)=q\d)"
    for op in ("matmul", "add", "swiglu", "rms_norm"):
        if re.search(rf"^NOT CLAIMED +\S+ +{op} {float_case}", out, re.M) or not re.search(rf"^PASS +numpy +{op} ", out, re.M):
            raise Failure(f"rlx-conformance: the example should claim and pass every {op} case on float weights")
    if re.search(r"^(PASS|FAIL) +\S+ +matmul .* w=q\d", out, re.M) or not re.search(r"^NOT CLAIMED +\S+ +matmul .* w=q4_k", out, re.M):
        raise Failure("rlx-conformance: the example must leave quantized matmuls to the reference kernels")
    for op in ("attention", "rope", "embed", "moe", "gather_last"):
        if re.search(rf"^PASS +\S+ +{op} ", out, re.M):
            raise Failure(f"rlx-conformance: the example does not implement {op}, yet a case passed on it")
    if not re.search(r"^PASS +model +model model: greedy ids vs NumPy golden", out, re.M) or claimed_not == 0:
        raise Failure(f"rlx-conformance: expected model checks and not-claimed ops:\n{out[-4000:]}")
    print(f"sdk:    {summary.group(0)}")

    step("6. check_golden.py with the example backend")
    out = run([py, os.path.join(args.source, "tests", "model", "check_golden.py"), "--rlx", rlx,
               "--model", model, "--workdir", os.path.join(work, "golden"), "--", "--plugin", "example",
               "--plugin-dir", exb], env)
    print("sdk:    " + out.strip().splitlines()[-1][:200])

    step("7. pkg-config --cflags --libs rlx")
    pkg = ["pkg-config"]
    version = run(pkg + ["--modversion", "rlx"], pc_env).strip()
    if version != args.version:
        raise Failure(f"pkg-config --modversion rlx: {version}, expected {args.version}")
    plugindir = run(pkg + ["--variable=plugindir", "rlx"], pc_env).strip()
    if os.path.realpath(plugindir) != os.path.realpath(plugin_dir):
        raise Failure(f"pkg-config plugindir {plugindir} is not {plugin_dir}")
    flags = shlex.split(run(pkg + ["--cflags", "--libs", "rlx"], pc_env))
    libdir = run(pkg + ["--variable=libdir", "rlx"], pc_env).strip()
    probe = os.path.join(work, "probe")
    run([args.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", *san,
         os.path.join(args.source, "tests", "sdk", "consumer", "main.c"), "-o", probe, *flags,
         f"-Wl,-rpath,{libdir}"], pc_env)
    out = run([probe, "example", exb], env)
    if not out.startswith("ok example 11 22 33"):
        raise Failure(f"pkg-config probe: {out}")

    step("8. find_package(rlx) and rlx::rlx")
    csrc = os.path.join(work, "consumer-src")
    shutil.copytree(os.path.join(args.source, "tests", "sdk", "consumer"), csrc)
    cbuild = os.path.join(work, "consumer-build")
    cflags = [f"-DCMAKE_C_FLAGS={' '.join(san)}"] if san else []
    run([args.cmake, "-S", csrc, "-B", cbuild, *find_rlx, f"-DCMAKE_C_COMPILER={args.cc}",
         *cflags], env)
    run([args.cmake, "--build", cbuild], env)
    out = run([os.path.join(cbuild, "consumer"), "cpu-blas"], env)  # the installed plugin, found beside librlx
    if not out.startswith("ok cpu-blas 11 22 33"):
        raise Failure(f"find_package consumer: {out}")
    out = run([args.cmake, "-S", csrc, "-B", os.path.join(work, "consumer-too-new"), *find_rlx,
               "-DRLX_REQUIRED_VERSION=9.0"], env, expect=None)
    if "rlxConfig" not in out or "9.0" not in out or "Configuring done" in out:
        raise Failure(f"find_package(rlx 9.0) should fail:\n{out[-3000:]}")

    step("9. install the example into the plugin folder; rlx finds it there")
    run([args.cmake, "--install", exb], env)
    if not os.path.exists(os.path.join(plugin_dir, "rlx-backend-example.so")):
        raise Failure(f"cmake --install of the example did not reach {plugin_dir}")
    out = run([rlx, "plugins"], env)
    if not re.search(r"\bexample\b", out):
        raise Failure(f"rlx plugins does not list the installed example:\n{out}")
    ids = run(gen + ["--plugin", "example"], env).split()
    if ids != ids_cpu:
        raise Failure(f"generate with the installed example: {ids} != {ids_cpu}")
    step("10. the embedding example of docs/embedding.md")
    with open(os.path.join(args.source, "docs", "embedding.md")) as f:
        blocks = re.findall(r"^```c\n(.*?)^```$", f.read(), re.M | re.S)
    if len(blocks) != 1:
        raise Failure(f"docs/embedding.md should hold one C block, found {len(blocks)}")
    embed_src, embed = os.path.join(work, "embed.c"), os.path.join(work, "embed")
    with open(embed_src, "w") as f:
        f.write(blocks[0])
    run([args.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", *san, embed_src, "-o", embed, *flags,
         f"-Wl,-rpath,{libdir}"], pc_env)
    ids_embed = run([embed, model, "example", exb, prompt], env).split()
    if ids_embed != ids_cpu:
        raise Failure(f"embedding example: {ids_embed} != rlx generate's {ids_cpu}")
    print("sdk: PASS")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (Failure, subprocess.TimeoutExpired, OSError) as e:
        print(f"sdk: FAIL: {e}")
        sys.exit(1)
