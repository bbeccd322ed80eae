"""A checkpoint's forward pass from a text, in NumPy: the residual stream entering any layer.

The text is embedded as for layer 0 (``checkpoint.embed_tokens``); each layer below is then computed
whole: its attention is attn's own traced layer (the fixture ``attn import`` writes, run through
the one pipeline, so RoPE and its scaling, GQA, windows and every variant are the traced ones),
its MLP and norms by ``core/forward.py``. One layer's tensors are read at a time (the attention's,
then the MLP's) and dropped before the next layer's are read.

Each family gives its block past attention and its head (``Family.block``, ``Family.head``:
where the norms sit, the MLP, the final norm and the LM head), written in its module under
io/families/models/ and checked against transformers (tests/reference/forward/): norms and MLPs
by core/forward.py, mixtures of experts (``Experts``) read an expert when a token chooses it.
Qwen3-Next's linear_attention layers run as their gated_deltanet fixture (no softmax map: such a
layer's weights hold no heads). A family without a block is refused in one line for a layer
past 0 (its layer 0 needs no forward).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from attn_cli.blas import blas_limit
from attn_cli.core import forward as fw
from attn_cli.core import ops
from attn_cli.core.steps import softmax
from attn_cli.errors import InputError, UsageError
from attn_cli.io import checkpoint as ck
from attn_cli.io import gate
from attn_cli.io.families import (
    REGISTRY,
    BlockPlan,
    Config,
    Experts,
    Family,
    HeadPlan,
    LayerPlan,
    MixtureReads,
    Norm,
    Stacked,
    Tensor,
    check_keys,
    check_tensors,
    get,
    plan_layer,
    prefix_of,
    resolve_family,
    text_model,
)
from attn_cli.io.tokens import encode_text, tokenizer_call
from attn_cli.io.weights import (
    ITEMSIZE,
    MAX_CHECKPOINT_BYTES,
    MAX_JSON_BYTES,
    Reader,
    locate,
    read_json,
    require,
)

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]


@dataclass
class Walk:
    """What the forward computed: tokens, each layer's attention weights, the residual stream."""

    family: str
    layers: int
    tokens: list[str]
    ids: list[int]
    weights: list[FloatArray] = field(default_factory=list)  # per layer (heads, T, T)
    residual: FloatArray | None = None  # entering layer ``through`` (or leaving the last)
    entering: list[FloatArray] = field(default_factory=list)  # per layer, when kept
    logits: FloatArray | None = None  # (T, vocab)
    notes: list[str] = field(default_factory=list)
    head_types: list[str] = field(default_factory=list)
    # called with each layer's whole trace (every stage kept) when set: the model view's page
    each_trace: Callable[[int, Any], None] | None = None
    maps: bool = True  # keep each layer's attention weights (an import of one layer needs none)


def has_forward(family: Family) -> bool:
    """Whether the family's block (norm placement, MLP) is written (a wrapper: its text model's)."""
    if family.wrapper is not None:
        return has_forward(get(family.wrapper.text))
    return family.block is not None


def block_families() -> tuple[str, ...]:
    """The families whose blocks are written and checked against transformers."""
    return tuple(name for name, family in REGISTRY.items() if has_forward(family))


def _refuse_family(source: str, family: str, what: str) -> None:
    if has_forward(get(family)):
        return
    why = "its block (norm placement, MLP) is not written and checked against transformers"
    raise InputError(
        source,
        "model_type",
        f"{family}: computing {what} takes the forward through the layers below, and {why}",
        "one of " + ", ".join(block_families()) + " (or layer 0)",
        option="layer",
    )


def block_plan(cfg: Config, family: str, plan: LayerPlan) -> BlockPlan:
    """The block of ``plan``'s layer past its attention, from config.json (family's defaults)."""
    cfg, family = text_model(cfg, family)
    block = get(family).block
    assert block is not None  # walk refused the family first
    return block(cfg, plan)


def head_plan(cfg: Config, family: str, plan: LayerPlan, names: set[str], prefix: str) -> HeadPlan:
    """The final norm and the LM head (or the tied embeddings) of a decoder."""
    cfg, family = text_model(cfg, family)
    head = get(family).head
    assert head is not None  # walk refused the family first
    return head(cfg, plan, names, prefix)


