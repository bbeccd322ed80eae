"""``attn probe``: call someone's attention function with crafted inputs, learn its conventions."""

import contextlib
import io
import re
from enum import Enum
from typing import Annotated

import typer

from attn_cli.cli.options import (
    ColorOption,
    Dtype,
    Format,
    LangOption,
    QuietOption,
    WidthOption,
    shown,
)
from attn_cli.cli.output import emit
from attn_cli.errors import UsageError


class Framework(str, Enum):
    numpy = "numpy"
    torch = "torch"


class MaskKind(str, Enum):
    bool_ = "bool"
    additive = "additive"


TargetArgument = Annotated[
    str,
    typer.Argument(
        help="path/to/file.py:function or package.module:function. The file is run (imported) "
        "in this process, as pytest imports a test file: probe only code you trust.",
        show_default=False,
        metavar="TARGET",
    ),
]
FrameworkOption = Annotated[
    Framework,
    typer.Option(
        help="numpy: pass NumPy arrays; torch: pass torch tensors (needs torch installed)."
    ),
]
MaskOption = Annotated[
    MaskKind,
    typer.Option(
        help="The mask passed to a function that takes one: bool (True attends, as SDPA) or "
        "additive (0 attends, -inf hidden; its polarity is then not asked).",
    ),
]
ProbeDtypeOption = Annotated[
    Dtype,
    typer.Option(help="The dtype of the arrays the function is given (and of its answers)."),
]
TimeoutOption = Annotated[
    str,
    typer.Option(
        metavar="SECONDS",
        help="Give up on a call of the function after this long (it is abandoned, and attn "
        "exits): more than 0, at most 3600.",
    ),
]
ExplainOption = Annotated[
    bool, typer.Option("--explain", help="Say what each finding means and how to fix it.")
]
ProbeFormatOption = Annotated[
    Format,
    typer.Option("--format", "-f", help="table (coloured on a terminal), plain, or json."),
]

_SECONDS = re.compile(r"^\s*(\d{1,9}(?:\.\d{0,9})?|\.\d{1,9})\s*s?\s*$", re.A)


def parse_timeout(text: str) -> float:
    """``10``, ``0.5`` or ``2s``: ASCII digits only, more than 0 and at most an hour."""
    match = _SECONDS.match(text)
    if not match:
        raise UsageError("", "--timeout", f"got {shown(text)}", "seconds, such as 10 or 0.5")
    seconds = float(match.group(1))
    if not 0 < seconds <= 3600:
        raise UsageError("", "--timeout", f"got {shown(text)}", "more than 0 and at most 3600")
    return seconds


def probe(
    target: TargetArgument,
    framework: FrameworkOption = Framework.numpy,
    dtype: ProbeDtypeOption = Dtype.float64,
    mask: MaskOption = MaskKind.bool_,
    timeout: TimeoutOption = "10",
    fmt: ProbeFormatOption = Format.table,
    width: WidthOption = None,
    color: ColorOption = None,
    explain: ExplainOption = False,
    lang: LangOption = None,
    quiet: QuietOption = False,
) -> None:
    """Call your attention function with crafted inputs: which conventions it follows, and
    where it differs from PyTorch SDPA.

    TARGET is path/to/file.py:function or package.module:function; loading it runs the file.
    fn gets q, k, v [batch, heads, seq, d] and, when its signature names them, causal, scale,
    mask and window; it returns [batch, heads, seq_q, d_v]. What it prints goes to standard
    error (dropped with --quiet). A call that takes longer than --timeout is abandoned and
    attn exits 2.

    Exit code: 0 matches, 1 differs, 2 trouble (cannot import, raises, hangs, wrong shape).

    Examples:

      attn probe my_attention.py:attention

      attn probe course/week3.py:causal_attention -f json

      attn probe mypkg.layers:sdpa_wrapper --framework torch --lang zh
    """
    from attn_cli.check.probe import probe_target

    seconds = parse_timeout(timeout)
    with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
        report = probe_target(
            target, framework=framework.value, dtype=dtype.value, mask=mask.value, timeout=seconds
        )
    if fmt is Format.json:
        import json

        text = json.dumps(report.as_json(), indent=2, allow_nan=False, ensure_ascii=False)
        emit(text + "\n", None, escape="json")
    else:
        from attn_cli.cli.runs import render_options, show
        from attn_cli.present.probe_view import render_probe

        language = render_options(0, False, explain, lang).lang
        view = render_probe(report, lang=language, explain=explain)
        show(view, fmt, None, width, color, True, False)
    raise typer.Exit(0 if report.verdict == "matches" else 1)
