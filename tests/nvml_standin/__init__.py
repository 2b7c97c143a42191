"""The NVML stand-in (``nvml_standin.c``): built with gcc as ``libnvidia-ml.so.1`` for a test
session, loaded by the real ``nvidia-ml-py`` in the processes a test starts (its directory on
``LD_LIBRARY_PATH``: the dynamic loader reads that when a process starts, so it is never this
test process that loads it), its figures written by the test and read again on every NVML call.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("nvml_standin.c")
GiB = 2**30
#: NVML's return codes the tests make the stand-in answer.
GPU_IS_LOST = 15
DRIVER_NOT_LOADED = 9


def build(directory: Path) -> Path:
    """Compile the stand-in into ``directory`` as ``libnvidia-ml.so.1``."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc builds the NVML stand-in"
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library),
                    str(SOURCE)], check=True, capture_output=True, text=True)
    return library


@dataclass
class StandIn:
    """One test's figures file, and the environment that makes a process load the stand-in
    and read them."""

    library_dir: Path
    figures: Path

    @property
    def env(self) -> dict[str, str]:
        path = os.environ.get("LD_LIBRARY_PATH")
        return {"LD_LIBRARY_PATH": f"{self.library_dir}{os.pathsep + path if path else ''}",
                "NVML_STANDIN_FIGURES": str(self.figures)}

    def set(self, *gpus: dict[str, Any], init_error: int | None = None) -> None:
        """Say what each GPU does now (``util``, ``mem_used``, ``mem_total``, ``pids``,
        ``error``, ``name``, ``uuid``): replaced whole, so a reader never sees half of it."""
        lines = [f"init_error={init_error}"] if init_error is not None else []
        for gpu in gpus:
            words = [f"{key}={_word(value)}" for key, value in gpu.items()]
            lines.append(" ".join(["gpu", *words]))
        tmp = self.figures.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.figures)


def _word(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def idle_gpu(**extra: Any) -> dict[str, Any]:
    return {"util": 0, "mem_used": 0, "mem_total": 16 * GiB, **extra}
