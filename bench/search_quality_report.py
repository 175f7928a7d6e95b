#!/usr/bin/env python3
"""The tables of bench/search-quality.sh, from its trials.csv and curves.csv: OUT/summary.md.

    python3 bench/search_quality_report.py results/search-quality
"""

import csv
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from objectives import OBJECTIVES  # noqa: E402


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 2:
        return (xs[0], xs[0], xs[0]) if xs else (math.nan,) * 3
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def sign_test(a, b):
    """Per seed, a better than b (lower), worse, and the two-sided sign test's p (ties dropped)."""
    wins = sum(x < y for x, y in zip(a, b))
    losses = sum(x > y for x, y in zip(a, b))
    n = wins + losses
    k = min(wins, losses)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return wins, losses, p


def objectives(rows, lines):
    runs = defaultdict(list)  # (method, objective, seed) -> rows in order
    for r in rows:
        runs[(r["method"], r["objective"], int(r["seed"]))].append(r)
    methods = [m for m in ("bayes", "optuna", "random") if any(k[0] == m for k in runs)]
    label = {"bayes": "gpumux bayes", "optuna": "Optuna TPE", "random": "gpumux random"}
    regret = {}
    for (m, o, s), rs in runs.items():
        vals = [float(r["value"]) for r in rs if r["state"] == "COMPLETE" and r["value"]]
        regret[(m, o, s)] = (min(vals) if vals else math.inf) - OBJECTIVES[o]["minimum"]
    objs = [o for o in OBJECTIVES if any(k[1] == o for k in runs)]
    n = max((len(rs) for rs in runs.values()), default=0)
    lines += [f"## Regret after {n} trials (best value − the minimum): median [IQR] over seeds", "",
              "| objective | seeds | " + " | ".join(label[m] for m in methods) + " | gpumux bayes vs Optuna, per seed: better–worse (sign test p) |",
              "|---|---:|" + "---|" * len(methods) + "---|"]
    for o in objs:
        seeds = sorted({k[2] for k in runs if k[1] == o and k[0] in methods})
        cells = []
        for m in methods:
            q1, med, q3 = quartiles([regret[(m, o, s)] for s in seeds if (m, o, s) in regret])
            cells.append(f"{med:.4f} [{q1:.4f}–{q3:.4f}]")
        both = [s for s in seeds if ("bayes", o, s) in regret and ("optuna", o, s) in regret]
        w, l, p = sign_test([regret[("bayes", o, s)] for s in both], [regret[("optuna", o, s)] for s in both])
        lines.append(f"| {o} | {len(seeds)} | " + " | ".join(cells) + f" | {w}–{l} (p = {p:.3f}) |")
    short = sorted(f"{m} {o} seed {s} ({len(rs)} trials)" for (m, o, s), rs in runs.items() if m != "optuna" and len(rs) < n)
    if short:
        lines += ["", "Sweeps that ended early: " + ", ".join(short) + ". A sweep whose first three trials fail the same way stops there (gpumux's guard against a broken command); its regret counts the trials it ran."]
    if "mnist" in {k[1] for k in runs}:
        lines += ["", "For `mnist` the value is the test error (1 − test accuracy), so its regret is the best trial's test error."]
    categorical(runs, methods, label, n, lines)
    failing(runs, methods, label, lines)
    lines.append("")


