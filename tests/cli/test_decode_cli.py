"""``attn decode`` and the grading of decode dumps, against references written here.

The reference is a naive decode loop in plain Python (math.exp, sums over lists): at every step
it recomputes the new token's attention from scratch over the keys it may see, with its own
RoPE (both layouts), RMSNorm, window, sinks and softcap (math.tanh). Q, K, V come from the
fixture's own X and W through NumPy's matmul. Ring-buffer contents and cache costs are worked
by hand.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import select
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from conftest import DIFFERENTIAL, GATED, LATENT, LINEAR, run_cli
from reference import llama3_frequency
from rich.console import Console
from typer.testing import CliRunner

from attn_cli.api import load
from attn_cli.check.compare import GRADER_TOLERANCE
from attn_cli.check.run import check_fixture
from attn_cli.check.runs import run_decode
from attn_cli.cli.app import user_errors
from attn_cli.cli.decode import decode
from attn_cli.cli.usage import AttnCommand, AttnGroup
from attn_cli.core.inputs import Inputs, Rope
from attn_cli.io.examples import example_paths
from attn_cli.present.decode_view import decode_pages, decode_titles
from attn_cli.present.options import RenderOptions
from attn_cli.present.pager import Pages, State, frame, last_top, press
from attn_cli.present.step import on_key, page_deck

Array = np.ndarray[Any, Any]
F64 = 1e-12
VARIANTS = [  # causal bundled examples in projection mode: the naive loop reads X and W
    "causal_multihead",
    "llama_rope_gqa",
    "llama_rope_interleaved",
    "mistral_sliding_window",
    "gptoss_sinks",
    "qwen3_qk_norm",
    "gemma2_softcap",
    "llama31_rope_scaling",
    "qk_layernorm",
    "post_rope_norm",
]
CAUSAL_EXAMPLES = [  # every bundled causal example
    *VARIANTS,
    "mask_sentinel",
    "llama4_chunked",
    "llama4_temperature",
    "olmo_clip_qkv",
]


def make_app() -> typer.Typer:
    """The command as cli/app.py will register it: user errors become one `Error:` line."""
    app = typer.Typer(cls=AttnGroup, pretty_exceptions_enable=False)

    @functools.wraps(decode)
    def guarded(*args: Any, **kwargs: Any) -> None:
        with user_errors():
            decode(*args, **kwargs)

    app.command(name="decode", cls=AttnCommand)(guarded)
    app.command(name="unused-second-command")(lambda: None)  # keep "decode" a subcommand
    return app


def invoke(*args: str) -> Any:
    return CliRunner().invoke(make_app(), ["decode", *args])


# ---------------------------------------------------------------------------------------------
# The reference: a naive decode loop


def rope_pairs(dims: int, layout: str) -> list[tuple[int, int]]:
    half = dims // 2
    if layout == "half":
        return [(i, i + half) for i in range(half)]
    return [(2 * i, 2 * i + 1) for i in range(half)]


def rope_vec(x: list[float], pos: int, rope: Rope) -> list[float]:
    """RoPE of one vector at one position: pair i turns by pos · base^(−2i/dims) (or that
    frequency as Llama 3.1's scaling leaves it)."""
    out = list(x)
    scaling, base = None if rope.scaling is None else rope.scaling.config(), rope.base
    if scaling is not None and scaling["type"] == "ntk_alpha":  # HunYuan: base × alpha^(d/(d-2))
        base, scaling = base * scaling["alpha"] ** (rope.dims / (rope.dims - 2)), None
    for i, (a, b) in enumerate(rope_pairs(rope.dims, rope.layout)):
        angle = pos * llama3_frequency(base ** (-2 * i / rope.dims), scaling)
        c, s = math.cos(angle), math.sin(angle)
        out[a], out[b] = x[a] * c - x[b] * s, x[b] * c + x[a] * s
    return out


def rms(x: list[float], w: Array, eps: float) -> list[float]:
    r = math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v / r * float(wi) for v, wi in zip(x, w, strict=True)]


def layer_norm_row(x: list[float], inp: Inputs, side: str, head: int) -> list[float]:
    """qk_layernorm of one head's row: (x − mean) / √(var + eps) · w (+ b), that head's w, b."""
    ln = inp.setting("qk_layernorm")
    w, b = (getattr(ln, f"{side}_{p}") for p in ("weight", "bias"))
    w, b = (p[head] if p is not None and p.ndim == 2 else p for p in (w, b))
    m = sum(x) / len(x)
    r = math.sqrt(sum((v - m) ** 2 for v in x) / len(x) + ln.eps)
    return [
        (v - m) / r * float(w[i]) + (0.0 if b is None else float(b[i])) for i, v in enumerate(x)
    ]


