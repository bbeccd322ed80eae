"""The explanations of every quantity ``attn decode`` shows (en and zh), with each step's shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_cli.present.i18n import Lang, label
from attn_cli.present.variants import view_asides, view_inputs, view_notes

if TYPE_CHECKING:
    from attn_cli.check.runs import DecodeRun
    from attn_cli.core.decode import DecodeStep
    from attn_cli.present.explain_registry import Explanation


_EXPLAIN: dict[str, dict[Lang, tuple[str, str]]] = {  # key -> lang -> (formula, meaning)
    "Q": {
        "en": (
            "q = Q[token] (projected as in attn trace)",
            "Only the new token's query is computed at this step: one row per head. The "
            "queries of earlier tokens are never needed again, so they are not kept.",
        ),
        "zh": (
            "q = Q[当前词]（与 attn trace 中的投影相同）",
            "这一步只计算新词的查询，每个头一行。之前各词的查询以后再也用不到，所以不保存。",
        ),
    },
    "Q_rot": {
        "en": (
            "q_rot = RoPE(q, position of the token)",
            "The query is rotated at its own position, now. Because each key was rotated "
            "at its own position when it entered the cache, q_rot·k_rot depends only on the "
            "distance between the two: the cached keys must never be rotated again.",
        ),
        "zh": (
            "q_rot = RoPE(q, 当前词的位置)",
            "查询在它自己的位置上旋转。每个键在进入缓存时已按自己的位置旋转过，所以 "
            "q_rot·k_rot 只取决于两者的距离：缓存中的键绝不能再旋转一次。",
        ),
    },
    "K_cache": {
        "en": (
            "K_cache[slot] = k_rot of the token held there (rotated once, on entry)",
            "The keys of every token the query may still see, one row per slot, per key/"
            "value head (kv_heads, not heads: grouped-query heads share them). Each row "
            "was written once, when its token arrived; nothing is recomputed.",
        ),
        "zh": (
            "K_cache[槽] = 该槽中那个词的 k_rot（进入缓存时旋转一次）",
            "查询仍能看到的每个词的键，每个槽一行，按键值头存放（是 kv_heads 不是 heads："
            "分组查询的多个头共用它们）。每一行只在那个词到来时写入一次，不再重新计算。",
        ),
    },
    "V_cache": {
        "en": (
            "V_cache[slot] = v of the token held there",
            "The values, slot for slot beside the keys: what the weights will average.",
        ),
        "zh": ("V_cache[槽] = 该槽中那个词的 v", "值与键逐槽对应：权重最终要对它们求加权平均。"),
    },
    "scores": {
        "en": (
            "scores = q · K_cacheᵀ (one row: the cache's slots)",
            "One dot product per cached key: the same numbers as the row of this token in "
            "the full scores matrix, in slot order instead of position order.",
        ),
        "zh": (
            "scores = q · K_cacheᵀ（一行：对应缓存的各个槽）",
            "对每个缓存中的键做一次点积：与完整 scores 矩阵中这个词的那一行相同，"
            "只是按槽的顺序排列，而不是按位置。",
        ),
    },
    "scaled": {
        "en": (
            "scaled = scores × scale",
            "As in the full computation: scale = 1/√d_k unless the fixture sets it.",
        ),
        "zh": ("scaled = scores × scale", "与完整计算相同：除非配置文件另行给出，scale = 1/√d_k。"),
    },
    "masked": {
        "en": (
            "masked = scaled (+ bias), −∞ at empty slots and outside the window",
            "No future key is in the cache, so causality needs no mask here. Only an empty "
            "slot, a key that fell out of the window, or the fixture's own mask and bias "
            "change anything.",
        ),
        "zh": (
            "masked = scaled（+ bias），空槽和窗口之外为 −∞",
            "缓存里没有未来的键，所以这里不需要因果遮盖。只有空槽、滑出窗口的键，"
            "或者配置文件自己的 mask 和 bias 才会起作用。",
        ),
    },
    "softmax": {
        "en": (
            "softmax = exp(masked − m) / Σ exp(masked − m) over the slots",
            "The weights over the cached tokens.",
        ),
        "zh": ("softmax = exp(masked − m) / Σ exp(masked − m)，沿各个槽", "对缓存中各词的权重。"),
    },
    "output": {
        "en": (
            "output = softmax · V_cache",
            "The new token's attention output for each head: the weighted average of the "
            "cached values. It must equal row t of the full computation.",
        ),
        "zh": (
            "output = softmax · V_cache",
            "新词在每个头上的注意力输出：缓存中各值的加权平均。它必须等于完整计算的第 t 行。",
        ),
    },
    "check": {
        "en": (
            "max |output − the full attention's row of this token| ≤ 1e-12",
            "The decode loop and the full computation are the same math in a different "
            "order: in float64 they agree to the last few bits. The full row is plain "
            "softmax attention over every key the token may see, computed a few rows at a "
            "time with no cache (as attn trace computes its output). A larger difference "
            "is a bug (a re-rotated key, a wrong slot, a wrong head), and attn stops with "
            "an error.",
        ),
        "zh": (
            "max |output − 完整注意力中该词的那一行| ≤ 1e-12",
            "解码循环和完整计算是同一套数学，只是顺序不同：在 float64 下只差最后几位。"
            "完整的那一行是对该词能看到的所有键做普通 softmax 注意力，每次算几行，不用缓存"
            "（与 attn trace 计算 output 相同）。"
            "更大的差别就是程序错误（键被重复旋转、槽位写错、头对应错），attn 会报错退出。",
        ),
    },
    "cost": {
        "en": (
            "bytes per token per layer = kv_heads × (d_k + d_v) × itemsize",
            "Every generated token adds its key and value to the cache of every layer. "
            "Grouped-query attention (fewer kv_heads than heads) and multi-query attention "
            "(one kv head) shrink this; real models store bf16 (2 bytes), here float64 (8).",
        ),
        "zh": (
            "每层每个词的字节数 = kv_heads × (d_k + d_v) × 每个数的字节数",
            "每生成一个词，都要把它的键和值加入每一层的缓存。分组查询注意力（kv_heads "
            "少于 heads）和多查询注意力（只有一个键值头）能减小这个开销；"
            "真实模型存 bf16（2 字节），这里是 float64（8 字节）。",
        ),
    },
    "block_table": {
        "en": (
            "page = block_table[i // block_size], slot = i mod block_size",
            "PagedAttention (vLLM) keeps the cache in fixed-size pages taken from one pool, "
            "as an operating system keeps memory in pages: a sequence owns a list of pages, "
            "its block table, and grows one page at a time, so no cache is reserved for the "
            "longest sequence in advance. Token i goes to logical block i // block_size; the "
            "table says which physical page holds that block, and the slot in the page is "
            "i mod block_size, never the token's global index.",
        ),
        "zh": (
            "页 = 块表[i // 每页词数]，槽 = i mod 每页词数",
            "PagedAttention（vLLM）把缓存存放在从同一个页池中取出的固定大小的页里，"
            "就像操作系统按页管理内存：每个序列拥有一串页，即它的块表，"
            "每次增长一页，不必预先为最长的序列保留整块缓存。第 i 个词进入逻辑块 "
            "i // 每页词数；块表给出存放这个块的物理页，页内的槽是 i mod 每页词数，"
            "而不是这个词在整个序列中的下标。",
        ),
    },
    "gather": {
        "en": (
            "K_cache = pool[block_table[b]] for each live block b, in order",
            "Each step reads the keys and values through the block table, page after page "
            "in logical order: the same rows as a contiguous cache, with the last page's "
            "empty slots read as zeros and hidden (−∞) like an empty slot of any cache. "
            "The scores, softmax and output are then exactly those of the contiguous "
            "cache: paging moves where the numbers live, not the math.",
        ),
        "zh": (
            "K_cache = 按顺序对每个仍在使用的块 b 取 页池[块表[b]]",
            "每一步都通过块表读取键和值，按逻辑顺序一页接一页：与连续缓存的各行相同，"
            "最后一页的空槽读作零并被遮盖（−∞），与任何缓存的空槽一样。之后的 scores、"
            "softmax 和 output 与连续缓存完全相同：分页改变的是数存放的位置，不是数学。",
        ),
    },
    "pool": {
        "en": (
            "pool bytes = pages × block_size × bytes per token slot",
            "A contiguous cache needs one slot per token it keeps; a pool of pages needs "
            "whole pages, so at most block_size − 1 slots of the last page are wasted, "
            "while a server that reserved a contiguous cache for the longest possible "
            "sequence would waste far more. Smaller pages waste less but make the block "
            "table longer. With a sliding window, pages the window has passed go back to "
            "the pool for other blocks.",
        ),
        "zh": (
            "页池字节数 = 页数 × 每页词数 × 每个词槽的字节数",
            "连续缓存为保留的每个词各用一个槽；页池只能整页分配，所以最多浪费最后一页的 "
            "每页词数 − 1 个槽，而为最长可能序列预留连续缓存的服务器浪费得多得多。"
            "页越小浪费越少，但块表越长。有滑动窗口时，窗口越过的页还回页池，"
            "供其他块使用。",
        ),
    },
}


def explain(run: DecodeRun, key: str, lang: Lang, step: DecodeStep | None = None) -> Explanation:
    """The explanation of one quantity of the decode, with this step's shapes."""
    from attn_cli.present.explain_registry import Explanation  # --explain only

    formula, meaning = (_EXPLAIN | view_notes("decode"))[key][lang]
    meaning += view_asides("decode", key, lang)
    inp = run.trace.inputs
    C = step.slots if step is not None else 0
    shapes = {
        "Q": f"[heads={inp.heads}, 1, d_k={inp.d_k}]",
        "Q_rot": f"[heads={inp.heads}, 1, d_k={inp.d_k}]",
        "K_cache": f"[kv_heads={inp.kv_heads}, slots={C}, d_k={inp.d_k}]",
        "V_cache": f"[kv_heads={inp.kv_heads}, slots={C}, d_v={inp.d_v}]",
        "output": f"[heads={inp.heads}, 1, d_v={inp.d_v}]",
        "check": label(lang, "scalar"),
        "cost": label(lang, "scalar"),
        "pool": label(lang, "scalar"),
        "block_table": f"[blocks={len(step.pages.table) if step and step.pages else 0}]",
        "gather": f"[kv_heads={inp.kv_heads}, slots={C}, d_k={inp.d_k}]",
    }
    if step is not None and key in step.outs:  # a head-output transform's (a gate)
        shapes[key] = f"[heads={inp.heads}, 1, d_v={inp.d_v}]"
    if step is not None and step.latent is not None:  # a latent cache (MLA's)
        width, r = step.K_cache.shape[-1], step.latent.shape[-1]
        shapes |= {
            "Q_latent": f"[heads={inp.heads}, 1, {width}]",
            "K_latent": f"[1, slots={C}, {width}]",
            "output_latent": f"[heads={inp.heads}, 1, {r}] → [heads={inp.heads}, 1, d_v={inp.d_v}]",
        }
    out = shapes.get(key, f"[heads={inp.heads}, 1, slots={C}]")
    inputs = (_INPUTS | view_inputs("decode")).get(
        key, ("masked",) if key == "softmax" else ("scores",)
    )
    return Explanation(key, lang, (formula,), inputs, f"{key} {out}", (meaning,))


_INPUTS: dict[str, tuple[str, ...]] = {
    "Q": ("Q",),
    "Q_rot": ("Q",),
    "K_cache": ("K",),
    "V_cache": ("V",),
    "scores": ("Q_rot | Q", "K_cache"),
    "masked": ("capped | scaled",),
    "output": ("softmax", "V_cache"),
    "check": ("output", "the full attention's rows"),
    "cost": ("kv_heads", "d_k", "d_v"),
    "block_table": ("i", "block_size"),
    "gather": ("pool", "block_table"),
    "pool": ("pages", "block_size", "kv_heads", "d_k", "d_v"),
}
