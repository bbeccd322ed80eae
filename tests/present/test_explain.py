"""The explanation layer and the worked cell: English and Chinese, hand-worked numbers.

The worked cell of "The cat sat" is checked against arithmetic done by hand in the comments;
the helpers that take a cell apart are checked, on every bundled example, to add back up to the
trace's own values.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import BUNDLED_PATHS, FIXTURES, Tolerance, run_cli
from numpy.testing import assert_allclose
from rich.cells import cell_len

from attn_cli.core.pipeline import Trace, run
from attn_cli.errors import UsageError
from attn_cli.io.fixture import load_fixture, validate
from attn_cli.present.explain import cell_text, explain_stage
from attn_cli.present.i18n import AXES, LABELS, Lang, default_lang
from attn_cli.present.worked import (
    CellRef,
    dot_terms,
    parse_cell,
    resolve_position,
    softmax_parts,
    weighted_terms,
    worked_cells,
)

SUM_TOL: Tolerance = {"rtol": 1e-12, "atol": 1e-12}  # float64 sums in another order than NumPy's


def trace_of(path: Path) -> Trace:
    return run(load_fixture(path))


# Every masking feature, a given scale, grouped-query heads, a bias and an empty row.
EVERYTHING = {
    "name": "everything",
    "tokens": ["a", "b", "c"],
    "Q": [[[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0]]],
    "K": [[[1, 0], [0, 1], [1, 1]]],
    "V": [[[1, 2], [3, 4], [5, 6]]],
    "heads": 2,
    "kv_heads": 1,
    "scale": 0.5,
    "causal": "lower-right",
    "mask": [[True, True, True], [True, True, True], [False, True, True]],
    "bias": [0, -1, "-inf"],
    "lengths": [3],
}


def everything() -> Trace:
    return run(validate(EVERYTHING, "everything.json"))


def all_traces() -> list[Trace]:
    return [*(trace_of(p) for p in BUNDLED_PATHS), everything()]


# ---------------------------------------------------------------------------------------------
# Language


@pytest.mark.parametrize(
    ("environ", "lang"),
    [
        ({}, "en"),
        ({"LANG": "zh_CN.UTF-8"}, "zh"),
        ({"LANG": "zh_TW.Big5"}, "zh"),
        ({"LANG": "en_US.UTF-8"}, "en"),
        ({"LC_ALL": "zh_CN.UTF-8", "LANG": "en_US.UTF-8"}, "zh"),
        ({"LC_ALL": "C", "LANG": "zh_CN.UTF-8"}, "en"),  # LC_ALL wins
        ({"LC_MESSAGES": "zh_HK.UTF-8"}, "zh"),
        ({"LANG": ""}, "en"),
    ],
)
def test_default_lang_follows_the_locale(environ: dict[str, Any], lang: str) -> None:
    assert default_lang(environ) == lang


def test_both_languages_have_every_label() -> None:
    assert LABELS["en"].keys() == LABELS["zh"].keys()
    for key, text in LABELS["en"].items():
        assert re.findall(r"{\w+}", text) == re.findall(r"{\w+}", LABELS["zh"][key]), key


# Identifiers a Chinese textbook keeps in Latin letters: stage names, fixture keys and values,
# weight and size symbols, key names. Anything else made of two or more Latin letters is English.
ALLOWED = [
    *("X", "Q", "K", "V", "scores", "scaled", "masked", "softmax", "output", "concat"),
    *("projected", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"),
    *("d_model", "d_k", "d_v", "d_out", "seq_q", "seq_k", "heads", "kv_heads"),
    *("max_k", "max", "m_i", "Σ_k", "Σ_d", "Σ_j", "x_j", "x_k"),
    *("scale", "mask", "bias", "lengths", "causal", "true", "false", "Esc"),
    # the configuration panel names torch's and attn's own settings
    *("torch", "SDPA", "nn.Linear", "nn.MultiheadAttention", "is_causal", "True", "attn_mask"),
    *("attn", "KV", "--full", "sink"),
    # RoPE scaling names config.json's keys and the library whose semantics it follows
    *("factor", "transformers", "rope_type"),
    # the modern variants' stages, settings and the models and papers they come from
    *("X_kv", "Q_norm", "K_norm", "Q_rot", "K_rot", "capped", "alibi", "lse", "lse_i"),
    "d_model_kv",
    *("RoPE", "RMSNorm", "ALiBi", "tanh", "eps", "mean", "q_weight", "k_weight", "base", "dims"),
    *("pos", "angle", "cos", "sin", "log", "slope_h", "pos_i", "pos_j", "sinks", "window"),
    *("Gemma", "BLOOM", "slope", "FlashAttention", "scaled_dot_product_attention", "log-sum-exp"),
    *("QK-norm", "Qwen3", "OLMo", "HF", "rotate_half", "Meta", "llama", "Mistral", "gpt-oss"),
    *("Press", "window_size", "pos_q", "pos_k", "softcap", "logit", "d_model_kv", "d_k"),
    *("mask_value", "sliding_window"),  # a fixture key and HF's config field
    *("gate", "gated", "W_G", "b_G", "q_proj", "Qwen3-Next"),  # the output gate
    # multi-head latent attention: its key, stages, weights and transformers' names for them
    *("mla", "DeepSeek", "LoRA", "c_Q", "c_Q_norm", "c_KV", "c_KV_norm", "q_nope", "q_rope"),
    *("k_rope", "K_nope", "q_rope_rot", "k_rope_rot", "q_absorbed", "scores_absorbed"),
    *("output_latent", "output_absorbed", "W_UK", "W_UV", "W_UQ", "W_DQ", "W_DKV", "W_KR"),
    *("kv_lora_rank", "q_lora_rank", "d_rope", "d_nope", "mscale", "q_a_proj", "q_a_layernorm"),
    *("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "query_states", "expand_kv"),
    *("q_norm", "kv_norm", "rope", "x0", "x1", "x2", "x3"),
    *("deepseek_v3", "deepseek_v2", "rope_layout", "pairs"),  # the two layouts' model types
    # differential attention: its key, stages, λ's names and the reference's
    *("diff", "Q_1", "K_1", "Q_2", "K_2", "Q1", "Q2", "K1", "K2", "A1", "A2", "scores_2"),
    *("softmax_2", "lambda", "diff_output", "diff_norm", "diff_scaled", "λ_init", "λ_q1"),
    *("λ_k1", "λ_q2", "λ_k2", "exp", "depth", "subln", "head_dim", "Differential Transformer"),
    *("norm", "Transformer"),
    # linear attention: its keys, stages, the paper's and transformers' names
    *("linear_attention", "gated_deltanet", "Gated DeltaNet", "elu", "phi_Q", "phi_K", "delta"),
    *("implicit_weights", "state", "normaliser", "output_recurrent", "output_chunked", "chunk"),
    *("qkv", "qkv_conv", "beta", "q_l2", "k_l2", "normed", "SiLU", "A_log", "dt_bias", "softplus"),
    *("in_proj_qkvz", "out_proj", "causal_conv1d_fn", "Qwen3NextRMSNormGated", "repeat_interleave"),
    *("use_qk_l2norm_in_kernel", "l2norm", "FLA", "UT", "norm", "diag", "strictly_lower"),
    *("k_heads", "eps", "conv", "conv_dim", "exp", "z_t", "S_t", "q_t", "k_t", "v_t"),
    # attention temperature and clip_qkv: their stages and keys, and torch's clamp
    *("Q_tuned", "floor_scale", "attn_scale", "offset", "Q_clip", "K_clip", "clamp"),
    *("LayerNorm", "StableLM", "Phi", "Q_ln", "K_ln", "var", "q_bias", "k_bias"),  # q/k LayerNorm
    # the norm after RoPE: its stages, HunYuan's module names, Llama 4's, NTK-alpha RoPE
    *("Q_postnorm", "K_postnorm", "query_layernorm", "key_layernorm", "Llama", "L2"),
    *("ntk_alpha", "alpha", "NTK", "q_norm", "k_norm"),
]


def english_left(text: str, tokens: tuple[str, ...] = ()) -> list[str]:
    """Latin words in ``text`` other than the allowed identifiers and the fixture's tokens."""
    for word in sorted([*ALLOWED, *tokens], key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z_]){re.escape(word)}(?![A-Za-z_])", " ", text)
    return re.findall(r"[A-Za-z]{2,}", text)


