"""The interactive page's markup and data without a browser (tests/present/test_html_browser.py
drives it in Chromium): the contract of docs/html.md, its escaping, its bounds, its start-up
cost."""

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
    fixture.write_text(
        json.dumps(
            {
                "name": HOSTILE[0],
                "tokens": HOSTILE,
                "Q": [[1.0, 0.0]] * n,
                "K": [[0.0, 1.0]] * n,
                "V": [[1.0, 2.0]] * n,
            }
        ),
        encoding="utf-8",
    )
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
    fixture.write_text(
        json.dumps(
            {name: rng.standard_normal((seq, 2)).round(3).tolist() for name in ("Q", "K", "V")}
        ),
        encoding="utf-8",
    )
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
        attn_cli.load_fixture(str(Path(__file__).parents[2] / "fixtures" / "the_cat_sat.yaml"))
    )
    assert "data-index" in trace_page(trace, RenderOptions(full=True))


@pytest.mark.subprocess
@pytest.mark.parametrize("argv", [["--help"], ["trace", "the_cat_sat", "-f", "json"], ["trace"]])
def test_other_commands_do_not_import_the_page(argv: list[str]) -> None:
    """Start-up budget: the page's generator loads only for ``-f html`` (python -X importtime)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attn_cli", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "attn_cli.present.html_page" not in out.stderr
    assert "attn_cli.present.explain" not in out.stderr


def test_the_template_is_package_data() -> None:
    """A non-editable install ships the template and the script: pyproject's package-data
    lists them (setuptools puts exactly those files in the wheel)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    root = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------------------------------------
# attn decode -f html and attn flash -f html (present/html_decode.py, html_flash.py): the same
# template and script, a section per step or tile; each cell names its place in the decode or
# flash JSON.

TD = re.compile(r"<td([^>]*) data-stage=\"([^\"]+)\"([^>]*)>([^<]*)<")
ATTR = re.compile(r'data-([a-z-]+)="([^"]*)"')


def step_cells(page: str) -> list[tuple[str, tuple[int, ...], dict[str, str], str]]:
    """Every number cell: its stage, its index, its other data- attributes and its text."""
    out = []
    for before, stage, after, text in TD.findall(page):
        attrs = dict(ATTR.findall(before + after))
        index = tuple(int(i) for i in attrs.pop("index").split(","))
        out.append((html.unescape(stage), index, attrs, text))
    return out


def json_at(data: object, index: tuple[int, ...]) -> object:
    for i in index:
        data = data[i]  # type: ignore[index]
    return data


def as_shown(x: object) -> str:
    """A table's number as the contract says: 4 decimals, no -0, non-finite spelled."""
    if isinstance(x, str):
        return x
    text = f"{x:.4f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def _made(*argv: str) -> tuple[str, dict[str, object]]:
    page = run_cli(*argv, "-f", "html")
    assert page.exit_code == 0, page.output
    data = run_cli(*argv, "-f", "json")
    assert data.exit_code == 0, data.output
    return page.stdout, json.loads(data.stdout)


@pytest.mark.parametrize("name", ["causal_multihead", "mistral_sliding_window", "deepseek_mla"])
def test_every_decode_cell_names_its_place_in_the_decode_json(name: str) -> None:
    page, run = _made("decode", name)
    steps = run["steps"]
    assert isinstance(steps, list)
    seen: dict[tuple[int, str], set[tuple[int, ...]]] = {}
    for stage, index, attrs, text in step_cells(page):
        k = int(attrs["step"])
        if attrs.get("source") == "trace":  # the full attention's row: (head, token, column)
            assert index[-2] == steps[k]["index"]
            mine = json_at(steps[k]["stages"][stage]["data"], (*index[:-2], 0, index[-1]))
            assert text == as_shown(mine)  # equal to 1e-12: the same at 4 decimals
            continue
        assert text == as_shown(json_at(steps[k]["stages"][stage]["data"], index)), (k, stage)
        seen.setdefault((k, stage), set()).add(index)
    for k, step in enumerate(steps):
        for stage, body in step["stages"].items():
            if name != "mistral_sliding_window" or stage not in ("K_cache", "V_cache"):
                import numpy as np

                every = set(np.ndindex(*body["shape"]))
                if stage in ("scores", "scaled", "capped", "softmax"):  # over the cache's slots
                    # an empty slot holds no key: its cell says — and names no number (issue 40)
                    every = {i for i in every if step["cache_positions"][i[-1]] >= 0}
                assert seen[(k, stage)] == every, (k, stage)
    assert page.count('<section class="stage"') == len(steps) + 2  # overview, steps, checks


def test_a_ring_buffers_slots_are_named_with_what_they_hold() -> None:
    page, run = _made("decode", "mistral_sliding_window", "--prefill", "2")
    assert "ring buffer of 3 slots: slot = position mod 3" in page
    last = run["steps"][-1]  # type: ignore[index]
    held = last["cache_positions"]
    assert held == [3, 4, 5] and ">2: mat@5<" in page and ">0: on@3<" in page


