#!/usr/bin/python3
"""Writes the llama.cpp reference data of tests/llamacpp: GGUF files that llama.cpp's own
converter and quantizer made from the checkpoints of arch_models.py, and what llama.cpp's own
programs compute on them.

  make_refs.py --llama-cpp DIR [--out DIR] [--workdir DIR] [--only NAME ...]

DIR is a llama.cpp checkout with its programs built in DIR/build/bin (llama-completion,
llama-perplexity, llama-quantize); nothing of it is copied here. For each checkpoint NAME:
  1. arch_models.build(NAME): make_model.py's files plus the Brown tokenizer, into --workdir;
  2. NAME-f32.gguf: convert.py (llama.cpp's convert_hf_to_gguf.py, naming the pre-tokenizer)
     --outtype f32;  NAME-q8_0.gguf: llama-quantize NAME-f32.gguf NAME-q8_0.gguf Q8_0;
  3. for each file: llama-completion -m FILE -p PROMPT -n 48 --temp 0 -no-cnv for PROMPTS
     (the text printed after the prompt), as it is and with F32 attention (F32_ATTENTION), and
     llama-perplexity -m FILE -f heldout.txt -c 256, as it is and with F32 attention;
  4. for each of VARIANTS: a copy of one of those files with some tokenizer metadata changed,
     written by llama.cpp's gguf-py (GGUFReader, GGUFWriter) into --workdir, not into OUT (the
     test derives it again and checks its sha256), and step 3's results on it;
and writes OUT/llama.cpp.json: the commands, llama.cpp's commit, each checkpoint's file digests
(the test regenerates the checkpoint and checks them) and each file's and variant's results.
llama.cpp runs with its defaults and 2 threads, as a user runs it.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import arch_models  # noqa: E402

PROMPTS = ["The jury said that the city", "In the morning, the people of the city", "He looked at her and said"]
STEPS = 48
CONTEXT = 256
QUANT = "Q8_0"
# llama.cpp's default attention on the CPU is flash attention over an F16 cache, which rounds Q,
# K and V to F16; these flags keep it in F32, as rlx computes it. Random-weight models meet near
# ties often enough that the rounding alone changes some continuations (README.md), so both are
# recorded and the test compares with this one.
F32_ATTENTION = ("-fa", "off", "-ctk", "f32", "-ctv", "f32")
PRE = "qwen2"  # the Brown tokenizer's pre-tokenizer, in llama.cpp's naming (convert.py)
PYTHON = "/usr/bin/python3"  # Debian's, which has torch for the converter
# Derived files: name -> (the file of OUT it copies, metadata values it changes). The Brown
# tokenizer adds no BOS; llama-bos-f32.gguf's does (its bos_token_id, <|endoftext|>, is already
# set), so llama-perplexity puts a BOS first in every chunk and llama-completion before the
# prompt, and rlx must do the same to agree.
VARIANTS = {"llama-bos-f32.gguf": ("llama-f32.gguf", {"tokenizer.ggml.add_bos_token": True})}
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
RUNNING = re.compile(r"\[(\d+)\]([\d.]+),")
END_OF_TEXT = " [end of text]\n"
# llama-completion runs of one prompt before its lost closing "\n\n" (see completion()) is an
# error: 3 were seen to lose it all on a machine running other jobs beside it
COMPLETION_TRIES = 8


def run(cmd, **kw):
    """Runs cmd; its output as text, where bytes that are not UTF-8 (a byte-level BPE model
    can print part of a character) become U+FFFD, as rlx's JSON output has them."""
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", **kw)
    if p.returncode != 0:
        raise SystemExit("make_refs.py: %s exited %d:\n%s" % (cmd[0], p.returncode, p.stderr[-3000:]))
    return p


def completion(bin_dir, model, prompt, flags=()):
    """llama-completion's continuation of prompt: stdout is the prompt, the generated text, then
    " [end of text]\\n" if it stopped at an end-of-generation token, then "\\n\\n"."""
    for _ in range(COMPLETION_TRIES):
        out = run([os.path.join(bin_dir, "llama-completion"), "-m", model, "-p", prompt, "-n", str(STEPS),
                   "--temp", "0", "-no-cnv", "-t", "2", *flags], stdin=subprocess.DEVNULL).stdout
        # The closing "\n\n" comes from llama.cpp's logging thread, which was seen to lose it at
        # exit under load: without it the end of the text is uncertain, so run again.
        if out.endswith("\n\n"):
            break
    if not out.startswith(prompt) or not out.endswith("\n\n"):
        raise SystemExit("make_refs.py: unexpected llama-completion output %r" % out[-200:])
    text = out[len(prompt):-2]
    stopped = text.endswith(END_OF_TEXT)
    return {"prompt": prompt, "continuation": text[:-len(END_OF_TEXT)] if stopped else text,
            "stopped": stopped}


def perplexity(bin_dir, model, text, flags=()):
    """llama-perplexity's final estimate, and its standard error when printed (else None).
    Its log lines come from a logging thread that was seen to lose the last lines at exit
    under load; the running estimates on stdout end with the final one, so when the "Final
    estimate" line is lost the estimate after the last chunk is taken, provided it is there
    (its index is the chunk count llama-perplexity announced); otherwise the (deterministic)
    run is repeated."""
    for _ in range(5):
        p = run([os.path.join(bin_dir, "llama-perplexity"), "-m", model, "-f", text, "-c", str(CONTEXT), "-t", "2",
                 *flags])
        m = FINAL.search(p.stderr + p.stdout)
        if m:
            return float(m.group(1)), float(m.group(2))
        chunks = re.search(r"calculating perplexity over (\d+) chunks", p.stderr)
        running = RUNNING.findall(p.stdout)
        if chunks and running and int(running[-1][0]) == int(chunks.group(1)):
            return float(running[-1][1]), None
    raise SystemExit("make_refs.py: no final estimate from llama-perplexity on %s:\n%s" % (model, p.stderr[-1000:]))


