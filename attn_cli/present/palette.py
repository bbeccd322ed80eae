"""Heatmap colours: viridis in true colour, and stepped palettes for 256- and 16-colour terminals.

Viridis is perceptually ordered and readable with colour-blindness and in grey. A terminal
without true colour (tmux without COLORTERM, many SSH sessions) gets Rich's nearest colour, and
there most of viridis' dark half collapses into one (0.14, 0.16, 0.17, 0.30 and 0.32 all become
xterm colour 60). There the scale is cut into ten steps of 0.1, each a colour the terminal has:
two values 0.1 or more apart never share a colour in 256 colours, and neighbouring steps differ
in 16 colours.
"""

from __future__ import annotations

import math

from rich.style import Style

# viridis at 0, 0.1, ..., 1 (matplotlib's colormap, as sampled by R's viridisLite)
VIRIDIS = (
    "#440154",
    "#482576",
    "#414487",
    "#35608d",
    "#2a788e",
    "#21908c",
    "#22a884",
    "#43bf71",
    "#7ad151",
    "#bbdf27",
    "#fde725",
)
STEPS = 10  # the stepped palettes cut [0, 1] into tenths

# xterm-256 colours along viridis, one per tenth, their lightness rising (purple, violet, blue,
# teal, sea green, greens, olive, yellow); the 6x6x6 cube has no finer dark blues than these.
PALETTE_256 = (53, 55, 25, 30, 36, 72, 77, 149, 184, 226)
# From colour 30 (relative luminance 0.19) on, black text reads better than white.
_LIGHT_FROM = 3
# The 16 standard colours in the same order; neighbours always differ.
PALETTE_16 = (
    "magenta",
    "blue",
    "bright_blue",
    "cyan",
    "bright_cyan",
    "green",
    "bright_green",
    "yellow",
    "bright_yellow",
    "bright_white",
)
_DARK_16 = frozenset({"magenta", "blue", "bright_blue"})  # these take white text
STEPPED_SYSTEMS = frozenset({"256", "standard", "windows"})  # Rich's names of colour systems


def scale_position(x: float, lo: float, hi: float) -> float:
    """Where ``x`` falls on the colour scale from ``lo`` to ``hi``: 0 at ``lo``, 1 at ``hi``.

    A range wider than float64 (-1e308 to 1e308, where ``hi - lo`` is inf and the plain
    formula gives inf / inf = NaN) is worked on values divided by its largest magnitude first,
    which cannot overflow. A flat or unknown range puts every value in the middle.
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi) or math.isnan(x):
        return 0.5
    span = hi - lo
    if math.isfinite(span):
        t = (x - lo) / span  # x - lo may overflow only for x beyond hi: then it clips to 1
    else:
        m = max(abs(lo), abs(hi))
        t = (x / m - lo / m) / (hi / m - lo / m)  # each quotient in [-1, 1] for x in range
    return min(max(t, 0.0), 1.0)


def _unit(t: float) -> float:
    """``t`` clipped to [0, 1]; NaN (no position) to the middle."""
    return 0.5 if math.isnan(t) else min(max(t, 0.0), 1.0)


def viridis(t: float) -> str:
    """The viridis colour at ``t`` in [0, 1], interpolated between samples, as ``#rrggbb``."""
    t = _unit(t) * (len(VIRIDIS) - 1)
    i = min(int(t), len(VIRIDIS) - 2)
    f = t - i
    a, b = VIRIDIS[i], VIRIDIS[i + 1]
    rgb = (round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (1, 3, 5))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def heat_style(t: float) -> Style:
    """A cell shaded by ``t``: viridis background, black or white text for contrast."""
    return Style(color="#000000" if t >= 0.55 else "#ffffff", bgcolor=viridis(t))


def step(t: float) -> int:
    """The tenth of the scale ``t`` falls in: 0 for [0, 0.1), ..., 9 for [0.9, 1]."""
    return min(int(_unit(t) * STEPS), STEPS - 1)


def stepped_style(t: float, system: str) -> Style:
    """The shading of ``t`` in a terminal of ``system`` (``"256"`` or ``"standard"``)."""
    k = step(t)
    if system == "256":
        ink = "color(16)" if k >= _LIGHT_FROM else "color(231)"
        return Style(color=ink, bgcolor=f"color({PALETTE_256[k]})")
    name = PALETTE_16[k]
    return Style(color="bright_white" if name in _DARK_16 else "black", bgcolor=name)
