"""Fixture format v1, rule by rule: every accepted form and every error (docs/fixture-format.md).

Error tests are ``(fixture, field, fragment)``: the message must be one line of the form
``<file>: <field>: <what is wrong>, expected <what>`` and contain the fragment. Mapping fixtures
go through :func:`validate` and, serialised, through the JSON parser; text fixtures through the
YAML parser. Accepted forms are checked on the :class:`Inputs` they produce.
"""

from __future__ import annotations

import io
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DOCS

from attn_cli.core.inputs import Inputs
from attn_cli.core.pipeline import run
from attn_cli.errors import InputError
from attn_cli.io.fixture import load_fixture, parse_fixture, validate

SRC = "fix.yaml"


def direct(**extra: Any) -> dict[str, Any]:
    """Direct mode, seq_q = seq_k = 2, d = 2, one head."""
    return {"Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1]], "V": [[1, 2], [3, 4]], **extra}


def direct3(**extra: Any) -> dict[str, Any]:
    """Direct mode with a batch axis: batch 2, seq 2, d 2."""
    qkv = [[[1, 0], [0, 1]], [[2, 0], [0, 2]]]
    return {"Q": qkv, "K": qkv, "V": qkv, **extra}


def proj(**extra: Any) -> dict[str, Any]:
    """Projection mode, seq 3, d_model 2, d_k = d_v = 2."""
    eye = [[1, 0], [0, 1]]
    return {"X": [[1, 0], [0, 1], [1, 1]], "W_Q": eye, "W_K": eye, "W_V": eye, **extra}


def yaml_text(body: str) -> str:
    return "Q: [[1, 0], [0, 1]]\nK: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\n" + body


def message(fixture: dict[str, Any] | str | bytes, **kw: Any) -> str:
    with pytest.raises(InputError) as info:
        if isinstance(fixture, (str, bytes)):
            parse_fixture(fixture, SRC, **kw)
        else:
            validate(fixture, SRC, **kw)
    return str(info.value)


def assert_message(msg: str, field: str, fragment: str) -> None:
    assert "\n" not in msg, msg
    prefix = f"{SRC}: {field}: " if field else f"{SRC}: "
    assert msg.startswith(prefix), msg
    assert ", expected " in msg, msg
    assert fragment in msg, msg


# ---------------------------------------------------------------------------------------------
# Errors in a parsed mapping (also checked through the JSON parser)

MAPPING_ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    # keys
    ("unknown key suggests", direct(causual=True), "causual", "did you mean 'causal'?"),
    ("unknown key case", direct(w_q=1), "w_q", "did you mean 'W_Q'?"),
    ("unknown key lists", direct(foo=1), "foo", "expected one of name, description"),
    ("unknown key null", direct(causual=None), "causual", "unknown key"),
    ("newline in key", direct(**{"a\nb": 1}), "'a\\nb'", "unknown key"),
    ("empty key", direct(**{"": 1}), "''", "unknown key"),
    ("both modes", {**proj(), **direct()}, "Q", "both modes at once (X, W_Q, W_K, W_V and"),
    ("bias vector makes both", direct(b_Q=[1, 2]), "Q", "both modes at once (b_Q and Q, K, V)"),
    ("neither mode", {"name": "x"}, "", "no inputs, expected X with W_Q, W_K, W_V"),
    ("only nulls", {"X": None, "Q": None}, "", "no inputs"),
    ("X alone", {"X": [[1]]}, "W_Q", "missing, expected X, W_Q, W_K and W_V together"),
    ("W_V missing", {**proj(), "W_V": None}, "W_V", "missing"),
    ("Q alone", {"Q": [[1]]}, "K", "missing, expected Q, K and V together"),
    # name, description, tokens, key_tokens
    ("name number", direct(name=3), "name", "got the number 3, expected a string"),
    ("name list", direct(name=["a"]), "name", "got a list, expected a string"),
    ("description bool", direct(description=True), "description", "the boolean true"),
    ("tokens string", direct(tokens="a b"), "tokens", "expected a list of strings"),
    ("tokens number", direct(tokens=["a", 1]), "tokens[1]", "got the number 1, expected a string"),
    ("tokens bool", direct(tokens=[True, "b"]), "tokens[0]", "the boolean true"),
    ("tokens null item", direct(tokens=["a", None]), "tokens[1]", "got null"),
    ("tokens count", direct(tokens=["a", "b", "c"]), "tokens", "has 3 tokens, expected 2 = seq_q"),
    ("tokens count proj", proj(tokens=["a"]), "tokens", "has 1 tokens, expected 3 = seq_q"),
    (
        "key_tokens count",
        direct(Q=[[1, 0]], key_tokens=["a"]),
        "key_tokens",
        "has 1 tokens, expected 2 = seq_k",
    ),
    ("key_tokens number", direct(key_tokens=[1, 2]), "key_tokens[0]", "expected a string"),
    # projection mode shapes
    ("X 1 axis", proj(X=[1, 0]), "X", "has 1 axes (shape [2]), expected shape [seq, d_model]"),
    ("X 4 axes", proj(X=[[[[1, 0]]]]), "X", "has 4 axes"),
    ("X scalar", proj(X=1), "X", "got the number 1, expected shape [seq, d_model]"),
    ("X mapping", proj(X={"a": 1}), "X", "got a mapping"),
    ("W_Q rows", proj(W_Q=[[1, 0]]), "W_Q", "has 1 rows, expected d_model = 2 rows"),
    ("W_K 1 axis", proj(W_K=[1, 0]), "W_K", "has 1 axes (shape [2]), expected shape [d_model"),
    ("W_Q heads", proj(W_Q=[[1, 0, 0], [0, 1, 0]], heads=2), "W_Q", "not divisible by heads = 2"),
    (
        "W_K kv_heads",
        proj(W_Q=[[1, 0, 0, 0], [0, 1, 0, 0]], W_K=[[1, 0, 0], [0, 1, 0]], heads=2),
        "W_K",
        "has 3 columns, not divisible by kv_heads = 2",
    ),
    (
        "W_K d_k",
        proj(W_K=[[1, 0, 0, 0], [0, 1, 0, 0]]),
        "W_K",
        "has 4 columns (d_k = 4 per head), expected kv_heads*d_k = 1*2 = 2 columns",
    ),
    (
        "W_K gqa width",
        proj(W_Q=[[1, 0, 0, 0], [0, 1, 0, 0]], heads=2, kv_heads=1, W_K=[[1], [0]]),
        "W_K",
        "expected kv_heads*d_k = 1*2 = 2 columns",
    ),
    (
        "W_V kv_heads",
        proj(
            W_Q=[[1, 0, 0, 0], [0, 1, 0, 0]],
            W_K=[[1, 0, 0, 0], [0, 1, 0, 0]],
            heads=2,
            W_V=[[1, 0, 0], [0, 1, 0]],
        ),
        "W_V",
        "not divisible by kv_heads = 2",
    ),
    ("b_Q length", proj(b_Q=[1, 2, 3]), "b_Q", "has length 3, expected columns of W_Q = 2"),
    ("b_K axes", proj(b_K=[[1, 2]]), "b_K", "has 2 axes"),
    ("b_V length", proj(b_V=[1]), "b_V", "has length 1, expected columns of W_V = 2"),
    ("b_Q scalar", proj(b_Q=1), "b_Q", "expected a vector of length"),
    # direct mode shapes
    ("Q 1 axis", direct(Q=[1, 0]), "Q", "has 1 axes (shape [2]), expected shape [seq, heads*d]"),
    ("Q 5 axes", direct(Q=[[[[[1]]]]]), "Q", "has 5 axes"),
    ("K other layout", direct(K=[[[1, 0], [0, 1]]]), "K", "has 3 axes but Q has 2"),
    ("V other layout", direct(V=[[[1, 0], [0, 1]]]), "V", "has 3 axes but Q has 2"),
    ("Q heads", direct(Q=[[1, 0, 0]], heads=2), "Q", "has 3 columns, not divisible by heads = 2"),
    ("K d_k", direct(K=[[1, 0, 0], [0, 1, 0]]), "K", "has d_k = 3 per head, expected d_k = 2"),
    ("V positions", direct(V=[[1, 2], [3, 4], [5, 6]]), "V", "has 3 positions, expected seq_k = 2"),
    ("K batch", direct3(K=[[[1, 0], [0, 1]]]), "K", "has batch 1, expected batch 2 as in Q"),
    ("V batch", direct3(V=[[[1, 0], [0, 1]]]), "V", "has batch 1, expected batch 2 as in Q"),
    (
        "4d heads given",
        {"Q": [[[[1.0]], [[1.0]]]], "K": [[[[1.0]]]], "V": [[[[1.0]]]], "heads": 3},
        "heads",
        "is 3 but the arrays have 2 on their head axis, expected 2, or omit it",
    ),
    (
        "4d kv_heads given",
        {"Q": [[[[1.0]], [[1.0]]]], "K": [[[[1.0]]]], "V": [[[[1.0]]]], "kv_heads": 2},
        "kv_heads",
        "is 2 but the arrays have 1 on their head axis",
    ),
    (
        "4d V heads",
        {"Q": [[[[1.0]], [[1.0]]]], "K": [[[[1.0]], [[1.0]]]], "V": [[[[1.0]]]]},
        "V",
        "has 1 heads, expected as many as K (2)",
    ),
    (
        "4d kv_heads divides",
        {"Q": [[[[1.0]], [[1.0]], [[1.0]]]], "K": [[[[1.0]], [[1.0]]]], "V": [[[[1.0]], [[1.0]]]]},
        "kv_heads",
        "is 2, which does not divide heads = 3",
    ),
    # heads and kv_heads
    ("heads 0", direct(heads=0), "heads", "is 0, expected a whole number >= 1"),
    ("heads negative", direct(heads=-2), "heads", "is -2"),
    ("heads float", direct(heads=2.0), "heads", "got the number 2.0, expected a whole number"),
    ("heads bool", direct(heads=True), "heads", "got the boolean true"),
    ("heads string", direct(heads="2"), "heads", "got the string '2'"),
    ("kv_heads 0", direct(kv_heads=0), "kv_heads", "is 0"),
    (
        "kv_heads divides",
        proj(W_Q=[[1, 0, 0, 0], [0, 1, 0, 0]], heads=4, kv_heads=3),
        "kv_heads",
        "is 3, which does not divide heads = 4, expected a divisor of heads",
    ),
    ("kv_heads above heads", direct(kv_heads=2), "kv_heads", "does not divide heads = 1"),
    # W_O and b_O
    ("W_O rows", direct(W_O=[[1], [2], [3]]), "W_O", "has 3 rows, expected heads*d_v = 1*2 = 2"),
    ("W_O 1 axis", direct(W_O=[1, 2]), "W_O", "has 1 axes"),
    ("b_O length", direct(W_O=[[1], [2]], b_O=[1, 2]), "b_O", "has length 2, expected d_out"),
    ("b_O without W_O", direct(b_O=[1, 2]), "b_O", "given without W_O"),
    # scale
    ("scale 0", direct(scale=0), "scale", "is 0, expected a finite number > 0"),
    ("scale negative", direct(scale=-0.5), "scale", "is -0.5"),
    ("scale string", direct(scale="0.5"), "scale", "got the string '0.5', expected a number > 0"),
    ("scale bool", direct(scale=True), "scale", "got the boolean true"),
    ("scale list", direct(scale=[1]), "scale", "got a list"),
    ("scale huge int", direct(scale=10**400), "scale", "expected a finite number > 0"),
    # causal
    ("causal typo", direct(causal="upper_left"), "causal", 'expected false, true, "upper-left"'),
    ("causal case", direct(causal="Lower-Right"), "causal", "got the string 'Lower-Right'"),
    ("causal number", direct(causal=1), "causal", "got the number 1"),
    ("causal string bool", direct(causal="true"), "causal", "got the string 'true'"),
    # mask
    ("mask 2", direct(mask=[[1, 2], [0, 1]]), "mask[0][1]", "the number 2, expected true/false"),
    ("mask float", direct(mask=[[1.0, 0], [0, 1]]), "mask[0][0]", "expected true/false or 1/0"),
    ("mask string", direct(mask="yes"), "mask", "got the string 'yes', expected true/false"),
    ("mask shape", direct(mask=[[1, 1, 1]]), "mask", "has shape [1, 3], which does not broadcast"),
    (
        "mask target",
        direct(mask=[1, 1, 1]),
        "mask",
        "right-aligned, as torch) to [batch=1, heads=1, seq_q=2, seq_k=2]",
    ),
    ("mask heads", direct(mask=[[[1, 1]], [[1, 1]]]), "mask", "has shape [2, 1, 2]"),
    ("mask batch", direct3(mask=[[[[1, 1]]]] * 3), "mask", "has shape [3, 1, 1, 2]"),
    ("mask 5 axes", direct(mask=[[[[[1]]]]]), "mask", "has 5 axes, expected at most 4"),
    ("mask ragged", direct(mask=[[1, 1], [1]]), "mask[1]", "row has 1 entries, expected 2"),
    # bias
    ("bias +inf", direct(bias=[["+inf", 0]]), "bias[0][0]", "got the string '+inf'"),
    ("bias inf", direct(bias=[[0, "inf"]]), "bias[0][1]", 'expected a number or "-inf"'),
    ("bias nan", direct(bias=[["nan", 0]]), "bias[0][0]", "got the string 'nan'"),
    ("bias bool", direct(bias=[[True, 0]]), "bias[0][0]", "got the boolean true"),
    ("bias shape", direct(bias=[0, 0, 0]), "bias", "has shape [3], which does not broadcast"),
    ("bias 5 axes", direct(bias=[[[[[0]]]]]), "bias", "has 5 axes"),
    # lengths
    ("lengths count", direct3(lengths=[2]), "lengths", "has 1 entries, expected one per batch"),
    ("lengths count nobatch", direct(lengths=[1, 1]), "lengths", "expected one per batch item (1)"),
    ("lengths above", direct(lengths=[3]), "lengths[0]", "is 3, expected a number of valid keys"),
    ("lengths negative", direct3(lengths=[2, -1]), "lengths[1]", "between 0 and seq_k = 2"),
    ("lengths bool", direct(lengths=[True]), "lengths[0]", "got the boolean true"),
    ("lengths float", direct(lengths=[1.0]), "lengths[0]", "got the number 1.0"),
    ("lengths scalar", direct(lengths=5), "lengths", "is 5"),
    ("lengths nested", direct(lengths=[[1]]), "lengths[0]", "got a list"),
    # expected
    ("expected list", direct(expected=[1]), "expected", "expected a mapping of stage name"),
    (
        "expected typo",
        direct(expected={"sofmax": [[1]]}),
        "expected.sofmax",
        "unknown stage (did you mean 'softmax'?), expected one of X, X_kv, c_Q, c_Q_norm, q_nope",
    ),
    ("expected case", direct(expected={"x": [[1]]}), "expected.x", "did you mean 'X'?"),
    (
        "expected value",
        direct(expected={"softmax": [[1, "x"]]}),
        "expected.softmax[0][1]",
        'got the string \'x\', expected a number, "-inf", "inf" or "nan"',
    ),
    ("expected axes", direct(expected={"scores": [[[[[1]]]]]}), "expected.scores", "has 5 axes"),
    ("expected scalar", direct(expected={"scores": 1}), "expected.scores", "got the number 1"),
    # numbers
    ("bool in X", proj(X=[[1, True], [0, 1], [1, 1]]), "X[0][1]", "got the boolean true"),
    ("string in X", proj(X=[[1, "1"], [0, 1], [1, 1]]), "X[0][1]", "got the string '1'"),
    ("null in X", proj(X=[[1, None], [0, 1], [1, 1]]), "X[0][1]", "got null, expected a number"),
    ("ragged X", proj(X=[[1, 0], [0], [1, 1]]), "X[1]", "row has 1 entries, expected 2 like X[0]"),
    ("list in row", proj(X=[[1, 0], [0, [1]], [1, 1]]), "X[1][1]", "got a list"),
    ("number for row", proj(X=[[1, 0], 3, [1, 1]]), "X[1]", "got the number 3, expected a list"),
    ("ragged 3d", direct3(Q=[[[1, 0], [0, 1]], [[2, 0], [0]]]), "Q[1][1]", "row has 1 entries"),
    ("empty X", proj(X=[]), "X", "empty list, expected a non-empty list"),
    ("empty row", proj(X=[[]]), "X[0]", "empty list"),
    ("float overflow", proj(X=[[1, 0], [0, 1], [1, 10**400]]), "X[2][1]", "beyond the range"),
    ("deep nesting", direct(Q=[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]), "Q", "nested more than 16"),
    ("top level list", [1, 2], "", "top level is a list, expected a mapping"),  # type: ignore[list-item]
]


