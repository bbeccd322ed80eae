"""The variant seam, proved from outside: a variant defined and registered here, in the test file,
flows through ``attn trace`` (tables, JSON, npz), the backward pass, KV-cache decoding and
FlashAttention tiles without an edit to any package module (issue 21).

The variant is Llama 4's chunked attention (HF ``attention_chunk_size``; transformers'
``masking_utils.chunked_overlay``: a query sees the keys of its own chunk,
``kv_idx // chunk == q_idx // chunk``, combined with the causal mask). Its independent source:
the same fixture with that rule written out as an explicit boolean ``mask`` by the loops below,
traced by the loop-based reference (tests/reference.py), which knows nothing of plug-ins.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml
from conftest import FIXTURES, run_cli
from reference import random_fixture, reference

import attn_cli.core.chain  # noqa: F401 (the variants attn ships, registered first)
from attn_cli.core.inputs import Inputs
from attn_cli.core.pipeline import run, run_streamed
from attn_cli.core.variant import BoolArray, Cells, Variant, before, register, unregister
from attn_cli.io.arrays import npz_writer
from attn_cli.io.fixture import validate
from attn_cli.io.trace_json import write_trace_json
from attn_cli.present import variant_texts as texts
from attn_cli.present.variant_texts import VariantTexts

CHUNK = 3
F64 = 1e-12


class ChunkedAttention(Variant):
    """Llama 4: attention within chunks of ``attention_chunk_size`` positions."""

    name = "attention_chunk_size"

    def parse(self, raw: Any, error: Callable[[str, str], Exception]) -> Any:
        if type(raw) is not int or raw < 1:
            raise error(f"got {raw!r}", "a whole number >= 1")
        return raw

    def allowed(self, value: Any, inputs: Inputs, cells: Cells) -> BoolArray:
        chunk_q = cells.pos_q[None, None, :, None] // value  # (1, 1, R, 1)
        chunk_k = cells.pos_k[None, None, None, :] // value  # (1, 1, 1, S)
        allowed: BoolArray = chunk_q == chunk_k
        return allowed

    def hides(self, value: Any) -> str:
        return f"chunks of {value}"


@pytest.fixture(autouse=True)
def chunked() -> Iterator[None]:
    register(ChunkedAttention())
    yield
    unregister("attention_chunk_size")


def chunk_mask(T: int, chunk: int) -> list[list[bool]]:
    """The rule as a loop: query i sees key j when both sit in the same chunk."""
    return [[i // chunk == j // chunk for j in range(T)] for i in range(T)]


def fixtures(seed: int = 7, T: int = 7) -> tuple[dict[str, Any], dict[str, Any]]:
    """(with the plug-in's key, with the same rule as an explicit mask); causal, 2 heads, GQA."""
    fx = random_fixture(seed, seq=T, d_model=8, heads=2, kv_heads=1, d_k=4, W_O=True, causal=True)
    return {**fx, "attention_chunk_size": CHUNK}, {**fx, "mask": chunk_mask(T, CHUNK)}


def test_the_plugged_rule_matches_the_loop_reference_with_an_explicit_mask() -> None:
    plugged, explicit = fixtures()
    trace = run(validate(plugged, "plugged"))
    want = reference(explicit)
    for name in ("scores", "scaled", "masked", "softmax", "output", "concat", "projected"):
        if name in trace and name in want:
            np.testing.assert_allclose(trace[name].data, want[name], rtol=F64, atol=F64)
    assert "chunks of 3" in trace["masked"].formula  # the variant names itself in the formula


def test_attn_trace_reads_the_key_and_shows_it(tmp_path: Path) -> None:
    plugged, _ = fixtures()
    path = tmp_path / "chunked.json"
    path.write_text(json.dumps(plugged))
    result = run_cli("trace", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    want = reference(fixtures()[1])
    np.testing.assert_allclose(doc["stages"]["softmax"]["data"], want["softmax"], rtol=F64)
    assert "chunks of 3" in doc["stages"]["masked"]["formula"]
    table = run_cli("trace", str(path), "--stage", "masked", "--format", "plain")
    assert table.exit_code == 0 and "chunks of 3" in table.stdout


def test_a_bad_setting_is_one_line_naming_the_key(tmp_path: Path) -> None:
    plugged, _ = fixtures()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**plugged, "attention_chunk_size": 0}))
    result = run_cli("trace", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}: attention_chunk_size: got 0, expected a ")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("command", ["trace", "decode", "flash"])
