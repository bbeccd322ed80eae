"""attn: a step-by-step tracer for Transformer self-attention.

Library use (no CLI needed)::

    from attn_cli import load_fixture, run
    trace = run(load_fixture("fixtures/the_cat_sat.yaml"))
    trace["softmax"].data   # (heads, seq_q, seq_k) float64

Heavy modules (NumPy, YAML) are imported on first use, so ``attn --help`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["AttnError", "InputError", "__version__", "load_fixture", "run"]

if TYPE_CHECKING:
    from attn_cli.core.pipeline import run
    from attn_cli.errors import AttnError, InputError
    from attn_cli.io.fixture import load_fixture


def __getattr__(name: str) -> Any:
    if name in ("AttnError", "InputError"):
        from attn_cli import errors

        return getattr(errors, name)
    if name == "load_fixture":
        from attn_cli.io.fixture import load_fixture

        return load_fixture
    if name == "run":
        from attn_cli.core.pipeline import run

        return run
    raise AttributeError(f"module 'attn_cli' has no attribute {name!r}")