# ---------------------------------------------------------------------------------------------
# The walk

_LITTLE = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}


class LeanReader(Reader):
    """A reader whose tensors are read from the file into memory of their own, not mapped:
    pages of a memory-mapped file stay resident (and counted) after their tensor is dropped,
    so a walk through every layer would hold the whole checkpoint."""

    def __enter__(self) -> LeanReader:
        return self

    def read(self, prefix: str, t: Tensor, plan: LayerPlan) -> FloatArray:
        _, _, entry = self.entry(prefix, t, plan)
        return self.block(prefix, t, plan, 0, entry.shape[0] if entry.shape else 1)

    def block(self, prefix: str, t: Tensor, plan: LayerPlan, row: int, n: int) -> FloatArray:
        """Rows ``row`` .. ``row + n`` of tensor ``t`` (all of a 1-axis one), finite."""
        name, path, entry = self.entry(prefix, t, plan)
        n = max(0, min(n, (entry.shape[0] if entry.shape else 1) - row))
        if entry.dtype == "BF16":
            arr = self.bf16(path, entry, row, n, name)
        else:
            per_row = math.prod(entry.shape[1:]) * ITEMSIZE[entry.dtype]
            with gate.open_regular(
                path, str(path), "a .safetensors file", max_bytes=MAX_CHECKPOINT_BYTES
            ) as f:
                f.seek(entry.begin + row * per_row)
                buf = bytearray(f.read(n * per_row))
            if len(buf) != n * per_row:
                raise InputError(str(path), name, "data is cut short", "a complete file")
            shape = (n, *entry.shape[1:]) if entry.shape else ()
            arr = self.widen(entry.dtype, np.frombuffer(buf, dtype=_LITTLE[entry.dtype]))
            arr = arr.reshape(shape)
        if not np.isfinite(arr).all():
            raise InputError(str(path), name, "holds inf or NaN", "finite weights")
        return arr


def walk(
    checkpoint: Path,
    text: str,
    *,
    through: int | None,
    config: Path | None = None,
    arch: str | None = None,
    max_memory: int | None = None,
    logits: bool = False,
    keep_residuals: bool = False,
    each_trace: Callable[[int, Any], None] | None = None,
    maps: bool = True,
) -> Walk:
    """Embed ``text`` and run layers 0 .. through-1 (None: every layer), keeping each layer's
    attention weights; ``residual`` is then the stream entering layer ``through`` (or, with
    None, leaving the last layer); ``logits`` adds the final norm and the LM head;
    ``keep_residuals`` keeps the stream entering each layer (``entering``); ``each_trace``
    is called with each layer's whole trace (its tokens as labels), made once; without
    ``maps`` no layer's weights are kept (``weights`` stays empty).

    With ``through`` None and no ``logits``, the last layer's attention is all that is asked
    of it: its MLP is not computed (``residual`` is then None)."""
    ck.check_inputs(0, None, text)
    folder, files, config_path = locate(Path(checkpoint), config)
    cfg = Config(read_json(config_path, "config.json"), str(config_path))
    family, overridden = resolve_family(cfg, arch)
    ignored = check_keys(cfg, family)
    plan0 = plan_layer(cfg, family, 0)
    n = plan0.layers
    if logits:
        _refuse_family(str(config_path), family, "the logits")
    elif n > 1 if through is None else through > 0:
        _refuse_family(str(config_path), family, "a layer past 0")
    ids, tokens, types = encode_text(folder / "tokenizer.json", text)
    notes = [*overridden, *ignored]
    out = Walk(family, n, tokens, ids, notes=notes, each_trace=each_trace, maps=maps)
    layers = n if through is None else through
    work = len(ids) * layers * 12 * plan0.hidden**2  # about a block's multiply-adds, per layer
    with LeanReader(files) as reader, blas_limit(len(ids), work):
        prefix = prefix_of(reader.names, plan0, reader.source)
        head = head_plan(cfg, family, plan0, set(reader.names), prefix) if logits else None
        x: FloatArray | None = ck.embed_tokens(reader, prefix, plan0, ids, types)  # (T, C) float64
        for layer in range(layers):
            assert x is not None
            if keep_residuals:
                out.entering.append(x)
            whole = through is not None or logits or layer < n - 1
            x = _layer(reader, prefix, cfg, family, layer, x, ids, out, max_memory, whole)
        if head is not None:
            assert x is not None
            out.logits = _logits(reader, prefix, head, plan0, x)
    out.residual = x
    out.notes += _no_map_note(out.weights)
    return out