def heads_of(inp: Inputs) -> tuple[Array, Array, Array]:
    """Q (H, T, D), K (Hkv, T, D), V (Hkv, T, Dv) of batch item 0 from X and W (NumPy)."""
    assert inp.X is not None and inp.W_Q is not None and inp.W_K is not None
    assert inp.W_V is not None
    X = inp.X[0]

    def split(W: Array, n: int) -> Array:
        flat = X @ W  # (T, n*d)
        heads: Array = flat.reshape(flat.shape[0], n, -1).transpose(1, 0, 2)  # (n, T, d)
        return heads

    return split(inp.W_Q, inp.heads), split(inp.W_K, inp.kv_heads), split(inp.W_V, inp.kv_heads)


def naive_decode(inp: Inputs, bug: str = "") -> list[list[list[float]]]:
    """The output of every token (T, H, Dv), each recomputed from scratch over its keys.

    ``bug``: "rerotate" rotates each cached key once more per step since it entered;
    "head_tiled" reads kv head h mod Hkv; "ring_plus_one" keeps window + 1 keys;
    "before_append" attends to the tokens before t only (token 0 is the prefill's).
    """
    q, k, v = heads_of(inp)
    H, T, D = q.shape
    Hkv = k.shape[0]
    scale = inp.scale if inp.scale is not None else 1 / math.sqrt(D)
    post = inp.setting("post_rope_norm")
    outs = []
    for t in range(T):
        per_head = []
        for h in range(H):
            g = h % Hkv if bug == "head_tiled" else h // (H // Hkv)
            qv = [float(x) for x in q[h, t]]
            if inp.setting("qk_norm") is not None:
                qv = rms(qv, inp.setting("qk_norm").q_weight, inp.setting("qk_norm").eps)
            if inp.setting("qk_layernorm") is not None:
                qv = layer_norm_row(qv, inp, "q", h)
            if inp.rope is not None:
                qv = rope_vec(qv, t, inp.rope)
            if post is not None:  # the norm after RoPE (HunYuan)
                qv = rms(qv, post.q_weight if post.q_weight is not None else np.ones(D), post.eps)
            keep = t + 1 if inp.window is None else inp.window + (bug == "ring_plus_one")
            seen = t if bug == "before_append" and t > 0 else t + 1  # the cache before t
            js = [j for j in range(seen) if t - j < keep]
            logits = []
            for j in js:
                kv = [float(x) for x in k[g, j]]
                if inp.setting("qk_norm") is not None:
                    kv = rms(kv, inp.setting("qk_norm").k_weight, inp.setting("qk_norm").eps)
                if inp.setting("qk_layernorm") is not None:
                    kv = layer_norm_row(kv, inp, "k", g)
                if inp.rope is not None:
                    turns = 1 + (max(0, t - max(j, 0)) if bug == "rerotate" and t > 0 else 0)
                    for _ in range(turns):
                        kv = rope_vec(kv, j, inp.rope)
                if post is not None:
                    kv = rms(
                        kv, post.k_weight if post.k_weight is not None else np.ones(D), post.eps
                    )
                x = sum(a * b for a, b in zip(qv, kv, strict=True)) * scale
                if inp.setting("softcap") is not None:  # Gemma 2: capped before anything is masked
                    x = inp.setting("softcap") * math.tanh(x / inp.setting("softcap"))
                logits.append(x)
            sink = [] if inp.setting("sinks") is None else [float(inp.setting("sinks")[h])]
            top = max(logits + sink)
            total = sum(math.exp(x - top) for x in logits + sink)
            w = [math.exp(x - top) / total for x in logits]
            per_head.append(
                [
                    sum(wj * float(v[g, j, e]) for wj, j in zip(w, js, strict=True))
                    for e in range(v.shape[2])
                ]
            )
        outs.append(per_head)
    return outs


def steps_of(doc: dict[str, Any]) -> Iterator[tuple[int, Array]]:
    for step in doc["steps"]:
        yield step["index"], np.array(step["stages"]["output"]["data"], dtype=float)


# ---------------------------------------------------------------------------------------------
# attn decode


