"""Which trials start warm, and what their zygote preloads (see
:mod:`tuner.backends.local.zygote`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tuner.backends.local.imports import entry_file, external_modules, local_module
from tuner.backends.local.installed import preloadable
from tuner.backends.local.pickled_imports import MACHINERY, pickled_imports
from tuner.sdk import run_function

HEAVY_MODULES = ("tensorflow", "keras")
ALWAYS = ("tuner",)
# What :mod:`tuner.sdk.run_function` imports to load a function sweep's pickle, in every trial.
FUNCTION_RUNNER = ("cloudpickle",)
MAX_PRELOAD = 64  # modules a warm process preloads at most (the zygote's argv, its key)


def warm_argv(argv: list[str], python: str) -> list[str] | None:
    """``["python", "train.py", ...]`` or ``["python", "-m", "mod", ...]`` run in this
    interpreter can start warm; anything else (another program, flags) starts cold."""
    if len(argv) < 2:
        return None
    exe = argv[0]
    names = {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}
    if exe not in names and os.path.realpath(exe) != os.path.realpath(python):
        return None
    if argv[1] == "-m" and len(argv) >= 3:
        return argv[1:]
    if argv[1].startswith("-"):
        return None
    return argv[1:]


def preload_for(
    workdir: Path, argv: list[str], requested: str | tuple[str, ...] = "auto",
    owner_uid: int | None = None,
) -> tuple[str, ...]:
    """Modules worth importing ahead. ``requested`` is the spec's ``preload``: an explicit
    list, ``none``, or ``auto``: the modules of installed packages the trial's code reaches
    through its import graph (helper modules included; ``sklearn.ensemble``, not only
    ``sklearn``, whose ``__init__`` alone imports little), so a trial forked from the warm
    process imports none of them again; what it still imports is measured at its end
    (:mod:`tuner.backends.local.zygote_process`). A function sweep's trials run
    :mod:`tuner.sdk.run_function`: its modules come from the pickled function
    (:func:`function_preload`). Only files of the snapshot's owner ``owner_uid`` are read
    (default: this process's user; :mod:`tuner.backends.local.owned_files` says why)."""
    if requested == "none":
        return ALWAYS
    if not isinstance(requested, str):
        return (*ALWAYS, *requested)
    if len(argv) == 3 and argv[:2] == ["-m", run_function.__name__]:
        return (*ALWAYS, *FUNCTION_RUNNER, *function_preload(workdir, workdir / argv[2],
                                                            owner_uid))
    entry = entry_file(workdir, argv)
    reached = external_modules(entry, workdir, owner_uid) if entry is not None else set()
    return (*ALWAYS, *_heavy_first(preloadable(reached)))


def _heavy_first(modules: list[str]) -> tuple[str, ...]:
    """TensorFlow and Keras first (a later import finds what they bring in), the rest sorted:
    the same modules always make the same list, so trials share one warm process."""
    heavy = [m for m in modules if m.split(".")[0] in HEAVY_MODULES]
    heavy.sort(key=lambda m: (HEAVY_MODULES.index(m.split(".")[0]), m))
    return (*heavy, *sorted(set(modules) - set(heavy))[:MAX_PRELOAD - len(heavy)])


def function_preload(
    workdir: Path, pickled: Path, owner_uid: int | None = None
) -> tuple[str, ...]:
    """The installed packages a pickled function imports
    (:mod:`tuner.backends.local.pickled_imports`), TensorFlow/Keras first. The standard library
    (cheap, and mostly imported already), the snapshot's own modules and what is not installed
    (:mod:`tuner.backends.local.installed`) are left out."""
    found = {
        m for m in pickled_imports(pickled, owner_uid)
        if m not in MACHINERY and local_module(workdir, m) is None
    }
    return _heavy_first(preloadable(found))
