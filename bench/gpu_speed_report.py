#!/usr/bin/env python3
"""The table of bench/gpu-speed.sh: reads what its steps left in OUT/raw/ and writes
OUT/ratios.csv (measure,gpumux,peer,ratio,goal) and OUT/summary.md.

    python3 bench/gpu_speed_report.py OUT --backend cuda|cpu [--rehearse [--with-peers]] ...

Only steps that ended with exit 0 are read, and only figures from the backend asked for (fib's
runs.csv `backend`, the `backend:` line of `gpumux train`, the PyTorch scripts' `device`). Each
figure is the median over the passes (and over the repeats inside a run, where a script repeats).
Standard library only. Exit 0 when no step failed and every measure has its figures (the
peer's may be missing where a rehearsal skips it), else 1.
"""

import argparse
import csv
import json
import os
import re
import statistics
import sys

# measure, goal, unit, which figure is better when higher
MEASURES = [
    ("mlp_best_n_vs_alone", 15.0),
    ("fused_vs_best_nonfused", 3.0),
    ("fused_vs_torch_func", 1.5),
    ("shared_vs_torch_procs", 5.0),
    ("mlp_alone_vs_torch", 10.0),
    ("resnet50_fp32_vs_torch", 1.0),
    ("resnet50_tf32_vs_torch", 1.0),
]
# Measures whose peer is PyTorch (skipped in a rehearsal without --with-peers).
TORCH_PEER = {
    "fused_vs_torch_func",
    "shared_vs_torch_procs",
    "mlp_alone_vs_torch",
    "resnet50_fp32_vs_torch",
    "resnet50_tf32_vs_torch",
}
DESCRIBE = {
    "mlp_best_n_vs_alone": (
        "s per training",
        "gpumux: the best time per training over N = {ns}, splits shared and logical ({best_at})",
        "gpumux alone: time per training at N = 1 ({alone_at})",
        "alone / best",
        "yes: every fib round runs after its split's untimed warm-up round",
    ),
    "fused_vs_best_nonfused": (
        "s per training",
        "gpumux fused at N = {fused_n}: time per training",
        "gpumux's best non-fused time per training (the row above)",
        "best non-fused / fused",
        "yes: fused's round runs after its own warm-up round",
    ),
    "fused_vs_torch_func": (
        "training samples/s (all N trainings)",
        "gpumux fused at N = {fused_n}: samples/s of the round (runs.csv)",
        "a torch.func ensemble of {fused_n} MLPs (bench/torch_ensemble.py), each its trial's lr: samples/s of all members",
        "gpumux / peer",
        "yes: gpumux after its warm-up round; the ensemble after an untimed epoch",
    ),
    "shared_vs_torch_procs": (
        "s per training",
        "gpumux shared at N = {nstar}: time per training",
        "{nstar} PyTorch processes at once (bench/torch_procs.py): makespan / N",
        "peer / gpumux",
        "yes: shared after its warm-up round; each process after an untimed epoch, all then started together",
    ),
    "mlp_alone_vs_torch": (
        "s per training",
        "gpumux: time per training at N = 1 ({alone_at})",
        "bench/torch_mnist.py: one training (train_s)",
        "peer / gpumux",
        "yes: N = 1 after the warm-up round (its time still holds the trial's arena, initialisation and graph "
        "capture); PyTorch after an untimed epoch (its weight reset untimed)",
    ),
    "resnet50_fp32_vs_torch": (
        "images/s",
        "gpumux train, ResNet-50 FP32: images/s of epoch 2",
        "bench/torch_resnet50.py --precision fp32: images/s of its timed steps",
        "gpumux / peer",
        "yes: gpumux's epoch 2 follows epoch 1 (warm-up and graph capture); PyTorch's timed steps follow 10 untimed ones",
    ),
    "resnet50_tf32_vs_torch": (
        "images/s",
        "gpumux train, ResNet-50 TF32 (engine: {{tf32: true}}): images/s of epoch 2",
        "bench/torch_resnet50.py --precision tf32: images/s of its timed steps",
        "gpumux / peer",
        "yes: as for FP32",
    ),
}


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=6):
    if x is None:
        return ""
    return f"{x:.{digits}g}"


