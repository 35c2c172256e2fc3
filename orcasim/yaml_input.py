"""Reading YAML input within limits: size, encoding, nesting, alias expansion, duplicate keys.

Scenario files and ``--set`` values are parsed here. A document is refused,
with a one-line :class:`~orcasim.errors.ScenarioError` naming the line, if it
is larger than :data:`MAX_TEXT_BYTES`, not UTF-8, nested deeper than
:data:`MAX_DEPTH`, expands through aliases to more than :data:`MAX_NODES`
nodes, or repeats a key in a mapping: never a silent choice, a recursion
error or an exponential blow-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from orcasim.errors import ScenarioError
from orcasim.spec import short_repr

try:
    from yaml._yaml import CParser as _CParser
except ImportError:  # PyYAML built without libyaml
    _CParser = None

#: a scenario file larger than this is refused unread
MAX_TEXT_BYTES = 20 * 2**20
#: a YAML document expanding (through aliases) to more nodes than this is refused
MAX_NODES = 1_000_000
#: a YAML document nested deeper than this (after alias expansion) is refused
MAX_DEPTH = 100
_MERGE_TAG = "tag:yaml.org,2002:merge"


def read_limited(path: Path, source: str) -> bytes:
    """The first :data:`MAX_TEXT_BYTES` + 1 bytes of ``path``: a huge file is never read whole."""
    try:
        with path.open("rb") as f:
            return f.read(MAX_TEXT_BYTES + 1)
    except OSError as err:
        raise ScenarioError("", f"cannot read: {err.strerror}", source) from None


def decode_text(data: bytes, source: str) -> str:
    """Scenario bytes as text: UTF-8, with or without a byte-order mark, and size-limited.

    UTF-16 and other encodings are refused by name rather than surfacing as a
    decoding traceback (UTF-16 text of ASCII characters is valid UTF-8 full of
    NUL characters, hence the NUL check).
    """
    if len(data) > MAX_TEXT_BYTES:
        raise ScenarioError("", f"cannot read: larger than {MAX_TEXT_BYTES // 2**20} MB", source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = "\x00"
    if "\x00" in text:
        raise ScenarioError("", "cannot read: not UTF-8 text", source)
    return text


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse scenario YAML; syntax errors name the line.

    Beyond syntax, a document is refused if it repeats a key in a mapping,
    nests deeper than :data:`MAX_DEPTH` or expands (through aliases) to more
    than :data:`MAX_NODES` nodes: each of these is a one-line error, never a
    silent choice, a recursion error or an exponential blow-up.
    """
    if len(text) > MAX_TEXT_BYTES:
        raise ScenarioError("", f"cannot read: larger than {MAX_TEXT_BYTES // 2**20} MB", source)
    try:
        raw = load_yaml(text)
    except ScenarioError as err:
        raise ScenarioError(err.field, err.message, source) from None
    except yaml.YAMLError as err:
        raise ScenarioError(*_yaml_problem(err), source) from None
    if not isinstance(raw, dict):
        raise ScenarioError("", "a scenario must be a YAML mapping", source)
    return raw


def _yaml_problem(err: yaml.YAMLError) -> tuple[str, str]:
    """``(where, message)`` of a YAML syntax error, without quoting the document."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return where, f"invalid YAML: {problem}"


if _CParser is not None:

    class _Loader(Composer, _CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """libyaml's parser with PyYAML's composer, so composition can be checked as it goes."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)

else:
    _Loader = yaml.SafeLoader  # type: ignore[misc, assignment]


class _ScenarioLoader(_Loader):  # type: ignore[misc, valid-type]
    """A safe loader that refuses duplicate keys, deep nesting and alias bombs.

    Every node is measured as it is composed: its size and depth *after*
    alias expansion, from the sizes of its children, so an alias costs what it
    would expand to while nothing is ever expanded. The running total of the
    document stops composition as soon as it passes :data:`MAX_NODES`.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._total = 0
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, depth)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._measured:
                raise ScenarioError(f"line {mark.line + 1}", "a YAML alias refers to itself")
            self._count(self._measured[id(node)][0], mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _too_deep(mark)
        self._count(1, mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._measure(node)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node: MappingNode = super().compose_mapping_node(anchor)
        self._refuse_duplicate_keys(node)
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._total += nodes
        if self._total > MAX_NODES:
            raise ScenarioError(
                f"line {mark.line + 1}",
                f"the document expands to more than {MAX_NODES:,} nodes (through YAML aliases "
                "or sheer size); refusing it",
            )

    def _measure(self, node: Node) -> None:
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        sizes = [self._measured[id(c)] for c in children]
        depth = 1 + max((d for _, d in sizes), default=0)
        if depth > MAX_DEPTH:
            raise _too_deep(node.start_mark)
        self._measured[id(node)] = (1 + sum(n for n, _ in sizes), depth)

    def _refuse_duplicate_keys(self, node: MappingNode) -> None:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue
            key = self.construct_object(key_node)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue
            if duplicate:
                raise ScenarioError(
                    f"line {key_node.start_mark.line + 1}", f"duplicate key {short_repr(key)}"
                )


def _too_deep(mark: Any) -> ScenarioError:
    return ScenarioError(f"line {mark.line + 1}", f"nested deeper than {MAX_DEPTH} levels")


def load_yaml(text: str) -> Any:
    """Parse one YAML document safely and within the limits of :class:`_ScenarioLoader`.

    Raises :class:`yaml.YAMLError` for a syntax error and :class:`ScenarioError`
    (without a source) for a document that breaks a limit or repeats a key.
    """
    loader = _ScenarioLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
