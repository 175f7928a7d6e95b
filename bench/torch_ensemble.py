#!/usr/bin/env python3
"""The PyTorch peer of gpumux's `fused` split: N MLPs trained as one ensemble with torch.func.

The N members are the MLP of bench/torch_mnist.py (784-128-10 by default), each with PyTorch's
default initialisation drawn on the CPU from its own seed (--seed + i), stacked with
torch.func.stack_module_state, and trained together: every step gathers each member's batch from
its own shuffle of the training split, runs vmap over grad_and_value of functional_call (one
forward and backward for all N), and updates the stacked parameters with Adam (betas 0.9/0.999,
eps 1e-8, as torch.optim.Adam computes it) where each member has its own learning rate. The data
(MNIST-10k, the seeded 80/20 split, standardised) is loaded by torch_mnist.py's own functions and
sits on the device. Evaluation: the test split after every epoch, for all members in one vmap per
batch (--eval end: after the last epoch only), as torch_mnist.py does for one model.

Learning rates: --lrs (comma-separated, one per member, e.g. the trials of a gpumux fused round),
or N log-uniform draws from [--lr-min, --lr-max] (those of jobs/mnist-fib.yaml) with --seed.

Timing: one untimed warm-up epoch (training and evaluation), then the parameters, Adam's state
and the shuffles are reset to their initial values before each of --repeats timed trainings.
Each timed region starts and ends with torch.cuda.synchronize(). `samples_per_s` counts the
whole ensemble's training samples (N x full batches x epochs) per second.

Output: a CSV header and one line per repeat on stdout (--out FILE appends them, with the header
only when FILE is new or empty):

    impl,model,device,n,epochs,batch_size,lr_min,lr_max,optimizer,train_s,samples_per_s,test_acc_mean,test_acc_min,test_acc_max

Exit codes as torch_mnist.py's: 2 bad input, 3 PyTorch or the requested device missing.
"""

import argparse
import copy
import csv
import math
import os
import statistics
import sys
import time

import numpy as np

# torch_mnist.py, imported from beside this file, without leaving a __pycache__ in bench/.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_mnist  # noqa: E402  (the data, the model and the exit codes are torch_mnist.py's)

HEADER = [
    "impl",
    "model",
    "device",
    "n",
    "epochs",
    "batch_size",
    "lr_min",
    "lr_max",
    "optimizer",
    "train_s",
    "samples_per_s",
    "test_acc_mean",
    "test_acc_min",
    "test_acc_max",
]
BETAS = (0.9, 0.999)
EPS = 1e-8
log = torch_mnist.log


def parse_lrs(text):
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"learning rates must be numbers: {text}") from e
    if not lrs or any(not lr > 0.0 for lr in lrs):
        raise argparse.ArgumentTypeError(f"learning rates must be positive: {text}")
    return lrs


