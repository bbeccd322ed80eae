"""Text for LaTeX: input text escaped literally, and the formulas inside prose set as math.

The explanations, formulas and worked cells are written for a terminal: ``Q·Kᵀ``, ``1/√d_k``,
``e^(x − m)``, ``W_Q``. :func:`latex_mixed` finds the formula stretches of such a line and sets
them as math (``\\(Q\\cdot K^{\\top}\\)``, ``\\(1/\\sqrt{d_{k}}\\)``, ``\\(e^{(x - m)}\\)``), so
minus signs, exponents and subscripts look as they do in a textbook, the same in a worked cell
as in a table. The prose around them, and every ``literal`` (tokens, file names: input text that
must print as typed), goes through :func:`latex_escape`.

A stretch is math when it holds an operator, a number or a subscripted name, together with the
names, single letters, brackets and commas next to it; a space is crossed only beside an
operator or after a comma inside brackets. Words of prose never join one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attn_cli.present.text import safe
from attn_cli.present.variants import math_names

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "&": r"\&",
    "#": r"\#",
    "^": r"\textasciicircum{}",
    "_": r"\_",
    "%": r"\%",
    "~": r"\textasciitilde{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    '"': r"\textquotedbl{}",
    "[": "{[}",
    "]": "{]}",
    "-": "-{}",  # no -- or --- ligatures from input text
    "'": r"\textquotesingle{}",
    "`": r"\textasciigrave{}",
    # the math symbols the explanations use
    "·": r"\ensuremath{\cdot}",
    "ᵀ": r"\ensuremath{^{\top}}",
    "×": r"\ensuremath{\times}",
    "−": r"\ensuremath{-}",
    "∞": r"\ensuremath{\infty}",
    "Σ": r"\ensuremath{\Sigma}",
    "√": r"\ensuremath{\surd}",
    "≤": r"\ensuremath{\leq}",
    "→": r"\ensuremath{\rightarrow}",
    "←": r"\ensuremath{\leftarrow}",
    "◀": r"\ensuremath{\triangleleft}",
    "…": r"\dots{}",
    "“": "``",
    "”": "''",
    "‘": "`",
    "’": "'",
    "\u00a0": "~",
}


def latex_escape(text: str) -> str:
    """Input text for LaTeX text mode, compiling with plain pdflatex.

    Specials are escaped; Latin-1 letters (é, ü) pass (T1 fonts), Chinese passes (inside the CJK
    environment the document opens when it needs one), anything else becomes ``U+XXXX``.
    """
    out = []
    for c in safe(text):
        if c in _LATEX_SPECIAL:
            out.append(_LATEX_SPECIAL[c])
        elif c.isascii() or ("\u00c0" <= c <= "\u00ff" and c not in "×÷") or cjk(c):
            out.append(c)
        else:
            out.append(rf"\texttt{{U+{ord(c):04X}}}")
    return "".join(out)


def cjk(c: str) -> bool:
    """A wide character the CJK package sets (in the Basic Multilingual Plane)."""
    return unicodedata.east_asian_width(c) in ("W", "F") and ord(c) < 0x10000


def latex_number(s: str) -> str:
    """A number as math content: ``−`` and ``-`` are the minus sign, ``1e−06`` with an upright e."""
    s = s.replace("−", "-")
    if s in ("-∞", "∞", "-inf", "inf"):
        return r"-\infty" if s.startswith("-") else r"\infty"
    mantissa, e, exponent = s.partition("e")
    return rf"{mantissa}\mathrm{{e}}{{{exponent}}}" if e else s


# ---------------------------------------------------------------------------------------------
# Tokens

_TOKEN = re.compile(
    r"(?P<lit>\ue000\d+\ue001)"
    r"|(?P<num>\d+(?:\.\d+)?(?:e[−+-]?\d+)?)"
    r"|(?P<sub>[A-Za-zΣ][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)"
    r"|(?P<word>[A-Za-z]+(?:-[A-Za-z]+)*)"
    r"|(?P<op>[=+−×·/^√ᵀ²∞≤≥*|→Σ…-])"
    r"|(?P<open>[(\[])|(?P<close>[)\]])|(?P<comma>,)|(?P<space> )|(?P<other>.)",
    re.S,
)
SEEDS = frozenset({"num", "sub", "op"})  # what makes a stretch math
# Names that join a formula next to an operator; other words of two or more letters are prose.
NAMES = frozenset(
    {
        *("X", "X_kv", "Q", "K", "V", "scores", "scaled", "capped", "masked"),
        *("softmax", "lse", "output", "concat", "projected", "tanh", "exp", "log", "mean"),
        *("max", "min", "scale", "bias", "eps", "sink", "head"),
        *("True", "False", "true", "false"),
    }
)
_FUNCTIONS = {"log": r"\log", "exp": r"\exp", "tanh": r"\tanh", "max": r"\max", "min": r"\min"}
_OPS = {
    "−": "-",
    "-": "-",
    "×": r"\times ",
    "·": r"\cdot ",
    "∞": r"\infty ",
    "≤": r"\leq ",
    "≥": r"\geq ",
    "→": r"\rightarrow ",
    "Σ": r"\sum ",
    "ᵀ": r"^{\top}",
    "²": "^{2}",
    "…": r"\dots ",
}
_VALUES = frozenset({"num", "sub", "word", "lit", "close"})  # a space between two is kept


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str


def _tokens(text: str, literals: Sequence[str]) -> list[_Token]:
    return [
        _Token("lit", literals[int(m.group()[1:-1])])
        if m.lastgroup == "lit"
        else _Token(m.lastgroup or "other", m.group())
        for m in _TOKEN.finditer(text)
    ]


def _protect(text: str, literals: Iterable[str]) -> tuple[str, list[str]]:
    """``text`` with each whole occurrence of a literal replaced by a placeholder."""
    found: list[str] = []
    for literal in sorted({x for x in literals if x}, key=len, reverse=True):
        before = r"(?<![A-Za-z0-9])" if literal[0].isalnum() else ""
        after = r"(?![A-Za-z0-9])" if literal[-1].isalnum() else ""
        pattern = before + re.escape(literal) + after
        if re.search(pattern, text):
            text = re.sub(pattern, lambda m: f"\ue000{len(found)}\ue001", text)
            found.append(literal)
    return text, found


# ---------------------------------------------------------------------------------------------
# Stretches of math


def _joins(token: _Token, following: _Token | None) -> bool:
    """Whether ``token`` may be part of a formula."""
    if token.kind == "word":
        return (
            len(token.text) == 1
            or token.text in NAMES
            or token.text in math_names()
            or (following is not None and following.kind == "open")
        )
    return token.kind in ("num", "sub", "op", "open", "close", "comma", "lit")


def _runs(tokens: list[_Token]) -> list[tuple[int, int]]:
    """(start, end) of each stretch of tokens that is math."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(tokens)
    while i < n:
        if not _joins(tokens[i], tokens[i + 1] if i + 1 < n else None):
            i += 1
            continue
        j, depth = i, 0
        while j < n:
            tok = tokens[j]
            nxt = tokens[j + 1] if j + 1 < n else None
            if tok.kind == "space":
                prev = tokens[j - 1]
                if nxt is None or not _joins(nxt, tokens[j + 2] if j + 2 < n else None):
                    break
                beside_op = _opish(prev) or _opish(nxt)
                counted = nxt.kind == "num" and prev.kind in ("word", "sub")  # head 0, d_k 2
                if not (beside_op or counted or (prev.kind == "comma" and depth > 0)):
                    break
            elif not _joins(tok, nxt):
                break
            depth += tok.kind == "open"
            depth -= tok.kind == "close"
            j += 1
        start, end = _trim(tokens, i, j)
        if any(t.kind in SEEDS for t in tokens[start:end]):
            runs.append((start, end))
        i = max(j, i + 1)
    return runs


