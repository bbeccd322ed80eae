"""Variants compose by the roles they declare (core/variant.py ``roles_of``, ``cannot_run_with``),
never by each other's names, and a fact about a variant lives in one layer (issue 37)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, run_cli

import attn_cli.core.chain  # noqa: F401 (the variants attn ships, registered)
from attn_cli.core.roles import HIDES_KEYS, HIDES_LATER_KEYS, REPLACES_SOFTMAX
from attn_cli.core.variant import (
    REGISTRY,
    Variant,
    first_clash,
    roles_of,
)

PACKAGE = Path(__file__).resolve().parents[1] / "attn_cli"
VARIANT_FOLDERS = ("core/plugins", "present/variants", "check/mistakes")


def test_the_roles_come_from_the_hooks_unless_declared() -> None:
    assert roles_of(REGISTRY["window"]) == {HIDES_KEYS}
    assert roles_of(REGISTRY["causal"]) == {HIDES_LATER_KEYS}  # declared: the causal rule alone
    assert REPLACES_SOFTMAX in roles_of(REGISTRY["linear_attention"])


def test_a_mixer_clashes_with_what_acts_on_the_softmax_but_not_with_causal() -> None:
    linear, window, causal = (REGISTRY[n] for n in ("linear_attention", "window", "causal"))
    assert first_clash([linear, causal]) is None
    assert first_clash([causal, window, linear]) == (linear, window)  # the refuser first


def test_a_hook_from_outside_is_refused_beside_a_mixer_without_a_name() -> None:
    class Everywhere(Variant):
        name = "everywhere"

        def allowed(self, value: object, inputs: object, cells: object) -> None:
            return None

    assert first_clash([REGISTRY["linear_attention"], Everywhere()]) is not None


def test_no_variant_module_names_another_variant() -> None:
    names = set(REGISTRY)
    for folder in VARIANT_FOLDERS:
        for path in sorted((PACKAGE / folder).glob("*.py")):
            own = {path.stem, "bias" if path.stem == "alibi" else path.stem}
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.lstrip().startswith(("from ", "import ")):
                    imported = set(re.findall(r"attn_cli\.\w+\.\w+\.(\w+)", line))
                    assert not (imported & names) - own, f"{path}: {line}"


def test_the_ring_buffer_has_the_slots_the_cache_has(tmp_path: Path) -> None:
    """A window wider than the sequence: the cache and its ring buffer are one size (core's)."""
    fixture = yaml.safe_load((FIXTURES / "mistral_sliding_window.yaml").read_text())
    path = tmp_path / "wide.yaml"
    path.write_text(yaml.safe_dump({**fixture, "window": 100}))
    result = run_cli("decode", str(path))
    assert result.exit_code == 0, result.output
    assert "cache: 6 slots" in result.stdout
    assert "ring buffer of 6 slots: slot = position mod 6" in result.stdout
    assert "100 slots" not in result.stdout


@pytest.mark.parametrize("key", ["window", "softcap", "gate"])
def test_decoding_linear_attention_refuses_what_it_ignored(tmp_path: Path, key: str) -> None:
    """Before, `attn decode` ran these with exit 0 and the variant silently left out."""
    fixture = yaml.safe_load((FIXTURES / "linear_attention.yaml").read_text())
    settings = {
        "window": 3,
        "softcap": 5,
        "gate": yaml.safe_load((FIXTURES / "qwen3_next_gate.yaml").read_text())["gate"],
    }
    path = tmp_path / "la.yaml"
    path.write_text(yaml.safe_dump({**fixture, key: settings[key]}))
    result = run_cli("decode", str(path))
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"Error: {path}: {key}: given with linear_attention, expected linear_attention "
        f"without {key} (it has no softmax scores to change)\n"
    )
