#!/usr/bin/env python3
"""NumPy reference of the sampling distribution, written from the sources it imitates rather
than from rlx's C, and a writer of cases for test_sampler.c.

  sampler_ref.py --out FILE [--seed S]

First the logit biases (OpenAI's and llama.cpp's logit_bias: added to the logits, a token listed
twice gets the sum, -inf bans), as llama.cpp's sampler chain puts them before the penalties. Then
the processors, in the order transformers' generate() applies them with do_sample=True:
  RepetitionPenaltyLogitsProcessor  score = where(score < 0, score * penalty, score / penalty)
                                    on the tokens of the window (each token once)
  OpenAI presence/frequency         logit -= presence * (count > 0) + frequency * count
                                    (applied right after the repetition penalty, as llama.cpp does)
  TemperatureLogitsWarper           scores / temperature
  TopKLogitsWarper                  scores < topk(scores, k)[-1] -> -inf
  TopPLogitsWarper                  sorted ascending, cumsum(softmax) <= 1 - top_p -> -inf,
                                    the last (largest) token always kept
  MinPLogitsWarper                  softmax < min_p * max(softmax) -> -inf, the top token kept
then softmax. Greedy (or temperature 0) is the one-hot argmax of the penalised logits (the first
of equal maxima, as torch.argmax). The window is llama.cpp's penalty_last_n: the last N tokens of
the history, all of it for -1, none for 0.

Random cases whose outcome hangs on a near-tie with a threshold (the top-p boundary, the min-p
floor, the k-th logit) are redrawn, so float32 against float64 rounding cannot flip a token in
or out and the C code is held to 1e-5 on every probability.

Each case is written as lines:
  case NAME
  params GREEDY TEMPERATURE TOP_K TOP_P MIN_P REPEAT_PENALTY REPEAT_LAST_N PRESENCE FREQUENCY
  bias N (ID BIAS)...
  history N ID...
  logits V X...
  probs V P...
and the file ends with "end".
"""
import argparse
import os

import numpy as np

MARGIN = 1e-4  # relative distance a random case keeps from every filter threshold


def window_of(history, last_n):
    if last_n == 0:
        return []
    return list(history) if last_n < 0 else list(history[-last_n:])


def penalties(logits, window, repeat_penalty, presence, frequency):
    scores = logits.astype(np.float64).copy()  # a copy: the caller's array stays as it was
    if not window:
        return scores
    counts = np.bincount(np.array(window), minlength=len(scores))
    seen = counts > 0
    s = scores[seen]
    scores[seen] = np.where(s < 0, s * repeat_penalty, s / repeat_penalty)
    scores -= presence * seen + frequency * counts
    return scores


def softmax(x):
    finite = np.isfinite(x)
    e = np.zeros_like(x)
    e[finite] = np.exp(x[finite] - x[finite].max())
    return e / e.sum()


class NearTie(Exception):
    pass


def warp(scores, temperature, top_k, top_p, min_p, strict):
    """The HF warpers; with strict, raises NearTie when a threshold is too close to call."""
    scores = scores / temperature
    if top_k > 0 and top_k < len(scores):
        kth = np.sort(scores)[::-1][top_k - 1]
        if strict:
            gap = np.abs(scores - kth)
            if np.any((gap > 0) & (gap < MARGIN * max(1.0, abs(kth)))) or np.sum(scores == kth) > 1:
                raise NearTie("top-k")
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p < 1:
        order = np.argsort(scores, kind="stable")  # ascending
        cum = np.cumsum(softmax(scores)[order])
        remove = cum <= 1 - top_p
        remove[-1] = False
        if strict and np.any(np.abs(cum[:-1] - (1 - top_p)) < MARGIN):
            raise NearTie("top-p")
        drop = np.zeros(len(scores), bool)
        drop[order] = remove
        scores = np.where(drop, -np.inf, scores)
    if min_p > 0:
        probs = softmax(scores)
        floor = min_p * probs.max()
        near = (probs > 0) & (probs != floor) & (np.abs(probs - floor) < MARGIN * floor)
        if strict and np.any(near):  # the top token itself, at the floor when min_p is 1, is no tie
            raise NearTie("min-p")
        remove = probs < floor
        remove[np.argmax(probs)] = False
        scores = np.where(remove, -np.inf, scores)
    return softmax(scores)


