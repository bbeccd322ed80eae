"""The fast path for big YAML fixtures gives exactly what PyYAML's safe loader gives, or steps
aside: every document here is parsed both ways and compared."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.io import fastyaml
from attn_cli.io.fixture import load_fixture
from attn_cli.io.yamlfmt import _check_aliases, _yaml_loader, _yaml_size

SOURCE = "test.yaml"


def slow(text: str) -> Any:
    return yaml.load(text, Loader=_yaml_loader(SOURCE, 10**9))  # a SafeLoader


def fast(text: str) -> Any:
    def check_size(node: Any) -> None:
        _check_aliases(*_yaml_size(node, SOURCE), SOURCE, 10**9)

    return fastyaml.parse(text, _yaml_loader(SOURCE, 10**9), check_size)


@pytest.fixture(autouse=True)
def small_documents_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastyaml, "MIN_CHARS", 0)


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types (1 and 1.0 differ) and NaN equal to NaN."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize(
    "text",
    [
        "X:\n- [0.5, -1.25, 3.0e-2, 1e5, 2E-3, .5, 5., +1.5, -0.0]\n- [1.0, 2.0, 3.0]\n",
        "X: [[1, 2], [3, -4]]\nlengths: [0, -0, +7]\n",
        "Q: [[1.5e+3, 1.5e3], [1e400, -1e400]]\n",  # beyond float64: inf, as the loader reads it
        "X: [\n  [1.0,\n   2.0],\n  [3.0, 4.0]\n]\n",
        "mask: [[1, 0], [0, 1]]\nheads: 2\nname: no rows here\n",
    ],
)
def test_taken_documents_equal_the_safe_loader(text: str) -> None:
    assert same(fast(text), slow(text))


@pytest.mark.parametrize(
    "text",
    [
        "X: [010, 1]\n",  # octal to YAML 1.1
        "X: [-.5, 1.0]\n",  # a string to YAML 1.1
        "X: [.inf, 1.0]\n",
        "X: [1_000.0, 1.0]\n",
        "X: [0x1F, 1.0]\n",
        "X: [1.0,, 2.0]\n",
        "X: [1.0, 2.0]  # [3.0, 4.0]\n",  # a row in a comment
        "name: '[1.0, 2.0]'\nX: [1.0]\n",  # a row in a string
        "description: |\n  [1.0, 2.0]\nX: [1.0]\n",  # in a block scalar
        "Q: &q [[1.0, 2.0]]\nK: *q\n",  # anchors and aliases
        "X: [1.0, 2.0]\nX: [3.0]\n",  # a duplicate key: the normal path names it
        "X: [1.0, 2.0\n",  # invalid YAML
        "X: !attn-row 0\n",  # our own tag in the input
        "X: [a, b]\n",
        "X: [1.0]\nname: rows [1.0, 2.0] in a plain scalar\n",
    ],
)
def test_doubtful_documents_are_left_to_the_normal_path(text: str) -> None:
    try:
        result = fast(text)
    except fastyaml.NotFast:
        return
    assert same(result, slow(text))


TOKENS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(
        [
            "010",
            "-0",
            "+5",
            "-.5",
            ".5",
            "5.",
            "1e5",
            "1E+5",
            "1.5e3",
            "1_0",
            ".inf",
            "0x1F",
            "-.5e3",
            "00.5",
            "1e",
            "e5",
            "1.2.3",
            "",
            "--1",
            "+.5",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(TOKENS, min_size=1, max_size=6), min_size=1, max_size=4))
def test_any_row_is_read_as_the_safe_loader_reads_it(rows: list[list[str]]) -> None:
    text = "X:\n" + "".join("- [" + ", ".join(row) + "]\n" for row in rows)
    try:
        expected = slow(text)
    except yaml.YAMLError:
        with pytest.raises(fastyaml.NotFast):
            fast(text)
        return
    try:
        got = fast(text)
    except fastyaml.NotFast:
        return
    assert same(got, expected), text


@pytest.mark.slow  # about 0.3 s: a 300-row fixture through both loaders
def test_a_big_yaml_fixture_loads_as_its_json_twin(tmp_path: Path) -> None:
    rows = [[(i * 7 + j) / 13 - 3 for j in range(64)] for i in range(400)]
    fx = {
        "X": rows,
        "W_Q": [r[:8] for r in rows[:64]],
        "W_K": [r[8:16] for r in rows[:64]],
        "W_V": [r[16:24] for r in rows[:64]],
    }
    (tmp_path / "fx.json").write_text(json.dumps(fx))
    (tmp_path / "fx.yaml").write_text(yaml.safe_dump(fx, default_flow_style=None, width=10**6))
    a, b = load_fixture(tmp_path / "fx.json"), load_fixture(tmp_path / "fx.yaml")
    for key in ("X", "W_Q", "W_K", "W_V"):
        assert (getattr(a, key) == getattr(b, key)).all(), key
