"""The one stage table: every intermediate of attention, declared once.

Each row says what a stage is computed from, its axes (with the batch axis, which a trace drops
when the fixture has none), whether it is score-like (a query x key matrix: heatmaps, masked
cells), the key of its explanation, when it applies, and its formula. The pipeline, the JSON
and npz writers, the renderers, the explanations and the grader all read this table; adding
a stage is one row here, one step function and one explanation entry.

A stage that does not apply to a fixture is absent from its trace. An opt-in stage (``lse``)
applies to every fixture but is computed only when asked for by name, so a default trace
leaves it out.

The gradient stages of the backward pass (``d_`` + the forward stage or input, laid out like
it, and ``delta``) follow the forward rows. They apply only to a run that asks for the
backward pass, so a default trace is unchanged; L is the sum of the final stage (``projected``,
else ``output``) times the fixture's ``grad``, or times ones when it has none.

Importing this module costs nothing: no NumPy, so ``attn --help`` can list the stages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs


class StageSpec(NamedTuple):
    """One row of the stage table."""

    name: str
    needs: tuple[str, ...]  # the stages it is computed from (those that apply)
    axes: tuple[str, ...]  # its layout, batch axis first
    score_like: bool  # a (query, key) matrix per head
    explain: str  # the key of its explanation (present/explain.py)
    applies: Callable[[Inputs], bool]
    formula: Callable[[Inputs], str]
    opt_in: bool = False  # computed only when asked for by name (``run(keep=...)``)
    gradient: bool = False  # a stage of the backward pass: only with ``run(backward=True)``


def has_masked(inputs: Inputs) -> bool:
    """Whether anything masks or biases the scores (the chain's biases and allowed-keys rules:
    causal, window, mask, lengths, bias, ALiBi, any registered variant), i.e. whether
    ``masked`` applies."""
    from attn_cli.core.chain import Chain  # NumPy: not on the path of `attn --help`

    return Chain(inputs).masks


def softmax_input(inputs: Inputs) -> str:
    """The stage the softmax reads: masked, else capped, else scaled."""
    if has_masked(inputs):
        return "masked"
    return "capped" if inputs.softcap is not None else "scaled"


def _number(x: float) -> str:
    return "−∞" if x == -math.inf else f"{x:g}".replace("-", "−")


def _projection(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        if inputs.mode != "projection":
            return f"{name} (given)"
        bias = f" + b_{name}" if getattr(inputs, f"b_{name}") is not None else ""
        source = "X_kv" if name in "KV" and inputs.X_kv is not None else "X"
        return f"{name} = {source}·W_{name}{bias}"

    return formula


def _norm_formula(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        assert inputs.qk_norm is not None
        weight = inputs.qk_norm.q_weight if name == "Q" else inputs.qk_norm.k_weight
        over = "each head" if weight.shape[0] == inputs.d_k else "the whole projection"
        w = name.lower()
        return (
            f"{name}_norm = {name} / √(mean({name}²) + eps) × {w}_weight, over {over}, "
            f"eps = {_number(inputs.qk_norm.eps)}"
        )

    return formula


def _rope_formula(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        rope = inputs.rope
        assert rope is not None
        source = f"{name}_norm" if inputs.qk_norm is not None else name
        where = "positions" if name == "Q" else "key positions"
        return (
            f"{name}_rot = RoPE({source}, {where}): {rope.layout} layout, "
            f"base {_number(rope.base)}, {rope.dims} of {inputs.d_k} dims"
        )

    return formula


def _query_key(name: str, inputs: Inputs) -> str:
    """What the scores read for Q or K: the rotated, normalised or plain stage."""
    if inputs.rope is not None:
        return f"{name}_rot"
    return f"{name}_norm" if inputs.qk_norm is not None else name


def _scores_formula(inputs: Inputs) -> str:
    return f"scores = {_query_key('Q', inputs)}·{_query_key('K', inputs)}ᵀ"


def _not_allowed_by(inputs: Inputs) -> list[str]:
    """What hides keys from a query: ``causal upper-left``, ``window 3``, ``mask``, ``lengths``."""
    from attn_cli.core.chain import Chain

    return Chain(inputs).hides()


def _masked_formula(inputs: Inputs) -> str:
    source = "capped" if inputs.softcap is not None else "scaled"
    text = f"masked = {source}" + (" + bias" if inputs.bias is not None else "")
    text += " + alibi" if inputs.alibi is not None else ""
    why = _not_allowed_by(inputs)
    fill = _number(inputs.mask_value)
    return text + (f", {fill} where not allowed ({', '.join(why)})" if why else "")


def _softmax_formula(inputs: Inputs) -> str:
    sinks = " with the head's sink joined, then dropped" if inputs.sinks is not None else ""
    return f"softmax = softmax({softmax_input(inputs)}) over keys{sinks}"


def _lse_formula(inputs: Inputs) -> str:
    sink = " + exp(sink)" if inputs.sinks is not None else ""
    source = softmax_input(inputs)
    return f"lse = log(Σ_keys exp({source}){sink}); softmax = exp({source} − lse)"


def _always(inputs: Inputs) -> bool:
    return True


_SCORES = ("batch", "head", "query", "key")
_Q = ("batch", "head", "query", "d_k")
_K = ("batch", "kv_head", "key", "d_k")
_QK = ("Q_rot", "K_rot", "Q_norm", "K_norm", "Q", "K")  # what scores may read
_LOGITS = ("masked", "capped", "scaled")  # what softmax may read

STAGES: tuple[StageSpec, ...] = (
    StageSpec("X", (), ("batch", "seq", "d_model"), False, "X",
              lambda i: i.mode == "projection", lambda i: "X (the input embeddings)"),
    StageSpec("X_kv", (), ("batch", "key", "d_model_kv"), False, "X_kv",
              lambda i: i.X_kv is not None,
              lambda i: "X_kv (the states keys and values are projected from)"),
    StageSpec("Q", ("X",), _Q, False, "QKV", _always, _projection("Q")),
    StageSpec("K", ("X", "X_kv"), _K, False, "QKV", _always, _projection("K")),
    StageSpec("V", ("X", "X_kv"), ("batch", "kv_head", "key", "d_v"), False, "QKV",
              _always, _projection("V")),
    StageSpec("Q_norm", ("Q",), _Q, False, "Q_norm",
              lambda i: i.qk_norm is not None, _norm_formula("Q")),
    StageSpec("K_norm", ("K",), _K, False, "K_norm",
              lambda i: i.qk_norm is not None, _norm_formula("K")),
    StageSpec("Q_rot", ("Q_norm", "Q"), _Q, False, "Q_rot",
              lambda i: i.rope is not None, _rope_formula("Q")),
    StageSpec("K_rot", ("K_norm", "K"), _K, False, "K_rot",
              lambda i: i.rope is not None, _rope_formula("K")),
    StageSpec("scores", _QK, _SCORES, True, "scores", _always, _scores_formula),
    StageSpec("scaled", ("scores",), _SCORES, True, "scaled",
              _always, lambda i: "scaled = scores × scale"),
    StageSpec("capped", ("scaled",), _SCORES, True, "capped",
              lambda i: i.softcap is not None,
              lambda i: f"capped = softcap × tanh(scaled / softcap), softcap = {i.softcap:g}"),
    StageSpec("alibi", (), _SCORES, True, "alibi",
              lambda i: i.alibi is not None,
              lambda i: "alibi = −slope_head × |query position − key position|"),
    StageSpec("masked", ("capped", "scaled", "alibi"), _SCORES, True, "masked",
              has_masked, _masked_formula),
    StageSpec("softmax", _LOGITS, _SCORES, True, "softmax", _always, _softmax_formula),
    StageSpec("lse", _LOGITS, ("batch", "head", "query"), False, "lse",
              _always, _lse_formula, opt_in=True),
    StageSpec("output", ("softmax", "V"), ("batch", "head", "query", "d_v"), False, "output",
              _always, lambda i: "output = softmax·V"),
    StageSpec("concat", ("output",), ("batch", "query", "heads*d_v"), False, "concat",
              lambda i: i.heads > 1 or i.W_O is not None,
              lambda i: "concat = [head 0 | head 1 | …]"),
    StageSpec("projected", ("concat",), ("batch", "query", "d_out"), False, "projected",
              lambda i: i.W_O is not None,
              lambda i: "projected = concat·W_O" + (" + b_O" if i.b_O is not None else "")),
)  # fmt: skip

# ---------------------------------------------------------------------------------------------
# The backward pass: one row per gradient, in the order it is computed (final stage first)


def final_stage(inputs: Inputs) -> str:
    """The stage L is taken over: ``projected`` when there is W_O, else ``output``."""
    return "projected" if inputs.W_O is not None else "output"


def _upstream(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        if inputs.grad is not None:
            return f"d_{name} (given)"
        return f"d_{name} = 1, L = Σ {name}"

    return formula


def _d_output(inputs: Inputs) -> str:
    if inputs.W_O is None:
        return _upstream("output")(inputs)
    if inputs.heads == 1:
        return "d_output = d_concat"
    return "d_output[h] = d_concat[:, h·d_v:(h+1)·d_v]"


def _d_concat(inputs: Inputs) -> str:
    if inputs.W_O is not None:
        return "d_concat = d_projected·W_Oᵀ"
    return "d_concat = [d_output head 0 | head 1 | …]"


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
    why = _not_allowed_by(inputs)
    return text + (f", 0 where not allowed ({', '.join(why)})" if why else "")


def _d_capped(inputs: Inputs) -> str:
    return "d_capped = d_masked" if has_masked(inputs) else f"d_capped = {_d_logits(inputs)}"


def _d_scaled(inputs: Inputs) -> str:
    if inputs.softcap is not None:
        cap = _number(inputs.softcap)
        return f"d_scaled = d_capped ∘ (1 − tanh²(scaled / {cap}))"
    return "d_scaled = d_masked" if has_masked(inputs) else f"d_scaled = {_d_logits(inputs)}"


def _d_query_key(name: str) -> Callable[[Inputs], str]:
    """d_Q_rot, d_Q_norm, d_Q (and K): from the scores, back through RoPE, then RMSNorm."""
    which = name[0]  # "Q" or "K"

    def formula(inputs: Inputs) -> str:
        q, k = _query_key("Q", inputs), _query_key("K", inputs)
        if name == _query_key(which, inputs):  # what entered the scores
            if which == "Q":
                return _group_sum(inputs, f"d_scores[h]·{k}[g]", f"d_{name}", per_query=True)
            return _group_sum(inputs, f"d_scores[h]ᵀ·{q}[h]", f"d_{name}")
        if (
            inputs.rope is not None
            and not name.endswith("_rot")
            and (name.endswith("_norm") or inputs.qk_norm is None)
        ):
            return f"d_{name} = RoPE⁻¹(d_{which}_rot)"
        src = f"d_{which}_norm"
        return (
            f"d_{name} = (w ∘ {src} − x̂ · mean(x̂ ∘ w ∘ {src})) / rms({name}), "
            f"x̂ = {name} / rms({name}), w = {which.lower()}_weight"
        )

    return formula


def _d_X(inputs: Inputs) -> str:
    paths = ("Q",) if inputs.X_kv is not None else ("Q", "K", "V")
    return "d_X = " + " + ".join(f"d_{p}·W_{p}ᵀ" for p in paths)


def _weight_grad(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
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

_GRADIENT_ROWS: tuple[StageSpec, ...] = tuple(
    StageSpec(name, needs, axes, score_like, explain, applies, formula, gradient=True)
    for name, needs, axes, score_like, explain, applies, formula in (
        ("d_projected", ("projected",), _PROJECTED, False, "d_final",
         lambda i: i.W_O is not None, _upstream("projected")),
        ("d_W_O", ("d_projected", "concat"), ("heads*d_v", "d_out"), False, "d_weight",
         lambda i: i.W_O is not None, lambda i: "d_W_O = concatᵀ·d_projected"),
        ("d_b_O", ("d_projected",), ("d_out",), False, "d_bias",
         lambda i: i.b_O is not None, _bias_grad("O", "projected")),
        ("d_concat", ("d_projected", "d_output"), ("batch", "query", "heads*d_v"), False,
         "d_concat", _concat_applies, _d_concat),
        ("d_output", ("d_concat", "output"), ("batch", "head", "query", "d_v"), False,
         "d_output", _always, _d_output),
        ("d_softmax", ("d_output", "V"), _SCORES, True, "d_softmax",
         _always, lambda i: _group_sum(i, "d_output[h]·V[g]ᵀ", "d_softmax", per_query=True)),
        ("d_V", ("d_output", "softmax"), ("batch", "kv_head", "key", "d_v"), False, "d_V",
         _always, lambda i: _group_sum(i, "softmax[h]ᵀ·d_output[h]", "d_V")),
        ("delta", ("d_output", "output"), _DELTA, False, "delta", _always,
         lambda i: "delta = rowsum(d_output ∘ output) = rowsum(d_softmax ∘ softmax)"),
        ("d_sinks", ("delta", "softmax"), ("head",), False, "d_sinks",
         lambda i: i.sinks is not None,
         lambda i: "d_sinks[h] = −Σ (1 − rowsum(softmax[h])) ∘ delta[h]"),
        ("d_masked", ("d_softmax", "delta", "softmax"), _SCORES, True, "d_logits",
         has_masked, _d_masked),
        ("d_capped", ("d_masked", "d_softmax", "delta"), _SCORES, True, "d_logits",
         lambda i: i.softcap is not None, _d_capped),
        ("d_scaled", ("d_capped", "d_masked", "d_softmax", "delta"), _SCORES, True, "d_logits",
         _always, _d_scaled),
        ("d_scores", ("d_scaled",), _SCORES, True, "d_scores",
         _always, lambda i: "d_scores = d_scaled × scale"),
        ("d_Q_rot", ("d_scores", "K_rot"), _Q, False, "d_query_key",
         lambda i: i.rope is not None, _d_query_key("Q_rot")),
        ("d_K_rot", ("d_scores", "Q_rot"), _K, False, "d_query_key",
         lambda i: i.rope is not None, _d_query_key("K_rot")),
        ("d_Q_norm", ("d_Q_rot", "d_scores", "K_norm"), _Q, False, "d_query_key",
         lambda i: i.qk_norm is not None, _d_query_key("Q_norm")),
        ("d_K_norm", ("d_K_rot", "d_scores", "Q_norm"), _K, False, "d_query_key",
         lambda i: i.qk_norm is not None, _d_query_key("K_norm")),
        ("d_Q", ("d_Q_norm", "d_Q_rot", "d_scores", "K"), _Q, False, "d_query_key",
         _always, _d_query_key("Q")),
        ("d_K", ("d_K_norm", "d_K_rot", "d_scores", "Q"), _K, False, "d_query_key",
         _always, _d_query_key("K")),
        ("d_X", ("d_Q", "d_K", "d_V"), ("batch", "seq", "d_model"), False, "d_X",
         _projection_mode, _d_X),
        ("d_X_kv", ("d_K", "d_V"), ("batch", "key", "d_model_kv"), False, "d_X",
         lambda i: i.X_kv is not None, lambda i: "d_X_kv = d_K·W_Kᵀ + d_V·W_Vᵀ"),
        ("d_W_Q", ("d_Q", "X"), ("d_model", "heads*d_k"), False, "d_weight",
         _projection_mode, _weight_grad("Q")),
        ("d_W_K", ("d_K", "X", "X_kv"), ("d_model", "kv_heads*d_k"), False, "d_weight",
         _projection_mode, _weight_grad("K")),
        ("d_W_V", ("d_V", "X", "X_kv"), ("d_model", "kv_heads*d_v"), False, "d_weight",
         _projection_mode, _weight_grad("V")),
        ("d_b_Q", ("d_Q",), ("heads*d_k",), False, "d_bias",
         lambda i: i.b_Q is not None, _bias_grad("Q", "Q")),
        ("d_b_K", ("d_K",), ("kv_heads*d_k",), False, "d_bias",
         lambda i: i.b_K is not None, _bias_grad("K", "K")),
        ("d_b_V", ("d_V",), ("kv_heads*d_v",), False, "d_bias",
         lambda i: i.b_V is not None, _bias_grad("V", "V")),
    )
)  # fmt: skip
STAGES = STAGES + _GRADIENT_ROWS

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
SPECS: dict[str, StageSpec] = {s.name: s for s in STAGES}
SCORE_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.score_like)


OPT_IN_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.opt_in)
FORWARD_STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES if not s.gradient)
GRADIENT_STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES if s.gradient)


def applicable_stages(
    inputs: Inputs, opt_in: Collection[str] = (), backward: bool = False
) -> tuple[str, ...]:
    """The stages a fixture has, in pipeline order (X only in projection mode, and so on).

    An opt-in stage (``lse``) is listed only when ``opt_in`` names it: a default run leaves it
    out, so traces of fixtures that never asked for it do not change. The gradient stages are
    listed only with ``backward``.
    """
    return tuple(
        s.name
        for s in STAGES
        if s.applies(inputs) and (not s.opt_in or s.name in opt_in) and (not s.gradient or backward)
    )


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
    return axes if has_batch or axes[0] != "batch" else axes[1:]


def unknown_stage(name: str, choices: Collection[str] = STAGE_NAMES) -> str:
    """``unknown stage`` with a did-you-mean hint, for error messages."""
    from attn_cli.errors import did_you_mean

    return "unknown stage" + did_you_mean(name, choices)