def test_under_linear_attention_the_rule_is_refused_naming_both(
    tmp_path: Path, command: str
) -> None:
    """Linear attention has no scores for the rule to hide: before, the chunks were ignored (the
    plain trace's numbers, exit 0), a silent wrong answer. The variants' declarations refuse it."""
    fixture = yaml.safe_load((FIXTURES / "linear_attention.yaml").read_text())
    path = tmp_path / "linear_chunked.json"
    path.write_text(json.dumps({**fixture, "attention_chunk_size": CHUNK}))
    result = run_cli(command, str(path))
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"Error: {path}: attention_chunk_size: given with linear_attention, expected "
        "linear_attention without attention_chunk_size (it has no softmax scores to change)\n"
    )


def test_json_and_npz_streams_hold_the_traced_numbers() -> None:
    inputs = validate(fixtures()[0], "plugged")
    held = run(inputs)
    text = io.StringIO()
    write_trace_json(run_streamed(inputs), text)
    stages = json.loads(text.getvalue())["stages"]
    buf = io.BytesIO()
    npz_writer(run_streamed(inputs))(buf)
    with np.load(io.BytesIO(buf.getvalue())) as z:
        for stage in held:
            np.testing.assert_array_equal(z[stage.name], stage.data)
            assert stages[stage.name]["formula"] == stage.formula
    np.testing.assert_array_equal(np.array(stages["masked"]["data"], float), held["masked"].data)


def test_the_backward_pass_hides_the_same_keys_as_an_explicit_mask() -> None:
    plugged, explicit = fixtures()
    mine = run(validate(plugged, "plugged"), backward=True)
    theirs = run(validate(explicit, "explicit"), backward=True)
    grads = [s.name for s in theirs if s.name.startswith("d_")]
    assert "d_masked" in grads and "d_Q" in grads
    for name in grads:
        np.testing.assert_allclose(mine[name].data, theirs[name].data, rtol=F64, atol=F64)
    allowed = np.array(chunk_mask(7, CHUNK)) & np.tri(7, dtype=bool)
    assert np.all(mine["d_masked"].data[:, ~allowed] == 0)  # no gradient into a hidden key


def test_decoding_and_flash_hide_the_same_keys(tmp_path: Path) -> None:
    from attn_cli.check.runs import run_decode, run_flash

    plugged, explicit = fixtures()
    path = tmp_path / "chunked.json"
    path.write_text(json.dumps(plugged))
    want = reference(explicit)["output"]  # (H, T, Dv), the loops with the explicit mask
    decoded = run_decode(str(path), prefill=2)
    assert decoded.ok, decoded.worst
    np.testing.assert_allclose(decoded.result.prefill_output[0], want[:, :2], rtol=F64, atol=F64)
    for step in decoded.result.steps:
        np.testing.assert_allclose(step.output[0, :, 0], want[:, step.index], rtol=F64, atol=F64)
    flash = run_flash(str(path), block_q=2, block_k=3)
    assert flash.ok
    np.testing.assert_allclose(flash.output[0], want, rtol=F64, atol=F64)


# ---------------------------------------------------------------------------------------------
# A Q/K transform with a stage of its own, registered here: Llama 4's attention temperature
# (HF ``Llama4TextAttention``: ``query_states * (log1p(floor((cache_position + 1) /
# floor_scale)) * attn_scale + 1)``), after RoPE. Its independent source: the loops below, from
# the loop reference's Q_rot and K_rot (tests/reference.py) to the projected output.