@pytest.mark.parametrize(
    ("fixture", "field", "fragment"),
    [pytest.param(f, k, m, id=i) for i, f, k, m in MAPPING_ERRORS],
)
def test_mapping_error(fixture: dict[str, Any], field: str, fragment: str) -> None:
    msg = message(fixture)
    assert_message(msg, field, fragment)
    text = json.dumps(fixture)
    if not re.search(r"\d{301}", text):
        # the same mapping written as JSON gives the same message
        assert message(json.dumps(fixture), fmt="json") == msg


# ---------------------------------------------------------------------------------------------
# Errors only text can make: YAML and JSON syntax, literals, duplicates, tags, aliases

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
)  # 10**10 scalars once expanded

TEXT_ERRORS: list[tuple[str, str, str | None, str, str]] = [
    # (id, text, fmt, field, fragment)
    ("yaml dup", yaml_text("causal: 1\ncausal: 0\n"), None, "causal", "duplicate key (line 5)"),
    ("yaml dup nested", yaml_text("expected: {Q: [[1]], Q: [[2]]}\n"), None, "Q", "duplicate key"),
    ("json dup", '{"Q": [[1]], "K": [[1]], "V": [[1]], "Q": [[2]]}', "json", "Q", "duplicate key"),
    ("json dup detected", '{"Q": [[1]], "Q": [[2]]}', None, "Q", "expected each key once"),
    ("yaml unknown", yaml_text("causual: true\n"), None, "causual", "did you mean 'causal'?"),
    ("yaml int key", yaml_text("1: 2\n"), None, "1", "key is the number 1, expected a string key"),
    ("yaml bool key", yaml_text("yes: 2\n"), None, "True", "key is the boolean true"),
    ("yaml tokens bool", yaml_text("tokens: [on, off]\n"), None, "tokens[0]", "quote it in YAML"),
    ("yaml tokens int", yaml_text("tokens: [1, 2]\n"), None, "tokens[0]", "got the number 1"),
    ("yaml .inf in X", yaml_text("W_O: [[.inf], [1]]\n"), None, "W_O[0][0]", "is inf"),
    ("yaml -.inf in Q", "Q: [[-.inf]]\nK: [[1]]\nV: [[1]]\n", None, "Q[0][0]", "is -inf"),
    ("yaml .nan", "Q: [[.nan]]\nK: [[1]]\nV: [[1]]\n", None, "Q[0][0]", "expected a finite number"),
    ("yaml 1e400", "Q: [[1e400]]\nK: [[1]]\nV: [[1]]\n", None, "Q[0][0]", "is inf"),
    ("yaml scale .inf", yaml_text("scale: .inf\n"), None, "scale", "is inf, expected a finite"),
    ("yaml scale .nan", yaml_text("scale: .nan\n"), None, "scale", "is nan"),
    ("yaml bias +inf", yaml_text("bias: [[0, .inf]]\n"), None, "bias[0][1]", "is inf"),
    ("yaml bias nan", yaml_text("bias: [[.nan, 0]]\n"), None, "bias[0][0]", "is nan"),
    ("yaml 5000 digits", yaml_text("scale: " + "1" * 5000 + "\n"), None, "line 4", "5000 digits"),
    ("yaml 400 digits", "Q: [[" + "9" * 400 + "]]\n", None, "line 1", "at most 300 digits"),
    ("json NaN", '{"Q": [[NaN]], "K": [[1]], "V": [[1]]}', "json", "Q[0][0]", "literal NaN"),
    (
        "json Infinity",
        '{"Q": [[1, Infinity]], "K": [[1, 1]], "V": [[1]]}',
        "json",
        "Q[0][1]",
        "the JSON literal Infinity",
    ),
    (
        "json -Infinity in bias",
        '{"Q": [[1]], "K": [[1]], "V": [[1]], "bias": [[-Infinity]]}',
        "json",
        "bias[0][0]",
        'got the JSON literal -Infinity, expected a number or "-inf"',
    ),
    ("json 1e400", '{"Q": [[1e400]], "K": [[1]], "V": [[1]]}', "json", "Q[0][0]", "float64"),
    (
        "json scale 1e400",
        json.dumps(direct())[:-1] + ', "scale": 1e400}',
        "json",
        "scale",
        "got the number 1e400, beyond the range of float64",
    ),
    ("json 5000 digits", '{"Q": [[' + "1" * 5000 + "]]}", "json", "", "integer with 5000 digits"),
    ("json syntax", '{"Q": [[1]],}', "json", "line 1 column 13", "invalid JSON"),
    ("yaml in .json", "Q: [[1]]\n", "json", "line 1 column 1", "invalid JSON"),
    ("json deep", "[" * 100_000 + "]" * 100_000, "json", "", "nesting is too deep"),
    ("yaml syntax", "Q: [[1]\nK: 1\n", None, "line 2 column 1", "did not find expected ',' or ']'"),
    ("yaml tab", "Q:\n\t- [1]\n", None, "line 2 column 1", "invalid YAML"),
    (
        "two documents",
        "Q: 1\n---\nK: 1\n",
        None,
        "line 2 column 1",
        "expected a single document in the stream, but found another",
    ),
    ("yaml top scalar", "hello\n", None, "", "top level is the string 'hello'"),
    ("yaml top null", "---\n", None, "", "top level is null"),
    ("comments only", "# nothing here\n", None, "", "the file is empty"),
    ("empty", "", None, "", "the file is empty, expected a JSON or YAML mapping"),
    ("whitespace", " \n\t\n", None, "", "the file is empty"),
    (
        "python tag",
        'Q: !!python/object/apply:os.system ["echo hi"]\n',
        None,
        "line 1 column 4",
        "the YAML tag !!python/object/apply:os.system is not allowed",
    ),
    ("python name tag", "Q: !!python/name:os.system ''\n", None, "line 1 column 4", "not allowed"),
    ("custom tag", "Q: !weights [[1]]\n", None, "line 1 column 4", "expected plain YAML data"),
    ("alias bomb", BOMB, None, "", "the document expands to too many values"),
    ("recursive alias", "Q: &a [*a]\n", None, "line 1", "a recursive alias"),
    ("yaml set", yaml_text("tokens: !!set {a, b}\n"), None, "tokens", "got a set (!!set)"),
    ("yaml date token", yaml_text("tokens: [2020-01-01, b]\n"), None, "tokens[0]", "the date 2020"),
]


