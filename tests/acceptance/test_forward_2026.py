"""The 2026 flagships' shapes (issue 41): tiny checkpoints saved by transformers 5.25
(tests/reference/forward_2026.py, its brief forward_2026.md), imported at two deep layers from
their text. X must be the residual stream entering the layer, the traced softmax transformers'
eager attention weights and ``projected`` the attention module's output, at rtol 1e-4, atol 1e-5.
A case attn does not read yet is listed as refused: it must fail in one line (exit 2), so that a
family that starts importing has to move to the checked list."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from attn_cli.core import forward as fw
from attn_cli.core.pipeline import run
from attn_cli.io.fixture import load_fixture

REFERENCE = Path(__file__).parent.parent / "reference" / "forward_2026"
# the same families in another shape: seed, text, 5 layers, a second value of their keys
# (tests/reference/forward_2026_alt.py): its deep layers are 3 and 4
ALT = REFERENCE.parent / "forward_2026_alt"
CASES = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir())
LAYERS = (2, 3)
RTOL, ATOL = 1e-4, 1e-5
CHECKED = (
    *("seed_oss", "apertus", "glm4_moe", "ernie4_5_moe"),
    *("phi3", "smollm3", "cohere2", "gptj", "ministral3", "olmo_clip", "llama4_text"),
    "stablelm",
    "hunyuan_v1_dense",
)
REFUSED: tuple[str, ...] = ()
MODELS = importlib.util.find_spec("safetensors") and importlib.util.find_spec("tokenizers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not MODELS, reason="attn import --text needs the models extra"),
]


def _ref(case: str, reference: Path = REFERENCE) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((reference / case / "reference.json").read_text())
    return data


def test_every_case_is_checked_or_refused() -> None:
    assert sorted((*CHECKED, *REFUSED)) == CASES
    assert not set(CHECKED) & set(REFUSED)


def layer_errors(
    case: str, layer: int, tmp_path: Path, reference: Path = REFERENCE
) -> dict[str, float]:
    """Import ``case``'s ``layer`` from its text and compare; the largest errors, by what."""
    ref = _ref(case, reference)
    deep = ref["deep"][str(layer)]
    out = tmp_path / f"{case}_{layer}.npz"
    result = run_cli(
        "import",
        str(reference / case),
        "--layer",
        str(layer),
        "--text",
        ref["text"],
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    fixture = load_fixture(out)
    trace = run(fixture)
    # X is the layer's input after its norm: the same import from transformers' hidden states
    # (the residual stream entering the layer) gives the X the walk through layers 0..L-1 must
    hidden = tmp_path / f"{case}_{layer}_hidden.npy"
    np.save(hidden, np.asarray(deep["hidden"], dtype=np.float32))
    expected_x = tmp_path / f"{case}_{layer}_hidden.npz"
    args = ("--layer", str(layer), "--hidden", str(hidden), "-o", str(expected_x))
    result = run_cli("import", str(reference / case), *args)
    assert result.exit_code == 0, result.stderr
    pairs = {
        "X": (fixture.X, load_fixture(expected_x).X),
        "softmax": (trace["softmax"].data, deep["attentions"]),
        "projected": (trace["projected"].data, deep["attn_output"]),
    }
    errors = {}
    for what, (actual, expected) in pairs.items():
        want = np.asarray(expected, dtype=np.float64)
        got = np.asarray(actual, dtype=np.float64).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{case} {what}")
        errors[what] = float(np.abs(got - want).max())
    return errors


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("case", CHECKED)
def test_a_deep_layer_matches_transformers(case: str, layer: int, tmp_path: Path) -> None:
    layer_errors(case, layer, tmp_path)


@pytest.mark.parametrize("layer", (3, 4))
@pytest.mark.parametrize("case", CHECKED)
def test_a_deep_layer_in_another_shape_matches_transformers(
    case: str, layer: int, tmp_path: Path
) -> None:
    assert sorted(p.name for p in ALT.iterdir() if p.is_dir()) == CASES
    layer_errors(case, layer, tmp_path, ALT)


@pytest.mark.parametrize("case", REFUSED)
def test_a_family_attn_does_not_read_yet_is_refused(case: str, tmp_path: Path) -> None:
    ref = _ref(case)
    out = tmp_path / "out.npz"
    args = ("--layer", "2", "--text", ref["text"], "-o", str(out))
    result = run_cli("import", str(REFERENCE / case), *args)
    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


# A new family's new keys, each set to what the checkpoint cannot be: refused in one line
HOSTILE: dict[
    str, tuple[str, dict[str, Any], str]
] = {  # id: (case, key, value) -> a word of the line
    "seed_oss attention_out_bias on, no o_proj.bias": (
        "seed_oss",
        {"attention_out_bias": True},
        "o_proj.bias",
    ),
    "seed_oss attention_out_bias not a bool": (
        "seed_oss",
        {"attention_out_bias": "yes"},
        "attention_out_bias",
    ),
    "xielu where the block has no learned activation": (
        "seed_oss",
        {"hidden_act": "xielu"},
        "hidden_act",
    ),
    "apertus hidden_act no activation attn computes": (
        "apertus",
        {"hidden_act": "xielu_cuda"},
        "hidden_act",
    ),
    "glm4_moe use_qk_norm not a bool": ("glm4_moe", {"use_qk_norm": "yes"}, "use_qk_norm"),
    "glm4_moe use_qk_norm off, q_norm saved": ("glm4_moe", {"use_qk_norm": False}, "norm.weight"),
    "glm4_moe n_group not dividing the experts": ("glm4_moe", {"n_group": 3}, "n_group"),
    "glm4_moe first_k_dense_replace negative": (
        "glm4_moe",
        {"first_k_dense_replace": -1},
        "first_k_dense_replace",
    ),
    "glm4_moe routed_scaling_factor not a number": (
        "glm4_moe",
        {"routed_scaling_factor": "2.5"},
        "routed_scaling_factor",
    ),
    "glm4_moe odd rotated dims": (
        "glm4_moe",
        {"rope_parameters.partial_rotary_factor": 0.375},
        "partial_rotary_factor",
    ),
    "ernie4_5_moe use_bias on": ("ernie4_5_moe", {"use_bias": True}, "use_bias"),
    "ernie4_5_moe moe_layer_interval 0": (
        "ernie4_5_moe",
        {"moe_layer_interval": 0},
        "moe_layer_interval",
    ),
    "ernie4_5_moe moe_norm_min not a number": (
        "ernie4_5_moe",
        {"moe_norm_min": "1e-12"},
        "moe_norm_min",
    ),
    "ernie4_5_moe moe_k zero": ("ernie4_5_moe", {"moe_k": 0}, "moe_k"),
    "ernie4_5_moe moe_layer_end_index -2": (
        "ernie4_5_moe",
        {"moe_layer_end_index": -2},
        "moe_layer_end_index",
    ),
    "apertus llama3 factor not a number": (
        "apertus",
        {"rope_parameters.factor": "8"},
        "factor",
    ),
}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_config_is_refused_in_one_line(hostile: str, tmp_path: Path) -> None:
    case, changes, word = HOSTILE[hostile]
    folder = tmp_path / case
    shutil.copytree(REFERENCE / case, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        keys = key.split(".")
        where = config
        for part in keys[:-1]:
            where = where[part]
        where[keys[-1]] = value
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.npz"
    result = run_cli("import", str(folder), "--layer", "2", "--text", "a b c", "-o", str(out))
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert word in lines[0]
    assert not out.exists()


# Keys transformers never reads: changed, the numbers stay the same and the note names them
INERT_CHANGES: dict[str, tuple[str, dict[str, Any]]] = {
    "apertus qk_norm false": ("apertus", {"qk_norm": False}),
    "seed_oss pretraining_tp 4": ("seed_oss", {"pretraining_tp": 4}),
    "glm4_moe num_nextn_predict_layers 3": ("glm4_moe", {"num_nextn_predict_layers": 3}),
    "ernie4_5_moe moe_use_aux_free false": ("ernie4_5_moe", {"moe_use_aux_free": False}),
    "hunyuan_v1_dense use_qk_norm false, use_cla true, attention_head_dim 4": (
        "hunyuan_v1_dense",
        {"use_qk_norm": False, "use_cla": True, "attention_head_dim": 4},
    ),
}


@pytest.mark.parametrize("change", INERT_CHANGES)
def test_an_inert_key_changes_nothing_and_is_named(change: str, tmp_path: Path) -> None:
    case, changes = INERT_CHANGES[change]
    folder = tmp_path / case
    shutil.copytree(REFERENCE / case, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    ref = _ref(case)
    outs: list[Any] = []
    for where in (REFERENCE / case, folder):
        out = tmp_path / f"{len(outs)}.npz"
        args = ("--layer", "2", "--text", ref["text"], "-o", str(out))
        result = run_cli("import", str(where), *args)
        assert result.exit_code == 0, result.stderr
        (note,) = [n for n in result.stderr.splitlines() if "never reads them): " in n]
        assert set(changes) <= set(note.split("never reads them): ")[1].split(", "))
        outs.append(run(load_fixture(out))["projected"].data)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_xielu_is_transformers_formula() -> None:
    """xIELU as activations.py's _xielu_python writes it, at values around 0 and eps."""
    from attn_cli.core.forward import xielu

    x = np.array([-30.0, -1.0, -1e-6, -1e-7, 0.0, 1e-7, 0.5, 3.0])
    alpha_p, alpha_n, beta, eps = 0.05, -1.2, 0.5, -1e-6
    ap, an = math.log1p(math.exp(alpha_p)), beta + math.log1p(math.exp(alpha_n))
    want = [
        ap * v * v + beta * v if v > 0 else (math.expm1(min(v, eps)) - v) * an + beta * v for v in x
    ]
    np.testing.assert_allclose(xielu(x, alpha_p, alpha_n, beta, eps), want, rtol=1e-15)


def _without_correction(route: Any) -> Any:
    return lambda logits, k, correction, *rest: route(logits, k, 0 * correction, *rest)


# each new convention of the forward, left out, misses transformers at layer 3
MISTAKES: dict[str, tuple[str, str, Any]] = {
    "ernie4_5_moe's router without its correction bias": (
        "ernie4_5_moe",
        "route_corrected",
        _without_correction(fw.route_corrected),
    ),
    "glm4_moe's router without its correction bias": (
        "glm4_moe",
        "route_grouped",
        _without_correction(fw.route_grouped),
    ),
    "apertus's xIELU with beta 0": (
        "apertus",
        "PARAMETRIC",
        {"xielu": (lambda x, beta, **p: fw.xielu(x, beta=0.0, **p), fw.PARAMETRIC["xielu"][1])},
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistaken_forward_misses_transformers(
    mistake: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case, name, wrong = MISTAKES[mistake]
    monkeypatch.setattr(fw, name, wrong)
    with pytest.raises(AssertionError, match=f"{case} (X|softmax|projected)"):
        layer_errors(case, 3, tmp_path)
