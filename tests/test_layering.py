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
HEAVY = ("optuna", "sqlalchemy", "tuner.api", "tuner.db", "tuner.search.study", "tuner.sweep_store")
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
        from tunehub_base.settings import load_settings
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
    """``tunehub_base/settings.py``'s promise: the state variables are read there (and by the trial
    SDK's ``data_dir``, which falls back to it), nowhere else."""
    from tunehub_base.settings import STATE_VARS

    readers: dict[str, set[str]] = {}
    for path in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "hub").rglob("*.py"),
                        *(REPO / "tunehub_base").rglob("*.py"), REPO / "jupyterhub_config.py"]):
        for name in _environment_reads(path) & set(STATE_VARS):
            readers.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert readers.pop("TUNEHUB_DATA") == {"tunehub_base/settings.py", "tuner/sdk/training.py"}
    assert readers == {name: {"tunehub_base/settings.py"} for name in STATE_VARS
                       if name != "TUNEHUB_DATA"}


# --- the floors and the arrows, read from the source -----------------------------------------

PACKAGES = ("tunehub_base", "hub", "tuner")


def _modules() -> dict[str, Path]:
    """Every module of our packages by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "migrations" in path.parts:  # Alembic's scripts, loaded by Alembic
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom,
              modules: dict[str, Path]) -> set[str]:
    """The dotted names an import statement names (``from a import b``: ``a.b`` when that is a
    module, else ``a``)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}


def _all_imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Everything the module imports anywhere: at module level, in functions, for types."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= _imported(module, path, node, modules)
    return names


def _load_time_imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """What importing the module imports: statements at module level (in ``if`` and ``try``
    too), not in functions, and not under ``if TYPE_CHECKING``."""
    names: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(_imported(module, path, node, modules))
            elif isinstance(node, ast.If):
                test = node.test
                if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                    walk(node.orelse)
                else:
                    walk(node.body)
                    walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                for handler in node.handlers:
                    walk(handler.body)
                walk(node.orelse)
                walk(node.finalbody)

    walk(ast.parse(path.read_text()).body)
    return names


def _ours(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours ``name`` is or lies in (``tuner.spec.SweepSpec`` -> ``tuner.spec``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_tuner_never_imports_the_hub() -> None:
    modules = _modules()
    found = sorted(
        f"{module} imports {name}"
        for module, path in modules.items() if _top(module) == "tuner"
        for name in _all_imports(module, path, modules) if _top(name) == "hub"
    )
    assert found == []


def test_the_floor_imports_neither_hub_nor_tuner() -> None:
    modules = _modules()
    assert any(_top(m) == "tunehub_base" for m in modules)
    found = sorted(
        f"{module} imports {name}"
        for module, path in modules.items() if _top(module) == "tunehub_base"
        for name in _all_imports(module, path, modules) if _top(name) in ("hub", "tuner")
    )
    assert found == []


def test_the_lifecycle_imports_nothing_that_schedules() -> None:
    """States and the ledger sit below scheduling: the controller, attempts and recovery
    call the ledger, never the other way round (no arrow back up)."""
    modules = _modules()
    assert any(m.startswith("tuner.lifecycle.") for m in modules)
    found = sorted(
        f"{module} imports {name}"
        for module, path in modules.items() if module.startswith("tuner.lifecycle.")
        for name in _all_imports(module, path, modules)
        if name.startswith(("tuner.scheduling", "tuner.backends", "tuner.api"))
    )
    assert found == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    """No module imports, at load time, one that imports it back (directly or around a
    circle). A submodule's implicit import of its own package is not an arrow."""
    modules = _modules()
    graph = {
        module: {dep for name in _load_time_imports(module, path, modules)
                 if (dep := _ours(name, modules)) is not None and dep != module}
        for module, path in modules.items()
    }
    # The check sees arrows at all: the controller's host imports the controller.
    assert "tuner.scheduling.controller" in graph["tuner.scheduling.host"]
    assert _cycles(graph) == []
    # And a circle, were there one, is found.
    assert _cycles({**graph, "tuner.scheduling.controller": {"tuner.scheduling.host"}})


def test_a_function_sweep_stored_before_the_sdk_package_still_runs(tmp_path: Path) -> None:
    """Sweeps submitted before ``tuner.sdk`` stored ``python -m tuner.run_function``; resuming
    one runs that command, so the old module name must still run the shipped function."""
    import cloudpickle

    out = tmp_path / "ran.json"

    def objective(params: dict[str, float]) -> float:
        out.write_text(json.dumps(params))
        return params["x"] * 2

    (tmp_path / "objective.pkl").write_bytes(cloudpickle.dumps(objective))
    env = {**os.environ, "TUNEHUB_PARAMS": json.dumps({"x": 0.25})}
    done = subprocess.run([sys.executable, "-m", "tuner.run_function", "objective.pkl"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"x": 0.25}
