#!/usr/bin/env python3
"""Trains an MLP on the MNIST-10k digits shipped with gpumux, as a sweep's external `command`.

    pip install torch
    python3 examples/torch_train.py --lr 0.001 --batch-size 64 --epochs 3 --seed 1 --out-dir /tmp/t1

It reads data/mnist-10k/*.gz (IDX format), holds out 20% of the digits (chosen by --seed) as the
test set, trains with Adam, prints one JSON line per epoch, writes the weights (model.pt) and the
metrics (metrics.json) into --out-dir, and prints the metrics as the last stdout line. Under
gpumux it keeps to its slice: on a GPU, GPUMUX_MEM_CAP_MIB becomes
torch.cuda.set_per_process_memory_fraction, less --reserve-mib for the CUDA context, which the
caching allocator does not count but NVML (and so gpumux's watchdog) does; on the CPU, its
intra-op pool takes OMP_NUM_THREADS (or GPUMUX_THREADS) threads, and it reports them as `threads`.
"""

import argparse
import gzip
import json
import os
import struct
import sys
import time
from pathlib import Path

import torch
from torch import nn

DATA = Path(__file__).resolve().parent.parent / "data" / "mnist-10k"
MIB = 1 << 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help="folder for model.pt and metrics.json")
    p.add_argument("--data", type=Path, default=DATA, help="folder with the two IDX .gz files")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument(
        "--reserve-mib",
        type=float,
        default=512.0,
        help="part of the cap left for the CUDA context (not counted by the allocator)",
    )
    return p.parse_args(argv)


def read_idx(path, magic):
    """The items of an IDX file as a uint8 tensor shaped by its header."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    got, = struct.unpack(">I", raw[:4])
    if got != magic:
        raise ValueError(f"{path}: magic {got:#010x}, expected {magic:#010x}")
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = bytearray(raw[4 + 4 * ndim :])
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def load(folder, test_fraction, seed):
    """(train_x, train_y, test_x, test_y): pixels standardised with the training split's moments."""
    images = read_idx(folder / "images-idx3-ubyte.gz", 0x00000803)
    labels = read_idx(folder / "labels-idx1-ubyte.gz", 0x00000801).long()
    x = images.reshape(images.shape[0], -1).float() / 255.0
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    n_test = int(round(x.shape[0] * test_fraction))
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(), x[train].std().clamp_min(1e-6)
    x = (x - mean) / std
    return x[train], labels[train], x[test], labels[test]


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def apply_cap(device, reserve_mib):
    """Limits the caching allocator to the slice's cap (GPUMUX_MEM_CAP_MIB) on CUDA; returns the fraction."""
    cap = os.environ.get("GPUMUX_MEM_CAP_MIB")
    if device.type != "cuda" or not cap:
        return None
    total_mib = torch.cuda.get_device_properties(device).total_memory / MIB
    usable = max(float(cap) - reserve_mib, 0.05 * float(cap))
    fraction = min(1.0, usable / total_mib)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def apply_threads():
    """The CPU threads of the intra-op pool: OMP_NUM_THREADS (PyTorch reads it too), else
    GPUMUX_THREADS, else PyTorch's default (one per core). Returns the count in use."""
    want = os.environ.get("OMP_NUM_THREADS") or os.environ.get("GPUMUX_THREADS")
    if want and int(want) > 0:
        torch.set_num_threads(int(want))
    return torch.get_num_threads()


def os_threads():
    """Threads of this process now (Linux), or 0."""
    try:
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("Threads:"))
    except (OSError, StopIteration):
        return 0


def evaluate(model, x, y, batch):
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            logits = model(x[i : i + batch])
            loss_sum += nn.functional.cross_entropy(logits, y[i : i + batch], reduction="sum").item()
            correct += (logits.argmax(1) == y[i : i + batch]).sum().item()
    model.train()
    return correct / x.shape[0], loss_sum / x.shape[0]


def train_epoch(model, opt, x, y, batch, gen):
    """One pass over the shuffled training set; returns the mean loss."""
    order = torch.randperm(x.shape[0], generator=gen).to(x.device)
    total, steps = 0.0, 0
    for i in range(0, x.shape[0], batch):
        idx = order[i : i + batch]
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.item()
        steps += 1
    return total / max(steps, 1)


def emit(obj):
    print(json.dumps(obj), flush=True)


def main(argv):
    args = parse_args(argv)
    if not (args.lr > 0 and args.batch_size > 0 and args.epochs > 0 and args.hidden > 0):
        print("torch_train: --lr, --batch-size, --epochs and --hidden must be positive", file=sys.stderr)
        return 2
    seed = args.seed % 2**32  # gpumux's {seed} is 64-bit; keep the seeds in a range all RNGs take
    torch.manual_seed(seed)
    threads = apply_threads()
    device = pick_device(args.device)
    fraction = apply_cap(device, args.reserve_mib)
    if fraction is not None:
        print(f"torch_train: allocator limited to {fraction:.3f} of the device", file=sys.stderr)
    tx, ty, vx, vy = (t.to(device) for t in load(args.data, args.test_fraction, seed))
    model = nn.Sequential(nn.Linear(tx.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(seed + 1)
    started = time.monotonic()
    loss = float("nan")
    for epoch in range(1, args.epochs + 1):
        loss = train_epoch(model, opt, tx, ty, args.batch_size, gen)
        acc, test_loss = evaluate(model, vx, vy, 1024)
        emit({"epoch": epoch, "train_loss": loss, "test_acc": acc, "test_loss": test_loss,
              "wall_s": time.monotonic() - started})
    metrics = {"test_acc": acc, "test_loss": test_loss, "final_loss": loss, "epochs": args.epochs,
               "wall_s": time.monotonic() - started, "threads": threads, "os_threads": os_threads()}
    if device.type == "cuda":
        metrics["peak_alloc_mib"] = torch.cuda.max_memory_allocated(device) / MIB
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out_dir / "model.pt")
        env = {k: v for k, v in os.environ.items() if k.startswith("GPUMUX_") or k == "OMP_NUM_THREADS"}
        (args.out_dir / "metrics.json").write_text(json.dumps({**metrics, "seed": args.seed, "env": env}, indent=1) + "\n")
    emit(metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
