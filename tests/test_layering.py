"""What each side imports: the hub's scope configuration and the notebook client stay light.

Each check runs in a fresh interpreter (the test process has long imported everything) and
reads ``sys.modules`` there; each also imports something that must pull the heavy module in,
so a check that could never fail is caught too.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.service_fixtures import running_tuner_hub

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("optuna", "sqlalchemy", "tuner.api", "tuner.db", "tuner.study", "tuner.sweeps")
READ_SUBMIT = ["custom:tuner:read", "custom:tuner:submit", "access:services!service=tuner"]

#: Prints which of HEAVY are loaded, as JSON, under a label (``loaded("after import")``).
PRELUDE = f"""
import json, sys
def loaded(label):
    print(json.dumps([label, [m for m in {HEAVY!r} if m in sys.modules]]), flush=True)
"""


def _run(code: str, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Run ``code`` after :data:`PRELUDE` in a fresh interpreter; what each ``loaded`` saw."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True, text=True, env=full_env, cwd=REPO, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]
    return {label: modules for label, modules in lines}


def test_hub_does_not_load_the_tuner_api() -> None:
    """The scopes and the service configured, then every module of ``hub/`` imported (some
    import JupyterHub's handlers, and with them JupyterHub's own SQLAlchemy)."""
    seen = _run("""
        import importlib, pkgutil
        from traitlets.config import Config
        import hub.scopes, hub.tuner_service
        from tuner.settings import load_settings
        c = Config()
        hub.scopes.configure(c, "tuner", ["admin"])
        settings = load_settings()
        hub.tuner_service.service_definition(
            "http://127.0.0.1:9999", hub.tuner_service.service_environment(settings)
        )
        loaded("scopes")
        import hub
        for module in pkgutil.iter_modules(hub.__path__):
            importlib.import_module(f"hub.{module.name}")
        loaded("hub")
        import tuner.api.auth
        loaded("api")
    """)
    assert seen["scopes"] == []
    assert seen["hub"] in ([], ["sqlalchemy"])
    assert {"tuner.api", "sqlalchemy", "optuna"} <= set(seen["api"])


def test_notebook_client_loads_optuna_only_for_a_plot(tmp_path: Path) -> None:
    """A whole session against a real hub and service: submit a function sweep, watch it,
    read its trials and best trial; Optuna and SQLAlchemy arrive with the plot, not before."""
    with running_tuner_hub(tmp_path, f"sqlite:///{tmp_path / 'tunehub.sqlite'}") as hub:
        env = {
            "TUNEHUB_API_URL": hub.url + "services/tuner/",
            "JUPYTERHUB_API_TOKEN": hub.token("erin", READ_SUBMIT),
        }
        seen = _run("""
            import tuner
            loaded("import")
            def objective(params):
                return params["x"]
            sweep = tuner.Sweep.submit(
                name="light", metric="score", trials=2, parallelism=1, seed=1,
                space={"x": {"type": "float", "low": 0.0, "high": 1.0}}, function=objective,
            )
            sweep.watch(interval=0.2, timeout=120)
            assert sweep.state == "completed", sweep.info
            assert len(sweep.trials()) == 2 and sweep.best is not None
            loaded("session")
            figures = sweep.plot()
            assert figures["history"].data
            loaded("plot")
        """, env)
    assert seen["import"] == []
    assert seen["session"] == []
    assert "optuna" in seen["plot"]


def _environment_reads(path: Path) -> set[str]:
    """The ``TUNEHUB_*`` names a module reads from a mapping (``env.get(X)``,
    ``os.environ[X]``, ``os.getenv(X)``, ``environ.pop(X)``), literally or through a constant of
    its own (``ENV_DATA = "TUNEHUB_DATA"``)."""
    tree = ast.parse(path.read_text())
    constants = {
        target.id: node.value.value
        for node in tree.body if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets if isinstance(target, ast.Name)
    }

    def name_of(key: ast.expr) -> str | None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return constants.get(key.id) if isinstance(key, ast.Name) else None

    keys: list[ast.expr] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "getenv", "pop") and node.args):
            keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            keys.append(node.slice)
    return {n for n in map(name_of, keys) if n and n.startswith("TUNEHUB_")}


def test_only_settings_reads_where_state_lives() -> None:
    """``tuner/settings.py``'s promise: the state variables are read there (and by the trial
    SDK's ``data_dir``, which falls back to it), nowhere else."""
    from tuner.settings import STATE_VARS

    readers: dict[str, set[str]] = {}
    for path in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "hub").rglob("*.py"),
                        REPO / "jupyterhub_config.py"]):
        for name in _environment_reads(path) & set(STATE_VARS):
            readers.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert readers.pop("TUNEHUB_DATA") == {"tuner/settings.py", "tuner/trial.py"}
    assert readers == {name: {"tuner/settings.py"} for name in STATE_VARS
                       if name != "TUNEHUB_DATA"}
