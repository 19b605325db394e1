"""The search space of a tile program and the search over it.

The space comes from what the lowering saw: a power-of-two block per tile (from 1, or 16 for a dot dimension,
up to its bound's next power of two), num_warps, num_stages and a persistent grid where there is an in-kernel
loop, program-id grouping where the grid's last two dimensions are tiles, and the program's own tunables. A
config is valid when no block holds more than 128 elements per thread. The default config of a program with one
dot takes the largest tile the GPU's registers and shared memory hold. The search times the default config and
a random population, then moves one parameter at a time from the best while that gains, then times the
near-best few again.
"""
import json
import math
import random
import time

PER_THREAD = 128  # elements a block may hold per thread
EFFORT = {"quick": (12, 1, 40.0), "full": (48, 2, 600.0)}  # population, move radius, seconds
# The knobs besides block sizes: their choices, default, and the lower.Lowered field saying where they apply (None: always).
KNOBS = {"num_warps": ([1, 2, 4, 8, 16], 4, None), "num_stages": ([1, 2, 3, 4], 2, "loops"),
         "persistent": ([False, True], False, "loops"), "group": ([1, 4, 8, 16], 8, "group")}


def key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


class Space:
    """The configs of a call, derived from what the lowering saw of each of its grids (lower.Lowered)."""

    def __init__(self, infos: list, tunables: dict):
        tiles = {var: bound for info in infos for var, bound in info.tiles.items()}
        dots, self.values = set().union(*(i.dots for i in infos)), set().union(*(i.values for i in infos))
        dot = {var for d in dots for var in d if var}
        self.choices, defaults = {}, {}
        for var, bound in tiles.items():  # bound: the next power of two of the tile's bound, or None
            lo, cap = (16, 256) if var in dot else (1, 16384)
            hi = max(lo, min(bound or cap, cap))
            self.choices[f"block_{var}"] = [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]
            defaults[f"block_{var}"] = min(64 if var in dot else 1024, hi)
        for name, (options, default, where) in KNOBS.items():
            if where is None or any(getattr(i, where) for i in infos):
                self.choices[name], defaults[name] = options, default
        for name, options in tunables.items():
            self.choices[name], defaults[name] = list(options), options[0]
        self.defaults = self.shrink(defaults)
        if len(dots) == 1 and self.valid(c := self.dot_default(*dots, tiles, infos[0])):  # it owns the registers
            self.defaults = c

    def dot_default(self, dims: tuple, bounds: dict, info) -> dict:
        """A dot's tile is the largest the registers hold: an f32 accumulator of 128 values per thread over two
        warpgroups (128x256, as wgmma takes 64-row blocks), a K step of one 128-byte row, and a ring as deep as
        shared memory holds, up to 4 slots: the bigger the tile, the fewer bytes per FLOP it moves. The wider
        of M and N then halves while the grid has fewer programs than the GPU has SMs."""
        c = dict(self.defaults)
        m, n, k = (min(w, self.choices[f"block_{v}"][-1]) if v else 16 for v, w in zip(dims, (128, 256, 128 // info.itemsize)))
        while max(m, n) > 16 and math.prod(-(-(bounds[v] or 1 << 20) // b) for v, b in zip(dims, (m, n)) if v) < info.gpu.sms:
            m, n = (m // 2, n) if m > n else (m, n // 2)
        c.update({f"block_{v}": b for v, b in zip(dims, (m, n, k)) if v}, num_warps=max(4, min(8, m * n // 4096)))
        if "num_stages" in c:
            c["num_stages"] = max(2, min(4, info.gpu.smem // ((m + n) * k * info.itemsize)))
        return c

    def elements(self, config: dict, shape: tuple) -> int:
        return math.prod(config.get(f"block_{d}", 1) if isinstance(d, str) else d for d in shape)

    def valid(self, config: dict) -> bool:
        return all(self.elements(config, v) <= PER_THREAD * 32 * config["num_warps"] for v in self.values)

    def contains(self, config) -> bool:
        return isinstance(config, dict) and set(config) == set(self.choices) \
            and all(config[k] in v for k, v in self.choices.items()) and self.valid(config)

    def shrink(self, config: dict) -> dict:
        """Halve the largest tile of the largest block (then add warps) until blocks hold 32 elements a thread."""
        while True:
            big = max(self.values, key=lambda v: self.elements(config, v), default=())
            if self.elements(config, big) <= 32 * 32 * config["num_warps"]:
                return config
            tiles = [f"block_{d}" for d in big if isinstance(d, str) and config[f"block_{d}"] > self.choices[f"block_{d}"][0]]
            if tiles:
                config[max(tiles, key=config.get)] //= 2
            elif config["num_warps"] < KNOBS["num_warps"][0][-1]:
                config["num_warps"] *= 2
            else:
                return config

    def default(self) -> dict:
        return dict(self.defaults)

    def random(self, rng: random.Random, n: int) -> list:
        tries = ({k: rng.choice(v) for k, v in self.choices.items()} for _ in range(50 * n))
        return [c for c, _ in zip(filter(self.valid, tries), range(n))]

    def neighbours(self, config: dict, radius: int = 1) -> list:
        """The valid configs one parameter away (up to `radius` steps along its choices). A move to blocks that
        overflow the threads takes the warps they need along, so that the walk crosses to bigger tiles in one step."""
        out = []
        for k, options in self.choices.items():
            i = options.index(config[k])
            for j in (j for j in range(max(0, i - radius), min(len(options), i + radius + 1)) if j != i):
                moved = {**config, k: options[j]}
                while k != "num_warps" and not self.valid(moved) and moved["num_warps"] < KNOBS["num_warps"][0][-1]:
                    moved["num_warps"] *= 2
                out.append(moved)
        return list(filter(self.valid, out))


def search(space: Space, measure, effort: str = "quick", budget: float | None = None, seed: int = 0):
    """The fastest config: `measure(configs, retime=False)` gives milliseconds per config (inf: rejected).
    Returns (the best config, {key: (config, ms)} of all tried)."""
    population, radius, seconds = EFFORT[effort]
    deadline, tried = time.monotonic() + (seconds if budget is None else budget), {}

    def run(configs):
        fresh = list({key(c): c for c in configs if key(c) not in tried}.values())
        if fresh and (not tried or time.monotonic() < deadline):
            tried.update((key(c), (c, ms)) for c, ms in zip(fresh, measure(fresh)))
        return min(tried.values(), key=lambda t: t[1])

    best = run([space.default()])
    best = run(space.random(random.Random(seed), population))
    while time.monotonic() < deadline:
        new = run(space.neighbours(best[0], radius))
        if not new[1] < best[1] * 0.99:  # gains under 1% are noise
            break
        best = new
    near = sorted((t for t in tried.values() if t[1] <= best[1] * 1.1), key=lambda t: t[1])[:3]
    if len(near) > 1 and math.isfinite(best[1]):  # the near-best again, with more runs
        best = min(zip((c for c, _ in near), measure([c for c, _ in near], retime=True)), key=lambda t: t[1])
    return best[0], tried
