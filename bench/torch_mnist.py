#!/usr/bin/env python3
"""The PyTorch peer of gpumux: times ONE training of the same MLP or CNN on MNIST-10k.

Same model, initialisation, optimiser, hyperparameters and data handling as a gpumux trial, so that
one gpumux training and one PyTorch training can be timed side by side on the same GPU:

* data: data/mnist-10k/{images,labels}-idx*-ubyte.gz, pixels byte/255, a seeded class-stratified
  80/20 split (8000/2000; the same sizes and per-class counts as gpumux, not the same permutation),
  standardised with the training split's pixel mean and standard deviation;
* model: MLP 784-128-10 (--hidden 256,128,100 for others) or the CNN
  conv(1->32,3x3)-ReLU-conv(32->64,3x3)-ReLU-maxpool(2)-[dropout]-fc(9216->128)-ReLU-[dropout]-fc(128->10);
  PyTorch's default initialisation, U(+-1/sqrt(fan_in)) for weights and biases;
* training: Adam (betas 0.9/0.999, eps 1e-8) or SGD with momentum, L2 weight decay as PyTorch's,
  mean cross-entropy, a fresh seeded shuffle every epoch, drop_last=True; the whole dataset lives on
  the device and batches are gathered with index tensors (no DataLoader, no worker processes);
* evaluation: the test split after every epoch (as gpumux does; --eval end for the last one only).

Timing: one untimed warm-up epoch (training and evaluation) runs first on the same model, so the
CUDA context, cuBLAS/cuDNN handles and torch.compile's compilation stay out of the timed region;
the model's weights are then restored to their seeded initial values and the optimiser is made anew
before each timed repeat. Each timed region starts and ends with torch.cuda.synchronize().
With --start-file PATH (for N processes timed together, bench/torch_procs.py), the process prints
`ready: ...` on stderr once warm and reset, waits until PATH exists, and prints each timed region's
start and end in Unix seconds on stderr (`timed region 1: started_at S ended_at E`).

Output: a CSV header and one line per repeat on stdout (--out FILE appends the same lines, with the
header only when FILE is new or empty); settings, per-epoch progress (-v) and the median go to stderr.

--dry-run reads, splits and standardises the data and prints what it found without importing torch.
"""

import argparse
import csv
import gzip
import math
import os
import statistics
import struct
import sys
import time

import numpy as np

HEADER = [
    "impl",
    "model",
    "device",
    "epochs",
    "batch_size",
    "lr",
    "optimizer",
    "train_s",
    "samples_per_s",
    "test_acc",
]

IMAGES_FILE = "images-idx3-ubyte.gz"
LABELS_FILE = "labels-idx1-ubyte.gz"
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
CLASSES = 10
# Exit codes as gpumux's: bad input 2, the requested device is not there 3.
BAD_INPUT = 2
NO_DEVICE = 3


class BadInput(Exception):
    """A data file or an argument that cannot be used."""


# ---------------------------------------------------------------------------------------------
# Data (standard library and numpy only)