@pytest.mark.parametrize("fixture", VARIANTS)
def test_every_step_equals_the_naive_loop(fixture: str) -> None:
    result = invoke(fixture, "--prefill", "2", "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "attn-decode" and doc["version"] == 1 and doc["prefill"] == 2
    want = naive_decode(load(fixture))
    assert [i for i, _ in steps_of(doc)] == list(range(2, len(want)))
    for i, out in steps_of(doc):
        np.testing.assert_allclose(out[:, 0], want[i], rtol=0, atol=F64)  # (H, 1, Dv)
    assert doc["max_abs_diff"] <= F64


def test_ring_buffer_worked_by_hand() -> None:
    """mistral_sliding_window: window 3, 6 tokens, prefill 1: slot = position mod 3."""
    doc = json.loads(invoke("mistral_sliding_window", "-f", "json").stdout)
    assert [s["slot"] for s in doc["steps"]] == [1, 2, 0, 1, 2]
    assert [s["cache_positions"] for s in doc["steps"]] == [
        [0, 1, -1],
        [0, 1, 2],
        [3, 1, 2],
        [3, 4, 2],
        [3, 4, 5],
    ]
    first = doc["steps"][0]["stages"]
    assert first["K_cache"]["shape"] == [1, 3, 4]  # kv_heads, window slots, d_k
    assert first["masked"]["data"][0][0][2] == "-inf"  # the empty slot, as the trace writes −∞


def test_stages_and_layouts() -> None:
    doc = json.loads(invoke("gptoss_sinks", "-f", "json").stdout)
    stages = doc["steps"][0]["stages"]
    assert list(stages) == [
        "Q",
        "Q_rot",
        "K_cache",
        "V_cache",
        "scores",
        "scaled",
        "masked",
        "softmax",
        "output",
    ]
    assert stages["Q"]["shape"] == [4, 1, 4] and stages["scores"]["shape"] == [
        4,
        1,
        3,
    ]  # 3 ring slots
    weights = np.array(stages["softmax"]["data"])
    assert np.all(weights.sum(axis=-1) < 1)  # gpt-oss sinks keep some weight


def test_cache_cost_worked_by_hand() -> None:
    """gptoss_sinks: 4 heads, 2 kv heads, d_k = d_v = 4, float64, 5 tokens."""
    doc = json.loads(invoke("gptoss_sinks", "-f", "json").stdout)
    cost = doc["kv_cache_bytes"]
    assert cost["per_token"] == 2 * 2 * 4 * 8 == 128
    assert (cost["per_token_mha"], cost["per_token_mqa"]) == (256, 64)
    assert (cost["total"], cost["total_mha"], cost["total_mqa"]) == (640, 1280, 320)
    text = invoke("gptoss_sinks", "-f", "plain").stdout
    assert "2 × (4 + 4) × 8 = 128" in text and "1,280" in text
    assert "window 3 the ring buffer keeps only 3 tokens: 384 bytes" in text


def test_plain_output_labels_tokens_and_checks_each_step() -> None:
    result = invoke("causal_multihead", "-f", "plain", "--explain")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "step 3 of 3 · token 'tea' at position 3 → cache slot 3" in text
    assert "0: I@0, 1: like@1, 2: green@2, 3: tea@3" in text
    assert text.count("self-check: max |output − the full attention's row") == 3
    assert "what this step does" in text and "kv_heads × (d_k + d_v) × itemsize" in text


def test_chinese() -> None:
    text = invoke("gptoss_sinks", "-f", "plain", "--lang", "zh", "--explain").stdout
    assert "第 1 步，共 4 步" in text and "环形缓冲区" in text and "每层 KV 缓存开销" in text


def test_json_is_deterministic() -> None:
    assert (
        invoke("llama_rope_gqa", "-f", "json").stdout
        == invoke("llama_rope_gqa", "-f", "json").stdout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["the_cat_sat"], "decoding needs a causal fixture"),
        (["cross_attention"], "decoding needs a causal fixture"),
        (["causal_multihead", "--prefill", "5"], "--prefill: is 5, expected 1 to 4"),
    ],
)
def test_refusals_are_one_line(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]


def test_a_step_that_leaves_the_trace_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from attn_cli.check import runs
    from attn_cli.core.decode import decode_mistakes

    def rerotated(q: Array, k: Array, v: Array, **kw: Any) -> Any:
        return next(m.result for m in decode_mistakes(q, k, v, **kw) if m.name == "rerotate_cache")

    monkeypatch.setattr(runs, "decode", rerotated)
    result = invoke("llama_rope_gqa", "-f", "plain")
    assert result.exit_code == 2
    assert "✗" in result.stdout  # shown, then refused
    assert "the decoded output differs from the full attention's rows by" in result.stderr