def _opish(token: _Token) -> bool:
    """An operator, or a sum or maximum with its index (``Σ_d``, ``max_k``): a space beside it
    is inside a formula."""
    if token.kind == "sub":
        return token.text.partition("_")[0] in ("Σ", *_FUNCTIONS)
    return token.kind == "op"


def _trim(tokens: list[_Token], start: int, end: int) -> tuple[int, int]:
    """A stretch without commas and spaces at its ends, nor brackets it does not close."""
    while True:
        unmatched = _unmatched(tokens, start, end)
        if start < end and (tokens[start].kind in ("comma", "space") or start in unmatched):
            start += 1
        elif end > start and (tokens[end - 1].kind in ("comma", "space") or end - 1 in unmatched):
            end -= 1
        else:
            return start, end


def _unmatched(tokens: list[_Token], start: int, end: int) -> set[int]:
    """The positions of the brackets in ``tokens[start:end]`` without a partner there."""
    opened: list[int] = []
    alone: set[int] = set()
    for k in range(start, end):
        if tokens[k].kind == "open":
            opened.append(k)
        elif tokens[k].kind == "close":
            if opened:
                opened.pop()
            else:
                alone.add(k)
    return alone | set(opened)


# ---------------------------------------------------------------------------------------------
# Setting math


def _name(text: str) -> str:
    if text == "Σ":
        return r"\sum"
    if text in _FUNCTIONS:
        return _FUNCTIONS[text]
    return text if len(text) == 1 else rf"\mathrm{{{text}}}"


