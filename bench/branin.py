#!/usr/bin/env python3
"""A cheap synthetic objective for sweep benchmarks: the Branin function (standard library only).

    python3 bench/branin.py --x1 2.5 --x2 7.5

prints one result line, {"branin": f(x1, x2)}. Its minimum, 0.397887, is reached at three
points: (-pi, 12.275), (pi, 2.275) and (9.42478, 2.475), over x1 in [-5, 10], x2 in [0, 15].
"""

import argparse
import json
import math


def branin(x1, x2):
    b, c = 5.1 / (4 * math.pi**2), 5 / math.pi
    r, s, t = 6.0, 10.0, 1 / (8 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--x1", type=float, required=True)
    p.add_argument("--x2", type=float, required=True)
    a = p.parse_args()
    print(json.dumps({"branin": branin(a.x1, a.x2)}), flush=True)
