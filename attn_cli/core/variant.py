"""What a variant of attention is: one object, found by its name, with hooks into the one chain.

The chain (core/chain.py) is written once::

    scores = q·kᵀ -> scaled = scores × scale -> score modifiers (capped, ...) ->
    masked = + additive biases, the fill where a key is not allowed -> softmax with extra
    logits -> output = weights·v

and every loop that computes attention runs it over its own cells: the block engine (query rows
of one head), KV-cache decoding (one query against the cache), FlashAttention-2 (a tile), the
backward pass and the grader (whole arrays). A variant says what it does at each hook, as
PyTorch's FlexAttention says it with ``score_mod`` and ``mask_mod``; no loop names a variant.

A variant's setting lives in the fixture under its ``name`` (``window: 3``); ``value(inputs)``
reads it (a field of :class:`Inputs`, else ``inputs.extra[name]``), None when it is off.
Axis names as in steps.py; a hook's arrays broadcast to the cells' (b, h, R, S).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, cast

import numpy as np

from attn_cli.core.roles import (
    ADDS_BIAS,
    EXTRA_LOGIT,
    HIDES_KEYS,
    KEEPS_STATE,
    MAKES_QKV,
    MODIFIES_SCORES,
    REPLACES_SOFTMAX,
    TRANSFORMS_OUTPUT,
    TRANSFORMS_QK,
    TWO_MAPS,
)
from attn_cli.core.stage_spec import K_AXES, OUT_AXES, Q_AXES, SCORE_AXES, StageSpec

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    from attn_cli.core.inputs import Inputs

    Setting = TypeVar("Setting", default=Any)  # a variant's setting; bare Variant: Variant[Any]
else:
    from typing import TypeVar

    Setting = TypeVar("Setting")

FloatArray = np.ndarray[Any, np.dtype[np.float64]]  # float32 too, at run time
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
Cast = Callable[[str, FloatArray], FloatArray]  # an input's array in the computing dtype


def same(name: str, array: FloatArray) -> FloatArray:
    """The array as it is (a float64 run, or a caller that casts nothing)."""
    return array


class Cells(NamedTuple):
    """The (batch, head, query, key) cells one call of the chain covers, as index vectors.

    ``queries`` and ``keys`` are token indices into the fixture's sequence (a cache slot that
    holds no token yet is -1); ``pos_q`` and ``pos_k`` their positions (RoPE, ALiBi, window).
    """

    batch: IntArray  # (b,)
    heads: IntArray  # (h,) query heads
    queries: IntArray  # (R,)
    keys: IntArray  # (S,)
    pos_q: IntArray  # (R,)
    pos_k: IntArray  # (S,)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(b, h, R, S): what every hook's array broadcasts to."""
        return (len(self.batch), len(self.heads), len(self.queries), len(self.keys))


class FixtureKey(Protocol):
    """The fixture key a variant parses: callable as ``key(got, expected)``, or with
    ``field="rope.dims"`` for a part of the setting, it makes the one-line error to raise; it
    holds the sizes of the inputs and the settings parsed before, to check against."""

    @property
    def heads(self) -> int:
        """Query heads."""
        ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def d_k(self) -> int: ...

    @property
    def d_v(self) -> int: ...

    @property
    def d_model(self) -> int | None:
        """The width of X; None when Q, K and V are given directly."""
        ...

    @property
    def batch(self) -> int:
        """Batch items (1 when the inputs have no batch axis)."""
        ...

    @property
    def seq_q(self) -> int:
        """Query positions."""
        ...

    @property
    def seq_k(self) -> int:
        """Key positions."""
        ...

    @property
    def has_batch(self) -> bool:
        """Whether the inputs were given with a batch axis."""
        ...

    @property
    def masks(self) -> bool:
        """Whether some keys are hidden: a variant with an ``allowed`` rule parsed before
        (causal, a mask or lengths)."""
        ...

    def setting(self, name: str) -> Any:
        """The setting of the variant ``name`` as parsed before this key; None: off, or parsed
        after (the keys that hide keys are parsed before the other variants)."""
        ...

    def __call__(self, got: str, expected: str, field: str | None = None) -> Exception: ...

    def describe(self, value: Any) -> str:
        """``the string 'x'``, ``a mapping``, ``null``: what a message says was found."""
        ...

    def floats(
        self, value: Any, field: str, ndims: tuple[int, ...], doc: str, allow: tuple[str, ...] = ()
    ) -> FloatArray:
        """Numbers with one of ``ndims`` axes, counted against the fixture's size limit; finite,
        unless ``allow`` names the specials a list may hold (``"-inf"``)."""
        ...

    def shape(
        self, value: Any, field: str, leaf: Callable[[Any], bool], doc: str
    ) -> tuple[int, ...]:
        """The shape of nested lists, rectangular, each leaf passing ``leaf`` (``doc`` says what
        a leaf is), counted against the fixture's size limit."""
        ...