@pytest.mark.parametrize(
    ("text", "fmt", "field", "fragment"),
    [pytest.param(t, f, k, m, id=i) for i, t, f, k, m in TEXT_ERRORS],
)
def test_text_error(text: str, fmt: Any, field: str, fragment: str) -> None:
    assert_message(message(text, fmt=fmt), field, fragment)


def test_yaml_tag_is_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f'Q: !!python/object/apply:os.system ["touch {marker}"]\nK: [[1]]\nV: [[1]]\n'
    assert_message(message(text), "line 1 column 4", "is not allowed (tags are refused, never run)")
    assert not marker.exists()


def test_alias_bomb_is_refused_quickly() -> None:
    start = time.perf_counter()
    assert_message(message(BOMB), "", "expands to too many values")
    assert time.perf_counter() - start < 1.0


def test_size_limit_counts_numbers() -> None:
    fixture = direct()  # 12 numbers
    validate(fixture, SRC, max_elements=12)
    assert_message(message(fixture, max_elements=11), "", "too many numbers, expected at most 11")


def test_size_limit_counts_expanded_aliases() -> None:
    text = "Q: &q [[1, 2, 3, 4]]\nK: *q\nV: *q\n"
    assert parse_fixture(text, SRC, max_elements=12).seq_k == 1
    assert_message(message(text, max_elements=3), "", "expands to too many values")