def explanation_strings(trace: Trace, lang: Lang) -> list[str]:
    texts: list[str] = []
    for stage in trace:
        expl = explain_stage(trace, stage.name, lang)
        texts += [*expl.formula, *expl.inputs, expl.output, *expl.meaning]
        for cell in worked_cells(trace, CellRef(trace.inputs.seq_q - 1, 0)):
            part = cell_text(trace, cell, stage.name, lang)
            if part is not None:
                texts += [part.title, *part.lines, *part.header, *part.footer]
                texts += [c for row in part.rows for c in row]
    return texts


@pytest.mark.parametrize("trace", all_traces(), ids=lambda t: t.inputs.name)
def test_chinese_explanations_have_no_english_left(trace: Trace) -> None:
    tokens = (*trace.query_labels, *trace.key_labels)
    for stage in trace:
        expl = explain_stage(trace, stage.name, "zh")
        assert expl.meaning, stage.name
        assert any("\u4e00" <= c <= "\u9fff" for c in "".join(expl.meaning)), stage.name
    for text in explanation_strings(trace, "zh"):
        assert english_left(text, tokens) == [], text
    for text in [*LABELS["zh"].values(), *AXES["zh"].values()]:
        assert english_left(re.sub(r"{\w+}", " ", text)) == [], text