class NewOption(NamedTuple):
    """A flag of ``attn new`` that turns a variant on, as data: cli/new.py makes the Typer option
    of it (core imports no Typer); the flag is the name with dashes (``--rope-base``)."""

    name: str  # the parameter: "window", "rope_base"
    kind: type[Any]  # bool: a switch (off by default); int, float or str: a value (None: not given)
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()  # a str flag's only values
    min: int | None = None
    max: int | None = None
    field: str | None = None  # the fixture field it sets, where the loader may refuse its value
    example: tuple[str, str] | None = None  # a line of the help's examples: arguments, comment


class NewSpec(Protocol):
    """What a variant reads of the fixture ``attn new`` makes: its sizes and the flags given."""

    @property
    def heads(self) -> int: ...

    @property
    def d_k(self) -> int: ...

    @property
    def d_model(self) -> int: ...

    @property
    def kv_heads(self) -> int | None:
        """Key and value heads; None: as many as ``heads``."""
        ...

    @property
    def causal(self) -> bool: ...

    @property
    def options(self) -> Mapping[str, Any]:
        """The variants' flags given, by name (a switch only when it is on)."""
        ...


@dataclass(frozen=True, eq=False)
class DecodeForm:
    """A cache of something other than K and V: the query, key and value decoding attends with
    (q (B, H, T, Dq), k (B, Hc, T, Dq), v (B, Hc, T, Dc), already at their positions: nothing is
    rotated on the way in) and ``finish``, which turns each step's softmax·v (B, H, n, Dc) into
    the layer's output (B, H, n, Dv). MLA's: the latent c_KV and the RoPE key, one for every
    head, with W_UK absorbed into the query and W_UV applied after."""

    q: FloatArray
    k: FloatArray
    v: FloatArray
    finish: Callable[[FloatArray], FloatArray]
    cached: int  # numbers one token adds to the cache (v's columns inside k's are not twice)
    parts: str  # what the cache holds, as a formula: "[c_KV_norm | k_rope_rot]"


@dataclass(frozen=True, eq=False)
class QKAt:
    """What a Q/K transform runs on besides the array: Q or K (``which``) of these inputs, at
    the tokens' ``positions`` (n,); ``cast(name, array)`` gives an array of the setting in the
    computing dtype."""

    inputs: Inputs
    which: str  # "Q" or "K"
    positions: IntArray  # (n,)
    cast: Cast = same


@dataclass(frozen=True, eq=False)
class Traced:
    """What a hook reads of a run: its inputs, the stages it reads by name (``arrays``,
    internal layouts) and ``cast(name, array)``, an array of the setting in the computing
    dtype."""

    inputs: Inputs
    arrays: Mapping[str, FloatArray]
    cast: Cast = same


def exact(x: Any) -> str:
    """A number as the literal that reads back as the same float (YAML, Python); -0.0 as 0.0."""
    return repr(float(x) + 0.0)


