"""Trials as processes on this machine (:mod:`~tuner.backends.local.backend`): how they are
started and stopped (:mod:`~tuner.backends.local.processes`, ``multiworker``),
how their output reaches the log (:mod:`~tuner.backends.local.log_pipes`),
run as their owner (:mod:`~tuner.backends.local.ownership`, ``owned_files``), and their warm
starts: which trials start warm and what they preload (:mod:`~tuner.backends.local.warm`,
``imports``, ``pickled_imports``), the process that forks them
(:mod:`~tuner.backends.local.zygote_process`) and the backend's handle on it
(:mod:`~tuner.backends.local.zygote`)."""

from tuner.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
