"""How to fix the mistakes of a hand-written decode loop that core/decode.py recomputes for any
fixture (``decode_mistakes``: not one variant's), in English and Chinese; the variants' own loop
mistakes (a ring buffer one slot too big) sit in their modules."""

from __future__ import annotations

from attn_cli.check.mistake import register_loop_texts

register_loop_texts(
    {
        "attend_before_append": (
            "Fix: append the step's key and value to the cache first, then attend: the new "
            "token is one of the keys it attends to (causal attention includes the diagonal).",
            "先注意力、后写入缓存",
            "这一步先对缓存做注意力，再把自己的键和值写入缓存，"
            "所以新 token 看不到它自己（因果注意力包括对角线）。"
            "修正：先把这一步的 k、v 写入缓存，再计算注意力。",
        ),
        "rerotate_cache": (
            "Fix: rotate each key once, when it enters the cache, at its own position.",
            "缓存里的键每一步又被旋转",
            "已缓存的键已经按它的位置旋转过，每一步再旋转一次就错了。修正：键只在写入缓存时按自己的位"
            "置旋转一次。",
        ),
        "restart_positions": (
            "Fix: a decoded token's position continues from the prompt (prefill + step).",
            "预填充之后位置又从 0 开始",
            "解码的 token 的位置应接着提示词继续。修正：位置 = 预填充长度 + 步数。",
        ),
        "cache_by_query_head": (
            "Fix: query head h reads cache head h // (heads / kv_heads).",
            "按查询头取缓存（h mod kv_heads）",
            "分组查询注意力中查询头 h 读的是第 h // (heads / kv_heads) 个键值头。"
            "修正：kv = h // groups。",
        ),
        "cache_sized_by_heads": (
            "Fix: cache kv_heads keys and values and repeat them to the query heads when reading.",
            "缓存按查询头的数量存放",
            "在写入缓存之前就把键和值复制到每个查询头：输出正确，但内存是 heads/kv_heads 倍。"
            "修正：缓存 kv_heads 份，读取时再复制。",
        ),
    }
)
