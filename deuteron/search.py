"""The search space of a tile program and the search over it.

The space is derived from what the lowering saw: a power-of-two block size per tile (from 1, or 16 for a dot
dimension, up to the bound's next power of two), num_warps, and where they matter num_stages and a persistent
grid (in-kernel loops) and program-id grouping (a grid whose last two dimensions are tiles), plus the
program's own tunables. A config is valid when no block holds more than 128 elements per thread.

The search: the default config, a random population, then a pattern search (every single-parameter move
from the best, repeated while the best improves), then the near-best few are timed again.
"""
from __future__ import annotations

import json
import math
import random
import time

from .lower import Info

WARPS = [1, 2, 4, 8, 16]
MAX_BLOCK, MAX_DOT_BLOCK = 16384, 256
PER_THREAD = 128  # the most elements of one block per thread in a valid config
EFFORT = {"quick": (12, 1), "full": (48, 2)}  # population, neighbourhood radius
BUDGET = {"quick": 40.0, "full": 600.0}  # seconds


def pow2s(lo: int, hi: int) -> list:
    return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]


def key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


class Space:
    def __init__(self, choices: dict, values: set, defaults: dict):
        self.choices, self.values, self.defaults = choices, values, defaults

    @staticmethod
    def derive(infos: list[Info], tunables: dict) -> "Space":
        tiles, dot, values, loops, group = {}, set(), set(), False, False
        for info in infos:
            tiles.update(info.tiles)
            dot |= info.dot
            values |= info.values
            loops, group = loops or info.loops, group or info.group
        choices, defaults = {}, {}
        for var, fact in tiles.items():
            lo, cap = (16, MAX_DOT_BLOCK) if var in dot else (1, MAX_BLOCK)
            choices[f"block_{var}"] = pow2s(lo, max(lo, min(fact[0] if fact else cap, cap)))
            defaults[f"block_{var}"] = min(64 if var in dot else 1024, choices[f"block_{var}"][-1])
        choices["num_warps"], defaults["num_warps"] = WARPS, 4
        if loops:
            choices["num_stages"], defaults["num_stages"] = [1, 2, 3, 4], 2
            choices["persistent"], defaults["persistent"] = [False, True], False
        if group:
            choices["group"], defaults["group"] = [1, 4, 8, 16], 8
        for name, options in tunables.items():
            choices[name], defaults[name] = list(options), options[0]
        space = Space(choices, values, {})
        space.defaults = space.shrink(defaults)
        return space

    def elements(self, config: dict, shape: tuple) -> int:
        return math.prod(config.get(f"block_{d}", 1) if isinstance(d, str) else d for d in shape)

    def valid(self, config: dict) -> bool:
        cap = PER_THREAD * 32 * config.get("num_warps", 4)
        return all(self.elements(config, v) <= cap for v in self.values)

    def contains(self, config) -> bool:
        return isinstance(config, dict) and set(config) == set(self.choices) \
            and all(config[k] in v for k, v in self.choices.items()) and self.valid(config)

    def shrink(self, config: dict) -> dict:
        """The default: blocks of at most 32 elements per thread, halving the largest tile of the largest block
        (then adding warps) until it fits."""
        config = dict(config)
        while True:
            budget = 32 * 32 * config["num_warps"]
            big = max(self.values, key=lambda v: self.elements(config, v), default=())
            if self.elements(config, big) <= budget:
                return config
            tiles = [f"block_{d}" for d in big if isinstance(d, str) and config[f"block_{d}"] > self.choices[f"block_{d}"][0]]
            if tiles:
                t = max(tiles, key=lambda t: config[t])
                config[t] //= 2
            elif config["num_warps"] < WARPS[-1]:
                config["num_warps"] *= 2
            else:
                return config

    def default(self) -> dict:
        return dict(self.defaults)

    def random(self, rng: random.Random, n: int) -> list:
        out = []
        for _ in range(50 * n):
            if len(out) == n:
                break
            c = {k: rng.choice(v) for k, v in self.choices.items()}
            if self.valid(c):
                out.append(c)
        return out

    def neighbours(self, config: dict, radius: int = 1) -> list:
        out = []
        for k, options in self.choices.items():
            i = options.index(config[k])
            for j in range(i - radius, i + radius + 1):
                if j != i and 0 <= j < len(options):
                    c = {**config, k: options[j]}
                    if self.valid(c):
                        out.append(c)
        return out


def search(space: Space, measure, effort: str = "quick", budget: float | None = None, seed: int = 0):
    """Find the fastest config. `measure(configs, retime=False)` returns milliseconds per config (inf for a
    rejected one). Returns (best config, {key: (config, ms)} of every config tried)."""
    population, radius = EFFORT[effort]
    deadline = time.monotonic() + (BUDGET[effort] if budget is None else budget)
    tried: dict = {}

    def run(configs):
        fresh = list({key(c): c for c in configs if key(c) not in tried}.values())
        if fresh and (not tried or time.monotonic() < deadline):
            for c, ms in zip(fresh, measure(fresh)):
                tried[key(c)] = (c, ms)

    def best():
        return min(tried.values(), key=lambda t: t[1])

    run([space.default()])
    run(space.random(random.Random(seed), population))
    current = best()
    while time.monotonic() < deadline:
        run(space.neighbours(current[0], radius))
        if not best()[1] < current[1] * 0.99:  # no gain
            break
        current = best()
    if not math.isfinite(current[1]):
        return current[0], tried
    near = sorted((t for t in tried.values() if t[1] <= current[1] * 1.1), key=lambda t: t[1])[:3]
    if len(near) > 1:  # the near-best again, with more runs: noise decides less
        again = measure([c for c, _ in near], retime=True)
        current = min(zip((c for c, _ in near), again), key=lambda t: t[1])
    return current[0], tried
