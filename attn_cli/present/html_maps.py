"""The derivations of a differential-attention decode page's own cells (html_steps.py's decode
page draws them): the second map's rows over the cache (``scores_2``, ``softmax_2``), the
difference ``diff`` = softmax − λ·softmax_2, λ, ``diff_output`` = Σ diff × V_cache, the norm
and ``diff_scaled``.

A worked line is given only where recomputing it from the step's numbers (and, for scores_2,
the trace's Q and K, whose second halves the second map reads) gives the cell's value within
1e-9; otherwise the derivation says what the cell is (the stage's formula), never a formula
that does not give its value. ``p`` is html_steps.py's page in the making (its ``n``, ``f``,
``options``, ``trace`` and ``run``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attn_cli.present.explain_registry import sum_terms
from attn_cli.present.i18n import Lang

MAP_ROWS = ("scores_2", "softmax_2", "diff")  # rows over the cache's slots, with the first map's
MAP_OUTS = ("lambda", "diff_output", "diff_norm", "diff_scaled")  # a row per head

WORDS: dict[Lang, dict[str, str]] = {
    "en": {
        "what": "{formula} (this number is taken as the decode step computed it)",
        "qk": "q₂ = Q[head {h}, {token}][d_k/2:], k₂ = K[kv head {g}, slot {s}: {held}][d_k/2:] "
        "(the second halves; the JSON's Q and K_cache are the first map's halves)",
        "dot": "scores_2 = q₂·k₂ = {terms} = {value}",
        "row": "softmax_2 over the slots of x = scores_2 × scale (the first map's mask): m = {m}",
        "exp": "Σ e^(x − m) = {total}; weight of slot {s} = e^({x} − {m}) / {total} = {value}",
        "shut": "softmax_2 = 0: the first map does not attend this slot either",
        "diff": "diff = softmax − λ·softmax_2 = {a} − {lam}×{b} = {value}",
        "out": "diff_output[head {h}, {j}] = Σ diff × V_cache[slot, {j}] over the slots "
        "= {terms} = {value}",
        "scaled": "diff_scaled = diff_norm × (1 − λ_init) = {a} × (1 − λ_init) = {value}",
    },
    "zh": {
        "what": "{formula}（这个数取自解码这一步的计算）",
        "qk": "q₂ = Q[头 {h}, {token}][d_k/2:]，k₂ = K[kv 头 {g}, 槽 {s}：{held}][d_k/2:]"
        "（后一半；JSON 中的 Q 和 K_cache 是第一张图的前一半）",
        "dot": "scores_2 = q₂·k₂ = {terms} = {value}",
        "row": "对缓存各槽的 x = scores_2 × scale（与第一张图相同的遮盖）做 softmax_2：m = {m}",
        "exp": "Σ e^(x − m) = {total}；槽 {s} 的权重 = e^({x} − {m}) / {total} = {value}",
        "shut": "softmax_2 = 0：第一张图也不看这个槽",
        "diff": "diff = softmax − λ·softmax_2 = {a} − {lam}×{b} = {value}",
        "out": "diff_output[头 {h}, {j}] = Σ diff × V_cache[槽, {j}]，对各槽求和 "
        "= {terms} = {value}",
        "scaled": "diff_scaled = diff_norm × (1 − λ_init) = {a} × (1 − λ_init) = {value}",
    },
}


def _m(lang: Lang, key: str, **values: Any) -> str:
    return WORDS[lang][key].format(**values)


def _close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def map_part(
    p: Any,
    k: int,
    st: dict[str, Any],
    name: str,
    lead: tuple[int, ...],
    index: tuple[int, ...],
    lang: Lang,
) -> dict[str, Any] | None:
    """The derivation of a differential cell (``st``: the step's stages, batch axis first;
    ``index``: (head, 0, slot or column)), None for a name not of these."""
    if name not in MAP_ROWS and name not in MAP_OUTS:
        return None
    b = lead[0] if lead else 0
    value = float(st[name][b][index])
    at = f"{name}[{', '.join(map(str, (*lead, *index)))}]"
    lines = _worked(p, k, st, name, b, index, value, lang)
    if lines is None:
        from attn_cli.core.stages import SPECS

        formula = SPECS[name].formula(p.trace.inputs) if name in SPECS else name
        lines = [_m(lang, "what", formula=formula), f"= {p.n(value)}"]
    return {"title": at, "lines": lines, "header": [], "rows": [], "footer": []}


def _worked(
    p: Any,
    k: int,
    st: dict[str, Any],
    name: str,
    b: int,
    index: tuple[int, ...],
    value: float,
    lang: Lang,
) -> list[str] | None:
    h, _, c = index
    n, f, full = p.n, p.f, p.options.full
    got: float | None = None
    lines: list[str] = []
    if name == "scores_2":
        return _scores_2(p, k, b, h, c, value, lang)
    if name == "softmax_2" and {"scores_2", "masked"} <= set(st):
        return _softmax_2(p, st, b, h, c, value, lang)
    if name == "diff" and {"softmax", "softmax_2", "lambda"} <= set(st):
        a, lam, s2 = (
            float(st[x][b, h, 0, i]) for x, i in (("softmax", c), ("lambda", 0), ("softmax_2", c))
        )
        got = a - lam * s2
        lines = [_m(lang, "diff", a=n(a), lam=n(lam), b=f(s2), value=n(value))]
    elif name == "diff_output" and {"diff", "V_cache", "Q"} <= set(st):
        V = st["V_cache"][b]  # (Hkv, C, Dv)
        g = h // max(1, st["Q"].shape[1] // V.shape[0])
        w, v = st["diff"][b, h, 0], V[g, :, c]
        got = math.fsum(float(x) * float(y) for x, y in zip(w, v, strict=True))
        terms = sum_terms([f"{f(x)}×{f(y)}" for x, y in zip(w, v, strict=True)], full)
        lines = [_m(lang, "out", h=h, j=c, terms=terms, value=n(value))]
    elif name == "diff_scaled" and "diff_norm" in st:
        a = float(st["diff_norm"][b, h, 0, c])
        from attn_cli.core.stages import SPECS

        formula = SPECS[name].formula(p.trace.inputs) if name in SPECS else name
        return [formula, _m(lang, "scaled", a=f(a), value=n(value))]
    if got is None or not _close(got, value):
        return None
    return lines


def _scores_2(p: Any, k: int, b: int, h: int, s: int, value: float, lang: Lang) -> list[str] | None:
    """q₂·k₂ from the trace's Q and K rows (their second halves), when they give the cell."""
    from attn_cli.check.runs import internal

    trace = p.trace
    if "Q" not in trace or "K" not in trace:
        return None
    step = p.run.result.steps[k]
    at = int(step.cache_positions[s])
    pos_of = {int(x): i for i, x in enumerate(trace.inputs.token_positions()[0])}
    if at not in pos_of:
        return None
    Q, K = internal(trace, "Q"), internal(trace, "K")
    half = Q.shape[-1] // 2
    g = h // max(1, Q.shape[1] // K.shape[1])
    q, kk = Q[b, h, step.index, half:], K[b, g, pos_of[at], half:]
    got = math.fsum(float(x) * float(y) for x, y in zip(q, kk, strict=True))
    if not _close(got, value):
        return None
    terms = sum_terms([f"{p.f(x)}×{p.f(y)}" for x, y in zip(q, kk, strict=True)], p.options.full)
    from attn_cli.present.text import safe

    token = f"{safe(p.run.label(step.index))}@{step.position}"
    held = f"{safe(p.run.label(pos_of[at]))}@{at}"
    return [
        _m(lang, "qk", h=h, token=token, g=g, s=s, held=held),
        _m(lang, "dot", terms=terms, value=p.n(value)),
    ]


def _softmax_2(
    p: Any, st: dict[str, Any], b: int, h: int, s: int, value: float, lang: Lang
) -> list[str] | None:
    """The second map's weight as exp(x − m)/Σ over the slots, x = scores_2 × scale where the
    first map may attend; only when the whole row recomputes to softmax_2."""
    open_ = np.isfinite(np.asarray(st["masked"][b, h, 0], dtype=float))
    x = np.where(open_, np.asarray(st["scores_2"][b, h, 0], dtype=float) * p.trace.scale, -np.inf)
    if not open_.any():
        return None
    m = float(x[open_].max())
    e = np.where(open_, np.exp(x - m), 0.0)
    total = math.fsum(float(t) for t in e)
    row = st["softmax_2"][b, h, 0]
    if not all(_close(float(w), float(y)) for w, y in zip(e / total, row, strict=True)):
        return None
    if not open_[s]:
        return [_m(lang, "shut")]
    n = p.n
    return [
        _m(lang, "row", m=n(m)),
        _m(lang, "exp", total=n(total), s=s, x=n(x[s]), m=p.f(m), value=n(value)),
    ]
