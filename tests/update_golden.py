"""Regenerate tests/golden/: for every bundled example, its plain rendering and its JSON trace.

Run it on purpose, from anywhere, then review and commit the diff:

    python tests/update_golden.py

Nothing else writes these files: tests/acceptance/test_golden.py only reads them. The JSON goldens
are written by ``attn check NAME --golden FILE --update`` (atomically), the renderings by
``attn trace NAME --format plain --width 100 -o FILE``, exactly as a user would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
FIXTURES = ROOT / "fixtures"
WIDTH = "100"


def bundled() -> list[str]:
    """The bundled examples' names, as ``attn examples`` lists them."""
    return sorted(p.stem for p in FIXTURES.iterdir() if p.suffix in (".yaml", ".yml", ".json"))


def attn(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "attn_cli", *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"attn {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return (done.stdout + done.stderr).strip()


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    names = bundled()
    for name in names:
        print(attn("check", name, "--golden", str(GOLDEN / f"{name}.json"), "--update"))
        text = GOLDEN / f"{name}.txt"
        attn("trace", name, "--format", "plain", "--width", WIDTH, "-o", str(text))
        print(f"wrote {text}")
    keep = {f"{n}{suffix}" for n in names for suffix in (".json", ".txt")}
    for stale in sorted(p for p in GOLDEN.iterdir() if p.name not in keep):
        stale.unlink()
        print(f"removed {stale} (no such bundled example)")


if __name__ == "__main__":
    main()
