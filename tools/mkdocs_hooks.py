"""mkdocs hooks: generated reference pages, and a navigation that others can extend.

- The scenario file reference and the built-in scenario gallery are generated
  from the code at build time (:mod:`orcasim.reference`), so they cannot drift
  from what the loader validates.
- A page listed in ``nav`` but absent from ``docs/`` is dropped (pages other
  work adds later can be listed ahead of time); a page in ``docs/`` that
  ``nav`` does not list is appended under "More", so a new page is never
  unreachable.
- A tutorial for a built-in scenario is found as ``docs/tutorials/<name>.md``
  or through ``extra.scenario_tutorials`` in mkdocs.yml.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

GENERATED = ("reference/scenario-file.md", "reference/builtin-scenarios.md")


def _prune(items: list[Any], docs: Path) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                kept = _prune(value, docs)
                if kept:
                    out.append({title: kept})
            elif _exists(value, docs):
                out.append(item)
        elif _exists(item, docs):
            out.append(item)
    return out


def _exists(path: str, docs: Path) -> bool:
    return "://" in path or path in GENERATED or (docs / path).is_file()


def _listed(items: list[Any]) -> set[str]:
    out: set[str] = set()
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            out |= _listed(value)
        else:
            out.add(value)
    return out


def on_config(config: Any) -> Any:
    docs = Path(config.docs_dir)
    if config.nav:
        nav = _prune(config.nav, docs)
        listed = _listed(nav)
        extra = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
        extra = [p for p in extra if p not in listed and not p.startswith("hooks/")]
        if extra:
            nav.append({"More": extra})
        config.nav = nav
    return config


def tutorials(config: Any) -> dict[str, str]:
    """Built-in scenario name -> its tutorial page, relative to the generated gallery page."""
    from orcasim.scenario import builtin_scenarios

    docs = Path(config.docs_dir)
    given = dict((config.extra or {}).get("scenario_tutorials") or {})
    out = {}
    for name in builtin_scenarios():
        page = given.get(name) or f"tutorials/{name}.md"
        if (docs / page).is_file():
            out[name] = posixpath.relpath(page, "reference")
    return out


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    import orcasim  # noqa: F401  (registers the built-in components)
    from orcasim.reference import builtin_scenarios_page, scenario_reference

    pages = {GENERATED[0]: scenario_reference(),
             GENERATED[1]: builtin_scenarios_page(tutorials(config))}
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
