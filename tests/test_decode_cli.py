"""``attn decode`` and the grading of decode dumps, against references written here.

The reference is a naive decode loop in plain Python (math.exp, sums over lists): at every step
it recomputes the new token's attention from scratch over the keys it may see, with its own
RoPE (both layouts), RMSNorm, window and sinks. Q, K, V come from the fixture's own X and W
through NumPy's matmul. Ring-buffer contents and cache costs are worked by hand.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from attn_cli.api import load
from attn_cli.check.compare import GRADER_TOLERANCE
from attn_cli.check.grade_decode import run_decode
from attn_cli.check.run import check_fixture
from attn_cli.cli.app import user_errors
from attn_cli.cli.decode import decode
from attn_cli.cli.usage import AttnCommand, AttnGroup
from attn_cli.core.inputs import Inputs
from attn_cli.present.decode_view import decode_pages
from attn_cli.present.options import RenderOptions

Array = np.ndarray[Any, Any]
F64 = 1e-12
VARIANTS = [  # causal bundled examples the decode loop runs (softcap is refused)
    "causal_multihead", "llama_rope_gqa", "llama_rope_interleaved", "mistral_sliding_window",
    "gptoss_sinks", "qwen3_qk_norm",
]  # fmt: skip


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


def rope_vec(x: list[float], pos: int, base: float, dims: int, layout: str) -> list[float]:
    """RoPE of one vector at one position: pair i turns by pos · base^(−2i/dims)."""
    out = list(x)
    for i, (a, b) in enumerate(rope_pairs(dims, layout)):
        angle = pos * base ** (-2 * i / dims)
        c, s = math.cos(angle), math.sin(angle)
        out[a], out[b] = x[a] * c - x[b] * s, x[b] * c + x[a] * s
    return out


def rms(x: list[float], w: Array, eps: float) -> list[float]:
    r = math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v / r * float(wi) for v, wi in zip(x, w, strict=True)]


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
    "head_tiled" reads kv head h mod Hkv; "ring_plus_one" keeps window + 1 keys.
    """
    q, k, v = heads_of(inp)
    H, T, D = q.shape
    Hkv = k.shape[0]
    scale = inp.scale if inp.scale is not None else 1 / math.sqrt(D)
    outs = []
    for t in range(T):
        per_head = []
        for h in range(H):
            g = h % Hkv if bug == "head_tiled" else h // (H // Hkv)
            qv = [float(x) for x in q[h, t]]
            if inp.qk_norm is not None:
                qv = rms(qv, inp.qk_norm.q_weight, inp.qk_norm.eps)
            if inp.rope is not None:
                qv = rope_vec(qv, t, inp.rope.base, inp.rope.dims, inp.rope.layout)
            keep = t + 1 if inp.window is None else inp.window + (bug == "ring_plus_one")
            js = [j for j in range(t + 1) if t - j < keep]
            logits = []
            for j in js:
                kv = [float(x) for x in k[g, j]]
                if inp.qk_norm is not None:
                    kv = rms(kv, inp.qk_norm.k_weight, inp.qk_norm.eps)
                if inp.rope is not None:
                    turns = 1 + (max(0, t - max(j, 0)) if bug == "rerotate" and t > 0 else 0)
                    for _ in range(turns):
                        kv = rope_vec(kv, j, inp.rope.base, inp.rope.dims, inp.rope.layout)
                logits.append(sum(a * b for a, b in zip(qv, kv, strict=True)) * scale)
            sink = [] if inp.sinks is None else [float(inp.sinks[h])]
            top = max(logits + sink)
            total = sum(math.exp(x - top) for x in logits + sink)
            w = [math.exp(x - top) / total for x in logits]
            per_head.append([sum(wj * float(v[g, j, e]) for wj, j in zip(w, js, strict=True))
                             for e in range(v.shape[2])])  # fmt: skip
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
        [0, 1, -1], [0, 1, 2], [3, 1, 2], [3, 4, 2], [3, 4, 5],
    ]  # fmt: skip
    first = doc["steps"][0]["stages"]
    assert first["K_cache"]["shape"] == [1, 3, 4]  # kv_heads, window slots, d_k
    assert first["masked"]["data"][0][0][2] == "-inf"  # the empty slot, as the trace writes −∞


def test_stages_and_layouts() -> None:
    doc = json.loads(invoke("gptoss_sinks", "-f", "json").stdout)
    stages = doc["steps"][0]["stages"]
    assert list(stages) == ["Q", "Q_rot", "K_cache", "V_cache", "scores", "scaled", "masked",
                            "softmax", "output"]  # fmt: skip
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
    assert text.count("self-check: max |output − attn trace's row") == 3
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
        (["gemma2_softcap"], "does not apply softcapping"),
        (["causal_multihead", "--prefill", "5"], "--prefill: is 5, expected 1 to 4"),
    ],
)
def test_refusals_are_one_line(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]


def test_a_step_that_leaves_the_trace_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from attn_cli.check import grade_decode
    from attn_cli.core.decode import decode_mistakes

    def rerotated(q: Array, k: Array, v: Array, **kw: Any) -> Any:
        return next(m.result for m in decode_mistakes(q, k, v, **kw) if m.name == "rerotate_cache")

    monkeypatch.setattr(grade_decode, "decode", rerotated)
    result = invoke("llama_rope_gqa", "-f", "plain")
    assert result.exit_code == 2
    assert "✗" in result.stdout  # shown, then refused
    assert "the decoded output differs from the full trace's by" in result.stderr


def test_mask_sentinel_decodes_with_minus_inf() -> None:
    result = invoke("mask_sentinel", "-f", "plain")
    assert result.exit_code == 0, result.output
    assert "mask_value -10000 replaced by −∞" in result.stdout


def test_step_pages() -> None:
    run = run_decode("gptoss_sinks", 2)
    pages = list(decode_pages(run, RenderOptions()))
    assert len(pages) == len(run.result.steps) + 2  # overview, each step, the checks


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


@pytest.mark.parametrize(
    ("fixture", "bug", "name"),
    [
        ("llama_rope_gqa", "rerotate", "rerotate_cache"),
        ("llama_rope_gqa", "head_tiled", "cache_by_query_head"),
        ("mistral_sliding_window", "ring_plus_one", "ring_buffer_off_by_one"),
    ],
)
def test_decode_mistakes_are_named(tmp_path: Path, fixture: str, bug: str, name: str) -> None:
    c = grade(fixture, dump(tmp_path, naive_decode(load(fixture), bug), 1))
    assert not c.same
    assert [d.name for d in c.diagnoses] == [name]


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