def biased(logits, bias):
    out = logits.astype(np.float64).copy()
    for token, b in bias:
        out[token] += b
    return out


def reference(logits, history, p, strict=False):
    window = window_of(history, p["repeat_last_n"])
    scores = penalties(biased(logits, p["bias"]), window, p["repeat_penalty"], p["presence"], p["frequency"])
    if p["greedy"] or p["temperature"] == 0:
        if strict:
            top2 = np.sort(scores)[-2:]
            if top2[1] - top2[0] < MARGIN * max(1.0, abs(top2[1])):
                raise NearTie("argmax")
        out = np.zeros(len(scores))
        out[np.argmax(scores)] = 1
        return out
    return warp(scores, p["temperature"], p["top_k"], p["top_p"], p["min_p"], strict)


def params(**kw):
    p = dict(greedy=0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, repeat_last_n=64,
             presence=0.0, frequency=0.0, bias=[])
    p.update(kw)
    return p


def f32(x):
    return float(np.float32(x))


def random_case(rng, i):
    vocab = int(rng.choice([5, 16, 37, 128, 300]))
    p = params(temperature=f32(rng.choice([0.0, 0.3, 0.7, 1.0, 1.6])) if rng.random() < 0.9 else 1.0,
               greedy=int(rng.random() < 0.1))
    if rng.random() < 0.5:
        p["top_k"] = int(rng.integers(1, vocab + 3))
    if rng.random() < 0.5:
        p["top_p"] = f32(rng.uniform(0.2, 1.0))
    if rng.random() < 0.5:
        p["min_p"] = f32(rng.uniform(0.0, 0.5))
    if rng.random() < 0.6:
        p["repeat_penalty"] = f32(rng.uniform(0.5, 2.5))
    if rng.random() < 0.5:
        p["presence"] = f32(rng.uniform(-1, 1.5))
    if rng.random() < 0.5:
        p["frequency"] = f32(rng.uniform(-0.5, 1.0))
    p["repeat_last_n"] = int(rng.choice([-1, 0, 1, 3, 7, 64]))
    if rng.random() < 0.3:  # at most 4 biases on a vocabulary of at least 5: never every token banned
        p["bias"] = [(int(rng.integers(0, vocab)), f32(rng.uniform(-5, 5)) if rng.random() < 0.8 else -np.inf)
                     for _ in range(int(rng.integers(1, 5)))]
    n_hist = int(rng.choice([0, 1, 5, 20, 90]))
    # a small alphabet of the vocabulary so tokens repeat and counts exceed 1
    alphabet = rng.choice(vocab, size=min(vocab, 6), replace=False)
    history = [int(t) for t in rng.choice(alphabet, size=n_hist)]
    scale = rng.choice([1.0, 3.0, 8.0])
    logits = (rng.standard_normal(vocab) * scale).astype(np.float32)
    return f"random{i}", p, history, logits


def fixed_cases():
    """Cases chosen by hand: each names what it pins."""
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.5, 1.5, 0.0, -0.5], np.float32)
    hist = [3, 1, 3, 5, 0, 3, 6, 1]
    yield "plain", params(), [], logits
    yield "temperature-zero-is-argmax", params(temperature=0.0), [], logits
    yield "temperature-zero-with-penalty", params(temperature=0.0, repeat_penalty=2.5), [3, 1], logits
    yield "greedy-repeat-penalty-moves-argmax", params(greedy=1, repeat_penalty=3.0), [3], logits
    yield "greedy-presence-moves-argmax", params(greedy=1, presence=1.6), [3], logits
    yield "greedy-frequency-counts", params(greedy=1, frequency=0.4), [3, 3, 3], logits
    yield "repeat-penalty-sign-rule", params(repeat_penalty=1.7), [1, 4, 0, 6], logits
    yield "penalty-below-one-favours-repeats", params(repeat_penalty=0.6), [1, 4, 2], logits
    yield "window-whole-context", params(repeat_penalty=2.0, frequency=0.3, repeat_last_n=-1), hist, logits
    yield "window-zero-disables", params(repeat_penalty=2.0, presence=1.0, repeat_last_n=0), hist, logits
    yield "window-wraps", params(repeat_penalty=2.0, frequency=0.5, repeat_last_n=3), hist * 5 + [2, 4, 7], logits
    yield "window-one", params(presence=0.8, repeat_last_n=1), hist, logits
    yield "min-p-alone", params(min_p=0.2), [], logits
    yield "min-p-after-top-p", params(top_p=0.9, min_p=0.3, temperature=0.8), [], logits
    yield "all-filters", params(temperature=1.3, top_k=5, top_p=0.85, min_p=0.1, repeat_penalty=1.3,
                                presence=0.2, frequency=0.1, repeat_last_n=4), hist, logits
    yield "top-k-larger-than-vocab", params(top_k=50), [], logits
    yield "min-p-one-keeps-top", params(min_p=1.0), [], logits
    yield "bias-bans-the-argmax", params(greedy=1, bias=[(3, -np.inf)]), [], logits
    yield "bias-forces-a-token", params(temperature=0.7, bias=[(4, 100.0)]), [], logits
    yield "bias-listed-twice-sums", params(bias=[(2, 1.0), (6, -0.5), (2, 1.5)]), [], logits
    yield "bias-before-repeat-penalty", params(repeat_penalty=2.0, bias=[(1, 3.0), (0, -1.5)]), [1, 0], logits
    yield "bias-ban-with-top-k", params(top_k=2, bias=[(3, -np.inf), (0, -np.inf)]), [], logits


