#!/usr/bin/env python3
"""The PyTorch peer of gpumux's ResNet-50: times training steps of torchvision's resnet50.

What it trains, so that a gpumux ResNet-50 trial can be timed side by side on the same GPU:

* model: torchvision.models.resnet50(weights=None, num_classes=--classes), with one of two stems:
  --stem imagenet keeps the standard 7x7 stride-2 conv and 3x3 stride-2 max-pool; --stem cifar
  replaces conv1 by a 3x3 stride-1 pad-1 conv (64 channels, no bias, initialised as torchvision
  initialises its convs: Kaiming normal, fan_out, ReLU) and the max-pool by an identity, as CIFAR
  ResNets do. Everything after the stem is torchvision's (bottleneck blocks 3-4-6-3, BatchNorm).
* data: one synthetic batch, standard-normal images (--batch-size, 3, --input, --input) and
  uniform labels in [0, --classes), drawn from --seed and resident on the device for the whole
  run, so nothing but the training step is timed (no loader, no host-to-device copies).
* training: SGD with momentum (--lr 0.1, --momentum 0.9, --weight-decay 5e-4 by default, PyTorch's
  L2 added to the gradient), mean cross-entropy, the model in training mode (BatchNorm batch
  statistics); zero_grad(set_to_none=True), forward, backward, step.
* precision: --precision fp32 forbids TF32 in both cuBLAS matmuls and cuDNN convolutions (PyTorch
  lets cuDNN convolutions use TF32 by default, so this has to be said); --precision tf32 allows it
  in both. The two legacy flags torch.backends.cuda.matmul.allow_tf32 and
  torch.backends.cudnn.allow_tf32 are set explicitly either way and read back into the output.
  Only those flags are used: PyTorch 2.9 and later raise an error when they are mixed with the
  newer fp32_precision settings.

Timing: --warmup untimed steps first (CUDA context, cuDNN algorithm search with
cudnn.benchmark, torch.compile's compilation), then --repeats timed regions of --steps steps
each, every region starting and ending with torch.cuda.synchronize(). images/s is
steps x batch size over the region's wall time; the median over repeats is reported.

Output: settings and each repeat on stderr; on stdout one line of images/s per repeat and, last,
one JSON line with the settings, the median images/s and step time, the final loss and (CUDA)
the peak memory allocated by PyTorch.

Exit codes follow gpumux's: 2 for bad arguments, 3 when PyTorch, torchvision or the requested
device is missing.
"""

import argparse
import json
import math
import statistics
import sys
import time

