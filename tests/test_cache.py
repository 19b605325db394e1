import multiprocessing
import os
import warnings
from pathlib import Path

import pytest

from newtc import cache
from newtc.cache import DiskCache


def test_key_is_stable_and_unambiguous():
    assert cache.key("a", b"b") == cache.key("a", b"b")
    assert len(cache.key("x")) == 64
    assert cache.key("ab", "c") != cache.key("a", "bc")
    assert cache.key("a") != cache.key("a", "")


def test_round_trip(tmp_path):
    c = DiskCache(tmp_path / "c")
    k = cache.key("kernel")
    assert c.get(k) is None
    c.put(k, b"\x7fELF payload")
    assert c.get(k) == b"\x7fELF payload"
    c.put(k, b"")
    assert c.get(k) == b""
    assert DiskCache(tmp_path / "c").get(k) == b""  # persisted, not held in memory


def test_default_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NEWT_CACHE_DIR", str(tmp_path))
    assert DiskCache().dir == tmp_path
    monkeypatch.delenv("NEWT_CACHE_DIR")
    assert cache.default_dir() == Path.home() / ".cache" / "newt"


def test_bad_key_is_refused(tmp_path):
    with pytest.raises(ValueError):
        DiskCache(tmp_path).get("../escape")


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "empty", "extend"])
def test_damaged_entry_is_a_miss_and_rebuilt(tmp_path, damage):
    c, k, data = DiskCache(tmp_path), cache.key("k"), bytes(range(256)) * 4
    c.put(k, data)
    path = tmp_path / f"{k}.bin"
    blob = bytearray(path.read_bytes())
    if damage == "flip_payload":
        blob[-10] ^= 0xFF
    elif damage == "flip_header":
        blob[0] ^= 0xFF
    elif damage == "truncate":
        del blob[len(blob) // 2:]
    elif damage == "empty":
        blob = bytearray()
    else:
        blob += b"junk"
    path.write_bytes(bytes(blob))
    assert c.get(k) is None
    assert not path.exists()
    c.put(k, data)
    assert c.get(k) == data


def _writer(directory, k, payload, rounds):
    c = DiskCache(directory)
    for _ in range(rounds):
        c.put(k, payload)
        got = c.get(k)
        assert got is None or len(got) == len(payload), "a reader saw a partial entry"


def test_concurrent_writers_leave_a_valid_entry(tmp_path):
    k = cache.key("shared")
    payloads = [bytes([i]) * (1 << 20) for i in range(6)]  # big enough for writes to overlap
    ctx = multiprocessing.get_context("spawn")  # fork from a threaded process can deadlock
    procs = [ctx.Process(target=_writer, args=(tmp_path, k, p, 10)) for p in payloads]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert DiskCache(tmp_path).get(k) in payloads
    assert sorted(os.listdir(tmp_path)) == [f"{k}.bin"]  # no temp files left behind


def test_unwritable_dir_warns_once_and_continues(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    c = DiskCache(blocker / "cache")  # works even as root, unlike chmod
    with pytest.warns(RuntimeWarning, match="cannot write the kernel cache"):
        c.put(cache.key("a"), b"x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.put(cache.key("b"), b"y")
        assert c.get(cache.key("a")) is None


def test_an_entry_serves_only_its_own_key(tmp_path):
    """A file copied (or renamed) from another key's entry is a miss: A never gets B's binary (issue 14, item 6)."""
    c = DiskCache(tmp_path)
    a, b = cache.key("kernel A"), cache.key("kernel B")
    c.put(b, b"B's cubin")
    (tmp_path / f"{a}.bin").write_bytes((tmp_path / f"{b}.bin").read_bytes())
    assert c.get(a) is None
    assert not (tmp_path / f"{a}.bin").exists()  # and it is gone
    assert c.get(b) == b"B's cubin"


def test_shared_cache_follows_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NEWT_CACHE_DIR", str(tmp_path / "one"))
    one = cache.shared()
    assert cache.shared() is one and one.dir == tmp_path / "one"
    monkeypatch.setenv("NEWT_CACHE_DIR", str(tmp_path / "two"))
    assert cache.shared().dir == tmp_path / "two"
