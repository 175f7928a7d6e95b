#!/usr/bin/env python3
"""A stand-in training command for gpumux sweeps: standard library only, no GPU, no data.

It "trains" for a few short epochs and prints one JSON line per epoch, then the metrics as the
last stdout line, the way a real training script run as a sweep's `command` should. The accuracy
is a deterministic function of the learning rate (best near 3e-3) and the batch size, so a sweep
over it has a known optimum.

    python3 examples/fake_train.py --lr 0.003 --batch-size 64
"""

import argparse
import json
import math
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, required=True, help="learning rate (> 0)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.05, help="seconds per epoch")
    return p.parse_args(argv)


def final_accuracy(lr, batch_size):
    """Peaks at 0.97 for lr = 3e-3, falling off with the distance in decades; small batches help a little."""
    decades = math.log10(lr) - math.log10(3e-3)
    acc = 0.97 - 0.08 * decades * decades - 0.002 * math.log2(max(batch_size, 1) / 32)
    return min(0.99, max(0.1, acc))


def main(argv):
    args = parse_args(argv)
    if not args.lr > 0:
        print(f"fake_train: --lr must be positive, not {args.lr}", file=sys.stderr)
        return 2
    final = final_accuracy(args.lr, args.batch_size)
    started = time.monotonic()
    loss = 2.3
    for epoch in range(1, args.epochs + 1):
        time.sleep(args.sleep)
        acc = 0.1 + (final - 0.1) * epoch / args.epochs
        loss = 2.3 * (1.0 - acc) + 0.05
        line = {"epoch": epoch, "test_acc": round(acc, 4), "loss": round(loss, 4)}
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                "test_acc": round(final, 4),
                "final_loss": round(loss, 4),
                "wall_s": round(time.monotonic() - started, 3),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
