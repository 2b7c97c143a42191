"""Optuna studies for sweeps: samplers, pruners and the shared RDB storage.

The study lives in tunehub's own database through Optuna's RDBStorage, so one backup holds both
and a resumed sweep finds every result it had.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import threading
import uuid

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.storages import RDBStorage
from sqlalchemy.exc import IntegrityError, ProgrammingError

from tuner.db.engine import engine_kwargs, tune_sqlite
from tuner.lifecycle.states import TrialState
from tuner.search.optuna_adapter import GridSampler, trial_for
from tuner.search.pruning import EnoughTrialsPruner, default_min_trials
from tuner.spec import OUR_PRUNER_OPTIONS, SpecError, SweepSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger("tunehub.study")


def check_sampler_available(spec: SweepSpec) -> None:
    """Optuna's GP sampler runs on PyTorch; say so at submission rather than mid-sweep."""
    if spec.sampler == "gp" and importlib.util.find_spec("torch") is None:
        raise SpecError("sampler", "gp needs PyTorch: pip install 'tunehub[gp]'")


def check_grid_size(spec: SweepSpec) -> None:
    if spec.sampler != "grid":
        return
    size = 1
    for values in spec.grid().values():
        size *= len(values)
    if spec.trials > size:
        raise SpecError("trials", f"the grid has {size} points; set trials to at most {size}")


def make_sampler(spec: SweepSpec) -> BaseSampler:
    seed = spec.seed
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "grid":
        return GridSampler(spec.grid(), seed=seed)
    if spec.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if spec.sampler == "gp":
        check_sampler_available(spec)
        return optuna.samplers.GPSampler(seed=seed)
    # With several trials in flight, TPE's constant liar keeps it from proposing the same
    # point to every free slot.
    return optuna.samplers.TPESampler(
        seed=seed, constant_liar=spec.parallelism > 1, multivariate=True,
        n_startup_trials=tpe_startup_trials(spec.trials),
    )


#: The least and the most random startup trials TPE gets (:func:`tpe_startup_trials`).
TPE_STARTUP = (5, 10)