def parse_args(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(
        description="Time a torch.func ensemble of N MLPs (the peer of gpumux's fused split) on MNIST-10k.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--n", type=torch_mnist.positive_int, default=34, help="members of the ensemble")
    p.add_argument("--hidden", type=torch_mnist.parse_hidden, default=[128], help="MLP hidden widths")
    p.add_argument("--epochs", type=torch_mnist.positive_int, default=5)
    p.add_argument("--batch-size", type=torch_mnist.positive_int, default=64)
    p.add_argument("--lrs", type=parse_lrs, help="one learning rate per member, comma-separated")
    p.add_argument("--lr-min", type=float, default=0.0003, help="without --lrs: log-uniform draws from here")
    p.add_argument("--lr-max", type=float, default=0.003, help="without --lrs: ... to here")
    p.add_argument("--seed", type=int, default=0, help="the split and the lr draws; member i is initialised from seed + i")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tf32", action="store_true", help="allow TF32 in matmuls (gpumux's default is off)")
    p.add_argument("--threads", type=torch_mnist.positive_int, help="CPU threads for torch (default: torch's)")
    p.add_argument("--eval", choices=["each", "end"], default="each", help="evaluate after each epoch or only the last")
    p.add_argument("--repeats", type=torch_mnist.positive_int, default=1, help="timed trainings")
    p.add_argument("--data", default=os.path.join(root, "data", "mnist-10k"), help="folder with the two IDX files")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--out", help="append the CSV lines to this file too")
    p.add_argument("-v", "--verbose", action="store_true", help="per-epoch loss and accuracy on stderr")
    args = p.parse_args(argv)
    if not 0.0 < args.test_fraction < 1.0:
        p.error("--test-fraction must lie strictly between 0 and 1")
    if args.lrs is not None and len(args.lrs) != args.n:
        p.error(f"--lrs has {len(args.lrs)} learning rates for --n {args.n} members")
    if args.lrs is None and not 0.0 < args.lr_min <= args.lr_max:
        p.error("--lr-min and --lr-max must be positive, the first not above the second")
    # torch_mnist.py's data and model functions read these.
    args.model, args.dropout = "mlp", 0.0
    return args


def learning_rates(args):
    if args.lrs is not None:
        return args.lrs
    rng = np.random.default_rng(args.seed)
    lo, hi = math.log(args.lr_min), math.log(args.lr_max)
    return [float(math.exp(x)) for x in rng.uniform(lo, hi, size=args.n)]


class Ensemble:
    """The stacked members, Adam's state, the shuffles and the device-resident data."""

    def __init__(self, torch, args, data, lrs):
        from torch.func import functional_call, grad_and_value, stack_module_state, vmap

        self.torch, self.args = torch, args
        self.F = torch.nn.functional
        self.device = torch.device(args.device)
        x_train, y_train, x_test, y_test, _, _ = data
        dev = self.device
        self.x_train = torch.from_numpy(x_train.reshape(len(x_train), -1)).to(dev)
        self.y_train = torch.from_numpy(y_train.astype(np.int64)).to(dev)
        self.x_test = torch.from_numpy(x_test.reshape(len(x_test), -1)).to(dev)
        self.y_test = torch.from_numpy(y_test.astype(np.int64)).to(dev)
        self.n = args.n
        self.steps = self.x_train.shape[0] // args.batch_size
        # Each member as torch_mnist.py builds one model, on the CPU from its own seed.
        members = []
        for i in range(args.n):
            torch.manual_seed(args.seed + i)
            members.append(torch_mnist.build_model(torch.nn, args))
        params, buffers = stack_module_state(members)
        self.names = list(params)
        self.initial = [params[k].detach().to(dev) for k in self.names]
        self.params = [t.clone() for t in self.initial]
        self.buffers = {k: v.to(dev) for k, v in buffers.items()}
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.lrs = torch.tensor(lrs, dtype=self.params[0].dtype, device=dev)
        # Each parameter's lr shape: (N, 1, ...) broadcasts over that member's slice.
        self.lr_shapes = [(self.n,) + (1,) * (p.dim() - 1) for p in self.params]
        self.t = 0
        self.shuffle = torch.Generator(device=dev)
        base = copy.deepcopy(members[0]).to("meta")
        F = self.F

        def member_loss(p, b, x, y):
            logits = functional_call(base, (p, b), (x,))
            loss = F.cross_entropy(logits, y)
            return loss, (logits.argmax(1) == y).sum()

        def member_eval(p, b, x, y):
            logits = functional_call(base, (p, b), (x,))
            return F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()

        self.step_fn = vmap(grad_and_value(member_loss, has_aux=True))
        # The test batch is the same for every member.
        self.eval_fn = vmap(member_eval, in_dims=(0, 0, None, None))

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def as_dict(self):
        return dict(zip(self.names, self.params))

    def reset(self):
        """The seeded initial weights, a fresh Adam state and the seeded shuffles."""
        torch = self.torch
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.initial)
            torch._foreach_zero_(self.exp_avg)
            torch._foreach_zero_(self.exp_avg_sq)
        self.t = 0
        self.shuffle.manual_seed(self.args.seed)

    def adam(self, grads):
        """One Adam step over the stacked parameters, each member with its own lr (as torch.optim.Adam)."""
        torch = self.torch
        self.t += 1
        b1, b2 = BETAS
        bc1 = 1.0 - b1**self.t
        bc2_sqrt = math.sqrt(1.0 - b2**self.t)
        with torch.no_grad():
            torch._foreach_lerp_(self.exp_avg, grads, 1.0 - b1)
            torch._foreach_mul_(self.exp_avg_sq, b2)
            torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, 1.0 - b2)
            denom = torch._foreach_sqrt(self.exp_avg_sq)
            torch._foreach_div_(denom, bc2_sqrt)
            torch._foreach_add_(denom, EPS)
            step = torch._foreach_div(self.exp_avg, denom)
            size = self.lrs / bc1
            torch._foreach_mul_(step, [size.view(s) for s in self.lr_shapes])
            torch._foreach_sub_(self.params, step)

    def train_epoch(self):
        """One epoch of full batches, each member on its own shuffle; returns the (device) sums of
        every member's loss and correct predictions."""
        torch, bs = self.torch, self.args.batch_size
        n_train = self.x_train.shape[0]
        keys = torch.rand((self.n, n_train), device=self.device, generator=self.shuffle)
        order = keys.argsort(dim=1)
        loss_sum = torch.zeros(self.n, device=self.device)
        correct = torch.zeros(self.n, dtype=torch.int64, device=self.device)
        for step in range(self.steps):
            idx = order[:, step * bs : (step + 1) * bs]
            xb, yb = self.x_train[idx], self.y_train[idx]
            grads, (loss, hits) = self.step_fn(self.as_dict(), self.buffers, xb, yb)
            self.adam([grads[k] for k in self.names])
            loss_sum += loss
            correct += hits
        return loss_sum, correct

    def evaluate(self):
        """Every member's accuracy over the test split, in batches of batch_size (the last partial)."""
        torch, bs = self.torch, self.args.batch_size
        n = self.x_test.shape[0]
        loss_sum = torch.zeros(self.n, device=self.device)
        correct = torch.zeros(self.n, dtype=torch.int64, device=self.device)
        with torch.no_grad():
            params = self.as_dict()
            for start in range(0, n, bs):
                loss, hits = self.eval_fn(params, self.buffers, self.x_test[start : start + bs], self.y_test[start : start + bs])
                loss_sum += loss
                correct += hits
        return (loss_sum / n).tolist(), (correct.double() / n).tolist()

    def train(self, epochs, label, eval_each):
        accs = [float("nan")] * self.n
        for epoch in range(1, epochs + 1):
            loss_sum, _ = self.train_epoch()
            if eval_each or epoch == epochs:
                _, accs = self.evaluate()
                losses = (loss_sum / self.steps).tolist()
                bad = sum(1 for x in losses if not math.isfinite(x))
                if bad:
                    log(f"{label}: {bad} members' training loss is not finite at epoch {epoch}")
                if self.args.verbose:
                    log(
                        f"{label} epoch {epoch}: train loss {statistics.fmean(losses):.4f} (mean), "
                        f"test acc {statistics.fmean(accs):.4f} mean, {min(accs):.4f} to {max(accs):.4f}"
                    )
        return accs


