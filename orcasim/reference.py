"""The scenario file reference, generated from the validation schema.

Every field a scenario accepts is declared once, in a pydantic model: the
top-level :class:`~orcasim.scenario.ScenarioModel` and its sections, and
the ``Params`` of every registered component (policies, latency models,
workloads, arrival processes, length distributions, admission controllers). This module walks those
models and registries and writes Markdown, so the reference in the
documentation site (built by ``mkdocs``, see ``tools/mkdocs_hooks.py``)
always matches what the loader validates::

    python -m orcasim.reference > scenario-reference.md
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import Any

import annotated_types as at
import yaml
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from orcasim import registry
from orcasim.params import ComponentParams
from orcasim.registry import Registry
from orcasim.spec import Nested

#: the registries, with the scenario fields that name one of their components
SECTIONS: list[tuple[str, str, Registry[Any], str]] = [
    ("Workloads", "workloads", registry.workloads, "`workload`"),
    ("Arrival processes", "arrival-processes", registry.arrivals, "`workload.arrival`"),
    ("Length distributions", "length-distributions", registry.lengths,
     "`workload.prompt_len`, `workload.output_len`"),
    ("Latency models", "latency-models", registry.latency_models, "`engine.latency`"),
    ("Policies", "policies", registry.policies, "`policy`"),
    ("Admission controllers", "admission-controllers", registry.admission, "`admission`"),
    ("Routing policies", "routing-policies", registry.routers, "`cluster.router`"),
]
#: top-level fields typed ``Any`` that hold a component of a registry
COMPONENT_FIELDS = {"workload": registry.workloads, "policy": registry.policies,
                    "latency": registry.latency_models, "admission": registry.admission}


#: what a field means, for the fields whose model gives no description
MEANINGS = {
    ("ScenarioModel", "name"): "names the default output folder `orcasim-out/<name>`",
    ("ScenarioModel", "description"): "one line, shown by `orcasim scenarios`",
    ("ScenarioModel", "seed"): "seed of the run's `numpy.random.default_rng` (`--seed` overrides)",
    ("ScenarioModel", "workload"): "where requests come from",
    ("ScenarioModel", "engine"): "the engine: its step-latency model",
    ("ScenarioModel", "policy"): "the scheduling policy",
    ("ScenarioModel", "memory"): "the KV-cache pool; none: unlimited memory (see memory.md)",
    ("ScenarioModel", "metrics"): "options of the summary metrics",
    ("ScenarioModel", "output"): "what `orcasim run` writes",
    ("ScenarioModel", "variants"): "named sets of dotted overrides, all run on the same requests",
    ("ScenarioModel", "admission"): "admission controllers, checked in order on every arrival",
    ("ScenarioModel", "events"): "scenario events at given times (drain, hard stop)",
    ("ScenarioModel", "sweep"): "the grid and seeds of `orcasim sweep`",
    ("EngineOptions", "latency"): "how long a step takes",
    ("MetricsOptions", "slo"): "latency bounds for goodput and SLO attainment",
    ("SLO", "ttft"): "time to first token bound, s",
    ("SLO", "tpot"): "time per output token bound, s",
    ("SLO", "e2e"): "end-to-end latency bound, s",
}


def _anchor(reg: Registry[Any]) -> str:
    for _, anchor, r, _ in SECTIONS:
        if r is reg:
            return anchor
    return ""


def _first_paragraph(doc: str | None) -> str:
    text = inspect.cleandoc(doc or "")
    return " ".join(text.split("\n\n")[0].split()).replace("``", "`")


def _type(ann: Any, info: FieldInfo | None, name: str, models: dict[type, str]) -> str:
    """The field's type in words; ``name`` is its dotted path (sub-models are noted there)."""
    for meta in (info.metadata if info is not None else []):
        if isinstance(meta, Nested):
            reg = meta.registry
            return f"[{reg.kind}](#{_anchor(reg)})"
    if ann is Any and name.rsplit(".", 1)[-1] in COMPONENT_FIELDS:
        reg = COMPONENT_FIELDS[name.rsplit(".", 1)[-1]]
        return f"[{reg.kind}](#{_anchor(reg)})"
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        # null is implied by a default of none
        return " or ".join(_type(a, None, name, models) for a in args if a is not type(None))
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, tuple):
        inner = {_type(a, None, name, models) for a in args if a is not Ellipsis}
        return f"list of {' or '.join(sorted(inner))}" if inner else "list"
    if origin is dict:
        return f"mapping of {_type(args[0], None, name, models)} to " \
               f"{_type(args[1], None, name, models)}" if args else "mapping"
    if isinstance(ann, type) and issubclass(ann, ComponentParams):
        models.setdefault(ann, f"{name}")
        return f"[mapping](#{_model_anchor(ann)})"
    if ann is Any:
        return "any"
    return getattr(ann, "__name__", str(ann))


