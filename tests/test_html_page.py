"""The interactive page's markup and data without a browser (tests/test_html_browser.py drives
it in Chromium): the contract of docs/html.md, its escaping, its bounds, its start-up cost."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

import attn_cli
from attn_cli.io.trace_json import dumps
from attn_cli.present.html_page import script_json, trace_page
from attn_cli.present.options import RenderOptions

DATA = re.compile(r'<script type="application/json" id="attn-data">(.*?)</script>', re.S)
SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)
CELL = re.compile(r'<td[^>]* data-stage="([^"]+)" data-index="([0-9,]+)"')


def page_data(page: str) -> dict[str, object]:
    found = DATA.search(page)
    assert found is not None
    data: dict[str, object] = json.loads(found.group(1))
    return data


def test_the_data_is_the_json_trace_as_attn_trace_json_writes_it() -> None:
    trace = attn_cli.trace_file("causal_multihead", keep_all=True, shaded=True)
    page = trace_page(trace)
    assert page_data(page)["trace"] == json.loads(dumps(trace))
    assert "{{" not in page.replace(DATA.search(page).group(1), "")  # type: ignore[union-attr]


def test_every_cell_names_its_place_in_the_json_trace() -> None:
    trace = attn_cli.trace_file("padding_batch", keep_all=True, shaded=True)
    page = trace_page(trace)
    cells = CELL.findall(page)
    expected = {(s.name, ",".join(map(str, i))) for s in trace for i in _indices(s.data.shape)}
    assert set(cells) == expected and len(cells) == len(expected)  # batch axis included


def _indices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    import numpy as np

    return list(np.ndindex(*shape))


HOSTILE = ["</script><script>alert(1)</script>", "<!--", "\u2028\u2029", "\u202eabc\u2066", "&amp;"]


def test_script_json_keeps_the_values_and_no_markup() -> None:
    from attn_cli.io.trace_json import json_text

    text = script_json(json_text(HOSTILE))
    assert json.loads(text) == HOSTILE
    for bad in ("</", "<!--", "\u2028", "\u2029", "\u202e", "\u2066", "&", "<", ">"):
        assert bad not in text, bad


def test_only_the_pages_own_script_may_run() -> None:
    page = trace_page(attn_cli.trace_file("the_cat_sat"))
    scripts = SCRIPT.findall(page)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'" in page


def test_hostile_text_is_escaped_in_the_markup(tmp_path: Path) -> None:
    fixture = tmp_path / "h.json"
    n = len(HOSTILE)
    fixture.write_text(json.dumps({
        "name": HOSTILE[0], "tokens": HOSTILE,
        "Q": [[1.0, 0.0]] * n, "K": [[0.0, 1.0]] * n, "V": [[1.0, 2.0]] * n,
    }), encoding="utf-8")  # fmt: skip
    result = run_cli("trace", str(fixture), "-f", "html")
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert page.count("<script") == 2 and "<!--" not in page
    assert "\u2028" not in page and "\u202e" not in page and "\u2066" not in page
    assert html.escape(HOSTILE[0]) in page  # shown as text


@pytest.mark.slow
def test_a_big_trace_is_cut_and_says_so(tmp_path: Path) -> None:
    """Past the page's cap the biggest stages keep the rows shown, their indices under kept."""
    import numpy as np

    rng = np.random.default_rng(1)
    seq = 700  # 700 x 700 x 3 score stages: 1.47 million numbers, past PAGE_NUMBERS
    fixture = tmp_path / "big.json"
    fixture.write_text(json.dumps({
        name: rng.standard_normal((seq, 2)).round(3).tolist() for name in ("Q", "K", "V")
    }), encoding="utf-8")  # fmt: skip
    trace = attn_cli.trace_file(str(fixture), keep_all=True)
    page = trace_page(trace)
    data = page_data(page)
    kept = data["kept"]
    assert isinstance(kept, dict) and set(kept) == {"scores", "scaled", "softmax"}
    assert kept["softmax"] == [None, [0, 1, 2, 697, 698, 699], None]  # rows shown, each whole
    full = trace["softmax"].data
    cut = data["trace"]["stages"]["softmax"]["data"]  # type: ignore[index]
    np.testing.assert_array_equal(np.array(cut), full[:, [0, 1, 2, 697, 698, 699], :])
    assert "The page embeds" in page and len(page) < 20_000_000


def test_full_is_capped() -> None:
    trace = attn_cli.run(
        attn_cli.load_fixture(str(Path(__file__).parent.parent / "fixtures" / "the_cat_sat.yaml"))
    )
    assert "data-index" in trace_page(trace, RenderOptions(full=True))


@pytest.mark.subprocess
@pytest.mark.parametrize("argv", [["--help"], ["trace", "the_cat_sat", "-f", "json"], ["trace"]])
def test_other_commands_do_not_import_the_page(argv: list[str]) -> None:
    """Start-up budget: the page's generator loads only for ``-f html`` (python -X importtime)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attn_cli", *argv],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "attn_cli.present.html_page" not in out.stderr
    assert "attn_cli.present.explain" not in out.stderr


def test_the_template_is_package_data() -> None:
    """A non-editable install ships the template and the script: pyproject's package-data
    lists them (setuptools puts exactly those files in the wheel)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    listed = config["tool"]["setuptools"]["package-data"]["attn_cli.present"]
    assert {"page.html", "page.js", "model.js"} <= set(listed)  # model.js: the model view's
    assert "attn_cli.present" in config["tool"]["setuptools"]["packages"]
    assert all((root / "attn_cli" / "present" / name).is_file() for name in listed)


@pytest.mark.subprocess
def test_the_packages_door_registers_the_notebook_view() -> None:
    """Trace._repr_html_ is the page once present/html_page.py is imported, which
    attn_cli.trace_file does; before that (attn_cli.api alone) it is None: plain text."""
    code = (
        "import attn_cli.api as api\n"
        "print(api.trace_file('the_cat_sat')._repr_html_() is None)\n"
        "import attn_cli\n"
        "print(attn_cli.trace_file('the_cat_sat')._repr_html_()[:15])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["True", "<iframe srcdoc="]
