"""The C sampler (runtime_c/src/sample.c, through the binding's ctypes Sampler) against independent
definitions: the distribution at temperature 1 against numpy's softmax (chi-square), top-k / top-p /
min-p against the issue's definitions written here, the repetition penalty against transformers'
RepetitionPenaltyLogitsProcessor, and the specified PRNG sequence against sample_spec.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sample_spec

from colibri.toolchain.binding.sampling import SampleError, Sampler

from cbuild import ROOT, compile_c

SRC = ROOT / "runtime_c" / "src"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    import ctypes

    so = compile_c(tmp_path_factory.mktemp("sample") / "libsample.so", [SRC / "sample.c", SRC / "cbmath.c"],
                   ["-shared", "-fPIC", f"-I{SRC}"])
    return ctypes.CDLL(str(so))


def chi2_critical(df: int, alpha_z: float = 3.719) -> float:
    """The upper quantile of chi-square(df) by Wilson-Hilferty; z = 3.719 is the normal 0.9999 quantile."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + alpha_z * math.sqrt(h)) ** 3


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - np.max(x))
    return e / e.sum()


def counts(sampler: Sampler, logits: np.ndarray, n: int) -> np.ndarray:
    c = np.zeros(logits.size, dtype=np.int64)
    for _ in range(n):
        c[sampler.next(logits)] += 1
    return c


def chi2(observed: np.ndarray, p: np.ndarray) -> float:
    expected = observed.sum() * p
    return float(((observed - expected) ** 2 / expected).sum())


LOGITS = np.random.default_rng(5).uniform(-1.5, 1.5, size=24).astype(np.float32)  # every p > 1%: 100+ expected


def test_chi_square_against_softmax(lib):
    observed = counts(Sampler(lib, LOGITS.size, temperature=1.0, seed=2026), LOGITS, 10_000)
    assert chi2(observed, softmax(LOGITS)) < chi2_critical(LOGITS.size - 1)
    # the test has teeth: the same draws fail against a nearby wrong distribution (temperature 1.25)
    assert chi2(observed, softmax(LOGITS / 1.25)) > chi2_critical(LOGITS.size - 1)


def test_temperature_scales_the_distribution(lib):
    observed = counts(Sampler(lib, LOGITS.size, temperature=0.5, seed=11), LOGITS * np.float32(0.5), 10_000)
    assert chi2(observed, softmax(LOGITS)) < chi2_critical(LOGITS.size - 1)


def test_greedy_is_argmax_with_the_first_of_equal_maxima(lib):
    lg = np.array([0.5, 2.0, -1.0, 2.0, 1.0], dtype=np.float32)
    s = Sampler(lib, lg.size)
    assert [s.next(lg) for _ in range(5)] == [1] * 5
    assert s.rand() == sample_spec.Rng(0).next()  # greedy draws nothing from the PRNG


# ------------------------------------------------------------- the definitions (from the text)

def kept_top_k(p: np.ndarray, k: int) -> set[int]:
    """top-k: the k most probable tokens (ties: the lower id first)."""
    return set(sorted(range(p.size), key=lambda i: (-p[i], i))[:k])


def kept_top_p(p: np.ndarray, top_p: float) -> set[int]:
    """top-p (nucleus): the smallest set of most probable tokens whose probabilities sum to >= top_p."""
    order = sorted(range(p.size), key=lambda i: (-p[i], i))
    total, kept = 0.0, set()
    for i in order:
        kept.add(i)
        total += p[i]
        if total >= top_p:
            break
    return kept


def kept_min_p(p: np.ndarray, min_p: float) -> set[int]:
    """min-p: the tokens whose probability is at least min_p times the most probable one's."""
    return {i for i in range(p.size) if p[i] >= min_p * p.max()}


def support(lib, logits: np.ndarray, n: int = 4000, **kw) -> set[int]:
    s = Sampler(lib, logits.size, seed=3, **kw)
    return {s.next(logits) for _ in range(n)}


# 40 ids; probabilities from 0.23 down to 0.005: every kept one is drawn within 4000 draws
CUT_LOGITS = np.linspace(2.5, -1.3, 40).astype(np.float32)[np.random.default_rng(9).permutation(40)]


@pytest.mark.parametrize("k", [1, 3, 10, 25])
def test_top_k_keeps_the_k_most_probable(lib, k):
    assert support(lib, CUT_LOGITS, temperature=1.0, top_k=k) == kept_top_k(softmax(CUT_LOGITS), k)


