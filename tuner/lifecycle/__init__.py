"""Every state change, and nothing else: sweep and trial states and every allowed change
between them, one table each (:mod:`~tuner.lifecycle.states`); the ledger, the one writer of
states (:mod:`~tuner.lifecycle.ledger`): it checks the change, commits the row and the counters,
then tells Optuna; and whether a sweep's controller is alive (:mod:`~tuner.lifecycle.liveness`)."""
