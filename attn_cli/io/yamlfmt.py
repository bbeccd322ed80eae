"""Fixture YAML: the safe loader, no tags, aliases sized before they are expanded."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from attn_cli.core.limits import MAX_INT_DIGITS, SHALLOW
from attn_cli.errors import InputError
from attn_cli.errors import field_name as _field
from attn_cli.io import fastyaml
from attn_cli.io.jsonfmt import MAX_DEPTH


def _yaml_loader(source: str, max_elements: int) -> Any:
    import yaml

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:
                    duplicate = False
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise InputError(
                        source, _field(key), f"duplicate key (line {line})", "each key once"
                    )
                with contextlib.suppress(TypeError):  # unhashable keys are reported later
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            digits = len(node.value.lstrip("+-").replace("_", ""))
            if digits > MAX_INT_DIGITS:
                raise InputError(
                    source,
                    f"line {node.start_mark.line + 1}",
                    f"an integer with {digits} digits",
                    f"at most {MAX_INT_DIGITS} digits",
                )
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    # YAML 1.1 reads 1e-3 (no dot, or no exponent sign) as a string; read it as YAML 1.2 does.
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_EXPONENT, list("-+.0123456789"))
    return Loader


_UNKNOWN_TAG = re.compile(r"could not determine a constructor for the tag '([^']*)'")
_YAML12_EXPONENT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


ALIAS_FREE = 1_000_000  # values any YAML document may reach through aliases
ALIAS_FACTOR = 10  # past that, aliases may repeat what is written at most this many times
MAX_YAML_DEPTH = MAX_DEPTH  # mappings and lists nested deeper are refused while sizing


def _yaml_size(root: Any, source: str) -> tuple[int, int]:
    """Scalars in a YAML node graph as written and as if aliases were expanded, expanding none.

    Each node is visited once (aliases share nodes), so a "billion laughs" document is sized in
    time proportional to its text.
    """
    memo: dict[int, int] = {}
    open_nodes: set[int] = set()
    written = 0

    def size(node: Any, depth: int) -> int:
        nonlocal written
        key = id(node)
        if key in memo:
            return memo[key]
        if key in open_nodes:
            raise InputError(
                source,
                f"line {node.start_mark.line + 1}",
                "an alias refers to a list or mapping that contains it (a recursive alias)",
                "aliases to finished values only",
            )
        if depth > MAX_YAML_DEPTH:
            raise RecursionError
        value = node.value
        if isinstance(value, list):
            open_nodes.add(key)
            total = 0
            for item in value:
                for part in item if isinstance(item, tuple) else (item,):  # (key, value) pairs
                    total += size(part, depth + 1)
            open_nodes.discard(key)
        else:
            total = 1
            written += 1
        memo[key] = total
        return total

    expanded = size(root, 0)
    return written, expanded


def parse_yaml(text: str, source: str, max_elements: int) -> Any:
    import yaml

    def check_size(node: Any) -> None:
        _check_aliases(*_yaml_size(node, source), source, max_elements)

    with contextlib.suppress(fastyaml.NotFast):
        return fastyaml.parse(text, _yaml_loader(source, max_elements), check_size)
    loader = _yaml_loader(source, max_elements)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError(source, "", "the file is empty", "a YAML mapping of fixture keys")
        # Aliases are legal but may expand exponentially ("billion laughs"): size the graph first.
        check_size(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else ""
        tag = _UNKNOWN_TAG.search(e.problem or "")
        if tag:  # !!python/object/apply:os.system and friends: named, refused, never run
            shown = tag.group(1).replace("tag:yaml.org,2002:", "!!")
            raise InputError(
                source,
                where,
                f"the YAML tag {shown} is not allowed (tags are refused, never run)",
                "plain YAML data: mappings, lists, strings, numbers, booleans and null",
            ) from None
        problem = ", ".join(" ".join(p.split()) for p in (e.context, e.problem) if p)
        raise InputError(source, where, f"invalid YAML ({problem})", "plain YAML data") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow, before parsing
        before = text[: e.position]
        where = f"line {before.count(chr(10)) + 1} column {len(before) - before.rfind(chr(10))}"
        char = e.character if isinstance(e.character, str) else chr(e.character)
        raise InputError(
            source,
            where,
            f"invalid YAML (the character {ord(char):#06x} is not allowed)",
            "plain YAML text without control characters",
        ) from None
    except yaml.YAMLError as e:
        problem = " ".join(str(e).split())
        raise InputError(source, "", f"invalid YAML ({problem})", "plain YAML data") from None
    except RecursionError:
        raise InputError(
            source, "", f"nesting is too deep (more than {MAX_YAML_DEPTH} levels)", SHALLOW
        ) from None
    finally:
        loader.dispose()


def _check_aliases(written: int, expanded: int, source: str, max_elements: int) -> None:
    """Aliases may repeat data (``K: *q``) but not multiply it into more than we would read."""
    if expanded == written:
        return  # no alias repeats anything: validation counts the numbers
    cap = 2 * max_elements
    limit = min(cap, max(ALIAS_FREE, ALIAS_FACTOR * written))
    if expanded <= limit:
        return
    if limit == cap:  # the element limit itself: the CLI names its flag
        raise InputError(
            source,
            "",
            f"the document expands to too many values (YAML aliases turn {written:,} values "
            f"written into {expanded:,})",
            f"at most {limit:,} values once aliases are expanded",
            option="max-elements",
        )
    if limit == ALIAS_FREE:
        why = "aliases may repeat parts of a fixture, not multiply it"
    else:
        why = f"{ALIAS_FACTOR} times the values written"
    raise InputError(
        source,
        "",
        f"the document expands to too many values (YAML aliases turn {written:,} values "
        f"written into {expanded:,})",
        f"at most {limit:,} values once aliases are expanded ({why})",
    )