def test_top_k_ties_keep_the_lower_ids(lib):
    lg = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0], dtype=np.float32)
    assert support(lib, lg, temperature=1.0, top_k=3) == {1, 3, 2}


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.8, 0.95])
def test_top_p_keeps_the_nucleus(lib, top_p):
    expected = kept_top_p(softmax(CUT_LOGITS), top_p)
    assert 1 < len(expected) < CUT_LOGITS.size
    assert support(lib, CUT_LOGITS, temperature=1.0, top_p=top_p) == expected


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.5])
def test_min_p_keeps_tokens_above_the_fraction_of_the_top(lib, min_p):
    expected = kept_min_p(softmax(CUT_LOGITS), min_p)
    assert 1 < len(expected) < CUT_LOGITS.size
    assert support(lib, CUT_LOGITS, temperature=1.0, min_p=min_p) == expected


def test_cuts_compose_top_k_then_top_p_then_min_p(lib):
    p = softmax(CUT_LOGITS)
    k_set = kept_top_k(p, 12)
    pk = np.where(np.isin(np.arange(p.size), list(k_set)), p, 0.0)
    pk /= pk.sum()  # top-p and min-p see the renormalised top-k distribution
    expected = kept_top_p(pk, 0.7) & kept_min_p(pk, 0.3)
    assert support(lib, CUT_LOGITS, temperature=1.0, top_k=12, top_p=0.7, min_p=0.3) == expected


def test_cut_distribution_is_renormalised_softmax(lib):
    k = 8
    kept = sorted(kept_top_k(softmax(CUT_LOGITS), k))
    observed = counts(Sampler(lib, CUT_LOGITS.size, temperature=1.0, top_k=k, seed=17), CUT_LOGITS, 10_000)
    assert observed[[i for i in range(CUT_LOGITS.size) if i not in kept]].sum() == 0
    assert chi2(observed[kept], softmax(CUT_LOGITS[kept])) < chi2_critical(k - 1)


# ------------------------------------------------------------- repetition penalty, against transformers

@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_is_hf_processor(lib, penalty):
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(4)
    logits = rng.normal(0, 3, size=50).astype(np.float32)
    logits[7] = 0.0
    recent = [3, 7, 3, 12, 40, 12, 12, 0, 49, int(np.argmax(logits))]
    hf = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([recent]), torch.tensor(logits[None, :]))[0].numpy()
    s = Sampler(lib, logits.size)
    np.testing.assert_array_equal(s.penalize(logits, recent, penalty), hf)
    # and the sampler uses it: greedy takes the penalised argmax
    assert Sampler(lib, logits.size, repeat_penalty=penalty).next(logits, recent) == int(np.argmax(hf))


# ------------------------------------------------------------- the PRNG and bad input

@pytest.mark.parametrize("seed", [0, 1, 7, 2**64 - 1])
def test_prng_is_the_specified_sequence(lib, seed):
    s, ref = Sampler(lib, 4, seed=seed), sample_spec.Rng(seed)
    assert [s.rand() for _ in range(100)] == [ref.next() for _ in range(100)]


def test_same_seed_same_ids_other_seed_other_ids(lib):
    def draws(seed):
        s = Sampler(lib, CUT_LOGITS.size, temperature=1.0, seed=seed)
        return [s.next(CUT_LOGITS) for _ in range(50)]

    assert draws(5) == draws(5) != draws(6)


@pytest.mark.parametrize("kw", [dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=1.5),
                                dict(min_p=-0.1), dict(repeat_penalty=0.0), dict(repeat_penalty=float("inf"))])
def test_bad_parameters_are_refused(lib, kw):
    with pytest.raises(SampleError):
        Sampler(lib, 4, **kw)


@pytest.mark.parametrize("logits,recent", [([0.0, float("nan")], []), ([float("inf"), 0.0], []),
                                           ([-float("inf")] * 2, []), ([0.0, 1.0], [2]), ([0.0, 1.0], [-1])])
def test_bad_input_is_an_error_code(lib, logits, recent):
    with pytest.raises(SampleError):
        Sampler(lib, 2, temperature=1.0).next(np.array(logits, dtype=np.float32), recent)


def test_masked_ids_are_never_drawn(lib):
    lg = np.zeros(10, dtype=np.float32)
    lg[::2] = -np.inf
    assert support(lib, lg, n=2000, temperature=1.0) == {1, 3, 5, 7, 9}
