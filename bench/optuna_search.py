#!/usr/bin/env python3
"""Optuna's default sampler (TPE, multivariate in Optuna 5) on bench/objectives.py's objectives,
for the same seeds and trial count as the gpumux sweeps of bench/search-quality.sh: prints one
CSV row per trial, in the order they ran.

    python3 bench/optuna_search.py --objective hartmann6 --seeds 1 2 3 --trials 60
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objectives import OBJECTIVES, evaluate  # noqa: E402

import optuna  # noqa: E402


def suggest(trial, name, spec):
    if "values" in spec:
        return trial.suggest_categorical(name, spec["values"])
    lo, hi = spec["min"], spec["max"]
    if isinstance(lo, int) and isinstance(hi, int):
        return trial.suggest_int(name, lo, hi)
    return trial.suggest_float(name, lo, hi, log=spec.get("distribution") == "log_uniform_values")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objective", choices=sorted(OBJECTIVES), required=True)
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--header", action="store_true")
    a = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = OBJECTIVES[a.objective]["space"]
    if a.header:
        print("method,objective,seed,trial,state,value,params")
    for seed in a.seeds:
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))

        def objective(trial):
            point = {k: suggest(trial, k, spec) for k, spec in space.items()}
            v = evaluate(a.objective, point, seed=seed * 100_000 + trial.number)
            return math.nan if v is None else v  # Optuna records a NaN as a failed trial

        study.optimize(objective, n_trials=a.trials)
        for t in study.trials:
            state = "COMPLETE" if t.state == optuna.trial.TrialState.COMPLETE else "FAIL"
            value = "" if state == "FAIL" else repr(t.value)
            params = json.dumps(t.params, sort_keys=True).replace('"', '""')
            print(f'optuna,{a.objective},{seed},{t.number + 1},{state},{value},"{params}"')


if __name__ == "__main__":
    main()
