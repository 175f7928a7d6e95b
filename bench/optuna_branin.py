#!/usr/bin/env python3
"""Optuna's TPE on bench/branin.py's objective, for the same seeds and trial count as the gpumux
sweeps of bench/smart-sweeps.sh: prints one CSV row per trial (seed, trial, value, best so far).

    python3 bench/optuna_branin.py --seeds 1 2 3 --trials 40
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from branin import branin  # noqa: E402

import optuna  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--trials", type=int, default=40)
    a = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("seed,trial,value,best")
    for seed in a.seeds:
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
        study.optimize(
            lambda t: branin(t.suggest_float("x1", -5, 10), t.suggest_float("x2", 0, 15)),
            n_trials=a.trials,
        )
        best = float("inf")
        for i, t in enumerate(study.trials, 1):
            best = min(best, t.value)
            print(f"{seed},{i},{t.value},{best}")


if __name__ == "__main__":
    main()
