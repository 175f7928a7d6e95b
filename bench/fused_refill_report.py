"""The summary of bench/fused-refill.sh: per seed, each sweep's wall time, trial-epochs and best
test_acc, and when the pruned sweep (and the random one) first reached the best of the unpruned
bayes sweep of the same seed, from the end time of each trial in the sweep's log.

Usage: python3 bench/fused_refill_report.py OUT   (reads OUT/runs.csv and the logs it names)
"""

import csv
import datetime
import re
import statistics
import sys

END = re.compile(
    r"^(\S+Z)\s+INFO trial \d+/\d+ \S+ (COMPLETE|PRUNED|FAIL)(?: test_acc ([0-9.]+))?"
)


def ends(log):
    """(seconds since the epoch, state, test_acc or None) of each trial's end, in order."""
    out = []
    for line in open(log, encoding="utf-8", errors="replace"):
        m = END.match(line)
        if not m:
            continue
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        out.append((t, m.group(2), float(m.group(3)) if m.group(3) else None))
    return out


def best_by(run, seconds):
    """The best COMPLETE test_acc among the trials that ended within `seconds` of the start."""
    accs = [
        acc
        for t, state, acc in ends(run["log"])
        if state == "COMPLETE" and acc is not None and t - float(run["start_unix"]) <= seconds
    ]
    return max(accs, default=float("nan"))


def reached(run, target):
    """Seconds from the sweep's start until a COMPLETE trial had test_acc >= target (None: never)."""
    for t, state, acc in ends(run["log"]):
        if state == "COMPLETE" and acc is not None and acc >= target - 1e-9:
            return t - float(run["start_unix"])
    return None


def main(out):
    runs = list(csv.DictReader(open(f"{out}/runs.csv")))
    by = {(r["seed"], r["sweep"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs}, key=int)
    lines = [
        "# Fused pruning with refill (bench/fused-refill.sh)",
        "",
        "Per seed: `pruned` is a fused bayes sweep with hyperband (a pruned trial's slot takes the next",
        "proposal at the group's next epoch), `bayes` the same sweep unpruned, `random` an unpruned",
        "random sweep. *reach* is the time from the sweep's start until one of its COMPLETE trials had",
        "at least the unpruned bayes sweep's best test_acc; *within 0.002* the same with 0.002 less (4 of",
        "the 2,000 test samples). *bayes best then* is the unpruned sweep's best at the pruned sweep's end.",
        "Ratios are to the unpruned bayes sweep's whole wall time.",
        "",
        "| seed | sweep | wall s | trials | pruned | trial-epochs | best test_acc | bayes best then | reach s (× bayes wall) | within 0.002 s (× bayes wall) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {"pruned": [], "pruned_near": [], "pruned_wall": [], "epochs": [], "vs_then": []}
    for seed in seeds:
        base = by.get((seed, "bayes"))
        if base is None:
            continue
        target, wall = float(base["best_test_acc"]), float(base["wall_s"])
        for sweep in ("pruned", "bayes", "random"):
            r = by.get((seed, sweep))
            if r is None:
                continue
            hit, near = reached(r, target), reached(r, target - 0.002)
            then = best_by(base, float(r["wall_s"]))
            fmt = lambda s: "never" if s is None else f"{s:.1f} ({s / wall:.2f}×)"
            lines.append(
                f"| {seed} | {sweep} | {float(r['wall_s']):.1f} | {r['trials']} | {r['pruned']} | "
                f"{r['trial_epochs']} | {float(r['best_test_acc']):.4f} | {then:.4f} | {fmt(hit)} | {fmt(near)} |"
            )
            if sweep == "pruned":
                ratios["pruned"].append(None if hit is None else hit / wall)
                ratios["pruned_near"].append(None if near is None else near / wall)
                ratios["pruned_wall"].append(float(r["wall_s"]) / wall)
                ratios["epochs"].append(int(r["trial_epochs"]) / max(1, int(base["trial_epochs"])))
                ratios["vs_then"].append(float(r["best_test_acc"]) - then)
    lines.append("")
    if ratios["pruned_wall"]:
        hits = [x for x in ratios["pruned"] if x is not None]
        nears = [x for x in ratios["pruned_near"] if x is not None]
        n = len(ratios["pruned"])
        lines += [
            f"Pruned against unpruned bayes, over {n} seeds:",
            f"- whole sweep: wall time {statistics.median(ratios['pruned_wall']):.2f}× (median), "
            f"trial-epochs {statistics.median(ratios['epochs']):.2f}×;",
            f"- reached the unpruned best in {len(hits)} of {n} seeds"
            + (f", at {statistics.median(hits):.2f}× its wall time (median of those)" if hits else "")
            + ";",
            f"- came within 0.002 of it in {len(nears)} of {n} seeds"
            + (f", at {statistics.median(nears):.2f}× (median of those)" if nears else "")
            + ";",
            f"- at the pruned sweep's end, its best was above the unpruned sweep's best at that "
            f"moment in {sum(d > 0 for d in ratios['vs_then'])} of {n} seeds, equal in "
            f"{sum(d == 0 for d in ratios['vs_then'])} (median difference "
            f"{statistics.median(ratios['vs_then']):+.4f}).",
        ]
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
