"""The examples the README names reach the data store on first start, once, readable by all."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from tunehub_base.settings import load_settings
from tuner.cli.examples import EXAMPLES, seed_examples


def test_examples_are_seeded_once_and_never_overwritten(tmp_path: Path) -> None:
    settings = load_settings({"TUNEHUB_HOME": str(tmp_path / "home")}).ensure_dirs()
    names = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())
    assert "digits" in names

    assert seed_examples(settings) == names
    digits = settings.examples_dir / "digits"
    assert (digits / "sweep.yaml").read_bytes() == (EXAMPLES / "digits" / "sweep.yaml").read_bytes()
    for path in [settings.examples_dir, *settings.examples_dir.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))

    # A person's change stays; an example they deleted does not come back.
    (digits / "sweep.yaml").write_text("name: mine\n")
    shutil.rmtree(settings.examples_dir / names[-1])
    assert seed_examples(settings) == []
    assert (digits / "sweep.yaml").read_text() == "name: mine\n"
    assert not (settings.examples_dir / names[-1]).exists()