def write_case(f, name, p, history, logits, probs):
    f.write(f"case {name}\n")
    f.write("params %d %.9g %d %.9g %.9g %.9g %d %.9g %.9g\n" % (
        p["greedy"], p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["repeat_penalty"], p["repeat_last_n"],
        p["presence"], p["frequency"]))
    f.write("bias %d %s\n" % (len(p["bias"]), " ".join("%d %.9g" % (t, b) for t, b in p["bias"])))
    f.write("history %d %s\n" % (len(history), " ".join(map(str, history))))
    f.write("logits %d %s\n" % (len(logits), " ".join("%.9g" % x for x in logits)))
    f.write("probs %d %s\n" % (len(probs), " ".join("%.17g" % x for x in probs)))


def self_check():
    """A few outcomes worked out by hand, so the reference itself is pinned."""
    l = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    s = penalties(l, [0, 1, 1], 2.0, 0.5, 0.25)
    assert np.allclose(s, [2.0 / 2 - 0.5 - 0.25, -1.0 * 2 - 0.5 - 0.5, 0.5, 3.0]), s
    assert window_of([1, 2, 3, 4], 2) == [3, 4] and window_of([1, 2], -1) == [1, 2] and window_of([1], 0) == []
    # top-p 0.5 over probabilities (0.6, 0.3, 0.1) keeps the first only; 0.7 keeps two
    x = np.log(np.array([0.1, 0.6, 0.3]))
    assert np.allclose(warp(x, 1.0, 0, 0.5, 0, False), [0, 1, 0])
    assert np.allclose(warp(x, 1.0, 0, 0.7, 0, False), [0, 2 / 3, 1 / 3])
    # min-p 0.4: 0.3 >= 0.24 stays, 0.1 goes
    assert np.allclose(warp(x, 1.0, 0, 1.0, 0.4, False), [0, 2 / 3, 1 / 3])
    assert np.allclose(warp(x, 1.0, 2, 1.0, 0, False), [0, 2 / 3, 1 / 3])
    # biases add, twice-listed ones sum, before the penalty: (2 + 1 + 1) / 2 for a seen token 0
    b = biased(l, [(0, 1.0), (0, 1.0), (2, -np.inf)])
    assert np.allclose(penalties(b, [0], 2.0, 0, 0)[[0, 1, 3]], [2.0, -1.0, 3.0]) and b[2] == -np.inf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--random", type=int, default=400)
    a = ap.parse_args()
    self_check()
    rng = np.random.default_rng(a.seed)
    n = 0
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        for name, p, history, logits in fixed_cases():
            write_case(f, name, p, history, logits, reference(logits, history, p, strict=True))
            n += 1
        written = 0
        while written < a.random:
            name, p, history, logits = random_case(rng, written)
            try:
                probs = reference(logits, history, p, strict=True)
            except NearTie:
                continue
            write_case(f, name, p, history, logits, probs)
            written += 1
            n += 1
        f.write("end\n")
    print(f"wrote {n} cases to {a.out}")


if __name__ == "__main__":
    main()
