#!/usr/bin/python3
"""Self-checks of the golden tooling that need no rlx binary.

The reference can't be checked against rlx (rlx is what it checks) and transformers is not
available, so this tests properties any correct Qwen3 forward must have: causality,
equivalences between configurations that describe the same function (tied vs untied, GQA
vs duplicated heads, identical experts vs one MLP, layer_types vs the window rule), RoPE's
relative-position property, the sliding window's receptive field, the safetensors round
trip, and that every golden case is well conditioned for a float32 implementation.

  test_ref_selfcheck.py        # exits 1 if any check fails
"""
import itertools
import json
import os
import sys
import tempfile
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_golden  # noqa: E402
import make_model  # noqa: E402
import make_models  # noqa: E402
import qwen3_ref as ref  # noqa: E402
import st  # noqa: E402

SMALL_KINDS = [k for k in make_model.KINDS if k not in make_model.BENCH_KINDS]
TOKENS = [3, 17, 100, 42, 7, 250, 300, 11, 64, 5, 480, 2, 99, 31]  # longer than any window


def build(tmp, kind, dtype="f32", seed=1):
    out = os.path.join(tmp, f"{kind}-{dtype}-{seed}")
    if not os.path.isdir(out):
        make_model.build(kind, dtype, 1, seed, out)
    return out


