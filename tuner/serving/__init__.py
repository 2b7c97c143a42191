"""Models after a sweep: the registry of versions and stages, laid out as TensorFlow Serving
reads it (:mod:`~tuner.serving.registry`), its ``models.config``
(:mod:`~tuner.serving.models_config`), and ``tunehub model serve``
(:mod:`~tuner.serving.server`)."""
