"""In-graph sampling (Gumbel-max over the top-k) against the distribution it must draw from."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

from personaplex_edge.export.sampling import sample_top_k, top_k_probabilities
from personaplex_edge.gumbel import gumbel_noise

FALSE_FAILURE_RATE = 1e-6  # chance that a correct sampler fails the chi-square test


def chi2_survival_even_df(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square with an even number of degrees of freedom (closed form)."""
    assert df % 2 == 0
    half = x / 2
    return math.exp(-half) * sum(half ** i / math.factorial(i) for i in range(df // 2))


def chi2_threshold(df: int, alpha: float) -> float:
    lo, hi = 0.0, 1000.0
    for _ in range(200):  # bisection: survival decreases with x
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_survival_even_df(mid, df) > alpha else (lo, mid)
    return hi


def draw(logits: torch.Tensor, n: int, k_max: int, temperature: float, top_k: int,
         seed: int) -> torch.Tensor:
    """n independent draws from one row of logits, as one batch."""
    noise = torch.from_numpy(gumbel_noise(np.random.default_rng(seed), (n, k_max)))
    rows = logits.expand(n, -1)
    return sample_top_k(rows, noise, torch.full((n,), temperature), torch.full((n,), top_k))


def test_chi2_helper_matches_known_quantile():
    # chi-square(4): P(X > 9.4877) = 0.05 (standard table value)
    assert chi2_survival_even_df(9.4877, 4) == pytest.approx(0.05, abs=1e-4)


def test_empirical_distribution_matches_softmax_of_top_k():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.2, 0.9, 1.9, -0.5, 1.5, 0.0, 0.8, -2.0, 1.0]])
    temperature, top_k, k_max, n = 0.8, 5, 8, 60000
    tokens = draw(logits, n, k_max, temperature, top_k, seed=1234)
    probs = top_k_probabilities(logits, temperature, top_k)[0].double()
    counts = torch.bincount(tokens, minlength=logits.shape[-1]).double()
    support = probs > 0
    assert int(support.sum()) == top_k
    assert counts[~support].sum() == 0, "drew a token outside the top-k"
    expected = probs[support] * n
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    threshold = chi2_threshold(top_k - 1, FALSE_FAILURE_RATE)
    assert chi2 < threshold, f"chi-square {chi2:.1f} >= {threshold:.1f}"
    # the temperature matters: the same counts are far from the untempered distribution
    plain = top_k_probabilities(logits, 1.0, top_k)[0].double()[support] * n
    assert float(((counts[support] - plain) ** 2 / plain).sum()) > threshold


def test_same_seed_same_tokens_and_other_seed_differs():
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0))
    a = draw(logits, 200, 250, 0.8, 250, seed=7)
    b = draw(logits, 200, 250, 0.8, 250, seed=7)
    c = draw(logits, 200, 250, 0.8, 250, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_zero_noise_is_argmax():
    logits = torch.randn(64, 2048, generator=torch.Generator().manual_seed(1))
    out = sample_top_k(logits, torch.zeros(64, 250), torch.full((64,), 0.7),
                       torch.full((64,), 25, dtype=torch.int64))
    assert torch.equal(out, logits.argmax(-1))


def test_top_k_one_is_greedy_whatever_the_noise():
    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(2))
    noise = torch.from_numpy(gumbel_noise(np.random.default_rng(3), (32, 250)))
    out = sample_top_k(logits, noise, torch.ones(32), torch.ones(32, dtype=torch.int64))
    assert torch.equal(out, logits.argmax(-1))


def test_nonpositive_top_k_means_k_max():
    logits = torch.zeros(1, 50)  # uniform: every one of the K_max candidates is equally likely
    n, k_max = 4000, 10
    noise = torch.from_numpy(gumbel_noise(np.random.default_rng(4), (n, k_max)))
    tokens = sample_top_k(logits.expand(n, -1), noise, torch.ones(n),
                          torch.zeros(n, dtype=torch.int64))
    assert len(torch.unique(tokens)) == k_max


def test_gumbel_noise_moments():
    g = gumbel_noise(np.random.default_rng(5), (200000,)).astype(np.float64)
    assert np.isfinite(g).all()
    assert g.mean() == pytest.approx(0.5772156649, abs=0.02)  # Euler-Mascheroni constant
    assert g.var() == pytest.approx(math.pi ** 2 / 6, abs=0.05)


class _Sampler(torch.nn.Module):
    def forward(self, logits, noise, temperature, top_k):
        return sample_top_k(logits, noise, temperature, top_k)


def test_onnx_sampler_matches_torch(tmp_path):
    B, V, K = 16, 700, 250
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(B, V, generator=gen) * 3
    noise = torch.from_numpy(gumbel_noise(np.random.default_rng(6), (B, K)))
    temperature = torch.linspace(0.3, 1.5, B)
    top_k = torch.tensor([1, 5, 25, 250, 0, -3, 300, 2] * 2, dtype=torch.int64)
    path = tmp_path / "sampler.onnx"
    args = (logits, noise, temperature, top_k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # legacy-exporter deprecation notices
        torch.onnx.export(_Sampler(), args, str(path), opset_version=17, dynamo=False,
                          input_names=["logits", "noise", "temperature", "top_k"],
                          output_names=["token"])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {n: t.numpy() for n, t in
                          zip(["logits", "noise", "temperature", "top_k"], args)})[0]
    want = sample_top_k(*args)
    np.testing.assert_array_equal(got, want.numpy())
    # the sampled tokens are not simply the argmax (the noise is used)
    assert not torch.equal(want, logits.argmax(-1))
