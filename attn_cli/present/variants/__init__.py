"""What present/ says about each variant attn ships: one module per variant (its labels,
header lines, explainers, worked-cell parts and notes in the decode and flash views), each with
a ``TEXTS`` object. Importing this package finds every module here and registers its texts by
the variant's name, in the order of their ``order`` (the header's); the presenters that show a
trace import it, and name no variant.
"""

from attn_cli.discover import submodules
from attn_cli.present.variant_texts import VariantTexts, register


def _found() -> list[VariantTexts]:
    """The ``TEXTS`` of every module of this package, in their order."""
    return sorted((m.TEXTS for m in submodules(__name__, __path__)), key=lambda t: t.order)


for _texts in _found():
    register(_texts)