class Raw:
    """The steps of one run and the figures read from them."""

    def __init__(self, out, backend):
        self.out, self.backend = out, backend
        self.raw = os.path.join(out, "raw")
        with open(os.path.join(self.raw, "steps.csv")) as f:
            self.steps = list(csv.DictReader(f))
        self.notes = []

    def ok(self, key):
        return [s for s in self.steps if s["key"] == key and s["result"] == "ok"]

    def note(self, text):
        if text not in self.notes:
            self.notes.append(text)

    def fib(self, key):
        """{pass: {(split, n): row}} of the fib runs of `key` that ran on the backend asked for."""
        found = {}
        for s in self.ok(key):
            try:
                with open(os.path.join(s["output"], "runs.csv")) as f:
                    rows = list(csv.DictReader(f))
            except OSError as e:
                self.note(f"{s['id']}: no runs.csv ({e})")
                continue
            wrong = [r["backend"] for r in rows if r["backend"] != self.backend]
            if wrong:
                self.note(f"{s['id']}: ran on {wrong[0]}, not {self.backend}: not used")
                continue
            good = {}
            for r in rows:
                if r["failed"] != "0" or r["ok"] != r["n"]:
                    self.note(f"{s['id']}: {r['split']} N={r['n']}: {r['failed']} of {r['n']} trials failed: round not used")
                    continue
                good[(r["split"], int(r["n"]))] = r
            found[s["id"]] = good
        return found

    def csv_rows(self, key, column):
        """[(step id, [values])] from the CSV output of `key`'s runs on the right device."""
        found = []
        for s in self.ok(key):
            try:
                with open(s["output"]) as f:
                    rows = list(csv.DictReader(f))
            except OSError as e:
                self.note(f"{s['id']}: no output ({e})")
                continue
            devices = {r.get("device") for r in rows}
            if devices != {self.backend}:
                self.note(f"{s['id']}: ran on {', '.join(sorted(map(str, devices)))}, not {self.backend}: not used")
                continue
            try:
                found.append((s["id"], [float(r[column]) for r in rows], rows))
            except (KeyError, ValueError) as e:
                self.note(f"{s['id']}: unreadable {column} ({e!r})")
        return found

    def gpumux_images(self, key):
        """[(step id, images/s of epoch 2, conv note)] from `gpumux train` logs."""
        found = []
        for s in self.ok(key):
            try:
                text = open(s["log"]).read()
            except OSError as e:
                self.note(f"{s['id']}: no log ({e})")
                continue
            m = re.search(r"^backend: (\S+)", text, re.M)
            if not m or m.group(1) != self.backend:
                self.note(f"{s['id']}: ran on {m.group(1) if m else 'an unnamed backend'}, not {self.backend}: not used")
                continue
            times = [float(x) for x in re.findall(r"^epoch\s+\d+ .* ([0-9.]+) s$", text, re.M)]
            train = re.search(r"^data: .* (\d+) train", text, re.M)
            batch = re.search(r"\bbatch (\d+)\b", text)
            if len(times) < 2 or not train or not batch:
                self.note(f"{s['id']}: fewer than two epoch lines, or no data or batch line")
                continue
            b = int(batch.group(1))
            samples = int(train.group(1)) // b * b
            conv = re.search(r"^note: .*convolutions run as .*$", text, re.M)
            found.append((s["id"], samples / (times[1] - times[0]), conv.group(0) if conv else ""))
        return found

    def torch_images(self, key):
        """[(step id, [images/s of each timed repeat])] from torch_resnet50.py logs."""
        found = []
        for s in self.ok(key):
            try:
                lines = [line for line in open(s["log"]) if line.startswith("{")]
                result = json.loads(lines[-1])
            except (OSError, IndexError, ValueError) as e:
                self.note(f"{s['id']}: no result line ({e!r})")
                continue
            if result.get("device") != self.backend:
                self.note(f"{s['id']}: ran on {result.get('device')}, not {self.backend}: not used")
                continue
            found.append((s["id"], [float(x) for x in result["images_per_s_each"]]))
        return found