def _atom(tok: _Token) -> str:
    """One token as math."""
    if tok.kind == "num":
        return latex_number(tok.text)
    if tok.kind == "sub":
        base, _, sub = tok.text.partition("_")
        return f"{_name(base)}_{{{_name(sub)}}}"
    if tok.kind == "word":
        return _name(tok.text)
    if tok.kind == "lit":
        return r"\text{" + latex_escape(tok.text) + "}"
    if tok.kind == "op":
        return _OPS.get(tok.text, tok.text)
    if tok.kind == "space":
        return " "
    return latex_escape(tok.text) if tok.kind == "other" else tok.text


def _group(tokens: list[_Token], i: int) -> tuple[list[_Token], int, bool]:
    """The operand after ``^`` or ``√`` at ``i``: a bracketed group (brackets dropped when
    ``√``) or one token with its sign; returns the tokens, the next index and whether bracketed."""
    if i < len(tokens) and tokens[i].kind == "open":
        depth = 0
        for j in range(i, len(tokens)):
            depth += tokens[j].kind == "open"
            depth -= tokens[j].kind == "close"
            if depth == 0:
                return tokens[i : j + 1], j + 1, True
    j = i + 1 if i < len(tokens) and tokens[i].text in ("−", "-") else i
    return tokens[i : j + 1], j + 1, False


def _math(tokens: list[_Token]) -> str:
    """Tokens as the content of ``\\( \\)``."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.kind == "op" and tok.text in ("^", "√"):
            operand, i, bracketed = _group(tokens, i + 1)
            if bracketed:  # the brackets only grouped the operand in plain text
                operand = operand[1:-1]
            inner = _math(operand)
            out.append(rf"\sqrt{{{inner}}}" if tok.text == "√" else f"^{{{inner}}}")
            continue
        spaced = 0 < i < len(tokens) - 1 and tokens[i - 1].kind in _VALUES
        spaced = spaced and not _opish(tokens[i - 1])
        if tok.kind == "space" and spaced and tokens[i + 1].kind in _VALUES - {"close"}:
            out.append(r"\ ")  # a space math would drop: head 0, d_model 4
        else:
            out.append(_atom(tok))
        i += 1
    return re.sub(" +", " ", "".join(out)).strip()


def latex_mixed(text: str, literals: Iterable[str] = (), *, formulas: bool = True) -> str:
    """A line of prose and formulas for LaTeX: formulas in ``\\( \\)``, the rest escaped;
    each of ``literals`` (tokens, names) prints exactly as given wherever it occurs.

    With ``formulas=False`` (shapes such as ``Q [head=1, d_k=2]``) only subscripted names are
    set as math.
    """
    protected, found = _protect(text, literals)
    tokens = _tokens(protected, found)
    out: list[str] = []
    done = 0
    if formulas:
        runs = _runs(tokens)
    else:
        runs = [(k, k + 1) for k, token in enumerate(tokens) if token.kind == "sub"]
    for start, end in runs:
        out.append(latex_escape("".join(t.text for t in tokens[done:start])))
        out.append(r"\(" + _math(tokens[start:end]) + r"\)")
        done = end
    out.append(latex_escape("".join(t.text for t in tokens[done:])))
    return "".join(out)
