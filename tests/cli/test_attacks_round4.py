"""Attacks of issue 40 (round four): the newer surfaces under hostile values.

`attn rope` and every command that rotates (rope scaling: every numeric key of every kind, fed
0, -1, 2**63, 1e308, 5e-324, NaN, inf, full-width digits, a list, a mapping, a bool), positions
at 2**53, `attn decode`'s overflow check (linear attention, Gated DeltaNet, differential
attention), integer settings of the linear-attention variants, and checkpoint configs whose
values have the wrong type. Each run ends in one ``Error:`` line naming the field and exit 2,
or in a finite result; never a traceback nor a raw RuntimeWarning (pytest turns warnings into
errors here).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_attacks import make_special
from test_attacks_cli import assert_error, assert_fine, attn, in_tmp  # noqa: F401

from attn_cli.io.examples import find_example

ROPE_FIXTURE = "llama31_rope_scaling"
ORIGINAL = "original_max_position_embeddings"
# One valid setting of each kind, every parameter it reads given (llama31_rope_scaling: d_k 16).
KINDS: dict[str, dict[str, Any]] = {
    "linear": {"type": "linear", "factor": 2.0},
    "dynamic": {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096},
    "llama3": {
        "type": "llama3",
        "factor": 8,
        "low_freq_factor": 1,
        "high_freq_factor": 4,
        ORIGINAL: 8192,
    },
    "yarn": {
        "type": "yarn",
        "factor": 4.0,
        ORIGINAL: 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1,
        "mscale_all_dim": 1,
        "attention_factor": 1.0,
        "max_position_embeddings": 16384,
    },
    "longrope": {
        "type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
        ORIGINAL: 4096,
        "factor": 4.0,
        "max_position_embeddings": 16384,
        "attention_factor": 1.0,
    },
}
BAD: dict[str, Any] = {
    "zero": 0,
    "negative": -1,
    "2**63": 2**63,
    "1e308": 1e308,
    "5e-324": 5e-324,
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "fullwidth": "１２",
    "list": [1, 2],
    "mapping": {"a": 1},
    "bool": True,
    "huge-string": "9" * 10_000,
}
# (key, bad value) pairs that are valid settings: mscale 0 turns DeepSeek's ratio off, and a
# tiny mscale leaves the attention factor at 1 + tiny.
ACCEPTED = {
    ("mscale", "zero"),
    ("mscale_all_dim", "zero"),
    ("mscale", "5e-324"),
    ("mscale_all_dim", "5e-324"),
}


def rope_fixture(scaling: dict[str, Any], **rope: Any) -> Path:
    """The bundled llama31_rope_scaling with its rope replaced, written to ./f.yaml."""
    example = find_example(ROPE_FIXTURE)
    assert example is not None
    with open(example, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    data["rope"] = {"base": 500000, **rope, "scaling": scaling}
    path = Path("f.yaml")
    with path.open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, allow_unicode=True)
    return path


def scaling_attacks() -> list[Any]:
    return [
        pytest.param(kind, key, bad, id=f"{kind}-{key}-{bad}")
        for kind, params in KINDS.items()
        for key in params
        if key != "type"
        for bad in BAD
    ]


@pytest.mark.parametrize(("kind", "key", "bad"), scaling_attacks())
def test_every_rope_scaling_key_fed_hostile_values(kind: str, key: str, bad: str) -> None:
    """attn rope (and, for a sample, trace) refuses the value in one line naming the key, or
    shows finite numbers when the value is a valid setting."""
    scaling = dict(KINDS[kind])
    lists = isinstance(scaling[key], list)
    scaling[key] = [BAD[bad]] * 8 if lists and not isinstance(BAD[bad], list | dict) else BAD[bad]
    path = str(rope_fixture(scaling))
    run = attn("rope", path, "-f", "json")
    if (key, bad) in ACCEPTED:
        assert_fine(run)
        table = json.loads(run.stdout)
        assert all(math.isfinite(x) for x in _numbers(table)), "a number is not finite"
        return
    assert_error(run)
    assert f"rope.scaling.{key}" in run.stderr, run.stderr
    if bad in ("1e308", "5e-324", "nan"):  # the same one check stands before every rotation
        trace = attn("trace", path, "-f", "json")
        assert_error(trace)
        assert trace.stderr == run.stderr


def _numbers(value: Any) -> list[float]:
    """Every number in a JSON document."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if isinstance(value, int | float) and not isinstance(value, bool) else []