TEMP = {"floor_scale": 2, "attn_scale": 0.5}


def temperature(position: int, floor_scale: float, attn_scale: float) -> float:
    """The query's factor at one position, as HF's line writes it."""
    return float(np.log1p(np.floor((position + 1.0) / floor_scale)) * attn_scale + 1.0)


class AttentionTemperature(Variant):
    """Llama 4: each query scaled by a factor that grows with its position, after RoPE."""

    name = "attn_temperature"
    suffix = "temp"  # its stage: Q_temp, and d_Q_temp
    transforms = ("Q",)
    positional = True
    key_order = 90

    def parse(self, raw: Any, key: Any) -> Any:
        if not isinstance(raw, dict) or set(raw) != {"floor_scale", "attn_scale"}:
            raise key(f"got {raw!r}", "a mapping {floor_scale, attn_scale}")
        return {k: float(v) for k, v in raw.items()}

    def factors(self, value: Any, positions: Any, dtype: Any) -> Any:
        pos = np.asarray(positions, dtype=np.float64)  # (n,)
        scales = np.log1p(np.floor((pos + 1.0) / value["floor_scale"])) * value["attn_scale"] + 1
        return scales.astype(dtype)[:, None]  # (n, 1)

    def transform(self, value: Any, at: Any, x: Any) -> Any:
        return x * self.factors(value, at.positions, x.dtype)  # (B, H, n, D)

    def grad_transform(self, value: Any, at: Any, d_out: Any, x_in: Any) -> Any:
        return d_out * self.factors(value, at.positions, d_out.dtype)  # (B, H, n, D)

    def stage_formula(self, value: Any, inputs: Inputs, stage: str) -> str:
        return f"Q_temp = {before(inputs, stage)} × (log1p(⌊(position + 1) / floor_scale⌋) × …)"

    def grad_formula(self, value: Any, inputs: Inputs, d_out: str, x_in: str) -> str:
        return f"{d_out} × the query's temperature"


@pytest.fixture
def tempered() -> Iterator[None]:
    register(AttentionTemperature())
    yield
    unregister("attn_temperature")


def temp_fixture(seed: int = 5, T: int = 6) -> dict[str, Any]:
    """Causal, RoPE, 2 query heads sharing 1 key/value head, W_O; the temperature on."""
    fx = random_fixture(
        seed, seq=T, d_model=8, heads=2, kv_heads=1, d_k=4, W_O=True, causal=True, rope=True
    )
    return {**fx, "attn_temperature": TEMP}


def loop_forward(fx: dict[str, Any]) -> dict[str, Any]:
    """Q_temp, softmax, output and projected by loops, from the reference's Q_rot, K_rot, V."""
    ref = reference({k: v for k, v in fx.items() if k != "attn_temperature"})
    q_rot, k_rot, v, W_O = ref["Q_rot"], ref["K_rot"], ref["V"], np.array(fx["W_O"])
    H, T, D = q_rot.shape
    q = np.zeros_like(q_rot)
    P = np.zeros((H, T, T))
    out = np.zeros((H, T, v.shape[-1]))
    for h in range(H):
        for t in range(T):
            q[h, t] = q_rot[h, t] * temperature(t, **TEMP)
            logits = [
                sum(q[h, t, d] * k_rot[0, s, d] for d in range(D)) / D**0.5 for s in range(t + 1)
            ]
            top = max(logits)
            e = [np.exp(x - top) for x in logits]
            for s in range(t + 1):
                P[h, t, s] = e[s] / sum(e)
                out[h, t] += P[h, t, s] * v[0, s]
    concat = np.concatenate(list(out), axis=-1)  # (T, H*Dv)
    return {"Q_temp": q, "softmax": P, "output": out, "projected": concat @ W_O, "K_rot": k_rot}