# Exit codes as gpumux's and bench/torch_mnist.py's: bad input 2, PyTorch or the device missing 3.
BAD_INPUT = 2
NO_DEVICE = 3
MIB = 1024 * 1024


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Time training steps of torchvision's ResNet-50 on synthetic device-resident data.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--stem", choices=["imagenet", "cifar"], default="cifar", help="imagenet: 7x7/2 conv + 3x3/2 max-pool; cifar: 3x3/1 conv, no max-pool")
    p.add_argument("--classes", type=positive_int, default=10, help="e.g. 10 (CIFAR-10) or 285")
    p.add_argument("--batch-size", type=positive_int, default=128)
    p.add_argument("--input", type=positive_int, default=32, help="image height and width, e.g. 32 or 224")
    p.add_argument("--precision", choices=["fp32", "tf32"], default="fp32", help="fp32: no TF32 in matmuls or convolutions (gpumux's default)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4, help="L2, added to the gradient")
    p.add_argument("--warmup", type=non_negative_int, default=10, help="untimed steps before timing")
    p.add_argument("--steps", type=positive_int, default=50, help="timed steps per repeat")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed regions; the median is reported")
    p.add_argument("--seed", type=int, default=0, help="fixes the initial weights and the synthetic batch")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's)")
    p.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false", help="do not let cuDNN time its algorithms (on by default: the shapes never change)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args(argv)
    if args.batch_size < 2:
        p.error("--batch-size must be at least 2: BatchNorm in training mode needs more than one value per channel")
    if not args.lr > 0.0:
        p.error("--lr must be positive")
    if not 0.0 <= args.momentum < 1.0:
        p.error("--momentum must lie in [0, 1)")
    if args.weight_decay < 0.0:
        p.error("--weight-decay must not be negative")
    return args


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def set_precision(torch, tf32):
    """Allows (tf32) or forbids (fp32) TF32 in cuBLAS matmuls and cuDNN convolutions, through the
    two legacy flags only, and returns them as read back: (matmul, cudnn)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


def build_model(torch, torchvision, args):
    """torchvision's resnet50 with the chosen stem, initialised on the CPU from --seed."""
    nn = torch.nn
    torch.manual_seed(args.seed)
    model = torchvision.models.resnet50(weights=None, num_classes=args.classes)
    if args.stem == "cifar":
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        model.maxpool = nn.Identity()
    return model


def run(args):
    try:
        import torch
        import torchvision
    except ImportError as e:
        log(f"error: {e.name or 'torch'} is not installed (python3 -m pip install torch torchvision)")
        return NO_DEVICE
    if args.device == "cuda" and not torch.cuda.is_available():
        log("error: --device cuda, but torch sees no CUDA device (use --device cpu)")
        return NO_DEVICE
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tf32_matmul, tf32_cudnn = set_precision(torch, args.precision == "tf32")
    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    model = build_model(torch, torchvision, args).to(device)
    params = sum(p.numel() for p in model.parameters())
    forward = torch.compile(model) if args.compile else model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    model.train()

    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    images = torch.randn(args.batch_size, 3, args.input, args.input, device=device, generator=gen)
    labels = torch.randint(0, args.classes, (args.batch_size,), device=device, generator=gen)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    log(
        f"torch {torch.__version__}, torchvision {torchvision.__version__} on {where}; resnet50 ({args.stem} stem, "
        f"{params} parameters), {args.classes} classes, input 3x{args.input}x{args.input}, batch {args.batch_size}, "
        f"sgd lr {args.lr:g} momentum {args.momentum:g} weight decay {args.weight_decay:g}, {args.precision} "
        f"(allow_tf32: matmul {tf32_matmul}, cudnn {tf32_cudnn}), cudnn.benchmark {args.cudnn_benchmark}, "
        f"compile {'on' if args.compile else 'off'}"
    )

    try:
        sync()
        first = None
        for _ in range(args.warmup):
            loss = step()
            if first is None:
                first = loss.item()
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rates, step_ms = [], []
        for r in range(args.repeats):
            sync()
            started = time.perf_counter()
            for _ in range(args.steps):
                loss = step()
            sync()
            elapsed = time.perf_counter() - started
            rate = args.steps * args.batch_size / elapsed
            rates.append(rate)
            step_ms.append(1000.0 * elapsed / args.steps)
            print(f"repeat {r + 1}/{args.repeats}: {rate:.1f} images/s ({step_ms[-1]:.2f} ms/step)", flush=True)
        final = loss.item()
    except torch.cuda.OutOfMemoryError as e:
        log(f"error: out of device memory at batch {args.batch_size}, input {args.input}: {e}")
        return BAD_INPUT
    if first is not None:
        log(f"loss {first:.4f} at the first warm-up step, {final:.4f} at the last timed step")
    if not math.isfinite(final):
        log(f"warning: the loss is {final}")
    peak = torch.cuda.max_memory_allocated(device) / MIB if device.type == "cuda" else None
    median_rate = statistics.median(rates)
    log(f"median of {len(rates)}: {median_rate:.1f} images/s, {statistics.median(step_ms):.2f} ms/step")
    result = {
        "impl": "torch-compile" if args.compile else "torch",
        "model": "resnet50",
        "stem": args.stem,
        "classes": args.classes,
        "input": args.input,
        "batch_size": args.batch_size,
        "precision": args.precision,
        "allow_tf32_matmul": tf32_matmul,
        "allow_tf32_cudnn": tf32_cudnn,
        "cudnn_benchmark": args.cudnn_benchmark,
        "optimizer": "sgd",
        "lr": args.lr,
        "momentum": args.momentum,
        "weight_decay": args.weight_decay,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "params": params,
        "warmup": args.warmup,
        "steps": args.steps,
        "repeats": args.repeats,
        "images_per_s": round(median_rate, 2),
        "images_per_s_each": [round(x, 2) for x in rates],
        "step_ms": round(statistics.median(step_ms), 4),
        "final_loss": final if math.isfinite(final) else None,
        "peak_mem_mib": round(peak, 1) if peak is not None else None,
    }
    print(json.dumps(result), flush=True)
    return 0


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