# ---------------------------------------------------------------------------------------------
# Accepted forms and the Inputs they give


def test_projection_2d() -> None:
    inp = validate(proj(tokens=["a", "b", "c"], name="n", description="d"), SRC)
    assert isinstance(inp, Inputs)
    assert (inp.mode, inp.has_batch, inp.batch, inp.seq_q, inp.seq_k) == (
        "projection",
        False,
        1,
        3,
        3,
    )
    assert (inp.heads, inp.kv_heads, inp.d_k, inp.d_v, inp.d_model) == (1, 1, 2, 2, 2)
    assert inp.X is not None and inp.X.shape == (1, 3, 2)  # (batch, seq, d_model)
    assert inp.X.dtype == np.float64
    assert inp.W_Q is not None and inp.W_Q.shape == (2, 2)
    assert (inp.name, inp.description, inp.source) == ("n", "d", SRC)
    assert inp.tokens == ("a", "b", "c")
    assert inp.key_tokens == inp.tokens  # defaults to tokens when seq_q == seq_k
    assert inp.Q is None and inp.b_Q is None and inp.W_O is None and inp.d_out is None
    assert (inp.scale, inp.causal, inp.mask, inp.bias, inp.lengths) == (None,) * 5
    assert dict(inp.expected) == {}


def test_projection_batch_heads_gqa_and_biases() -> None:
    X = np.arange(2 * 3 * 2, dtype=float).reshape(2, 3, 2).tolist()  # (batch, seq, d_model)
    W_Q = np.ones((2, 8)).tolist()  # heads 4 * d_k 2
    W_K = np.ones((2, 4)).tolist()  # kv_heads 2 * d_k 2
    W_V = np.ones((2, 6)).tolist()  # kv_heads 2 * d_v 3
    inp = validate(
        {
            "X": X,
            "W_Q": W_Q,
            "W_K": W_K,
            "W_V": W_V,
            "heads": 4,
            "kv_heads": 2,
            "b_Q": [0.5] * 8,
            "b_K": [1] * 4,
            "b_V": [2] * 6,
        },
        SRC,
    )
    assert (inp.has_batch, inp.batch, inp.heads, inp.kv_heads, inp.d_k, inp.d_v) == (
        True,
        2,
        4,
        2,
        2,
        3,
    )
    assert inp.X is not None and inp.X.shape == (2, 3, 2)
    assert inp.b_Q is not None and inp.b_Q.shape == (8,)
    assert inp.b_V is not None and inp.b_V.tolist() == [2.0] * 6


