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

VERSION = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()[:16]


def directory() -> Path:
    return Path(os.environ.get("DEUTERON_CACHE_DIR") or default_dir() / "deuteron")


def arg_key(a):
    if isinstance(a, torch.Tensor):
        return [str(a.dtype).removeprefix("torch."), [1 << max(0, (s - 1).bit_length()) for s in a.shape],
                a.data_ptr() % 16 == 0, [st == 1 for st in a.stride()]]
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return repr(a)
    return ["int", 1 << max(0, (abs(a) - 1).bit_length())] if isinstance(a, int) else "float"


def key(fn, args, kwargs) -> dict:
    device = next((a.device for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)), None)
    gpu = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else "cpu"
    return {"program": fn.name, "text": fn.hash, "args": [arg_key(a) for a in args],
            "kwargs": {k: arg_key(v) for k, v in sorted(kwargs.items())}, "gpu": gpu,
            "newt": newtc.jit.VERSION, "deuteron": VERSION}


def digest(k: dict) -> str:
    return hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:24]


def path(k: dict) -> Path:
    return directory() / f"{k['program']}-{digest(k)}.json"


def load(k: dict, space) -> dict | None:
    """The stored config for this key, or None (absent, unreadable, another key's, or not in the space)."""
    try:
        entry = json.loads(path(k).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != k or not space.contains(entry.get("config")):
        return None
    return entry["config"]


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