def _model_anchor(model: type) -> str:
    return f"model-{model.__name__.lower()}"


def _constraints(info: FieldInfo) -> str:
    out = []
    for m in info.metadata:
        if isinstance(m, at.Gt):
            out.append(f"> {m.gt}")
        elif isinstance(m, at.Ge):
            out.append(f">= {m.ge}")
        elif isinstance(m, at.Lt):
            out.append(f"< {m.lt}")
        elif isinstance(m, at.Le):
            out.append(f"<= {m.le}")
        elif isinstance(m, at.MinLen):
            out.append(f"at least {m.min_length} item(s)")
    return ", ".join(out)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "**required**"
    else:
        value = info.default
    if isinstance(value, ComponentParams):
        return "(see below)"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return f"`{text.removesuffix('...').strip()}`"


def _table(model: type[ComponentParams], models: dict[type, str], where: str = "") -> list[str]:
    rows = ["| field | type | default | constraints | meaning |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        desc = info.description or MEANINGS.get((model.__name__, name), "")
        desc = desc.replace("|", "\\|").replace("\n", " ")
        path = f"{where}.{name}" if where else name
        rows.append(f"| `{name}` | {_type(info.annotation, info, path, models)} | "
                    f"{_default(info)} | {_constraints(info)} | {desc} |")
    return rows


def _nested_models(models: dict[type, str], done: set[type]) -> Iterator[str]:
    """Tables of the mappings (sub-models) the tables so far refer to, until none is left."""
    while True:
        todo = [m for m in models if m not in done]
        if not todo:
            return
        for m in todo:
            done.add(m)
            yield ""
            yield f"<a id='{_model_anchor(m)}'></a>"
            yield f"#### `{models[m]}`"
            yield ""
            doc = _first_paragraph(m.__doc__)
            if doc and not doc.startswith("!!!"):
                yield doc
                yield ""
            yield from _table(m, models, models[m])


def scenario_reference() -> str:
    """The whole reference page, as Markdown."""
    from orcasim.scenario import ScenarioModel

    lines = [
        "# Scenario file reference",
        "",
        "Every field a scenario file accepts, generated from the models the loader validates "
        "against (so it is always current). A component (workload, arrival process, length "
        "distribution, latency model, policy) is a mapping with `type:` and that type's "
        "fields, or just its name (`policy: continuous`). See [Scenario files](../scenarios.md) "
        "for a guided tour, variants and overrides.",
        "",
        "## Top level",
        "",
    ]
    models: dict[type, str] = {}
    done: set[type] = set()
    lines += _table(ScenarioModel, models)
    lines += list(_nested_models(models, done))
    for title, _, reg, where in SECTIONS:
        lines += ["", f"## {title}", "",
                  f"Used in {where}. Registered: {', '.join(f'`{n}`' for n in reg.names())}.",
                  ""]
        for name, cls in reg:
            lines += [f"### `{name}`", "", _first_paragraph(cls.__doc__), ""]
            params = cls.Params
            if params.model_fields:
                lines += _table(params, models, f"{where.split(',')[0].strip('`')}")
            else:
                lines.append("No fields.")
            lines += list(_nested_models(models, done))
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def builtin_scenarios_page(tutorials: Mapping[str, str] | None = None) -> str:
    """One section per built-in scenario: description, tutorial link, command, and the file.

    ``tutorials`` maps a scenario name to its tutorial page (a path relative to
    this page).
    """
    from orcasim.scenario import builtin_scenarios, load_scenario

    tutorials = tutorials or {}
    lines = ["# Built-in scenarios", "",
             "The scenarios shipped with orcasim (`orcasim scenarios` lists them). Run one by "
             "name, or copy its file and edit it.", ""]
    root = resources.files("orcasim.scenarios")
    for name in builtin_scenarios():
        sc = load_scenario(name)
        lines += [f"## `{name}`", "", sc.model.description or "", ""]
        if name in tutorials:
            lines += [f"Tutorial: [{name}]({tutorials[name]}).", ""]
        lines += [f"Variants: {', '.join(f'`{v}`' for v in sc.variant_names)}. Run it with "
                  f"`orcasim run {name}`.", "", "```yaml",
                  (root / f"{name}.yaml").read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    import orcasim  # noqa: F401  (registers the built-in components)

    print(scenario_reference(), end="")
