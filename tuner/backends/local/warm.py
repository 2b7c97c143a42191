"""Which trials start warm, and what their zygote preloads (see
:mod:`tuner.backends.local.zygote`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tuner.backends.local.imports import entry_file, external_imports, local_module
from tuner.backends.local.pickled_imports import MACHINERY, pickled_imports
from tuner.sdk import run_function

HEAVY_MODULES = ("tensorflow", "keras")
ALWAYS = ("tuner",)


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
    list, ``none``, or ``auto``: TensorFlow/Keras when the trial's code reaches them through
    its import graph (helper modules included), so sweeps that never touch TensorFlow don't
    pay for it and those that do never start cold by accident. A function sweep's trials run
    :mod:`tuner.sdk.run_function`: its modules come from the pickled function
    (:func:`function_preload`). Only files of the snapshot's owner ``owner_uid`` are read
    (default: this process's user; :mod:`tuner.backends.local.owned_files` says why)."""
    if requested == "none":
        return ALWAYS
    if not isinstance(requested, str):
        return (*ALWAYS, *requested)
    if len(argv) == 3 and argv[:2] == ["-m", run_function.__name__]:
        return (*ALWAYS, *function_preload(workdir, workdir / argv[2], owner_uid))
    entry = entry_file(workdir, argv)
    reached = external_imports(entry, workdir, owner_uid) if entry is not None else set()
    heavy = tuple(m for m in HEAVY_MODULES if m in reached)
    extra = tuple(m for m in ("numpy", "sklearn") if heavy and m in reached)
    return (*ALWAYS, *heavy, *extra)


def function_preload(
    workdir: Path, pickled: Path, owner_uid: int | None = None
) -> tuple[str, ...]:
    """The installed packages a pickled function imports
    (:mod:`tuner.backends.local.pickled_imports`),
    TensorFlow/Keras first. All of them, not only the heavy ones as for a script: loading the
    pickle imports them in every trial anyway (a script's import graph also holds imports its
    run may never reach), so importing them once ahead only saves time. The standard library
    (cheap, and mostly imported already) and the snapshot's own modules are left out."""
    found = {
        m for m in pickled_imports(pickled, owner_uid)
        if m not in sys.stdlib_module_names and m not in MACHINERY and m not in ALWAYS
        and local_module(workdir, m) is None
    }
    heavy = [m for m in HEAVY_MODULES if m in found]
    return (*heavy, *sorted(found - set(heavy)))
