"""``attn flash`` and the grading of flash dumps, against references written here.

The references are a plain two-pass softmax per row (math.exp, math.log: the row max, then the
sum; a softcap c turns each scaled score x into c·math.tanh(x/c) first) and an independent tile
loop in plain Python with switchable mistakes, run on fixtures
given directly as Q, K, V (4-axis layout) so that nothing of attn computes the inputs; tile
counts and skipped tiles are worked by hand.
"""

from __future__ import annotations

import functools
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from conftest import DIFFERENTIAL, GATED, LATENT, LINEAR
from rich.console import Console
from test_decode_cli import CAUSAL_EXAMPLES, check_titles_stay, every_screen, step_in_pty
from typer.testing import CliRunner

from attn_cli.check.compare import GRADER_TOLERANCE
from attn_cli.check.run import check_fixture
from attn_cli.check.runs import run_flash
from attn_cli.cli.app import user_errors
from attn_cli.cli.flash import flash
from attn_cli.cli.usage import AttnCommand, AttnGroup
from attn_cli.io.examples import example_paths
from attn_cli.present.flash_view import flash_pages, flash_titles
from attn_cli.present.options import RenderOptions
from attn_cli.present.pager import Pages, State, frame
from attn_cli.present.step import on_key, page_deck

Array = np.ndarray[Any, Any]
F64 = 1e-12
NEG = -math.inf
LOG2E = 1 / math.log(2)


def make_app() -> typer.Typer:
    """The command as cli/app.py will register it: user errors become one `Error:` line."""
    app = typer.Typer(cls=AttnGroup, pretty_exceptions_enable=False)

    @functools.wraps(flash)
    def guarded(*args: Any, **kwargs: Any) -> None:
        with user_errors():
            flash(*args, **kwargs)

    app.command(name="flash", cls=AttnCommand)(guarded)
    app.command(name="unused-second-command")(lambda: None)  # keep "flash" a subcommand
    return app


def invoke(*args: str) -> Any:
    return CliRunner().invoke(make_app(), ["flash", *args])


def fixture(
    tmp_path: Path,
    B: int = 1,
    H: int = 2,
    Hkv: int = 1,
    T: int = 5,
    S: int = 5,
    causal: str | None = "upper-left",
    seed: int = 0,
    **extra: Any,
) -> tuple[Path, dict[str, Array]]:
    """A direct-mode fixture (4-axis Q, K, V) with random numbers, and its arrays."""
    rng = np.random.default_rng(seed)
    arrays = {
        "Q": rng.normal(size=(B, H, T, 3)),
        "K": rng.normal(size=(B, Hkv, S, 3)),
        "V": rng.normal(size=(B, Hkv, S, 2)),
    }
    doc: dict[str, Any] = {name: a.tolist() for name, a in arrays.items()}
    if causal is not None:
        doc["causal"] = causal
    doc.update(extra)
    path = tmp_path / f"f{seed}.json"
    path.write_text(json.dumps(doc))
    return path, arrays


def capped(x: float, softcap: float | None) -> float:
    """Gemma 2's softcap of one scaled score: c·tanh(x/c) (x itself without a cap)."""
    return x if softcap is None else softcap * math.tanh(x / softcap)


def two_pass(
    a: dict[str, Array], causal_offset: int | None, softcap: float | None = None
) -> tuple[Array, Array]:
    """O (B, H, T, Dv) and L (B, H, T): per row, the max, then the sum, with math.exp."""
    q, k, v = a["Q"], a["K"], a["V"]
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D)
    out, L = np.zeros((B, H, T, v.shape[3])), np.full((B, H, T), NEG)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            for i in range(T):
                js = [j for j in range(S) if causal_offset is None or j <= i + causal_offset]
                x = [
                    capped(sum(q[b, h, i, d] * k[b, g, j, d] for d in range(D)) * scale, softcap)
                    for j in js
                ]
                top = max(x)
                total = sum(math.exp(s - top) for s in x)
                L[b, h, i] = top + math.log(total)
                for e in range(v.shape[3]):
                    out[b, h, i, e] = sum(
                        math.exp(s - top) / total * v[b, g, j, e]
                        for s, j in zip(x, js, strict=True)
                    )
    return out, L