def test_mask_sentinel_decodes_with_minus_inf() -> None:
    result = invoke("mask_sentinel", "-f", "plain")
    assert result.exit_code == 0, result.output
    assert "mask_value -10000 replaced by −∞" in result.stdout


def test_step_pages() -> None:
    run = run_decode("gptoss_sinks", 2)
    pages = list(decode_pages(run, RenderOptions()))
    assert len(pages) == len(run.result.steps) + 2  # overview, each step, the checks
    assert len(decode_titles(run, "en")) == len(pages)


# ---------------------------------------------------------------------------------------------
# Every bundled causal example, and softcap (Gemma 2)


def test_the_list_holds_every_bundled_causal_example() -> None:
    causal = sorted(name for name in example_paths() if load(name).causal is not None)
    # (decoded elsewhere, or refused)
    assert causal == sorted([*CAUSAL_EXAMPLES, *GATED, *LATENT, *DIFFERENTIAL, *LINEAR])


@pytest.mark.parametrize("prefill", [1, 3])
@pytest.mark.parametrize("fixture", CAUSAL_EXAMPLES)
def test_every_bundled_causal_example_decodes(fixture: str, prefill: int) -> None:
    result = invoke(fixture, "--prefill", str(prefill), "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc["steps"]) == len(doc["tokens"]) - prefill
    assert doc["max_abs_diff"] <= F64 and all(s["max_abs_diff"] <= F64 for s in doc["steps"])


def test_softcap_caps_each_step_before_the_mask() -> None:
    """gemma2_softcap: capped = 5·tanh(scaled/5) (math.tanh here), then the window's mask."""
    doc = json.loads(invoke("gemma2_softcap", "-f", "json").stdout)
    for step in doc["steps"]:
        stages = step["stages"]
        assert list(stages) == [
            "Q",
            "K_cache",
            "V_cache",
            "scores",
            "scaled",
            "capped",
            "masked",
            "softmax",
            "output",
        ]
        scaled = np.array(stages["scaled"]["data"], dtype=float)  # (H, 1, C)
        capped = np.array(stages["capped"]["data"], dtype=float)
        want = [[[5 * math.tanh(x / 5) for x in row] for row in head] for head in scaled]
        np.testing.assert_allclose(capped, want, rtol=0, atol=F64)
        masked = np.array(stages["masked"]["data"], dtype=float)
        held = np.isfinite(masked)  # the slots the window lets through: exactly capped there
        np.testing.assert_array_equal(masked[held], capped[held])
        assert np.all(np.abs(capped) < 5)
    big = np.array(doc["steps"][0]["stages"]["scaled"]["data"], dtype=float)
    assert np.abs(big).max() > 5  # the example's scores do reach the cap
    text = invoke("gemma2_softcap", "-f", "plain", "--explain").stdout
    assert "capped = softcap × tanh(scaled / softcap)" in text


# ---------------------------------------------------------------------------------------------
# Step mode (--step): the pager of attn trace, one decoding step a page


def screen_text(lines: list[Any]) -> list[str]:
    return ["".join(s.text for s in line).rstrip() for line in lines]


def every_screen(deck: Pages, k: int, width: int, height: int) -> list[list[str]]:
    """Every screen of page ``k`` from the top, one line down at a time, to the end."""
    state = State(k)
    shown = [screen_text(frame(deck, state, width, height))]
    while (after := press(deck, state, "down", width, height)) != state:
        state = after
        shown.append(screen_text(frame(deck, state, width, height)))
    return shown


def check_titles_stay(deck: Pages, width: int = 80, height: int = 24) -> int:
    """On every screen of every page: the pinned "stage k of n  title" line on top, the status
    line at the bottom; returns how many pages had to scroll."""
    n = len(deck.names)
    scrolled = 0
    for k, title in enumerate(deck.names):
        screens = every_screen(deck, k, width, height)
        scrolled += len(screens) > 1
        for screen in screens:
            assert len(screen) == height
            top = " ".join(screen[:3])  # a long title may wrap: it is all pinned
            assert f"stage {k + 1} of {n}" in screen[0] or f"第 {k + 1} 步，共 {n} 步" in screen[0]
            assert " ".join(title.split()) in " ".join(top.split()), (title, screen[:3])
            assert str(n) in screen[-1]
    return scrolled


def decode_deck(fixture: str, lang: str = "en", prefill: int = 1) -> Pages:
    run = run_decode(fixture, prefill)
    options = RenderOptions(explain=True, lang=lang)  # type: ignore[arg-type]
    console = Console(width=80, color_system=None, file=io.StringIO())
    return page_deck(
        decode_pages(run, options), decode_titles(run, options.lang), options.lang, console
    )


@pytest.mark.parametrize(("fixture", "lang"), [("gemma2_softcap", "en"), ("gptoss_sinks", "zh")])
@pytest.mark.slow
def test_every_step_page_keeps_its_title_at_80x24(fixture: str, lang: str) -> None:
    deck = decode_deck(fixture, lang)
    run = run_decode(fixture, 1)
    assert len(deck.names) == len(run.result.steps) + 2
    assert check_titles_stay(deck) >= len(run.result.steps)  # each step's page scrolls


def test_step_titles_name_the_token_position_and_slot() -> None:
    deck = decode_deck("mistral_sliding_window")  # window 3: slot = position mod 3
    assert deck.names[1:-1] == [
        "cat@1 → slot 1",
        "sat@2 → slot 2",
        "on@3 → slot 0",
        "the@4 → slot 1",
        "mat@5 → slot 2",
    ]
    body = screen_text(frame(deck, State(3), 80, 24))
    assert "step 3 of 5 · token 'on' at position 3 → cache slot 0" in body[1]


def test_keys_walk_the_steps() -> None:
    deck = decode_deck("causal_multihead")  # overview, like@1, green@2, tea@3, the checks
    state: State | None = State()
    for key, page in [(b"\r", 1), (b" ", 2), (b"b", 1), (b"5", 4), (b"\x1b[D", 3)]:
        assert state is not None
        state = on_key(deck, state, key, 80, 24)
        assert state is not None and state.k == page, key
    for key in (b"g", b"g", b"r", b"e", b"e", b"n", b"\r"):  # go to a token by name
        assert state is not None
        state = on_key(deck, state, key, 80, 24)
    assert state is not None and deck.names[state.k] == "green@2 → slot 2"
    end = press(deck, State(2), "end", 80, 24)
    assert end.top == last_top(deck.page(2, 80), 24) > 0
    assert on_key(deck, State(2), b"q", 80, 24) is None


@pytest.mark.parametrize(
    "args", [["--step", "-f", "json"], ["--step", "-o", "out.txt"], ["-f", "json", "--step"]]
)
def test_step_is_refused_with_json_or_a_file(args: list[str], tmp_path: Path) -> None:
    result = invoke("causal_multihead", *args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "--step" in lines[0] and "works only in the terminal" in lines[0]
    assert not Path("out.txt").exists()


def test_step_without_a_terminal_says_so() -> None:
    result = invoke("causal_multihead", "--step")
    assert result.exit_code == 2
    assert "standard input is not a terminal" in result.stderr


ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][0-9A-Za-z]|[=>78])")