@pytest.mark.parametrize(
    ("scaling", "field"),
    [
        ({**KINDS["longrope"], ORIGINAL: 1}, ORIGINAL),  # ln(1) = 0 divides the factor
        ({**KINDS["yarn"], "beta_fast": 1e308}, "beta_fast"),  # was: math domain error
        ({**KINDS["yarn"], "beta_slow": 5e-324}, "beta_slow"),  # was: inf to an integer
        ({**KINDS["llama3"], "high_freq_factor": 1, "low_freq_factor": 4}, "high_freq_factor"),
    ],
    ids=["longrope-original-1", "yarn-beta-fast-1e308", "yarn-beta-slow-tiny", "llama3-bands"],
)
def test_rope_scaling_formulas_never_divide_by_zero(scaling: dict[str, Any], field: str) -> None:
    for command in ("rope", "trace", "decode", "flash"):
        run = attn(command, str(rope_fixture(scaling)))
        assert_error(run)
        assert f"rope.scaling.{field}" in run.stderr


def test_yarn_needs_a_base_above_one() -> None:
    """yarn's correction range divides by ln(base): base 1 is one line, not a ZeroDivisionError."""
    run = attn("rope", str(rope_fixture(KINDS["yarn"], base=1)))
    assert_error(run)
    assert "rope.scaling" in run.stderr and "base" in run.stderr


@pytest.mark.parametrize(
    ("rope", "length"),
    [({"base": 1e308}, None), ({"base": 5e-324}, None), ({}, "9007199254740992")],
    ids=["base-1e308", "base-5e-324", "dynamic-length-2**53"],
)
def test_frequencies_checked_where_made(rope: dict[str, Any], length: str | None) -> None:
    """A setting within every key's range whose frequencies still leave float64 (a dynamic base
    grown over 2**53 positions) is the one ComputeError of ``frequencies``, or finite output."""
    scaling = {"type": "dynamic", "factor": 1e6, "max_position_embeddings": 1}
    path = str(rope_fixture(scaling, **rope))
    run = attn("rope", path, "-f", "json", *(("--length", length) if length else ()))
    if run.exit_code == 0:
        assert all(math.isfinite(x) for x in _numbers(json.loads(run.stdout)))
    else:
        assert_error(run)
        assert "rope" in run.stderr


@pytest.mark.parametrize(
    ("option", "value", "code"),
    [
        ("-p", "9007199254740992", 2),  # 2**53: its length would be 2**53 + 1
        ("-p", "9007199254740991", 0),  # 2**53 - 1, the last whole position
        ("--length", "9007199254740993", 2),
        ("--length", "9007199254740992", 0),
    ],
)
def test_rope_positions_at_two_to_the_53(option: str, value: str, code: int) -> None:
    run = attn("rope", ROPE_FIXTURE, option, value, "-f", "json")
    if code:
        assert_error(run)
        assert ("--position" if option == "-p" else "--length") in run.stderr
        return
    assert_fine(run)
    table = json.loads(run.stdout)
    assert all(math.isfinite(x) for x in _numbers(table))


# ---------------------------------------------------------------------------------------------
# attn decode: the pipeline's overflow check on what decoding computes beside the trace


def bundled(name: str) -> dict[str, Any]:
    example = find_example(name)
    assert example is not None
    with open(example, encoding="utf-8") as f:
        data: dict[str, Any] = yaml.safe_load(f)
    return data


def times(rows: Any, factor: float) -> Any:
    return [times(r, factor) for r in rows] if isinstance(rows, list) else rows * factor


def overflowing(case: str) -> Path:
    """A bundled fixture changed so that attention overflows float64 (issue 40's cases)."""
    if case == "linear-X":
        data = bundled("linear_attention")
        data["X"] = times(data["X"], 1e200)
    elif case == "deltanet-W_v":
        data = bundled("gated_deltanet")
        data["gated_deltanet"]["W_v"] = times(data["gated_deltanet"]["W_v"], 1e200)
    else:  # lambda = exp(lambda_q1 · lambda_k1) − ... = exp(1800): inf
        data = bundled("diff_transformer")
        data["diff"]["lambda_q1"] = data["diff"]["lambda_k1"] = [30, 30]
    path = Path(f"{case}.yaml")
    with path.open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    return path


