"""Fuzzing the loader and the pipeline: whatever comes in, the only exceptions are our own.

- random nested structures, with the real key names among random ones;
- random arrays of small shapes under the real keys (these often pass, so later rules run);
- valid fixtures with one thing broken (a key dropped, a shape changed, a type swapped, a NaN);
- raw bytes and text into ``parse_fixture``, as JSON, YAML and undetected;
- numbers of every magnitude from 1e-300 to 1e300 through the whole pipeline.

``validate`` either returns :class:`Inputs` or raises :class:`InputError`; ``run`` either returns
a trace with no NaN in any stage or raises :class:`ComputeError`.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np
import yaml
from conftest import FIXTURES
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from reference import random_fixture

from attn_cli.core.inputs import Inputs
from attn_cli.core.pipeline import Trace, run
from attn_cli.core.stages import STAGE_NAMES
from attn_cli.errors import ComputeError, InputError
from attn_cli.io.fixture import KNOWN_KEYS, parse_fixture, validate

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = 100_000  # a numbers limit that keeps every drawn fixture quick


def check_fixture(obj: Any) -> Inputs | None:
    """Validate and, when valid, trace: only InputError and ComputeError may come out."""
    try:
        inputs = validate(obj, "fuzz.json", max_elements=SMALL)
    except InputError as e:
        assert_one_line(e)
        return None
    assert isinstance(inputs, Inputs)
    check_trace(inputs)
    return inputs


def check_trace(inputs: Inputs) -> Trace | None:
    try:
        trace = run(inputs)
    except ComputeError as e:
        assert_one_line(e)
        return None
    for stage in trace:
        data = stage.data
        assert not np.isnan(data).any(), stage.name
        if stage.name == "masked":
            assert not np.isposinf(data).any()
        else:
            assert np.isfinite(data).all(), stage.name
    return trace


def assert_one_line(error: Exception) -> None:
    text = str(error)
    assert text and "\n" not in text, text
    assert ", expected " in text or text.endswith("expected"), text


# ---------------------------------------------------------------------------------------------
# Random structures

NAMES = st.sampled_from([*KNOWN_KEYS, *STAGE_NAMES]) | st.text(max_size=6)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**400), 10**400)
    | st.integers(-3, 3)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(-5, 5)
    | st.text(max_size=6)
    | st.sampled_from(["-inf", "inf", "nan", "upper-left", "lower-right", "", "\x1b[2J"])
)
NESTED = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
    max_leaves=40,
)


@FUZZ
@given(st.dictionaries(NAMES, NESTED, max_size=10) | NESTED)
def test_random_structures_give_inputs_or_input_error(obj: Any) -> None:
    check_fixture(obj)


@st.composite
def arrays(draw: st.DrawFn) -> Any:
    """A small rectangular nested list of numbers (or 0/1, or booleans), now and then spoiled."""
    shape = draw(st.lists(st.integers(1, 3), min_size=0, max_size=4))
    leaf = draw(
        st.sampled_from([st.floats(-4, 4), st.integers(0, 1), st.booleans(), LEAVES, st.just(1.0)])
    )

    def build(dims: list[int]) -> Any:
        if not dims:
            return draw(leaf)
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(shape)


SCALARS = {
    "heads": st.integers(-1, 5) | LEAVES,
    "kv_heads": st.integers(-1, 5) | LEAVES,
    "scale": st.floats(-1, 10) | LEAVES,
    "causal": st.sampled_from([True, False, "upper-left", "lower-right", "upper_left", 1]),
    "lengths": st.lists(st.integers(-1, 4), max_size=3) | LEAVES,
    "tokens": st.lists(st.text(max_size=3), max_size=4) | LEAVES,
    "key_tokens": st.lists(st.text(max_size=3), max_size=4) | LEAVES,
    "name": st.text(max_size=8) | LEAVES,
    "description": st.text(max_size=8) | LEAVES,
    "expected": st.dictionaries(st.sampled_from(STAGE_NAMES) | st.text(max_size=4), arrays()),
}


@st.composite
def shaped_fixtures(draw: st.DrawFn) -> dict[str, Any]:
    """The real keys with values of plausible kinds: arrays where arrays go, and so on."""
    keys = draw(st.sets(st.sampled_from(KNOWN_KEYS), max_size=10))
    mode = draw(st.sampled_from([("X", "W_Q", "W_K", "W_V"), ("Q", "K", "V"), ()]))
    return {k: draw(SCALARS.get(k, arrays())) for k in sorted({*keys, *mode})}


@FUZZ
@given(shaped_fixtures())
def test_shaped_fixtures_give_inputs_or_input_error(obj: dict[str, Any]) -> None:
    check_fixture(obj)


# ---------------------------------------------------------------------------------------------
# Valid fixtures, broken one way


@st.composite
def valid_fixtures(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        path = draw(st.sampled_from(sorted(FIXTURES.glob("*.yaml"))))
        return dict(yaml.safe_load(path.read_text(encoding="utf-8")))
    mode = draw(st.sampled_from(["projection", "direct"]))
    heads = draw(st.sampled_from([1, 2, 4]))
    layout = 2 if mode == "projection" else draw(st.sampled_from([2, 3, 4]))
    return random_fixture(
        draw(st.integers(0, 2**16)),
        mode=mode,
        layout=layout,
        seq=draw(st.integers(1, 4)),
        heads=heads,
        kv_heads=draw(st.sampled_from([n for n in (1, 2, 4) if heads % n == 0])),
        W_O=draw(st.booleans()),
        causal=draw(st.sampled_from([None, True, "lower-right"])),
        mask=draw(st.sampled_from([None, (), (1,)])),
        lengths=draw(st.sampled_from([None, 1])) if layout == 2 else None,
    )


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a nested structure, as the keys and indices that lead there."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


MUTATIONS = (
    "drop",
    "replace",
    "wrap",
    "unwrap",
    "shorten",
    "lengthen",
    "nan",
    "rename",
    "to_string",
    "to_bool",
    "to_null",
    "huge",
)


@FUZZ
@given(valid_fixtures(), st.sampled_from(MUTATIONS), st.data())
def test_valid_fixture_broken_one_way(fx: dict[str, Any], how: str, data: st.DataObject) -> None:
    fx = copy.deepcopy(fx)
    places = [p for p in _paths(fx) if p]
    path = data.draw(st.sampled_from(places))
    parent, last = _get(fx, path[:-1]), path[-1]
    value = parent[last]
    if how == "drop":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif how == "replace":
        parent[last] = data.draw(NESTED)
    elif how == "wrap":
        parent[last] = [value]
    elif how == "unwrap":
        parent[last] = value[0] if isinstance(value, list) and value else value
    elif how == "shorten" and isinstance(value, list):
        parent[last] = value[:-1]
    elif how == "lengthen" and isinstance(value, list) and value:
        parent[last] = [*value, copy.deepcopy(value[-1])]
    elif how == "nan":
        parent[last] = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, "nan", "-inf"]))
    elif how == "rename" and isinstance(parent, dict):
        parent[data.draw(NAMES)] = parent.pop(last)
    elif how == "to_string":
        parent[last] = str(value)
    elif how == "to_bool":
        parent[last] = bool(value)
    elif how == "to_null":
        parent[last] = None
    elif how == "huge":
        parent[last] = data.draw(st.sampled_from([1e308, -1e308, 10**300, 1e-320]))
    check_fixture(fx)


@settings(max_examples=40, deadline=None)
@given(valid_fixtures())
def test_valid_fixtures_survive_the_text_round_trip(fx: dict[str, Any]) -> None:
    as_json = json.dumps(fx)
    assert check_fixture(fx) is not None
    parse_fixture(as_json, "fuzz.json", fmt="json")
    parse_fixture(yaml.safe_dump(fx), "fuzz.yaml", fmt="yaml")


# ---------------------------------------------------------------------------------------------
# Raw bytes and text

YAMLISH = st.text(alphabet="{}[],:-&*!|>'\"#%@`?~\t\n .01eE+-QKVX_ab\\\x00\x1b\ufeff", max_size=60)
FORMATS = st.sampled_from(["json", "yaml", None])


def check_text(data: bytes | str, fmt: Any) -> None:
    try:
        inputs = parse_fixture(data, "fuzz.txt", fmt=fmt, max_elements=SMALL)
    except InputError as e:
        assert_one_line(e)
        return
    check_trace(inputs)


@FUZZ
@given(st.binary(max_size=200), FORMATS)
@example(b"\xff\xfe\x00\x00", None)
@example(b"\xef\xbb\xbf\x00", "json")
@example(b"a: &a [*a]", None)
@example(b"[" * 2000, "json")
def test_random_bytes_give_inputs_or_input_error(data: bytes, fmt: Any) -> None:
    check_text(data, fmt)


@FUZZ
@given(YAMLISH | st.text(max_size=80), FORMATS)
@example("? [a]\n: 1", None)
@example("{Q: [[1]], K: [[1]], V: [[1]], <<: {}}", None)
@example('{"Q": [[1]], "K": [[1]], "V": [[1]], "tokens": ["\\udc80"]}', "json")
def test_random_text_gives_inputs_or_input_error(text: str, fmt: Any) -> None:
    check_text(text, fmt)


VALID_TEXT = (FIXTURES / "the_cat_sat.yaml").read_bytes()


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID_TEXT) - 1), st.integers(0, 255)), max_size=4))
def test_valid_text_with_flipped_bytes(flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID_TEXT)
    for at, byte in flips:
        data[at] = byte
    check_text(bytes(data), None)


# ---------------------------------------------------------------------------------------------
# Numerics: magnitudes from 1e-300 to 1e300


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(-300, 300),
    st.sampled_from(["projection", "direct"]),
    st.sampled_from([None, 1e-300, 1e-10, 1.0, 1e10, 1e300]),
    st.booleans(),
    st.sampled_from([None, True, "lower-right"]),
)
def test_any_magnitude_gives_finite_stages_or_a_compute_error(
    seed: int, exponent: int, mode: str, scale: float | None, bias: bool, causal: Any
) -> None:
    fx = random_fixture(
        seed,
        mode=mode,
        layout=2 if mode == "projection" else 3,
        seq=3,
        heads=2,
        kv_heads=1,
        W_O=True,
        b_O=True,
        qkv_bias=True,
        scale=scale,
        causal=causal,
        bias=(3, 3) if bias else None,
        neg_inf_bias=bias,
        magnitude=10.0**exponent,
    )
    try:
        inputs = validate(fx, "magnitude.json")
    except InputError:  # a random number may itself land beyond float64 at 1e300
        assume(False)
        return
    trace = check_trace(inputs)
    if trace is not None:
        rows = trace["softmax"].data.sum(axis=-1)
        assert np.all((np.abs(rows - 1) < 1e-9) | (rows == 0))


def test_scores_of_1e4_softmax_without_overflow() -> None:
    trace = check_trace(validate({"Q": [[1e4], [-1e4]], "K": [[1e4], [1]], "V": [[1], [2]]}, "x"))
    assert trace is not None
    np.testing.assert_allclose(trace["softmax"].data[0], [[1, 0], [0, 1]], atol=1e-300)
