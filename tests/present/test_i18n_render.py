"""``--lang zh`` everywhere: the configuration panel, stage titles and formulas, table axis
labels, slice titles, the heatmap's column label and legend, in the terminal, Markdown and
LaTeX. English stays byte-identical (tests/golden checks the plain rendering)."""

from __future__ import annotations

import re
from dataclasses import replace
from io import StringIO

import pytest
from conftest import BUNDLED_PATHS, FIXTURES
from rich.console import Console, RenderableType

from attn_cli.core.pipeline import Trace, run
from attn_cli.io.fixture import load_fixture
from attn_cli.present.export_text import to_latex, to_markdown
from attn_cli.present.i18n import Lang, formula_text
from attn_cli.present.options import RenderOptions
from attn_cli.present.render import render_header, render_heatmap, render_trace
from attn_cli.present.text import header_lines
from attn_cli.present.variants import texts

# Latin words a Chinese classroom keeps: stage and weight names, fixture keys, library names.
KEPT = {
    *("softmax", "scores", "scaled", "masked", "output", "concat", "projected", "capped"),
    *("alibi", "lse", "softcap", "tanh", "RoPE", "mean", "eps", "log", "exp", "sink", "bias"),
    "clamp",  # clip_qkv's clamp(Q, −c, c), torch's name as tanh is
    *("scale", "mask", "lengths", "true", "torch", "SDPA", "nn", "Linear", "attn"),
    *("MultiheadAttention", "is_causal", "True", "attn_mask", "KV", "half", "interleaved"),
    *("keys", "weight", "model"),  # inside Σ_keys, q_weight, d_model
    *("factor", "transformers"),  # RoPE scaling: config.json's key, the library it follows
    # the header's variants lines name the models, libraries and papers a convention comes from
    *("HF", "Mistral", "FlashAttention", "Meta", "llama", "Gemma", "Qwen", "OLMo", "Press"),
    *("QK", "norm", "RMSNorm", "ALiBi", "sinks", "logit", "gpt", "oss", "base", "dims"),
    *("gate", "gated", "Next"),  # Qwen3-Next's output gate and its stages
    *("mla", "DeepSeek", "kv_lora_rank", "lora", "rank", "rope", "nope", "mscale", "LoRA", "KV"),
    *("diff", "init", "Differential", "Transformer", "lambda"),  # differential attention
    # linear attention: the paper's φ, Gated DeltaNet's name and stages
    *("elu", "Gated", "DeltaNet", "beta", "qkv", "conv", "SiLU", "softplus", "diag", "state"),
    *("normaliser", "normed", "UT"),
    *("LayerNorm", "StableLM", "Phi", "var"),  # q/k LayerNorm: the norm, its models, var(x)
    *("alpha", "NTK", "Llama", "L2"),  # ntk_alpha's key and name; Llama 4's L2 norm
}


def plain(renderable: RenderableType, width: int = 100) -> str:
    console = Console(file=StringIO(), width=width, color_system=None, highlight=False)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def english_words(text: str, tokens: tuple[str, ...] = ()) -> list[str]:
    """Latin words of two or more letters not kept in Chinese and not the fixture's tokens."""
    for token in sorted(tokens, key=len, reverse=True):
        text = text.replace(token, " ")
    words = re.findall(r"[A-Za-z][A-Za-z_]+", text)
    return [w for w in words if "_" not in w and w not in KEPT]


def trace_of(name: str) -> Trace:
    return run(load_fixture(FIXTURES / f"{name}.yaml"))


# ---------------------------------------------------------------------------------------------
# The configuration panel


@pytest.mark.parametrize("path", BUNDLED_PATHS, ids=lambda p: p.stem)
def test_header_panel_is_chinese(path: object) -> None:
    trace = run(load_fixture(path))  # type: ignore[arg-type]
    for key, value in header_lines(trace, "zh"):
        assert english_words(key) == [], key
        if key not in ("简介", "来源"):  # the fixture's own description and file name
            assert english_words(value) == [], value


def test_header_panel_in_both_languages() -> None:
    trace = trace_of("causal_multihead")
    zh = plain(render_header(trace, "zh"))
    for word in ("来源", "模式", "形状", "头数", "缩放", "遮盖", "投影", "因果遮盖（左上对齐）"):
        assert word in zh, word
    en = plain(render_header(trace))
    assert re.search(
        r"│ mode +projection: Q = X·W_Q \(X @ W; a torch nn\.Linear weight is Wᵀ\)", en
    )
    assert "│ masking  causal upper-left: query i sees keys j ≤ i (torch is_causal=True)" in en


