#!/usr/bin/env python3
"""Checks the results of a sweep of one of the examples/ clients (standard library only).

    check_sweep.py OUT --trials 4 --epochs 3 --threads 1 --params batch_size,epochs,lr

OUT is the sweep's --out. Every trial must be COMPLETE in trials.csv with the epochs it ran;
progress.csv must have a row with a finite train_loss and test_acc for each of its epochs; the
client's OUT/trials/<trial id>/metrics.json must show the thread share it was given and the seed
trials.csv records (distinct seeds); best.yaml must name the trial with the best test_acc and list
exactly the parameters the command received. Prints what failed and exits 1, or exits 0.
"""

import argparse
import csv
import json
import math
import sys
from pathlib import Path


def finite(text):
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def best_yaml(path):
    """(trial_id, parameter names) of a best.yaml, read line by line (no YAML library needed)."""
    trial, params, inside = None, [], False
    for line in path.read_text().splitlines():
        if line.startswith("trial_id:"):
            trial = line.split(":", 1)[1].strip()
        elif line.startswith("parameters:"):
            inside = True
        elif inside and line.startswith("  ") and not line.startswith("    "):
            params.append(line.strip().rstrip(":"))
        elif inside and line and not line.startswith(" "):
            inside = False
    return trial, sorted(params)


def check(out, args):
    errors = []
    trials = list(csv.DictReader(open(out / "trials.csv", newline="")))
    if len(trials) != args.trials:
        errors.append(f"trials.csv has {len(trials)} trials, expected {args.trials}")
    progress = list(csv.DictReader(open(out / "progress.csv", newline="")))
    seeds = set()
    for t in trials:
        tid = t["trial_id"]
        if t["state"] != "COMPLETE":
            errors.append(f"{tid}: state {t['state']}: {t['error']}")
            continue
        if int(t["epochs"]) != args.epochs:
            errors.append(f"{tid}: trials.csv epochs {t['epochs']}, expected {args.epochs}")
        rows = [r for r in progress if r["trial_id"] == tid]
        got = sorted(int(r["epoch"]) for r in rows)
        if got != list(range(1, args.epochs + 1)):
            errors.append(f"{tid}: progress.csv epochs {got}, expected 1..{args.epochs}")
        for r in rows:
            if not (finite(r["train_loss"]) and finite(r["test_acc"])):
                errors.append(f"{tid}: epoch {r['epoch']}: train_loss {r['train_loss']}, test_acc {r['test_acc']}")
        try:
            seen = json.loads((out / "trials" / tid / "metrics.json").read_text())
        except (OSError, ValueError) as e:
            errors.append(f"{tid}: no metrics.json from the client in its {{out_dir}}: {e}")
            continue
        if seen.get("threads") != args.threads:
            errors.append(f"{tid}: the client saw GPUMUX_THREADS {seen.get('threads')}, expected {args.threads}")
        env = seen.get("env", {})
        for var in ("OMP_NUM_THREADS", "PJRT_NPROC", "TF_NUM_INTRAOP_THREADS"):
            if var in env and env[var] != str(args.threads):
                errors.append(f"{tid}: the client saw {var}={env[var]}, expected {args.threads}")
        if str(seen.get("seed")) != t["seed"]:
            errors.append(f"{tid}: the client got seed {seen.get('seed')}, trials.csv says {t['seed']}")
        seeds.add(t["seed"])
        print(f"{tid}: test_acc {float(t['test_acc']):.4f}, seed {t['seed']}, "
              f"threads {seen.get('threads')}, process threads {seen.get('os_threads')}")
    if len(seeds) != len(trials):
        errors.append(f"{len(seeds)} distinct seeds for {len(trials)} trials")
    done = [t for t in trials if t["state"] == "COMPLETE"]
    if done:
        best = max(done, key=lambda t: float(t["test_acc"]))
        trial, params = best_yaml(out / "best.yaml")
        if trial != best["trial_id"]:
            errors.append(f"best.yaml names {trial}, the best test_acc is {best['trial_id']}'s")
        if params != sorted(args.params.split(",")):
            errors.append(f"best.yaml lists parameters {params}, the command received {args.params}")
    return errors


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--threads", type=int, required=True, help="the thread share each trial must see")
    p.add_argument("--params", required=True, help="comma-separated names best.yaml must list")
    args = p.parse_args(argv)
    errors = check(args.out, args)
    for e in errors:
        print(f"check_sweep: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