class Variant(Generic[Setting]):
    """One kind of attention variant; every hook is optional (the base does nothing).

    Subclasses set ``name`` and override the hooks they use. The hooks receive the variant's
    ``value`` (its setting, never None) as first argument after ``inputs`` where they need it.
    """

    name: str = ""
    # where it runs among the others at each hook (the registry's order); a variant from
    # outside the package goes after the built-in ones unless it says otherwise
    order: int = 1000
    # a score modifier's stage (written after `scaled`, before `masked`), e.g. "capped"
    stage: str | None = None
    # an additive bias that is a stage of its own (ALiBi): kept like any other score stage
    bias_stage: str | None = None
    # the gradient stage of an extra logit (d_<name>), laid out (H,)
    gradient: str | None = None
    # its roles in the chain when its hooks do not say them (None: ``roles_of`` reads them from
    # the hooks), and the roles it cannot run beside (``first_clash``)
    declares: frozenset[str] | None = None
    cannot_run_with: frozenset[str] = frozenset()

    # -- the fixture key: parsing, the JSON config, the layout of its arrays -------------------

    # where a file reference or a NumPy array may stand in the setting: "" the whole setting
    # (a list per head), else the subkeys of a mapping (rope.base)
    array_parts: tuple[str, ...] = ()
    # the subkeys of a setting that is a mapping (a whole-fixture .npz spells them KEY.SUBKEY)
    subkeys: tuple[str, ...] = ()
    # it reads token positions (so the JSON config lists them, and `positions` has a reader)
    reads_positions: bool = False
    # where its key goes wherever the fixture's variants are listed, lowest first: the JSON
    # trace's config (a fixed key order), the known keys, what reads positions
    key_order: int = 100

    def parse(self, raw: Any, key: FixtureKey) -> Setting | None:
        """The setting as a fixture gives it (a number, a list, a mapping; never null), checked;
        None: off. ``key(got, expected)`` makes the one-line error to raise, and ``key`` holds
        what the setting is checked against (heads, seq_k, the settings parsed before ...; see
        :class:`FixtureKey`)."""
        parsed: Setting | None = raw
        return parsed

    def config(self, value: Setting, inputs: Inputs) -> Any:
        """The setting as the JSON trace's config writes it (plain JSON values)."""
        return value

    def value(self, inputs: Inputs) -> Setting | None:
        """The variant's setting in these inputs; None when it is off."""
        extra = inputs.extra
        setting: Setting | None = (
            extra[self.name] if self.name in extra else getattr(inputs, self.name, None)
        )
        return setting

    # -- its rows of the stage table (core/stages.py) and the formulas it writes --------------

    def stage_rows(self) -> tuple[StageSpec, ...]:
        """Its rows of the stage table, forward then gradient, made from the hooks it has: each
        transform's ``Q_<suffix>``/``K_<suffix>``, the modifier's ``stage``, the bias's
        ``bias_stage``, and their gradients; a head-output transform's ``out_stages``. The table
        adds what a row needs from its neighbours in the chain and writes the gradients'
        formulas of transforms and modifiers (from :meth:`grad_formula`)."""
        on, rows = self.applies, []
        for which in self.transforms if self.suffix is not None else ():
            name, axes = f"{which}_{self.suffix}", Q_AXES if which == "Q" else K_AXES
            rows.append(StageSpec(name, (), axes, False, name, on, self.formula_of(name)))
        if self.stage is not None:
            rows.append(
                StageSpec(
                    self.stage, (), SCORE_AXES, True, self.stage, on, self.formula_of(self.stage)
                )
            )
        if self.bias_stage is not None:
            rows.append(
                StageSpec(
                    self.bias_stage,
                    (),
                    SCORE_AXES,
                    True,
                    self.bias_stage,
                    on,
                    self.formula_of(self.bias_stage),
                )
            )
        for row in tuple(rows):
            explain = "d_logits" if row.score_like else "d_query_key"
            rows.append(row._replace(name=f"d_{row.name}", explain=explain, gradient=True))
        needs = self.out_needs if isinstance(self, OutTransform) else lambda name: ("output",)
        for name in self.out_stages:  # a head-output transform's: no gradient rows
            rows.append(
                StageSpec(name, needs(name), OUT_AXES, False, name, on, self.formula_of(name))
            )
        if self.gradient is not None:  # an extra logit's
            rows.append(
                StageSpec(
                    self.gradient,
                    ("delta", "softmax"),
                    ("head",),
                    False,
                    self.gradient,
                    on,
                    self.formula_of(self.gradient),
                    gradient=True,
                )
            )
        return tuple(r for r in rows if r.name != f"d_{self.bias_stage}")  # a bias takes none

    def applies(self, inputs: Inputs) -> bool:
        """Whether it is on in these inputs (its stage rows apply)."""
        return self.value(inputs) is not None

    def formula_of(self, stage: str) -> Callable[[Inputs], str]:
        """The formula of one of its stages, as the table calls it."""
        return lambda inputs: self.stage_formula(cast("Setting", self.value(inputs)), inputs, stage)

    def stage_formula(self, value: Setting, inputs: Inputs, stage: str) -> str:
        """The formula of one of its own stages (``capped = cap × tanh(...)``)."""
        return stage

    def formula_part(self, value: Setting, inputs: Inputs, stage: str) -> str:
        """What it adds to another stage's formula (``softmax``: a sink joined); "": nothing."""
        return ""

    def grad_formula(self, value: Setting, inputs: Inputs, d_out: str, x_in: str) -> str:
        """Its gradient: d(``x_in``) from ``d_out``, as a formula (``RoPE⁻¹(d_Q_rot)``)."""
        return f"d_{x_in} from {d_out}"

    # -- Q/K transforms: Q -> Q_<suffix>, K -> K_<suffix>, before the scores (QK-norm, RoPE) ---

    # the suffix of its stages: "norm" makes Q_norm and K_norm (and d_Q_norm, d_K_norm)
    suffix: str | None = None
    # which of Q and K it transforms
    transforms: tuple[str, ...] = ("Q", "K")
    # it reads each token's position: decoding applies it, and every transform after it, as a
    # token arrives (a key once, when it enters the cache; a query at its position), not to the
    # whole sequence up front
    positional: bool = False
    # its gradients are listed after the input projections' in ``Gradients.stages()`` (QK-norm)
    grad_late: bool = False

    def transform(self, value: Setting, at: QKAt, x: FloatArray) -> FloatArray:
        """Q or K (``at.which``), (B, heads, n, D) at the tokens ``at.positions`` (n,),
        transformed."""
        raise NotImplementedError(f"{self.name} transforms neither Q nor K")

    def grad_transform(
        self, value: Setting, at: QKAt, d_out: FloatArray, x_in: FloatArray
    ) -> FloatArray:
        """d(transformed) -> d(x_in), the transform's Jacobian (transposed) applied."""
        raise NotImplementedError(f"{self.name} transforms neither Q nor K")

    def transform_v(self, value: Setting, v: FloatArray) -> FloatArray:
        """V (B, kv_heads, S, Dv) as the projections leave it, changed in place of V
        (a clamp to [-c, c]); by default as it is."""
        return v

    # -- additive biases: added in `masked` (the fixture's bias, ALiBi) ------------------------

    def bias(self, value: Setting, inputs: Inputs, cells: Cells, dtype: Any) -> FloatArray | None:
        """The bias of the cells, broadcasting to (b, h, R, S); None: this variant adds none."""
        return None

    def bound_bias(self, value: Setting, inputs: Inputs) -> float:
        """The largest finite |bias| (overflow checks)."""
        return 0.0

    # -- allowed keys: where a query may attend (causal, window, mask, lengths) ----------------

    def allowed(self, value: Setting, inputs: Inputs, cells: Cells) -> BoolArray | None:
        """True where a query may attend, broadcasting to (b, h, R, S); None: all may."""
        return None

    def hides(self, value: Setting) -> str | None:
        """How the `masked` formula names what this variant hides (``window 3``); None: nothing."""
        return None

    # -- head-output transforms: output -> its stages, per head, before concat (a gate) ------

    # its stages in the order they are computed, each laid out (batch, head, query, d_v) as
    # output is; the last is the output transformed, what concat joins ("gate", "gated")
    out_stages: tuple[str, ...] = ()

    # the chain's stages it reads besides output and X (differential attention's second map:
    # Q, K, V and the first softmax), held whole by a run and handed to it in ``seen``
    out_reads: tuple[str, ...] = ()

    # its gradient stages in backward order (d_gated, d_gate, its weights'): rows it adds in
    # ``stage_rows``, computed by ``grad_out``
    out_gradients: tuple[str, ...] = ()

    # -- a front end: Q, K and V made by the variant itself from X (MLA's latent) ------------

    # its stages before Q, K and V (its ``stage_rows`` list them; the table puts them there)
    front_stages: tuple[str, ...] = ()
    # a second form of the same attention, computed beside the chain from its stages (its rows
    # go after ``projected``), and the pairs (its stage, the chain's) that must agree to rounding
    side_stages: tuple[str, ...] = ()
    side_equal: tuple[tuple[str, str], ...] = ()
    # why it cannot run beside what it refuses (``cannot_run_with``), for the message the
    # fixture's loader writes (differential attention's); "": the loader's own words
    excludes_why: str = ""

    @property
    def excludes(self) -> tuple[str, ...]:
        """The keys of the registered variants it cannot run beside (their roles meet its
        ``cannot_run_with``), in registry order: a front end's other ways of making Q and K."""
        return tuple(
            n for n, v in REGISTRY.items() if v is not self and roles_of(v) & self.cannot_run_with
        )

    def latent_sizes(self, value: Setting, heads: int) -> tuple[int, int]:
        """A front end's (d_k, d_v) per head, from its setting."""
        raise NotImplementedError(f"{self.name} makes no Q, K, V")

    # a front end's gradient rows (``stage_rows`` lists them; the table puts them after the
    # base rows), in backward order, and the forward stages ``grad_front`` reads
    front_gradients: tuple[str, ...] = ()
    front_reads: tuple[str, ...] = ()

    # -- a mixer: output made from Q, K, V by the variant, in place of scores..softmax ----------

    # its stages between V and output (linear attention's feature maps, its implicit weights);
    # with a mixer on, scores, scaled, masked and softmax do not apply
    mixer_stages: tuple[str, ...] = ()

    def default_scale(self, value: Setting, inputs: Inputs) -> float | None:
        """The softmax scale when the fixture gives none; None: 1/√d_k."""
        return None

    # -- what a KV cache holds when it is not K and V (MLA's latent) ----------------------------

    # the stages ``decode_form`` reads from the trace
    decode_stages: tuple[str, ...] = ()

    def decode_form(self, value: Setting, run: Traced) -> DecodeForm | None:
        """What decoding caches and attends with, from the trace's stages (internal layouts);
        None: Q, K and V as the chain has them."""
        return None

    def decode_state(self, value: Setting, run: Traced) -> Any:
        """A recurrent state decoding carries in place of a KV cache (a core.decode_state
        ``Recurrence``: linear attention), from the trace's Q, K, V, X and ``decode_stages``;
        None: a cache."""
        return None

    def decode_maps(self, value: Setting, run: Traced) -> Any:
        """More than one softmax map per head over one KV cache (a core.decode_maps
        ``MapsForm``: differential attention), from the trace's Q, K, V and ``decode_stages``;
        None: the chain's one map."""
        return None

    def refuses(self, value: Setting, inputs: Inputs, what: str) -> tuple[str, str, str] | None:
        """Why ``what`` (``decoding``, ``FlashAttention``, ``the backward pass``, ``attn rope``)
        cannot give the reference's numbers for this setting: (the field, what, expected);
        None: it can. The one refusal hook: each run asks it before computing anything."""
        return None

    # -- `attn new`: the flags that turn it on, the numbers it draws, the lines it writes ------

    # its flags (none: `attn new` does not write it)
    new_options: tuple[NewOption, ...] = ()
    # where `attn new` takes it, lowest first: its flags in the help, their checks, its random
    # draws (so a seed draws the same numbers as before a variant was added), its key in the
    # comment naming the optional keys
    new_rank: int = 100
    # where its lines, its word in the description and its .npz members go in a new fixture
    new_order: int = 100

    def new_problem(self, spec: NewSpec) -> tuple[str, str, str] | None:
        """What is wrong with its flags: (the flag's name, what, expected); None: nothing."""
        return None

    def new_members(self, spec: NewSpec, rng: np.random.Generator) -> dict[str, Any]:
        """What it adds to a new fixture, as whole-fixture .npz members (a mapping's entries as
        ``KEY.SUBKEY``), its random numbers drawn from ``rng``; {}: it is off. By default the
        flag named as the variant is its one member."""
        value = spec.options.get(self.name)
        return {} if value is None or value is False else {self.name: np.array(value)}

    def new_lines(self, spec: NewSpec, members: Mapping[str, Any]) -> list[str]:
        """Its keys in a new fixture's YAML, each with a comment saying what it does."""
        return []

    def new_words(self, spec: NewSpec, members: Mapping[str, Any]) -> str:
        """What a new fixture's description calls it (``window 3``)."""
        return self.name


