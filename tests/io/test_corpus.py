"""The bad-input corpus: every hostile or broken fixture ends in one clear line and exit code 2.

Each file in tests/corpus is named for what it tries; ``attn trace FILE`` must end with exit
code 2, one ``Error:`` line naming the file and the problem (the fragment in CORPUS), no
traceback, nothing on stdout and no file created anywhere it looks. A few inputs cannot be
committed as files (a FIFO, a device, a 600 MB file, a 200,000-token fixture): they are made in
the test's temporary directory.

Most entries run in this process, from an empty working directory. The entries in IN_A_PROCESS
run the real ``python -m attn_cli`` with a timeout and an address-space limit: those whose
regression would hang (a FIFO, an endless device), exhaust memory (alias bombs, traces and files
too big), overflow the stack (deep nesting) or run the input's code: in the test process, any of
these would take the whole test session down with it instead of failing one test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import CORPUS_DIR, clean_env, limit_memory, run_attn, run_cli

TIMEOUT = 20  # seconds; the slowest case takes about 1
MEMORY_LIMIT = 1 << 30  # bytes of address space: NumPy imports and runs well within it

# file -> a fragment of the one-line message that names its problem
CORPUS: dict[str, str] = {
    # YAML tags construct nothing: refused, never executed
    "yaml_python_object_apply.yaml": "line 2 column 4: the YAML tag !!python/object/apply:os.sys",
    "yaml_python_object_new.yaml": "the YAML tag !!python/object/new:subprocess.Popen is not",
    "yaml_python_name.yaml": "the YAML tag !!python/name:os.system is not allowed",
    "yaml_python_module.yaml": "the YAML tag !!python/module:os is not allowed",
    "yaml_python_tuple_key.yaml": "line 2 column 1: the YAML tag !!python/tuple is not allowed",
    "yaml_custom_tag.yaml": "line 2 column 4: the YAML tag !weights is not allowed",
    # YAML aliases: sized before anything is built
    "billion_laughs.yaml": "20 values written into 11,111,111,120), expected at most 1,000,000",
    "billion_laughs_inside_q.yaml": "the document expands to too many values",
    "alias_expands_to_huge_matrix.yaml": "aliases turn 1,007 values written into 49,000,007",
    "yaml_recursive_alias.yaml": "line 2: an alias refers to a list or mapping that contains it",
    "yaml_undefined_alias.yaml": "line 2 column 4: invalid YAML (found undefined alias)",
    "trace_too_big_for_memory.yaml": "22.4 GiB of memory (3 score stages each hold 1,000,000,000",
    # YAML syntax and structure
    "yaml_two_documents.yaml": "expected a single document in the stream, but found another",
    "yaml_tab_indentation.yaml": "line 2 column 1: invalid YAML",
    "yaml_unclosed_bracket.yaml": "did not find expected ',' or ']'",
    "yaml_deep_flow_nesting.yaml": "exceeded maximum nesting depth",
    "yaml_deep_mapping_nesting.yaml": "nesting is too deep (more than 64 levels)",
    "yaml_duplicate_key.yaml": "causal: duplicate key (line 5), expected each key once",
    "yaml_duplicate_nested_key.yaml": "softmax: duplicate key (line 6)",
    "yaml_complex_key.yaml": "found unhashable key",
    "yaml_control_character.yaml": "line 4 column 12: invalid YAML (the character 0x0007 is not",
    "yaml_escape_sequence_raw.yaml": "line 4 column 13: invalid YAML (the character 0x001b is not",
    "yaml_top_level_list.yaml": "top level is a list, expected a mapping of fixture keys",
    "yaml_top_level_scalar.yaml": "top level is the string 'just some text'",
    "yaml_comments_only.yaml": "the file is empty",
    "yaml_null_document.yaml": "top level is null",
    # YAML values that are not what they look like
    "yaml_set_as_tokens.yaml": "tokens: got a set (!!set), expected a list of strings",
    "yaml_date_as_token.yaml": "tokens[0]: got the date 2020-01-01 (YAML reads unquoted dates as",
    "yaml_booleans_as_tokens.yaml": "tokens[0]: got the boolean true, expected a string (quote it",
    "yaml_binary_as_name.yaml": "name: got 5 bytes of binary data (!!binary), expected a string",
    "yaml_timestamp_as_scale.yaml": "scale: got the timestamp 2001-12-14T21:59:43.100000-05:00",
    "yaml_integer_5000_digits.yaml": "line 4: an integer with 5000 digits, expected at most 300",
    "yaml_hex_beyond_float64.yaml": "Q[0][0]: is an integer beyond the range of float64",
    "yaml_inf_in_weights.yaml": "W_Q[0][0]: is inf (infinite, or beyond float64), expected a",
    "yaml_nan_in_keys.yaml": "K[1][1]: is nan (not a number), expected a finite number",
    "yaml_1e400.yaml": "Q[0][0]: is inf",
    "yaml_null_in_matrix.yaml": "Q[0][1]: got null, expected a number",
    "yaml_unknown_key_typo.yaml": "causual: unknown key (did you mean 'causal'?)",
    "yaml_scale_negative.yaml": "scale: is -0.5, expected a finite number > 0",
    # encodings and bytes
    "utf16.json": "the file is UTF-16 encoded, expected UTF-8 text",
    "utf16_without_bom.json": "the file looks UTF-16 encoded",
    "utf32.json": "the file is UTF-32 encoded",
    "nul_bytes.json": "the file is binary (it holds NUL bytes, the first at offset 70)",
    "binary_garbage.json": "byte 0x80 at offset 0 is not UTF-8",
    "latin1_name.yaml": "byte 0xe9 at offset 9 is not UTF-8",
    "bom_then_invalid_json.json": "line 1 column 24: invalid JSON",  # the BOM itself is fine
    "bom_only.yaml": "the file is empty",
    "empty.json": "the file is empty, expected a JSON or YAML mapping of fixture keys",
    "whitespace_only.json": "the file is empty",
    # JSON: literals, numbers, duplicates, syntax
    "json_nan_literal.json": "Q[0][0]: got the JSON literal NaN, expected a number",
    "json_infinity_literal.json": "Q[1][1]: got the JSON literal Infinity",
    "json_negative_infinity_in_bias.json": "bias[0][1]: got the JSON literal -Infinity, expected a",
    "json_1e400.json": "Q[0][0]: got the number 1e400, beyond the range of float64",
    "json_scale_1e400.json": "scale: got the number 1e400, beyond the range of float64",
    "json_5000_digit_integer.json": "an integer with 5000 digits, expected at most 300 digits",
    "json_duplicate_key.json": "Q: duplicate key, expected each key once",
    "json_duplicate_nested_key.json": "softmax: duplicate key",
    "json_trailing_comma.json": "line 1 column 70: invalid JSON",
    "json_single_quotes.json": "line 1 column 2: invalid JSON (Expecting property name enclosed in",
    "json_comment.json": "line 2 column 3: invalid JSON",
    "json_truncated.json": "invalid JSON (Expecting ',' delimiter)",
    "json_deep_nesting.json": "nesting is too deep",
    "json_lists_17_deep.json": "Q: lists nested more than 16 deep, expected at most 4 axes",
    "json_top_level_array.json": "top level is a list",
    "json_top_level_string.json": "top level is the string 'Q, K and V'",
    "json_lone_surrogate_name.json": "name: holds a lone surrogate '\\ud800'",
    "json_lone_surrogate_token.json": "tokens[1]: holds a lone surrogate '\\udfff'",
    # JSON: values of the wrong kind, shapes that do not fit
    "json_bool_in_matrix.json": "Q[0][1]: got the boolean true, expected a number",
    "json_string_number.json": "Q[1][1]: got the string '1', expected a number",
    "json_null_in_matrix.json": "K[0][1]: got null, expected a number",
    "json_object_as_matrix.json": "Q: got a mapping, expected shape [seq, heads*d]",
    "ragged_rows.json": "X[1]: row has 2 entries, expected 3 like X[0] (rows must all be the",
    "ragged_batch.json": "Q[1]: row has 1 entries, expected 2 like Q[0]",
    "json_empty_matrix.json": "Q: empty list, expected a non-empty list",
    "json_empty_row.json": "Q[0]: empty list",
    "json_number_where_row.json": "Q[1]: got the number 7, expected a list like Q[0]",
    "json_five_axes.json": "Q: has 5 axes (shape [1, 1, 1, 1, 1])",
    "json_scale_zero.json": "scale: is 0, expected a finite number > 0",
    "json_heads_do_not_divide.json": "Q: has 3 columns, not divisible by heads = 2",
    "json_kv_heads_do_not_divide.json": "kv_heads: is 3, which does not divide heads = 4",
    "json_heads_zero.json": "heads: is 0, expected a whole number >= 1",
    "json_heads_huge.json": "Q: has 2 columns, not divisible by heads = 9999",
    "json_both_modes.json": "Q: both modes at once (X, W_Q, W_K, W_V and Q, K, V)",
    "json_no_inputs.json": "no inputs, expected X with W_Q, W_K, W_V (projection mode) or Q, K, V",
    "json_projection_missing_w_v.json": "W_V: missing, expected X, W_Q, W_K and W_V together",
    "json_mismatched_d_model.json": "W_Q: has 2 rows, expected d_model = 3 rows (columns of X)",
    "json_mask_value_2.json": "mask[0][1]: got the number 2, expected true/false or 1/0",
    "json_mask_does_not_broadcast.json": "mask: has shape [3], which does not broadcast",
    "json_bias_plus_inf.json": "bias[0][1]: got the string '+inf'",
    "json_lengths_beyond_seq.json": "lengths[0]: is 3, expected a number of valid keys between",
    "json_lengths_boolean.json": "lengths[0]: got the boolean true",
    "json_causal_misspelt.json": "causal: got the string 'upper_left', expected false, true,",
    "json_expected_unknown_stage.json": "expected.sofmax: unknown stage (did you mean 'softmax'?)",
    "json_tokens_wrong_count.json": "tokens: has 3 tokens, expected 2 = seq_q",
    "json_tokens_numbers.json": "tokens[0]: got the number 1, expected a string",
    "json_name_not_string.json": "name: got a list, expected a string",
    "json_integer_key_like.json": ": '': unknown key",
    "json_key_with_markup.json": ": [bold red]X[/bold red]: unknown key",  # printed as text
    "json_key_with_escape.json": "'\\x1b]8;;http://evil.example\\x07click\\x1b]8;;\\x07'",
    # finite inputs whose products overflow float64: refused, naming stage and position
    "overflow_in_scores.json": "scores[head 0, query 0 'big', key 0 'big']: is inf (float64",
    "overflow_in_projection.json": "Q[query 0, feature 0]: is inf (float64 overflow)",
    "overflow_in_output_projection.json": "projected[query 0 'a', d_out 0]: is inf (float64",
}


def _fifo(tmp: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp / "named_pipe.yaml"
    os.mkfifo(path)  # nobody ever writes to it: reading it would hang
    return path


def _device(tmp: Path) -> Path:
    path = Path("/dev/zero")  # stat says 0 bytes, reading never ends
    if not path.exists():
        pytest.skip("no /dev/zero here")
    return path


def _sparse_600_mb(tmp: Path) -> Path:
    path = tmp / "huge.json"
    with path.open("wb") as f:
        f.truncate(600 * 1024 * 1024)  # sparse: takes no disk space
    return path


def _long_sequence(tmp: Path) -> Path:
    path = tmp / "200000_tokens.json"
    fixture = {"X": [[0.5]] * 200_000, "W_Q": [[1]], "W_K": [[1]], "W_V": [[1]]}
    path.write_text(json.dumps(fixture, separators=(",", ":")), encoding="utf-8")
    return path


def _symlink_loop(tmp: Path) -> Path:
    path = tmp / "loop.yaml"
    try:
        path.symlink_to(path)
    except OSError:
        pytest.skip("cannot make symlinks here")
    return path


# name -> (make the path in a temporary folder, the fragment)
MADE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a_directory": (
        lambda tmp: tmp,
        "is a directory, expected a .json, .yaml or .yml fixture file",
    ),
    "a_missing_file": (
        lambda tmp: tmp / "nope.yaml",
        "no such file, expected a .json, .yaml or .yml fixture file",
    ),
    "a_path_through_a_file": (
        lambda tmp: Path(__file__) / "x.yaml",
        "no such file (a part of the path is not a folder)",
    ),
    "a_fifo": (_fifo, "is a named pipe (FIFO), not a regular file"),
    "dev_zero": (_device, "is a character device, not a regular file"),
    "a_600_mb_file": (
        _sparse_600_mb,
        "file is 629,145,600 bytes, expected at most 536,870,912 bytes",
    ),
    "a_200000_token_sequence": (
        _long_sequence,
        "3 score stages each hold 40,000,000,000 numbers: batch 1 x heads 1 x seq_q 200000",
    ),
    "a_symlink_loop": (_symlink_loop, "the path is a loop of symbolic links"),
}


# name -> why it needs a process of its own (everything else runs in-process)
IN_A_PROCESS: dict[str, str] = {
    "a_fifo": "reading it would block forever",
    "dev_zero": "reading it never ends",
    "a_600_mb_file": "reading it whole would take 600 MB",
    "a_200000_token_sequence": "tracing it would take 894 GiB",
    "trace_too_big_for_memory.yaml": "tracing it would take 22.4 GiB",
    "billion_laughs.yaml": "building it would take 11 billion values",
    "billion_laughs_inside_q.yaml": "building it would exhaust memory",
    "alias_expands_to_huge_matrix.yaml": "building it would take 49 million values",
    "yaml_recursive_alias.yaml": "following it never ends",
    "yaml_deep_flow_nesting.yaml": "parsing it recursively would overflow the stack",
    "yaml_deep_mapping_nesting.yaml": "parsing it recursively would overflow the stack",
    "json_deep_nesting.json": "parsing it recursively would overflow the stack",
    "yaml_python_object_apply.yaml": "constructing it would run a shell command",
    "yaml_python_object_new.yaml": "constructing it would start a process",
}


class Outcome(NamedTuple):
    """What a run of ``attn trace PATH`` left: exit code, standard output, standard error."""

    code: int
    stdout: str
    stderr: str


def trace(path: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Outcome:
    """``attn trace PATH`` from ``cwd``: in a process of its own when IN_A_PROCESS says so."""
    if name in IN_A_PROCESS:
        done = run_attn(
            "trace",
            str(path),
            cwd=cwd,
            env=clean_env(COLUMNS="100"),
            timeout=TIMEOUT,
            preexec_fn=limit_memory(MEMORY_LIMIT),
        )
        return Outcome(done.returncode, done.stdout, done.stderr)
    monkeypatch.chdir(cwd)
    result = run_cli("trace", str(path))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # shows its traceback, as the process's stderr would
    return Outcome(result.exit_code, result.stdout, result.stderr)


def assert_one_clean_error(outcome: Outcome, path: Path, fragment: str) -> None:
    assert outcome.code == 2, (outcome.code, outcome.stderr)
    assert outcome.stdout == ""
    assert "Traceback" not in outcome.stderr
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr
    assert lines[0].startswith(f"Error: {path}: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert "\x1b" not in outcome.stderr  # control characters from the input arrive escaped


def cases(names: list[str]) -> list[object]:
    """Test parameters, with the subprocess mark on those that run in a process."""
    return [
        pytest.param(name, marks=pytest.mark.subprocess) if name in IN_A_PROCESS else name
        for name in sorted(names)
    ]


def test_corpus_table_lists_every_file() -> None:
    files = {p.name for p in CORPUS_DIR.iterdir()}
    assert files == set(CORPUS)
    assert len(files) >= 60
    for path in CORPUS_DIR.iterdir():
        assert path.stat().st_size < 16 * 1024, path.name  # small on disk, billion laughs too
    assert set(IN_A_PROCESS) <= set(CORPUS) | set(MADE)


@pytest.mark.parametrize("name", cases(list(CORPUS)))
def test_corpus_file_is_refused_cleanly(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = sorted(p.name for p in CORPUS_DIR.iterdir())
    path = CORPUS_DIR / name
    outcome = trace(path, cwd, monkeypatch, name)
    assert_one_clean_error(outcome, path, CORPUS[name])
    assert list(cwd.iterdir()) == []  # e.g. no "pwned" from yaml_python_object_apply
    assert sorted(p.name for p in CORPUS_DIR.iterdir()) == before  # no temporary beside it


@pytest.mark.parametrize("name", cases(list(MADE)))
def test_special_path_is_refused_cleanly(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, fragment = MADE[name]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    made = tmp_path / "made"
    made.mkdir()
    path = make(made)
    before = sorted(p.name for p in made.iterdir())
    outcome = trace(path, cwd, monkeypatch, name)
    assert_one_clean_error(outcome, path, fragment)
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in made.iterdir()) == before