def compute(raw, args):
    """The rows: {measure: dict(gpumux, peer, ratio, runs, ...)} and the words for the descriptions."""
    rows = {m: {"gpumux": None, "peer": None, "ratio": None, "runs": []} for m, _ in MEASURES}
    words = {"ns": "?", "best_at": "?", "alone_at": "?", "fused_n": "?", "nstar": "?"}

    # The MLP's fib runs: medians per (split, N) over the passes.
    fib = raw.fib("fib-mlp")
    per = {}
    for sid, good in fib.items():
        for k, r in good.items():
            per.setdefault(k, []).append((sid, float(r["time_per_training_s"])))
    med = {k: median([v for _, v in vs]) for k, vs in per.items()}
    if med:
        words["ns"] = ",".join(str(n) for n in sorted({n for _, n in med}))
    alone = [(med[k], k) for k in med if k[1] == 1]
    best = min(((v, k) for k, v in med.items()), default=None)
    alone = min(alone, default=None)
    if best:
        words["best_at"] = f"{best[1][0]}, N = {best[1][1]}; median of {len(per[best[1]])} runs"
    if alone:
        words["alone_at"] = f"{alone[1][0]}, the faster at N = 1; median of {len(per[alone[1]])} runs"
    r = rows["mlp_best_n_vs_alone"]
    r["gpumux"] = best[0] if best else None
    r["peer"] = alone[0] if alone else None
    if best:
        r["runs"].append(f"best ({best[1][0]}, N={best[1][1]}): " + ", ".join(f"{v:.6g} ({sid})" for sid, v in per[best[1]]))
    if alone:
        r["runs"].append(f"alone ({alone[1][0]}, N=1): " + ", ".join(f"{v:.6g} ({sid})" for sid, v in per[alone[1]]))
    for k in sorted(med, key=lambda k: (k[1], k[0])):
        r["runs"].append(f"{k[0]} N={k[1]}: median {med[k]:.6g} s of " + ", ".join(f"{v:.6g}" for _, v in per[k]))

    # Fused at its N.
    fused = raw.fib("fib-fused")
    f_tpt, f_sps = [], []
    for sid, good in fused.items():
        for (split, n), row in good.items():
            if split == "fused":
                words["fused_n"] = str(n)
                f_tpt.append((sid, float(row["time_per_training_s"])))
                f_sps.append((sid, float(row["samples_per_s"])))
    r = rows["fused_vs_best_nonfused"]
    r["gpumux"] = median([v for _, v in f_tpt])
    r["peer"] = best[0] if best else None
    r["runs"] = [f"fused: {v:.6g} s ({sid})" for sid, v in f_tpt] + [f"best non-fused: {fmt(r['peer'])} s (above)"]

    r = rows["fused_vs_torch_func"]
    r["gpumux"] = median([v for _, v in f_sps])
    ens = raw.csv_rows("torch-ensemble", "samples_per_s")
    r["peer"] = median([v for _, vs, _ in ens for v in vs])
    r["runs"] = [f"fused: {v:.1f} samples/s ({sid})" for sid, v in f_sps]
    r["runs"] += [f"torch.func: {', '.join(f'{v:.1f}' for v in vs)} samples/s ({sid})" for sid, vs, _ in ens]

    # N processes against shared at the same N.
    procs = raw.csv_rows("torch-procs", "time_per_training_s")
    r = rows["shared_vs_torch_procs"]
    ns = sorted({int(row["n"]) for _, _, rs in procs for row in rs})
    nstar = ns[0] if len(ns) == 1 else None
    if len(ns) > 1:
        raw.note(f"torch-procs ran at several N ({ns}): not compared")
    if nstar is None:
        # The N the peer would have run at: the best shared N of the first fib run.
        first = [g for sid, g in sorted(fib.items())][:1]
        cands = [(float(row["time_per_training_s"]), n) for g in first for (s, n), row in g.items() if s == "shared"]
        nstar = min(cands)[1] if cands else None
    if nstar is not None:
        words["nstar"] = str(nstar)
        r["gpumux"] = med.get(("shared", nstar))
        r["runs"].append(f"shared N={nstar}: " + ", ".join(f"{v:.6g} s ({sid})" for sid, v in per.get(("shared", nstar), [])))
        shared = [(v, n) for (s, n), v in med.items() if s == "shared"]
        if shared and min(shared)[1] != nstar:
            raw.note(
                f"shared_vs_torch_procs: N = {nstar} was the best shared N of the first fib run (the peer ran there); "
                f"over all runs' medians the best shared N is {min(shared)[1]}"
            )
    if nstar is not None and len(ns) == 1:
        r["peer"] = median([v for _, vs, _ in procs for v in vs])
        for sid, vs, rs in procs:
            row = rs[0]
            r["runs"].append(
                f"{nstar} processes: {vs[0]:.6g} s per training, makespan {row['makespan_s']} s, "
                f"last start {float(row['start_spread_s']) * 1e3:.1f} ms after the signal ({sid})"
            )

    # One training alone.
    alone_t = raw.csv_rows("torch-alone", "train_s")
    r = rows["mlp_alone_vs_torch"]
    r["gpumux"] = alone[0] if alone else None
    r["peer"] = median([v for _, vs, _ in alone_t for v in vs])
    if alone:
        r["runs"].append(f"gpumux N=1 ({alone[1][0]}): " + ", ".join(f"{v:.6g} s ({sid})" for sid, v in per[alone[1]]))
    r["runs"] += [f"torch_mnist.py: {', '.join(f'{v:.6g}' for v in vs)} s ({sid})" for sid, vs, _ in alone_t]

    # ResNet-50.
    for prec in ("fp32", "tf32"):
        r = rows[f"resnet50_{prec}_vs_torch"]
        g = raw.gpumux_images(f"resnet50-{prec}-gpumux")
        t = raw.torch_images(f"resnet50-{prec}-torch")
        r["gpumux"] = median([v for _, v, _ in g])
        r["peer"] = median([v for _, vs in t for v in vs])
        r["runs"] = [f"gpumux: {v:.1f} images/s ({sid})" for sid, v, _ in g]
        r["runs"] += [f"PyTorch: {', '.join(f'{v:.1f}' for v in vs)} images/s ({sid})" for sid, vs in t]
        for sid, _, conv in g:
            if conv:
                raw.note(f"{sid}: {conv}")

    # The ratios: above 1 when gpumux is better.
    for m, _ in MEASURES:
        r = rows[m]
        g, p = r["gpumux"], r["peer"]
        if g is None or p is None or g <= 0 or p <= 0:
            continue
        if DESCRIBE[m][0].startswith("s per"):
            r["ratio"] = p / g
        else:
            r["ratio"] = g / p
    return rows, words


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--backend", choices=["cuda", "cpu"], required=True)
    p.add_argument("--rehearse", action="store_true")
    p.add_argument("--with-peers", action="store_true")
    p.add_argument("--budget", default="?")
    p.add_argument("--took", default="?")
    p.add_argument("--smi", default="")
    p.add_argument("--torch", default="")
    p.add_argument("--commit", default="")
    args = p.parse_args(argv)
    raw = Raw(args.out, args.backend)
    rows, words = compute(raw, args)
    same_device(raw, args)
    peers_skipped = args.rehearse and not args.with_peers

    with open(os.path.join(args.out, "ratios.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["measure", "gpumux", "peer", "ratio", "goal"])
        for m, goal in MEASURES:
            r = rows[m]
            skipped = peers_skipped and m in TORCH_PEER
            w.writerow([
                m,
                fmt(r["gpumux"]),
                "" if skipped else fmt(r["peer"]),
                "" if skipped else fmt(r["ratio"], 4),
                f"{goal:g}",
            ])

    missing = []
    lines = []
    if args.rehearse:
        lines.append("# REHEARSAL: gpumux against its peers, on the CPU backend (not a measurement)")
        lines.append("")
        lines.append(
            "`bench/gpu-speed.sh --rehearse`: the GPU flow on the CPU backend, sized down (N up to 3, 1 epoch, "
            "a 1/16-width ResNet-50 on 32 px images). "
            + (
                "The PyTorch peers were skipped: their rows have no peer and no ratio. "
                if peers_skipped
                else "The PyTorch peers ran on the CPU at other sizes (a full-width ResNet-50): the ratios are not comparable. "
            )
            + "No goal is judged."
        )
    else:
        lines.append("# gpumux against its peers on one GPU")
        lines.append("")
        lines.append(f"Device: {args.smi or 'unknown (no nvidia-smi)'} (nvidia-smi: name, UUID, driver, memory).")
        lines.append(f"PyTorch: {args.torch or 'unknown'}.")
    lines.append("")
    lines.append(f"Commit: {args.commit or 'unknown'}. Budget {args.budget} s, taken {args.took} s. "
                 "Each side ran on the same device, interleaved (gpumux first in passes 1 and 3, the peer first in "
                 "pass 2); each figure is the median over the passes (and the repeats within a run). "
                 "Ratios are above 1 when gpumux is better.")
    lines.append("")
    lines.append("| measure | unit | gpumux | peer | ratio | goal | result |")
    lines.append("|---|---|---|---|---|---|---|")
    for m, goal in MEASURES:
        r = rows[m]
        skipped = peers_skipped and m in TORCH_PEER
        if skipped:
            peer, ratio, result = "skipped (rehearsal)", "", "not judged (rehearsal: peer skipped)"
            if r["gpumux"] is None:
                missing.append(m)
        else:
            peer, ratio = fmt(r["peer"]), fmt(r["ratio"], 4)
            if r["ratio"] is None:
                missing.append(m)
                result = "no figure (see the notes)"
            elif args.rehearse:
                result = "not judged (rehearsal)"
            else:
                result = "PASS" if r["ratio"] >= goal else "FAIL"
        lines.append(f"| `{m}` | {DESCRIBE[m][0]} | {fmt(r['gpumux'])} | {peer} | {ratio} | >= {goal:g} | {result} |")
    lines.append("")
    lines.append("## The sides")
    lines.append("")
    lines.append("| measure | gpumux side | peer side | ratio | warm against warm |")
    lines.append("|---|---|---|---|---|")
    for m, _ in MEASURES:
        unit, g, pe, ratio, warm = DESCRIBE[m]
        lines.append(f"| `{m}` | {g.format(**words)} | {pe.format(**words)} | {ratio} | {warm} |")
    lines.append("")
    lines.append(
        "gpumux's time per training is a fib round's makespan over N, and covers each whole trial: its arena, "
        "weight initialisation and graph capture, every epoch and every evaluation. The PyTorch scripts time "
        "every epoch and evaluation after an untimed warm-up epoch; their weight reset is not timed."
    )
    lines.append("")
    lines.append("## The raw runs")
    lines.append("")
    for m, _ in MEASURES:
        lines.append(f"- `{m}`:")
        for run in rows[m]["runs"] or ["no run"]:
            lines.append(f"  - {run}")
    lines.append("")
    lines.append("## The steps")
    lines.append("")
    lines.append("| step | result | seconds | output |")
    lines.append("|---|---|---|---|")
    for s in raw.steps:
        output = os.path.relpath(s["output"], args.out) if s["output"] else ""
        lines.append(f"| {s['id']} | {s['result']} | {s['seconds']} | {output} |")
        if s["result"].startswith("FAIL"):
            raw.note(f"{s['id']} {s['result']}: {tail(s['log'])}")
    lines.append("")
    lines.append("The exact commands, the commit and the device: `command.txt`; each step's log: `raw/<step>.log`.")
    if raw.notes or missing:
        lines.append("")
        lines.append("## Notes")
        lines.append("")
        for m in missing:
            lines.append(f"- `{m}`: no figure: its steps failed, were skipped or ran on another backend")
        for n in raw.notes:
            lines.append(f"- {n}")
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")

    print(f"{'measure':<24} {'gpumux':>12} {'peer':>12} {'ratio':>8} {'goal':>5}")
    with open(os.path.join(args.out, "ratios.csv")) as f:
        for row in list(csv.reader(f))[1:]:
            print(f"{row[0]:<24} {row[1]:>12} {row[2] or '-':>12} {row[3] or '-':>8} {row[4]:>5}")
    for n in raw.notes:
        print(f"note: {n}")
    for m in missing:
        print(f"missing: {m} has no figure")
    failed = [s["id"] for s in raw.steps if s["result"].startswith("FAIL")]
    if failed:
        print(f"failed steps: {', '.join(failed)}")
    return 1 if missing or failed else 0


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def same_device(raw, args):
    """Notes whether nvidia-smi, gpumux and PyTorch named the same GPU (by UUID)."""
    if args.backend != "cuda":
        return
    try:
        devices = open(os.path.join(raw.raw, "devices.log")).read()
    except OSError:
        devices = ""
    line = next((x for x in devices.splitlines() if x.startswith("backend: cuda")), "")
    seen = {
        "nvidia-smi": UUID.findall(args.smi),
        "gpumux": UUID.findall(line),
        "PyTorch": UUID.findall(args.torch),
    }
    named = {k: v[0].lower() for k, v in seen.items() if v}
    if len(set(named.values())) > 1:
        raw.note("NOT THE SAME GPU: " + ", ".join(f"{k} GPU-{v}" for k, v in named.items()))
    elif named:
        missing = [k for k in seen if k not in named]
        raw.note(
            f"one GPU, GPU-{next(iter(named.values()))}, named by {', '.join(named)}"
            + (f" ({', '.join(missing)}: no UUID)" if missing else "")
        )


def tail(path):
    try:
        lines = [line.rstrip() for line in open(path) if line.strip()]
    except OSError:
        return "no log"
    return " | ".join(lines[-2:])[-300:]


if __name__ == "__main__":
    sys.exit(main())