# -- the rarer hooks: a variant that has one subclasses its capability ------------------------


class ScoreModifier(Variant[Setting]):
    """A score modifier: scaled -> its ``stage``, before the mask (the logit cap)."""

    def modify(self, value: Setting, x: FloatArray, out: FloatArray | None = None) -> FloatArray:
        """The modified logits; ``out`` may be ``x`` (in place)."""
        raise NotImplementedError(self.name)

    def grad_modify(self, value: Setting, d_out: FloatArray, x_in: FloatArray) -> FloatArray:
        """d(modified) -> d(x_in), the modifier's Jacobian applied."""
        raise NotImplementedError(self.name)

    def bound_modify(self, value: Setting, bound: float) -> float:
        """The largest |logit| after modifying, given the largest before (overflow checks)."""
        return bound


class ExtraLogit(Variant[Setting]):
    """An extra logit joined to every softmax row, dropped after (a sink logit); its
    gradient stage is ``gradient``."""

    def extra_logit(self, value: Setting, cells: Cells, dtype: Any) -> FloatArray | None:
        """One logit per query head of the cells, (h,); None: no extra logit."""
        raise NotImplementedError(self.name)

    def grad_extra(self, value: Setting, weights: FloatArray, delta: FloatArray) -> FloatArray:
        """dL/d(extra logit) (H,), from the kept weights and Delta = rowsum(dP ∘ P)."""
        raise NotImplementedError(self.name)


