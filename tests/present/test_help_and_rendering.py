"""Round three's polish (issue 22): help texts, golden folders, decode's ring, 80 columns, HTML
themes, blank lines in plain output, the step-mode keys and the minus sign."""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import BUNDLED, DOCS, FIXTURES, ROOT, run_cli
from rich.cells import cell_len

from attn_cli.cli.app import COMMANDS, _built, app

# -- 1. help texts are plain text, not Rich markup ----------------------------------------------

_BRACKETED = re.compile(r"\[[^\[\]]*\]")


def _squeezed(text: str) -> str:
    return " ".join(text.split())


def _help_sources(command: Any) -> list[str]:
    """The help texts of a Click command and of each of its parameters, as written."""
    texts = [command.help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return [t for t in texts if t]


def _literals(texts: list[str]) -> list[str]:
    return [_squeezed(found) for text in texts for found in _BRACKETED.findall(text)]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_bracket_in_a_command_help_is_shown(name: str) -> None:
    literals = _literals(_help_sources(_built(name)))
    result = run_cli(name, "--help", env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    shown = _squeezed(result.stdout)
    missing = [literal for literal in literals if literal not in shown]
    assert not missing, f"attn {name} --help lost {missing}"


def test_the_brackets_the_issue_names_are_shown() -> None:
    """The three the issue saw eaten; a guard that the test above has something to find."""
    assert "pip install 'attn-cli[models]'" in run_cli("import", "-h").stdout
    wide = {"COLUMNS": "400"}
    assert "[seq, hidden] or [batch, seq, hidden]" in run_cli("import", "-h", env=wide).stdout
    assert "[heads*d_k, d_model]" in _squeezed(run_cli("new", "-h", env=wide).stdout)


def test_the_root_help_and_its_listing_keep_brackets() -> None:
    import typer.main

    group = typer.main.get_command(app)
    literals = _literals([group.help or "", *(entry.summary for entry in COMMANDS.values())])
    result = run_cli("--help", env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert all(literal in _squeezed(result.stdout) for literal in literals)


def test_help_texts_stay_as_written_after_drawing() -> None:
    """Escaping is for the drawing only: completion reads the same texts."""
    before = _help_sources(_built("import"))
    assert run_cli("import", "--help").exit_code == 0
    assert _help_sources(_built("import")) == before


# -- 2. --update makes the golden's folders -----------------------------------------------------


def _documented_updates() -> list[str]:
    """The ``attn check ... --update`` lines of the README and docs/ci.md, comments cut."""
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    lines += (DOCS / "ci.md").read_text("utf-8").splitlines()
    found = [line.split("#", 1)[0].strip() for line in lines if line.startswith("attn check")]
    return [line for line in found if "--update" in line]


def test_the_documented_golden_commands_run_in_a_fresh_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = _documented_updates()
    assert len(commands) >= 2
    for i, line in enumerate(commands):
        here = tmp_path / str(i)
        here.mkdir()
        monkeypatch.chdir(here)
        args = shlex.split(line)[1:]
        for arg in args[1:]:
            if arg.endswith((".yaml", ".yml")):  # the fixture, perhaps a glob: one file for it
                fixture = here / arg.replace("*", "cat")
                fixture.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(FIXTURES / "the_cat_sat.yaml", fixture)
        args = [word for arg in args for word in _expanded(here, arg)]
        result = run_cli(*args)
        assert result.exit_code == 0, f"{line}: {result.stderr}"
        assert list(here.rglob("*.json")), line


def _expanded(here: Path, arg: str) -> list[str]:
    """A glob expanded as the shell would, in ``here``; other words as they are."""
    if "*" not in arg:
        return [arg]
    return [str(p.relative_to(here)) for p in sorted(here.glob(arg))]


def test_update_makes_nested_folders_and_compares_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("check", "the_cat_sat", "--golden", "a/b/c/cat.json", "--update")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "a/b/c/cat.json").is_file()
    assert run_cli("check", "the_cat_sat", "--golden", "a/b/c/cat.json").exit_code == 0
    result = run_cli("check", "the_cat_sat", "--golden-dir", "g/h", "--update")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "g/h/the_cat_sat.json").is_file()


@pytest.mark.parametrize("option", ["--golden", "--golden-dir"])
def test_a_file_where_a_folder_should_be_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("a file", encoding="utf-8")
    target = "f/x/cat.json" if option == "--golden" else "f/x"
    result = run_cli("check", "the_cat_sat", option, target, "--update")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: f/x/")
    assert f": {option}: 'f' is not a folder, expected " in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_failed_update_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("x: [\n", encoding="utf-8")
    (tmp_path / "kept").mkdir()
    result = run_cli("check", "bad.yaml", "--golden", "kept/new/deeper/bad.json", "--update")
    assert result.exit_code == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bad.yaml", "kept"]


# -- 3. decode shows the slots a ring buffer fills, not all `window` of them --------------------


def _windowed(tmp_path: Path, window: int, positions: list[int] | None = None) -> Path:
    """The bundled Mistral fixture (6 tokens) with another window, perhaps other positions."""
    text = (FIXTURES / "mistral_sliding_window.yaml").read_text("utf-8")
    assert "\nwindow: 3\n" in text
    extra = f"positions: {positions}\nkey_positions: {positions}\n" if positions else ""
    path = tmp_path / "windowed.yaml"
    path.write_text(text.replace("\nwindow: 3\n", f"\nwindow: {window}\n{extra}"), "utf-8")
    return path


@pytest.mark.parametrize("full", [False, True])
def test_decode_with_the_window_of_an_imported_mistral_is_short(tmp_path: Path, full: bool) -> None:
    """Window 4096 over 6 tokens: every slot of the ring was listed (3,433 lines)."""
    fixture = _windowed(tmp_path, 4096)
    result = run_cli("decode", str(fixture), "--no-color", *(["--full"] * full))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "6: —" not in out and "4095:" not in out
    assert len(out.splitlines()) < 400


GAPS = [0, 10, 20, 30, 40, 50]  # window 40: a ring of 40 slots, of which 0, 10, 20, 30 fill


@pytest.mark.parametrize("full", [False, True])
def test_decode_shows_only_the_ring_slots_a_run_fills(tmp_path: Path, full: bool) -> None:
    fixture = _windowed(tmp_path, 40, GAPS)
    result = run_cli("decode", str(fixture), "--no-color", *(["--full"] * full))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "cache: 40 slots · slot: token@position\n  0: The@0, 10: cat@10, 20: —, " in out
    assert "1: —" not in out and "39: —" not in out
    assert "36 of the 40 slots stay empty in this run (6 tokens) and are not shown" in out


@pytest.mark.parametrize("full", [False, True])
def test_decode_elides_a_long_cache_line_as_its_tables(tmp_path: Path, full: bool) -> None:
    """20 tokens: the last step's cache line listed all 20 slots (1,024 at 1,024 tokens, most of
    the rendering time); now the first and last three, as the K and V tables' rows."""
    rows = [[math.sin(i + j) for j in range(2)] for i in range(20)]
    fixture = tmp_path / "long.json"
    fixture.write_text(json.dumps({"Q": rows, "K": rows, "V": rows, "causal": True}), "utf-8")
    result = run_cli("decode", str(fixture), "--no-color", "--width", "400", *(["--full"] * full))
    assert result.exit_code == 0, result.stderr
    out = result.stdout.splitlines()
    lines = [out[n + 1] for n, line in enumerate(out) if line.startswith("cache: 20 slots")]
    assert len(lines) == 1  # the slots on a line of their own, under "cache: 20 slots"
    listed = lines[0].strip().split(", ")
    if full:
        assert listed == [f"{s}: {s}@{s}" for s in range(20)]
    else:
        assert listed == ["0: 0@0", "1: 1@1", "2: 2@2", "…", "17: 17@17", "18: 18@18", "19: 19@19"]


def test_decode_in_chinese_says_the_empty_slots_are_not_shown(tmp_path: Path) -> None:
    fixture = _windowed(tmp_path, 40, GAPS)
    result = run_cli("decode", str(fixture), "--no-color", "--lang", "zh")
    assert result.exit_code == 0, result.stderr
    assert "40 个槽中有 36 个在本次运行（6 个词）中始终为空，不显示" in result.stdout


def test_a_window_shorter_than_the_sequence_shows_every_slot() -> None:
    result = run_cli("decode", "mistral_sliding_window", "--no-color", "--full")
    assert result.exit_code == 0, result.stderr
    assert "stay empty" not in result.stdout
    assert "2: —" in result.stdout and "3: —" not in result.stdout  # window 3


# -- 4. 80 x 24: every line fits, the cost table whole, the step-mode footer keeps quit ---------


def _too_long(text: str, width: int = 80) -> list[str]:
    """The lines wider than ``width`` terminal cells (a CJK character takes two)."""
    return [line for line in text.splitlines() if cell_len(line) > width]


@pytest.fixture(scope="module")
def wide_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal fixture of 20 tokens and 48 embedding columns: --full drew 486-cell lines."""
    path = tmp_path_factory.mktemp("wide") / "wide.yaml"
    made = run_cli(
        "new", str(path), "--seq", "20", "--d-model", "48", "--d-k", "16", "--causal", "-q"
    )
    assert made.exit_code == 0, made.stderr
    return path


@pytest.mark.slow
@pytest.mark.parametrize("full", [False, True], ids=["elided", "full"])
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("command", ["trace", "decode", "flash"])
def test_a_wide_fixture_fits_80_columns(
    wide_fixture: Path, command: str, lang: str, full: bool
) -> None:
    args = ["--no-color", "--width", "80", "--lang", lang, "--explain", *(["--full"] * full)]
    result = run_cli(command, str(wide_fixture), *args)
    assert result.exit_code == 0, result.stderr
    assert not _too_long(result.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("command", ["trace", "decode", "flash"])
def test_every_bundled_example_fits_80_columns(command: str, lang: str) -> None:
    ran = 0
    for name in BUNDLED:
        for full in ([], ["--full"]):
            result = run_cli(command, name, "--no-color", "--width", "80", "--lang", lang, *full)
            refused = (
                "causal" in result.stderr,
                ": gate: " in result.stderr,
                ": mla: " in result.stderr,
                ": diff: " in result.stderr,
                ": linear_attention: " in result.stderr,
                ": gated_deltanet: " in result.stderr,
            )
            if result.exit_code == 2 and any(refused):
                continue  # decode and flash: causal fixtures only, no gate, MLA, linear attention
            assert result.exit_code == 0, f"{name}: {result.stderr}"
            assert not _too_long(result.stdout), f"{command} {name} {lang} {full}"
            ran += 1
    assert ran >= 8


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_cache_cost_table_is_whole_at_80_columns(lang: str) -> None:
    result = run_cli("decode", "gptoss_sinks", "--no-color", "--width", "80", "--lang", lang)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(n for n, line in enumerate(lines) if "(K and V" in line or "（K 和 V" in line)
    table = "\n".join(lines[start : start + 8])
    assert "…" not in table
    assert "kv_heads" in table
    assert "(float64)" in table or "（float64）" in table


def test_full_wraps_a_wide_matrix_in_blocks_of_columns(wide_fixture: Path) -> None:
    result = run_cli(
        "trace", str(wide_fixture), "--no-color", "--width", "80", "--full", "--stage", "X"
    )
    assert result.exit_code == 0, result.stderr
    headers = [line.split() for line in result.stdout.splitlines() if line.startswith("seq ")]
    assert len(headers) > 1  # 48 columns do not fit in 80 cells: several blocks
    shown = [int(j) for header in headers for j in header[1:]]
    assert shown == list(range(48))  # every column once, in order, none elided


def _deck_last_lines(lang: str, width: int, height: int) -> list[str]:
    """The status line of every stage's first screen of step mode."""
    import io

    from rich.console import Console

    from attn_cli.api import trace_file
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.pager import Deck, State, frame

    trace = trace_file("causal_multihead", keep_all=True)
    options = RenderOptions(explain=True, lang=lang)  # type: ignore[arg-type]
    deck = Deck(trace, options, Console(width=width, color_system=None, file=io.StringIO()))
    screens = [frame(deck, State(k), width, height) for k in range(len(deck.names))]
    return ["".join(s.text for s in screen[-1]) for screen in screens]


@pytest.mark.parametrize("width", [80, 60, 40])
@pytest.mark.parametrize(("lang", "quit_word"), [("en", "quit"), ("zh", "退出")])
def test_the_step_mode_footer_always_says_how_to_quit(
    lang: str, quit_word: str, width: int
) -> None:
    for line in _deck_last_lines(lang, width, 24):
        assert quit_word in line, line
        assert cell_len(line.rstrip()) <= width


# -- 5. HTML in the theme's colours, its language named, CJK boxed two cells wide ---------------

_BODY = re.compile(r"body \{\s*color: (#[0-9a-f]{6});\s*background-color: (#[0-9a-f]{6});")
_BOXED = re.compile(r'<span class="w">(.)</span>')


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_the_trace_page_opens_in_the_theme(theme: str) -> None:
    """attn trace's interactive page starts in the theme asked (its button switches it)."""
    result = run_cli("trace", "the_cat_sat", "-f", "html", "--theme", theme)
    assert result.exit_code == 0, result.stderr
    assert f'<body data-lang="en" data-theme="{theme}"' in result.stdout


@pytest.mark.parametrize("command", ["heatmap"])
@pytest.mark.parametrize("theme", ["dark", "light"])
def test_an_html_page_takes_the_theme_colours(command: str, theme: str) -> None:
    result = run_cli(command, "the_cat_sat", "-f", "html", "--theme", theme)
    assert result.exit_code == 0, result.stderr
    body = _BODY.search(result.stdout)
    assert body is not None
    foreground, background = body.groups()
    if theme == "dark":  # a dark page with light text, as the terminal it imitates
        assert _luminance(background) < 0.3 < 0.6 < _luminance(foreground)
    else:
        assert background == "#ffffff" and _luminance(foreground) < 0.3


@pytest.mark.parametrize(("lang", "tag"), [("en", "en"), ("zh", "zh-Hans")])
def test_an_html_page_names_its_language(lang: str, tag: str) -> None:
    for command in ("trace", "heatmap"):
        result = run_cli(command, "the_cat_sat", "-f", "html", "--lang", lang)
        assert result.exit_code == 0, result.stderr
        assert f'<!DOCTYPE html>\n<html lang="{tag}">\n<head>\n' in result.stdout


def _text_of(code: str) -> str:
    """The page's text with each boxed wide character kept, every other tag dropped."""
    import html

    return html.unescape(re.sub(r"<[^>]*>", "", _BOXED.sub(r"\1", code)))


def test_every_wide_character_of_a_chinese_page_is_boxed_two_cells_wide() -> None:
    """Rich's HTML rendering (attn heatmap -f html, --split slides; attn trace -f html is the
    interactive page of docs/html.md), of the whole explained trace."""
    from attn_cli.api import trace_file
    from attn_cli.cli.options import Lang, TraceFormat
    from attn_cli.cli.trace import classroom_options, document

    trace = trace_file("causal_multihead", keep_all=True, shaded=True)
    options = classroom_options(trace, 4, None, False, True, Lang.zh, None, None)
    page = document(trace, options, TraceFormat.html, None, None)
    assert ".w { display: inline-block; width: 2ch;" in page
    code = page.split("<code", 1)[1].split(">", 1)[1].split("</code>", 1)[0]
    boxed = _BOXED.findall(code)
    assert len(boxed) > 100 and all(cell_len(ch) == 2 for ch in boxed)
    unboxed = re.sub(r"<[^>]*>", "", _BOXED.sub("", code))
    assert not [ch for ch in unboxed if cell_len(ch) == 2]
    lines = _text_of(code).splitlines()
    framed = [line for line in lines if line.startswith("│")]  # the header panel's rows
    assert framed and {cell_len(line) for line in framed} == {cell_len(lines[0])}


def test_slides_name_their_language_and_theme() -> None:
    from attn_cli.api import trace_file
    from attn_cli.present.options import RenderOptions
    from attn_cli.present.slides import slides

    trace = trace_file("the_cat_sat")
    made = slides(trace, RenderOptions(lang="zh"), "html", theme="dark")
    assert made and all('<html lang="zh-Hans">' in slide.text for slide in made)
    assert all("background-color: #ffffff" not in slide.text for slide in made)


# -- 6. plain output: no trailing blanks on a line or at the end ---------------------------------


def _blank_trouble(text: str) -> list[str]:
    """What breaks the promise of docs/ci.md: a line ending in a blank, a blank line at the end."""
    lines = text.split("\n")
    assert lines[-1] == "", "the text ends with a newline"
    trouble = [f"line {n + 1}: {line!r}" for n, line in enumerate(lines) if line != line.rstrip()]
    if len(lines) > 1 and not lines[-2].strip():
        trouble.append("a blank line at the end")
    return trouble


@pytest.mark.slow
@pytest.mark.parametrize("how", [["--no-color"], ["-f", "plain"], ["--no-color", "--explain"]])
def test_plain_output_of_every_bundled_example_has_no_trailing_blanks(how: list[str]) -> None:
    for name in BUNDLED:
        result = run_cli("trace", name, *how)
        assert result.exit_code == 0, result.stderr
        assert not _blank_trouble(result.stdout), name


PLAIN_RUNS = [
    (command, how)
    for command in ("decode", "flash", "heatmap")
    for how in (["--no-color"], ["-f", "plain"], ["--no-color", "--full"])
    if not (command == "heatmap" and "--full" in how)  # heatmap has no --full
]


@pytest.mark.parametrize(("command", "how"), PLAIN_RUNS)
def test_plain_decode_flash_and_heatmap_have_no_trailing_blanks(
    command: str, how: list[str]
) -> None:
    for name in ("causal_multihead", "gptoss_sinks"):
        result = run_cli(command, name, *how)
        assert result.exit_code == 0, result.stderr
        assert not _blank_trouble(result.stdout), name


def test_no_color_to_a_pipe_is_the_plain_format() -> None:
    for command in ("trace", "decode", "flash", "heatmap"):
        plain = run_cli(command, "causal_multihead", "-f", "plain").stdout
        assert run_cli(command, "causal_multihead", "--no-color").stdout == plain


def test_color_to_a_pipe_is_still_colour() -> None:
    result = run_cli("trace", "the_cat_sat", "--color")
    assert result.exit_code == 0
    assert "\x1b[" in result.stdout


# -- 7. the keys of step mode as docs/classroom.md lists them; one minus sign per kind of text ---

# The keys' names as the doc writes them, and the bytes a terminal sends for each.
KEY_BYTES: dict[str, tuple[bytes, ...]] = {
    "Enter": (b"\r", b"\n"),
    "Space": (b" ",),
    "→": (b"\x1b[C", b"\x1bOC"),
    "n": (b"n",),
    "l": (b"l",),
    "←": (b"\x1b[D", b"\x1bOD"),
    "Backspace": (b"\x7f", b"\x08"),
    "b": (b"b",),
    "p": (b"p",),
    "h": (b"h",),
    "↓": (b"\x1b[B", b"\x1bOB"),
    "j": (b"j",),
    "↑": (b"\x1b[A", b"\x1bOA"),
    "k": (b"k",),
    "Page Down": (b"\x1b[6~",),
    "Page Up": (b"\x1b[5~",),
    "Home": (b"\x1b[H", b"\x1bOH", b"\x1b[1~", b"\x1b[7~"),
    "End": (b"\x1b[F", b"\x1bOF", b"\x1b[4~", b"\x1b[8~"),
    "g": (b"g",),
    "?": (b"?",),
    "q": (b"q",),
    "Q": (b"Q",),
    "Esc": (b"\x1b",),
    "Ctrl-C": (b"\x03",),
    "Ctrl-D": (b"\x04",),
}
DOES = {  # how the doc's "does" column begins, for each action of the pager
    "next": "next stage",
    "back": "previous stage",
    "down": "scroll down one line",
    "up": "scroll up one line",
    "pgdn": "scroll down one screen",
    "pgup": "scroll up one screen",
    "home": "top of the stage",
    "end": "bottom of the stage",
    "goto": "go to a stage",
    "help": "the keys",
    "quit": "quit",
}


def _doc_keys() -> list[tuple[list[str], str]]:
    """The rows of the keys table of docs/classroom.md: the keys, what they do."""
    lines = (DOCS / "classroom.md").read_text("utf-8").splitlines()
    start = lines.index("| key | does |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        keys, does = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((keys.split(", "), does))
    return rows


def test_the_classroom_keys_table_is_the_pagers_key_map() -> None:
    from attn_cli.present.step import KEYS

    documented: dict[bytes, str] = {}
    for keys, does in _doc_keys():
        if keys == ["1 … 9"]:
            assert does.startswith("go to that stage")  # digits: on_key's go-to prompt
            continue
        actions = {KEYS[sent] for key in keys for sent in KEY_BYTES[key]}
        assert len(actions) == 1, f"one row, one action: {keys}"
        (action,) = actions
        assert does.startswith(DOES[action]), (keys, does)
        documented.update(dict.fromkeys((s for key in keys for s in KEY_BYTES[key]), action))
    assert documented == KEYS  # every key of the pager, and no other, as the doc says


def test_the_pager_help_and_the_doc_agree_on_page_down() -> None:
    """PgDn scrolls (the doc said it went to the next stage): at the bottom it moves on."""
    from attn_cli.present.pager import HELP

    page = ("PgDn  PgUp", "scroll one screen; past the end, the next (previous) stage")
    assert page in HELP["en"]
    assert ("↓ ↑  j k", "scroll one line") in HELP["en"]


@pytest.mark.parametrize(
    ("x", "table", "formula"),
    [
        (-5.65685, "-5.6569", "−5.6569"),
        (-math.inf, "-inf", "−∞"),
        (math.inf, "inf", "∞"),
        (-0.00001, "0.0000", "0.0000"),
        (-2.0, "-2.0000", "−2"),
        (3.5, "3.5000", "3.5000"),
    ],
)
def test_one_formatter_two_styles(x: float, table: str, formula: str) -> None:
    """Tables ASCII (as plain output and goldens are), formulas with U+2212 (as −∞ is)."""
    from attn_cli.present.text import factor, format_number, short_number

    assert format_number(x, 4) == table
    assert short_number(x, 4) == formula
    if formula.startswith("−"):
        assert factor(x, 4) == f"({formula})"


def test_a_worked_cell_writes_every_minus_alike() -> None:
    result = run_cli(
        "trace", "the_cat_sat", "--cell", "The,cat", "--stage", "softmax", "--no-color"
    )
    assert result.exit_code == 0, result.stderr
    cell = result.stdout.split("worked cell", 1)[1]
    assert "−5.6569" in cell
    assert not re.search(r"(?<![\w.])-\d", cell)  # no ASCII hyphen before a number
    table = result.stdout.split("worked cell", 1)[0]
    assert re.search(r"\s-\d\.\d{4}\s", table) or "−" not in table  # tables keep ASCII


def test_flash_tiles_write_numbers_as_the_trace_tables_do() -> None:
    flash = run_cli("flash", "gptoss_sinks", "--no-color").stdout
    trace = run_cli("trace", "gptoss_sinks", "--no-color", "--stage", "masked").stdout
    for out in (flash, trace):
        assert re.search(r"\s-inf\b", out)  # a table's −∞, as the goldens spell it
        assert re.search(r"\s-\d+\.\d{4}\b", out)  # and its negative numbers
        assert not re.search(r"−\d", out)
