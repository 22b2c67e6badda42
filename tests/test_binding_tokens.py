"""The binding's token rules: Python ints or numpy integers in [0, vocab), flat; anything else is a
TypeError or ValueError naming the element and its index, and never runs (a cast would run another
token: 2**32+3 as 3, 3.9 as 3, "3" as 3, [[1, 2], [3, 4]] as 1, 2, 3, 4)."""

from __future__ import annotations

import numpy as np
import pytest

from colibri.runtime import ColibriError, TokenError, load

PROMPT = [3, 17, 42]


@pytest.fixture(scope="module")
def model(golden_ckpts, build_model):
    return load(build_model(golden_ckpts["gqa_top2"], "int8c") / "model.bin")


@pytest.fixture(scope="module")
def want(model) -> np.ndarray:
    model.reset()
    logits = model.forward(PROMPT)
    model.reset()
    return logits


@pytest.mark.parametrize("tokens", [
    tuple(PROMPT), range(3, 4), [np.int64(t) for t in PROMPT], [np.uint8(t) for t in PROMPT],
    np.array(PROMPT, dtype=np.int64), np.array(PROMPT, dtype=np.uint16), np.array(PROMPT, dtype=np.int32),
    (t for t in PROMPT),
], ids=["tuple", "range", "np.int64", "np.uint8", "int64-array", "uint16-array", "int32-array", "generator"])
def test_integer_tokens_accepted(model, want, tokens):
    model.reset()
    got = model.forward(tokens)
    if isinstance(tokens, range):  # a different prompt: just that it ran one token
        assert model.n_past == 1
    else:
        assert np.array_equal(got, want) and model.n_past == len(PROMPT)
    model.reset()


VOCAB = 97  # gqa_top2's vocabulary (tests/conftest.py GOLDEN)

REFUSED = [
    ([2**32 + 3], ValueError, "tokens[0]"),
    ([1, 2**40], ValueError, "tokens[1]"),
    ([-(2**31) - 1], ValueError, "tokens[0]"),
    ([1, 3.9], TypeError, "tokens[1]"),
    ([np.float32(3)], TypeError, "tokens[0]"),
    (["3"], TypeError, "tokens[0]"),
    ("3", TypeError, "str"),
    (b"\x03", TypeError, "bytes"),
    ({3, 17}, TypeError, "set"),
    (3, TypeError, "int"),
    ([[1, 2], [3, 4]], TypeError, "tokens[0]"),
    ([1, [2]], TypeError, "tokens[1]"),
    ([True, 3], TypeError, "tokens[0]"),
    ([np.bool_(True)], TypeError, "tokens[0]"),
    ([None], TypeError, "tokens[0]"),
    (np.array([[1, 2], [3, 4]]), TypeError, "2-D"),
    (np.array([3.0, 17.0]), TypeError, "float64"),
    (np.array([True]), TypeError, "bool"),
    (np.array([1, 2**33], dtype=np.int64), ValueError, "tokens[1]"),
    (np.array([1, 2**63], dtype=np.uint64), ValueError, "tokens[1]"),
    ([VOCAB], ValueError, "tokens[0]"),
    ([1, 2, -1], ValueError, "tokens[2]"),
    (np.array([5, VOCAB + 5]), ValueError, "tokens[1]"),
]


@pytest.mark.parametrize("tokens,error,names", REFUSED, ids=[f"{i}-{e.__name__}" for i, (_, e, _) in
                                                            enumerate(REFUSED)])
def test_bad_tokens_refused_never_cast(model, want, tokens, error, names):
    assert model.vocab == VOCAB
    model.reset()
    with pytest.raises(error) as err:
        model.forward(tokens)
    assert names in str(err.value)
    assert model.n_past == 0  # nothing ran
    assert np.array_equal(model.forward(PROMPT), want)  # and the context is as good as new
    model.reset()


def test_out_of_vocab_is_a_value_error_with_the_runtime_status(model):
    """Outside [0, vocab) stays the runtime's E_TOKEN (a ColibriError) and is also a ValueError."""
    model.reset()
    with pytest.raises(TokenError) as err:
        model.forward([4, 5, VOCAB + 1])
    assert isinstance(err.value, ColibriError) and isinstance(err.value, ValueError)
    assert err.value.index == 2 and f"= {VOCAB + 1}" in str(err.value)
    assert err.value.status != 0


@pytest.mark.parametrize("n,error", [(True, TypeError), (2.0, TypeError), ("2", TypeError), (-1, ValueError)])
def test_generate_count_refused(model, n, error):
    model.reset()
    with pytest.raises(error):
        model.generate(PROMPT, n)
    assert model.n_past == 0


def test_generate_with_numpy_prompt(model):
    model.reset()
    a = model.generate(PROMPT, 4)
    model.reset()
    assert model.generate(np.array(PROMPT, dtype=np.int64), np.int64(4)) == a
    model.reset()