def test_untitled_trace_title() -> None:
    """A fixture without a name is titled by the label, in the language asked for."""
    named = trace_of("pytorch_snippet")
    untitled = replace(named, inputs=replace(named.inputs, name=""))
    titles: tuple[tuple[Lang, str], ...] = (("en", "attention trace"), ("zh", "注意力计算过程"))
    for lang, title in titles:
        assert plain(render_header(named, lang=lang)).find(title) < 0
        assert title in plain(render_header(untitled, lang=lang))


# ---------------------------------------------------------------------------------------------
# Stages: titles, formulas, axis labels


def test_stage_titles_and_axis_labels_are_chinese() -> None:
    out = plain(render_trace(trace_of("the_cat_sat"), RenderOptions(lang="zh")))
    assert "X（输入的嵌入向量）   [词=3, d_model=4]" in out
    assert "Q = X·W_Q   [头=1, 查询=3, d_k=2]" in out
    assert "softmax = softmax(scaled)（沿键方向）" in out
    assert re.search(r"^词\s+0\s+1\s+2\s+3$", out, re.M)  # the row axis above the tokens
    assert re.search(r"^查询\s+The\s+cat\s+sat$", out, re.M)
    assert "(the input embeddings)" not in out and "query" not in out and "seq" not in out


def test_slice_titles_and_legend_are_chinese() -> None:
    out = plain(render_trace(trace_of("grouped_query"), RenderOptions(lang="zh", heatmap=True)))
    assert re.search(r"^头 3\s*$", out, re.M)
    assert "[键值头=2, 键=3, d_k=2]" in out
    assert "低 " in out and " 高 " in out and "行内最大值" in out
    body = out.split("╰")[1]  # after the panel, whose "about" is the fixture's own text
    assert not re.search(r"\b(kv )?head \d", body)  # heads*d_v stays: a size, as d_k


def test_heatmap_column_label_is_chinese() -> None:
    out = plain(render_heatmap(trace_of("causal_multihead"), RenderOptions(lang="zh")), 120)
    assert re.search(r"^查询\s+I\s+like\s+green\s+tea\s+行和", out, re.M)
    assert "query" not in out


@pytest.mark.parametrize("path", BUNDLED_PATHS, ids=lambda p: p.stem)
def test_every_formula_has_a_chinese_wording(path: object) -> None:
    trace = run(load_fixture(path))  # type: ignore[arg-type]
    texts(trace.inputs)  # as every view does first: the variants' wordings register on load
    for stage in trace:
        assert english_words(formula_text("zh", stage.formula)) == [], stage.formula
        assert formula_text("en", stage.formula) == stage.formula


def test_more_tables_note_is_chinese() -> None:
    from attn_cli.present.render import _more_tables

    assert _more_tables("en", 20) == "… 14 more tables (… --full shows all)"
    assert _more_tables("zh", 20) == "… 另有 14 个表（… 加 --full 显示全部）"


# ---------------------------------------------------------------------------------------------
# Markdown and LaTeX


def test_markdown_in_chinese() -> None:
    text = to_markdown(trace_of("padding_batch"), RenderOptions(lang="zh", heatmap=True))
    assert "*由 attn " in text and "- **来源**:" in text and "- **遮盖**:" in text
    assert "| 查询 |" in text and "**批 1 · 头 0**" in text
    assert "**粗体** = 行内最大值" in text
    assert "Traced by" not in text and "| query |" not in text and "batch 1" not in text


def test_latex_in_chinese() -> None:
    text = to_latex(trace_of("causal_multihead"), RenderOptions(lang="zh"))
    assert r"\item[来源]" in text and "由 attn" in text and "头 1" in text
    assert r"查询 & I & like & green & tea \\ \hline" in text
    assert "Traced by" not in text and r"\item[source]" not in text


def test_step_mode_first_page_header_is_chinese() -> None:
    from attn_cli.present.render import render_step_page

    page = plain(render_step_page(trace_of("the_cat_sat"), 0, RenderOptions(lang="zh")))
    assert "第 1 步" in page and "来源" in page and "模式" in page
    assert "source" not in page
