"""Optuna's side: studies, samplers and pruners (:mod:`~tuner.search.study`,
:mod:`~tuner.search.pruning`), the study a controller keeps in memory
(:mod:`~tuner.search.mirror`), the bounded views TPE and the pruners read
(:mod:`~tuner.search.sampling_view`), which of two values is better
(:mod:`~tuner.search.ranking`), and the one module that uses Optuna below its public API
(:mod:`~tuner.search.optuna_adapter`, pinned by ``tests/test_optuna_adapter.py``)."""
