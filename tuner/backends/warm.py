"""Which trials start warm, and what their zygote preloads (see :mod:`tuner.backends.zygote`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tuner.backends.imports import entry_file, external_imports

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
    workdir: Path, argv: list[str], requested: str | tuple[str, ...] = "auto"
) -> tuple[str, ...]:
    """Modules worth importing ahead. ``requested`` is the spec's ``preload``: an explicit
    list, ``none``, or ``auto``: TensorFlow/Keras when the trial's code reaches them through
    its import graph (helper modules included), so sweeps that never touch TensorFlow don't
    pay for it and those that do never start cold by accident."""
    if requested == "none":
        return ALWAYS
    if not isinstance(requested, str):
        return (*ALWAYS, *requested)
    entry = entry_file(workdir, argv)
    reached = external_imports(entry, workdir) if entry is not None else set()
    heavy = tuple(m for m in HEAVY_MODULES if m in reached)
    extra = tuple(m for m in ("numpy", "sklearn") if heavy and m in reached)
    return (*ALWAYS, *heavy, *extra)