class CacheRule(Variant[Setting]):
    """A rule of what a KV cache must hold (the window's ring buffer)."""

    def cache_slots(self, value: Setting, inputs: Inputs) -> int | None:
        """How many slots a KV cache needs (a ring of that many); None: the cache grows.

        A variant with a cache rule trusts the cache to hide what falls out of it, so a decode
        loop that gets the ring wrong (one slot too many) runs without its ``allowed`` rule.
        """
        raise NotImplementedError(self.name)


class OutTransform(Variant[Setting]):
    """A head-output transform: output -> its ``out_stages``, per head, before concat (a gate),
    with ``grad_out`` back through them."""

    def out_needs(self, stage: str) -> tuple[str, ...]:
        """What one of its ``out_stages`` is computed from (stages of the table)."""
        return ("output",)

    def out_transform(
        self, value: Setting, run: Traced, output: FloatArray
    ) -> dict[str, FloatArray]:
        """Its stages by name, each (B, H, T, Dv), from the attention output (B, H, T, Dv) of the
        fixture's queries and ``run.arrays``: the states the queries were projected from, ``X``
        (B, T, d_model; absent when Q, K, V are given), and the stages of ``out_reads``
        (internal layouts); the last of ``out_stages`` is the transformed output."""
        raise NotImplementedError(self.name)

    def grad_out(
        self, value: Setting, run: Traced, d_out: FloatArray, made: Mapping[str, FloatArray]
    ) -> tuple[FloatArray, dict[str, FloatArray], FloatArray | None]:
        """Back through it: from ``d_out``, the gradient of its last stage (B, H, T, Dv),
        ``made``, its forward stages and the output it read (``"output"``), and the run's
        ``X`` (absent when Q, K, V are given), to (the gradient of
        that output, its gradient stages by name, what it adds to d_X; None: nothing)."""
        raise NotImplementedError(self.name)


