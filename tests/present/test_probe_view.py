"""``attn probe``'s table and findings, rendered whole from a report built here (no probing)."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from attn_cli.check.probe import Decision, Finding, ProbeReport
from attn_cli.present.probe_view import render_probe

REPORT = ProbeReport(
    "t.py:f",
    (
        Decision("scale", "1/d", "1/sqrt(d)", "q·k = 2 vs 1"),
        Decision("gqa", "refused", "repeat-interleave", "raised ValueError"),
        Decision("deterministic", True, True, "twice"),
    ),
    (Finding("scaled_by_d_k", "scaled by d_k instead of √d_k", "q·k = 2 vs 1"),),
    (),
)

ENGLISH = """\
attn probe t.py:f
┏━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┓
┃ convention    ┃ found   ┃ reference         ┃ evidence          ┃
┡━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━┩
│ scale         │ 1/d     │ 1/sqrt(d)         │ q·k = 2 vs 1      │
│ gqa           │ refused │ repeat-interleave │ raised ValueError │
│ deterministic │ true    │ true              │ twice             │
└───────────────┴─────────┴───────────────────┴───────────────────┘

finding: scaled by d_k instead of √d_k [scaled_by_d_k]
The scores are divided by d instead of √d. Fix: / math.sqrt(d).
evidence: q·k = 2 vs 1

verdict: differs (1 finding)
"""


def rendered(lang: str, explain: bool) -> str:
    console = Console(file=StringIO(), width=72, color_system=None)
    console.print(render_probe(REPORT, lang=lang, explain=explain))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "".join(line.rstrip() + "\n" for line in str(text).splitlines())


def test_the_table_then_each_finding_then_the_verdict() -> None:
    assert rendered("en", explain=True) == ENGLISH
    assert rendered("en", explain=False) == ENGLISH.replace(
        "The scores are divided by d instead of √d. Fix: / math.sqrt(d).\n", ""
    )


def test_in_chinese_a_catalogued_finding_takes_the_graders_chinese() -> None:
    zh = rendered("zh", explain=False)
    assert "发现：除以 d_k 而不是 √d_k [scaled_by_d_k: scaled by d_k instead of" in zh
    assert "分数除以了 d_k，而公式要求除以 √d_k。修正：除以 math.sqrt(d_k)。\n" in zh
    assert zh.endswith("evidence: q·k = 2 vs 1\n\nverdict: differs (1 finding)\n")
