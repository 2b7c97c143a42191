"""A Keras MLP on scikit-learn's bundled digits data (8x8 images, no download).

Runs as a tunehub trial (parameters from the sweep, validation accuracy reported every epoch,
pruned when the pruner says so, the model exported for serving) and as a plain script:
``python train.py`` trains with the defaults, for debugging.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import tuner  # noqa: E402

DEFAULTS = {
    "lr": 1e-3,
    "units": 64,
    "layers": 1,
    "dropout": 0.1,
    "batch_size": 32,
    "epochs": int(os.environ.get("DIGITS_EPOCHS", "12")),
}


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")  # pixel intensities are 0..16
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def build(p: dict) -> keras.Model:
    layers = [keras.Input(shape=(64,), name="pixels")]
    for _ in range(int(p["layers"])):
        layers.append(keras.layers.Dense(int(p["units"]), activation="relu"))
        layers.append(keras.layers.Dropout(float(p["dropout"])))
    layers.append(keras.layers.Dense(10, activation="softmax", name="digit"))
    model = keras.Sequential(layers)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=float(p["lr"])),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    # Two trials share this machine's cores: one thread each trains faster than contending.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    p = tuner.params(DEFAULTS)
    keras.utils.set_random_seed(0)
    x_train, x_val, y_train, y_val = load()
    model = build(p)
    history = model.fit(
        x_train,
        y_train,
        validation_data=(x_val, y_val),
        epochs=int(p["epochs"]),
        batch_size=int(p["batch_size"]),
        verbose=0,
        callbacks=[tuner.keras.ReportCallback(metric="val_accuracy")],
    )
    tuner.save_model(model)
    # Empty when a retried attempt found every epoch in its checkpoint (README: Checkpoints).
    for value in history.history.get("val_accuracy", [])[-1:]:
        print(f"val_accuracy={value:.4f} params={p}")


if __name__ == "__main__":
    main()