def _no_map_note(weights: list[FloatArray]) -> list[str]:
    """Qwen3-Next's linear_attention layers: computed whole, with no softmax map to show."""
    linear = [str(i) for i, w in enumerate(weights) if w.shape[0] == 0]
    if not linear:
        return []
    return [
        f"layer{'s' * (len(linear) > 1)} {', '.join(linear)}: linear attention (Gated "
        "DeltaNet), no softmax map: its weights hold no heads (blank in the model view)"
    ]


def _layer(
    reader: Reader,
    prefix: str,
    cfg: Config,
    family: str,
    layer: int,
    x: FloatArray,
    ids: list[int],
    out: Walk,
    max_memory: int | None,
    whole: bool = True,
) -> FloatArray | None:
    """The residual stream leaving ``layer``, from the one entering it (None: only the
    attention weights were asked for, not ``whole``)."""
    plan = plan_layer(cfg, family, layer)
    check_tensors(reader.names, prefix, plan, reader.source)
    ck.check_budget(reader, prefix, plan, len(ids), None, max_memory)
    if not whole:
        out.weights.append(_attention(reader, prefix, plan, x, out)[0])
        return None
    bp = block_plan(cfg, family, plan)
    _check_block_tensors(reader.names, prefix, plan, bp, reader.source)
    _check_block_budget(reader, prefix, plan, bp, x.shape[0], max_memory)
    weights, attention = _attention(reader, prefix, plan, x, out)
    if out.maps:
        out.weights.append(weights)
    t = {tensor.role: reader.read(prefix, tensor, plan) for tensor in bp.tensors}  # as read
    norms = {role: _norm_of(norm, t) for role, norm in bp.norms.items()}

    def mlp(h: FloatArray) -> FloatArray:
        if bp.experts is not None:
            return _moe(reader, prefix, plan, bp, h)
        out = mlp_as_stored(bp, t, h)
        return out if bp.residual is None else bp.residual * out

    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if bp.residual is not None:  # Granite: each branch times residual_multiplier, then added
            attention = bp.residual * attention
        leaving = fw.block(x, bp.placement, attention, mlp, norms)
    if not np.isfinite(leaving).all():  # checked here, before the next layer's norm reads it
        raise InputError(
            cfg.source,
            f"{cfg.path}num_hidden_layers",
            f"the residual stream leaving layer {layer} is not finite (float64 overflow in its "
            "block: a multiplier such as routed_scaling_factor or residual_multiplier, or a "
            "weight, too large)",
            "config values and weights of an ordinary size",
        )
    return leaving


def _moe(reader: Reader, prefix: str, plan: LayerPlan, bp: BlockPlan, h: FloatArray) -> FloatArray:
    """The mixture of experts on h [T, C]: the router, then each chosen expert, read when
    chosen; Qwen2-MoE adds its shared expert, scaled by sigmoid(h W)."""
    x = bp.experts
    assert x is not None
    act = fw.ACTIVATIONS[bp.act]

    def read(tensor: Tensor) -> FloatArray:
        return reader.read(prefix, tensor, plan).astype(np.float64)

    if x.own is not None:  # the family's own mixture, its stacked experts read a row at a time
        assert isinstance(reader, LeanReader)
        return x.own(h, MixtureReads(read, partial(_stacked_row, reader, prefix, plan), act))
    chosen, weights = _route(x, h, read)  # (T, k) each

    def expert(e: int, rows: FloatArray) -> FloatArray:
        if x.stacked is not None:
            return _stacked_expert(reader, prefix, plan, x.stacked, e, rows)
        gate, up, down = (read(tensor) for tensor in x.each(e))
        return fw.gated_mlp(rows, gate.T, up.T, down.T, act)

    out = fw.mixture(h, chosen, weights, expert)
    if x.shared is not None:
        gate, up, down, sigmoid = (read(tensor) for tensor in x.shared)
        shared = fw.gated_mlp(h, gate.T, up.T, down.T, act)  # (T, C)
        out = out + ops.sigmoid(h @ sigmoid.T) * shared  # (T, 1) gate per token
    if x.plain_shared is not None:  # DeepSeek V3's shared experts, on every token, ungated
        gate, up, down = (read(tensor) for tensor in x.plain_shared)
        out = out + fw.gated_mlp(h, gate.T, up.T, down.T, act)
    return out


