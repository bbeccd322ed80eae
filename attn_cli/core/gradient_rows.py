"""The backward pass's rows of the stage table (core/stages.py): one row per gradient, in the
order it is computed (final stage first), ``d_`` + the forward stage or input, laid out like
it, and ``delta``; the variants' gradient rows fill the slots. No NumPy at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from attn_cli.core.stage_facts import (
    Slot,
    always,
    chain_of,
    has_masked,
    not_allowed_by,
    parts,
)
from attn_cli.core.stage_spec import K_AXES as _K
from attn_cli.core.stage_spec import Q_AXES as _Q
from attn_cli.core.stage_spec import SCORE_AXES as _SCORES
from attn_cli.core.stage_spec import StageSpec as StageSpec

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


def _upstream(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        if inputs.grad is not None:
            return f"d_{name} (given)"
        return f"d_{name} = 1, L = Σ {name}"

    return formula


def _d_output(inputs: Inputs) -> str:
    outs = chain_of(inputs).outs
    if outs:  # back through the head-output transform that read output (the gate)
        v, value = outs[0]
        return "d_output = " + v.grad_formula(value, inputs, f"d_{v.out_stages[-1]}", "output")
    if inputs.W_O is None:
        return _upstream("output")(inputs)
    if inputs.heads == 1:
        return "d_output = d_concat"
    return "d_output[h] = d_concat[:, h·d_v:(h+1)·d_v]"


def _d_concat(inputs: Inputs) -> str:
    if inputs.W_O is not None:
        return "d_concat = d_projected·W_Oᵀ"
    return f"d_concat = [d_{chain_of(inputs).joined} head 0 | head 1 | …]"


def _group_sum(inputs: Inputs, term: str, grad: str, per_query: bool = False) -> str:
    """``grad = term`` per head; under GQA key/value head g serves the query heads h ∈ g, so
    a key/value gradient sums the group's terms (``per_query``: a query head reads its g)."""
    plain = term.replace("[h]", "").replace("[g]", "")
    if inputs.heads == inputs.kv_heads:
        return f"{grad} = {plain}"
    if per_query:
        return f"{grad}[h] = {term}, g = h // {inputs.heads // inputs.kv_heads}"
    return f"{grad}[g] = Σ_(h ∈ g) {term}"


def _d_logits(inputs: Inputs) -> str:
    """dS, the softmax Jacobian applied: what the softmax's input stage receives."""
    return "softmax ∘ (d_softmax − delta)"


def _d_masked(inputs: Inputs) -> str:
    text = f"d_masked = {_d_logits(inputs)}"
    why = not_allowed_by(inputs)
    return text + (f", 0 where not allowed ({', '.join(why)})" if why else "")


def d_modified(name: str) -> Callable[[Inputs], str]:
    """d_scaled, or a score modifier's stage gradient (d_capped): what the softmax's input
    passes back, then each modifier's Jacobian, the last modifier's first."""

    def formula(inputs: Inputs) -> str:
        chain = chain_of(inputs)
        stages = ("scaled", *chain.stages)
        i = stages.index(name)
        if i == len(stages) - 1:  # the softmax's input, or masked's
            return f"d_{name} = " + ("d_masked" if chain.masks else _d_logits(inputs))
        v, value = chain.modifiers[i]  # the modifier that reads `name`
        return f"d_{name} = " + v.grad_formula(value, inputs, f"d_{stages[i + 1]}", name)

    return formula


def d_query_key(name: str) -> Callable[[Inputs], str]:
    """d_Q_rot, d_Q_norm, d_Q (and K): from the scores, back through each Q/K transform."""
    which = name[0]  # "Q" or "K"

    def formula(inputs: Inputs) -> str:
        chain = chain_of(inputs)
        stages = chain.qk_stages(which)
        if name == stages[-1]:  # what entered the scores
            q, k = chain.query_key("Q"), chain.query_key("K")
            if which == "Q":
                return _group_sum(inputs, f"d_scores[h]·{k}[g]", f"d_{name}", per_query=True)
            return _group_sum(inputs, f"d_scores[h]ᵀ·{q}[h]", f"d_{name}")
        i = stages.index(name)
        v, value = chain.transforms_of(which)[i]  # the transform that reads `name`
        return f"d_{name} = " + v.grad_formula(value, inputs, f"d_{stages[i + 1]}", name)

    return formula


def _weight_applies(name: str) -> Callable[[Inputs], bool]:
    """d_W_Q, d_W_K, d_W_V: with the weight, or when a front end fills the row (MLA's W_Q)."""

    def applies(inputs: Inputs) -> bool:
        if getattr(inputs, f"W_{name}") is not None:
            return True
        front = chain_of(inputs).front
        return front is not None and front[0].front_fills(front[1], f"d_W_{name}")

    return applies


def _d_X(inputs: Inputs) -> str:
    front = chain_of(inputs).front
    if front is not None:
        return front[0].stage_formula(front[1], inputs, "d_X") + parts(inputs, "d_X")
    paths = ("Q",) if inputs.X_kv is not None else ("Q", "K", "V")
    return "d_X = " + " + ".join(f"d_{p}·W_{p}ᵀ" for p in paths) + parts(inputs, "d_X")