def test_kv_heads_defaults_to_heads() -> None:
    inp = validate(direct(Q=[[1, 0, 0, 1]], K=[[1, 0, 0, 1]], V=[[1, 0, 0, 1]], heads=2), SRC)
    assert (inp.heads, inp.kv_heads) == (2, 2)


def test_direct_2d_splits_contiguous_column_blocks() -> None:
    Q = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # seq 3, heads 2 * d 2
    inp = validate({"Q": Q, "K": Q, "V": Q, "heads": 2}, SRC)
    assert (inp.mode, inp.has_batch, inp.batch, inp.heads, inp.d_k, inp.d_v) == (
        "direct",
        False,
        1,
        2,
        2,
        2,
    )
    assert inp.Q is not None and inp.Q.shape == (1, 2, 3, 2)  # (batch, heads, seq, d)
    np.testing.assert_array_equal(inp.Q[0, 0], [[0, 1], [4, 5], [8, 9]])  # head 0: columns 0:2
    np.testing.assert_array_equal(inp.Q[0, 1], [[2, 3], [6, 7], [10, 11]])  # head 1: columns 2:4
    assert inp.X is None and inp.W_Q is None and inp.d_model is None


def test_direct_3d_has_batch() -> None:
    inp = validate(direct3(), SRC)
    assert (inp.has_batch, inp.batch, inp.seq_q, inp.heads) == (True, 2, 2, 1)
    assert inp.Q is not None and inp.Q.shape == (2, 1, 2, 2)
    np.testing.assert_array_equal(inp.Q[1, 0], [[2, 0], [0, 2]])


