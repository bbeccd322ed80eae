"""Plain-text helpers shared by every renderer and exporter: numbers and safe token text."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attn_cli.errors import printable

if TYPE_CHECKING:
    from attn_cli.core.pipeline import Trace


ELLIPSIS = "…"
# An axis longer than LIMIT shows its first and last EDGE entries, as NumPy summarises arrays
# (edgeitems=3). Every renderer and exporter elides the same way.
ROW_LIMIT, ROW_EDGE = 12, 3
COL_LIMIT, COL_EDGE = 10, 3
TABLE_LIMIT, TABLE_EDGE = 16, 3  # tables (batch items x heads) per stage


def pick(n: int, limit: int, edge: int, full: bool) -> list[int | None]:
    """Indices to show along one axis; None marks the ellipsis."""
    if full or n <= limit:
        return list(range(n))
    return [*range(edge), None, *range(n - edge, n)]


def axis_labels(trace: Trace, axis: str, n: int) -> tuple[str, ...]:
    """Tokens for the query and key axes, indices for the feature axes."""
    if axis in ("query", "seq"):
        return trace.query_labels
    if axis == "key":
        return trace.key_labels
    return tuple(str(i) for i in range(n))


def safe(text: str) -> str:
    """Input text as printable characters only: no escape sequences reach the terminal."""
    return printable(text)


def format_number(x: float, precision: int) -> str:
    """Fixed-point with ``precision`` digits; never ``-0.0000``; infinities spelled out."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    s = f"{x:.{precision}f}"
    if s.startswith("-") and not s.strip("-0.").strip():
        s = s[1:]
    return s


def short_number(x: float, precision: int) -> str:
    """A whole number without decimals (``8``), else ``format_number``; −∞ as a symbol."""
    if math.isinf(x):
        return "−∞" if x < 0 else "∞"
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return format_number(x, precision)


def factor(x: float, precision: int) -> str:
    """A number as a factor in a product: negative ones in parentheses, ``2×(-1)``."""
    s = short_number(x, precision)
    return f"({s})" if s.startswith(("-", "−")) else s


def header_lines(trace: Trace) -> list[tuple[str, str]]:
    """The configuration as (key, text) lines: shapes, heads, scale and masking semantics."""
    inp = trace.inputs
    lines: list[tuple[str, str]] = []
    if inp.description:
        lines.append(("about", inp.description))
    lines.append(("source", inp.source))
    if inp.mode == "projection":
        lines.append(("mode", "projection: Q = X·W_Q (X @ W; a torch nn.Linear weight is Wᵀ)"))
    else:
        lines.append(("mode", "direct: Q, K, V given"))
    dims = [f"batch {inp.batch}" if inp.has_batch else "no batch axis"]
    dims.append(f"seq_q {inp.seq_q}" if inp.seq_q != inp.seq_k else f"seq {inp.seq_q}")
    if inp.seq_q != inp.seq_k:
        dims.append(f"seq_k {inp.seq_k}")
    if inp.d_model is not None:
        dims.append(f"d_model {inp.d_model}")
    dims.append(f"d_k {inp.d_k}")
    dims.append(f"d_v {inp.d_v}")
    if inp.d_out is not None:
        dims.append(f"d_out {inp.d_out}")
    lines.append(("shapes", ", ".join(dims)))
    heads = f"{inp.heads}"
    if inp.kv_heads != inp.heads:
        heads += (
            f" query heads, {inp.kv_heads} key/value heads (grouped-query: head h reads "
            f"kv head h // {inp.heads // inp.kv_heads})"
        )
    lines.append(("heads", heads))
    default = 1 / math.sqrt(inp.d_k)
    if trace.scale_source == "default":
        scale = f"{trace.scale:.6g} = 1/√d_k (default, as torch SDPA)"
    else:
        scale = f"{trace.scale:.6g} (from the fixture; 1/√d_k would be {default:.6g})"
        if trace.scale == 1:
            scale += ", unscaled as in the source article"
    lines.append(("scale", scale))
    masking: list[str] = []
    if inp.causal == "upper-left":
        masking.append("causal upper-left: query i sees keys j ≤ i (torch is_causal=True)")
    elif inp.causal == "lower-right":
        masking.append("causal lower-right: query i sees keys j ≤ i + seq_k − seq_q (KV cache)")
    if inp.mask is not None:
        masking.append(
            "mask: true = may attend (torch SDPA's convention; nn.MultiheadAttention's is the "
            "opposite)"
        )
    if inp.bias is not None:
        masking.append("bias: added to the scaled scores (−∞ blocks a key)")
    if inp.lengths is not None:
        masking.append(
            f"lengths {[int(n) for n in inp.lengths]}: keys past each length are padding"
        )
    if len(masking) > 1:
        masking.append(
            "these combine (torch SDPA refuses attn_mask with is_causal; attn allows it)"
        )
    for i, text in enumerate(masking):
        lines.append(("masking" if i == 0 else "", text))
    if trace.empty_rows:
        lines.append(("note", "rows with nothing to attend to get all-zero weights (torch ≥ 2.5)"))

    return lines