@pytest.mark.parametrize("name", ["causal_multihead", "padding_batch", "gptoss_sinks"])
def test_every_flash_cell_names_its_place_in_the_flash_json(name: str) -> None:
    page, run = _made("flash", name)
    tiles, stages = run["tiles"], run["stages"]
    assert isinstance(tiles, list) and isinstance(stages, dict)
    counted = 0
    for stage, index, attrs, text in step_cells(page):
        if "tile" in attrs:
            expected = json_at(tiles[int(attrs["tile"])][stage], index)
        else:
            assert attrs["source"] == "run"
            expected = json_at(stages[stage]["data"], index)
        assert text == as_shown(expected), (stage, index, attrs)
        counted += 1
    computed = [t for t in tiles if not t["skipped"]]
    per_tile = sum(len(t["S"]) * len(t["S"][0]) * 2 for t in computed)  # S and P
    assert counted > per_tile
    assert page.count('<section class="stage"') == len(tiles) + 2


def test_the_derivations_are_made_from_the_runs_numbers() -> None:
    page, run = _made("decode", "causal_multihead")
    data = page_data(page)
    assert data["format"] == "attn-decode" and list(data["steps"]) == ["0", "1", "2"]  # type: ignore[call-overload]
    step = run["steps"][0]  # type: ignore[index]
    cell = re.search(
        r'data-stage="scores" data-index="1,0,1" data-step="0"[^>]*data-w="(\d+)"', page
    )
    assert cell is not None
    text = json.dumps(data["derivations"][int(cell.group(1))]["en"], ensure_ascii=False)  # type: ignore[index]
    q, k = step["stages"]["Q"]["data"][1][0], step["stages"]["K_cache"]["data"][1][1]
    assert f"{q[0]:g}×{k[0]:g}".replace(".0", "") in text.replace(".0000", "")
    assert "scores = q·k" in text


@pytest.mark.parametrize("command", ["decode", "flash"])
def test_hostile_tokens_in_decode_and_flash_pages(tmp_path: Path, command: str) -> None:
    fixture = tmp_path / "h.json"
    n = len(HOSTILE)
    fixture.write_text(
        json.dumps(
            {
                "name": HOSTILE[0],
                "tokens": HOSTILE,
                "causal": True,
                "Q": [[1.0, 0.0]] * n,
                "K": [[0.0, 1.0]] * n,
                "V": [[1.0, 2.0]] * n,
            }
        ),
        encoding="utf-8",
    )
    result = run_cli(command, str(fixture), "-f", "html")
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert page.count("<script") == 2 and "<!--" not in page
    assert "\u2028" not in page and "\u202e" not in page and "\u2066" not in page
    assert html.escape(HOSTILE[0]) in page
    scripts = SCRIPT.findall(page)
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'" in page