def _route(
    x: Experts, h: FloatArray, read: Callable[[Tensor], FloatArray]
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], FloatArray]:
    """Each token's chosen experts and their weights [T, k]: a softmax router (gpt-oss's with
    its bias; DeepSeek V2's greedy one), or DeepSeek V3's grouped sigmoid one."""
    logits = h @ read(x.router).T  # (T, E)
    if x.router_bias is not None:
        logits = logits + read(x.router_bias)
    if x.greedy is not None:
        return fw.route_greedy(logits, x.k, x.greedy.groups, x.greedy.scale)
    if x.corrected is not None:
        bias = read(x.corrected.correction).reshape(-1)  # (E,): saved as (1, E)
        return fw.route_corrected(logits, x.k, bias, x.corrected.norm_min)
    if x.grouped is None:
        return fw.route_logits(logits, x.k, x.normalize)
    g = x.grouped
    return fw.route_grouped(logits, x.k, read(g.correction), g.groups, x.normalize, g.scale)


def _stacked_row(
    reader: LeanReader, prefix: str, plan: LayerPlan, tensor: Tensor, e: int
) -> FloatArray:
    """Row ``e`` of a stacked tensor (one expert's), read alone and widened."""
    row: FloatArray = reader.block(prefix, tensor, plan, e, 1)[0].astype(np.float64)
    return row


def _stacked_expert(
    reader: Reader, prefix: str, plan: LayerPlan, s: Stacked, e: int, rows: FloatArray
) -> FloatArray:
    """gpt-oss's expert ``e`` on the tokens that chose it [n, C]: its row of each stacked
    tensor read alone, (clamped swiglu(rows W_gate_up + b)) W_down + b."""
    assert isinstance(reader, LeanReader)
    gate_up, gate_up_b, down, down_b = (
        reader.block(prefix, tensor, plan, e, 1)[0].astype(np.float64) for tensor in s.tensors()
    )  # (C, 2F), (2F,), (F, C), (C,)
    out: FloatArray = fw.clamped_swiglu(rows @ gate_up + gate_up_b, s.alpha, s.limit) @ down
    out = out + down_b  # (n, C)
    return out


def _attention(
    reader: Reader, prefix: str, plan: LayerPlan, x: FloatArray, out: Walk | None = None
) -> tuple[FloatArray, FloatArray]:
    """The layer's attention weights (heads, T, T) and output projection (T, C): attn's trace
    of the fixture ``attn import`` makes from this residual stream (whole, and handed to
    ``out.each_trace``, when that is set)."""
    from attn_cli.core.pipeline import run
    from attn_cli.io.validate import validate

    found = {t.role: reader.read(prefix, t, plan) for t in plan.tensors}
    X = x if plan.pre_norm is None else ck.normalize_rows(x, plan.pre_norm, found)
    ck.require_finite(X, reader.source)
    hook = None if out is None else out.each_trace
    tokens = None if hook is None or out is None else out.tokens
    fixture = ck.layer_fixture(plan, found, X, tokens, Path(reader.source), None, Path("-"))
    if hook is not None:
        below = f" through layers 0-{plan.layer - 1} in NumPy" if plan.layer else ""
        fixture["description"] = fixture["description"].replace(
            "X from the hidden states -", f"X from the text's embeddings{below}"
        )
    maps = plan.softmax and (out is None or out.maps)
    keep = ("softmax", "projected") if maps else ("projected",)
    trace = run(
        validate(fixture, f"{reader.source} (layer {plan.layer})"),
        keep=None if hook is not None else keep,
    )
    if hook is not None:
        hook(plan.layer, trace)
    projected = np.asarray(trace["projected"].data)
    if not maps:  # linear attention (no softmax map), or none asked for: a layer of no heads
        return np.zeros((0, len(x), len(x))), projected  # (0, T, T)
    return np.asarray(trace["softmax"].data), projected


