"""attn import under hostile checkpoints and inputs: one ``Error:`` line, exit 2, bounded time.

Each test names the item of issue 22 it covers: overflow-safe norms and non-finite values,
JSON nesting (the one 64-level rule), windows longer than any sequence, tokenizer.json regexes
that backtrack or panic, budgets taken from the file's claims (``--max-memory``), special files
named for what they are, and a ``--text`` that is not UTF-8.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="attn import needs safetensors: pip install '.[models]'")
pytest.importorskip("tokenizers", reason="attn import needs tokenizers: pip install '.[models]'")

from conftest import limit_memory, run_attn, run_cli, run_timed
from safetensors.numpy import save_file
from test_checkpoint import WORDS, _error, _layer_norm, _randn, _rms_norm, _small_llama, _write

from attn_cli.io import tokens
from attn_cli.io.checkpoint import import_layer
from attn_cli.io.jsonfmt import MAX_DEPTH
from attn_cli.io.yamlfmt import MAX_YAML_DEPTH

rng = np.random.default_rng(22)


def _llama(tmp_path: Path, **cfg: Any) -> Path:
    folder, config, tensors = _small_llama(tmp_path, **cfg)
    return _write(folder, config, tensors)


def _one_line(stderr: str) -> str:
    """The one ``Error:`` line of a run's standard error (and nothing else there)."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


def _refused(*args: str, limit: float = 10.0) -> str:
    """``attn import ARGS -o out.npz`` in this process: exit 2, one line, within ``limit`` s."""
    run = run_timed("import", *args, "-o", str(Path(args[0]).parent / "out.npz"), limit=limit)
    assert run.exception is None, run.exception
    assert run.exit_code == 2, run.stdout + run.stderr
    return _one_line(run.stderr)


# ---------------------------------------------------------------------------------------------
# 1) The pre-attention norm: no overflow, nothing non-finite


def _hidden_rows(tmp_path: Path, rows: np.ndarray[Any, Any]) -> Path:
    np.save(tmp_path / "h.npy", rows)
    return tmp_path / "h.npy"


def test_rms_norm_of_rows_of_1e200_and_1e_200_matches_the_float64_reference(
    tmp_path: Path,
) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    _write(folder, cfg, t)
    r = rng.standard_normal((3, 8))
    scales = np.array([[1e200], [1.0], [1e-200]])
    hidden = _hidden_rows(tmp_path, r * scales)
    X = import_layer(folder, layer=0, hidden=hidden).fixture["X"]
    w, eps = t["model.layers.0.input_layernorm.weight"], 1e-6
    # RMSNorm(c r) = r / sqrt(mean(r^2) + eps / c^2): for c = 1e200 eps / c^2 is 1e-406, nothing
    expected = np.vstack(
        [
            _rms_norm(r[:1], w, 0.0),
            _rms_norm(r[1:2], w, eps),
            _rms_norm(r[2:] * 1e-200, w, eps),  # Python floats: the squares underflow, eps remains
        ]
    )
    np.testing.assert_allclose(X, expected, rtol=1e-12, atol=0)