def test_direct_4d_kept_and_heads_read_from_arrays() -> None:
    Q = np.arange(1 * 4 * 2 * 3, dtype=float).reshape(1, 4, 2, 3)  # (batch, heads, seq_q, d_k)
    K = np.ones((1, 2, 5, 3))  # (batch, kv_heads, seq_k, d_k)
    V = np.ones((1, 2, 5, 7))  # (batch, kv_heads, seq_k, d_v)
    inp = validate({"Q": Q.tolist(), "K": K.tolist(), "V": V.tolist(), "heads": 4}, SRC)
    assert (inp.has_batch, inp.heads, inp.kv_heads, inp.seq_q, inp.seq_k, inp.d_k, inp.d_v) == (
        True,
        4,
        2,
        2,
        5,
        3,
        7,
    )
    assert inp.Q is not None
    np.testing.assert_array_equal(inp.Q, Q)
    assert inp.V is not None and inp.V.shape == (1, 2, 5, 7)


def test_direct_gqa_2d() -> None:
    inp = validate({"Q": [[1] * 8], "K": [[1] * 2], "V": [[1] * 4], "heads": 4, "kv_heads": 1}, SRC)
    assert (inp.heads, inp.kv_heads, inp.d_k, inp.d_v) == (4, 1, 2, 4)
    assert inp.K is not None and inp.K.shape == (1, 1, 1, 2)


def test_queries_and_keys_differ_in_length() -> None:
    fixture = {"Q": [[1, 0]], "K": [[1, 0], [0, 1], [1, 1]], "V": [[1], [2], [3]]}
    inp = validate({**fixture, "tokens": ["q"], "key_tokens": ["a", "b", "c"]}, SRC)
    assert (inp.seq_q, inp.seq_k, inp.d_v) == (1, 3, 1)
    assert (inp.tokens, inp.key_tokens) == (("q",), ("a", "b", "c"))
    inp = validate({**fixture, "tokens": ["q"]}, SRC)
    assert inp.key_tokens is None  # keys are labelled by position


def test_key_tokens_may_differ_from_tokens() -> None:
    inp = validate(direct(tokens=["a", "b"], key_tokens=["x", "y"]), SRC)
    assert (inp.tokens, inp.key_tokens) == (("a", "b"), ("x", "y"))
    assert validate(direct(), SRC).tokens is None


def test_output_projection() -> None:
    inp = validate(direct(W_O=[[1, 0, 1], [0, 1, 1]], b_O=[0, 0, 1]), SRC)
    assert inp.W_O is not None and inp.W_O.shape == (2, 3)
    assert inp.b_O is not None and inp.b_O.tolist() == [0, 0, 1]
    assert inp.d_out == 3
    assert validate(direct(W_O=[[1], [1]]), SRC).b_O is None


@pytest.mark.parametrize(("value", "scale"), [(None, None), (1, 1.0), (0.125, 0.125), (3, 3.0)])
def test_scale(value: Any, scale: float | None) -> None:
    inp = validate(direct(scale=value), SRC)
    assert inp.scale == scale
    assert inp.scale is None or type(inp.scale) is float


@pytest.mark.parametrize(
    ("value", "causal"),
    [
        (False, None),
        (None, None),
        (True, "upper-left"),
        ("upper-left", "upper-left"),
        ("lower-right", "lower-right"),
    ],
)
def test_causal(value: Any, causal: str | None) -> None:
    assert validate(direct(causal=value), SRC).causal == causal


@pytest.mark.parametrize(
    "mask",
    [
        True,
        [1, 0],  # [seq_k]
        [[True, False], [True, True]],  # [seq_q, seq_k]
        [[1, 0], [1, 1]],
        [[True, False]],  # [1, seq_k]
        [[[1, 1]]],  # [heads, 1, seq_k]
        [[[[1, 0], [1, 1]]]],  # [batch, heads, seq_q, seq_k]
    ],
)
def test_mask_forms(mask: Any) -> None:
    inp = validate(direct(mask=mask), SRC)
    assert inp.mask is not None and inp.mask.dtype == np.bool_
    assert np.broadcast_to(inp.mask, (1, 1, 2, 2)).shape == (1, 1, 2, 2)


def test_mask_values() -> None:
    inp = validate(direct(mask=[[1, 0], [True, False]]), SRC)
    assert inp.mask is not None
    assert inp.mask.tolist() == [[True, False], [True, False]]  # True/1 = may attend


def test_mask_broadcasts_over_batch_and_heads() -> None:
    qkv = np.ones((2, 3, 4)).tolist()  # batch 2, seq 3, heads 2 * d 2
    fixture = {"Q": qkv, "K": qkv, "V": qkv, "heads": 2}
    for shape in [(2, 1, 1, 3), (2, 2, 3, 3), (1, 2, 1, 3), (3,), (3, 3), (2, 3, 3)]:
        inp = validate({**fixture, "mask": np.ones(shape, dtype=bool).tolist()}, SRC)
        assert inp.mask is not None and inp.mask.shape == shape
    for shape in [(3, 1, 3, 3), (2, 2, 2, 3, 3), (4,), (2, 3)]:
        with pytest.raises(InputError, match="mask"):
            validate({**fixture, "mask": np.ones(shape, dtype=bool).tolist()}, SRC)


