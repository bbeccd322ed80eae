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

The rows of the variants (core/variant.py ``stage_rows``: QK-norm's ``Q_norm``, RoPE's ``Q_rot``,
the logit cap's ``capped``, ALiBi's bias stage, their gradients, an extra logit's) go into the
slots the base rows leave for each kind of hook, in registry order (gradients of transforms and
modifiers the last first), with what each needs from its neighbours in the chain. The table is
built when it is first read and again whenever the registry has changed since, so a variant
registered later has its rows wherever ``STAGES``, ``SPECS``, ``STAGE_NAMES`` ... are read: they
are views of the table as it is now, not copies.

Importing this module costs nothing: no NumPy (the variants are imported when the table is
first read).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from attn_cli.core.gradient_rows import GRADIENT_ROWS, d_modified, d_query_key
from attn_cli.core.stage_facts import Slot, always, chain_of, has_masked, parts
from attn_cli.core.stage_spec import K_AXES as _K
from attn_cli.core.stage_spec import Q_AXES as _Q
from attn_cli.core.stage_spec import SCORE_AXES as _SCORES
from attn_cli.core.stage_spec import StageSpec as StageSpec
from attn_cli.core.stage_spec import number_text as _number

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.variant import Variant


def softmax_input(inputs: Inputs) -> str:
    """The stage the softmax reads: masked, else the last score modifier's (capped), else
    scaled."""
    chain = chain_of(inputs)
    if chain.masks:
        return "masked"
    return chain.stages[-1] if chain.stages else "scaled"


def _projection(name: str) -> Callable[[Inputs], str]:
    def formula(inputs: Inputs) -> str:
        for v, value in chain_of(inputs).on:  # a front end makes Q, K, V itself (MLA)
            if v.front_stages:
                return v.stage_formula(value, inputs, name)
        if inputs.mode != "projection":
            return f"{name} (given)"
        bias = f" + b_{name}" if getattr(inputs, f"b_{name}") is not None else ""
        source = "X_kv" if name in "KV" and inputs.X_kv is not None else "X"
        return f"{name} = {source}·W_{name}{bias}" + parts(inputs, name)

    return formula


def _scores_formula(inputs: Inputs) -> str:
    chain = chain_of(inputs)
    return f"scores = {chain.query_key('Q')}·{chain.query_key('K')}ᵀ"


def _masked_formula(inputs: Inputs) -> str:
    chain = chain_of(inputs)
    text = "masked = " + (chain.stages[-1] if chain.stages else "scaled")
    text += "".join(f" + {v.bias_stage or v.name}" for v, _ in chain.biases)
    why = chain.hides()
    fill = _number(inputs.mask_value)
    return text + (f", {fill} where not allowed ({', '.join(why)})" if why else "")


def _softmax_formula(inputs: Inputs) -> str:
    return f"softmax = softmax({softmax_input(inputs)}) over keys{parts(inputs, 'softmax')}"


def _lse_formula(inputs: Inputs) -> str:
    source = softmax_input(inputs)
    return f"lse = log(Σ_keys exp({source}){parts(inputs, 'lse')}); softmax = exp({source} − lse)"


def _mixer(inputs: Inputs) -> tuple[Variant, Any] | None:
    """The variant that makes output from Q, K, V itself (linear attention), when one is on."""
    return next(((v, x) for v, x in chain_of(inputs).on if v.mixer_stages), None)


def _softmax_chain(inputs: Inputs) -> bool:
    """Whether scores, scaled and softmax apply: no mixer (linear attention) replaces them."""
    return _mixer(inputs) is None


def _output_formula(inputs: Inputs) -> str:
    mixer = _mixer(inputs)
    return (
        "output = softmax·V"
        if mixer is None
        else mixer[0].stage_formula(mixer[1], inputs, "output")
    )


# The rows of the forward pass; ``Slot`` marks where the variants' rows go.


_FORWARD_ROWS: tuple[StageSpec | Slot, ...] = (
    StageSpec(
        "X",
        (),
        ("batch", "seq", "d_model"),
        False,
        "X",
        lambda i: i.mode == "projection",
        lambda i: "X (the input embeddings)",
    ),
    StageSpec(
        "X_kv",
        (),
        ("batch", "key", "d_model_kv"),
        False,
        "X_kv",
        lambda i: i.X_kv is not None,
        lambda i: "X_kv (the states keys and values are projected from)",
    ),
    Slot("front"),
    StageSpec("Q", ("X",), _Q, False, "QKV", always, _projection("Q")),
    StageSpec("K", ("X", "X_kv"), _K, False, "QKV", always, _projection("K")),
    StageSpec(
        "V",
        ("X", "X_kv"),
        ("batch", "kv_head", "key", "d_v"),
        False,
        "QKV",
        always,
        _projection("V"),
    ),
    Slot("transform"),
    Slot("mixer"),
    StageSpec("scores", ("Q", "K"), _SCORES, True, "scores", _softmax_chain, _scores_formula),
    StageSpec(
        "scaled",
        ("scores",),
        _SCORES,
        True,
        "scaled",
        _softmax_chain,
        lambda i: "scaled = scores × scale",
    ),
    Slot("modifier"),
    Slot("bias"),
    StageSpec(
        "masked",
        ("scaled",),
        _SCORES,
        True,
        "masked",
        lambda i: has_masked(i) and _softmax_chain(i),
        _masked_formula,
    ),
    StageSpec("softmax", ("scaled",), _SCORES, True, "softmax", _softmax_chain, _softmax_formula),
    StageSpec(
        "lse",
        ("scaled",),
        ("batch", "head", "query"),
        False,
        "lse",
        _softmax_chain,
        _lse_formula,
        opt_in=True,
    ),
    StageSpec(
        "output",
        ("softmax", "V"),
        ("batch", "head", "query", "d_v"),
        False,
        "output",
        always,
        _output_formula,
    ),
    Slot("out"),
    StageSpec(
        "concat",
        ("output",),
        ("batch", "query", "heads*d_v"),
        False,
        "concat",
        lambda i: i.heads > 1 or i.W_O is not None,
        lambda i: "concat = [head 0 | head 1 | …]" + parts(i, "concat"),
    ),
    StageSpec(
        "projected",
        ("concat",),
        ("batch", "query", "d_out"),
        False,
        "projected",
        lambda i: i.W_O is not None,
        lambda i: "projected = concat·W_O" + (" + b_O" if i.b_O is not None else ""),
    ),
    Slot("side"),
)

# ---------------------------------------------------------------------------------------------
# The table: the base rows, the registered variants' rows in their slots


class _Table(NamedTuple):
    variants: tuple[Variant, ...]  # the registry it was built from
    rows: tuple[StageSpec, ...]
    names: tuple[str, ...]
    score: tuple[str, ...]
    opt_in: tuple[str, ...]
    forward: tuple[str, ...]
    gradient: tuple[str, ...]
    specs: dict[str, StageSpec]


_built: list[_Table] = []  # the table as last built


def _table() -> _Table:
    """The table as the registry stands now (built again when a variant was registered or
    taken out since)."""
    from attn_cli.core.chain import REGISTRY  # the variants attn ships, registered

    variants = tuple(REGISTRY.values())
    if not _built or _built[0].variants != variants:
        rows = _build(variants)
        names = tuple(r.name for r in rows)
        _built[:] = [
            _Table(
                variants,
                rows,
                names,
                tuple(r.name for r in rows if r.score_like),
                tuple(r.name for r in rows if r.opt_in),
                tuple(r.name for r in rows if not r.gradient),
                tuple(r.name for r in rows if r.gradient),
                {r.name: r for r in rows},
            )
        ]
    return _built[0]


def _build(variants: tuple[Variant, ...]) -> tuple[StageSpec, ...]:
    """The base rows with each slot filled by the variants' rows, and each row's needs
    extended by its neighbours in the chain."""
    slots = _slot_rows(variants)
    needs = _base_needs(variants)
    rows: list[StageSpec] = []
    for row in (*_FORWARD_ROWS, *GRADIENT_ROWS):
        if isinstance(row, Slot):
            rows.extend(slots[row.kind])
        else:
            rows.append(row._replace(needs=needs.get(row.name, row.needs)))
    assert len({r.name for r in rows}) == len(rows), "two rows of one name"
    return tuple(rows)


def _qk(variants: tuple[Variant, ...], which: str) -> list[str]:
    """The stages of Q's (or K's) transforms, in chain order: ``["Q_norm", "Q_rot"]``."""
    return [f"{which}_{v.suffix}" for v in variants if v.suffix and which in v.transforms]


def _base_needs(variants: tuple[Variant, ...]) -> dict[str, tuple[str, ...]]:
    """What the base rows around the slots read: the variants' stages, nearest first."""
    transforms = [v for v in variants if v.suffix is not None]
    mods = [str(v.stage) for v in variants if v.stage is not None]
    biases = [str(v.bias_stage) for v in variants if v.bias_stage is not None]
    logits = ("masked", *reversed(mods), "scaled")
    return {
        "scores": (
            *(f"{w}_{v.suffix}" for v in reversed(transforms) for w in v.transforms),
            "Q",
            "K",
        ),
        "masked": (*reversed(mods), "scaled", *biases),
        "softmax": logits,
        "lse": logits,
        "output": (*(s for v in variants for s in v.mixer_stages), "softmax", "V"),
        "concat": (*(v.out_stages[-1] for v in reversed(variants) if v.out_stages), "output"),
        "d_scaled": (*(f"d_{m}" for m in mods), "d_masked", "d_softmax", "delta"),
        "d_Q": (*(f"d_{s}" for s in _qk(variants, "Q")), "d_scores", "K"),
        "d_K": (*(f"d_{s}" for s in _qk(variants, "K")), "d_scores", "Q"),
    }


def _slot_rows(variants: tuple[Variant, ...]) -> dict[str, list[StageSpec]]:
    """Each variant's rows by the slot they go in, with their needs in the chain (and the
    gradient formulas of transforms and modifiers)."""
    kinds = (
        "front",
        "transform",
        "mixer",
        "modifier",
        "bias",
        "out",
        "side",
        "d_out",
        "extra",
        "d_modifier",
        "d_transform",
        "d_front",
    )
    slots: dict[str, list[StageSpec]] = {k: [] for k in kinds}
    mods = [str(v.stage) for v in variants if v.stage is not None]
    for v in variants:
        for row in v.stage_rows():
            kind, row = _placed(v, row, variants, mods)
            slots[kind].append(row)
    # gradients run backward: the last transform's and the last modifier's first
    for kind in ("d_modifier", "d_transform"):
        order = {v.name: i for i, v in enumerate(reversed(variants))}
        owner = {r.name: v.name for v in variants for r in v.stage_rows()}
        slots[kind].sort(key=lambda r: order[owner[r.name]])
    return slots


def _placed(
    v: Variant, row: StageSpec, variants: tuple[Variant, ...], mods: list[str]
) -> tuple[str, StageSpec]:
    """The slot of one of a variant's rows, the row with its neighbours' needs."""
    base = row.name.removeprefix("d_") if row.gradient else row.name
    if row.name in v.front_gradients:
        return "d_front", row
    if row.name in v.front_stages or row.name in v.side_stages:
        return ("front" if row.name in v.front_stages else "side"), row
    if v.suffix is not None and base[0] in "QK" and base == f"{base[0]}_{v.suffix}":
        stages = _qk(variants, base[0])
        i = stages.index(base)
        if not row.gradient:
            return "transform", row._replace(needs=(*reversed(stages[:i]), base[0], *row.needs))
        other = f"{'K' if base[0] == 'Q' else 'Q'}_{v.suffix}"
        later = tuple(f"d_{s}" for s in stages[i + 1 :])
        return "d_transform", row._replace(
            needs=(*later, "d_scores", other, *row.needs), formula=d_query_key(base)
        )
    if row.name in v.mixer_stages:
        return "mixer", row
    if row.name in v.out_stages:
        return "out", row
    if row.name in v.out_gradients:
        return "d_out", row
    if base == v.stage:
        i = mods.index(base)
        if not row.gradient:
            return "modifier", row._replace(needs=(mods[i - 1] if i else "scaled", *row.needs))
        later = tuple(f"d_{m}" for m in mods[i + 1 :])
        needs = (*later, "d_masked", "d_softmax", "delta", *row.needs)
        return "d_modifier", row._replace(needs=needs, formula=d_modified(base))
    return ("extra" if row.gradient else "bias"), row


_K_ = TypeVar("_K_")


class _View(Sequence[_K_], Generic[_K_]):
    """A tuple of the table as it is now (``STAGE_NAMES``): read, never copied, so a variant
    registered later is in it."""

    def __init__(self, field: str) -> None:
        self._field = field

    def _now(self) -> tuple[_K_, ...]:
        now: tuple[_K_, ...] = getattr(_table(), self._field)
        return now

    def __getitem__(self, i: Any) -> Any:
        return self._now()[i]

    def __len__(self) -> int:
        return len(self._now())

    def __iter__(self) -> Iterator[_K_]:
        return iter(self._now())

    def __contains__(self, x: object) -> bool:
        return x in self._now()

    def __eq__(self, other: object) -> bool:
        return self._now() == (tuple(other) if isinstance(other, _View) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._now())


class _Specs(Mapping[str, StageSpec]):
    """The rows by name (``SPECS["capped"]``), as the table is now."""

    def __getitem__(self, name: str) -> StageSpec:
        return _table().specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_table().specs)

    def __len__(self) -> int:
        return len(_table().specs)

    def __contains__(self, name: object) -> bool:
        return name in _table().specs


STAGES: Sequence[StageSpec] = _View("rows")
STAGE_NAMES: Sequence[str] = _View("names")
SPECS: Mapping[str, StageSpec] = _Specs()
SCORE_STAGES: Sequence[str] = _View("score")
OPT_IN_STAGES: Sequence[str] = _View("opt_in")
FORWARD_STAGE_NAMES: Sequence[str] = _View("forward")
GRADIENT_STAGE_NAMES: Sequence[str] = _View("gradient")


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
