"""Bounded process groups on one machine, cgroup v1 or v2 behind one base class: a trial's
attempt (:mod:`tuner.backends.local.cgroups`) and a notebook server (:mod:`hub.server_limits`)
get one each."""
