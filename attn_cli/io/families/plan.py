"""What ``attn import`` plans for one layer of a checkpoint: its tensors, sizes, norms and the
variants' settings (``LayerPlan``), and its block past attention for the NumPy forward
(``BlockPlan``, ``Experts``, ``HeadPlan``). A family's module builds them from config.json.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from attn_cli.core.forward import Placement

FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
NormKind = Literal["layer", "rms", "rms1p"]


@dataclass(frozen=True)
class Tensor:
    """One tensor the import reads: role, name (no prefix), the shape config.json implies."""

    role: str
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Norm:
    """A norm over the last axis: LayerNorm, RMSNorm, or Gemma's RMSNorm with 1 + weight."""

    kind: NormKind
    eps: float
    weight: str | None  # role of the weight tensor (None: OLMo's LayerNorm has none)
    bias: str | None = None  # role of the bias tensor (LayerNorm)


@dataclass(frozen=True)
class Embedding:
    """How layer 0's input is made from token ids: tables, BERT's LayerNorm, Gemma's scale."""

    tokens: str
    positions: str | None = None
    types: str | None = None
    norm: Norm | None = None
    scale: float | None = None  # Gemma: sqrt(hidden), rounded to the table's dtype
    multiplier: float | None = None  # Granite's embedding_multiplier
    position_offset: int | None = None  # RoBERTa: positions start at pad_token_id + 1


@dataclass(frozen=True)
class Rope:
    """Rotary embedding of Q and K: base, rotated dims per head, HF ``rotate_half`` layout."""

    base: float
    dims: int
    layout: Literal["half", "interleaved"] = "half"
    # RoPE scaling as a fixture's rope.scaling: {type: llama3, factor: 8, ...}; None: none
    scaling: tuple[tuple[str, Any], ...] | None = None


@dataclass(frozen=True)
class FromTensors:
    """A variant's fixture value made once the layer's tensors are read: ``make`` gets them by
    role and the fixture's weights (``W_Q`` ... ``W_G``)."""

    make: Callable[[Mapping[str, FloatArray], Mapping[str, FloatArray]], Any]


class FrontEnd(Protocol):
    """A variant that makes Q, K and V itself (multi-head latent attention, Gated DeltaNet):
    the fixture holds its key and W_O in place of W_Q, W_K, W_V."""

    @property
    def variant(self) -> str: ...  # the fixture's key it fills

    @property
    def softmax(self) -> bool: ...  # False: a linear layer, no softmax map

    @property
    def scaled(self) -> bool: ...  # the fixture's scale is the plan's (mla), or none is given

    def fixture(
        self, heads: int, t: Mapping[str, FloatArray]
    ) -> tuple[dict[str, Any], FloatArray]: ...

    def sizes(self, hidden: int) -> str | None: ...  # its sizes, where not heads and head_dim

    def describe(
        self, plan: LayerPlan, label: str, checkpoint: str, given: str
    ) -> tuple[str, str] | None: ...


@dataclass(frozen=True)
class LayerPlan:
    """What layer ``layer`` of a checkpoint is: its tensors, sizes and attention conventions.

    ``variants`` holds each variant's setting by its name, as the fixture takes it (``window``:
    4096, ``rope``: {base, layout, dims, scaling.*}), or a ``FromTensors`` made from the layer's
    tensors (``gate``, a family's own variants' weights), in the order the fixture lists them."""

    family: str
    layer: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layout: Literal["linear", "conv1d", "qkv_rows", "qkv_heads"]
    anchor: str  # a regex of a tensor of every layer; its match finds the checkpoint's prefix
    tensors: tuple[Tensor, ...]  # the layer's tensors, all required
    embed_tensors: tuple[Tensor, ...]  # read only to embed --text
    pre_norm: Norm | None
    embedding: Embedding
    causal: bool
    scale: float
    variants: Mapping[str, Any] = field(default_factory=dict)
    positions: bool = False  # the fixture's positions 0..T-1 (RoPE, a window)
    front_end: FrontEnd | None = None  # a variant making Q, K, V (the fixture's mla key, ...)
    q_gate_rows: bool = False  # q_proj's rows per head: head_dim query rows, then gate rows
    notes: tuple[str, ...] = ()
    block: str = ""  # the layer's own prefix (``layers.3.``): its modules below are checked
    # where the layers may be (a wrapper's text model: the first is what transformers saves);
    # none: any prefix
    prefixes: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()  # modules of the block whose every tensor the plan reads
    unused: str = "$^"  # a regex (after ``block``) of tensors there the model never uses

    @property
    def softmax(self) -> bool:
        """Whether the layer has a softmax map (a linear-attention layer has none)."""
        return self.front_end is None or self.front_end.softmax


