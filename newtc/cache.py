"""The on-disk cache of compiled kernels: atomic writes, checksummed entries, never fatal.

A damaged entry reads as a miss (and is deleted) so the caller simply recompiles; a cache folder that
cannot be written is reported once and then ignored."""
from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import warnings
from pathlib import Path

_MAGIC = b"NEWTBIN1"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload


def key(*parts: str | bytes) -> str:
    """sha256 hex of the parts; each is length-prefixed so ('ab', 'c') and ('a', 'bc') differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(struct.pack("<Q", len(data)))
        h.update(data)
    return h.hexdigest()


def default_dir() -> Path:
    return Path(os.environ.get("NEWT_CACHE_DIR") or Path.home() / ".cache" / "newt")


class DiskCache:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.dir = Path(directory) if directory is not None else default_dir()
        self.writable = True  # turned off, with one warning, by the first failed write

    def _path(self, key: str) -> Path:
        if not key.isalnum():  # keys come from key(); anything else could escape the folder
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
            magic, length, digest = _HEADER.unpack_from(blob)
            payload = blob[_HEADER.size:]
            if magic == _MAGIC and length == len(payload) and hashlib.sha256(payload).digest() == digest:
                return payload
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    def put(self, key: str, data: bytes) -> None:
        """Store `data`; readers see the old entry or the whole new one, never a partial write."""
        if not self.writable:
            return
        path, tmp = self._path(key), None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{key}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, len(data), hashlib.sha256(data).digest()))
                f.write(data)
            os.replace(tmp, path)  # atomic; concurrent writers of one key each replace it whole
        except OSError as e:
            self.writable = False
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            warnings.warn(f"newt: cannot write the kernel cache in {self.dir} ({e}); "
                          "continuing without it (set NEWT_CACHE_DIR to a writable folder)",
                          RuntimeWarning, stacklevel=2)
