#!/usr/bin/env python3
"""Trains an MLP on the MNIST-10k digits shipped with gpumux with JAX, as a sweep's external `command`.

    pip install "jax[cpu]"      # or "jax[cuda12]" on a GPU
    python3 examples/jax_train.py --lr 0.001 --batch-size 64 --epochs 3 --seed 1 --out-dir /tmp/t1

Plain JAX, no other library: a hand-written Adam. It holds out 20% of the digits (chosen by
--seed) as the test set, prints one JSON line per epoch, writes the weights and the metrics into
--out-dir, and prints the metrics as the last stdout line. Under gpumux it sets nothing itself:
gpumux gives it XLA_PYTHON_CLIENT_MEM_FRACTION on a GPU (XLA's allocator keeps to the slice's cap)
and, on the CPU, PJRT_NPROC (XLA's thread pools keep to the trial's share of the
cores). It reports what it saw: `threads` (GPUMUX_THREADS) and `os_threads`, the threads the
process holds after training.
"""

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

# Read before JAX starts, which reads the same variables: nothing here sets them.
SEEN = {k: os.environ.get(k) for k in ("GPUMUX_TRIAL", "GPUMUX_THREADS", "GPUMUX_MEM_CAP_MIB",
                                       "XLA_PYTHON_CLIENT_MEM_FRACTION", "PJRT_NPROC", "XLA_FLAGS")}

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "mnist-10k"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help="folder for params.npz and metrics.json")
    p.add_argument("--data", type=Path, default=DATA, help="folder with the two IDX .gz files")
    return p.parse_args(argv)


def read_idx(path):
    """The items of a gzipped IDX file as a uint8 array shaped by its header."""
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


def init(key, hidden):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (784, hidden)) * (2 / 784) ** 0.5, "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, 10)) * (1 / hidden) ** 0.5, "b2": jnp.zeros(10)}


def forward(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    logp = jax.nn.log_softmax(forward(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@jax.jit
def adam_step(params, m, v, t, x, y, lr):
    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
    scale = lr * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
    params = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), params, m, v)
    return params, m, v, loss


@jax.jit
def evaluate(params, x, y):
    logits = forward(params, x)
    logp = jax.nn.log_softmax(logits)
    loss = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return jnp.mean(jnp.argmax(logits, 1) == y), loss


def os_threads():
    """Threads of this process now (Linux), or 0."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main(argv):
    args = parse_args(argv)
    if not (args.lr > 0 and args.batch_size > 0 and args.epochs > 0 and args.hidden > 0):
        print("jax_train: --lr, --batch-size, --epochs and --hidden must be positive", file=sys.stderr)
        return 2
    print(f"jax_train: devices {jax.devices()}, saw {SEEN}", file=sys.stderr)
    seed = args.seed % 2**32  # gpumux's {seed} is 64-bit; JAX's PRNGKey takes an int64
    tx, ty, vx, vy = load(args.data, seed)
    params = init(jax.random.PRNGKey(seed), args.hidden)
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    rng, t, started = np.random.default_rng(seed + 1), 0, time.monotonic()
    steps = max(len(tx) // args.batch_size, 1)  # whole batches only: one compiled shape
    for epoch in range(1, args.epochs + 1):
        order, total = rng.permutation(len(tx)), 0.0
        for i in range(steps):
            idx = order[i * args.batch_size : (i + 1) * args.batch_size]
            t += 1
            params, m, v, loss = adam_step(params, m, v, t, tx[idx], ty[idx], args.lr)
            total += float(loss)
        acc, test_loss = evaluate(params, vx, vy)
        print(json.dumps({"epoch": epoch, "train_loss": total / steps, "test_acc": float(acc),
                          "test_loss": float(test_loss), "wall_s": time.monotonic() - started}), flush=True)
    metrics = {"test_acc": float(acc), "test_loss": float(test_loss), "final_loss": total / steps,
               "epochs": args.epochs, "wall_s": time.monotonic() - started,
               "threads": int(SEEN["GPUMUX_THREADS"] or 0), "os_threads": os_threads()}
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        np.savez(args.out_dir / "params.npz", **{k: np.asarray(p) for k, p in params.items()})
        (args.out_dir / "metrics.json").write_text(json.dumps({**metrics, "seed": args.seed, "env": SEEN}, indent=1) + "\n")
    print(json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