def test_bias_minus_inf_in_json_and_yaml() -> None:
    want = [[0.0, -np.inf], [0.5, 0.0]]
    for text, fmt in [
        (json.dumps(direct(bias=[[0, "-inf"], [0.5, 0]])), "json"),
        (yaml_text("bias: [[0, -.inf], [0.5, 0]]\n"), "yaml"),
        (yaml_text('bias: [[0, "-inf"], [0.5, 0]]\n'), "yaml"),
        (yaml_text("bias: [[0, -inf], [0.5, 0]]\n"), "yaml"),  # a plain string in YAML 1.1
        (yaml_text("bias: [[0, -.Inf], [0.5, 0]]\n"), "yaml"),
    ]:
        inp = parse_fixture(text, SRC, fmt=fmt)  # type: ignore[arg-type]
        assert inp.bias is not None and inp.bias.dtype == np.float64
        assert inp.bias.tolist() == want


def test_bias_scalar_and_broadcast() -> None:
    inp = validate(direct(bias=0.5), SRC)
    assert inp.bias is not None and inp.bias.shape == ()
    inp = validate(direct(bias=[0, "-inf"]), SRC)
    assert inp.bias is not None and inp.bias.tolist() == [0, -np.inf]


def test_lengths() -> None:
    inp = validate(direct3(lengths=[2, 0]), SRC)
    assert inp.lengths is not None and inp.lengths.tolist() == [2, 0]
    assert inp.lengths.dtype == np.int64
    assert validate(direct(lengths=[1]), SRC).lengths.tolist() == [1]  # type: ignore[union-attr]
    assert validate(direct(lengths=2), SRC).lengths.tolist() == [2]  # type: ignore[union-attr]


def test_causal_mask_bias_lengths_together() -> None:
    inp = validate(
        direct3(causal="lower-right", mask=[1, 1], bias=[0, "-inf"], lengths=[1, 2]), SRC
    )
    assert inp.causal == "lower-right"
    assert inp.mask is not None and inp.bias is not None and inp.lengths is not None


def test_expected() -> None:
    inp = validate(
        direct(
            expected={
                "softmax": [[1, 0], [0.5, 0.5]],
                "masked": [[0, "-inf"], ["nan", "inf"]],
                "output": None,
            }
        ),
        SRC,
    )
    assert set(inp.expected) == {"softmax", "masked"}
    np.testing.assert_array_equal(inp.expected["masked"], [[0, -np.inf], [np.nan, np.inf]])
    assert inp.expected["softmax"].dtype == np.float64


def test_null_means_omitted() -> None:
    nulls = dict.fromkeys(
        [
            "name",
            "description",
            "tokens",
            "key_tokens",
            "heads",
            "kv_heads",
            "W_O",
            "b_O",
            "scale",
            "causal",
            "mask",
            "bias",
            "lengths",
            "expected",
            "b_Q",
            "X",
        ]
    )
    inp = validate(direct(**nulls), SRC)
    assert (inp.mode, inp.name, inp.tokens, inp.heads, inp.scale, inp.causal) == (
        "direct",
        "",
        None,
        1,
        None,
        None,
    )
    assert inp.W_O is None and inp.mask is None and inp.bias is None and inp.lengths is None
    yaml_nulls = yaml_text("scale: null\ncausal: ~\nmask:\nW_O: null\nb_O: null\n")
    assert parse_fixture(yaml_nulls, SRC).scale is None


def test_numbers_in_yaml() -> None:
    inp = parse_fixture(
        "Q: [[1e-3, 1.5e+2, -2E1, .5]]\nK: [[1, 1, 1, 1]]\nV: [[1]]\nscale: 1e-1\n", SRC
    )
    assert inp.Q is not None and inp.Q[0, 0, 0].tolist() == [1e-3, 150.0, -20.0, 0.5]
    assert inp.scale == 0.1


def test_yaml_alias_still_works() -> None:
    text = "W_Q: &w [[1, 0], [0, 1]]\nW_K: *w\nW_V: *w\nX: [[1, 2]]\n"
    inp = parse_fixture(text, SRC)
    assert inp.W_K is not None and inp.W_K.tolist() == [[1, 0], [0, 1]]


def test_int_digits_limit_is_inclusive() -> None:
    big = "9" * 300
    assert parse_fixture(yaml_text(f"scale: {big}\n"), SRC).scale == float(big)
    assert parse_fixture(json.dumps(direct()).replace("1", big, 1), SRC, fmt="json").Q is not None


# ---------------------------------------------------------------------------------------------
# Formats, detection, encodings and files