def tile_loop(
    a: dict[str, Array],
    bq: int,
    bk: int,
    offset: int | None,
    bug: str = "",
    softcap: float | None = None,
) -> tuple[Array, Array]:
    """An independent FlashAttention-2 forward per row in plain Python, with one mistake:
    "acc" (acc not rescaled), "sum" (l not rescaled), "nomax" (L = log l)."""
    q, k, v = a["Q"], a["K"], a["V"]
    B, H, T, D = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    scale = 1 / math.sqrt(D)
    out, L = np.zeros((B, H, T, Dv)), np.full((B, H, T), NEG)
    for b, h, i in np.ndindex(B, H, T):
        g = h // (H // Hkv)
        t1 = (i // bq + 1) * bq  # the end of the row's query block
        m, l, acc = NEG, 0.0, [0.0] * Dv  # noqa: E741
        for s0 in range(0, S, bk):
            if offset is not None and s0 > min(T, t1) - 1 + offset:
                continue  # wholly above the diagonal
            x = [
                capped(sum(q[b, h, i, d] * k[b, g, j, d] for d in range(D)) * scale, softcap)
                if offset is None or j <= i + offset
                else NEG
                for j in range(s0, min(S, s0 + bk))
            ]
            m_new = max(m, *x)
            if m_new == NEG:
                continue
            alpha = math.exp(m - m_new)
            p = [math.exp(s - m_new) for s in x]
            l = (l if bug == "sum" else alpha * l) + sum(p)  # noqa: E741
            for e in range(Dv):
                pv = sum(pj * v[b, g, s0 + j, e] for j, pj in enumerate(p))
                acc[e] = (acc[e] if bug == "acc" else alpha * acc[e]) + pv
            m = m_new
        out[b, h, i] = [x / l for x in acc]
        L[b, h, i] = math.log(l) + (0.0 if bug == "nomax" else m)
    return out, L


# ---------------------------------------------------------------------------------------------
# attn flash


@pytest.mark.parametrize(
    ("shape", "causal", "offset"),
    [
        ((1, 2, 1, 5, 5), "upper-left", 0),
        ((2, 2, 2, 3, 5), "lower-right", 2),
        ((1, 4, 2, 4, 6), None, None),
    ],
)
@pytest.mark.parametrize("blocks", [(2, 2), (3, 2), (1, 4)])
def test_output_and_lse_equal_the_two_pass_softmax(
    tmp_path: Path,
    shape: tuple[int, ...],
    causal: str | None,
    offset: int | None,
    blocks: tuple[int, int],
) -> None:
    B, H, Hkv, T, S = shape
    path, arrays = fixture(tmp_path, B, H, Hkv, T, S, causal)
    args = [str(path), "-f", "json", "--block-q", str(blocks[0]), "--block-k", str(blocks[1])]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "attn-flash" and doc["version"] == 1
    assert (doc["block_q"], doc["block_k"]) == blocks
    out, L = two_pass(arrays, offset)
    np.testing.assert_allclose(np.array(doc["stages"]["output"]["data"]), out, rtol=0, atol=F64)
    np.testing.assert_allclose(np.array(doc["stages"]["lse"]["data"]), L, rtol=0, atol=F64)
    assert all(c["ok"] and c["max_abs_diff"] <= F64 for c in doc["checks"])
    # a 4-axis fixture has a batch axis: every tile names its item, and every item has tiles
    assert sorted({t["batch"] for t in doc["tiles"]}) == list(range(B))


def test_skipped_tiles_worked_by_hand(tmp_path: Path) -> None:
    """T = S = 5, blocks of 2, upper-left: query blocks [0,2) [2,4) [4,5) by the same key
    blocks; [0,2) skips [2,4) and [4,5), [2,4) skips [4,5): 3 of 9 per head, 2 heads."""
    path, _ = fixture(tmp_path)
    doc = json.loads(invoke(str(path), "-f", "json").stdout)  # default blocks: 2 for 5 tokens
    assert doc["tiles_total"] == 18 and doc["tiles_shown"] == 18 and doc["causal_skip"]
    skipped = {
        (t["head"], tuple(t["q_block"]), tuple(t["k_block"])) for t in doc["tiles"] if t["skipped"]
    }
    want = {((0, 2), (2, 4)), ((0, 2), (4, 5)), ((2, 4), (4, 5))}
    assert skipped == {(h, *qk) for h in (0, 1) for qk in want}
    s = next(t for t in doc["tiles"] if t["skipped"])
    assert s["S"] is None and s["P"] is None and s["alpha"] is None
    text = invoke(str(path), "-f", "plain").stdout
    assert "18 tiles (6 skipped)" in text and "skipped: every key of this block" in text


def test_tile_recurrence_by_hand(tmp_path: Path) -> None:
    """One query [1, 0] against keys [1, 0], [3, 0] with values 10, 20, one key per tile."""
    path = tmp_path / "two.json"
    path.write_text(
        json.dumps(
            {"Q": [[1.0, 0.0]], "K": [[1.0, 0.0], [3.0, 0.0]], "V": [[10.0], [20.0]], "scale": 1}
        )
    )
    doc = json.loads(invoke(str(path), "-f", "json", "--block-q", "1", "--block-k", "1").stdout)
    first, second = doc["tiles"]
    assert "batch" not in first  # no batch axis in the fixture, none in the JSON
    assert first["m"] == [1.0] and first["alpha"] == [0.0] and first["l"] == [1.0]
    assert first["acc"] == [[10.0]]
    assert second["m"] == [3.0]
    assert second["alpha"][0] == pytest.approx(math.exp(-2), rel=1e-15)
    assert second["l"][0] == pytest.approx(math.exp(-2) + 1, rel=1e-15)
    assert second["acc"][0][0] == pytest.approx(10 * math.exp(-2) + 20, rel=1e-15)
    lse = doc["stages"]["lse"]["data"][0][0]
    assert lse == pytest.approx(3 + math.log(1 + math.exp(-2)), rel=1e-15)


def test_base2_is_triton_form(tmp_path: Path) -> None:
    path, arrays = fixture(tmp_path, causal="upper-left")
    doc = json.loads(invoke(str(path), "-f", "json", "--base2").stdout)
    assert doc["base2"] and doc["lse_base"] == "2"
    _, L = two_pass(arrays, 0)
    np.testing.assert_allclose(np.array(doc["stages"]["lse"]["data"]), L * LOG2E, rtol=1e-15)
    text = invoke(str(path), "-f", "plain", "--base2").stdout
    assert "--base2: Triton's form" in text and "P = exp2(S − m)" in text


def test_max_tiles_bounds_the_json(tmp_path: Path) -> None:
    """256 tokens: 65,536 scores per head; the JSON holds only the 4 tiles shown."""
    path, _ = fixture(tmp_path, T=256, S=256, H=1)
    result = invoke(str(path), "-f", "json", "--max-tiles", "4", "--block-q", "8", "--block-k", "8")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["tiles_shown"] == 4 and doc["tiles_total"] == 32 * 32
    assert "showing 4 of 1,024 tiles" in result.stderr
    assert len(result.stdout) < 30_000 + 40 * 256 * 3  # tiles shown, plus O and L rows
    assert all(c["ok"] for c in doc["checks"])


def test_float32_is_shown_in_ulps(tmp_path: Path) -> None:
    path, _ = fixture(tmp_path, T=6, S=6)
    doc = json.loads(invoke(str(path), "-f", "json", "--dtype", "float32").stdout)
    assert all(c["ulps"] is not None and c["ok"] for c in doc["checks"])
    assert doc["checks"][0]["max_abs_diff"] < 1e-5
    text = invoke(str(path), "-f", "plain", "--dtype", "float32").stdout
    assert "in ulps" in text


EXAMPLES = [  # every bundled example: the causal ones (as attn decode's tests), then the rest
    *CAUSAL_EXAMPLES,
    "the_cat_sat",
    "cross_attention",
    "padding_batch",
    "grouped_query",
    "article_example_2",
    "pytorch_snippet",
]


def test_the_list_holds_every_bundled_example() -> None:
    assert sorted([*EXAMPLES, *GATED, *LATENT, *DIFFERENTIAL, *LINEAR]) == sorted(example_paths())


@pytest.mark.parametrize("name", EXAMPLES)
def test_bundled_examples_check_themselves(name: str) -> None:
    result = invoke(name, "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["tiles_total"] >= 4  # several tiles by default
    assert [c["name"] for c in doc["checks"]] == ["output", "lse", "softmax"]


def test_explain_in_both_languages() -> None:
    en = invoke("causal_multihead", "-f", "plain", "--explain").stdout
    assert "α = exp(m_old − m)" in en and "what this step does" in en
    zh = invoke("causal_multihead", "-f", "plain", "--explain", "--lang", "zh").stdout
    assert "逐块展示" in zh and "运行中的 softmax 分母" in zh


def test_a_wrong_kernel_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from attn_cli.core import flash as core_flash

    def unrescaled(q: Array, k: Array, v: Array, **kw: Any) -> Any:
        setup = core_flash._Setup(
            kw["chain"],
            kw["scale"],
            kw["origin"],
            kw["causal_offset"],
            kw["base2"],
            kw["record_tiles"],
        )
        return core_flash._forward(
            q, k, v, kw["block_q"], kw["block_k"], setup, core_flash._Bugs(acc_not_rescaled=True)
        )

    monkeypatch.setattr(core_flash, "flash_forward", unrescaled)  # read at each call
    result = invoke("llama_rope_gqa", "--block-k", "1")
    assert result.exit_code == 2
    assert "FlashAttention's output differs from the trace's" in result.stderr


@pytest.mark.parametrize("cap", [0.3, 2.0])
@pytest.mark.parametrize("blocks", [(2, 2), (3, 4)])
def test_softcap_equals_the_two_pass_softmax(
    tmp_path: Path, cap: float, blocks: tuple[int, int]
) -> None:
    path, arrays = fixture(tmp_path, H=2, Hkv=1, T=6, S=6, softcap=cap)
    args = ["-f", "json", "--block-q", str(blocks[0]), "--block-k", str(blocks[1])]
    doc = json.loads(invoke(str(path), *args).stdout)
    out, L = two_pass(arrays, 0, cap)
    np.testing.assert_allclose(np.array(doc["stages"]["output"]["data"]), out, rtol=0, atol=F64)
    np.testing.assert_allclose(np.array(doc["stages"]["lse"]["data"]), L, rtol=0, atol=F64)
    plain, _ = two_pass(arrays, 0)
    assert np.abs(plain - out).max() > 1e-3  # the cap changes the answer
    tile = doc["tiles"][0]  # (0..1) × (0..1): S is the capped score, −∞ above the diagonal
    q, k = arrays["Q"][0, 0], arrays["K"][0, 0]
    want = [
        [
            capped(float(q[i] @ k[j]) / math.sqrt(3), cap) if j <= i else "-inf"
            for j in range(blocks[1])
        ]
        for i in range(blocks[0])
    ]
    assert [
        [x if x == "-inf" else pytest.approx(x, abs=F64) for x in row] for row in tile["S"]
    ] == want
    text = invoke(str(path), "-f", "plain").stdout
    assert f"S: capped scores of the tile, {cap:g}·tanh(scaled/{cap:g})" in text


def test_gemma2_softcap_in_base2_and_float32() -> None:
    doc = json.loads(invoke("gemma2_softcap", "-f", "json", "--base2").stdout)
    assert all(c["ok"] and c["max_abs_diff"] <= F64 for c in doc["checks"])
    doc = json.loads(invoke("gemma2_softcap", "-f", "json", "--dtype", "float32").stdout)
    assert all(c["ok"] and c["ulps"] is not None for c in doc["checks"])


def test_step_pages() -> None:
    run = run_flash("causal_multihead", max_tiles=5)
    assert len(list(flash_pages(run, RenderOptions()))) == 5 + 2
    assert len(flash_titles(run, "en")) == 5 + 2


# ---------------------------------------------------------------------------------------------
# Step mode (--step): the pager of attn trace, one tile a page


def flash_deck(name: str, lang: str = "en", **kw: Any) -> Pages:
    run = run_flash(name, **kw)
    options = RenderOptions(explain=True, lang=lang)  # type: ignore[arg-type]
    console = Console(width=80, color_system=None, file=io.StringIO())
    return page_deck(
        flash_pages(run, options), flash_titles(run, options.lang), options.lang, console
    )


@pytest.mark.parametrize(("name", "lang"), [("gemma2_softcap", "en"), ("llama_rope_gqa", "zh")])
def test_every_tile_page_keeps_its_title_at_80x24(name: str, lang: str) -> None:
    deck = flash_deck(name, lang, max_tiles=12)
    assert len(deck.names) == 12 + 2
    assert check_titles_stay(deck) >= 10  # tiles that compute scroll; a skipped one may not


def test_tile_titles_say_where_and_what_was_skipped() -> None:
    deck = flash_deck("causal_multihead")  # 4 tokens, blocks of 2: 2 × 2 tiles per head
    assert deck.names[1:5] == [
        "head 0 · q 0..1 × k 0..1",
        "head 0 · q 0..1 × k 2..3 (skipped)",
        "head 0 · q 2..3 × k 0..1",
        "head 0 · q 2..3 × k 2..3",
    ]
    assert len(deck.names) == 2 * 4 + 2
    screen = every_screen(deck, 2, 80, 24)[0]
    assert "skipped: every key of this block is after every query" in "\n".join(screen)
    state = on_key(deck, State(), b"9", 80, 24)
    assert state is not None and state.k == 8
    top = "".join(segment.text for segment in frame(deck, state, 80, 24)[0])
    assert top.startswith("stage 9 of 10  head 1 · q 2..3 × k 2..3")


@pytest.mark.parametrize("args", [["--step", "-f", "json"], ["--step", "-o", "flash.txt"]])
def test_step_is_refused_with_json_or_a_file(args: list[str]) -> None:
    result = invoke("causal_multihead", *args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "--step" in lines[0]
    assert not Path("flash.txt").exists()


@pytest.mark.subprocess
def test_step_in_a_pty() -> None:
    code, _ = step_in_pty(
        ["flash", "causal_multihead", "--step"],
        [
            (b"\r", r"stage 2 of 10\s+head 0 · q 0\.\.1 × k 0\.\.1"),
            (b"\r", r"stage 3 of 10\s+head 0 · q 0\.\.1 × k 2\.\.3 \(skipped\)"),
            (b"\x1b[F", r"stage 3 of 10"),
            (b"q", r""),
        ],
        first=r"stage 1 of 10\s+overview",
    )
    assert code == 0


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM in /proc")
def test_memory_of_the_json_grows_with_the_tiles_shown(tmp_path: Path) -> None:
    """4,096 tokens, 4 tiles shown: the peak stays far below one 128 MiB score matrix (T × S
    float64), and the JSON holds 4 tiles of 1024 × 16 (not 16M scores: about 330 MB of text)."""
    path, _ = fixture(tmp_path, T=4096, S=4096, H=1, causal=None)
    code = (
        "import sys\n"
        "from attn_cli.check.runs import run_flash\n"
        "from attn_cli.io.decode_json import flash_dumps\n"
        f"r = run_flash({str(path)!r}, block_q=1024, block_k=16, max_tiles=4)\n"
        "text = flash_dumps(r)\n"
        # VmHWM, not getrusage's ru_maxrss: that starts from the parent's peak at fork
        "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM'))\n"
        "print(int(hwm.split()[1]), len(text))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    peak_kib, size = (int(x) for x in out.stdout.split()[-2:])
    assert peak_kib < 128 * 1024
    assert size < 5_000_000


# ---------------------------------------------------------------------------------------------
# Grading a flash dump (attn check FIXTURE --against DUMP): O and L, as CS336 asks for


def grade(path: Path, dump: dict[str, Any], suffix: str = ".json") -> Any:
    out = path.parent / f"dump{suffix}"
    if suffix == ".json":
        out.write_text(json.dumps(dump))
    else:
        np.savez(out, **dump)
    outcome = check_fixture(str(path), against=out, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None
    return outcome.comparison


def test_a_right_kernel_passes_also_as_npz_in_cs336_layout(tmp_path: Path) -> None:
    path, arrays = fixture(tmp_path, B=2, H=2, Hkv=2, T=6, S=6)
    out, L = tile_loop(arrays, 4, 4, 0)
    assert grade(path, {"O": out.tolist(), "L": L.tolist()}).same
    c = grade(path, {"O": out.reshape(4, 6, 2), "L": L.reshape(4, 6)}, ".npz")  # (batch·heads, T)
    assert c.same, c.stages


@pytest.mark.parametrize(
    ("bug", "name"),
    [("acc", "acc_not_rescaled"), ("sum", "sum_not_rescaled"), ("nomax", "lse_without_max")],
)
def test_kernel_mistakes_are_named(tmp_path: Path, bug: str, name: str) -> None:
    path, arrays = fixture(tmp_path, H=2, Hkv=1, T=6, S=6, seed=3)
    out, L = tile_loop(arrays, 2, 2, 0, bug)
    c = grade(path, {"output": out.tolist(), "lse": L.tolist(), "block_q": 2, "block_k": 2})
    assert [d.name for d in c.diagnoses] == [name]


@pytest.mark.parametrize(
    ("bug", "name"), [("acc", "acc_not_rescaled"), ("nomax", "lse_without_max")]
)
def test_kernel_mistakes_are_named_under_softcap(tmp_path: Path, bug: str, name: str) -> None:
    path, arrays = fixture(tmp_path, H=2, Hkv=1, T=6, S=6, seed=7, softcap=1.5)
    right = tile_loop(arrays, 2, 2, 0, softcap=1.5)
    c = grade(
        path, {"output": right[0].tolist(), "lse": right[1].tolist(), "block_q": 2, "block_k": 2}
    )
    assert c.same, c.stages
    out, L = tile_loop(arrays, 2, 2, 0, bug, softcap=1.5)
    c = grade(path, {"output": out.tolist(), "lse": L.tolist(), "block_q": 2, "block_k": 2})
    assert [d.name for d in c.diagnoses] == [name]


def test_base2_where_base_e_is_expected(tmp_path: Path) -> None:
    path, arrays = fixture(tmp_path, seed=4)
    out, L = two_pass(arrays, 0)
    c = grade(path, {"output": out.tolist(), "lse": (L * LOG2E).tolist()})
    assert [d.name for d in c.diagnoses] == ["lse_base2"]
    assert c.stages[0].status == "same"  # O is right; only L is in the wrong base


def test_block_sizes_are_guessed_when_not_given(tmp_path: Path) -> None:
    path, arrays = fixture(tmp_path, H=1, T=8, S=8, seed=5)
    out, L = tile_loop(arrays, 4, 4, 0, "acc")
    c = grade(path, {"output": out.tolist(), "lse": L.tolist()})
    assert [d.name for d in c.diagnoses] == ["acc_not_rescaled"]
    assert "blocks 4 × 4" in c.diagnoses[0].detail


def test_tiles_m_and_l_of_our_own_json(tmp_path: Path) -> None:
    path, _ = fixture(tmp_path, seed=6)
    ours = tmp_path / "ours.json"
    ours.write_text(invoke(str(path), "-f", "json").stdout)
    outcome = check_fixture(str(path), against=ours, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None and outcome.comparison.same
    assert [s.name for s in outcome.comparison.stages] == ["output", "lse", "tile m", "tile l"]
