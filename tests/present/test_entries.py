"""The derivations of Q, K, V, concat and projected entries (present/entries.py, issue 26),
without a browser: for every bundled example, each entry's terms are the products of its X (or
X_kv, or concat) row and weight column as a loop here makes them from the fixture, and they add
up to the trace's value; an entry that is not X·W (given Q, K, V; MLA's latent) has none."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from attn_cli.api import trace_file
from attn_cli.core.pipeline import Trace
from attn_cli.io.examples import example_paths
from attn_cli.present.entries import ENTRY_STAGES, entry_text

EXAMPLES = sorted(example_paths())
NUMBER = r"\(?−?\d+(?:\.\d+)?\)?"


def number(text: str) -> float:
    return float(text.strip("()").replace("−", "-"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_entry_adds_up(name: str) -> None:
    trace = trace_file(name)
    inp = trace.inputs
    for stage in (s for s in ENTRY_STAGES if s in trace):
        data = np.asarray(trace[stage].data)
        for at in list(np.ndindex(*data.shape))[:: max(1, data.size // 40)]:  # ~40 a stage
            part = entry_text(trace, stage, at, "en", precision=6)
            if part is None:
                assert stage != "concat", (name, at)  # a column of one head, always
                clamped = stage == "V" and abs(data[at]) == inp.setting("clip_qkv")  # not X·W
                assert (
                    stage == "projected"
                    or inp.W_Q is None
                    or name in {"deepseek_mla", "gated_deltanet"}
                    or clamped
                ), (name, stage, at)
                continue
            line = part.lines[-1]
            assert re.search(rf"= {NUMBER}$", line), line
            total = number(line.rsplit("= ", 1)[1])
            assert math.isclose(total, float(data[at]), abs_tol=1e-6), (line, data[at])
            if stage in ("Q", "K", "V", "projected"):
                check_terms(trace, stage, at, line)


def check_terms(trace: Trace, stage: str, at: tuple[int, ...], line: str) -> None:
    """Each shown product x×w is the source row's and weight column's (a loop here)."""
    inp = trace.inputs
    axes = dict(zip(trace[stage].axes, at, strict=True))
    if stage == "projected":
        row = np.asarray(trace["concat"].data)[tuple(at[:-1])]
        W, col = np.asarray(inp.W_O), at[-1]
    else:
        t = axes["query" if stage == "Q" else "key"]
        h = axes["head" if stage == "Q" else "kv_head"]
        source = inp.X if stage == "Q" or inp.X_kv is None else inp.X_kv
        X = np.asarray(source)
        row = X[axes.get("batch", 0), t] if X.ndim == 3 else X[t]
        W = np.asarray(getattr(inp, f"W_{stage}"))
        col = h * trace[stage].shape[-1] + at[-1]
    products = re.findall(rf"({NUMBER})×({NUMBER})", line)
    shown = min(len(row), 6)  # long sums show their first six terms and the last two
    assert len(products) >= shown, line
    for i, (x, w) in enumerate(products[:shown]):
        assert math.isclose(number(x), float(row[i]), abs_tol=5e-7), (i, x, row[i])
        assert math.isclose(number(w), float(W[i, col]), abs_tol=5e-7), (i, w, W[i, col])


def test_chinese_has_no_english_words() -> None:
    trace = trace_file("causal_multihead")
    for stage, at in (("Q", (1, 2, 0)), ("concat", (2, 3)), ("projected", (2, 1))):
        en = entry_text(trace, stage, at, "en")
        zh = entry_text(trace, stage, at, "zh")
        assert en is not None and zh is not None
        text = " ".join((zh.title, *zh.lines))
        assert not re.search(r"\b(the|row|column|times|where|comes|from|head|plus)\b", text), text
        assert "的来历" in zh.title and en.lines[-1] == zh.lines[-1].replace("头", "head")
