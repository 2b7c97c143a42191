"""Deciding what runs when: the host of a process's sweep controllers, which routes reports and
backend events to them (:mod:`~tuner.scheduling.host`); the controller, which decides when to
ask, launch, retry and stop (:mod:`~tuner.scheduling.controller`), and the attempts it has out
(:mod:`~tuner.scheduling.attempts`); picking a sweep up after its controller died
(:mod:`~tuner.scheduling.recovery`); what an attempt is launched with: files and log headers
(:mod:`~tuner.scheduling.workdirs`), token and environment (:mod:`~tuner.scheduling.trial_env`);
and the model at a sweep's end (:mod:`~tuner.scheduling.promotion`)."""
