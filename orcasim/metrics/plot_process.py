"""Drawing plots in a child process that imports matplotlib while the command simulates.

Importing matplotlib takes about as long as simulating a few hundred
requests, and drawing a figure about as long again. A command that will
write plots creates a :class:`PlotProcess` before its own work: the child
imports matplotlib and the module that draws while the parent reads its
inputs and simulates, then draws what the parent sends it. With two cores
the import costs no wall time. The child calls the same functions on the
same (pickled) data as the parent would, so the files are identical
(``tests/test_plot_process.py``).

Whenever the child cannot help, the parent draws itself: when this process
has imported matplotlib already (drawing here then costs no import, and
keeps any settings made to it), on a single core, or when the child fails
for any reason (the parent then draws, and a real error such as an
unwritable file is raised here as usual). The child runs in a session of
its own, so that Ctrl-C reaches the parent only (which ends the child), and
ends when its input closes.

The child (:data:`CHILD`, run with ``python -c``) imports the modules, reads
a pickled list of ``(function name, args)`` jobs from stdin, calls
``MODULE.<name>(*args)`` for each and writes a pickled list of their return
values (or the error's text) to stdout. It imports the parent's orcasim (from
the same directory) or gives up.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orcasim

#: when False, every :class:`PlotProcess` draws in this process
ENABLED = True


def worthwhile() -> bool:
    """Whether a child would save time: matplotlib not imported here yet, and two cores."""
    if "matplotlib" in sys.modules:
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores > 1


#: results of more request rows than this are drawn in the parent: pickling them for the
#: child would raise the parent's peak memory, for a saving small beside the simulation
MAX_CHILD_ROWS = 250_000


def takes_results(results: Any) -> bool:
    """Whether a child may draw :class:`~orcasim.metrics.results.Results`: at most
    :data:`MAX_CHILD_ROWS` rows, none spilled to a file (which belongs to this process)."""
    from orcasim.metrics.request_table import num_rows
    from orcasim.metrics.row_spill import SpilledColumns

    columns = [v.columns for v in results.values()]
    return (not any(isinstance(c, SpilledColumns) for c in columns)
            and sum(num_rows(c) for c in columns) <= MAX_CHILD_ROWS)


class PlotProcess:
    """Jobs for the drawing functions of one module, run in a child process when it helps.

    Use as a context manager, created before the command's work::

        with PlotProcess("orcasim.replay.plots") as plotter:
            ...                                   # simulate
            plotter.draw("latency_cdfs", path, measured, predicted, title)
            plotter.send()                        # optional: the child starts drawing now
            ...                                   # write the other files meanwhile
            plotter.finish()                      # every file is written when it returns

    ``preload`` names modules the child imports while it waits, besides
    ``module`` and matplotlib: those that unpickling the jobs' arguments needs.
    """

    def __init__(self, module: str, *, preload: Sequence[str] = (),
                 child: bool | None = None) -> None:
        self.module = module
        self._jobs: list[tuple[str, tuple[Any, ...]]] = []
        self._sender: threading.Thread | None = None
        #: set by :meth:`finish`: whether the child drew the jobs (False: drawn here)
        self.drawn_in_child = False
        if child is None:
            child = ENABLED and worthwhile()
        self._proc = self._spawn([module, *preload]) if child else None

    @property
    def in_child(self) -> bool:
        """Whether a child process draws (else :meth:`finish` draws here)."""
        return self._proc is not None

    @staticmethod
    def _spawn(modules: list[str]) -> subprocess.Popen[bytes] | None:
        # in its own session: Ctrl-C at the terminal reaches the parent only, which ends it
        try:
            return subprocess.Popen([sys.executable, "-c", CHILD, _root(), *modules],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    start_new_session=True)
        except OSError:
            return None

    def draw(self, function: str, *args: Any) -> None:
        """Queue ``MODULE.<function>(*args)``; :meth:`finish` runs the queue."""
        if self._sender is not None:
            raise RuntimeError("draw() after send()")
        self._jobs.append((function, args))

    def send(self) -> None:
        """Hand the queued jobs to the child now (from a thread: the call does not wait)."""
        proc = self._proc
        if proc is None or self._sender is not None:
            return
        try:
            data = pickle.dumps(self._jobs, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # not picklable: drawn here
            self.close()
            return
        self._sender = threading.Thread(target=_write, args=(proc.stdin, data), daemon=True)
        self._sender.start()

    def finish(self) -> list[Any]:
        """Run the queued jobs (in the child, or here should it fail), wait for them, and
        return what each function returned."""
        self.send()
        proc, sender, self._proc, self._sender = self._proc, self._sender, None, None
        jobs, self._jobs = self._jobs, []
        if proc is not None and sender is not None:
            try:
                sender.join()
            except BaseException:  # Ctrl-C while waiting: end the child too
                _end(proc, sender)
                raise
            answer = _answer(proc)  # which ends the child in any case
            if isinstance(answer, list):
                self.drawn_in_child = True
                return answer
        return _run(self.module, jobs)

    def close(self) -> None:
        """End the child without drawing (on an error in the command)."""
        proc, sender, self._proc, self._sender = self._proc, self._sender, None, None
        if proc is not None:
            _end(proc, sender)

    def __enter__(self) -> PlotProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _write(stdin: IO[bytes], data: bytes) -> None:
    try:
        with stdin:
            stdin.write(data)
    except (OSError, ValueError):  # the child is gone: its answer says so
        pass


def _answer(proc: subprocess.Popen[bytes]) -> object:
    """The child's answer (a list of return values), or None when it failed."""
    try:
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait()
        return pickle.loads(out) if proc.returncode == 0 else None
    except Exception:  # anything at all: the parent draws instead
        return None
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[bytes], sender: threading.Thread | None = None) -> None:
    """Kill the child if it still runs, let the thread writing to it stop, close the pipes."""
    if proc.returncode is None:
        proc.kill()
        proc.wait()
    if sender is not None:
        sender.join()  # its write fails at once: nobody reads
    for f in (proc.stdin, proc.stdout):
        if f is not None and not f.closed:
            f.close()


def _run(module: str, jobs: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    import importlib

    mod = importlib.import_module(module)
    return [getattr(mod, function)(*args) for function, args in jobs]


def _root() -> str:
    """The directory holding this ``orcasim`` package."""
    return str(Path(orcasim.__file__).resolve().parent.parent)


#: the child's program: this orcasim first on its path (unless there already), then _child
CHILD = ("import sys; root = sys.argv[1]; root in sys.path or sys.path.insert(0, root); "
         "from orcasim.metrics.plot_process import _child; "
         "sys.exit(_child(root, sys.argv[2:], sys.stdin.buffer, sys.stdout.buffer))")


def _child(root: str, modules: list[str], stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """The child's work: import, wait for the jobs, draw them, answer."""
    import importlib

    try:
        if _root() != root:
            raise ImportError(f"found orcasim in {_root()}, not in {root}")
        from orcasim.metrics.plots import _pyplot

        _pyplot()
        for module in modules:
            importlib.import_module(module)
        jobs = pickle.load(stdin)
        answer: object = _run(modules[0], jobs)
    except Exception as err:  # reported to the parent, which draws itself
        answer = f"{type(err).__name__}: {err}"
    try:
        stdout.write(pickle.dumps(answer))
        stdout.flush()
    except OSError:  # the parent is gone
        return 1
    return 0