def test_detection_without_format() -> None:
    as_json = json.dumps(direct(name="j"))
    assert parse_fixture(as_json, SRC).name == "j"  # JSON is detected
    assert parse_fixture("  \n" + as_json, SRC).name == "j"
    flow = "{Q: [[1]], K: [[1]], V: [[1]], name: flow}"  # YAML in flow style starts with "{" too
    assert parse_fixture(flow, SRC).name == "flow"
    assert parse_fixture(yaml_text("name: y\n"), SRC).name == "y"
    # a broken JSON document is reported as JSON
    assert_message(message('{"Q": [[1]],, }'), "line 1 column 13", "invalid JSON")


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", json.dumps(direct(name="x"))),
        (".JSON", json.dumps(direct(name="x"))),
        (".yaml", yaml_text("name: x\n")),
        (".yml", yaml_text("name: x\n")),
        (".yaml", json.dumps(direct(name="x"))),  # JSON is YAML
        (".txt", yaml_text("name: x\n")),  # any other name: detected
        ("", json.dumps(direct(name="x"))),
    ],
)
def test_load_fixture_by_suffix(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"fix{suffix}"
    path.write_text(text, encoding="utf-8")
    inp = load_fixture(path)
    assert (inp.name, inp.source) == ("x", str(path))
    assert load_fixture(str(path)).name == "x"


def test_yaml_in_a_json_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "fix.json"
    path.write_text(yaml_text(""), encoding="utf-8")
    with pytest.raises(InputError, match=r"fix\.json: line 1 column 1: invalid JSON"):
        load_fixture(path)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_utf8_bom_accepted(fmt: str) -> None:
    text = json.dumps(direct(name="é")) if fmt == "json" else yaml_text("name: é\n")
    data = b"\xef\xbb\xbf" + text.encode("utf-8")
    assert parse_fixture(data, SRC, fmt=fmt).name == "é"  # type: ignore[arg-type]
    assert parse_fixture(data, SRC).name == "é"
    assert parse_fixture("\ufeff" + text, SRC, fmt=fmt).name == "é"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (yaml_text("").encode("utf-16"), "the file is UTF-16 encoded, expected UTF-8 text"),
        (yaml_text("").encode("utf-16-be"), "looks UTF-16 encoded (a NUL byte beside every"),
        (b"name: x\n\x00\x01", "binary (it holds NUL bytes, the first at offset 8)"),
        (yaml_text("").encode("utf-32"), "expected UTF-8 text"),
        (b"name: \xff\n", "byte 0xff at offset 6 is not UTF-8, expected UTF-8 text"),
        (b"\xef\xbb\xbf", "the file is empty"),
        (b"", "the file is empty"),
    ],
)
def test_encodings_refused(data: bytes, fragment: str) -> None:
    assert_message(message(data), "", fragment)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_bytes(b"")
    with pytest.raises(InputError) as info:
        load_fixture(path)
    assert (
        str(info.value)
        == f"{path}: the file is empty, expected a JSON or YAML mapping of fixture keys"
    )


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_fixture(tmp_path)
    assert (
        str(info.value)
        == f"{tmp_path}: is a directory, expected a .json, .yaml or .yml fixture file"
    )


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InputError) as info:
        load_fixture(path)
    assert str(info.value) == f"{path}: no such file, expected a .json, .yaml or .yml fixture file"


def test_file_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "fix.json"
    path.write_text(json.dumps(direct()), encoding="utf-8")
    size = path.stat().st_size
    assert load_fixture(path, max_bytes=size).seq_q == 2
    with pytest.raises(InputError) as info:
        load_fixture(path, max_bytes=size - 1)
    assert str(info.value) == f"{path}: file is {size:,} bytes, expected at most {size - 1:,} bytes"


def test_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(yaml_text("causual: true\n"), encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_fixture(path)
    assert str(info.value).startswith(f"{path}: causual: unknown key (did you mean 'causal'?)")
    assert (info.value.source, info.value.field) == (str(path), "causual")


@pytest.mark.parametrize("text", [json.dumps(direct(name="in")), yaml_text("name: in\n")])
def test_stdin_is_detected(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    inp = load_fixture("-")
    assert (inp.name, inp.source) == ("in", "<stdin>")


def test_stdin_errors_name_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"scale: 1\n")))
    with pytest.raises(InputError, match=r"^<stdin>: no inputs, expected X with W_Q"):
        load_fixture("-")


def test_validate_takes_numpy_arrays_from_python() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 3, 4))  # (batch, seq, d_model)
    W = rng.standard_normal((4, 4))
    inp = validate(
        {
            "X": X,
            "W_Q": W,
            "W_K": W,
            "W_V": W,
            "heads": np.int64(2),
            "scale": np.float64(0.5),
            "mask": np.tril(np.ones((3, 3), dtype=bool)),
            "lengths": np.array([3, 2]),
            "expected": {"X": X},
        },
        SRC,
    )
    assert inp.X is not None
    np.testing.assert_array_equal(inp.X, X)
    assert (inp.heads, inp.scale, inp.d_k) == (2, 0.5, 2)
    assert inp.lengths is not None and inp.lengths.tolist() == [3, 2]
    np.testing.assert_array_equal(inp.expected["X"], X)
    bad = {"X": X, "W_Q": W, "W_K": W, "W_V": np.full((4, 4), np.nan)}
    assert_message(message(bad), "W_V[0][0]", "expected a finite number")
    assert_message(message(direct(mask=np.ones((2, 2)))), "mask[0][0]", "got the number 1.0")


# ---------------------------------------------------------------------------------------------
# docs/fixture-format.md: its complete examples load, and the JSON one's numbers are right

DOC = DOCS / "fixture-format.md"


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)


def test_doc_yaml_example_is_the_bundled_fixture() -> None:
    (block,) = doc_blocks("yaml")
    bundled = DOC.parent.parent / "fixtures" / "the_cat_sat.yaml"
    assert block == bundled.read_text(encoding="utf-8")


def test_doc_json_example_worked_by_hand() -> None:
    (block,) = doc_blocks("json")
    inp = parse_fixture(block, "doc.json", fmt="json")
    assert (inp.mode, inp.seq_q, inp.seq_k, inp.causal, inp.scale) == (
        "direct",
        2,
        3,
        "lower-right",
        1.0,
    )
    assert inp.key_tokens == ("The", "cat", "sat")
    w = np.e / (np.e + 1)  # softmax of the two scores 1 and 0 left in each row
    softmax = [[[w, 1 - w, 0], [1 - w, 0, w]]]  # (heads, seq_q, seq_k)
    np.testing.assert_allclose(inp.expected["softmax"], softmax, rtol=1e-15)
    np.testing.assert_allclose(inp.expected["output"], [[[w, 1 - w], [1, w]]], rtol=1e-15)
    trace = run(inp)  # and attn agrees with the page
    for stage, want in inp.expected.items():
        np.testing.assert_allclose(trace[stage].data, want, rtol=1e-12, atol=1e-15)
