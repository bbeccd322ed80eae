"""What present/ says about a variant: one object per variant, found by its name.

A module of ``present/variants/`` subclasses :class:`VariantTexts` for one variant and
``register()``s it: its labels join the label table, its explainers and worked-cell parts join
the tables of explain_registry.py, and the presenters ask the objects here, in their order, for
the rest (header lines, notes on the masked stage, the extra logit of a head), through the
questions of ``present/variants/__init__.py``, which loads and registers the built-in ones. No
presenter names a variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from attn_cli.present.i18n import FORMULA_ZH_MORE, LABELS, Lang, en_zh, formula_text

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.pipeline import Trace


class VariantTexts:
    """The texts of one variant; every hook is optional (the base says nothing)."""

    name: str = ""  # the variant's fixture key
    order = 100  # where it stands among the others: its header line, its notes on masked
    stage: str | None = None  # a score modifier's stage (capped): masked starts from it
    bias_stage: str | None = None  # an additive bias kept as a stage of its own, added in masked
    reads_positions = False  # the header shows the token positions when it is on
    before_positions = False  # its header line comes before the positions line
    labels: ClassVar[dict[Lang, dict[str, str]]] = {}  # short labels, merged into i18n's table
    grad_note: ClassVar[dict[Lang, str]] = {}  # why the gradient through its stage is what it is
    add_label = "cell_bias"  # the label of a worked cell's masked sum when it adds its bias
    # its explainers and worked-cell parts, by explanation key and stage (explain_registry.py)
    explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    cell_texts: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    # a front end's explainers of Q, K and V, which it makes itself (MLA), by stage
    front_explainers: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    # words its formulas use beside operators: the LaTeX export sets them as math, not prose
    math_names: ClassVar[tuple[str, ...]] = ()
    # its notes in the decode and flash views: view -> key -> lang -> (formula, meaning), and
    # what each note's quantity is computed from
    view_notes: ClassVar[dict[str, dict[str, dict[Lang, tuple[str, str]]]]] = {}
    view_inputs: ClassVar[dict[str, dict[str, tuple[str, ...]]]] = {}
    # what it adds to another note of a view, on or off: view -> key -> lang -> sentence
    view_asides: ClassVar[dict[str, dict[str, dict[Lang, str]]]] = {}
    # the words of its stage formulas in Chinese (regex, replacement), joined to i18n's table
    formula_zh: ClassVar[tuple[tuple[str, str], ...]] = ()

    def setting(self, inp: Inputs) -> Any:
        """The variant's setting in these inputs (a field of Inputs, else ``inp.extra``); None
        when it is off."""
        if self.name in inp.extra:
            return inp.extra[self.name]
        return getattr(inp, self.name, None)

    def conventions(self, value: Any, inp: Inputs, lang: Lang) -> list[str]:
        """Its lines under "variants" in the header, given its setting ``value``."""
        return []

    def view_title(self, view: str, value: Any, lang: Lang) -> str | None:
        """The title of the quantity it changes in ``view`` (flash: S), None: the usual one."""
        return None

    def extra_logit(self, inp: Inputs, head: int) -> float | None:
        """The logit it joins to every softmax row of ``head``; None: none."""
        return None

    def cell_values(self, trace: Trace, head: int, cell: tuple[int, ...]) -> dict[str, Any]:
        """Its numbers in a worked cell, named as the cell's attributes, None when off: its
        stages' values at ``cell`` and what ``setting_values`` adds."""
        values: dict[str, Any] = {}
        for stage in (self.stage, self.bias_stage):
            if stage is not None:
                values[stage] = float(trace[stage].data[cell]) if stage in trace else None
        value = self.setting(trace.inputs)
        return values | self.setting_values(None if value is None else value, head)

    def cell_rows(
        self,
        trace: Trace,
        rows: tuple[tuple[int, ...], tuple[int, ...]],
        positions: tuple[int, int],
    ) -> dict[str, Any]:
        """Its parts of a worked cell that read whole rows, named as the cell's attributes,
        None each when off: ``rows`` index the query's row of a (batch?, head, query, ...) stage
        and the key's of a (batch?, kv_head, key, ...) one, ``positions`` the two tokens'."""
        return {}

    def setting_values(self, value: Any, head: int) -> dict[str, Any]:
        """Numbers of its setting a worked cell shows (None each when ``value`` is None)."""
        return {}

    def cost_notes(self, value: Any, per_token: int, seq: int, lang: Lang) -> list[str]:
        """Its sentences under the KV cache's cost in the decode view (``per_token`` bytes a
        token, ``seq`` tokens)."""
        return []

    def grad_transform(self, stage: str, formula: str, lang: Lang) -> tuple[str, str] | None:
        """When the gradient ``stage`` (d_Q, d_K_norm) with this ``formula`` undoes its Q/K
        transform: why it is what it is, and the gradient it is computed from; else None."""
        return None

    def masked_note(self, value: Any, zh: bool) -> list[str]:
        """What it does in the masked stage, one sentence each."""
        return []

    def notes(self, stage: str, c: Any) -> list[str]:
        """More sentences under the explanation of ``stage`` (a Context of explain_registry)."""
        return []


TEXTS: dict[str, VariantTexts] = {}  # by name; each one's ``order`` is where the header lists it


def register(texts: VariantTexts) -> VariantTexts:
    """Add a variant's texts: its labels join the label table, its words of formulas the
    Chinese formulas' table; explain_registry.py finds its explainers and worked-cell parts."""
    TEXTS[texts.name] = texts
    for lang, labels in texts.labels.items():
        LABELS[lang].update(labels)
    FORMULA_ZH_MORE.extend(texts.formula_zh)
    return texts


def stage_explainer(
    reads: tuple[str, ...], en: str, zh: str, fallback: str = "X", stage: str | None = None
) -> Callable[[Any], Any]:
    """A variant stage's explanation: its formula, the shapes of the stages it reads (``fallback``'s
    when none of them is in the trace) and its meaning in English or Chinese; ``stage`` names the
    stage whose formula is shown (default: the one explained)."""

    def explain(c: Any) -> Any:  # explain_registry's Context -> Parts (it imports this module)
        formula = (formula_text(c.lang, c.trace[stage or c.name].formula),)
        shapes = tuple(c.shape_of(s) for s in reads if s in c.trace) or (c.shape_of(fallback),)
        return formula, shapes, [en_zh(c, en, zh)]

    return explain
