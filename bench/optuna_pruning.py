#!/usr/bin/env python3
"""Optuna's HyperbandPruner on the learning curves examples/search_curves.rs wrote (DIR/curves-SEED.csv),
in the same asynchronous schedule: CONCURRENCY slots take the trials in order as they come free,
an epoch a time unit. Prints the `prune` rows of bench/search-quality.sh's curves.csv.

    python3 bench/optuna_pruning.py DIR [CONCURRENCY]
"""

import csv
import heapq
import sys
from collections import defaultdict
from pathlib import Path

import optuna


def replay(curves, concurrency):
    """The epochs each trial trained under Optuna's HyperbandPruner (eta 3, min_resource 1)."""
    n = len(curves)
    epochs = len(curves[0])
    study = optuna.create_study(
        direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs, reduction_factor=3),
    )
    trained = [0] * n
    trials = {}
    events, nxt = [], 0
    for _ in range(min(concurrency, n)):
        trials[nxt] = study.ask()
        heapq.heappush(events, (1, nxt, 1))
        nxt += 1
    while events:
        time, i, t = heapq.heappop(events)
        trained[i] = t
        trial, value = trials[i], curves[i][t - 1]
        trial.report(value, t)
        if t < epochs and not trial.should_prune():
            heapq.heappush(events, (time + 1, i, t + 1))
            continue
        study.tell(trial, value if t == epochs else None,
                   state=optuna.trial.TrialState.COMPLETE if t == epochs else optuna.trial.TrialState.PRUNED)
        if nxt < n:
            trials[nxt] = study.ask()
            heapq.heappush(events, (time + 1, nxt, 1))
            nxt += 1
    return trained


def main():
    folder = Path(sys.argv[1])
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    files = sorted(folder.glob("curves-*.csv"), key=lambda p: int(p.stem.split("-")[1]))
    for f in files:
        seed = int(f.stem.split("-")[1])
        by_trial = defaultdict(list)
        for r in csv.DictReader(open(f)):
            by_trial[int(r["trial"])].append(float(r["value"]))
        curves = [by_trial[i] for i in sorted(by_trial)]
        n, epochs = len(curves), len(curves[0])
        trained = replay(curves, concurrency)
        finals = [c[-1] for c in curves]
        best = max(range(n), key=lambda i: finals[i])
        kept = [i for i in range(n) if trained[i] == epochs]
        top = max(kept, key=lambda i: finals[i]) if kept else None
        rank = n if top is None else sum(f > finals[top] for f in finals)
        ratio = sum(trained) / (n * epochs)
        print(f"prune,Optuna HyperbandPruner,{seed},{ratio:.3f},{int(trained[best] == epochs)},{rank},,,,")


if __name__ == "__main__":
    main()