def step_in_pty(args: list[str], script: list[tuple[bytes, str]], first: str) -> tuple[int, str]:
    """``python -m attn_cli ARGS`` on an 80x24 pty: wait for ``first``, then for each (key,
    pattern) type the key and wait for the pattern; the exit code and the last screen text."""
    import fcntl
    import struct

    from conftest import ROOT, attn_command, clean_env

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        attn_command(*args),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env=clean_env(TERM="xterm"),
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    seen = ""

    def expect(pattern: str) -> None:
        nonlocal seen
        deadline = time.monotonic() + 20
        while (found := re.search(pattern, ANSI.sub("", seen))) is None:
            assert time.monotonic() < deadline, f"{pattern!r} never appeared: {seen[-400:]!r}"
            if select.select([master], [], [], 0.1)[0]:
                seen += os.read(master, 65536).decode("utf-8", "replace")
        seen = ANSI.sub("", seen)[found.end() :]

    try:
        expect(first)
        for key, pattern in script:
            os.write(master, key)
            expect(pattern)
        return proc.wait(timeout=20), seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


@pytest.mark.subprocess
def test_step_in_a_pty() -> None:
    code, _ = step_in_pty(
        ["decode", "causal_multihead", "--step"],
        [
            (b"\r", r"stage 2 of 5\s+like@1 → slot 1"),
            (b"\x1b[C", r"stage 3 of 5\s+green@2"),
            (b"b", r"stage 2 of 5"),
            (b"q", r""),
        ],
        first=r"stage 1 of 5\s+overview and KV-cache cost",
    )
    assert code == 0


