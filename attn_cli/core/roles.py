"""The roles a variant has in the chain: the words it declares (core/variant.py ``declares``,
``cannot_run_with``) and the chain reads to decide which variants run together.

A variant's roles are read from the hooks it has (``roles_of``); a variant whose hooks do not
say it all declares them. What it cannot run beside it declares as roles too: the chain refuses
two variants when either's roles meet what the other cannot run beside (``first_clash``), so no
variant names another.
"""

TRANSFORMS_QK = "transforms Q and K"  # a Q/K transform (QK-norm, RoPE)
MODIFIES_SCORES = "modifies the scores"  # a score modifier (the logit cap)
ADDS_BIAS = "adds a bias to the scores"  # the fixture's bias, ALiBi
HIDES_KEYS = "hides keys"  # an allowed rule (window, mask, lengths)
HIDES_LATER_KEYS = "hides later keys"  # the causal rule alone: what a causal mixer does itself
SETS_FILL = "sets the fill of hidden keys"  # a finite sentinel in place of -inf
EXTRA_LOGIT = "joins an extra logit to the softmax"  # a sink per head
TRANSFORMS_OUTPUT = "transforms the head outputs"  # a gate
MAKES_QKV = "makes Q, K and V itself"  # a front end (MLA's latent)
REPLACES_SOFTMAX = "replaces the softmax"  # a mixer (linear attention)
KEEPS_STATE = "keeps a state, not a cache"  # decoding carries a recurrent state
TWO_MAPS = "computes two softmax maps"  # differential attention
# every role that acts on softmax attention: meaningless where a mixer replaces it
ON_SOFTMAX = frozenset(
    {
        TRANSFORMS_QK,
        MODIFIES_SCORES,
        ADDS_BIAS,
        HIDES_KEYS,
        SETS_FILL,
        EXTRA_LOGIT,
        TRANSFORMS_OUTPUT,
    }
)
