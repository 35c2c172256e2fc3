"""Validated component specifications: ``{type: name, ...params}`` -> class + params.

A scenario names its components (policy, latency model, workload, arrival
process, length distributions) by ``type`` and gives their parameters next to
it. :func:`build_spec` looks the type up in a registry, validates the rest
against the class's ``Params`` model and recurses into fields marked
:class:`Nested`, so every mistake is found at load time and reported with its
full dotted path (``workload.arrival.rate: ...``).
"""

from __future__ import annotations

import difflib
import reprlib
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

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


def _make_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 2, 60, 60, 40
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 5
    return r


_REPR = _make_repr()


def short_repr(value: Any) -> str:
    """A bounded ``repr`` for messages: a huge or deeply shared input never gets expanded."""
    return _REPR.repr(value)


MAX_ERRORS = 5


def format_validation_error(err: ValidationError, prefix: str) -> tuple[str, str]:
    """First error of ``err`` as ``(dotted field path, message)``."""
    return _format_error(err.errors()[0], prefix, None)


def format_validation_errors(
    err: ValidationError, prefix: str, model: type[BaseModel] | None = None
) -> tuple[str, str]:
    """All errors of ``err`` as ``(first field, message)`` for one line.

    The message is the first error's, then ``"; field: message"`` for each
    other one (at most :data:`MAX_ERRORS`, then a count). Unknown fields come
    first, each with the closest field name of ``model``: a misspelt required
    field is reported as the typo it is before the "missing" it causes.
    """
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    parts = [_format_error(e, prefix, model) for e in errors[:MAX_ERRORS]]
    field, message = parts[0]
    rest = [f"{f}: {m}" if f else m for f, m in parts[1:]]
    if len(errors) > MAX_ERRORS:
        rest.append(f"(and {len(errors) - MAX_ERRORS} more)")
    return field, "; ".join([message, *rest])


def _format_error(e: Any, prefix: str, model: type[BaseModel] | None) -> tuple[str, str]:
    loc = [str(p) for p in e["loc"]]
    field = ".".join([prefix, *loc] if prefix else loc)
    kind = e["type"]
    if kind == "extra_forbidden":
        hint = _suggest(model, e["loc"]) if model is not None and e["loc"] else None
        return field, f"unknown field (did you mean {hint!r}?)" if hint else "unknown field"
    if kind == "missing":
        return field, "required field is missing"
    msg = e["msg"].removeprefix("Value error, ")
    if "input" in e and not isinstance(e["input"], dict):
        msg = f"{msg} (got {short_repr(e['input'])})"
    return field, msg


def _suggest(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The field name of the model holding ``loc`` closest to its last key, if any is close."""
    holder = _holder(model, loc[:-1])
    if holder is None:
        return None
    names = _field_names(holder)
    match = difflib.get_close_matches(str(loc[-1]), names, n=1)
    return match[0] if match else None


def _holder(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose fields a key at ``loc`` (below ``model``) is checked against."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return None
        info = current.model_fields.get(part) if isinstance(part, str) else None
        if info is not None:
            current = _model_in(info.annotation)
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model in a type (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    """Field names of ``model`` with their string aliases (``max_num_seqs`` for ``max_batch``)."""
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append(name)
        if isinstance(info.alias, str):
            names.append(info.alias)
        choices = getattr(info.validation_alias, "choices", None) or []
        names += [c for c in choices if isinstance(c, str)]
    return list(dict.fromkeys(names))


def validate_params(model: type[ComponentParams], data: Any, path: str) -> ComponentParams:
    """Validate ``data`` against ``model``; a failure is a :class:`ScenarioError` at ``path``.

    Every error of the section is reported (on one line), not only the first.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(path, f"expected a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(*format_validation_errors(err, path, model)) from None


def build_spec(registry: Registry[Any], data: Any, path: str) -> Spec:
    """Validate ``data`` (``"name"`` or ``{type: name, ...}``) as a component of ``registry``."""
    if isinstance(data, str):
        data = {"type": data}
    if not isinstance(data, dict):
        raise ScenarioError(path, f"expected a {registry.kind} name or mapping with 'type'")
    data = dict(data)
    name = data.pop("type", None)
    known = ", ".join(registry.names())
    if name is None:
        raise ScenarioError(f"{path}.type", f"missing (one of: {known})")
    if not isinstance(name, str):
        raise ScenarioError(
            f"{path}.type", f"must be a string naming a registered component (one of: {known})"
        )
    if name not in registry:
        raise ScenarioError(
            f"{path}.type", f"unknown {registry.kind} {short_repr(name)} (known: {known})"
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
