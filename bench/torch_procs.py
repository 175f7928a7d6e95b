#!/usr/bin/env python3
"""N PyTorch trainings at once, one process each: the peer of gpumux's `shared` rounds.

Starts N processes of bench/torch_mnist.py (one MLP or CNN training each, the same as one gpumux
trial), lets each warm up on its own (import, CUDA context, an untimed epoch, the weights reset),
and starts their timed trainings together: each prints `ready` once warm and waits for a start
file, which this driver creates when all N are ready. The round's makespan runs from the start
file's creation to the last process's end of training (as each process reports it, so that
process exit and CUDA context teardown are not counted); the time per training is makespan / N.

    python3 bench/torch_procs.py --n 8 --log-dir /tmp/procs -- --device cuda --epochs 5 --batch-size 64

Arguments after `--` go to every torch_mnist.py process as they are; the driver sets each one's
--seed (--seed + i), --lr (the i-th of --lrs, or --lr), --repeats 1 and --start-file itself.

Output: a CSV header and one line on stdout (appended to --out FILE too, with the header only
when FILE is new or empty):

    impl,model,device,n,epochs,batch_size,makespan_s,time_per_training_s,samples_per_s,start_spread_s,ready_s,train_s_median,test_acc_mean

`start_spread_s` is how long after the start file the last process began its timed training,
`ready_s` how long after launch the last one was warm; `samples_per_s` is all N trainings'
samples over the makespan. `<log-dir>/procs.csv` has one row per process (times from the start
file's creation), `<log-dir>/proc-NN.csv` and `proc-NN.log` each process's stdout and stderr.

Exit codes as torch_mnist.py's: 2 bad input, 3 PyTorch or the device missing (any process that
exits 3), 1 a process failed otherwise or the driver's --timeout ran out; the processes left are
then killed.
"""

import argparse
import csv
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HEADER = [
    "impl",
    "model",
    "device",
    "n",
    "epochs",
    "batch_size",
    "makespan_s",
    "time_per_training_s",
    "samples_per_s",
    "start_spread_s",
    "ready_s",
    "train_s_median",
    "test_acc_mean",
]
PROC_HEADER = ["proc", "pid", "seed", "lr", "exit", "ready_s", "started_s", "ended_s", "train_s", "test_acc"]
BAD_INPUT = 2
NO_DEVICE = 3
FAILED = 1
# Flags of torch_mnist.py that the driver sets for each process.
OWNED = ("--seed", "--lr", "--repeats", "--start-file", "--out", "--dry-run")
TIMED = re.compile(r"^timed region 1: started_at ([0-9.]+) ended_at ([0-9.]+)$", re.M)


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def parse_lrs(text):
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"learning rates must be numbers: {text}") from e
    if not lrs or any(not lr > 0.0 for lr in lrs):
        raise argparse.ArgumentTypeError(f"learning rates must be positive: {text}")
    return lrs


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(
        description="N torch_mnist.py trainings at once, warmed up apart and started together.",
        epilog="Arguments after -- go to every torch_mnist.py process.",
    )
    p.add_argument("--n", type=positive_int, required=True, help="processes (trainings) at once")
    p.add_argument("--seed", type=int, default=0, help="process i gets seed + i")
    p.add_argument("--lr", type=float, default=0.001, help="every process's lr, unless --lrs")
    p.add_argument("--lrs", type=parse_lrs, help="comma-separated; process i gets the i-th (cycled)")
    p.add_argument("--python", default=sys.executable, help="the Python that runs torch_mnist.py")
    p.add_argument("--script", default=os.path.join(here, "torch_mnist.py"))
    p.add_argument("--log-dir", help="each process's output and procs.csv (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole round, warm-ups included")
    p.add_argument("--out", help="append the CSV line to this file too")
    args, rest = p.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    for word in rest:
        if word.split("=", 1)[0] in OWNED:
            p.error(f"{word.split('=', 1)[0]} is set by the driver for each process")
    if not args.lr > 0.0:
        p.error("--lr must be positive")
    if not args.timeout > 0.0:
        p.error("--timeout must be positive")
    if not os.path.isfile(args.script):
        p.error(f"{args.script} does not exist")
    args.child_args = rest
    return args


