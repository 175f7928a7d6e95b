#!/usr/bin/env python3
"""Collects the parallel.csv rows of several `gpumux parallel` runs into one table.csv and a table.md.

Usage: bench/parallel-tables.py OUT_DIR RUN_DIR...   (standard library only)
"""
import csv
import sys
from pathlib import Path

COLUMNS = [
    ("slices", "slices"),
    ("split", "split"),
    ("ratios", "ratios"),
    ("shards", "shards"),
    ("global_batch", "global batch"),
    ("epochs", "epochs"),
    ("time_per_epoch_s", "time per epoch (s)"),
    ("total_s", "total time (s)"),
    ("test_acc", "test accuracy"),
    ("slice_samples_per_s", "samples/s per slice"),
    ("samples_per_s", "samples/s total"),
    ("slice_busy", "busy per slice"),
]


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    rows = []
    for d in sys.argv[2:]:
        with open(Path(d) / "parallel.csv", newline="") as f:
            rows.extend(csv.DictReader(f))
    if not rows:
        print("no rows", file=sys.stderr)
        return 1
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    def cell(key, value):
        if key in ("time_per_epoch_s", "total_s"):
            return f"{float(value):.2f}"
        if key == "test_acc":
            return f"{float(value):.4f}"
        if key == "samples_per_s":
            return f"{float(value):.0f}"
        return value.replace(";", " / ")

    lines = [
        "| " + " | ".join(h for _, h in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        lines.append("| " + " | ".join(cell(k, r[k]) for k, _ in COLUMNS) + " |")
    lines.append("")
    lines.append(f"device: {rows[0]['device']} (backend {rows[0]['backend']}); "
                 f"model {rows[0]['model']} on {rows[0]['dataset']}, {rows[0]['optimizer']} lr {rows[0]['lr']}")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