@pytest.mark.parametrize("trace", all_traces(), ids=lambda t: t.inputs.name)
def test_english_explanations_have_no_chinese(trace: Trace) -> None:
    for text in explanation_strings(trace, "en"):
        assert not re.search(r"[\u3000-\u9fff\uff00-\uffef]", text), text


def test_q_k_v_use_the_source_articles_search_analogy() -> None:
    trace = trace_of(FIXTURES / "the_cat_sat.yaml")
    zh = {n: "".join(explain_stage(trace, n, "zh").meaning) for n in "QKV"}
    en = {n: "".join(explain_stage(trace, n, "en").meaning) for n in "QKV"}
    # the article: Query 我想找什么内容？ Key 你提供了哪些"关键词"？ Value 你具体包含了哪些信息？
    assert "我想找什么内容" in zh["Q"] and "搜索" in zh["Q"]
    assert "关键词" in zh["K"] and "标签" in zh["K"]
    assert "包含了哪些信息" in zh["V"] and "正文" in zh["V"]
    assert "looking for" in en["Q"] and "search" in en["Q"]
    assert "labels" in en["K"] and "tags" in en["K"]
    assert "content" in en["V"]


def test_explanations_say_why_we_scale_and_subtract_the_max() -> None:
    cat = trace_of(FIXTURES / "the_cat_sat.yaml")
    scaled = explain_stage(cat, "scaled", "en")
    assert scaled.formula == ("scaled = scores × 1/√d_k = scores × 1/√2 = scores × 0.7071",)
    assert "√d_k" in scaled.meaning[1] and "scale: 1" in scaled.meaning[2]
    softmax = " ".join(explain_stage(cat, "softmax", "en").meaning)
    assert "unchanged" in softmax and "overflow" in softmax and "sums to 1" in softmax
    zh = " ".join(explain_stage(cat, "softmax", "zh").meaning)
    assert "结果完全不变" in zh and "溢出" in zh and "加起来等于 1" in zh
    # the article's own example sets scale: 1; the explanation says what the default would be
    article = trace_of(FIXTURES / "article_example_2.yaml")
    assert "1/√d_k = 0.7071" in explain_stage(article, "scaled", "en").meaning[0]


def test_masked_explanation_names_every_reason() -> None:
    meaning = " ".join(explain_stage(everything(), "masked", "en").meaning)
    for phrase in ("bottom-right", "mask:", "lengths = [3]", "bias:"):
        assert phrase in meaning
    zh = " ".join(explain_stage(everything(), "masked", "zh").meaning)
    for phrase in ("右下对齐", "遮盖矩阵", "长度", "偏置"):
        assert phrase in zh