@pytest.mark.usefixtures("tempered")
def test_a_q_transform_has_its_stage_in_the_trace_and_matches_the_loops() -> None:
    fx = temp_fixture()
    trace = run(validate(fx, "tempered"))
    want = loop_forward(fx)
    names = [s.name for s in trace]
    assert names.index("Q_rot") < names.index("Q_temp") < names.index("scores")
    assert "K_temp" not in names  # it transforms the queries only
    assert trace["scores"].formula == "scores = Q_temp·K_rotᵀ"
    assert trace["Q_temp"].formula.startswith("Q_temp = Q_rot × ")
    for name in ("Q_temp", "softmax", "output", "projected"):
        np.testing.assert_allclose(trace[name].data, want[name], rtol=F64, atol=F64)


@pytest.mark.usefixtures("tempered")
def test_attn_trace_shows_the_transform_stage_in_tables_json_and_npz(tmp_path: Path) -> None:
    fx = temp_fixture()
    path = tmp_path / "tempered.json"
    path.write_text(json.dumps(fx))
    want = loop_forward(fx)
    result = run_cli("trace", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    np.testing.assert_allclose(doc["stages"]["Q_temp"]["data"], want["Q_temp"], rtol=F64)
    table = run_cli("trace", str(path), "--stage", "Q_temp", "--format", "plain")
    assert table.exit_code == 0, table.output
    assert "Q_temp" in table.stdout and "Q_rot" in table.stdout  # the stage, and its formula
    buf = io.BytesIO()
    npz_writer(run_streamed(validate(fx, "tempered")))(buf)
    with np.load(io.BytesIO(buf.getvalue())) as z:
        np.testing.assert_allclose(z["Q_temp"], want["Q_temp"], rtol=F64, atol=F64)


def loop_loss(fx: dict[str, Any]) -> float:
    """L = Σ projected (the trace's loss without a ``grad``), by the loops."""
    return float(loop_forward(fx)["projected"].sum())


@pytest.mark.usefixtures("tempered")
def test_the_backward_pass_carries_the_gradient_through_the_transform() -> None:
    fx = temp_fixture()
    trace = run(validate(fx, "tempered"), backward=True)
    names = [s.name for s in trace]
    assert names.index("d_scores") < names.index("d_Q_temp") < names.index("d_Q_rot")
    # d_Q_temp = d_scores·K_rot (summed over keys); d_Q_rot = the factor × d_Q_temp
    d_scores, k_rot = trace["d_scores"].data, loop_forward(fx)["K_rot"]
    H, T, _ = d_scores.shape
    for h in range(H):
        for t in range(T):
            d_temp = sum(d_scores[h, t, s] * k_rot[0, s] for s in range(T))
            np.testing.assert_allclose(trace["d_Q_temp"].data[h, t], d_temp, rtol=1e-10, atol=1e-12)
            d_rot = d_temp * temperature(t, **TEMP)
            np.testing.assert_allclose(trace["d_Q_rot"].data[h, t], d_rot, rtol=1e-10, atol=1e-12)
    # and d_X against finite differences of the loops' loss
    X, step = np.array(fx["X"], dtype=float), 1e-6
    for index in [(0, 0), (2, 3), (5, 7)]:
        plus, minus = X.copy(), X.copy()
        plus[index] += step
        minus[index] -= step
        numeric = loop_loss({**fx, "X": plus.tolist()}) - loop_loss({**fx, "X": minus.tolist()})
        np.testing.assert_allclose(
            trace["d_X"].data[index], numeric / (2 * step), rtol=1e-6, atol=1e-8
        )


@pytest.mark.usefixtures("tempered")
def test_decoding_and_flash_apply_the_transform(tmp_path: Path) -> None:
    from attn_cli.check.runs import run_decode, run_flash

    fx = temp_fixture()
    path = tmp_path / "tempered.json"
    path.write_text(json.dumps(fx))
    want = loop_forward(fx)["output"]  # (H, T, Dv)
    decoded = run_decode(str(path), prefill=2)
    assert decoded.ok, decoded.worst
    np.testing.assert_allclose(decoded.result.prefill_output[0], want[:, :2], rtol=F64, atol=F64)
    for step in decoded.result.steps:
        np.testing.assert_allclose(step.output[0, :, 0], want[:, step.index], rtol=F64, atol=F64)
    flash = run_flash(str(path), block_q=2, block_k=2)
    assert flash.ok
    np.testing.assert_allclose(flash.output[0], want, rtol=F64, atol=F64)


def test_the_stage_table_imported_before_registering_has_the_new_rows() -> None:
    from attn_cli.core.stages import SPECS, STAGE_NAMES  # as a module imported them at start

    assert "Q_temp" not in STAGE_NAMES
    register(AttentionTemperature())
    try:
        names = list(STAGE_NAMES)
        assert names.index("K_rot") < names.index("Q_temp") < names.index("scores")
        assert names.index("d_scores") < names.index("d_Q_temp") < names.index("d_Q_rot")
        # the transforms before it, the last first: the norm after RoPE, RoPE, the q/k
        # LayerNorm, QK-norm
        before = ("Q_postnorm", "Q_rot", "Q_ln", "Q_norm")
        assert SPECS["d_Q_temp"].gradient and SPECS["Q_temp"].needs[:4] == before
    finally:
        unregister("attn_temperature")
    assert "Q_temp" not in STAGE_NAMES and "d_Q_temp" not in SPECS


class TemperatureTexts(VariantTexts):
    """What present/ says about the temperature: its explanation, in English and Chinese."""

    name = "attn_temperature"

    @staticmethod
    def _explain(c: Any) -> Any:
        meaning = {
            "en": "Llama 4 scales each query by a temperature that grows with its position, "
            "so that far tokens keep sharp attention on long contexts.",
            "zh": "Llama 4 用随位置增大的温度缩放每个查询，让长上下文里远处的词的注意力保持集中。",
        }
        return (c.trace[c.name].formula,), (c.shape_of("Q_rot"),), [meaning[c.lang]]

    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {"Q_temp": _explain}


@pytest.mark.usefixtures("tempered")
@pytest.mark.parametrize(
    ("lang", "said"),
    [("en", "temperature that grows with its position"), ("zh", "随位置增大的温度")],
)
def test_the_transform_explains_itself_in_both_languages(
    tmp_path: Path, lang: str, said: str
) -> None:
    path = tmp_path / "tempered.json"
    path.write_text(json.dumps(temp_fixture()))
    before = run_cli("trace", str(path), "--stage", "Q_temp", "--explain", "-f", "plain")
    assert before.exit_code == 0, before.output  # no text registered: said so, no traceback
    assert "No explanation is registered for this stage" in before.stdout
    texts.register(TemperatureTexts())
    try:
        result = run_cli(
            "trace", str(path), "--stage", "Q_temp", "--explain", "--lang", lang, "-f", "plain"
        )
    finally:
        del texts.TEXTS["attn_temperature"]
    assert result.exit_code == 0, result.output
    assert said in result.stdout.replace("\n", "")


def test_the_documented_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/python.md's "Your own kind of attention" block, executed: a variant from outside."""
    page = Path(__file__).parents[2] / "docs" / "python.md"
    readme = page.read_text(encoding="utf-8")
    section = readme.split("## Your own kind of attention", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    plugged, explicit = fixtures()
    (tmp_path / "my_chunked.yaml").write_text(json.dumps(plugged))  # JSON is YAML
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/python.md", "exec"), scope)  # the page's own code, as a user runs it
    trace = scope["trace"]
    assert "chunks of 3" in trace["masked"].formula
    np.testing.assert_allclose(trace["softmax"].data, reference(explicit)["softmax"], rtol=F64)