@pytest.mark.parametrize(
    ("case", "stage"),
    [("linear-X", "output["), ("deltanet-W_v", "normed["), ("diff-lambda", "diff_scaled[")],
)
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_decode_refuses_overflow_as_trace_does(case: str, stage: str, fmt: str) -> None:
    """Was: exit 0 with NaN or inf in every step (and raw RuntimeWarnings for diff)."""
    run = attn("decode", str(overflowing(case)), "-f", fmt)
    assert_error(run)
    assert stage in run.stderr and "overflow" in run.stderr, run.stderr
    assert run.stdout == ""
    trace = attn("trace", str(overflowing(case)), "-f", "json")
    assert_error(trace)


@pytest.mark.parametrize(
    ("name", "key", "value", "said"),
    [
        ("mask_sentinel", "scale", 1e308, "scaled[prefill at token 0 'a']"),  # decode's own stage
        ("causal_multihead", "scale", 1e308, "output["),  # the reference rows: NaN
        ("gemma2_softcap", "softcap", 5e-324, ""),  # cap·tanh(x/cap) = ±cap: finite, no warning
        ("gemma2_softcap", "X", [[1e200] * 8] * 5, "scores[prefill at token 0 'The']"),  # capped
    ],
)
def test_a_decode_step_that_overflows_is_one_line(
    name: str, key: str, value: float, said: str
) -> None:
    data = bundled(name)
    data[key] = value
    path = Path("f.yaml")
    with path.open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    run = attn("decode", str(path), "-f", "json")
    if not said:
        assert_fine(run)
        assert all(math.isfinite(x) for x in _numbers(json.loads(run.stdout)))
        table = attn("decode", str(path))  # the view asks for each step's tables again
        assert_fine(table)
        return
    assert_error(run)
    assert said in run.stderr and "overflow" in run.stderr


# ---------------------------------------------------------------------------------------------
# attn import: a config value of the wrong type is one line naming the key (io/families/config.py
# Config's typed accessors), and a block that overflows is refused before the next norm

REFERENCE = Path(__file__).parent.parent / "reference"


def checkpoint_with(folder: Path, changes: dict[tuple[str, ...], Any]) -> Path:
    """A copy of a tiny reference checkpoint (its files linked) with config.json changed."""
    pytest.importorskip("safetensors", reason="attn import needs the models extra")
    pytest.importorskip("tokenizers", reason="attn import needs the models extra")
    out = Path(folder.name)
    out.mkdir()
    for f in folder.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    for path, value in changes.items():
        where = config
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


CONFIG_TYPES = [
    ("families/gemma3", ("text_config", "rope_parameters"), [1, 2], "text_config.rope_parameters"),
    ("families/gemma3", ("text_config", "rope_parameters"), "x", "text_config.rope_parameters"),
    (
        "families/gemma3",
        ("text_config", "hidden_activation"),
        ["gelu"],
        "text_config.hidden_activation",
    ),
    ("forward/gemma3_text", ("rope_parameters",), 1e308, "rope_parameters"),
    ("forward/deepseek_v3", ("hidden_act",), {"a": 1}, "hidden_act"),
    ("forward/deepseek_v3", ("rope_scaling",), [1, 2], "rope_scaling"),
    ("families/roberta", ("position_embedding_type",), ["absolute"], "position_embedding_type"),
]


BLOCK_KEYS = ("hidden_act", "hidden_activation")  # read by the MLP only


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "key", "value", "field"), CONFIG_TYPES)
@pytest.mark.parametrize("layer", ["0", "1"])
def test_a_config_value_of_the_wrong_type_is_one_line(
    folder: str, key: tuple[str, ...], value: Any, field: str, layer: str
) -> None:
    """Was: gemma3's rope_parameters [1, 2] a TypeError at --layer 1, silently accepted at 0."""
    ckpt = checkpoint_with(REFERENCE / folder, {key: value})
    run = attn("import", str(ckpt), "--text", "The cat sat", "--layer", layer, "-o", "out.npz")
    if layer == "0" and key[-1] in BLOCK_KEYS:  # layer 0's X is the embedding: no block is run
        assert_fine(run)
        return
    assert_error(run)
    assert f"{field}: got" in run.stderr, run.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("folder", "key"),
    [
        ("families/qwen3_next", "num_experts"),
        ("forward/deepseek_v3", "n_routed_experts"),
        ("forward/deepseek_v3", "num_experts_per_tok"),
    ],
)
def test_a_count_of_experts_of_2_to_the_63_is_one_line(folder: str, key: str) -> None:
    """Was: a list of 2**63 experts' tensor names built until the machine ran out of memory."""
    ckpt = checkpoint_with(REFERENCE / folder, {(key,): 2**63})
    run = attn("import", str(ckpt), "--text", "The cat sat", "--layer", "2", "-o", "out.npz")
    if run.exit_code == 2 and "num_hidden_layers" in run.stderr:  # a 2-layer checkpoint
        run = attn("import", str(ckpt), "--text", "The cat sat", "--layer", "1", "-o", "out.npz")
    assert_error(run)
    assert f"{key}: got 9223372036854775808, expected a whole number from " in run.stderr
    assert "to 65,536" in run.stderr


