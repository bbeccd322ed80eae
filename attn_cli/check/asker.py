"""Asking someone's attention function, for ``attn probe``: it is called with copies of our
arrays (in its framework and dtype), and what it returns is checked and read as float64."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attn_cli.core.inputs import FloatArray
from attn_cli.errors import ProbeError
from attn_cli.io.target import call, one_line


@dataclass
class Asker:
    """Calls the function with our arrays (copies, converted), and checks what it returns."""

    fn: Callable[..., Any]
    source: str
    framework: str
    dtype: str
    timeout: float
    takes: tuple[str, ...]
    mask_kind: str = "bool"  # or "additive": 0 where a key attends, -inf where it is hidden
    mutated: dict[str, str] = field(default_factory=dict)  # array name -> evidence

    def ask(
        self,
        q: FloatArray,
        k: FloatArray,
        v: FloatArray,
        *,
        fatal: bool = True,
        **options: Any,
    ) -> FloatArray | str:
        """The output as float64 (batch, heads, seq_q, d_v); a message when it cannot be had:
        raised as a ProbeError when ``fatal``, else returned. Options it does not take are
        dropped, and so are those set to None."""
        kwargs = {n: o for n, o in options.items() if n in self.takes and o is not None}
        arrays = {"q": q, "k": k, "v": v} | ({"mask": kwargs["mask"]} if "mask" in kwargs else {})
        held = {n: self._convert(a) for n, a in arrays.items()}
        kwargs |= {"mask": held["mask"]} if "mask" in kwargs else {}
        shown = _called(q, k, kwargs)
        got = call(
            self.fn,
            (held["q"], held["k"], held["v"]),
            kwargs,
            timeout=self.timeout,
            source=self.source,
            field=shown,
        )
        self._check_mutation(arrays, held, kwargs)
        expected = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
        problem = f"raised {one_line(got.error)}" if got.error is not None else None
        out = None if problem else self._numbers(got.value)
        if isinstance(out, str):
            problem, out = out, None
        if out is not None and out.shape != expected:
            problem = f"returned shape {tuple(out.shape)}, expected {expected}"
        if problem is None and out is not None:
            return out
        if fatal:
            raise ProbeError(
                self.source,
                shown,
                str(problem),
                "an array [batch, heads, seq_q, d_v] from fn(q, k, v, ...)",
            )
        return f"{shown}: {problem}"

    def _convert(self, a: np.ndarray[Any, Any]) -> Any:
        a = a if a.dtype == bool else a.astype(self.dtype)
        if self.framework == "torch":
            import torch

            return torch.from_numpy(a.copy())
        return a.copy()

    def _numbers(self, value: Any) -> FloatArray | str:
        """What the function returned as a float64 array, or what is wrong with it."""
        kind = type(value).__name__
        if self.framework == "torch":
            import torch

            if not isinstance(value, torch.Tensor):
                return f"returned a {kind}, expected a torch.Tensor"
            value = value.detach().to("cpu").to(torch.float64).numpy()
        elif not isinstance(value, np.ndarray):
            hint = " (or --framework torch)" if kind == "Tensor" else ""
            return f"returned a {kind}, expected a NumPy array{hint}"
        if not (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)):
            return f"returned an array of {value.dtype}, expected real numbers"
        return np.asarray(value, dtype=np.float64)

    def _check_mutation(
        self, arrays: Mapping[str, Any], held: Mapping[str, Any], kwargs: Mapping[str, Any]
    ) -> None:
        for name, original in arrays.items():
            after = held[name]
            after = after.detach().numpy() if self.framework == "torch" else after
            before = original if original.dtype == bool else original.astype(self.dtype)
            if name not in self.mutated and (
                after.shape != before.shape or not np.array_equal(after, before, equal_nan=True)
            ):
                self.mutated[name] = f"{name} changed by the call {_called(before, None, kwargs)}"


def _called(
    q: np.ndarray[Any, Any], k: np.ndarray[Any, Any] | None, kwargs: Mapping[str, Any]
) -> str:
    """How a call is named in evidence: fn(q[2,2,4,4], k[2,2,4,4], causal=True)."""
    parts = [f"q{_shape(q)}"] + ([f"k{_shape(k)}"] if k is not None else [])
    parts += [f"{n}={o!r}" if n != "mask" else f"mask{_shape(o)}" for n, o in kwargs.items()]
    return f"fn({', '.join(parts)})"


def _shape(a: Any) -> str:
    return "[" + ",".join(str(n) for n in a.shape) + "]"