class FrontEnd(Variant[Setting]):
    """A front end: Q, K and V made by the variant itself from X (its ``front_stages``: MLA's
    latent), and its backward through them (``front_gradients``)."""

    def front(
        self, value: Setting, inputs: Inputs, X: FloatArray, positions: IntArray, cast: Cast
    ) -> dict[str, FloatArray]:
        """Its front stages and ``Q`` (B, H, T, D), ``K`` (B, H, S, D), ``V`` (B, H, S, Dv)
        from X (B, T, d_model) at the tokens' ``positions`` (T,)."""
        raise NotImplementedError(f"{self.name} makes no Q, K, V")

    def grad_front(
        self, value: Setting, run: Traced, grads: Mapping[str, FloatArray]
    ) -> dict[str, FloatArray]:
        """Back through its front end: from ``grads`` (``d_Q``, ``d_K``, ``d_V``, internal
        layouts) and its forward stages in ``run.arrays`` to its gradient stages by name, ``d_X``
        among them (the base rows it fills, such as ``d_W_Q``, too)."""
        raise NotImplementedError(f"{self.name} makes no Q, K, V")

    def front_fills(self, value: Setting, gradient: str) -> bool:
        """Whether ``grad_front`` fills the base row ``gradient`` (``d_W_Q``) for this setting."""
        return False


