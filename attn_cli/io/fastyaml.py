"""Fast YAML loading: rows of plain numbers are read without PyYAML's per-number work.

PyYAML makes several Python objects per scalar and runs its resolver regexes on each, so a
2048 × 512 matrix takes seconds. Most big fixtures write their matrices as flow rows
(``- [0.12, -3.4, ...]``, what ``yaml.dump`` writes). This module reads each such row directly
and hands PyYAML the document with every row replaced by a tagged placeholder: the same safe
loader (duplicate keys, sizes, everything else) then composes a document of a few thousand nodes.

It is exact or it steps aside. A row is taken only if every item is a number that the loader
would read as the same int or float (no octal ``010``, no ``-.5``, which YAML 1.1 reads as a
string, no ``.inf``, no ``_``). The document is taken only if it has no anchors or aliases and
every placeholder came back as a value, not inside a string or a comment. Otherwise, or on any
error, the caller parses the original text the normal way (which also gives the right message).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

TAG = "!attn-row"
MIN_CHARS = 100_000  # smaller documents go the normal way: they are quick anyway

_ROW = re.compile(r"\[([^\[\]]*)\]")  # a flow sequence holding no other sequence
_NOT_NUMERIC = re.compile(r"[^0-9eE.+\-, \n\r]")
_NO_POINT_ITEM = re.compile(r",[^.eE,]*(?:,|$)")  # an item without . e E: an int (or empty)
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]{0,299})")  # what YAML reads as a decimal int


class NotFast(Exception):
    """This document is not for the fast path; parse it the normal way."""


def parse(text: str, loader_class: Any, check_size: Callable[[Any], None]) -> Any:
    """The document, parsed with ``loader_class`` and its numeric rows read directly.

    ``check_size(node)`` runs on the composed document before it is constructed. Raises
    :class:`NotFast` when the fast path does not apply or cannot be sure of the result.
    """
    if len(text) < MIN_CHARS or "&" in text or "*" in text or TAG in text:
        raise NotFast  # anchors and aliases would need sizing through placeholders
    rows: list[list[Any]] = []
    pieces: list[str] = []
    end = 0
    for match in _ROW.finditer(text):
        row = _numbers(match.group(1))
        if row is None:
            continue
        pieces += (text[end : match.start()], f"{TAG} {len(rows)}")
        rows.append(row)
        end = match.end()
    if not rows:
        raise NotFast
    pieces.append(text[end:])
    used: set[int] = set()

    def construct_row(loader: Any, node: Any) -> list[Any]:
        i = int(node.value)
        used.add(i)
        return rows[i]

    class Loader(loader_class):  # type: ignore[misc]
        pass

    Loader.add_constructor(TAG, construct_row)
    loader = Loader("".join(pieces))
    try:
        node = loader.get_single_node()
        if node is None:
            raise NotFast
        check_size(node)
        document = loader.construct_document(node)
    except NotFast:
        raise
    except Exception:  # any complaint: the normal path names it against the original text
        raise NotFast from None
    finally:
        loader.dispose()
    if len(used) != len(rows):  # a placeholder ended up in a string or a comment
        raise NotFast
    return document


def _numbers(items: str) -> list[Any] | None:
    """The numbers of a flow row, as the safe loader would read them; None if unsure."""
    if not items.strip() or _NOT_NUMERIC.search(items):
        return None
    if "-." in items or "+." in items:  # "-.5" is a string to YAML 1.1: leave such rows alone
        return None
    parts = items.split(",")
    if _NO_POINT_ITEM.search("," + items) is None:  # floats only: the common case, in one go
        try:
            return list(map(float, parts))
        except ValueError:  # "1.2.3", "e5", an empty item
            return None
    out: list[Any] = []
    for part in parts:
        item = part.strip(" \r\n")
        if _INT.fullmatch(item):
            out.append(int(item))
            continue
        if not any(c in item for c in ".eE"):
            return None  # 010 is octal to YAML 1.1; leave it to the loader
        try:
            out.append(float(item))
        except ValueError:
            return None
    return out