def _norm_of(norm: Norm, t: Mapping[str, FloatArray]) -> fw.Norm:
    return lambda h: ck.normalize_rows(h, norm, t)


def activation(name: str, t: Mapping[str, FloatArray]) -> Callable[[FloatArray], FloatArray]:
    """The activation ``name``; a learned one (fw.PARAMETRIC) with its parameters' values from
    the layer's tensors (roles ``act.<name>``)."""
    if name not in fw.PARAMETRIC:
        return fw.ACTIVATIONS[name]
    fn, params = fw.PARAMETRIC[name]
    values = {p: float(np.asarray(t[f"act.{p}"], dtype=np.float64).reshape(-1)[0]) for p in params}
    return partial(fn, **values)


def mlp_as_stored(bp: BlockPlan, t: Mapping[str, FloatArray], h: FloatArray) -> FloatArray:
    """The MLP on h [T, C] (float64) in its weights' precision as read (float32 unless stored
    as F64), as the model computes it, its weights never widened; float64 (the weights
    widened) where float32 overflows. The result is added to the float64 residual."""
    dtype = np.result_type(*t.values())
    if dtype != np.float64:
        with np.errstate(over="ignore", invalid="ignore"):
            out = _mlp(bp, t, h.astype(dtype))  # (T, C)
        if np.isfinite(out).all():
            return out
    return _mlp(bp, {role: w.astype(np.float64) for role, w in t.items()}, h)


def _mlp(bp: BlockPlan, t: Mapping[str, FloatArray], h: FloatArray) -> FloatArray:
    """The MLP on h [T, C], in h's dtype (the weights' own)."""
    act = _in_dtype(activation(bp.act, t))
    if bp.mlp == "dense":
        W_in, W_out = (t["in.weight"], t["out.weight"])
        if not bp.conv1d:  # nn.Linear [out, in]
            W_in, W_out = W_in.T, W_out.T
        return fw.dense_mlp(h, W_in, t.get("in.bias"), W_out, t.get("out.bias"), act)
    if bp.mlp == "gated_fused":  # Phi-3: gate_up_proj's rows are the gate's, then the up's
        W_gate, W_up = np.split(t["gate_up.weight"], 2, axis=0)
    else:
        W_gate, W_up = t["gate.weight"], t["up.weight"]
    biases = (t.get("gate.bias"), t.get("up.bias"), t.get("down.bias"))
    return fw.gated_mlp(h, W_gate.T, W_up.T, t["down.weight"].T, act, biases)


def _in_dtype(act: Callable[[FloatArray], FloatArray]) -> Callable[[FloatArray], FloatArray]:
    """``act`` returning its input's dtype (core/forward.py's are float64): the product after
    it stays in float32 rather than widening its weights."""
    return lambda x: act(x).astype(x.dtype, copy=False)


def _logits(
    reader: LeanReader, prefix: str, head: HeadPlan, plan: LayerPlan, x: FloatArray
) -> FloatArray:
    """The final norm, then the LM head (tied: the token embeddings): [T, vocab]."""
    outer = prefix[: -len("model.")] if prefix.endswith("model.") else ""
    t: dict[str, FloatArray] = {}
    for tensor in head.tensors[:-1]:  # the final norm's
        t[tensor.role] = reader.read(prefix, tensor, plan)
    h = x if head.norm is None else ck.normalize_rows(x, head.norm, t)
    W = head.tensors[-1]  # (vocab, C): read and widened a block of rows at a time
    at = prefix if W.name == plan.embed_tensors[0].name else outer
    logits = np.empty((h.shape[0], W.shape[0]))  # (T, vocab)
    for start in range(0, W.shape[0], _HEAD_ROWS):
        rows = reader.block(at, W, plan, start, _HEAD_ROWS).astype(np.float64)  # (rows, C)
        logits[:, start : start + rows.shape[0]] = h @ rows.T
    if head.bias is not None:  # Phi's LM head
        logits += reader.read(outer, head.bias, plan).astype(np.float64)
    if head.logit_scale is not None:  # Cohere
        logits *= head.logit_scale
    if head.divide is not None:  # Granite's logits_scaling
        logits = logits / head.divide
    return fw.cap_logits(logits, head.final_cap)