class FlashMaps(Variant[Setting]):
    """More softmax maps FlashAttention tiles beside the chain's (differential attention's
    second), and the stages it makes of every map's O, checked against the trace."""

    # the trace's stages ``flash_maps`` and ``flash_finish`` read (and check against)
    flash_reads: tuple[str, ...] = ()

    def flash_maps(self, value: Setting, run: Traced) -> tuple[tuple[FloatArray, FloatArray], ...]:
        """From the trace's ``flash_reads``, more (q, k) pairs, (B, H, T, D) and (B, Hkv, S, D),
        whose softmax·V FlashAttention tiles as it tiles the chain's, with the chain's scale,
        modifiers and mask."""
        raise NotImplementedError(self.name)

    def flash_finish(
        self, value: Setting, run: Traced, outputs: tuple[FloatArray, ...]
    ) -> dict[str, FloatArray]:
        """Stages of the trace made from every map's tiled O (the chain's first) and its
        ``flash_reads``, by name: each is checked against the trace's."""
        raise NotImplementedError(self.name)


class Mixer(Variant[Setting]):
    """A mixer: output made from Q, K, V by the variant, in place of scores..softmax (its
    ``mixer_stages``: linear attention's feature maps, its implicit weights)."""

    def mix(self, value: Setting, run: Traced) -> dict[str, FloatArray]:
        """Its mixer stages and ``output`` (B, H, T, Dv), from the chain's Q, K, V."""
        raise NotImplementedError(self.name)


class SideForm(Variant[Setting]):
    """A second form of the same attention computed beside the chain (its ``side_stages``,
    checked against the chain's by ``side_equal``: MLA's absorbed form, linear attention's
    recurrent and chunked ones)."""

    def side(self, value: Setting, run: Traced, scale: float) -> dict[str, FloatArray]:
        """Its side stages, from the chain's stages and its ``scale``."""
        raise NotImplementedError(self.name)


REGISTRY: dict[str, Variant] = {}  # by name, in the order they run at each hook


def register(variant: Variant) -> Variant:
    """Add a variant to the registry, in ``order`` (a tie goes after those registered before; a
    known name is replaced)."""
    if not variant.name:
        raise ValueError("a variant needs a name")
    REGISTRY[variant.name] = variant
    ranked = sorted(REGISTRY.values(), key=lambda v: v.order)  # stable: ties keep their order
    REGISTRY.clear()
    REGISTRY.update((v.name, v) for v in ranked)
    return variant


