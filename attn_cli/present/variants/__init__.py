"""What present/ says about each variant attn ships: one module per variant (its labels,
header lines, explainers and worked-cell parts), registered by name when this package is
imported, in the order the header lists them. The presenters that show a trace import it."""

from attn_cli.present.explain_registry import CELL_TEXTS, EXPLAINERS
from attn_cli.present.variant_texts import register
from attn_cli.present.variants import alibi, qk_norm, rope, sinks, softcap, window

for _module in (qk_norm, rope, window, softcap, alibi, sinks):
    register(_module.TEXTS)
    EXPLAINERS.update(_module.TEXTS.explainers)
    CELL_TEXTS.update(_module.TEXTS.cell_texts)