def tpe_startup_trials(trials: int) -> int:
    """How many of a sweep's first trials TPE draws at random before it models the results:
    an eighth of the sweep, at least 5 and at most Optuna's own 10. Optuna's fixed 10 is a
    quarter of a 40-trial sweep spent on luck, and those trials are exactly random search's
    with the same seed; measured in ``benchmarks/search.py`` (README, "Search defaults")."""
    low, high = TPE_STARTUP
    return max(low, min(high, trials // 8))


def make_pruner(spec: SweepSpec) -> BasePruner:
    """Optuna's pruner for the spec, behind tunehub's two rules for small sweeps
    (:mod:`tuner.search.pruning`). A multi-objective sweep is never pruned: Optuna's pruners
    judge one objective (the spec refuses a pruner named with several metrics)."""
    if spec.multi_objective:
        return optuna.pruners.NopPruner()
    opts = {k: v for k, v in spec.pruner.options.items() if k not in OUR_PRUNER_OPTIONS}
    kind = spec.pruner.type
    inner: BasePruner
    if kind == "median":
        inner = optuna.pruners.MedianPruner(**opts)
    elif kind == "hyperband":
        inner = optuna.pruners.HyperbandPruner(**opts)
    elif kind == "asha":
        inner = optuna.pruners.SuccessiveHalvingPruner(**opts)
    else:
        return optuna.pruners.NopPruner()
    chosen = spec.pruner.options.get("min_trials")
    min_trials = chosen or default_min_trials(kind, opts)
    max_resource = opts.get("max_resource")
    last_step = int(max_resource) if isinstance(max_resource, int | float) else None
    auto = opts if not chosen and kind == "hyperband" and max_resource in (None, "auto") else None
    return EnoughTrialsPruner(inner, int(min_trials), last_step, auto)


#: Our finished trial states that Optuna has a state of its own for; any other is FAIL to it
#: (Optuna has no "cancelled"). Ours are :class:`tuner.lifecycle.states.TrialState`, Optuna's
#: :class:`optuna.trial.TrialState`: two different types that share a name.
OPTUNA_STATES = {TrialState.COMPLETED: optuna.trial.TrialState.COMPLETE,
                 TrialState.PRUNED: optuna.trial.TrialState.PRUNED}


def optuna_state(state: TrialState) -> optuna.trial.TrialState:
    """What Optuna is told for a trial that ended in our ``state``."""
    return OPTUNA_STATES.get(state, optuna.trial.TrialState.FAIL)


def our_state(state: optuna.trial.TrialState) -> TrialState:
    """Our state for a trial Optuna finished as ``state``."""
    return next((ours for ours, theirs in OPTUNA_STATES.items() if theirs == state),
                TrialState.FAILED)


#: The process's storages by URL, the most recently made last (at most 8 kept).
_STORAGES: dict[str, RDBStorage] = {}
_MAKING_STORAGE = threading.Lock()


def storage_for(url: str) -> RDBStorage:
    """One RDBStorage per database URL per process (it owns a connection pool), with our
    SQLite settings on its connections. Made once: the first calls of several threads (the
    first sweeps submitted at once) wait for the one that makes it, instead of each creating
    Optuna's schema and racing on it."""
    with _MAKING_STORAGE:
        storage = _STORAGES.get(url)
        if storage is None:
            storage = _STORAGES[url] = _new_storage(url)
            while len(_STORAGES) > 8:
                del _STORAGES[next(iter(_STORAGES))]
        return storage


def forget_storages() -> None:
    """Drop the storages made so far (tests that drop their database)."""
    with _MAKING_STORAGE:
        _STORAGES.clear()


def _new_storage(url: str) -> RDBStorage:
    try:
        storage = RDBStorage(url, engine_kwargs=engine_kwargs(url))
    except (IntegrityError, ProgrammingError):
        # Another process made Optuna's tables and types at the same moment (two tuners, or
        # the service and a CLI, starting on a new database): they are there now.
        storage = RDBStorage(url, engine_kwargs=engine_kwargs(url))
    tune_sqlite(storage.engine)
    return storage


#: The study's user attributes that say whose sweep it is and which: optuna-dashboard opened on
#: tunehub's database (or ``optuna.load_study(...).user_attrs``) shows them beside the results.
OWNER_ATTR, SWEEP_ID_ATTR, SWEEP_NAME_ATTR = "owner", "sweep_id", "sweep_name"
#: Room for a study name in the sweep row's ``study_name`` column.
STUDY_NAME_LENGTH = 128


def new_study_name(spec: SweepSpec, owner: str, request_key: str | None = None) -> str:
    """A unique study name a person can read in optuna-dashboard's list:
    ``<owner>/<sweep name>/<suffix>``.

    The suffix is random, or, for a submission named by an ``Idempotency-Key``, a digest of
    the owner, the key and the objectives' directions: the same request sent again (its first
    try lost the database between creating the study and committing the sweep) creates the
    study it created, which ``create_study`` loads, instead of leaving the first one behind
    unused. The directions are what a study keeps from its creation (``create_study`` would
    load a study of the other direction as it is), so a changed request under the same key
    gets a study of its own.

    The sweep's id cannot be in it: the study is created before the sweep's row (a controller
    may load the study as soon as the row exists), so the id becomes a user attribute later
    (:func:`record_sweep_id`). The name is never derived again: every lookup reads the sweep
    row's ``study_name`` column, so studies named ``tunehub-<hex>`` by earlier versions keep
    working as they are."""
    if request_key is None:
        suffix = uuid.uuid4().hex[:16]
    else:
        made = "\0".join([owner, request_key, *(o.direction for o in spec.objectives)])
        suffix = hashlib.sha256(made.encode()).hexdigest()[:16]
    room = STUDY_NAME_LENGTH - len(spec.name) - len(suffix) - 2
    return f"{owner[:room]}/{spec.name}/{suffix}"


def create_study(
    spec: SweepSpec, study_name: str, url: str, owner: str | None = None
) -> optuna.Study:
    """The sweep's study in tunehub's database, with ``owner`` and the sweep's name as user
    attributes when an owner is given."""
    study = optuna.create_study(
        study_name=study_name,
        storage=storage_for(url),
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
        directions=[o.direction for o in spec.objectives],
        load_if_exists=True,
    )
    if owner is not None:
        study.set_user_attr(OWNER_ATTR, owner)
        study.set_user_attr(SWEEP_NAME_ATTR, spec.name)
    return study


def record_sweep_id(study_name: str, url: str, sweep_id: int) -> bool:
    """Name the sweep a study belongs to, once the sweep's row exists; False if that failed.

    Best effort, by design: it runs after the sweep's row is committed (the id exists only
    then), so the sweep exists and a controller may already run it. A failure here (the
    database busy or gone for a moment) must not turn that submission into an error the
    notebook would retry, submitting the sweep twice; the attribute only labels the study
    for people reading it in optuna-dashboard, and tunehub never reads it back."""
    try:
        study = optuna.load_study(
            study_name=study_name, storage=storage_for(url),
            sampler=optuna.samplers.RandomSampler(),
        )
        study.set_user_attr(SWEEP_ID_ATTR, sweep_id)
    except Exception as exc:
        cause: BaseException = exc  # Optuna's StorageInternalError hides the database's reason
        while cause.__cause__ is not None:
            cause = cause.__cause__
        log.warning("sweep %s: could not record its id on study %r: %s", sweep_id, study_name,
                    str(cause).strip(), exc_info=True)
        return False
    return True


def complete_params(
    study: optuna.Study, trial_id: int, distributions: dict[str, BaseDistribution]
) -> dict[str, object]:
    """The parameters of a trial Optuna created but did not finish suggesting for (its
    controller died inside ``study.ask``): the missing ones are suggested now, the way
    ``ask`` would have, so the trial keeps its number and runs with a full set."""
    trial = trial_for(study, trial_id)
    for name, dist in distributions.items():
        if isinstance(dist, FloatDistribution):
            trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
        elif isinstance(dist, IntDistribution):
            trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        elif isinstance(dist, CategoricalDistribution):
            trial.suggest_categorical(name, dist.choices)
        else:
            raise TypeError(f"{name}: unsupported distribution {dist!r}")
    return dict(trial.params)
