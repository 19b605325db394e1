"""The last specialization of each kernel, recorded under the cache folder for `newtc lsp`.

The jit writes one small JSON file per (source file, kernel) whenever it specializes a kernel; the
language server reads it to show types and layouts for the launch a user last made. The record is
written the way `newtc --sig` and `-D` are, so that one parser reads both. Never fatal: a folder
that cannot be written just means no record.
"""
from __future__ import annotations

import contextlib
import json
import os
import time

from . import cache
from .types import DType


def _path(real: str, kernel: str) -> str:
    return os.path.join(cache.default_dir(), "launches", f"{cache.key(real, kernel)[:32]}.json")


def record(filename: str, kernel: str, spec) -> None:
    """Remember `spec` (a compiler.Spec) as the last launch of `kernel` in the file `filename`."""
    real = os.path.realpath(filename)
    if not os.path.isfile(real):  # a kernel compiled from a string has no file to edit
        return
    data = {"file": real, "kernel": kernel, "sig": [f"{n}={t.name}" for n, t in spec.sig],
            "defines": [f"{n}={v.name if isinstance(v, DType) else repr(v)}" for n, v in spec.constexprs],
            "num_warps": spec.num_warps, "num_stages": spec.num_stages, "num_ctas": spec.num_ctas,
            "maxnreg": spec.maxnreg, "idx64": spec.idx64,
            "aligned": list(spec.aligned), "eights": list(spec.eights), "ones": list(spec.ones),
            "positive": list(spec.positive), "arch": spec.arch}
    path = _path(real, kernel)
    old = _read(path, kernel)
    if old is not None and {k: v for k, v in old.items() if k != "time"} == data:
        return  # reading is cheap, a write costs milliseconds on some file systems: rewrite only a change
    data["time"] = time.time()
    with contextlib.suppress(OSError):
        cache.write_atomic(path, json.dumps(data).encode())  # readers see the old record or the new one


def last(filename: str, kernel: str) -> dict | None:
    """The record written by `record` (with "time", when this specialization was first recorded), or None."""
    return _read(_path(os.path.realpath(filename), kernel), kernel)


def _read(path: str, kernel: str) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kernel") == kernel else None
