"""The digits MLP trained data-parallel across the workers of a multi-worker trial.

``resources: {workers: 2}`` starts this script twice (two local processes, or two pods of an
Indexed Job); tunehub gives each its ``TF_CONFIG`` and ``MultiWorkerMirroredStrategy`` makes
them one training job: every batch is split between the workers and the gradients are summed
over the network (gRPC collectives). Both workers compute the same validation accuracy;
only the chief's reports count and only its export is kept (``tuner.is_chief()``).

A custom training loop rather than ``model.fit``: Keras 3's ``fit`` does not yet run under
``MultiWorkerMirroredStrategy`` (keras-team/keras#20585). Outside a sweep (no ``TF_CONFIG``)
it trains on one process: ``python train.py``.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import tuner  # noqa: E402

DEFAULTS = {
    "lr": 3e-3,
    "units": 64,
    "batch_size": 64,  # global: split across the workers
    "epochs": int(os.environ.get("DIGITS_EPOCHS", "8")),
}


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def main() -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    p = tuner.params(DEFAULTS)
    keras.utils.set_random_seed(0)  # the same initial weights on every worker
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    batch = int(p["batch_size"])
    x_train, x_val, y_train, y_val = load()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=0).batch(batch).with_options(options))
    val = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch).with_options(options))
    with strategy.scope():
        model = keras.Sequential([
            keras.Input(shape=(64,), name="pixels"),
            keras.layers.Dense(int(p["units"]), activation="relu"),
            keras.layers.Dense(10, activation="softmax", name="digit"),
        ])
        optimizer = keras.optimizers.Adam(learning_rate=float(p["lr"]))
    per_example = keras.losses.SparseCategoricalCrossentropy(reduction="none")

    @tf.function
    def train_step(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    per_example(y, model(x, training=True)), global_batch_size=batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss
        return strategy.reduce("SUM", strategy.run(step, (x, y)), axis=None)

    @tf.function
    def eval_step(x, y):
        def step(x, y):
            hits = tf.equal(tf.argmax(model(x, training=False), -1), tf.cast(y, tf.int64))
            return tf.reduce_sum(tf.cast(hits, tf.float32)), tf.cast(tf.size(hits), tf.float32)
        right, seen = strategy.run(step, (x, y))
        return strategy.reduce("SUM", right, axis=None), strategy.reduce("SUM", seen, axis=None)

    accuracy = 0.0
    for epoch in range(1, int(p["epochs"]) + 1):
        for x, y in train:
            train_step(x, y)
        right = seen = 0.0
        for x, y in val:
            r, s = eval_step(x, y)
            right, seen = right + float(r), seen + float(s)
        accuracy = right / seen  # over the whole validation set: every worker's shard
        tuner.report(accuracy, step=epoch)
    tuner.save_model(model)
    peers = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker")
    print(f"worker replicas={strategy.num_replicas_in_sync} val_accuracy={accuracy:.4f} "
          f"chief={tuner.is_chief()} cluster={json.dumps(peers)} params={p}")


if __name__ == "__main__":
    main()