@pytest.mark.slow
def test_a_huge_routed_scaling_factor_gives_finite_numbers_or_one_line() -> None:
    """Was: raw RuntimeWarnings (an inf power of two in the norm's row scale) before the error:
    the residual stream of 1e308 × the experts is finite, and normalised exactly."""
    ckpt = checkpoint_with(REFERENCE / "forward/deepseek_v3", {("routed_scaling_factor",): 1e308})
    run = attn("import", str(ckpt), "--text", "The cat sat", "--layer", "2", "-o", "out.npz")
    if run.exit_code == 2:
        assert_error(run)
        return
    assert_fine(run)
    import numpy as np

    with np.load("out.npz") as npz:
        assert all(
            np.isfinite(npz[name]).all() for name in npz.files if npz[name].dtype.kind == "f"
        )


# ---------------------------------------------------------------------------------------------
# Pages: a token's label is cut as the terminal cuts it; its full text stays in the data

LONG = 10**6  # characters of one token: a 617 MB trace page, 128 MB decode page before


def long_token_fixture(name: str, chars: int = LONG) -> tuple[Path, str]:
    data = bundled(name)
    token = "x" * (chars - 1) + "<"  # markup in it: the cut label is escaped too
    data["tokens"][1] = token
    path = Path(f"long_{name}.yaml")
    with path.open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, width=2 * chars)
    return path, token


def page_data(page: str) -> Any:
    """The page's JSON (its one ``<script type="application/json">``)."""
    start = page.index('<script type="application/json"')
    start = page.index(">", start) + 1
    return json.loads(page[start : page.index("</script>", start)])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("trace", "causal_multihead"),
        ("decode", "causal_multihead"),
        ("flash", "causal_multihead"),
        ("decode", "diff_transformer"),
        ("decode", "gated_deltanet"),
    ],
)
def test_a_page_of_a_huge_token_is_bounded(command: str, name: str) -> None:
    path, token = long_token_fixture(name)
    run = attn(command, str(path), "-f", "html", "-o", "page.html", limit=60)
    assert run.exit_code == 0, run.stderr
    page = Path("page.html").read_text(encoding="utf-8")
    size = path.stat().st_size
    assert len(page.encode()) < min(16 * size, 32 << 20), (len(page), size)
    assert 1 <= page.count(token[:-1]) <= 2  # the data's tokens (and key_tokens), no label
    cut = "x" * 39 + "…"  # present/text.py LABEL_CHARS = 40
    assert cut in page
    data = page_data(page)
    tokens = data["trace"]["tokens"] if command == "trace" else data["tokens"]
    assert tokens[1] == token  # the full text, once, for a script to read


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["markdown", "latex"])
def test_a_document_of_a_huge_token_is_bounded(fmt: str) -> None:
    """Markdown and LaTeX repeated the token in every table too (27 MB, 27x the fixture)."""
    path, _ = long_token_fixture("causal_multihead")
    run = attn("trace", str(path), "-f", fmt, "-o", "doc.txt", limit=60)
    assert run.exit_code == 0, run.stderr
    text = Path("doc.txt").read_text(encoding="utf-8")
    assert len(text) < 64_000 and "x" * 39 in text and "x" * 41 not in text  # LaTeX: \\dots{}


