"""The machine's administration tools (``useradd``, ``nft``, ``ip``, ``setfacl``) as root runs them.

Root's processes look for them in the system's own directories first and in ``PATH`` only after
them: a ``PATH`` set by hand (``env -i``, a service manager's, ``sudo`` without ``secure_path``)
often lacks ``/usr/sbin``, where Debian puts ``useradd`` and ``nft``, and a directory early in
``PATH`` that someone else can write must never decide which program root runs.
"""

from __future__ import annotations

import os
import shutil

#: Searched before ``PATH``, in this order; root-owned on any machine tunehub runs as root on.
SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def system_tool(name: str) -> str | None:
    """The path of the tool ``name``, or None where the machine has none."""
    return shutil.which(name, path=os.pathsep.join([*SYSTEM_DIRS, os.environ.get("PATH", "")]))


def system_argv(argv: list[str]) -> list[str]:
    """``argv`` with its program resolved by :func:`system_tool` (left as it is where there is
    none: running it then fails with ``FileNotFoundError``, which callers report)."""
    return [system_tool(argv[0]) or argv[0], *argv[1:]]