def categorical(runs, methods, label, n, lines):
    """Where the late proposals of `mixed` go, and whether that is the right value."""
    table = []
    for m in methods:
        shares, wrong, seeds = [], 0, 0
        for (mm, o, s), rs in runs.items():
            late = [json.loads(r["params"])["optimizer"] for r in rs[n // 2:]] if (mm, o) == (m, "mixed") else []
            if not late:
                continue
            value, count = Counter(late).most_common(1)[0]
            shares.append(count / len(late))
            wrong += value != "sgd"
            seeds += 1
        if seeds:
            table.append(f"| {label[m]} | {statistics.median(shares):.0%} ({max(shares):.0%}) | {wrong} of {seeds} seeds |")
    if table:
        lines += ["", "## The categorical of `mixed` (sgd is right; adam's broad bowl is the trap)", "",
                  f"Share of trials {n // 2 + 1}–{n} on their most proposed optimizer (median over seeds), and the seeds whose most proposed is not sgd.", "",
                  "| method | late share on one value (median, max) | wrong value in |", "|---|---|---|"] + table


def failing(runs, methods, label, lines):
    """How often `mixed-fail`'s failing value is still proposed after its third failure."""
    table = []
    for m in methods:
        after = proposed = under = seeds = 0
        for (mm, o, s), rs in runs.items():
            if (mm, o) != (m, "mixed-fail"):
                continue
            fails = a = c = 0
            for r in rs:
                is_r = json.loads(r["params"])["optimizer"] == "rmsprop"
                if fails >= 3:
                    a += 1
                    c += is_r
                fails += is_r
            after += a
            proposed += c
            under += 3 * c <= a
            seeds += 1
        if seeds:
            table.append(f"| {label[m]} | {proposed} of {after} ({proposed / max(after, 1):.0%}) | {under} of {seeds} |")
    if table:
        lines += ["", "## A value that always fails (`mixed-fail`: every rmsprop trial fails)", "",
                  "After rmsprop's third failure, the share of the trials that still propose it (all seeds together).", "",
                  "| method | rmsprop proposed after 3 failures | seeds where it stayed under a third |", "|---|---|---|"] + table


def curves(rows, lines):
    lines += ["## Early termination on learning curves that cross", "",
              "Trial-epochs trained against the same sweep unpruned, and the seeds in which the unpruned sweep's best trial was kept to its last epoch.", "",
              "| pruner | seeds | trial-epochs / unpruned: median (max) | unpruned best kept to the end | best kept trial's rank (0: the best), median |",
              "|---|---:|---|---|---|"]
    by = defaultdict(list)
    for r in rows:
        if r["kind"] == "prune":
            by[r["pruner"]].append(r)
    for pruner, rs in by.items():
        ratios = [float(r["trial_epochs_ratio"]) for r in rs]
        kept = sum(int(r["best_kept"]) for r in rs)
        rank = statistics.median(int(r["best_rank_of_kept"]) for r in rs)
        lines.append(f"| {pruner} | {len(rs)} | {statistics.median(ratios):.2f}× ({max(ratios):.2f}×) | {kept} of {len(rs)} | {rank:g} |")
    bo = [r for r in rows if r["kind"] == "bayes"]
    if bo:
        lines += ["", "## bayes with hyperband over a training-like space", "",
                  "Per seed: the share of the late half of the trials on their most proposed batch size, and the trial that found the best value (the startup trials are random).", "",
                  "| pruner | seeds | trial-epochs / unpruned, median | late share on one value: median (max) | best found after the startup trials | best final accuracy, median [IQR] |",
                  "|---|---:|---|---|---|---|"]
        groups = defaultdict(list)
        for r in bo:
            groups[r["pruner"]].append(r)
        for pruner, rs in groups.items():
            shares = [float(r["late_share"]) for r in rs]
            after = sum(int(r["best_trial"]) > int(r["startup"]) for r in rs)
            q1, best, q3 = quartiles([float(r["best_value"]) for r in rs])
            ratio = statistics.median(float(r["trial_epochs_ratio"]) for r in rs)
            lines.append(f"| {pruner} | {len(rs)} | {ratio:.2f}× | {statistics.median(shares):.0%} ({max(shares):.0%}) | {after} of {len(rs)} seeds | {best:.4f} [{q1:.4f}–{q3:.4f}] |")
    lines.append("")


def main():
    out = Path(sys.argv[1])
    lines = ["# Search quality: gpumux against Optuna", ""]
    head = [l[2:] for l in (out / "command.txt").read_text().splitlines() if l.startswith("# ")]
    lines += [f"- {h}" for h in head] + [""]
    if (out / "trials.csv").exists():
        objectives(list(csv.DictReader(open(out / "trials.csv"))), lines)
    if (out / "curves.csv").exists():
        curves(list(csv.DictReader(open(out / "curves.csv"))), lines)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