def variant(llama_cpp, src, dst, changes):
    """Writes dst: src with the metadata values of changes (keys src already has) replaced, by
    gguf-py, the GGUF library llama.cpp's converter writes with; returns dst's sha256."""
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    import gguf
    reader = gguf.GGUFReader(src)
    missing = sorted(set(changes) - set(reader.fields))
    if missing or reader.get_field(gguf.Keys.Tokenizer.BOS_ID) is None:
        raise SystemExit("make_refs.py: %s has no %s" % (src, ", ".join(missing or [gguf.Keys.Tokenizer.BOS_ID])))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # GGUF.* are the header's counts, not metadata; the writer adds general.architecture itself
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        array = field.types[0] == gguf.GGUFValueType.ARRAY
        writer.add_key_value(field.name, changes.get(field.name, field.contents()), field.types[0],
                             sub_type=field.types[-1] if array else None)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    with open(dst, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def results(bin_dir, path, text):
    """What llama-perplexity and llama-completion compute on the GGUF file path."""
    ppl, err = perplexity(bin_dir, path, text)
    return {"perplexity": ppl, "perplexity_stderr": err,
            "perplexity_f32_attention": perplexity(bin_dir, path, text, F32_ATTENTION)[0],
            "greedy": [completion(bin_dir, path, p) for p in PROMPTS],
            "greedy_f32_attention": [completion(bin_dir, path, p, F32_ATTENTION) for p in PROMPTS]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp checkout with build/bin")
    ap.add_argument("--out", default=os.path.join(HERE, "ref"))
    ap.add_argument("--workdir", default="/tmp/rlx-llamacpp-refs")
    ap.add_argument("--only", nargs="*", help="checkpoints to redo (default: all); others keep their entries")
    args = ap.parse_args()
    llama_cpp = os.path.abspath(args.llama_cpp)
    bin_dir = os.path.join(llama_cpp, "build", "bin")
    text = os.path.join(args.out, "heldout.txt")
    commit = run(["git", "-C", llama_cpp, "rev-parse", "HEAD"]).stdout.strip()
    ref_path = os.path.join(args.out, "llama.cpp.json")
    ref = {"models": {}, "files": {}}
    if args.only and os.path.exists(ref_path):
        with open(ref_path) as f:
            ref = json.load(f)
    ref.update({
        "producer": "llama.cpp commit %s, CPU build, 2 threads" % commit,
        "converter_command": "%s convert.py --llama-cpp LLAMA_CPP --pre %s -- HF_DIR --outtype f32 "
                             "--model-name rlx-test-NAME --outfile NAME-f32.gguf" % (PYTHON, PRE),
        "quantize_command": "llama-quantize NAME-f32.gguf NAME-%s.gguf %s" % (QUANT.lower(), QUANT),
        "greedy_command": "llama-completion -m FILE -p PROMPT -n %d --temp 0 -no-cnv -t 2 (text after the "
                          "prompt; stopped: it ended at an end-of-generation token)" % STEPS,
        "greedy_f32_attention_command": "the greedy command with %s" % " ".join(F32_ATTENTION),
        "perplexity_command": "llama-perplexity -m FILE -f heldout.txt -c %d -t 2" % CONTEXT,
        "perplexity_f32_attention_command": "the perplexity command with %s" % " ".join(F32_ATTENTION),
        "variant_command": "gguf-py (LLAMA_CPP/gguf-py) GGUFReader on SOURCE, GGUFWriter writing its metadata "
                           "(with the values of `metadata` replaced) and tensors in order to NAME",
        "seed": arch_models.SEED,
    })
    os.makedirs(args.workdir, exist_ok=True)
    names = args.only or sorted(arch_models.MODELS)
    for name in names:
        hf = os.path.join(args.workdir, name)
        shutil.rmtree(hf, ignore_errors=True)
        digests = arch_models.build(name, hf)
        ref["models"][name] = {"kind": arch_models.MODELS[name][0], "sha256": digests}
        f32 = os.path.join(args.out, "%s-f32.gguf" % name)
        quant = os.path.join(args.out, "%s-%s.gguf" % (name, QUANT.lower()))
        run([PYTHON, os.path.join(HERE, "convert.py"), "--llama-cpp", llama_cpp, "--pre", PRE, "--", hf,
             "--outtype", "f32", "--model-name", "rlx-test-" + name, "--outfile", f32])
        run([os.path.join(bin_dir, "llama-quantize"), f32, quant, QUANT])
        for path in (f32, quant):
            ref["files"][os.path.basename(path)] = {"model": name, **results(bin_dir, path, text)}
    # variants of the checkpoints not redone keep their entries, as the checkpoints' files do
    kept = {n: e for n, e in ref.get("variants", {}).items() if n in VARIANTS and e["model"] not in names}
    ref["variants"] = kept
    for name, (source, changes) in sorted(VARIANTS.items()):
        if name in kept:
            continue
        path = os.path.join(args.workdir, name)
        digest = variant(llama_cpp, os.path.join(args.out, source), path, changes)
        ref["variants"][name] = {"model": ref["files"][source]["model"], "source": source, "metadata": changes,
                                 "sha256": digest, **results(bin_dir, path, text)}
    with open(ref_path, "w") as f:
        json.dump(ref, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    print("wrote %s" % ref_path)


if __name__ == "__main__":
    main()