def _weight_grad(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        front = chain_of(inputs).front
        if front is not None:
            return front[0].stage_formula(front[1], inputs, f"d_W_{name}")
        source = "X_kv" if name in "KV" and inputs.X_kv is not None else "X"
        return f"d_W_{name} = {source}ᵀ·d_{name}"

    return formula


def _bias_grad(name: str, stage: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        over = "b, t" if inputs.has_batch else "t"
        return f"d_b_{name} = Σ_{over} d_{stage}[{over}]"

    return formula


def _projection_mode(inputs: Inputs) -> bool:
    return inputs.mode == "projection"


def _concat_applies(inputs: Inputs) -> bool:
    return inputs.heads > 1 or inputs.W_O is not None


_PROJECTED = ("batch", "query", "d_out")
_DELTA = ("batch", "head", "query")

GRADIENT_ROWS: tuple[StageSpec | Slot, ...] = tuple(
    row if isinstance(row, Slot) else StageSpec._make((*row, False, True))  # gradient rows
    for row in (
        (
            "d_projected",
            ("projected",),
            _PROJECTED,
            False,
            "d_final",
            lambda i: i.W_O is not None,
            _upstream("projected"),
        ),
        (
            "d_W_O",
            ("d_projected", "concat"),
            ("heads*d_v", "d_out"),
            False,
            "d_weight",
            lambda i: i.W_O is not None,
            lambda i: "d_W_O = concatᵀ·d_projected",
        ),
        (
            "d_b_O",
            ("d_projected",),
            ("d_out",),
            False,
            "d_bias",
            lambda i: i.b_O is not None,
            _bias_grad("O", "projected"),
        ),
        (
            "d_concat",
            ("d_projected", "d_output"),
            ("batch", "query", "heads*d_v"),
            False,
            "d_concat",
            _concat_applies,
            _d_concat,
        ),
        Slot("d_out"),
        (
            "d_output",
            ("d_concat", "output"),
            ("batch", "head", "query", "d_v"),
            False,
            "d_output",
            always,
            _d_output,
        ),
        (
            "d_softmax",
            ("d_output", "V"),
            _SCORES,
            True,
            "d_softmax",
            always,
            lambda i: _group_sum(i, "d_output[h]·V[g]ᵀ", "d_softmax", per_query=True),
        ),
        (
            "d_V",
            ("d_output", "softmax"),
            ("batch", "kv_head", "key", "d_v"),
            False,
            "d_V",
            always,
            lambda i: _group_sum(i, "softmax[h]ᵀ·d_output[h]", "d_V") + parts(i, "d_V"),
        ),
        (
            "delta",
            ("d_output", "output"),
            _DELTA,
            False,
            "delta",
            always,
            lambda i: "delta = rowsum(d_output ∘ output) = rowsum(d_softmax ∘ softmax)",
        ),
        Slot("extra"),
        (
            "d_masked",
            ("d_softmax", "delta", "softmax"),
            _SCORES,
            True,
            "d_logits",
            has_masked,
            _d_masked,
        ),
        Slot("d_modifier"),
        (
            "d_scaled",
            ("d_masked", "d_softmax", "delta"),
            _SCORES,
            True,
            "d_logits",
            always,
            d_modified("scaled"),
        ),
        (
            "d_scores",
            ("d_scaled",),
            _SCORES,
            True,
            "d_scores",
            always,
            lambda i: "d_scores = d_scaled × scale",
        ),
        Slot("d_transform"),
        ("d_Q", ("d_scores", "K"), _Q, False, "d_query_key", always, d_query_key("Q")),
        ("d_K", ("d_scores", "Q"), _K, False, "d_query_key", always, d_query_key("K")),
        (
            "d_X",
            ("d_Q", "d_K", "d_V"),
            ("batch", "seq", "d_model"),
            False,
            "d_X",
            _projection_mode,
            _d_X,
        ),
        (
            "d_X_kv",
            ("d_K", "d_V"),
            ("batch", "key", "d_model_kv"),
            False,
            "d_X",
            lambda i: i.X_kv is not None,
            lambda i: "d_X_kv = d_K·W_Kᵀ + d_V·W_Vᵀ",
        ),
        (
            "d_W_Q",
            ("d_Q", "X"),
            ("d_model", "heads*d_k"),
            False,
            "d_weight",
            _weight_applies("Q"),
            _weight_grad("Q"),
        ),
        (
            "d_W_K",
            ("d_K", "X", "X_kv"),
            ("d_model", "kv_heads*d_k"),
            False,
            "d_weight",
            _weight_applies("K"),
            _weight_grad("K"),
        ),
        (
            "d_W_V",
            ("d_V", "X", "X_kv"),
            ("d_model", "kv_heads*d_v"),
            False,
            "d_weight",
            _weight_applies("V"),
            _weight_grad("V"),
        ),
        (
            "d_b_Q",
            ("d_Q",),
            ("heads*d_k",),
            False,
            "d_bias",
            lambda i: i.b_Q is not None,
            _bias_grad("Q", "Q"),
        ),
        (
            "d_b_K",
            ("d_K",),
            ("kv_heads*d_k",),
            False,
            "d_bias",
            lambda i: i.b_K is not None,
            _bias_grad("K", "K"),
        ),
        (
            "d_b_V",
            ("d_V",),
            ("kv_heads*d_v",),
            False,
            "d_bias",
            lambda i: i.b_V is not None,
            _bias_grad("V", "V"),
        ),
        Slot("d_front"),
    )
)
