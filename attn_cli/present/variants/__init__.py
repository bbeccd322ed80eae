"""What present/ says about each variant attn ships: one module per variant (its labels,
header lines, explainers, worked-cell parts and notes in the decode and flash views), each with
a ``TEXTS`` object. Importing this package finds every module here and registers its texts by
the variant's name, in the order of their ``order`` (the header's); the presenters that show a
trace import it, and name no variant.
"""

import pkgutil
from importlib import import_module

from attn_cli.present.variant_texts import VariantTexts, register


def _found() -> list[VariantTexts]:
    """The ``TEXTS`` of every module of this package, in their order."""
    modules = [import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted((m.TEXTS for m in modules), key=lambda t: t.order)


for _texts in _found():
    register(_texts)
