"""What people's code imports: inside a trial (:mod:`~tuner.sdk.training`: ``tuner.params``,
``tuner.report``, ``tuner.save_model``, ``tuner.Pruned``; checkpoints,
:mod:`~tuner.sdk.checkpoints`: ``tuner.checkpoint``, ``tuner.restore``; the Keras callback,
:mod:`~tuner.sdk.keras`), in a notebook (:mod:`~tuner.sdk.client`: ``tuner.Sweep``), and the
command a function sweep's trials run (:mod:`~tuner.sdk.run_function`). Public names are
re-exported from :mod:`tuner`; everything here stays light (no Optuna, no SQLAlchemy)."""
