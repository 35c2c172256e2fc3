"""Name -> component registries: policies, latency models, workloads, admission controllers...

Each component is a class with a ``Params`` pydantic model (its scenario
fields) and registers itself under a name with one decorator::

    @policies.register("my-policy")
    class MyPolicy(Policy):
        class Params(PolicyParams):
            max_batch: int = 32

The built-in components of a kind live in one package (``orcasim.policies``
for policies), imported the first time its registry is read or written, so
that ``import orcasim`` stays cheap and a name clashing with a built-in one
is refused whichever is registered first. Third-party packages can add
policies through the ``orcasim.policies`` entry point group; they are loaded
the first time the registry is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of component classes of one kind (e.g. ``"policy"``)."""

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 builtins: str | None = None) -> None:
        self.kind = kind
        self._items: dict[str, type[T]] = {}
        self._group = entry_point_group
        self._plugins_loaded = entry_point_group is None
        self._builtins = builtins

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: make ``cls`` available under ``name``."""

        def deco(cls: type[T]) -> type[T]:
            self._load_builtins()
            if name in self._items and self._items[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = cls
            cls.type_name = name  # type: ignore[attr-defined]
            return cls

        return deco

    def _load_builtins(self) -> None:
        """Import the package of built-in components once (their decorators register them).

        The name is cleared first: the package's own decorators come back here
        while it is being imported, and find it already under way."""
        if self._builtins is not None:
            package, self._builtins = self._builtins, None
            importlib.import_module(package)

    def _load_plugins(self) -> None:
        self._load_builtins()
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self._group or ""):
            ep.load()

    def get(self, name: str) -> type[T]:
        """Return the class registered as ``name``; KeyError lists the known names."""
        self._load_plugins()
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r} (known: {', '.join(self.names())})"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._load_plugins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[tuple[str, type[T]]]:
        self._load_plugins()
        return iter(sorted(self._items.items()))


policies: Registry[Any] = Registry("policy", "orcasim.policies", builtins="orcasim.policies")
latency_models: Registry[Any] = Registry("latency model", builtins="orcasim.latency")
workloads: Registry[Any] = Registry("workload", builtins="orcasim.workload")
arrivals: Registry[Any] = Registry("arrival process", builtins="orcasim.workload")
lengths: Registry[Any] = Registry("length distribution", builtins="orcasim.workload")
admission: Registry[Any] = Registry("admission controller", builtins="orcasim.admission")
routers: Registry[Any] = Registry("routing policy", builtins="orcasim.routing")
