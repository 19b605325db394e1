"""The on-disk cache of compiled kernels and parsed modules: atomic writes, checksummed entries, never fatal.

An entry holds its key: one copied or renamed from another key's file is not served. A damaged entry reads
as a miss (and is deleted) so the caller simply recompiles; a cache folder that cannot be written is
reported once and then ignored. Entries are data (a cubin, JSON): nothing in the folder runs on load."""
from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path

_MAGIC = b"NEWTBIN2"
_HEADER = struct.Struct("<8s32sQ32s")  # magic, the key, payload length, sha256 of the key and the payload


def key(*parts: str | bytes) -> str:
    """sha256 hex of the parts; each is length-prefixed so ('ab', 'c') and ('a', 'bc') differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def _digest(k: bytes, payload: bytes) -> bytes:
    h = hashlib.sha256(k)
    h.update(payload)
    return h.digest()


def default_dir() -> Path:
    return Path(os.environ.get("NEWT_CACHE_DIR") or Path.home() / ".cache" / "newt")


_shared: dict = {}
_lock = threading.Lock()


def shared() -> "DiskCache":
    """The process's cache in default_dir(), one object per folder (it remembers an unwritable folder)."""
    directory = default_dir()
    with _lock:
        return _shared.setdefault(directory, DiskCache(directory))


class DiskCache:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.dir = Path(directory) if directory is not None else default_dir()
        self.writable = True  # turned off, with one warning, by the first failed write

    def _path(self, key: str) -> Path:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):  # keys come from key()
            raise ValueError(f"bad cache key {key!r}")
        return self.dir / f"{key}.bin"

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None if absent, unreadable or damaged (a damaged entry is deleted)."""
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        if len(blob) >= _HEADER.size:
            magic, stored_key, length, digest = _HEADER.unpack_from(blob)
            payload = blob[_HEADER.size:]
            if (magic, stored_key, length) == (_MAGIC, bytes.fromhex(key), len(payload)) and \
                    _digest(stored_key, payload) == digest:
                return payload
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    def put(self, key: str, data: bytes) -> None:
        """Store `data`; readers see the old entry or the whole new one, never a partial write."""
        if not self.writable:
            return
        k = bytes.fromhex(key)
        try:
            write_atomic(self._path(key), _HEADER.pack(_MAGIC, k, len(data), _digest(k, data)) + data)
        except OSError as e:
            self.writable = False
            warnings.warn(f"newt: cannot write the kernel cache in {self.dir} ({e}); "
                          "continuing without it (set NEWT_CACHE_DIR to a writable folder)",
                          RuntimeWarning, stacklevel=2)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace the file `path` (and make its folder): readers see the old file or the whole new one, and
    concurrent writers each replace it whole. An OSError leaves no temporary file behind."""
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
