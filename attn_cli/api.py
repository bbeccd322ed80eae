"""The one way through, for the CLI and for Python: a fixture name, path or ``-`` to a trace.

``trace_file`` resolves bundled example names and standard input, validates the fixture,
checks what was asked of it (stages, dtype) and the memory it would need, all *before* any
stage is computed, then runs the pipeline. Errors are :class:`AttnError` and name no
command-line flag; the CLI adds the flag when it reports them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attn_cli.core.limits import DEFAULT_MAX_BYTES, DEFAULT_MAX_ELEMENTS
from attn_cli.core.stages import (
    OPT_IN_STAGES,
    SPECS,
    STAGE_NAMES,
    applicable_stages,
    unknown_stage,
)
from attn_cli.errors import UsageError

if TYPE_CHECKING:
    from attn_cli.core.inputs import Inputs
    from attn_cli.core.memory import Written
    from attn_cli.core.pipeline import Dtype, Streamed, Trace
    from attn_cli.core.rope_table import RopeTable

Progress = Callable[[int, int], None]  # (blocks done, blocks in all)
STDIN = "-"


def trace_file(
    fixture: str | os.PathLike[str] | None = None,
    *,
    stages: Sequence[str] | None = None,
    dtype: Dtype = "float64",
    keep_all: bool = False,
    shaded: bool = False,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_memory: int | None = None,
    progress: Progress | None = None,
    backward: bool = False,
) -> Trace:
    """Load a fixture (path, bundled example name, ``-`` for stdin, None for the default
    example) and trace it.

    ``stages`` keeps only those (and computes only what they need); ``keep_all`` keeps every
    stage anyway (explanations and worked cells read them all); ``shaded`` keeps ``masked``
    beside ``softmax``, for a heatmap that greys the masked cells. ``max_memory`` is a budget in
    bytes (default: 4 GiB, or half the RAM if less); a trace that would need more is refused
    before anything is computed. ``backward`` adds the gradient stages (``d_Q``, ...) of
    L = Σ grad ∘ final stage, the fixture's ``grad`` or ones.
    """
    from attn_cli.core.pipeline import run

    inputs, keep = _checked(fixture, stages, dtype, keep_all, shaded, max_elements, backward)
    _check_memory(inputs, max_memory, keep, dtype, backward, "held")
    return run(inputs, keep=keep, dtype=dtype, progress=progress, backward=backward)


def stream_file(
    fixture: str | os.PathLike[str] | None = None,
    *,
    written: Written,
    stages: Sequence[str] | None = None,
    dtype: Dtype = "float64",
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_memory: int | None = None,
    progress: Progress | None = None,
    backward: bool = False,
) -> Streamed:
    """As :func:`trace_file`, for a trace about to be written as ``written`` ("npz", "json"):
    the score stages kept are computed as they are written (``run_streamed``), and the memory
    check prices what that holds, a block of them, not the file."""
    from attn_cli.core.pipeline import in_dtype, run_streamed

    inputs, keep = _checked(fixture, stages, dtype, False, False, max_elements, backward)
    _check_memory(inputs, max_memory, keep, dtype, backward, written)
    # A float32 run never reads the float64 arrays again: let them go before it starts.
    small = in_dtype(inputs, dtype)
    del inputs
    return run_streamed(small, keep=keep, dtype=dtype, progress=progress, backward=backward)


def rope_file(
    fixture: str | os.PathLike[str] | None = None,
    *,
    position: int | None = None,
    length: int | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> tuple[Inputs, RopeTable]:
    """A fixture's RoPE pair by pair (core/rope_table.py): frequencies, bands, wavelengths and
    the angle at ``position`` (default: the fixture's last), for a sequence of ``length``
    positions (default: the fixture's, or up to ``position``)."""
    from attn_cli.core.plugins.rope import rope_length
    from attn_cli.core.rope_table import MAX_POSITION, rope_table
    from attn_cli.errors import InputError

    for name, value, least, most in (
        ("position", position, 0, "2**53 - 1"),
        ("length", length, 1, "2**53"),
    ):
        top = MAX_POSITION - 1 if name == "position" else MAX_POSITION  # position < length
        if value is not None and not least <= value <= top:
            raise UsageError(
                "", name, f"is {value}", f"a whole number from {least} to {most}", option=name
            )
    inputs = load(fixture, max_elements=max_elements)
    from attn_cli.core.pipeline import refuse

    refuse(inputs, "attn rope")  # a variant with a RoPE of its own (MLA's) that it cannot show
    if inputs.rope is None:
        raise InputError(
            inputs.source,
            "rope",
            "is not set: the fixture has no rotary position embedding",
            "a fixture with rope (e.g. the bundled llama_rope_gqa)",
        )
    own = rope_length(inputs)
    if position is None:
        position = own - 1 if length is None else min(own, length) - 1
    if length is None:
        length = max(own, position + 1)
    if position >= length:
        raise UsageError(
            "",
            "position",
            f"is {position}, past a sequence of {length} positions",
            f"a position below --length ({length})",
            option="position",
        )
    return inputs, rope_table(inputs.rope, inputs.d_k, length, position, inputs.source)


def _checked(
    fixture: str | os.PathLike[str] | None,
    stages: Sequence[str] | None,
    dtype: str,
    keep_all: bool,
    shaded: bool,
    max_elements: int,
    backward: bool,
) -> tuple[Inputs, tuple[str, ...] | None]:
    """The fixture loaded and what was asked of it checked: its inputs and the stages to keep."""
    from attn_cli.core.pipeline import DTYPES

    wanted = check_stage_names(stages)
    if dtype not in DTYPES:
        raise UsageError("", "dtype", f"got {dtype!r}", "one of " + ", ".join(DTYPES))
    check_gradients_asked(wanted, backward)
    inputs = load(fixture, max_elements=max_elements)
    check_stages_apply(inputs, wanted, backward)
    opt_in = [s for s in wanted or () if s in OPT_IN_STAGES]
    if keep_all and opt_in:  # every stage, and the opt-in ones (lse) asked for by name
        return inputs, applicable_stages(inputs, opt_in=opt_in, backward=backward)
    return inputs, None if keep_all else kept_stages(wanted, shaded)


def _check_memory(
    inputs: Inputs,
    max_memory: int | None,
    keep: tuple[str, ...] | None,
    dtype: str,
    backward: bool,
    written: Written,
) -> None:
    from attn_cli.core.memory import check_memory

    check_memory(inputs, max_memory, keep, 4 if dtype == "float32" else 8, backward, written)


def load(
    fixture: str | os.PathLike[str] | None,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Inputs:
    """A fixture from a path, standard input (``-``), or a bundled example's name."""
    from attn_cli.io.examples import DEFAULT_EXAMPLE, example_paths, find_example
    from attn_cli.io.fixture import load_fixture, parse_fixture

    if fixture is not None and os.fspath(fixture) == STDIN:
        _require_piped_stdin()
        return load_fixture(STDIN, max_elements=max_elements, max_bytes=max_bytes)
    name = DEFAULT_EXAMPLE if fixture is None else os.fspath(fixture)
    path = Path(name)
    if fixture is not None and (_exists(path) or path.suffix or "/" in name or "\\" in name):
        return load_fixture(path, max_elements=max_elements, max_bytes=max_bytes)
    bundled = find_example(name)
    if bundled is None:
        names = ", ".join(example_paths()) or "none installed"
        raise UsageError(
            name,
            "",
            "no such file or bundled example",
            f"a fixture path or an example name ({names})",
        )
    return parse_fixture(bundled.read_bytes(), bundled.name, max_elements=max_elements)


def check_stage_names(stages: Sequence[str] | None) -> tuple[str, ...] | None:
    """The stage names asked for, without repeats; an unknown name is an error."""
    if not stages:
        return None
    for name in stages:
        if name not in STAGE_NAMES:
            raise UsageError(
                "",
                f"stage {name}",
                unknown_stage(name),
                "one of " + ", ".join(STAGE_NAMES),
                option="stage",
            )
    return tuple(dict.fromkeys(stages))


def check_gradients_asked(stages: Collection[str] | None, backward: bool) -> None:
    """Refuse a gradient stage (``d_Q``) asked for without the backward pass."""
    for name in stages or ():
        if SPECS[name].gradient and not backward:
            raise UsageError(
                "",
                f"stage {name}",
                "is a stage of the backward pass",
                "the backward pass asked for too",
                option="backward",
            )


def check_stages_apply(
    inputs: Inputs, stages: Collection[str] | None, backward: bool = False
) -> None:
    """Refuse, before computing, a stage this fixture does not have (``masked`` unmasked)."""
    applicable = applicable_stages(inputs, opt_in=OPT_IN_STAGES, backward=backward)  # by name
    for name in stages or ():
        if name not in applicable:
            raise UsageError(
                "",
                f"stage {name}",
                "this fixture has no such stage",
                "one of " + ", ".join(applicable),
                option="stage",
            )


def kept_stages(stages: tuple[str, ...] | None, shaded: bool) -> tuple[str, ...] | None:
    """The stages to keep for a subset: those asked for, and ``masked`` for a shaded softmax."""
    if stages is None:
        return None
    if "softmax" in stages and shaded:
        return (*stages, "masked")  # a heatmap of softmax marks the masked cells
    return stages


def _require_piped_stdin() -> None:
    expected = "a fixture piped in, e.g. attn trace - < fixture.yaml"
    if sys.stdin is None:
        raise UsageError("<stdin>", "", "standard input is closed", expected)
    if sys.stdin.isatty():
        raise UsageError("<stdin>", "", "standard input is a terminal", expected)


def _exists(path: Path) -> bool:
    """Whether something is at ``path``; a name too long for the system is a file name too."""
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return True  # let the loader name the problem