def test_shapes_in_and_out_come_from_the_trace() -> None:
    trace = trace_of(FIXTURES / "causal_multihead.yaml")
    expl = explain_stage(trace, "scores", "en")
    assert expl.inputs == ("Q [head=2, query=4, d_k=2]", "K [kv_head=2, key=4, d_k=2]")
    assert expl.output == "scores [head=2, query=4, key=4]"
    zh = explain_stage(trace, "projected", "zh")
    assert zh.inputs == (
        "concat [查询=4, heads*d_v=4]",
        "W_O [heads*d_v=4, d_out=4]",
        "b_O [d_out=4]",
    )


# ---------------------------------------------------------------------------------------------
# The CLI's explanation layer


def test_trace_explain_in_chinese_explains_every_stage() -> None:
    result = run_cli("trace", "--explain", "--lang", "zh", "--format", "plain")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("这一步在做什么") == 8  # X Q K V scores scaled softmax output
    assert "what this step does" not in result.stdout


def test_trace_explain_language_comes_from_the_locale() -> None:
    zh = run_cli("trace", "--explain", "--format", "plain", env={"LANG": "zh_CN.UTF-8"})
    assert zh.exit_code == 0
    assert "这一步在做什么" in zh.stdout
    en = run_cli("trace", "--explain", "--lang", "en", "-f", "plain", env={"LANG": "zh_CN.UTF-8"})
    assert en.exit_code == 0
    assert "what this step does" in en.stdout and "这一步" not in en.stdout


def test_without_explain_the_default_rendering_has_no_explanation() -> None:
    result = run_cli("trace", "--format", "plain", env={"LANG": "zh_CN.UTF-8"})
    assert result.exit_code == 0
    assert "这一步" not in result.stdout and "what this step does" not in result.stdout