def derive(src, dst, config_updates=None, edit=None):
    """Copy model src to dst as F32, with config changes and `edit(tensors)` applied in place."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.update(config_updates or {})
    tensors, _ = st.read(src)
    if edit:
        edit(tensors)
    os.makedirs(dst)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    st.write(dst, [(n, a.shape, lambda a=a: [a]) for n, a in tensors.items()], "F32")
    return dst


def assert_close(got, want, rtol, what):
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert err <= rtol, f"{what}: relative difference {err:.3g} > {rtol:g}"


def test_safetensors_round_trip(tmp):
    rng = np.random.default_rng(0)
    tensors = {f"t{i}": rng.standard_normal(shape).astype(np.float32)
               for i, shape in enumerate([(3, 5), (7,), (2, 3, 4), (16, 8), (1,)])}
    for dtype, narrow in (("F32", np.float32), ("F16", np.float16), ("BF16", None)):
        for shards in (1, 3):
            out = os.path.join(tmp, f"rt-{dtype}-{shards}")
            specs = [(n, a.shape, lambda a=a: np.array_split(a, 2)) for n, a in tensors.items()]
            files = st.write(out, specs, dtype, shards, metadata={"k": "v"})
            back, got_dtype = st.read(out)
            assert got_dtype == dtype and list(back) == list(tensors), (dtype, shards)
            assert st.Checkpoint(out).metadata["k"] == "v"
            for n, a in tensors.items():
                # F32/F16 must match NumPy's casts exactly. BF16 (8 significant bits) must be
                # within half a spacing, 2^-8 relative; test_bf16_rounding pins the ties.
                want = a.astype(narrow).astype(np.float32) if narrow else a
                tol = 2.0 ** -8 * np.abs(a) if narrow is None else 0
                assert np.all(np.abs(back[n] - want) <= tol), (dtype, shards, n)
            if shards > 1:
                with open(os.path.join(out, st.INDEX_NAME)) as f:
                    index = json.load(f)
                assert set(index["weight_map"].values()) == set(files[:-1]), files
                assert index["metadata"]["total_size"] == sum(
                    a.size * st.STORAGE[dtype].itemsize for a in tensors.values())


def test_bf16_rounding(tmp):
    # Ties go to the even BF16 value; anything above the tie rounds up; specials survive.
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F800000, 0x80000000,
                     0x7F7FFFFF], dtype=np.uint32)
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F80, 0x8000, 0x7F80], dtype=np.uint16)
    got = st.f32_to_bf16_bits(bits.view(np.float32))
    assert np.array_equal(got, want), [hex(v) for v in got]
    nan = st.bf16_bits_to_f32(st.f32_to_bf16_bits(np.array([np.nan], dtype=np.float32)))
    assert np.isnan(nan).all()


def test_bf16_activation_oracle(tmp):
    # The second oracle rounds exactly the named matmuls' inputs: on a golden prompt all of
    # them move the logits by about BF16's relative precision, never the router of a MoE, and
    # an unknown weight is refused.
    assert ref.round_bf16(np.float64(1.0 + 2.0 ** -8)) == 1.0
    assert ref.round_bf16(np.float64(1.0 + 3 * 2.0 ** -8)) == 1.0 + 2.0 ** -6
    for kind in ("dense-tied", "moe"):
        model = ref.load(build(tmp, kind))
        prompt = check_golden.golden_case(model).sequence
        exact = ref.forward(model, prompt)
        names = [n for n in model.ckpt if len(model.ckpt.shape(n)) == 2 and ".mlp." not in n]
        sparse = [i for i in range(model.layers) if model.sparse[i]]
        ref.set_bf16_activations(model, names, sparse)
        assert not any(n.endswith("mlp.gate.weight") for n in model.act_bf16), "router rounded"
        err = np.abs(ref.forward(model, prompt) - exact).max() / max(1.0, np.abs(exact).max())
        assert 1e-4 < err < check_golden.BF16_TOL_EXACT, f"{kind}: bf16 oracle moved logits by {err:.3g}"
        try:
            ref.set_bf16_activations(model, ["model.layers.0.no_such.weight"])
        except ValueError:
            continue
        raise AssertionError("an unknown weight name was accepted")


def test_causal_prefix(tmp):
    # Logits at position t from the full sequence equal the last logits of the prefix 0..t,
    # so no position sees the future (this is also what a KV-cached decode must reproduce).
    for kind in SMALL_KINDS:
        model = ref.load(build(tmp, kind))
        full = ref.forward(model, TOKENS)
        for t in range(len(TOKENS)):
            assert_close(ref.forward(model, TOKENS[:t + 1])[-1], full[t], 1e-12,
                         f"{kind} prefix {t}")


def test_tied_equals_untied(tmp):
    # An untied copy whose lm_head is twice the embedding gives exactly twice the logits:
    # the same function, and proof that an untied model reads lm_head.weight.
    src = build(tmp, "dense-tied")
    dst = derive(src, os.path.join(tmp, "untied"), {"tie_word_embeddings": False},
                 lambda t: t.update({"lm_head.weight": 2 * t["model.embed_tokens.weight"]}))
    assert_close(ref.forward(ref.load(dst), TOKENS), 2 * ref.forward(ref.load(src), TOKENS),
                 1e-12, "tied vs untied")


def test_gqa_equals_duplicated_heads(tmp):
    # Giving every query head its own copy of its kv head (kv head h // group, as HF's
    # repeat_kv) must not change the function; biases included (dense-untied-bias has them).
    src = build(tmp, "dense-untied-bias")
    model = ref.load(src)
    group, D = model.heads // model.kv_heads, model.head_dim

    def duplicate(t):
        for i in range(model.layers):
            for proj in ("k_proj", "v_proj"):
                for part in ("weight", "bias"):
                    name = f"model.layers.{i}.self_attn.{proj}.{part}"
                    heads = t[name].reshape(model.kv_heads, D, *t[name].shape[1:])
                    t[name] = np.repeat(heads, group, axis=0).reshape(model.heads * D, *heads.shape[2:])

    dst = derive(src, os.path.join(tmp, "mha"), {"num_key_value_heads": model.heads}, duplicate)
    assert_close(ref.forward(ref.load(dst), TOKENS), ref.forward(model, TOKENS), 1e-12, "GQA vs MHA")


def test_rope_relative_position(tmp):
    D, theta = 16, 10000.0
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 1, D))
    cos, sin = ref.rope_tables(np.arange(64), D, theta, np.float64)
    rot = lambda x, p: ref.apply_rope(x, cos[p:p + 1], sin[p:p + 1])[0, 0]  # noqa: E731
    assert np.allclose(rot(q, 0), q[0, 0], atol=1e-15), "position 0 must be the identity"
    # Scores depend only on the distance between query and key positions.
    for m, n in ((5, 2), (9, 9), (3, 11)):
        base = rot(q, m) @ rot(k, n)
        for shift in (1, 7, 40):
            assert abs(rot(q, m + shift) @ rot(k, n + shift) - base) < 1e-12, (m, n, shift)
    # Rotate-half pairs dimension i with i + D/2 and turns it by pos * theta^(-2i/D): the
    # complex-number form of NeoX RoPE (not the interleaved GPT-J pairing).
    pos, half = 13, D // 2
    z = (q[0, 0, :half] + 1j * q[0, 0, half:]) * np.exp(1j * pos * theta ** (-np.arange(half) * 2 / D))
    assert np.allclose(rot(q, pos), np.concatenate([z.real, z.imag]), atol=1e-12)


def test_sliding_window(tmp):
    src = build(tmp, "sliding")
    cfg = ref.load(src).config
    W, L = cfg["sliding_window"], cfg["num_hidden_layers"]
    # With every layer sliding, token 0 reaches position i only if i <= L * (W - 1).
    all_sliding = derive(src, os.path.join(tmp, "all-sliding"), {"max_window_layers": 0})
    model = ref.load(all_sliding)
    a = ref.forward(model, TOKENS)
    b = ref.forward(model, [TOKENS[0] + 1] + TOKENS[1:])
    changed = np.abs(a - b).max(axis=-1) > 1e-9
    reach = L * (W - 1)
    assert changed[:reach + 1].all() and not changed[reach + 1:].any(), changed
    # An explicit layer_types list overrides the max_window_layers rule.
    listed = derive(src, os.path.join(tmp, "listed"),
                    {"max_window_layers": L, "layer_types": ["sliding_attention"] * L})
    assert_close(ref.forward(ref.load(listed), TOKENS), a, 1e-12, "layer_types")
    # use_sliding_window false disables a configured window (the dense-untied-bias trap).
    src = build(tmp, "dense-untied-bias")
    nulled = derive(src, os.path.join(tmp, "nulled"), {"sliding_window": None})
    assert_close(ref.forward(ref.load(nulled), TOKENS), ref.forward(ref.load(src), TOKENS),
                 1e-12, "ignored window")


def test_identical_experts_equal_dense_mlp(tmp):
    # If every expert of a sparse layer is the same MLP, routing weights that sum to 1 make
    # the block that MLP: with norm_topk_prob, or with top-k = all experts and no renorm.
    src = build(tmp, "moe")
    model = ref.load(src)
    cfg, E, I = model.config, model.config["num_experts"], model.config["intermediate_size"]

    def same_experts(t):
        for i in np.nonzero(model.sparse)[0]:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                for e in range(1, E):
                    t[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"] = \
                        t[f"model.layers.{i}.mlp.experts.0.{proj}.weight"]

    def as_dense(t):
        # Zero-pad expert 0 to the dense width: padded units have silu(0) * 0 = 0.
        for i in np.nonzero(model.sparse)[0]:
            p = f"model.layers.{i}.mlp."
            m = cfg["moe_intermediate_size"]
            gate, up = np.zeros((I, model.hidden), np.float32), np.zeros((I, model.hidden), np.float32)
            down = np.zeros((model.hidden, I), np.float32)
            gate[:m], up[:m] = t[p + "experts.0.gate_proj.weight"], t[p + "experts.0.up_proj.weight"]
            down[:, :m] = t[p + "experts.0.down_proj.weight"]
            for name in [n for n in t if n.startswith(p)]:
                del t[name]
            t.update({p + "gate_proj.weight": gate, p + "up_proj.weight": up,
                      p + "down_proj.weight": down})

    dense = ref.forward(ref.load(derive(src, os.path.join(tmp, "moe-dense"),
                                        {"model_type": "qwen3"}, as_dense)), TOKENS)
    for name, updates in (("norm_topk", {}),
                          ("all_experts", {"num_experts_per_tok": E, "norm_topk_prob": False})):
        moe = ref.load(derive(src, os.path.join(tmp, "moe-" + name), updates, same_experts))
        assert_close(ref.forward(moe, TOKENS), dense, 1e-12, name)


def test_golden_cases_conditioned_for_f32(tmp):
    # Every golden model (the seeds of ctest's make_models.py and of check_golden.py): a
    # prompt qualifies, and the reference run in float32 (a stand-in for rlx) stays 10x
    # inside the logits tolerance and reproduces the greedy ids.
    for kind, dtype, seed in itertools.product(SMALL_KINDS, make_model.DTYPES,
                                               {make_models.SEED, check_golden.DEFAULT_SEED}):
        model = ref.load(build(tmp, kind, dtype, seed))
        case = check_golden.golden_case(model)
        f32 = check_golden.condition(model, case.prompt, dtype=np.float32)
        assert f32.generated == case.generated, (kind, dtype, seed, f32.generated, case.generated)
        assert_close(f32.logits, case.logits, check_golden.LOGITS_TOL / 10, f"{kind} {dtype} {seed}")


TESTS = [test_safetensors_round_trip, test_bf16_rounding, test_bf16_activation_oracle, test_causal_prefix,
         test_tied_equals_untied, test_gqa_equals_duplicated_heads, test_rope_relative_position,
         test_sliding_window, test_identical_experts_equal_dense_mlp,
         test_golden_cases_conditioned_for_f32]


def main():
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for test in TESTS:
            try:
                test(tmp)
                print(f"PASS {test.__name__}")
            except Exception:  # report every failing check, not just the first
                failed += 1
                print(f"FAIL {test.__name__}\n{traceback.format_exc()}")
    print(f"{len(TESTS) - failed}/{len(TESTS)} self-checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