def read_idx(path, magic, ndim):
    """Reads a gzip-compressed IDX file of unsigned bytes; returns a numpy array of its dimensions."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise BadInput(f"{path}: {e}") from e
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise BadInput(f"{path}: {len(raw)} bytes, too short for an IDX header")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise BadInput(f"{path}: magic {found:#010x}, expected {magic:#010x}")
    dims = struct.unpack(">" + "I" * ndim, raw[4:head])
    count = math.prod(dims)
    if len(raw) - head != count:
        raise BadInput(f"{path}: {len(raw) - head} data bytes, dimensions {dims} need {count}")
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(dims)


def load_mnist(folder):
    """The images (n, 28, 28) and labels (n,) of an MNIST-10k folder, as uint8."""
    images = read_idx(os.path.join(folder, IMAGES_FILE), IMAGES_MAGIC, 3)
    labels = read_idx(os.path.join(folder, LABELS_FILE), LABELS_MAGIC, 1)
    if images.shape[0] != labels.shape[0]:
        raise BadInput(f"{folder}: {images.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and int(labels.max()) >= CLASSES:
        raise BadInput(f"{folder}: label {int(labels.max())} is not a digit")
    return images, labels


def stratified_split(labels, test_fraction, seed):
    """Splits indices 0..n into (train, test) index arrays.

    The test side gets round(n * test_fraction) samples (halves round up), shared among the classes
    in proportion to their counts, the largest remainders taking the leftover ones (ties: lower
    class). Which samples of a class go to the test side, and the order of both sides, come from
    one seeded permutation.
    """
    n = len(labels)
    target = min(int(math.floor(n * test_fraction + 0.5)), n)
    counts = np.bincount(labels, minlength=CLASSES)
    quota = [0] * len(counts)
    remainders = []
    for c, count in enumerate(counts.tolist()):
        exact = count * test_fraction
        quota[c] = min(int(math.floor(exact)), count)
        if quota[c] < count:
            remainders.append((-(exact - math.floor(exact)), c))
    remainders.sort()
    for _, c in remainders[: max(target - sum(quota), 0)]:
        quota[c] += 1
    order = np.random.default_rng(seed).permutation(n)
    train, test = [], []
    for i in order.tolist():
        c = int(labels[i])
        if quota[c] > 0:
            quota[c] -= 1
            test.append(i)
        else:
            train.append(i)
    return np.asarray(train, dtype=np.int64), np.asarray(test, dtype=np.int64)


def standardise(train_bytes, test_bytes):
    """Scales bytes to [0, 1] (float32), then standardises both sides with the training side's
    pixel mean and (population) standard deviation, computed in float64 over every pixel."""
    train = train_bytes.astype(np.float32) / np.float32(255.0)
    test = test_bytes.astype(np.float32) / np.float32(255.0)
    mean = float(train.astype(np.float64).mean())
    std = float(np.sqrt(((train.astype(np.float64) - mean) ** 2).mean()))
    scale = 1.0 / std if std > 1e-12 else 1.0
    train = ((train.astype(np.float64) - mean) * scale).astype(np.float32)
    test = ((test.astype(np.float64) - mean) * scale).astype(np.float32)
    return train, test, mean, std


def prepare(args):
    """The standardised splits as numpy arrays: (x_train, y_train, x_test, y_test, mean, std)."""
    images, labels = load_mnist(args.data)
    train_idx, test_idx = stratified_split(labels, args.test_fraction, args.seed)
    x_train, x_test, mean, std = standardise(images[train_idx], images[test_idx])
    # (n, 1, 28, 28): the CNN's layout; the MLP flattens it.
    x_train = x_train.reshape(len(train_idx), 1, 28, 28)
    x_test = x_test.reshape(len(test_idx), 1, 28, 28)
    return x_train, labels[train_idx], x_test, labels[test_idx], mean, std


# ---------------------------------------------------------------------------------------------
# Arguments and output


def parse_hidden(text):
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"hidden widths must be integers: {text}") from e
    if not widths or any(w < 1 for w in widths):
        raise argparse.ArgumentTypeError(f"hidden widths must be positive: {text}")
    return widths


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def parse_args(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(
        description="Time one PyTorch training of the gpumux MLP/CNN on MNIST-10k.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", type=parse_hidden, default=[128], help="MLP hidden widths, e.g. 256,128,100")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--epochs", type=positive_int, default=5)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD only")
    p.add_argument("--weight-decay", type=float, default=0.0, help="L2, added to the gradient")
    p.add_argument("--seed", type=int, default=0, help="fixes the split, the initial weights and the shuffles")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--tf32", action="store_true", help="allow TF32 in matmuls and convolutions (gpumux's default is off)")
    p.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's)")
    p.add_argument("--eval", choices=["each", "end"], default="each", help="evaluate after each epoch or only the last")
    p.add_argument("--repeats", type=positive_int, default=1, help="timed trainings")
    p.add_argument("--data", default=os.path.join(root, "data", "mnist-10k"), help="folder with the two IDX files")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--out", help="append the CSV lines to this file too")
    p.add_argument(
        "--start-file",
        help="after the warm-up, print 'ready' on stderr and wait until this file exists before the first timed "
        "training; each repeat's start and end (Unix seconds) go to stderr (for N processes started together)",
    )
    p.add_argument("--dry-run", action="store_true", help="check the data and split only; torch is not imported")
    p.add_argument("-v", "--verbose", action="store_true", help="per-epoch loss and accuracy on stderr")
    args = p.parse_args(argv)
    if not 0.0 < args.test_fraction < 1.0:
        p.error("--test-fraction must lie strictly between 0 and 1")
    if not 0.0 <= args.dropout < 1.0:
        p.error("--dropout must lie in [0, 1)")
    if not args.lr > 0.0:
        p.error("--lr must be positive")
    return args


def model_name(args):
    if args.model == "mlp":
        name = "mlp-" + "-".join(str(w) for w in args.hidden)
    else:
        name = "cnn"
    if args.dropout > 0.0:
        name += f"-dropout{args.dropout:g}"
    return name


def csv_row(args, train_s, test_acc, samples):
    return [
        "torch-compile" if args.compile else "torch",
        model_name(args),
        args.device,
        args.epochs,
        args.batch_size,
        f"{args.lr:g}",
        args.optimizer,
        f"{train_s:.4f}",
        f"{samples / train_s:.1f}" if train_s > 0 else "",
        f"{test_acc:.4f}",
    ]


def emit(rows, out_path):
    """Writes the header and rows to stdout, and appends them to out_path (header if new)."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerows(rows)
    sys.stdout.flush()
    if out_path:
        fresh = not os.path.exists(out_path) or os.path.getsize(out_path) == 0
        with open(out_path, "a", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            if fresh:
                w.writerow(HEADER)
            w.writerows(rows)


def optimiser_words(args):
    words = "adam" if args.optimizer == "adam" else f"sgd (momentum {args.momentum:g})"
    if args.weight_decay:
        words += f", weight decay {args.weight_decay:g}"
    return words


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Training (torch is imported only here)


def build_model(nn, args):
    layers = []
    if args.model == "mlp":
        layers.append(nn.Flatten())
        width = 28 * 28
        for h in args.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if args.dropout > 0.0:
                layers.append(nn.Dropout(args.dropout))
            width = h
        layers.append(nn.Linear(width, CLASSES))
    else:
        layers += [
            nn.Conv2d(1, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        if args.dropout > 0.0:
            layers.append(nn.Dropout(args.dropout))
        layers += [nn.Flatten(), nn.Linear(64 * 12 * 12, 128), nn.ReLU()]
        if args.dropout > 0.0:
            layers.append(nn.Dropout(args.dropout))
        layers.append(nn.Linear(128, CLASSES))
    return nn.Sequential(*layers)


def make_optimizer(torch, params, args):
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


class Trainer:
    """The model, its seeded initial weights, and the device-resident data."""

    def __init__(self, torch, args, data):
        self.torch = torch
        self.F = torch.nn.functional
        self.args = args
        self.device = torch.device(args.device)
        x_train, y_train, x_test, y_test, _, _ = data
        self.x_train = torch.from_numpy(x_train).to(self.device)
        self.y_train = torch.from_numpy(y_train.astype(np.int64)).to(self.device)
        self.x_test = torch.from_numpy(x_test).to(self.device)
        self.y_test = torch.from_numpy(y_test.astype(np.int64)).to(self.device)
        # Initialised on the CPU from the seed, so the weights do not depend on the device.
        torch.manual_seed(args.seed)
        model = build_model(torch.nn, args)
        self.initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.model = model.to(self.device)
        self.forward = torch.compile(self.model) if args.compile else self.model
        self.shuffle = torch.Generator(device=self.device)
        self.steps = self.x_train.shape[0] // args.batch_size

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def reset(self):
        """Restores the seeded initial weights in place (a compiled model keeps its graphs), a new
        optimiser, and the seeded shuffle."""
        self.model.load_state_dict(self.initial)
        self.optimizer = make_optimizer(self.torch, self.model.parameters(), self.args)
        self.shuffle.manual_seed(self.args.seed)

    def train_epoch(self):
        """One epoch of full batches; returns the (device) sums of loss and correct predictions."""
        torch, bs = self.torch, self.args.batch_size
        self.model.train()
        order = torch.randperm(self.x_train.shape[0], device=self.device, generator=self.shuffle)
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for step in range(self.steps):
            idx = order[step * bs : (step + 1) * bs]
            xb = self.x_train.index_select(0, idx)
            yb = self.y_train.index_select(0, idx)
            logits = self.forward(xb)
            loss = self.F.cross_entropy(logits, yb)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            loss_sum += loss.detach()
            correct += (logits.detach().argmax(1) == yb).sum()
        return loss_sum, correct

    def evaluate(self):
        """Mean loss and accuracy over the test split, in batches of batch_size (the last partial)."""
        torch, bs = self.torch, self.args.batch_size
        n = self.x_test.shape[0]
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        with torch.no_grad():
            for start in range(0, n, bs):
                xb, yb = self.x_test[start : start + bs], self.y_test[start : start + bs]
                logits = self.forward(xb)
                loss_sum += self.F.cross_entropy(logits, yb, reduction="sum")
                correct += (logits.argmax(1) == yb).sum()
        return loss_sum.item() / n, correct.item() / n

    def train(self, epochs, label, eval_each):
        """Trains `epochs` epochs from the current weights; evaluates after each epoch with
        `eval_each`, else after the last one only; returns the final test accuracy."""
        n_train = self.steps * self.args.batch_size
        test_acc = float("nan")
        for epoch in range(1, epochs + 1):
            loss_sum, correct = self.train_epoch()
            if eval_each or epoch == epochs:
                test_loss, test_acc = self.evaluate()
                train_loss = loss_sum.item() / self.steps
                if not math.isfinite(train_loss):
                    log(f"{label}: training loss is {train_loss} at epoch {epoch}")
                if self.args.verbose:
                    log(
                        f"{label} epoch {epoch}: train loss {train_loss:.4f} acc {correct.item() / n_train:.4f}, "
                        f"test loss {test_loss:.4f} acc {test_acc:.4f}"
                    )
        return test_acc


def wait_for_start(path):
    """Says the process is warm ('ready' on stderr), then waits until `path` exists (polled every
    millisecond), so that N processes warmed up one by one start their timed trainings together."""
    log(f"ready: warm, waiting for {path}")
    while not os.path.exists(path):
        time.sleep(0.001)


def set_tf32(torch, on):
    """Allows or forbids TF32 in CUDA matmuls and cuDNN convolutions (forbidden: full FP32)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        # PyTorch 2.9 and later; the allow_tf32 flags are deprecated there.
        precision = "tf32" if on else "ieee"
        matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:
        matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def run(args, data):
    try:
        import torch
    except ImportError:
        log("error: PyTorch is not installed (python3 -m pip install torch); --dry-run needs no torch")
        return NO_DEVICE
    if args.device == "cuda" and not torch.cuda.is_available():
        log("error: --device cuda, but torch sees no CUDA device (use --device cpu)")
        return NO_DEVICE
    if args.threads:
        torch.set_num_threads(args.threads)
    set_tf32(torch, args.tf32)
    n_train = data[0].shape[0]
    if args.batch_size > n_train:
        log(f"error: batch size {args.batch_size} is larger than the {n_train} training samples")
        return BAD_INPUT

    trainer = Trainer(torch, args, data)
    where = torch.cuda.get_device_name(trainer.device) if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    log(
        f"torch {torch.__version__} on {where}; {model_name(args)}, {optimiser_words(args)}, lr {args.lr:g}, "
        f"batch {args.batch_size}, {args.epochs} epochs, train {n_train} / test {data[2].shape[0]}, "
        f"tf32 {'on' if args.tf32 else 'off'}, compile {'on' if args.compile else 'off'}, eval {args.eval}"
    )
    log("warm-up: one untimed epoch (training and evaluation), then the weights are reset")
    trainer.reset()
    trainer.train(1, "warm-up", eval_each=True)
    trainer.sync()

    samples = trainer.steps * args.batch_size * args.epochs
    rows, times = [], []
    for r in range(args.repeats):
        trainer.reset()
        trainer.sync()
        if r == 0 and args.start_file:
            wait_for_start(args.start_file)
        wall_start = time.time()
        started = time.perf_counter()
        test_acc = trainer.train(args.epochs, f"repeat {r + 1}", args.eval == "each")
        trainer.sync()
        elapsed = time.perf_counter() - started
        if args.start_file:
            log(f"timed region {r + 1}: started_at {wall_start:.6f} ended_at {wall_start + elapsed:.6f}")
        times.append(elapsed)
        rows.append(csv_row(args, elapsed, test_acc, samples))
        log(f"repeat {r + 1}/{args.repeats}: {elapsed:.3f} s, test acc {test_acc:.4f}")
    emit(rows, args.out)
    median = statistics.median(times)
    log(f"median of {len(times)}: train_s {median:.4f}, samples_per_s {samples / median:.1f}")
    return 0


def dry_run(args, data):
    x_train, y_train, x_test, y_test, mean, std = data
    log(f"data {args.data}: train {x_train.shape[0]}, test {x_test.shape[0]}")
    log(f"train pixel mean {mean:.6f}, std {std:.6f} (after standardising: {x_train.mean():.2e}, {x_train.std():.4f})")
    log("test per class: " + " ".join(str(c) for c in np.bincount(y_test, minlength=CLASSES).tolist()))
    log(f"model {model_name(args)}; steps per epoch {x_train.shape[0] // args.batch_size} (drop_last)")
    print(",".join(HEADER))
    return 0


def main(argv=None):
    args = parse_args(argv)
    try:
        data = prepare(args)
    except BadInput as e:
        log(f"error: {e}")
        return BAD_INPUT
    if args.dry_run:
        return dry_run(args, data)
    return run(args, data)


if __name__ == "__main__":
    sys.exit(main())
