"""Validated component specifications: ``{type: name, ...params}`` -> class + params.

A scenario names its components (policy, latency model, workload, arrival
process, length distributions) by ``type`` and gives their parameters next to
it. :func:`build_spec` looks the type up in a registry, validates the rest
against the class's ``Params`` model and recurses into fields marked
:class:`Nested`, so every mistake is found at load time and reported with its
full dotted path (``workload.arrival.rate: ...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from orcasim.errors import ScenarioError
from orcasim.params import ComponentParams
from orcasim.registry import Registry


class Nested:
    """Field metadata: this field is itself a component from ``registry``.

    Use as ``arrival: Annotated[Any, Nested(arrivals)]`` in a ``Params`` model.
    After validation the field holds a :class:`Spec`.
    """

    def __init__(self, registry: Registry[Any]) -> None:
        self.registry = registry


@dataclass(frozen=True)
class Spec:
    """A component class with validated parameters, ready to instantiate."""

    cls: type
    params: ComponentParams

    @property
    def type(self) -> str:
        return self.cls.type_name  # type: ignore[attr-defined, no-any-return]

    def create(self, *args: Any, **kwargs: Any) -> Any:
        """Instantiate the component: ``cls(params, *args, **kwargs)``."""
        return self.cls(self.params, *args, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The spec as it would be written in a scenario (all defaults filled in)."""
        out: dict[str, Any] = {"type": self.type}
        for name in type(self.params).model_fields:
            value = getattr(self.params, name)
            out[name] = _plain(value)
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Spec):
        return value.to_dict()
    if isinstance(value, ComponentParams):
        return {k: _plain(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def format_validation_error(err: ValidationError, prefix: str) -> tuple[str, str]:
    """First error of ``err`` as ``(dotted field path, message)``."""
    e = err.errors()[0]
    loc = [str(p) for p in e["loc"]]
    field = ".".join([prefix, *loc] if prefix else loc)
    kind = e["type"]
    if kind == "extra_forbidden":
        return field, "unknown field"
    if kind == "missing":
        return field, "required field is missing"
    msg = e["msg"]
    if "input" in e and not isinstance(e["input"], dict):
        msg = f"{msg} (got {e['input']!r})"
    return field, msg


def validate_params(model: type[ComponentParams], data: Any, path: str) -> ComponentParams:
    """Validate ``data`` against ``model``; a failure is a :class:`ScenarioError` at ``path``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(path, f"expected a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(*format_validation_error(err, path)) from None


def build_spec(registry: Registry[Any], data: Any, path: str) -> Spec:
    """Validate ``data`` (``"name"`` or ``{type: name, ...}``) as a component of ``registry``."""
    if isinstance(data, str):
        data = {"type": data}
    if not isinstance(data, dict):
        raise ScenarioError(path, f"expected a {registry.kind} name or mapping with 'type'")
    data = dict(data)
    name = data.pop("type", None)
    if name is None:
        raise ScenarioError(
            f"{path}.type", f"missing (one of: {', '.join(registry.names())})"
        )
    if name not in registry:
        raise ScenarioError(
            f"{path}.type",
            f"unknown {registry.kind} {name!r} (known: {', '.join(registry.names())})",
        )
    cls = registry.get(name)
    params = validate_params(cls.Params, data, path)
    nested: dict[str, Spec] = {}
    for fname, finfo in type(params).model_fields.items():
        for meta in finfo.metadata:
            if isinstance(meta, Nested) and getattr(params, fname) is not None:
                nested[fname] = build_spec(meta.registry, getattr(params, fname), f"{path}.{fname}")
    if nested:
        params = params.model_copy(update=nested)
    return Spec(cls, params)