@pytest.mark.slow
def test_a_model_page_with_a_huge_tokenizer_token_is_bounded() -> None:
    """A 60,000-character tokenizer token: one model-view click unzipped a 47 MB layer page."""
    import base64
    import gzip

    token = "x" * 60_000
    ckpt = checkpoint_with(REFERENCE / "forward/llama", {})
    (ckpt / "tokenizer.json").unlink()
    tok = json.loads((REFERENCE / "forward/llama/tokenizer.json").read_text(encoding="utf-8"))
    tok["model"]["vocab"][token] = 12  # below vocab_size 16
    (ckpt / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    run = attn(
        "import",
        str(ckpt),
        "--text",
        f"a {token} b",
        "--layer",
        "all",
        "-f",
        "html",
        "-o",
        "model.html",
        limit=60,
    )
    assert run.exit_code == 0, run.stderr
    page = Path("model.html").read_text(encoding="utf-8")
    assert page.count(token) == 1 and len(page) < 2 << 20  # the data's tokens
    for packed, _ in page_data(page)["pages"].values():
        layer = gzip.decompress(base64.b64decode(packed)).decode("utf-8")
        assert len(layer) < 2 << 20 and layer.count(token) <= 2, len(layer)


@pytest.mark.parametrize(
    ("name", "where", "value", "code", "said"),
    [
        # rows of 1e196: rounding moves them by ~1e180, which an absolute 1e-12 called a failure
        ("linear_attention", ("W_V", 0, 0), 1e200, 0, ""),
        # the chunked form's triangular solve met inf: was a LinAlgError traceback
        ("gated_deltanet", ("X", 0, 0), -1e308, 2, "triangular system is singular"),
    ],
)
def test_decode_of_huge_inputs_is_checked_to_their_scale(
    name: str, where: tuple[Any, ...], value: float, code: int, said: str
) -> None:
    data = bundled(name)
    at = data
    for key in where[:-1]:
        at = at[key]
    at[where[-1]] = value
    path = Path("f.yaml")
    with path.open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    run = attn("decode", str(path), "-f", "json")
    if code:
        assert_error(run)
        assert said in run.stderr
        return
    assert_fine(run)
    doc = json.loads(run.stdout)
    assert doc["max_abs_diff"] <= 1e-12 * 1e200  # within rounding of numbers that size


def test_flash_json_of_huge_scores_is_strict_json() -> None:
    """MLA with W_KR[0][0] = 1e200: the lse check's tolerance was inf, written as Infinity."""
    data = bundled("deepseek_mla")
    data["mla"]["W_KR"][0][0] = 1e200
    path = Path("f.yaml")
    with path.open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    run = attn("flash", str(path), "-f", "json")
    if run.exit_code == 2:
        assert_error(run)
        return
    assert_fine(run)

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON")

    doc = json.loads(run.stdout, parse_constant=refuse)
    assert all(math.isfinite(c["tolerance"]) for c in doc["checks"])


# ---------------------------------------------------------------------------------------------
# The newer commands' inputs and outputs: special files in, unwritable places out

NEWER = {
    "rope": ["rope", "llama31_rope_scaling", "-f", "json"],
    "decode-html": ["decode", "causal_multihead", "-f", "html"],
    "decode-state": ["decode", "gated_deltanet", "-f", "json"],
    "flash-html": ["flash", "the_cat_sat", "-f", "html"],
    "rope-table": ["rope", "llama31_rope_scaling"],
}


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "symlink_loop", "missing"])
@pytest.mark.parametrize("command", ["rope", "decode", "flash"])
def test_a_special_file_as_the_newer_commands_fixture(kind: str, command: str) -> None:
    path = Path("fx.yaml")
    make_special(kind, path)
    run = attn(command, str(path), limit=5.0)
    assert_error(run)
    assert "fx.yaml" in run.stderr


@pytest.mark.parametrize("where", ["folder", "/dev/full", "missing/out.txt"])
@pytest.mark.parametrize("name", list(NEWER))
def test_the_newer_outputs_into_an_unwritable_place(name: str, where: str) -> None:
    if where == "folder":
        Path("folder").mkdir()
    if where == "/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    run = attn(*NEWER[name], "-o", where)
    assert_error(run)
    assert "--output" in run.stderr or "output" in run.stderr
    assert sorted(p.name for p in Path().iterdir()) == (["folder"] if where == "folder" else [])


@pytest.mark.parametrize("bad", ["list", "mapping", "bool", "fullwidth", "2**63", "nan"])
def test_the_rope_scaling_type_of_another_type_is_one_line(bad: str) -> None:
    """Was: a TypeError (unhashable) when type was a list or a mapping."""
    run = attn("rope", str(rope_fixture({**KINDS["linear"], "type": BAD[bad]})))
    assert_error(run)
    assert "rope.scaling.type" in run.stderr


@pytest.mark.slow
def test_a_huge_residual_multiplier_is_one_line_without_warnings() -> None:
    """Granite's residual_multiplier 1e308: a raw overflow RuntimeWarning before the check."""
    ckpt = checkpoint_with(REFERENCE / "forward/granite", {("residual_multiplier",): 1e308})
    run = attn("import", str(ckpt), "--text", "The cat sat", "--layer", "1", "-o", "out.npz")
    if run.exit_code == 0:
        assert_fine(run)
        return
    assert_error(run)
    assert "residual stream leaving layer 0 is not finite" in run.stderr
