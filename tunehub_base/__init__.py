"""The floor both ``hub`` and ``tuner`` stand on, and that imports neither.

What the hub and the tuner must agree on without one loading the other: where state lives
(:mod:`~tunehub_base.settings`), the table of every setting (:mod:`~tunehub_base.options`), the
Unix users people's processes run as (:mod:`~tunehub_base.unix_users`), the machine's GPUs and
who holds them (:mod:`~tunehub_base.gpus`), the GPU names Kubernetes knows them by
(:mod:`~tunehub_base.gpu_names`) and the tuner's scope names (:mod:`~tunehub_base.scopes`).
``tests/test_layering.py`` keeps it a floor: nothing here imports ``hub`` or ``tuner``.
"""