def _long_fixture(path: Path, seq: int, d: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(3)
    path.write_text(
        json.dumps(
            {
                "causal": True,
                **{n: rng.standard_normal((seq, d)).round(3).tolist() for n in "QKV"},
            }
        ),
        encoding="utf-8",
    )
    return path


@pytest.mark.slow
def test_a_long_decode_gives_a_bounded_page_and_says_so(tmp_path: Path) -> None:
    """600 tokens: 599 steps, 6 drawn; each step's cache of 128-wide rows is big, so the page's
    data keeps the first steps' numbers only (a cap of 300,000), and says both."""
    fixture = _long_fixture(tmp_path / "long.json", 600, 128)
    result = run_cli("decode", str(fixture), "-f", "html")
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert "6 of 599 steps shown" in page
    assert page.count('<section class="stage"') == 8
    assert "The page embeds the numbers of" in page
    assert len(page) < 8_000_000, len(page)
    data = page_data(page)
    assert 0 < len(data["steps"]) < 6  # type: ignore[arg-type]


def test_flash_tiles_past_the_pages_cap_elide(tmp_path: Path) -> None:
    fixture = _long_fixture(tmp_path / "tiles.json", 48, 2)
    result = run_cli(
        "flash",
        str(fixture),
        "-f",
        "html",
        "--block-q",
        "2",
        "--block-k",
        "2",
        "--max-tiles",
        "200",
    )
    assert result.exit_code == 0, result.output
    assert "16 of 576 tiles shown here" in result.stdout
    assert result.stdout.count('<section class="stage"') == 18


def test_step_mode_refuses_html() -> None:
    result = run_cli("decode", "causal_multihead", "-f", "html", "--step")
    assert result.exit_code == 2
    assert "--step" in result.stderr and "no --format html" in result.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "argv", [["decode", "causal_multihead", "-f", "json"], ["flash", "causal_multihead"]]
)
def test_decode_and_flash_without_html_do_not_import_the_page(argv: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attn_cli", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "attn_cli.present.html_steps" not in out.stderr
    assert "attn_cli.present.html_page" not in out.stderr


@pytest.mark.subprocess
def test_decode_and_flash_runs_show_their_pages_in_a_notebook() -> None:
    """_repr_html_ is the page once present/html_decode.py is imported (attn_cli.run_decode and
    attn_cli.run_flash import it); from check/runs.py alone it is None: plain text."""
    code = (
        "import attn_cli.check.runs as runs\n"
        "print(runs.run_decode('causal_multihead')._repr_html_() is None)\n"
        "import attn_cli\n"
        "print(attn_cli.run_decode('causal_multihead')._repr_html_()[:15])\n"
        "print(attn_cli.run_flash('causal_multihead')._repr_html_()[:15])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["True", "<iframe srcdoc=", "<iframe srcdoc="]


def test_a_decode_with_a_batch_axis_and_the_full_rows_of_the_json_trace(tmp_path: Path) -> None:
    """With a batch axis every index starts with it; the full attention's row of each step is
    attn trace -f json's output at (batch, head, token, column)."""
    fixture = tmp_path / "batch.json"
    x = [[[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0]], [[0, 0, 1, 1], [1, 0, 1, 0], [0, 1, 0, 1]]]
    k = [[[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0]], [[0, 2, 1, 1], [1, 0, 1, 0], [0, 1, 0, 1]]]
    fixture.write_text(json.dumps({"causal": True, "heads": 2, "Q": x, "K": k, "V": x}), "utf-8")
    page, run = _made("decode", str(fixture))
    traced = json.loads(run_cli("trace", str(fixture), "-f", "json").stdout)["stages"]
    steps = run["steps"]
    assert isinstance(steps, list)
    rows = 0
    for stage, index, attrs, text in step_cells(page):
        k_step = int(attrs["step"])
        if attrs.get("source") == "trace":
            assert text == as_shown(json_at(traced[stage]["data"], index))
            rows += 1
        else:
            assert text == as_shown(json_at(steps[k_step]["stages"][stage]["data"], index))
        assert len(index) == 4 and index[0] in (0, 1)
    assert rows == 2 * 2 * 2 * 2  # 2 steps × 2 batch items × 2 heads × d_v = 2
    assert page.count('<select data-role="batch">') == 1 and ">批 1 · 头 0<" in page


@pytest.mark.slow
def test_full_draws_every_step_up_to_its_cap(tmp_path: Path) -> None:
    fixture = _long_fixture(tmp_path / "t20.json", 20, 2)
    elided = run_cli("decode", str(fixture), "-f", "html")
    every = run_cli("decode", str(fixture), "-f", "html", "--full")
    assert elided.exit_code == every.exit_code == 0
    assert elided.stdout.count('<section class="stage"') == 6 + 2
    assert "6 of 19 steps shown" in elided.stdout
    assert every.stdout.count('<section class="stage"') == 19 + 2
    assert "steps shown" not in every.stdout


DRAWN = ["linear_attention", "gated_deltanet", "diff_transformer"]  # a state's, two maps'


@pytest.mark.parametrize("example", DRAWN)
def test_a_state_and_two_maps_decode_have_a_page_keyed_as_the_json(
    example: str, tmp_path: Path
) -> None:
    """A recurrent state's and differential attention's decode are drawn: every number cell
    names a stage and index of ``attn decode -f json``'s step and shows its number."""
    import re

    out = tmp_path / "p.html"
    assert run_cli("decode", example, "-f", "html", "-o", str(out), "-q").exit_code == 0
    run = json.loads(run_cli("decode", example, "-f", "json").stdout)
    page = out.read_text(encoding="utf-8")
    cells = re.findall(
        r'<td[^>]* data-stage="([^"]+)" data-index="([^"]*)" data-step="(\d+)"'
        r"(?! data-source)[^>]*>([^<]*)</td>",
        page,
    )
    assert len(cells) > 100
    for stage, index, k, text in cells:
        data = run["steps"][int(k)]["stages"][stage]["data"]
        for i in map(int, index.split(",")):
            data = data[i]
        want = f"{data:.4f}"
        assert text == (want[1:] if want.startswith("-") and float(want) == 0 else want)
    names = {stage for stage, *_ in cells}
    assert names >= set(run["steps"][0]["stages"]) - {"Q_rot", "capped"}, names


def test_a_decode_of_rows_the_page_does_not_know_is_refused_in_one_line() -> None:
    """A decode with a row the page has no derivation for (a third map) is refused, not drawn
    with derivations that are not its own."""
    from types import SimpleNamespace

    from attn_cli.cli.decode import refuse_page
    from attn_cli.cli.runs import RunFormat
    from attn_cli.errors import UsageError

    step = SimpleNamespace(rows={"scores_2": 0, "softmax_2": 0, "scores_3": 0, "diff": 0})
    inputs = SimpleNamespace(source="f.json")
    run = SimpleNamespace(
        result=SimpleNamespace(steps=[step]), trace=SimpleNamespace(inputs=inputs)
    )
    with pytest.raises(UsageError, match="html: a decode of the rows scores_3 has no page yet"):
        refuse_page(run, RunFormat.html)
    refuse_page(run, RunFormat.json)  # the JSON shows it
    step.rows.pop("scores_3")
    refuse_page(run, RunFormat.html)
