"""Multi-head latent attention against transformers' own ``DeepseekV3Attention``: the numbers
tests/reference/torch_mla.py recorded once in a throwaway venv (float64, eager attention), read
here; torch and transformers are not needed. The fixture is built from the module's weights the
way docs/fixture-format.md says a checkpoint maps onto the ``mla`` key (torch Linear weights are
transposed; kv_a_proj_with_mqa splits into W_DKV and W_KR, kv_b_proj per head into W_UK and
W_UV), so a wrong split, a wrong RoPE layout or a wrong scale shows here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reference import mla_from_torch

from attn_cli.core.pipeline import run
from attn_cli.io.validate import validate

DOC = json.loads((Path(__file__).parent.parent / "reference" / "torch_mla.json").read_text())
CASES = DOC["cases"]


def yarn_mscale(yarn: dict[str, Any] | None) -> float:
    """transformers' yarn_get_mscale(factor, mscale_all_dim), 1 without yarn."""
    if not yarn or not yarn.get("mscale_all_dim") or yarn["factor"] <= 1:
        return 1.0
    return 0.1 * float(yarn["mscale_all_dim"]) * math.log(float(yarn["factor"])) + 1.0


def fixture_of(case: dict[str, Any]) -> dict[str, Any]:
    cfg, w = case["config"], {k: np.array(v) for k, v in case["weights"].items()}
    H = cfg["num_attention_heads"]
    mla, W_O = mla_from_torch(w, H, cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["v_head_dim"])
    mla |= {"base": cfg["rope_theta"], "eps": cfg["eps"], "mscale": yarn_mscale(cfg["yarn"])}
    return {"X": np.array(case["X"]), "heads": H, "causal": True, "mla": mla, "W_O": W_O}


@pytest.mark.parametrize("name", list(CASES))
def test_attn_computes_what_transformers_computes(name: str) -> None:
    case = CASES[name]
    trace = run(validate(fixture_of(case), "torch_mla.json"))
    assert trace.scale == pytest.approx(case["scaling"], rel=1e-14)
    # eager_attention_forward takes the softmax in float32 (dtype=torch.float32), so its weights
    # and what follows them hold float32's 7 digits of attn's float64 numbers
    for stage in ("softmax", "concat", "projected"):
        want = case["output" if stage == "projected" else stage]
        np.testing.assert_allclose(trace[stage].data, want, rtol=1e-6, atol=1e-7, err_msg=stage)
    for absorbed, naive in (("scores_absorbed", "scores"), ("output_absorbed", "output")):
        np.testing.assert_allclose(trace[absorbed].data, trace[naive].data, rtol=1e-10, atol=1e-12)


def test_the_cases_cover_both_query_paths_and_yarn() -> None:
    weights = [set(c["weights"]) for c in CASES.values()]
    assert any("q_proj.weight" in w for w in weights)
    assert any("q_a_proj.weight" in w for w in weights)
    assert any(c["config"]["yarn"] for c in CASES.values())
    assert DOC["generator"].endswith("transformers 5.24.0")