@dataclass(frozen=True)
class BlockPlan:
    """One block past its attention: where the norms sit, the MLP's tensors and activation."""

    placement: Placement
    norms: Mapping[str, Norm]  # by role: attn_out, mlp_in, mlp_out
    mlp: str  # "dense", "gated", "gated_fused", "moe"
    conv1d: bool  # GPT-2's Conv1D is [in, out] already
    act: str
    tensors: tuple[Tensor, ...]
    experts: Experts | None = None  # a mixture of experts in place of the MLP (mlp "moe")
    residual: float | None = None  # Granite's residual_multiplier on both branches


@dataclass(frozen=True)
class MixtureReads:
    """What the forward hands a family's own mixture: readers of the layer's tensors (whole, or
    row e of a stacked one: one expert's), widened to float64, and the block's activation."""

    whole: Callable[[Tensor], FloatArray]
    row: Callable[[Tensor, int], FloatArray]
    act: Callable[[FloatArray], FloatArray]


class OwnMixture(Protocol):
    """A mixture of experts its family computes whole (Llama 4's, whose experts take their
    input scaled by the router's weight), on the post-attention-norm rows h [T, C]."""

    def tensors(self) -> tuple[Tensor, ...]: ...  # what it reads beside the Experts' router

    def held(self) -> tuple[Tensor, ...]: ...  # what it holds at once (the memory budget's)

    def __call__(self, h: FloatArray, reads: MixtureReads) -> FloatArray: ...


@dataclass(frozen=True)
class Experts:
    """A mixture of experts: the router's tensor, each expert's gate/up/down (read only when a
    token chooses it), top-k, renormalised or not, and Qwen2-MoE's gated shared expert."""

    router: Tensor
    each: Callable[[int], tuple[Tensor, ...]]  # expert e's gate, up, down (none: stacked)
    count: int
    k: int
    normalize: bool
    shared: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # gate, up, down, its sigmoid gate
    router_bias: Tensor | None = None  # gpt-oss: added to the router's logits
    stacked: Stacked | None = None  # gpt-oss: every expert in one tensor each
    grouped: Grouped | None = None  # DeepSeek V3's sigmoid router
    plain_shared: tuple[Tensor, Tensor, Tensor] | None = None  # DeepSeek V3: gate, up, down
    greedy: Greedy | None = None  # DeepSeek V2's softmax router
    corrected: Corrected | None = None  # ERNIE 4.5 MoE's softmax router with its correction
    own: OwnMixture | None = None  # computed whole by the family (Llama 4's), the rest unread


@dataclass(frozen=True)
class Stacked:
    """gpt-oss's experts (GptOssExperts): expert e is row e of each tensor, [in, out] already;
    gate_up's columns interleave gate and up; biases; the clamped swiglu."""

    gate_up: Tensor  # (E, C, 2F)
    gate_up_bias: Tensor  # (E, 2F)
    down: Tensor  # (E, F, C)
    down_bias: Tensor  # (E, C)
    alpha: float  # swiglu_alpha
    limit: float  # swiglu_limit

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.gate_up, self.gate_up_bias, self.down, self.down_bias)


@dataclass(frozen=True)
class Grouped:
    """DeepSeek V3's router (DeepseekV3TopkRouter): sigmoid scores, the choice moved by
    e_score_correction_bias and kept to the best topk_group of n_group groups."""

    correction: Tensor  # e_score_correction_bias (E,)
    groups: tuple[int, int]  # n_group, topk_group
    scale: float  # routed_scaling_factor


@dataclass(frozen=True)
class Corrected:
    """ERNIE 4.5 MoE's router (Ernie4_5_MoeTopKRouter): softmax over every expert, the choice
    moved by e_score_correction_bias, the chosen weights over max(their sum, moe_norm_min)."""

    correction: Tensor  # moe_statics.e_score_correction_bias (1, E)
    norm_min: float  # moe_norm_min


@dataclass(frozen=True)
class Greedy:
    """DeepSeek V2's router (DeepseekV2TopkRouter): softmax over every expert, the top k
    (topk_method greedy) or the top k within the topk_group best of n_group groups, a group
    worth its best score (group_limited_greedy); the weights not renormalised, times
    routed_scaling_factor."""

    groups: tuple[int, int] | None  # n_group, topk_group; None: greedy
    scale: float  # routed_scaling_factor


@dataclass(frozen=True)
class HeadPlan:
    """The final norm and the LM head."""

    norm: Norm | None
    tensors: tuple[Tensor, ...]  # the norm's, then "head" (the LM head or the tied embeddings)
    final_cap: float | None  # the logits capped, cap · tanh(logits / cap) (Gemma 2); None: not
    bias: Tensor | None = None  # the LM head's bias (Phi)
    logit_scale: float | None = None  # logits times this (Cohere's logit_scale)
    divide: float | None = None  # Granite's logits_scaling: logits / it
