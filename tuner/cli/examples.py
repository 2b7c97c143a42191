"""The examples the README names, put into the data store on first start.

``tunehub up`` seeds ``examples/<name>`` of this checkout into ``$TUNEHUB_DATA/examples/<name>``,
so the README's notebook cell finds ``examples/digits/sweep.yaml`` there with no variable set.
Each example is seeded once: the names seeded are remembered in the home, so an example a person
changed is never overwritten and one they deleted does not come back. The copies are the
platform's (as root: root's, 0755/0644, inside the sticky data store), readable by every account
and replaceable by none; people copy one into their own area to change it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tunehub_base.settings import Settings

#: The examples of this checkout (``tunehub demo`` runs ``digits`` from here too).
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEEDED_FILE = "examples-seeded.json"


def seed_examples(settings: Settings, source: Path = EXAMPLES) -> list[str]:
    """Copy the examples not seeded before; returns the names copied now."""
    if not source.is_dir():
        return []
    record = settings.home / SEEDED_FILE
    try:
        seeded = set(json.loads(record.read_text()))
    except (OSError, ValueError):
        seeded = set()
    copied = []
    for example in sorted(p for p in source.iterdir() if p.is_dir()):
        target = settings.examples_dir / example.name
        if example.name in seeded or target.exists():
            seeded.add(example.name)
            continue
        settings.examples_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(settings.examples_dir, 0o755)
        shutil.copytree(example, target, symlinks=False,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _readable_by_all(target)
        seeded.add(example.name)
        copied.append(example.name)
    record.write_text(json.dumps(sorted(seeded)))
    return copied


def _readable_by_all(root: Path) -> None:
    """Directories 0755, files 0644, whatever umask the copy ran under."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
