"""The one stage table: every intermediate of attention, declared once.

Each row says what a stage is computed from, its axes (with the batch axis, which a trace drops
when the fixture has none), whether it is score-like (a query x key matrix: heatmaps, masked
cells), the key of its explanation, when it applies, and its formula. The pipeline, the JSON
and npz writers, the renderers, the explanations and the grader all read this table; adding
a stage is one row here, one step function and one explanation entry.

Importing this module costs nothing: no NumPy, so ``attn --help`` can list the stages.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


@dataclass(frozen=True)
class StageSpec:
    """One row of the stage table."""

    name: str
    needs: tuple[str, ...]  # the stages it is computed from (those that apply)
    axes: tuple[str, ...]  # its layout, batch axis first
    score_like: bool  # a (query, key) matrix per head
    explain: str  # the key of its explanation (present/explain.py)
    applies: Callable[[Inputs], bool]
    formula: Callable[[Inputs], str]


def has_masked(inputs: Inputs) -> bool:
    """Whether anything masks or biases the scores, i.e. whether ``masked`` applies."""
    return any(x is not None for x in (inputs.causal, inputs.mask, inputs.bias, inputs.lengths))


def _projection(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        if inputs.mode != "projection":
            return f"{name} (given)"
        bias = f" + b_{name}" if getattr(inputs, f"b_{name}") is not None else ""
        return f"{name} = X·W_{name}{bias}"

    return formula


def _masked_formula(inputs: Inputs) -> str:
    text = "masked = scaled" + (" + bias" if inputs.bias is not None else "")
    why = [
        name
        for name, given in (
            (f"causal {inputs.causal}", inputs.causal is not None),
            ("mask", inputs.mask is not None),
            ("lengths", inputs.lengths is not None),
        )
        if given
    ]
    return text + (f", −∞ where not allowed ({', '.join(why)})" if why else "")


def _softmax_formula(inputs: Inputs) -> str:
    return f"softmax = softmax({'masked' if has_masked(inputs) else 'scaled'}) over keys"


def _always(inputs: Inputs) -> bool:
    return True


_SCORES = ("batch", "head", "query", "key")

STAGES: tuple[StageSpec, ...] = (
    StageSpec("X", (), ("batch", "seq", "d_model"), False, "X",
              lambda i: i.mode == "projection", lambda i: "X (the input embeddings)"),
    StageSpec("Q", ("X",), ("batch", "head", "query", "d_k"), False, "QKV",
              _always, _projection("Q")),
    StageSpec("K", ("X",), ("batch", "kv_head", "key", "d_k"), False, "QKV",
              _always, _projection("K")),
    StageSpec("V", ("X",), ("batch", "kv_head", "key", "d_v"), False, "QKV",
              _always, _projection("V")),
    StageSpec("scores", ("Q", "K"), _SCORES, True, "scores",
              _always, lambda i: "scores = Q·Kᵀ"),
    StageSpec("scaled", ("scores",), _SCORES, True, "scaled",
              _always, lambda i: "scaled = scores × scale"),
    StageSpec("masked", ("scaled",), _SCORES, True, "masked",
              has_masked, _masked_formula),
    StageSpec("softmax", ("masked", "scaled"), _SCORES, True, "softmax",
              _always, _softmax_formula),
    StageSpec("output", ("softmax", "V"), ("batch", "head", "query", "d_v"), False, "output",
              _always, lambda i: "output = softmax·V"),
    StageSpec("concat", ("output",), ("batch", "query", "heads*d_v"), False, "concat",
              lambda i: i.heads > 1 or i.W_O is not None,
              lambda i: "concat = [head 0 | head 1 | …]"),
    StageSpec("projected", ("concat",), ("batch", "query", "d_out"), False, "projected",
              lambda i: i.W_O is not None,
              lambda i: "projected = concat·W_O" + (" + b_O" if i.b_O is not None else "")),
)  # fmt: skip

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
SPECS: dict[str, StageSpec] = {s.name: s for s in STAGES}
SCORE_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.score_like)


def applicable_stages(inputs: Inputs) -> tuple[str, ...]:
    """The stages a fixture has, in pipeline order (X only in projection mode, and so on)."""
    return tuple(s.name for s in STAGES if s.applies(inputs))


def needed_stages(wanted: Collection[str], applicable: Collection[str]) -> set[str]:
    """The stages that must be computed to get ``wanted``: those and what they depend on."""
    need: set[str] = set()
    todo = [s for s in wanted if s in applicable]
    while todo:
        name = todo.pop()
        if name not in need:
            need.add(name)
            todo.extend(s for s in SPECS[name].needs if s in applicable)
    return need


def public_axes(name: str, has_batch: bool) -> tuple[str, ...]:
    """A stage's axes as a trace shows them: without ``batch`` when the fixture has none."""
    axes = SPECS[name].axes
    return axes if has_batch else axes[1:]


def unknown_stage(name: str, choices: Collection[str] = STAGE_NAMES) -> str:
    """``unknown stage`` with a did-you-mean hint, for error messages."""
    from attn_cli.errors import did_you_mean

    return "unknown stage" + did_you_mean(name, choices)