def csv_row(args, lrs, train_s, samples, accs):
    return [
        "torch-func",
        "mlp-" + "-".join(str(w) for w in args.hidden),
        args.device,
        args.n,
        args.epochs,
        args.batch_size,
        f"{min(lrs):g}",
        f"{max(lrs):g}",
        "adam",
        f"{train_s:.4f}",
        f"{samples / train_s:.1f}" if train_s > 0 else "",
        f"{statistics.fmean(accs):.4f}",
        f"{min(accs):.4f}",
        f"{max(accs):.4f}",
    ]


def emit(rows, out_path):
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


def run(args, data):
    try:
        import torch
        import torch.func  # noqa: F401  (PyTorch 2.0 and later)
    except ImportError:
        log("error: PyTorch 2.0 or later (with torch.func) is not installed")
        return torch_mnist.NO_DEVICE
    if args.device == "cuda" and not torch.cuda.is_available():
        log("error: --device cuda, but torch sees no CUDA device (use --device cpu)")
        return torch_mnist.NO_DEVICE
    if args.threads:
        torch.set_num_threads(args.threads)
    torch_mnist.set_tf32(torch, args.tf32)
    n_train = data[0].shape[0]
    if args.batch_size > n_train:
        log(f"error: batch size {args.batch_size} is larger than the {n_train} training samples")
        return torch_mnist.BAD_INPUT
    lrs = learning_rates(args)
    ens = Ensemble(torch, args, data, lrs)
    where = torch.cuda.get_device_name(ens.device) if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    log(
        f"torch {torch.__version__} on {where}; torch.func ensemble of {args.n} mlp-{'-'.join(map(str, args.hidden))}, "
        f"adam, lr {min(lrs):g} to {max(lrs):g}, batch {args.batch_size}, {args.epochs} epochs, "
        f"train {n_train} / test {data[2].shape[0]}, tf32 {'on' if args.tf32 else 'off'}, eval {args.eval}"
    )
    log("warm-up: one untimed epoch (training and evaluation), then the weights and Adam's state are reset")
    ens.reset()
    ens.train(1, "warm-up", eval_each=True)
    ens.sync()

    samples = args.n * ens.steps * args.batch_size * args.epochs
    rows, times = [], []
    for r in range(args.repeats):
        ens.reset()
        ens.sync()
        started = time.perf_counter()
        accs = ens.train(args.epochs, f"repeat {r + 1}", args.eval == "each")
        ens.sync()
        elapsed = time.perf_counter() - started
        times.append(elapsed)
        rows.append(csv_row(args, lrs, elapsed, samples, accs))
        log(f"repeat {r + 1}/{args.repeats}: {elapsed:.3f} s, test acc {statistics.fmean(accs):.4f} mean")
    emit(rows, args.out)
    median = statistics.median(times)
    log(f"median of {len(times)}: train_s {median:.4f}, samples_per_s {samples / median:.1f} (all {args.n} members)")
    return 0


def main(argv=None):
    args = parse_args(argv)
    try:
        data = torch_mnist.prepare(args)
    except torch_mnist.BadInput as e:
        log(f"error: {e}")
        return torch_mnist.BAD_INPUT
    return run(args, data)


if __name__ == "__main__":
    sys.exit(main())
