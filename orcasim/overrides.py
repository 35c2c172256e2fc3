"""Scenario overrides: dotted field paths, deep merges and ``field.path=value`` assignments.

Variants and command-line overrides are written as dotted paths into the
scenario's mapping; these functions expand, merge and set them, and refuse a
path that would silently create a misspelt variant.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

import yaml

from orcasim.errors import ScenarioError
from orcasim.spec import short_repr
from orcasim.yaml_input import MAX_DEPTH, load_yaml

#: an override path with more dotted parts than this is refused
MAX_PATH_PARTS = 50


def check_override_path(raw: dict[str, Any], path: str) -> None:
    """Refuse an override that would silently create a variant through a misspelt name.

    ``variants.NAME.field`` must name an existing variant; ``variants.NAME``
    (a whole variant) or ``variants`` (all of them) may add new ones.
    """
    parts = str(path).split(".")
    if len(parts) > MAX_PATH_PARTS:
        raise ScenarioError(short_repr(path), f"more than {MAX_PATH_PARTS} dotted parts")
    if len(parts) < 3 or parts[0] != "variants":
        return
    variants = raw.get("variants")
    names = [str(n) for n in variants] if isinstance(variants, dict) else []
    if parts[1] in names:
        return
    have = ", ".join(names) if names else "none"
    hint = difflib.get_close_matches(parts[1], names, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ScenarioError(f"variants.{parts[1]}", f"no such variant (have: {have}){suggestion}")


def merge(base: Any, over: Any) -> Any:
    """Deep-merge ``over`` into a copy of ``base``.

    Mappings merge key by key, except that a mapping whose ``type`` changes is
    replaced whole (another component's parameters do not carry over).
    """
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    if "type" in over and base.get("type") != over["type"]:
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if k in out else copy.deepcopy(v)
    return out


def expand_dotted(d: dict[str, Any]) -> dict[str, Any]:
    """``{"policy.max_batch": 8}`` -> ``{"policy": {"max_batch": 8}}`` (recursively).

    A result nested deeper than :data:`MAX_DEPTH` is refused: dotted keys
    inside nested mappings multiply depth, and a later deep copy would not
    survive it.
    """
    return _expand(d, 0)


def _expand(d: dict[str, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        parts = str(k).split(".")
        if depth + len(parts) > MAX_DEPTH:
            raise ScenarioError(short_repr(str(k)), f"nested deeper than {MAX_DEPTH} levels")
        v = _expand(v, depth + len(parts)) if isinstance(v, dict) else v
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        leaf = parts[-1]
        node[leaf] = merge(node[leaf], v) if leaf in node else v
    return out


def set_path(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set ``raw[a][b][c] = value`` for ``path = "a.b.c"``, creating mappings as needed."""
    parts = path.split(".")
    node = raw
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        if isinstance(nxt, str) and i == len(parts) - 2 and p in ("policy", "latency"):
            nxt = {"type": nxt}
        if nxt is None:
            nxt = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(
                ".".join(parts[: i + 1]), "is not a mapping; cannot set a field in it"
            )
        node[p] = nxt
        node = nxt
    node[parts[-1]] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"policy.max_batch=16"`` -> ``("policy.max_batch", 16)``; the value is parsed as YAML."""
    if "=" not in text:
        raise ScenarioError(text, "an override must look like field.path=value")
    path, _, value = text.partition("=")
    path = path.strip()
    try:
        parsed = load_yaml(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    except ScenarioError as err:
        raise ScenarioError(path, f"value: {err.message}") from None
    return path, parsed