def test_tables_stay_aligned_with_wide_characters(tmp_path: Path) -> None:
    fixture = tmp_path / "cn.yaml"
    fixture.write_text(
        "tokens: [猫, 坐在, 垫子上]\n"
        "X: [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]\n"
        "W_Q: [[1, 0], [0, 1], [1, 0], [0, 1]]\n"
        "W_K: [[0, 1], [1, 0], [0, 0], [1, 1]]\n"
        "W_V: [[1, 0], [0, 1], [1, 1], [0, 0]]\n",
        encoding="utf-8",
    )
    width = 72
    result = run_cli(
        "trace",
        str(fixture),
        "--explain",
        "--lang",
        "zh",
        "--cell",
        "猫,坐在",
        "--heatmap",
        "--format",
        "plain",
        "--width",
        str(width),
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= width
    # every boxed line ends exactly at the right border
    for line in lines:
        if line.startswith("│"):
            assert cell_len(line) == width and line.endswith("│"), line
    # each table's header, rule and rows end in the same column (right-justified numbers)
    start = lines.index("scores ─" + "─" * (width - 8))
    table = lines[start + 2 : start + 7]  # header, rule, three rows
    assert table[0].startswith("查询") and table[2].startswith("猫")  # the axis label in Chinese
    assert len({cell_len(line) for line in table}) == 1, table
    # and the columns line up: each number ends where its header ends
    header_ends = [m.end() for m in re.finditer(r"\S+", table[0])]
    for row in table[2:]:
        ends = [cell_len(row[: m.end()]) for m in re.finditer(r"\S+", row)]
        assert ends[1:] == [cell_len(table[0][:e]) for e in header_ends[1:]], row


# ---------------------------------------------------------------------------------------------
# The worked cell, by hand: "The cat sat", query The, key cat
#   Q = X·W_Q = [[2, 0], [0, 4], [2, 2]]    K = X·W_K = [[0, 1], [4, 2], [2, 2]]
#   V = X·W_V = [[2, 1], [0, 2], [2, 2]]
#   scores[The, cat] = 2×4 + 0×2 = 8;  scaled = 8/√2 = 4√2 = 5.656854...
#   row of The, scaled: [0, 4√2, 2√2]; m = 4√2; e^(x − m) = [e^(−4√2), 1, e^(−2√2)]
#   = [0.0034935, 1, 0.0591057]; sum = 1.0625992; softmax[The, cat] = 1/1.0625992 = 0.941089


def test_worked_cell_of_the_cat_sat_by_hand() -> None:
    trace = trace_of(FIXTURES / "the_cat_sat.yaml")
    (cell,) = worked_cells(trace, CellRef(0, 1))
    assert cell.q == (2.0, 0.0) and cell.k == (4.0, 2.0)
    assert cell.products == (8.0, 0.0)
    assert cell.score == 8.0
    r2 = math.sqrt(2)
    assert_allclose(cell.scaled, 4 * r2, rtol=1e-15)
    assert cell.masked is None and cell.bias is None
    assert cell.parts is not None
    assert_allclose(cell.parts.row_max, 4 * r2, rtol=1e-15)
    exps = [math.exp(-4 * r2), 1.0, math.exp(-2 * r2)]
    assert_allclose(cell.parts.exps, exps, rtol=1e-14)
    assert_allclose(cell.parts.total, sum(exps), rtol=1e-14)
    assert_allclose(cell.parts.exps, [0.0034935, 1, 0.0591057], atol=5e-8)  # by calculator
    weights = [e / sum(exps) for e in exps]
    assert_allclose(cell.weights, weights, rtol=1e-14)
    assert_allclose(cell.weights[1], 0.941089, atol=5e-7)
    v = [[2, 1], [0, 2], [2, 2]]
    assert_allclose(
        cell.output, [sum(w * r[c] for w, r in zip(weights, v, strict=True)) for c in (0, 1)]
    )


def test_worked_cell_text_in_the_cli() -> None:
    result = run_cli("trace", "--cell", "The,cat", "--format", "plain", "--lang", "en")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "scores[The, cat] = Q[The]·K[cat] = 2×4 + 0×2 = 8 + 0 = 8" in out
    assert "scaled[The, cat] = scores[The, cat] × 0.7071 = 8 × 0.7071 = 5.6569" in out
    assert "softmax over the row of The: m = the row maximum = 5.6569" in out
    assert re.search(r"cat ◀\s+5\.6569\s+0\s+1\s+0\.9411", out)
    assert re.search(r"The\s+0\s+−5\.6569\s+0\.0035\s+0\.0033", out)  # U+2212, as −∞
    assert "Σ e^(x − m) = 1.0626; softmax[The, cat] = 1 / 1.0626 = 0.9411" in out
    # output[The] = 0.0033×[2, 1] + 0.9411×[0, 2] + 0.0556×[2, 2] = [0.1178, 1.9967]
    # past 76 characters (a panel at 80 columns) a line breaks before its second "="
    assert re.search(
        r"output\[The, 0\] = 0\.0033×2 \+ 0\.9411×0 \+ 0\.0556×2 *│\n"
        r"│ = 0\.0066 \+ 0 \+ 0\.1112 = 0\.1178 ",
        out,
    )
    assert "output[The, 1] = 0.0033×1 + 0.9411×2 + 0.0556×2" in out and "= 1.9967" in out
    by_index = run_cli("trace", "--cell", "0,1", "--format", "plain", "--lang", "en")
    assert by_index.exit_code == 0
    assert by_index.stdout == out


def test_worked_cell_is_shown_per_head_and_marks_masked_keys() -> None:
    result = run_cli(
        "trace", "causal_multihead", "--cell", "like,green", "-f", "plain", "--lang", "en"
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("worked cell: query like, key green (head 0)") == 4
    assert out.count("worked cell: query like, key green (head 1)") == 4
    # output sums over every key: its part names V's rows, not the one key (issue 40)
    assert out.count("worked cell: query like, every value row V (head 0)") == 1
    assert "masked[like, green] = −∞" in out  # causal: "like" may not see "green"
    assert re.search(r"green ◀\s+−∞\s+−∞\s+0\s+0", out)


@pytest.mark.parametrize("path", BUNDLED_PATHS, ids=lambda p: p.stem)
def test_worked_cell_parts_add_up_to_the_trace(path: Path) -> None:
    trace = trace_of(path)
    inp = trace.inputs
    for i in range(inp.seq_q):
        for j in range(inp.seq_k):
            for cell in worked_cells(trace, CellRef(i, j)):
                assert_allclose(math.fsum(dot_terms(cell.q, cell.k)), cell.score, **SUM_TOL)
                assert_allclose(cell.score * cell.scale, cell.scaled, **SUM_TOL)
                if cell.parts is None:
                    assert not any(cell.weights)
                    continue
                ratio = [e / cell.parts.total for e in cell.parts.exps]
                assert_allclose(ratio, cell.weights, **SUM_TOL)
                for c in range(len(cell.output)):
                    total = math.fsum(weighted_terms(cell.weights, cell.values, c))
                    assert_allclose(total, cell.output[c], **SUM_TOL)


def test_softmax_parts_of_a_row_with_masked_keys() -> None:
    parts = softmax_parts([0.0, math.log(3.0), -math.inf])
    assert parts is not None
    assert parts.row_max == math.log(3.0)
    assert_allclose(parts.exps, [1 / 3, 1.0, 0.0], rtol=1e-15)
    assert softmax_parts([-math.inf, -math.inf]) is None


def test_weighted_terms_and_dot_terms_by_hand() -> None:
    assert dot_terms([1, -2, 3], [4, 5, -6]) == (4.0, -10.0, -18.0)
    assert weighted_terms([0.25, 0.75], [[4, 8], [2, 0]], 0) == (1.0, 1.5)
    assert np.isclose(sum(weighted_terms([0.25, 0.75], [[4, 8], [2, 0]], 1)), 2.0)


# ---------------------------------------------------------------------------------------------
# Naming a cell or a focus: tokens, indices, duplicates, commas


@pytest.mark.parametrize(
    ("spec", "labels", "expected"),
    [
        ("The,cat", ("The", "cat", "sat"), CellRef(0, 1)),
        ("2,0", ("The", "cat", "sat"), CellRef(2, 0)),
        ("sat,1", ("The", "cat", "sat"), CellRef(2, 1)),
        ("a,b,c", ("a,b", "c"), CellRef(0, 1)),  # a comma inside a token
        ("c,a,b", ("a,b", "c"), CellRef(1, 0)),
    ],
)
def test_parse_cell(spec: str, labels: tuple[str, ...], expected: CellRef) -> None:
    assert parse_cell(spec, labels, labels) == expected


@pytest.mark.parametrize(
    ("spec", "labels", "message"),
    [
        (
            "the,cat",
            ("the", "cat", "the"),
            "the query token 'the' is ambiguous (at positions "
            "0, 2), expected an index instead, one of 0, 2",
        ),
        ("dog,cat", ("the", "cat"), "no query token or index 'dog'"),
        ("cat", ("the", "cat"), "'cat' has no comma, expected QUERY,KEY"),
        ("0,7", ("the", "cat"), "no key token or index '7'"),
    ],
)
def test_parse_cell_errors(spec: str, labels: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_cell(spec, labels, labels)
    assert message in str(info.value)


def test_cli_cell_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    fixture = tmp_path / "dup.json"
    fixture.write_text(
        '{"tokens": ["the", "cat", "the"], "Q": [[1], [2], [3]], "K": [[1], [2], [3]], '
        '"V": [[1], [2], [3]]}'
    )
    result = run_cli("trace", str(fixture), "--cell", "the,cat")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --cell: the query token 'the' is ambiguous (at positions 0, 2), expected an "
        "index instead, one of 0, 2\n"
    )
    assert run_cli("trace", str(fixture), "--cell", "2,cat").exit_code == 0
    result = run_cli("trace", "--focus", "dog")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: --focus: no query token or index 'dog'")


def test_resolve_position_prefers_a_token_to_an_index() -> None:
    assert resolve_position("1", ("0", "2", "1"), "--focus", "query") == 2
    assert resolve_position("1", ("a", "b"), "--focus", "query") == 1


def test_focus_follows_one_query_through_every_stage() -> None:
    result = run_cli("trace", "--focus", "cat", "--format", "plain", "--lang", "en")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "focus: query cat" in out
    blocks = dict(re.findall(r"^(\w+) ─+\n(.*?)(?=^\w+ ─|\Z)", out, re.M | re.S))
    for stage in ("X", "Q", "scores", "scaled", "softmax", "output"):
        rows = re.findall(r"^(The|cat|sat)\s", blocks[stage], re.M)
        assert rows == ["cat"], stage
    for stage in ("K", "V"):  # every key is part of what the query searches
        assert re.findall(r"^(The|cat|sat)\s", blocks[stage], re.M) == ["The", "cat", "sat"]
    assert re.search(r"^cat\s+4\.0000\s+8\.0000\s+8\.0000$", blocks["scores"], re.M)
