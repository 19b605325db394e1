"""Tuned configs on disk: a JSON file per key, written atomically. The key is the tile program's text (and the
file's helpers), the specialization (dtypes, shape bucket: the next power of two per dimension, 16-byte
alignment, unit strides), the GPU's name and the newt and deuteron versions. An entry that does not parse, names
another key or holds a config outside today's space reads as a miss: the program is tuned again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import torch

import newtc.jit
from newtc.cache import default_dir

from .lang import device_of
from .lower import next_pow2

VERSION = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()[:16]


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
    digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:24]
    return Path(os.environ.get("DEUTERON_CACHE_DIR") or default_dir() / "deuteron") / f"{k['program']}-{digest}.json"


def load(k: dict, space) -> dict | None:
    """The stored config for this key, or None (absent, unreadable, another key's, or not in the space)."""
    try:
        entry = json.loads(path(k).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(entry, dict) and entry.get("key") == k and space.contains(entry.get("config"))
    return entry["config"] if ok else None


def save(k: dict, config: dict, **info) -> None:
    """Readers see the old entry or the whole new one; concurrent writers each replace it whole."""
    target, tmp = path(k), None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": k, "config": config, **info}, f, indent=1, sort_keys=True)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError, TypeError):
            os.unlink(tmp)
        warnings.warn(f"deuteron: cannot store the tuned config in {target.parent} ({e}); set DEUTERON_CACHE_DIR",
                      RuntimeWarning, stacklevel=3)