def before(inputs: Inputs, stage: str) -> str:
    """The stage a Q/K transform's stage reads: the transform before it that is on, else Q or K
    (``Q_rot`` reads ``Q_norm`` under QK-norm)."""
    which, stages = stage[0], [stage[0]]
    for v in REGISTRY.values():
        if v.suffix is not None and which in v.transforms and v.value(inputs) is not None:
            stages.append(f"{which}_{v.suffix}")
    return stages[stages.index(stage) - 1]


def unregister(name: str) -> None:
    """Take a variant out of the registry (tests that define their own)."""
    REGISTRY.pop(name, None)


def take(full: Any, cells: Cells) -> Any:
    """The cells of a whole (B, H, T, S) array: a view where the indices run in steps of one
    (the engine's blocks), else a copy (decoding's cache slots, -1 read as 0)."""
    index = tuple(_as_slice(i) for i in cells[:4])
    if all(isinstance(i, slice) for i in index):
        return full[index]
    return full[np.ix_(*(np.maximum(np.asarray(i), 0) for i in cells[:4]))]


def _as_slice(i: IntArray) -> slice | IntArray:
    """A run start, start+1, ... as a slice (a view), anything else as it is."""
    run = i.size and int(i[0]) >= 0 and int(i[-1]) - int(i[0]) == i.size - 1
    if run and (i.size < 3 or bool(np.all(np.diff(i) == 1))):
        return slice(int(i[0]), int(i[-1]) + 1)
    return i


def roles_of(v: Variant) -> frozenset[str]:
    """What ``v`` is to the chain: what it declares, else the roles its hooks give."""
    if v.declares is not None:
        return v.declares
    kind = type(v)
    hooks = (
        (v.suffix is not None, TRANSFORMS_QK),
        (v.stage is not None, MODIFIES_SCORES),
        (kind.bias is not Variant.bias, ADDS_BIAS),
        (kind.allowed is not Variant.allowed, HIDES_KEYS),
        (isinstance(v, ExtraLogit), EXTRA_LOGIT),
        (bool(v.out_stages), TRANSFORMS_OUTPUT),
        (bool(v.front_stages), MAKES_QKV),
        (bool(v.mixer_stages), REPLACES_SOFTMAX),
        (kind.decode_state is not Variant.decode_state, KEEPS_STATE),
        (kind.decode_maps is not Variant.decode_maps, TWO_MAPS),
    )
    return frozenset(role for has, role in hooks if has)


def first_clash(on: list[Variant]) -> tuple[Variant, Variant] | None:
    """The first two variants of ``on`` (in order) that cannot run together, the one that
    cannot run beside the other first; None: all can."""
    for i, a in enumerate(on):
        for b in on[i + 1 :]:
            if roles_of(b) & a.cannot_run_with:
                return a, b
            if roles_of(a) & b.cannot_run_with:
                return b, a
    return None


# why a variant of a role cannot run beside another, when it does not say it itself
_ROLE_WHY = {REPLACES_SOFTMAX: "it has no softmax scores to change"}


def refuse_clash(inputs: Inputs, on: list[Variant]) -> None:
    """Two variants of ``on`` that cannot run together: the one-line error naming both."""
    pair = first_clash(on)
    if pair is None:
        return
    from attn_cli.errors import InputError

    a, b = pair
    roles = roles_of(b) & a.cannot_run_with
    why = a.excludes_why or next(
        (w for role, w in _ROLE_WHY.items() if role in roles_of(a)),
        f"{a.name} cannot run beside what {b.name} does: it {', '.join(sorted(roles))}",
    )
    raise InputError(
        inputs.source, b.name, f"given with {a.name}", f"{a.name} without {b.name} ({why})"
    )


def own_loop(v: Variant) -> bool:
    """Whether ``v`` decodes with a loop of its own (a recurrent state, two softmax maps)."""
    return bool(roles_of(v) & {KEEPS_STATE, TWO_MAPS})