class Round:
    """The N processes, their files, and what they reported."""

    def __init__(self, args, folder):
        self.args = args
        self.folder = folder
        self.start_file = os.path.join(folder, "start")
        self.procs = []

    def launch(self):
        a = self.args
        base = [a.python, a.script, *a.child_args]
        for i in range(a.n):
            lr = a.lrs[i % len(a.lrs)] if a.lrs else a.lr
            cmd = base + ["--seed", str(a.seed + i), "--lr", repr(lr), "--repeats", "1", "--start-file", self.start_file]
            out = open(os.path.join(self.folder, f"proc-{i:02d}.csv"), "w")
            err = open(os.path.join(self.folder, f"proc-{i:02d}.log"), "w")
            # Its own session, so that a stop ends it and everything it started.
            p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
            out.close()
            err.close()
            self.procs.append({"i": i, "seed": a.seed + i, "lr": lr, "p": p, "ready": None})
        log(f"launched {a.n} processes: {' '.join(base)} --seed {a.seed}+i --lr ... --repeats 1 --start-file {self.start_file}")

    def stderr(self, proc):
        try:
            with open(os.path.join(self.folder, f"proc-{proc['i']:02d}.log")) as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, proc):
        lines = [line for line in self.stderr(proc).splitlines() if line.strip()]
        return " | ".join(lines[-3:])

    def kill(self):
        for proc in self.procs:
            if proc["p"].poll() is None:
                try:
                    os.killpg(proc["p"].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc["p"].wait()

    def failure(self, proc):
        """The driver's exit code for a process that ended before its time, after saying why."""
        code = proc["p"].returncode
        log(f"error: process {proc['i']} (pid {proc['p'].pid}) exited {code} early: {self.tail(proc)}")
        return code if code in (BAD_INPUT, NO_DEVICE) else FAILED

    def wait_ready(self, deadline, launched):
        while True:
            waiting = 0
            for proc in self.procs:
                if proc["ready"] is not None:
                    continue
                if "\nready:" in "\n" + self.stderr(proc):
                    proc["ready"] = time.time() - launched
                    continue
                if proc["p"].poll() is not None:
                    return self.failure(proc)
                waiting += 1
            if not waiting:
                return 0
            if time.time() > deadline:
                log(f"error: {waiting} of {self.args.n} processes not warm within --timeout {self.args.timeout:g} s")
                return FAILED
            time.sleep(0.01)

    def wait_done(self, deadline):
        for proc in self.procs:
            left = max(deadline - time.time(), 0.01)
            try:
                proc["p"].wait(timeout=left)
            except subprocess.TimeoutExpired:
                log(f"error: process {proc['i']} still training at the --timeout of {self.args.timeout:g} s")
                return FAILED
            if proc["p"].returncode != 0:
                return self.failure(proc)
        return 0

    def results(self, t0):
        """Each process's CSV row and timed region, or an error message."""
        for proc in self.procs:
            try:
                with open(os.path.join(self.folder, f"proc-{proc['i']:02d}.csv")) as f:
                    rows = list(csv.DictReader(f))
            except OSError as e:
                return f"process {proc['i']}: {e}"
            m = TIMED.search(self.stderr(proc))
            if len(rows) != 1 or not m:
                return f"process {proc['i']}: no CSV row or no timed region in its output"
            proc["row"] = rows[0]
            proc["started"] = float(m.group(1)) - t0
            proc["ended"] = float(m.group(2)) - t0
        return ""


def emit(line, out_path):
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerow(line)
    sys.stdout.flush()
    if out_path:
        fresh = not os.path.exists(out_path) or os.path.getsize(out_path) == 0
        with open(out_path, "a", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            if fresh:
                w.writerow(HEADER)
            w.writerow(line)


def main(argv=None):
    args = parse_args(argv)
    folder = args.log_dir or tempfile.mkdtemp(prefix="torch-procs.")
    os.makedirs(folder, exist_ok=True)
    rnd = Round(args, folder)
    if os.path.exists(rnd.start_file):
        os.remove(rnd.start_file)

    def stop(signum, _frame):
        rnd.kill()
        log(f"stopped by signal {signum}")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    launched = time.time()
    deadline = launched + args.timeout
    rnd.launch()
    try:
        code = rnd.wait_ready(deadline, launched)
        if code:
            return code
        ready_s = max(p["ready"] for p in rnd.procs)
        log(f"all {args.n} warm {ready_s:.2f} s after launch; starting them together")
        t0 = time.time()
        with open(rnd.start_file, "w"):
            pass
        code = rnd.wait_done(deadline)
        if code:
            return code
    finally:
        rnd.kill()
    why = rnd.results(t0)
    if why:
        log(f"error: {why}")
        return FAILED

    procs = rnd.procs
    first = procs[0]["row"]
    makespan = max(p["ended"] for p in procs)
    spread = max(p["started"] for p in procs)
    # Each process's training samples (full batches x epochs), from its own figures.
    samples = sum(round(float(p["row"]["samples_per_s"]) * float(p["row"]["train_s"])) for p in procs)
    train_s = [float(p["row"]["train_s"]) for p in procs]
    accs = [float(p["row"]["test_acc"]) for p in procs]
    with open(os.path.join(folder, "procs.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(PROC_HEADER)
        for p in procs:
            w.writerow(
                [p["i"], p["p"].pid, p["seed"], repr(p["lr"]), p["p"].returncode, f"{p['ready']:.3f}",
                 f"{p['started']:.6f}", f"{p['ended']:.6f}", p["row"]["train_s"], p["row"]["test_acc"]]
            )
    line = [
        f"{first['impl']}-procs",
        first["model"],
        first["device"],
        args.n,
        first["epochs"],
        first["batch_size"],
        f"{makespan:.4f}",
        f"{makespan / args.n:.5f}",
        f"{samples / makespan:.1f}",
        f"{spread:.4f}",
        f"{ready_s:.2f}",
        f"{statistics.median(train_s):.4f}",
        f"{statistics.fmean(accs):.4f}",
    ]
    emit(line, args.out)
    log(
        f"{args.n} processes: makespan {makespan:.3f} s ({makespan / args.n:.4f} s per training), "
        f"last start {spread * 1e3:.1f} ms after the signal, median train_s {statistics.median(train_s):.3f} s; "
        f"logs in {folder}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
