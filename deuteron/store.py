"""Tuned configs on disk: a JSON file per key, written atomically. The key is the tile program's text (and the
file's helpers), the specialization (dtypes, shape bucket: the next power of two per dimension, 16-byte
alignment, unit strides), the GPU's name and the newt and deuteron versions. An entry that does not parse, names
another key or holds a config outside today's space reads as a miss, with a warning: the program is tuned again.
"""
import json
import os
import warnings
from pathlib import Path

import torch

import newtc.jit
from newtc import cache

from .lang import device_of
from .lower import next_pow2

VERSION = cache.key(*(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py"))))[:16]


def arg_key(a):
    """An argument's part of the key: a tensor's dtype, shape bucket, alignment and unit strides; an int's bucket."""
    if isinstance(a, torch.Tensor):
        bucket = [next_pow2(s) for s in a.shape]
        return [str(a.dtype).removeprefix("torch."), bucket, a.data_ptr() % 16 == 0, [st == 1 for st in a.stride()]]
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return repr(a)
    return ["int", next_pow2(abs(a))] if isinstance(a, int) else "float"


def key(fn, args, kwargs) -> dict:
    device = device_of(args, kwargs)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"program": fn.name, "text": fn.hash, "args": [arg_key(a) for a in args],
            "kwargs": {k: arg_key(v) for k, v in sorted(kwargs.items())}, "gpu": gpu,
            "newt": newtc.jit.VERSION, "deuteron": VERSION}


def path(k: dict) -> Path:
    folder = Path(os.environ.get("DEUTERON_CACHE_DIR") or cache.default_dir() / "deuteron")
    return folder / f"{k['program']}-{cache.key(json.dumps(k, sort_keys=True))[:24]}.json"


def load(k: dict, space) -> dict | None:
    """The stored config for this key, or None: absent, or damaged (unreadable, another key's, or not in the
    space), which warns. Its keys come in the space's order, as the tuner made it: the same kernel text."""
    try:
        entry = json.loads(path(k).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable, or not JSON
        entry = None
    if isinstance(entry, dict) and entry.get("key") == k and space.contains(entry.get("config")):
        return {name: entry["config"][name] for name in space.choices}
    warnings.warn(f"deuteron: ignoring {path(k)}: it is not a config of this key and search space",
                  RuntimeWarning, stacklevel=3)
    return None


def save(k: dict, config: dict, **info) -> None:
    """Readers see the old entry or the whole new one; concurrent writers each replace it whole."""
    try:
        cache.write_atomic(path(k), json.dumps({"key": k, "config": config, **info}, indent=1, sort_keys=True).encode())
    except OSError as e:
        warnings.warn(f"deuteron: cannot store the tuned config in {path(k).parent} ({e}); set DEUTERON_CACHE_DIR",
                      RuntimeWarning, stacklevel=3)
