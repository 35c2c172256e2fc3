"""Plugins without packaging: import a Python file or module so that its components register.

A policy (or latency model, workload...) written in a file registers itself
with a decorator such as ``@orcasim.register_policy("my-policy")`` when the
file is imported. :func:`load_plugins` imports such files, or importable
modules, on request: from ``orcasim --import FILE_OR_MODULE`` and from a
scenario's ``plugins:`` list. An installed package can still use the
``orcasim.policies`` entry point group instead (see :mod:`orcasim.registry`).

A file is imported under a module name derived from its resolved path, so
loading the same file again is a no-op and another process (a sweep worker)
that loads the same path gets the same module, in which pickled references
to the plugin's classes resolve. :func:`with_plugins` wraps a function sent
to worker processes so that they load every plugin this process has loaded
before anything else of the call is unpickled.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from orcasim.errors import UsageError

R = TypeVar("R")

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
#: every plugin loaded in this process, in order: resolved spec -> module name
_LOADED: dict[str, str] = {}


def load_plugins(specs: Sequence[str], base_dir: Path | None = None) -> list[str]:
    """Import each plugin of ``specs`` (running its registration decorators); return them resolved.

    A spec is a path to a ``.py`` file (relative to ``base_dir``, default the
    current directory) or an importable module name (``mypkg.policies``). The
    result holds each file's absolute path and each module's name: what
    another process passes to load the same plugins. Every failure is a
    one-line :class:`~orcasim.errors.UsageError` naming the plugin.
    """
    return [_load_one(str(spec), base_dir) for spec in specs]


def loaded_plugins() -> list[str]:
    """The resolved specs of every plugin loaded in this process so far, in load order."""
    return list(_LOADED)


def with_plugins(fn: Callable[..., R]) -> Callable[..., R]:
    """``fn``, made to load this process's plugins in whichever process unpickles it.

    For calls sent to worker processes (a sweep's runs): the arguments of a
    call may hold plugin classes, which a worker can only unpickle once it has
    imported the plugin; the function is unpickled before its arguments. With
    no plugins loaded, ``fn`` is returned unchanged.
    """
    specs = loaded_plugins()
    return _PluginCall(fn, specs) if specs else fn


class _PluginCall(Generic[R]):
    """A function bundled with the plugins it needs; unpickling it loads them."""

    def __init__(self, fn: Callable[..., R], specs: Sequence[str]) -> None:
        self.fn = fn
        self.specs = tuple(specs)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        load_plugins(self.specs)
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickle_call, (self.fn, self.specs)


def _unpickle_call(fn: Callable[..., R], specs: tuple[str, ...]) -> _PluginCall[R]:
    """Rebuild a :class:`_PluginCall` in a worker, loading its plugins first."""
    load_plugins(specs)
    return _PluginCall(fn, specs)


def _load_one(spec: str, base_dir: Path | None) -> str:
    """Load one plugin; return its resolved spec."""
    if _is_file_spec(spec, base_dir):
        path = _plugin_path(spec, base_dir)
        _import_file(spec, path)
        return str(path)
    _import_module(spec)
    return spec


def _is_file_spec(spec: str, base_dir: Path | None) -> bool:
    """A path (it ends in ``.py``, has a separator or names an existing file), not a module."""
    if spec.endswith(".py") or "/" in spec or "\\" in spec or not _MODULE_NAME.fullmatch(spec):
        return True
    return (base_dir or Path.cwd()).joinpath(spec).is_file()


def _plugin_path(spec: str, base_dir: Path | None) -> Path:
    """The absolute path of a file plugin, checked to be an existing ``.py`` file."""
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.exists():
        where = "" if Path(spec).is_absolute() else f" ({path})"
        raise UsageError(f"plugin {spec}: no such file{where}")
    if not path.is_file() or path.suffix != ".py":
        raise UsageError(f"plugin {spec}: not a .py file")
    return path


def module_name(path: Path) -> str:
    """The module name a plugin file is imported under: the same for the same resolved path."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"orcasim_plugin_{stem}_{digest}"


def _import_file(spec: str, path: Path) -> ModuleType:
    """Import the file at ``path`` under its :func:`module_name`, once per process."""
    name = module_name(path)
    if name in sys.modules:
        _LOADED.setdefault(str(path), name)
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UsageError(f"plugin {spec}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise _import_error(spec, err, str(path)) from None
    _LOADED[str(path)] = name
    return module


def _import_module(spec: str) -> ModuleType:
    """Import the module named ``spec``; a missing module is a usage error, not a crash."""
    if spec in sys.modules:
        _LOADED.setdefault(spec, spec)
        return sys.modules[spec]
    try:
        found = importlib.util.find_spec(spec)
    except ModuleNotFoundError:
        found = None
    except Exception as err:  # a parent package that fails to import
        raise _import_error(spec, err, None) from None
    if found is None:
        raise UsageError(f"plugin {spec}: no module named {spec!r} "
                         "(a plugin is a .py file or an importable module name)")
    try:
        module = importlib.import_module(spec)
    except Exception as err:
        raise _import_error(spec, err, found.origin) from None
    _LOADED[spec] = spec
    return module


def _import_error(spec: str, err: Exception, origin: str | None) -> UsageError:
    """One line for an exception raised while importing a plugin: type, message, file:line."""
    message = str(err.msg if isinstance(err, SyntaxError) else err).strip()
    text = f"{type(err).__name__}: {message.splitlines()[0]}" if message else type(err).__name__
    where = _where(err, origin)
    return UsageError(f"plugin {spec}: {text}" + (f" ({where})" if where else ""))


def _where(err: Exception, origin: str | None) -> str:
    """``file:line`` of the last traceback frame inside the plugin (a syntax error: its line)."""
    if isinstance(err, SyntaxError) and err.filename and err.lineno:
        return f"{Path(err.filename).name}:{err.lineno}"
    frames = traceback.extract_tb(err.__traceback__)
    inside = [f for f in frames if origin is not None and f.filename == origin]
    if not inside:
        inside = [f for f in frames if f.filename != __file__
                  and not f.filename.startswith("<frozen")
                  and "importlib" not in Path(f.filename).parts]
    if not inside:
        return ""
    return f"{Path(inside[-1].filename).name}:{inside[-1].lineno}"