_HEAD_ROWS = 4096  # LM head rows widened at once


def _check_block_budget(
    reader: Reader,
    prefix: str,
    plan: LayerPlan,
    bp: BlockPlan,
    tokens: int,
    budget: int | None,
) -> None:
    """Refuse, before the layer is read, a block whose norms and MLP would hold more than
    ``budget`` bytes: its tensors widened to float64 (a mixture: the router, k experts, the
    shared one), the float32 read beside the largest, and the MLP's activations (float64)."""
    from attn_cli.core.memory import default_max_memory, format_bytes

    limit = default_max_memory() if budget is None else budget
    tensors = list(bp.tensors)
    if bp.experts is not None:
        x = bp.experts
        tensors += [x.router, *(t for e in range(x.k) for t in x.each(e)), *(x.shared or ())]
        tensors += [*(x.plain_shared or ()), *(x.stacked.tensors() if x.stacked else ())]
        tensors += [*(x.own.held() if x.own else ())]
    sizes = [math.prod(t.shape) for t in tensors]
    if bp.experts is not None and bp.experts.stacked is not None:  # k rows of each stacked one
        x = bp.experts
        sizes[-4:] = [size // x.count * x.k for size in sizes[-4:]]
    widest = max((t.shape[0] for t in tensors if len(t.shape) == 2), default=0)
    need = 8 * sum(sizes) + 4 * max(sizes, default=0) + 3 * 8 * tokens * max(widest, plan.hidden)
    if need > limit:
        at = max(range(len(sizes)), key=sizes.__getitem__)
        raise InputError(
            reader.source,
            prefix + tensors[at].name,
            f"computing layer {plan.layer}'s MLP would need about {format_bytes(need)} of "
            f"memory (its tensors in float64; the largest, {list(tensors[at].shape)})",
            f"at most {format_bytes(limit)}",
            option="max-memory",
        )


def _expert_tensors(bp: BlockPlan) -> list[Tensor]:
    """Every tensor of a mixture of experts (the check's list: only chosen ones are read)."""
    x = bp.experts
    if x is None:
        return []
    more = [*(x.plain_shared or ()), *(x.stacked.tensors() if x.stacked else ())]
    more += [*(x.own.tensors() if x.own else ())]
    corrections = (x.grouped and x.grouped.correction, x.corrected and x.corrected.correction)
    more += [t for t in (x.router_bias, *corrections) if t is not None]
    return [x.router, *(t for e in range(x.count) for t in x.each(e)), *(x.shared or ()), *more]


def _check_block_tensors(
    names: list[str], prefix: str, plan: LayerPlan, bp: BlockPlan, source: str
) -> None:
    """Every tensor of the layer is read by its attention plan or its block plan: an MoE
    router, an extra norm or a bias no block here has means another model, refused."""
    block = prefix + plan.block
    read = {prefix + t.name for t in (*plan.tensors, *bp.tensors, *_expert_tensors(bp))}
    unused = re.compile(plan.unused)
    for name in names:
        if name.startswith(block) and name not in read:
            rest = name[len(block) :]
            if bp.experts is not None and bp.experts.stacked is not None:
                _refuse_mxfp4(source, name)
            if not unused.fullmatch(rest):
                raise InputError(
                    source,
                    name,
                    f"a tensor of layer {plan.layer} that the {plan.family} block has no place for",
                    "only the attention's, the norms' and the MLP's",
                )


def _refuse_mxfp4(source: str, name: str) -> None:
    """gpt-oss as OpenAI released it: each expert tensor as MXFP4 blocks and scales."""
    if name.endswith(("_proj_blocks", "_proj_scales")):
        raise InputError(
            source,
            name,
            "gpt-oss's experts quantized to MXFP4 (blocks and scales), which the "
            "forward does not dequantize",
            "float experts (gate_up_proj, down_proj: a BF16 or dequantized copy of the checkpoint)",
        )


# ---------------------------------------------------------------------------------------------
# What the CLI asks for


def import_deep(
    checkpoint: Path,
    *,
    layer: int,
    text: str,
    config: Path | None = None,
    arch: str | None = None,
    max_memory: int | None = None,
) -> ck.ImportedLayer:
    """Layer ``layer``'s attention as a fixture, X from ``text`` through layers 0 .. layer-1."""
    ck.check_inputs(0, None, text)  # the text's checks (layer 0: the text embeds it)
    _, files, config_path = locate(Path(checkpoint), config)
    cfg = Config(read_json(config_path, "config.json"), str(config_path))
    family, _ = resolve_family(cfg, arch)
    plan = plan_layer(cfg, family, layer)  # the layer exists, before any is computed
    w = walk(
        checkpoint, text, through=layer, config=config, arch=arch, max_memory=max_memory, maps=False
    )
    assert w.residual is not None
    with LeanReader(files) as reader:
        prefix = prefix_of(reader.names, plan, reader.source)
        check_tensors(reader.names, prefix, plan, reader.source)
        ck.check_budget(reader, prefix, plan, len(w.ids), None, max_memory)
        found = {t.role: reader.read(prefix, t, plan) for t in plan.tensors}
        widened = sorted(reader.widened)
    X = w.residual if plan.pre_norm is None else ck.normalize_rows(w.residual, plan.pre_norm, found)
    ck.require_finite(X, str(checkpoint))
    fixture = ck.layer_fixture(plan, found, X, w.tokens, Path(checkpoint), text, None)
    fixture["description"] = fixture["description"].replace(
        "X from the text", f"X from layers 0-{layer - 1} computed in NumPy on the text"
    )
    ck.check_fixture(fixture, str(config_path))
    notes = [*w.notes, *plan.notes, _deep_note(plan, layer)]
    if widened:
        notes.append(f"{', '.join(widened)} tensors widened to float32 (exact)")
    return ck.ImportedLayer(fixture=fixture, family=w.family, notes=tuple(notes))


def _deep_note(plan: LayerPlan, layer: int) -> str:
    after = " then the layer's norm," if plan.pre_norm is not None else ""
    return (
        f"X = the text's embeddings through layers 0-{layer - 1} (attention by attn's chain, "
        f"norms and MLP in NumPy),{after} computed in float64, the MLPs' products in their "
        "weights' own precision (float32 unless stored as F64), as the model computes them"
    )


def check_layer_choice(layer: str) -> int | None:
    """``--layer``: a whole number >= 0, or ``all`` (None)."""
    if layer.strip().lower() == "all":
        return None
    try:
        value = int(layer)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(
            "", "layer", f"got {layer!r}", "a layer number >= 0, or all", option="layer"
        )
    return value


def top_tokens(
    checkpoint: Path, config: Path | None, logits: FloatArray, k: int = 5
) -> list[tuple[str, int, float]]:
    """The ``k`` most likely next tokens after the last position: (token, id, probability),
    each token's text from the checkpoint's tokenizer.json."""
    folder = locate(Path(checkpoint), config)[0]
    path = folder / "tokenizer.json"
    tokenizers = require("tokenizers")
    raw = gate.read_bytes(path, str(path), "tokenizer.json", max_bytes=MAX_JSON_BYTES)
    tokenizer = tokenizer_call(
        path,
        lambda: tokenizers.Tokenizer.from_str(raw.decode("utf-8", "replace")),
        "unreadable tokenizer",
        "a tokenizer.json",
    )
    last = logits[-1]
    p = softmax(last)  # (vocab,) softmax of the last position
    out = []
    for i in np.argsort(-p, kind="stable")[:k]:
        name = tokenizer.id_to_token(int(i))
        out.append((f"<id {int(i)}>" if name is None else str(name), int(i), float(p[i])))
    return out