def _gpt2(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    C = 4
    t = {
        "wte.weight": _randn(len(WORDS), C),
        "wpe.weight": _randn(8, C),
        "h.0.attn.c_attn.weight": _randn(C, 3 * C),
        "h.0.attn.c_attn.bias": _randn(3 * C),
        "h.0.attn.c_proj.weight": _randn(C, C),
        "h.0.attn.c_proj.bias": _randn(C),
        "h.0.ln_1.weight": _randn(C),
        "h.0.ln_1.bias": _randn(C),
    }
    cfg = {
        "model_type": "gpt2",
        "n_embd": C,
        "n_head": 1,
        "n_layer": 1,
        "n_positions": 8,
        "vocab_size": len(WORDS),
    }
    return _write(tmp_path / "g", cfg, t), t


def test_layer_norm_of_huge_rows_matches_the_float64_reference(tmp_path: Path) -> None:
    folder, t = _gpt2(tmp_path)
    r = rng.standard_normal((2, 4))
    hidden = _hidden_rows(tmp_path, r * np.array([[1e300], [-1e-300]]))
    X = import_layer(folder, layer=0, hidden=hidden).fixture["X"]
    w, b, eps = t["h.0.ln_1.weight"], t["h.0.ln_1.bias"], 1e-5
    expected = np.vstack(
        [
            _layer_norm(r[:1], w, b, 0.0),  # LayerNorm(c r) = LayerNorm(r) with eps / c^2 = 0
            _layer_norm(r[1:] * -1e-300, w, b, eps),
        ]
    )
    np.testing.assert_allclose(X, expected, rtol=1e-12, atol=1e-300)


def test_an_inf_embedding_row_is_refused(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    t["model.embed_tokens.weight"][2, 3] = np.inf  # "cat"
    msg = _error(_write(folder, cfg, t), text="the cat")
    assert "model.safetensors: model.embed_tokens.weight: row 2 holds inf or NaN" in msg
    assert "expected finite embeddings" in msg


def test_a_nan_weight_is_refused(tmp_path: Path) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    t["model.layers.0.input_layernorm.weight"][0] = np.nan
    msg = _error(_write(folder, cfg, t))
    assert "model.layers.0.input_layernorm.weight: holds inf or NaN, expected finite" in msg


# ---------------------------------------------------------------------------------------------
# 2) JSON nesting: the fixture reader's 64 levels, for config.json, the index and the header


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_one_nesting_rule_for_json_and_yaml() -> None:
    assert MAX_DEPTH == MAX_YAML_DEPTH == 64


@pytest.mark.parametrize("levels", [MAX_DEPTH, 100_000])
def test_deep_config_json(tmp_path: Path, levels: int) -> None:
    folder = _llama(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    text = json.dumps(config)[:-1] + ', "x": ' + "[" * levels + "]" * levels + "}"
    (folder / "config.json").write_text(text)  # the object is one level more
    msg = _error(folder)
    assert "config.json: nesting is too deep (more than 64 levels)" in msg


def test_config_json_nested_64_levels_is_read(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    # under a key that cannot change the attention: an unknown key is refused (test_import_arch)
    deep = {"task_specific_params": _nested(MAX_DEPTH - 1)}
    (folder / "config.json").write_text(json.dumps(config | deep))
    assert import_layer(folder, layer=0, text="the cat").family == "llama"


def test_deep_shard_index(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    (folder / "model.safetensors").rename(folder / "s1.safetensors")
    deep = "[" * 200_000 + "]" * 200_000
    (folder / "model.safetensors.index.json").write_text(f'{{"metadata": {deep}}}')
    assert "index.json: nesting is too deep (more than 64 levels)" in _error(folder)


def test_deep_safetensors_header(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    raw = b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    msg = _error(folder)
    assert "model.safetensors: header: nesting is too deep (more than 64 levels)" in msg


# ---------------------------------------------------------------------------------------------
# 3) A window longer than any sequence: plain causal attention


@pytest.mark.parametrize("window", [2**63, 2**64, 10**400], ids=["2^63", "2^64", "10^400"])
def test_a_window_beyond_int64_is_plain_causal(tmp_path: Path, window: int) -> None:
    folder = _llama(tmp_path, model_type="mistral", sliding_window=window)
    imported = import_layer(folder, layer=0, text="the cat")
    assert "window" not in imported.fixture and imported.fixture["causal"] is True
    assert any("longer than any sequence, plain causal" in n for n in imported.notes)


def test_a_window_that_fits_int64_is_kept(tmp_path: Path) -> None:
    folder = _llama(tmp_path, model_type="mistral", sliding_window=2**63 - 1)
    assert import_layer(folder, layer=0, text="the cat").fixture["window"] == 2**63 - 1


def test_a_huge_window_imports_through_the_cli(tmp_path: Path) -> None:
    folder = _llama(tmp_path, model_type="mistral", sliding_window=2**64)
    out = tmp_path / "w.npz"
    result = run_cli("import", str(folder), "--text", "the cat", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    with np.load(out) as z:
        assert "window" not in z.files and z["causal"].item() is True


# ---------------------------------------------------------------------------------------------
# 4) tokenizer.json regexes: a panic and a slow backtrack, each one line in bounded time


def _regex_tokenizer(folder: Path, pattern: str) -> None:
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": pattern},
        "behavior": "Isolated",
        "invert": False,
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))


@pytest.mark.slow
def test_a_regex_that_makes_tokenizers_panic(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = _llama(tmp_path)
    _regex_tokenizer(folder, r"(a+)+$")  # Oniguruma's retry limit: a Rust panic, a BaseException
    line = _refused(str(folder), "--text", "a" * 40 + "b")
    assert "tokenizer.json: its tokenizer fails on the text (Onig: Regex search error" in line
    assert "panicked" not in capfd.readouterr().err  # Rust's panic hook printed nothing


@pytest.mark.slow
def test_a_backtracking_regex_is_cut_off_by_the_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _llama(tmp_path)
    _regex_tokenizer(folder, r"\s+\b")  # quadratic: 8,000 spaces take about a second
    monkeypatch.setattr(tokens, "TOKENIZE_SECONDS", 0.2)
    start = time.perf_counter()
    msg = _error(folder, text=" " * 8000)
    assert time.perf_counter() - start < 0.8
    assert "tokenizer.json: tokenizing the text takes more than 0.2 s" in msg


def test_a_text_over_the_length_budget_is_refused_before_tokenizing(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    _regex_tokenizer(folder, r"\s+\b")
    line = _refused(str(folder), "--text", " " * (tokens.MAX_TEXT_CHARS + 1), limit=2.0)
    assert line == "Error: --text: is 65,537 characters long, expected at most 65,536 characters"


def test_the_tokenizer_guard_lets_ctrl_c_through(tmp_path: Path) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokens.tokenizer_call(tmp_path, interrupted, "fails", "works")


def test_tokens_are_those_of_encode(tmp_path: Path) -> None:
    """The bounded path (encode_batch in a worker) tokenises as Tokenizer.encode does."""
    from tokenizers import Tokenizer

    folder = _llama(tmp_path)
    text = "the dog ran on a mat"
    expected = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).tokens
    assert import_layer(folder, layer=0, text=text).fixture["tokens"] == expected


# ---------------------------------------------------------------------------------------------
# 5) Budgets from the file's claims, and --max-memory


@pytest.mark.subprocess
def test_a_billion_layers_build_no_list(tmp_path: Path) -> None:
    folder = _llama(tmp_path, model_type="gemma2", num_hidden_layers=10**9, head_dim=4)
    out = tmp_path / "g.npz"
    done = run_attn(
        "import", str(folder), "--text", "the cat", "-o", str(out), preexec_fn=limit_memory(1 << 30)
    )
    assert done.returncode == 0, done.stderr
    assert "sliding window 4096 on layer 0 (layer_types" in done.stderr


def _sparse_llama(tmp_path: Path, C: int) -> Path:
    """A llama layer of hidden size C, one head of C dims, F32, in a sparse file: a header that
    claims about 16 C^2 bytes the disk does not hold."""
    folder = tmp_path / "big"
    folder.mkdir()
    shapes = {
        "model.layers.0.self_attn.q_proj.weight": [C, C],
        "model.layers.0.self_attn.k_proj.weight": [C, C],
        "model.layers.0.self_attn.v_proj.weight": [C, C],
        "model.layers.0.self_attn.o_proj.weight": [C, C],
        "model.layers.0.input_layernorm.weight": [C],
    }
    header, at = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + size]}
        at += size
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + at)
    cfg = {
        "model_type": "llama",
        "hidden_size": C,
        "num_attention_heads": 1,
        "num_hidden_layers": 1,
        "vocab_size": 4,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    np.save(tmp_path / "h.npy", np.ones((2, C)))
    return folder


@pytest.mark.subprocess
def test_a_sparse_8_gib_layer_is_refused_before_it_is_read(tmp_path: Path) -> None:
    folder = _sparse_llama(tmp_path, 23_170)  # q_proj, k_proj, v_proj, o_proj: 2 GiB each
    start = time.perf_counter()
    done = run_attn(
        "import",
        str(folder),
        "--hidden",
        str(tmp_path / "h.npy"),
        "-o",
        str(tmp_path / "o.npz"),
        "--max-memory",
        "8G",
        preexec_fn=limit_memory(1 << 30),
    )
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "model.safetensors: model.layers.0.self_attn.q_proj.weight: importing layer 0" in line
    assert "would need about 10.0 GiB of memory (the largest tensor, [23170, 23170] of F32)" in line
    assert line.endswith("expected at most 8.0 GiB (see --max-memory)")
    assert time.perf_counter() - start < 10


def test_max_memory_of_import(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    out = str(tmp_path / "o.npz")
    line = _refused(str(folder), "--text", "the cat", "--max-memory", "1K")
    assert "importing layer 0 would need about" in line and "expected at most 1.0 KiB" in line
    assert line.endswith("(see --max-memory)")
    result = run_cli("import", str(folder), "--text", "the cat", "-o", out, "--max-memory", "1M")
    assert result.exit_code == 0, result.stderr
    bad = run_cli(
        "import", str(folder), "--text", "the cat", "-o", out, "--force", "--max-memory", "x"
    )
    assert bad.exit_code == 2 and "--max-memory: got 'x'" in bad.stderr


def test_long_hidden_states_are_named_as_x(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    hidden = _hidden_rows(tmp_path, rng.standard_normal((20_000, 8)))
    msg = _error(folder, text=None, hidden=hidden, max_memory=1 << 20)
    assert msg.startswith(f"{hidden}: importing layer 0 would need about 4.9 MiB of memory")
    assert "(X holds 20,000 x 8 numbers: rows x hidden)" in msg and "at most 1.0 MiB" in msg


# ---------------------------------------------------------------------------------------------
# 6) Special files are named for what they are, and never opened to block


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)


SPECIAL = {
    "fifo": (_fifo, "is a named pipe (FIFO), not a regular file"),
    "folder": (_folder, "is a directory"),
    "loop": (_loop, "the path is a loop of symbolic links"),
}


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("config.json", "expected the model's config.json"),
        ("model.safetensors", "expected a .safetensors file"),
        ("tokenizer.json", "expected the checkpoint's tokenizer.json"),
    ],
)
def test_a_special_file_in_the_folder(tmp_path: Path, kind: str, name: str, expected: str) -> None:
    if kind == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    folder = _llama(tmp_path)
    make, what = SPECIAL[kind]
    make(folder / name)
    line = _refused(str(folder), "--text", "the cat", limit=5.0)
    assert line.startswith(f"Error: {folder / name}: {what}, {expected}"), line


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_shard(tmp_path: Path, kind: str) -> None:
    folder, cfg, t = _small_llama(tmp_path)
    folder.mkdir()
    save_file(t, str(folder / "s1.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    index = {"weight_map": dict.fromkeys(t, "s1.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    make, what = SPECIAL[kind]
    make(folder / "s1.safetensors")
    np.save(tmp_path / "h.npy", np.ones((2, 8)))
    line = _refused(str(folder), "--hidden", str(tmp_path / "h.npy"), limit=5.0)
    assert f"s1.safetensors: model.layers.0.self_attn.q_proj.weight: {what}" in line
    assert line.endswith("expected the safetensors shard holding it")


def test_special_checkpoints_and_configs(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    _fifo(tmp_path / "pipe")
    line = _refused(str(tmp_path / "pipe"), "--text", "the cat", limit=5.0)
    assert line == (
        f"Error: {tmp_path / 'pipe'}: is a named pipe (FIFO), not a regular file, expected a "
        "model folder or .safetensors file, or a bundled one: tiny_gpt2, tiny_llama"
    )
    line = _refused(str(folder), "--text", "the cat", "--config", os.devnull, limit=5.0)
    assert "/dev/null: is a character device, not a regular file, expected the model's" in line
    (folder / "model.safetensors").rename(folder / "weights")
    _fifo(folder / "model.safetensors.index.json")
    line = _refused(str(folder), "--text", "the cat", limit=5.0)
    assert (
        "index.json: is a named pipe (FIFO), not a regular file, expected the shard index" in line
    )


# ---------------------------------------------------------------------------------------------
# 7) A --text that is not UTF-8 is the text's fault, not tokenizer.json's


def test_a_text_of_surrogate_escaped_bytes(tmp_path: Path) -> None:
    folder = _llama(tmp_path)
    text = b"the \xff cat".decode("utf-8", "surrogateescape")  # as argv gives such bytes
    line = _refused(str(folder), "--text", text)
    assert line == (
        "Error: --text: holds the byte 0xff at character 4, which is not UTF-8, "
        "expected text in UTF-8"
    )
    assert "holds U+D800 at character 0" in _error(folder, text="\ud800")