# ---------------------------------------------------------------------------------------------
# Grading a decode dump (attn check FIXTURE --against DUMP)


def dump(tmp_path: Path, outputs: list[list[list[float]]], prefill: int, **extra: Any) -> Path:
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"decode_output": outputs[prefill:], "prefill": prefill, **extra}))
    return path


def grade(fixture: str, path: Path) -> Any:
    outcome = check_fixture(fixture, against=path, tolerance=GRADER_TOLERANCE)
    assert outcome.comparison is not None
    return outcome.comparison


def test_a_right_decode_loop_passes(tmp_path: Path) -> None:
    c = grade(
        "mistral_sliding_window", dump(tmp_path, naive_decode(load("mistral_sliding_window")), 2)
    )
    assert c.same, c.stages
    assert c.stages[0].name == "decode output" and c.stages[0].cells == 4 * 2 * 4
    capped = grade("gemma2_softcap", dump(tmp_path, naive_decode(load("gemma2_softcap")), 1))
    assert capped.same, capped.stages
    uncapped = naive_decode(load("gemma2_softcap").with_setting("softcap", None))
    assert not grade("gemma2_softcap", dump(tmp_path, uncapped, 1)).same


@pytest.mark.parametrize(
    ("fixture", "bug", "name"),
    [
        ("llama_rope_gqa", "rerotate", "rerotate_cache"),
        ("llama_rope_gqa", "head_tiled", "cache_by_query_head"),
        ("mistral_sliding_window", "ring_plus_one", "ring_buffer_off_by_one"),
        ("gemma2_softcap", "ring_plus_one", "ring_buffer_off_by_one"),  # capped, window 4
        ("causal_multihead", "before_append", "attend_before_append"),
        ("llama_rope_gqa", "before_append", "attend_before_append"),
        ("mistral_sliding_window", "before_append", "attend_before_append"),  # a ring
        ("gemma2_softcap", "before_append", "attend_before_append"),
    ],
)
def test_decode_mistakes_are_named(tmp_path: Path, fixture: str, bug: str, name: str) -> None:
    c = grade(fixture, dump(tmp_path, naive_decode(load(fixture), bug), 1))
    assert not c.same
    assert [d.name for d in c.diagnoses] == [name]


@pytest.mark.parametrize(
    ("lang", "said"),
    [
        ("en", "attended to the cache before appending the step's own key and value"),
        ("zh", "先注意力、后写入缓存"),
    ],
)
def test_attend_before_append_is_said_with_its_fix(tmp_path: Path, lang: str, said: str) -> None:
    path = dump(tmp_path, naive_decode(load("causal_multihead"), "before_append"), 1)
    run = run_cli(
        "check", "causal_multihead", "--against", str(path), "--lang", lang, "--format", "plain"
    )
    assert run.exit_code == 1, run.stderr
    text = " ".join(run.stdout.split())
    assert said in text
    fix = "修正：先把这一步的 k、v 写入缓存" if lang == "zh" else "Fix: append the step's key"
    assert fix in text


def test_an_unknown_difference_names_nothing(tmp_path: Path) -> None:
    outputs = naive_decode(load("llama_rope_gqa"))
    outputs[3][1][0] += 0.5
    c = grade("llama_rope_gqa", dump(tmp_path, outputs, 1))
    assert not c.same and c.diagnoses == () and c.tried


def test_our_own_json_grades_as_the_same(tmp_path: Path) -> None:
    path = tmp_path / "ours.json"
    path.write_text(invoke("gptoss_sinks", "-f", "json", "--prefill", "3").stdout)
    c = grade("gptoss_sinks", path)
    assert c.same and [s.name for s in c.stages] == ["decode output", "K_cache", "V_cache"]


def test_a_cache_sized_by_heads_is_named(tmp_path: Path) -> None:
    doc = json.loads(invoke("llama_rope_gqa", "-f", "json").stdout)
    K = np.array(doc["steps"][-1]["stages"]["K_cache"]["data"])  # (Hkv, C, D)
    outputs = naive_decode(load("llama_rope_gqa"))
    path = dump(tmp_path, outputs, 1, K_cache=np.repeat(K, 2, axis=0).tolist())
    c = grade("llama_rope_gqa", path)
    assert [d.name for d in c.diagnoses] == ["cache_sized_by_heads"]
