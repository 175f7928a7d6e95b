#!/usr/bin/env python3
"""Synthetic objectives for the search benchmarks (standard library only), one trial a call.

    python3 bench/objectives.py branin --x1 2.5 --x2 7.5
    python3 bench/objectives.py hartmann6 --x1 .2 --x2 .15 --x3 .48 --x4 .28 --x5 .31 --x6 .66
    python3 bench/objectives.py mixed --lr 0.01 --optimizer sgd --layers 6
    python3 bench/objectives.py mixed-fail ...   (mixed, but every rmsprop trial fails: exit 1)

prints one result line, {"value": f}, to be minimised. OBJECTIVES below holds each one's space
(in W&B's sweep vocabulary) and its minimum, for gpumux's jobs and Optuna's studies alike.

- branin: the Branin function over x1 in [-5, 10], x2 in [0, 15]; minimum 0.397887.
- hartmann6: the six-dimensional Hartmann function over [0, 1]^6; minimum -3.32237.
- mixed: a training-like space: a log learning rate in [1e-5, 1], an optimizer among sgd, adam
  and rmsprop, and an integer layers in [1, 8]. Each optimizer has its own bowl in the learning
  rate's decades and its own best layers; adam's is broad and shallow (easy to find, 0.08 above
  the minimum), sgd's narrow and deep (the minimum, 0, at lr 0.1 and 6 layers), rmsprop's
  between. A search that settles on adam early has settled on the wrong value.
- mnist: a real training, gpumux's built-in MLP (784-128-10) on MNIST-10k for MNIST_EPOCHS
  (default 3) epochs on the CPU backend, over a log learning rate, the optimizer, the batch size
  and the momentum; the value is the test error (1 - test accuracy). gpumux's sweeps train it
  in-process; here (for a peer's study) each call runs `$GPUMUX train` with the point's flags.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys

from branin import branin

_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
_P = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
]
_ALPHA = [1.0, 1.2, 3.0, 3.2]


def hartmann6(xs):
    return -sum(
        a * math.exp(-sum(_A[i][j] * (xs[j] - _P[i][j]) ** 2 for j in range(6))) for i, a in enumerate(_ALPHA)
    )


# Per optimizer: the best lr's decade, the bowl's width in decades, its floor, the best layers.
_BOWLS = {"sgd": (-1.0, 0.3, 0.0, 6), "adam": (-3.3, 1.2, 0.08, 3), "rmsprop": (-2.5, 0.6, 0.05, 4)}


def mixed(lr, optimizer, layers):
    centre, width, floor, best_layers = _BOWLS[optimizer]
    d = (math.log10(lr) - centre) / width
    return floor + (1 - math.exp(-0.5 * d * d)) + 0.02 * (layers - best_layers) ** 2


def _floats(names, lo, hi):
    return {n: {"min": float(lo), "max": float(hi)} for n in names}


MIXED_SPACE = {
    "lr": {"min": 1e-5, "max": 1.0, "distribution": "log_uniform_values"},
    "optimizer": {"values": ["sgd", "adam", "rmsprop"]},
    "layers": {"min": 1, "max": 8},
}

MNIST_SPACE = {
    "lr": {"min": 1e-4, "max": 0.3, "distribution": "log_uniform_values"},
    "optimizer": {"values": ["sgd", "adam"]},
    "batch_size": {"values": [32, 64, 128, 256]},
    "momentum": {"min": 0.5, "max": 0.99},
}

OBJECTIVES = {
    "branin": {"space": {"x1": {"min": -5.0, "max": 10.0}, "x2": {"min": 0.0, "max": 15.0}}, "minimum": 0.397887},
    "hartmann6": {"space": _floats([f"x{i}" for i in range(1, 7)], 0, 1), "minimum": -3.32237},
    "mixed": {"space": MIXED_SPACE, "minimum": 0.0},
    "mixed-fail": {"space": MIXED_SPACE, "minimum": 0.0},
    "mnist": {"space": MNIST_SPACE, "minimum": 0.0, "builtin": True},
}


def mnist(p, seed):
    """The test error of gpumux's built-in MLP on MNIST-10k trained at the point `p`."""
    cmd = [os.environ.get("GPUMUX", "target/release/gpumux"), "train", "--backend", "cpu", "--model", "mlp",
           "--hidden", "128", "--data", "mnist-10k", "--epochs", os.environ.get("MNIST_EPOCHS", "3"),
           "--seed", str(seed)] + [a for k, v in sorted(p.items()) for a in (f"--{k.replace('_', '-')}", str(v))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return 1.0 - float(re.search(r"done: test acc ([0-9.]+)", out).group(1))


def evaluate(name, p, seed=0):
    """The objective `name` at the point `p` (a dict of parameter values); None when it fails.
    `seed` is the training's seed, for the objectives that train."""
    if name == "mnist":
        return mnist(p, seed)
    if name == "branin":
        return branin(p["x1"], p["x2"])
    if name == "hartmann6":
        return hartmann6([p[f"x{i}"] for i in range(1, 7)])
    if name == "mixed-fail" and p["optimizer"] == "rmsprop":
        return None
    return mixed(p["lr"], p["optimizer"], int(p["layers"]))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in OBJECTIVES:
        sys.exit(f"usage: objectives.py {{{','.join(OBJECTIVES)}}} --PARAM VALUE ...")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, spec in OBJECTIVES[name]["space"].items():
        ap.add_argument(f"--{k}", type=str if "values" in spec else float, required=True)
    value = evaluate(name, vars(ap.parse_args(sys.argv[2:])))
    if value is None:
        sys.exit(f"{name}: this optimizer fails")
    print(json.dumps({"value": value}), flush=True)


if __name__ == "__main__":
    main()
