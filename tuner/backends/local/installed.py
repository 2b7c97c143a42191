"""Which modules are installed packages of the interpreter, told without importing them.

A warm-start process (:mod:`tuner.backends.local.zygote_process`) is shared by all of one
person's trials of a sweep and runs outside any attempt's cgroup and network island, so it
imports nothing of the person's: only packages installed in the interpreter's own package
directories (``site-packages``; where tunehub runs as root, nobody else can write there). Their
own snapshot, a ``pip install --user`` directory, ``PYTHONPATH`` and the working directory are
not installed packages here: a trial imports from those itself, after the fork, in its cgroup.

The same test decides what a trial is said to have paid for after its fork
(:mod:`tuner.backends.local.import_clock`): installed packages only, since the person's own
modules are never preloaded and the standard library is cheap and mostly imported already.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from functools import cache
from importlib.machinery import PathFinder
from pathlib import Path

#: Imported by tunehub's own code, not the person's: preloaded as they are, never reported.
PLATFORM = frozenset({"tuner", "tunehub_base", "hub"})

#: Installed packages a warm process never preloads, because a process that imported them
#: cannot fork safely: ``mpi4py`` calls ``MPI_Init`` at import (MPI implementations do not
#: support a fork after it); ``pycuda.autoinit`` creates a CUDA context (CUDA does not survive
#: a fork). A trial importing them pays for it after the fork and is reported so.
FORK_UNSAFE = ("mpi4py", "pycuda.autoinit", "pycuda.gl.autoinit")

@cache
def package_dirs() -> tuple[str, ...]:
    """The interpreter's own package directories (the virtual environment's or the system's
    ``site-packages``), without the per-user one."""
    paths = sysconfig.get_paths()
    found = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    user = site.getusersitepackages() if site.ENABLE_USER_SITE is not False else None
    return tuple(sorted(os.path.realpath(d) for d in found if d and d != user))


@cache
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib"))


def _under(path: str, dirs: Iterable[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d + os.sep) for d in dirs)


def trusted_path(path: list[str], platform_root: str | None = None) -> list[str]:
    """The entries of ``sys.path`` a warm process may import from: the standard library's and
    the installed packages' (and ``platform_root``, where the ``tuner`` package itself comes
    from), never the working directory, the user's site or ``PYTHONPATH``'s other entries."""
    allowed = (*package_dirs(), *_stdlib_dirs(), *([platform_root] if platform_root else []))
    return [p for p in path if p and p != os.curdir and _under(p, allowed)]


def is_installed(dotted: str) -> bool:
    """Whether the top-level package of ``dotted`` is in :func:`package_dirs` (found by the
    path finder over those directories alone: nothing is imported or run)."""
    top = dotted.split(".")[0]
    if not top.isidentifier() or top in sys.stdlib_module_names:
        return False
    try:
        return PathFinder.find_spec(top, list(package_dirs())) is not None
    except (ImportError, ValueError, OSError):
        return False


def installed_module(dotted: str) -> str | None:
    """The longest leading part of ``dotted`` that is a module file of an installed package:
    ``sklearn.ensemble.RandomForestClassifier`` -> ``sklearn.ensemble`` (the class is no
    module), ``tensorflow.keras`` -> ``tensorflow`` (a name made at import time). Read from the
    file system only; None when the package is not installed."""
    parts = dotted.split(".")
    if not is_installed(parts[0]):
        return None
    spec = PathFinder.find_spec(parts[0], list(package_dirs()))
    if spec is None or not spec.submodule_search_locations:
        return parts[0]
    roots = [Path(p) for p in spec.submodule_search_locations]
    depth = 1
    for i in range(1, len(parts)):
        if not parts[i].isidentifier():
            break
        rel = Path(*parts[1:i + 1])
        if not any((r / rel).with_suffix(".py").is_file() or (r / rel / "__init__.py").is_file()
                   or any(r.glob(f"{rel}.*.so")) for r in roots):
            break
        depth = i + 1
    return ".".join(parts[:depth])


def preloadable(names: Iterable[str]) -> list[str]:
    """Of the dotted module names a trial's code imports, those a warm process preloads: the
    modules of installed packages (:func:`installed_module`), without the standard library,
    tunehub's own, and :data:`FORK_UNSAFE`; a name implied by another (``sklearn`` by
    ``sklearn.ensemble``) is left out."""
    found: set[str] = set()
    for name in names:
        top = name.split(".")[0]
        if top in PLATFORM:
            continue
        module = installed_module(name)
        if module is None or any(module == bad or module.startswith(bad + ".")
                                 for bad in FORK_UNSAFE):
            continue
        found.add(module)
    return sorted(m for m in found if not any(o.startswith(m + ".") for o in found))
