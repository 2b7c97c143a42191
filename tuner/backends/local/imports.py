"""What a trial's code imports, read from the code snapshot without running it.

Warm starts preload the installed packages a trial imports (TensorFlow, scikit-learn, NumPy, …)
in a process that trials fork from. A trial that imports one through a helper module
(``from model import build``) must still start warm, so the decision follows the import graph of
the snapshot: from the entry script through every module of the snapshot it imports, collecting
the modules outside it (:mod:`tuner.backends.local.installed` keeps the installed ones).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tuner.backends.local.owned_files import read_owned

# A snapshot with more modules than this is not walked further (the imports found so far count).
MAX_MODULES = 500
# A module bigger than this is not parsed (no helper module is; generated data files may be).
MAX_SOURCE_BYTES = 2 * 2**20


def local_module(root: Path, dotted: str) -> Path | None:
    """The file of ``dotted`` inside the snapshot (``a.b`` -> ``a/b.py`` or
    ``a/b/__init__.py``), or None for a module that is not part of the snapshot."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(root: Path, path: Path) -> list[str]:
    """The dotted package a module file lives in, relative to the snapshot root."""
    try:
        rel = path.parent.resolve().relative_to(root.resolve())
    except ValueError:
        return []
    return [part for part in rel.parts if part]


def _imports_of(path: Path, root: Path, owner_uid: int | None) -> list[str]:
    """Absolute dotted names imported by one file (relative imports resolved); nothing for a
    file that is not the snapshot owner's (:func:`tuner.backends.local.owned_files.read_owned`)."""
    source = read_owned(path, owner_uid, MAX_SOURCE_BYTES)
    if source is None:
        return []
    try:
        tree = ast.parse(source.decode(errors="replace"), filename=str(path))
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(root, path)
                package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                prefix = ".".join([*package, node.module] if node.module else package)
            else:
                prefix = node.module or ""
            if not prefix:
                names.extend(alias.name for alias in node.names)
                continue
            names.append(prefix)
            # ``from pkg import mod`` may name a submodule of the snapshot.
            names.extend(f"{prefix}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def external_modules(entry: Path, root: Path, owner_uid: int | None = None) -> set[str]:
    """Dotted names of the modules outside the snapshot that ``entry`` reaches (``sklearn``,
    ``sklearn.ensemble``, and names that may turn out not to be modules:
    ``sklearn.ensemble.RandomForestClassifier``), reading only files owned by ``owner_uid``, the
    snapshot's owner (default: this process's user)."""
    found: set[str] = set()
    seen: set[Path] = set()
    todo = [entry]
    while todo and len(seen) < MAX_MODULES:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for dotted in _imports_of(path, root, owner_uid):
            local = local_module(root, dotted)
            if local is not None:
                todo.append(local)
                # Importing ``a.b`` runs ``a/__init__.py`` first.
                parent = dotted.rsplit(".", 1)[0]
                if "." in dotted and (init := local_module(root, parent)) is not None:
                    todo.append(init)
            elif local_module(root, dotted.split(".")[0]) is None:
                found.add(dotted)
    return found


def external_imports(entry: Path, root: Path, owner_uid: int | None = None) -> set[str]:
    """Top-level names of the packages outside the snapshot that ``entry`` reaches
    (:func:`external_modules`)."""
    return {name.split(".")[0] for name in external_modules(entry, root, owner_uid)}


def entry_file(workdir: Path, argv: list[str]) -> Path | None:
    """The file a ``python script.py`` / ``python -m module`` trial starts in."""
    if not argv:
        return None
    if argv[0] == "-m":
        return local_module(workdir, argv[1]) if len(argv) > 1 else None
    path = workdir / argv[0]
    return path if path.is_file() else None
