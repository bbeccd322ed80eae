"""Fixture loader: a JSON, YAML or .npz file in, validated :class:`Inputs` out.

Everything a user can get wrong is caught here and raised as :class:`InputError` naming the
file, the field and what was expected. Past this module there are no loose dicts, only arrays
of known shape. Array layouts after loading (``B`` is 1 when the fixture has no batch axis):

- projection mode: ``X`` (B, seq, d_model), ``W_Q`` (d_model, heads*d_k), ``W_K`` (d_model,
  kv_heads*d_k), ``W_V`` (d_model, kv_heads*d_v), biases as vectors;
- direct mode: ``Q`` (B, heads, seq_q, d_k), ``K`` (B, kv_heads, seq_k, d_k), ``V`` (B, kv_heads,
  seq_k, d_v), whatever layout the file used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from attn_cli.core.inputs import Inputs
from attn_cli.core.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_ELEMENTS
from attn_cli.errors import InputError
from attn_cli.io import gate
from attn_cli.io.arrays import has_references, load_npz_fixture, resolve_references
from attn_cli.io.text import decode_text
from attn_cli.io.validate import KNOWN_KEYS, validate

__all__ = ["KNOWN_KEYS", "load_fixture", "parse_fixture", "validate"]


# ---------------------------------------------------------------------------------------------
# Reading and parsing


def load_fixture(
    path: str | os.PathLike[str],
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Inputs:
    """Read, parse and validate the fixture file at ``path`` (``-`` reads standard input)."""
    source = os.fspath(path)
    if source == "-":
        data, source, fmt = gate.read_stdin(max_bytes, "a fixture piped in"), "<stdin>", None
        base = Path.cwd()  # {file: ...} references are relative to the current folder
    elif Path(source).suffix.lower() == ".npz":  # a whole fixture as NumPy arrays
        obj = load_npz_fixture(Path(source), source, max_elements=max_elements, max_bytes=max_bytes)
        return validate(obj, source, max_elements=max_elements)
    else:
        data, fmt = _read_file(Path(source), source, max_bytes), _format_from_suffix(source)
        base = Path(source).resolve().parent  # references are relative to the fixture
    return parse_fixture(
        data, source, fmt=fmt, max_elements=max_elements, base=base, max_bytes=max_bytes
    )


def parse_fixture(
    data: bytes | str,
    source: str,
    *,
    fmt: Literal["json", "yaml"] | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    base: Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Inputs:
    """Parse fixture text (``fmt`` None: detect JSON or YAML) and validate it.

    ``{file: ...}`` references are read from ``base`` (default: the current folder).
    """
    from attn_cli.io.jsonfmt import JSONSyntaxError, parse_json  # each parser where it is needed
    from attn_cli.io.yamlfmt import parse_yaml

    text = decode_text(data, source) if isinstance(data, bytes) else data.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(source, "", "the file is empty", "a JSON or YAML mapping of fixture keys")
    if fmt == "json":
        obj = parse_json(text, source)
    elif fmt == "yaml" or not text.lstrip().startswith("{"):
        obj = parse_yaml(text, source, max_elements)
    else:  # detect: JSON, unless it is YAML in flow style ({X: [[1]]} starts with "{" too)
        try:
            obj = parse_json(text, source)
        except JSONSyntaxError as json_error:
            try:
                obj = parse_yaml(text, source, max_elements)
            except InputError:
                raise json_error from None
    if has_references(obj):
        obj = resolve_references(
            obj, source, base or Path.cwd(), max_elements=max_elements, max_bytes=max_bytes
        )
    return validate(obj, source, max_elements=max_elements)


def _format_from_suffix(source: str) -> Literal["json", "yaml"] | None:
    suffix = Path(source).suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    return None


_A_FIXTURE_FILE = "a .json, .yaml or .yml fixture file"


def _read_file(path: Path, source: str, max_bytes: int) -> bytes:
    """The bytes of a fixture file, through the input gate."""
    hint = " (to pipe a fixture in, use: attn trace - < FILE)"
    return gate.read_bytes(path, source, _A_FIXTURE_FILE, max_bytes=max_bytes, special_hint=hint)
