"""Kernel objects: modules and attributes, the inspection stages, NEWT_DEBUG, the disk caches (binaries and
ASTs, across processes), CPU launches through the interpreter, launch errors, 64-bit index specialization.

Nothing here needs a GPU: binaries come from NVRTC for a named arch, launches run on CPU tensors."""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import struct
import subprocess
import sys
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import newtc
from newtc import cache, compiler, ir, jit, nvrtc, ops, syntax
from newtc.compiler import Spec
from newtc.errors import NkError
from newtc.types import Ptr, f32, i32, i64

STDLIB = Path(__file__).resolve().parents[1] / "stdlib"
ADD = STDLIB / "add.nk"

TWO = """\
# two kernels in one file
kernel copy(x, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)

def twice(v):
    return v * 2.0

kernel scale(x, out, n, BLOCK: constexpr, TWICE: constexpr = False):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    v = load(x + offs, mask=offs < n)
    if TWICE:
        v = twice(v)
    store(out + offs, v, mask=offs < n)
"""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def point_cache_at(monkeypatch, directory) -> None:
    """Every disk-cache user (binaries, ASTs) in this process now reads and writes `directory`."""
    monkeypatch.setenv("NEWT_CACHE_DIR", str(directory))


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Tests never touch ~/.cache/newt; one folder for the file unless a test asks for a fresh one."""
    point_cache_at(monkeypatch, tmp_path_factory.getbasetemp() / "newt-cache")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    point_cache_at(monkeypatch, d)
    return d


def entries(d: Path) -> set[str]:
    return {p.name for p in d.glob("*.bin")} if d.exists() else set()


def add_args(n=1000):
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    return x, y, out, n


# ---- modules and kernels -------------------------------------------------------------------------
def test_compile_gives_a_module_with_kernel_attributes():
    mod = newtc.compile(TWO, "two.nk")
    assert isinstance(mod, newtc.Module)
    assert set(mod.kernels) == {"copy", "scale"}  # the helper is not a kernel
    assert isinstance(mod.copy, newtc.Kernel) and mod.copy.name == "copy"
    assert mod.scale is mod.kernels["scale"]
    assert {"copy", "scale"} <= set(dir(mod))
    assert "two.nk" in repr(mod.copy)
    assert mod.scale.constexpr_names == {"BLOCK", "TWICE"}
    assert [p.name for p in mod.scale.runtime] == ["x", "out", "n"]


def test_unknown_kernel_attribute_lists_the_kernels():
    mod = newtc.compile(TWO, "two.nk")
    with pytest.raises(AttributeError, match=r"no kernel 'cpy'.*kernels: copy, scale"):
        mod.cpy
    assert not hasattr(mod, "twice")  # a helper is not an attribute
    assert getattr(mod, "nope", None) is None


def test_load_parses_once_and_again_when_the_file_changes(tmp_path):
    std = newtc.load(ADD)
    assert set(std.kernels) == {"add"} and std.filename == str(ADD)
    assert newtc.load(str(ADD)) is std
    sm = newtc.load(STDLIB / "softmax.nk")
    assert {"softmax", "softmax_looped", "cross_entropy"} <= set(sm.kernels)

    path = tmp_path / "k.nk"
    path.write_text(TWO)
    first = newtc.load(path)
    assert newtc.load(path) is first
    path.write_text(TWO.replace("kernel scale", "kernel scale2"))  # a different size
    second = newtc.load(path)
    assert second is not first and set(second.kernels) == {"copy", "scale2"}


def test_compile_errors_are_diagnostics():
    with pytest.raises(NkError, match=r"bad\.nk:2:\d+: error"):
        newtc.compile("kernel k(x):\n    y = = 1\n", "bad.nk")


# ---- the stages, for inspection (no GPU) ---------------------------------------------------------
def test_ir_and_source_for_cpu_arguments():
    k = newtc.load(ADD).add
    args = add_args()
    text = k.ir(*args, BLOCK=1024)
    assert text.startswith("kernel @add(") and "[BLOCK=1024]" in text
    assert "*f32" in text and "program_id() {axis=0} : i32" in text
    assert re.search(r"load\(.*\) : f32\[1024\]", text)
    src = k.source(*args, BLOCK=1024)
    assert '__launch_bounds__(128) nk_add(float* x, float* y, float* out, int n)' in src
    assert f'#line 5 "{ADD}"' in src
    # num_warps and dtypes take part in the specialization
    assert "__launch_bounds__(256)" in k.source(*args, BLOCK=1024, num_warps=8)
    h = [a.half() if isinstance(a, torch.Tensor) else a for a in args]
    assert "nk_f16* x" in k.source(*h, BLOCK=1024)


def test_ptx_and_sass_for_a_named_arch():
    k = newtc.load(ADD).add
    args = add_args()
    ptx = k.ptx(*args, BLOCK=1024, arch="sm_90a")
    assert ".target sm_90a" in ptx and ".entry nk_add" in ptx
    assert ".target sm_80" in k.ptx(*args, BLOCK=1024, arch="sm_80")
    sass = k.sass(*args, BLOCK=1024, arch="sm_90a")
    assert "Function : nk_add" in sass and "LDG.E.128" in sass


@pytest.mark.skipif(torch.cuda.is_available(), reason="without a GPU the default arch is sm_90a")
def test_default_arch_without_a_gpu():
    assert jit.default_arch() == "sm_90a"


def test_newt_debug_prints_the_cuda(monkeypatch, capsys):
    k = newtc.load(ADD).add
    args = add_args()
    monkeypatch.delenv("NEWT_DEBUG", raising=False)
    src = k.source(*args, BLOCK=512)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("NEWT_DEBUG", "1")
    assert k.source(*args, BLOCK=512) == src
    err = capsys.readouterr().err
    assert "// ---- newt: add" in err and "BLOCK" in err and "num_warps=4" in err
    assert src in err


# ---- the binary disk cache ------------------------------------------------------------------------
ARCH = "sm_90a"


def _binary(mod=None, arch=ARCH, **meta):
    mod = mod or newtc.load(ADD)
    x = torch.empty(1000)
    return mod.add.binary((x, x, x, 1000), {"BLOCK": 1024, **meta}, arch)


def counting_compile(monkeypatch) -> list:
    calls, real = [], nvrtc.compile

    def compile_(*a, **kw):
        calls.append(a[2] if len(a) > 2 else kw.get("arch"))
        return real(*a, **kw)

    monkeypatch.setattr(nvrtc, "compile", compile_)
    return calls


def refuse_compile(monkeypatch) -> None:
    def boom(*a, **kw):
        raise AssertionError("compiled although the disk cache holds the binary")

    monkeypatch.setattr(nvrtc, "compile", boom)


def test_binary_is_written_then_read(fresh_cache, monkeypatch):
    mod = newtc.load(ADD)  # may write its AST entry: count binaries only from here
    before = entries(fresh_cache)
    calls = counting_compile(monkeypatch)
    b = _binary(mod)
    assert calls == [ARCH]
    assert len(entries(fresh_cache) - before) == 1
    assert b.name == "nk_add" and b.cubin.startswith(b"\x7fELF") and b.threads == 128
    assert b.param_types == [Ptr(f32), Ptr(f32), Ptr(f32), i32]
    assert jit.Binary.unpack(b.pack()) == b

    refuse_compile(monkeypatch)
    assert _binary(mod) == b
    monkeypatch.setattr(cache, "_shared", {})  # a new process would start with no DiskCache object
    assert _binary(mod) == b


def test_binary_key_separates_specializations(fresh_cache, monkeypatch):
    calls = counting_compile(monkeypatch)
    b90 = _binary()
    b80 = _binary(arch="sm_80")
    b8w = _binary(num_warps=8)
    assert calls == [ARCH, "sm_80", ARCH]
    assert b90.cubin != b80.cubin and b8w.threads == 256
    assert len(entries(fresh_cache)) >= 3
    refuse_compile(monkeypatch)
    assert (_binary(), _binary(arch="sm_80"), _binary(num_warps=8)) == (b90, b80, b8w)


def test_corrupted_entries_are_rebuilt(fresh_cache, monkeypatch):
    good = _binary()
    for path in fresh_cache.glob("*.bin"):
        blob = bytearray(path.read_bytes())
        for i in (0, len(blob) // 2, len(blob) - 1):
            blob[i] ^= 0xFF
        path.write_bytes(bytes(blob))
    calls = counting_compile(monkeypatch)
    again = _binary()
    assert calls == [ARCH]
    assert (again.name, again.threads, again.param_types) == (good.name, good.threads, good.param_types)
    assert again.cubin.startswith(b"\x7fELF")
    refuse_compile(monkeypatch)  # the rebuilt entry was written back
    assert _binary() == again


def test_checksummed_but_unreadable_entry_is_rebuilt(fresh_cache, monkeypatch):
    mod = newtc.load(ADD)
    before = entries(fresh_cache)
    _binary(mod)
    (name,) = entries(fresh_cache) - before
    cache.DiskCache(fresh_cache).put(Path(name).stem, b"\x05\x00\x00\x00{bad}garbage")  # valid checksum
    calls = counting_compile(monkeypatch)
    b = _binary(mod)
    assert calls == [ARCH] and b.cubin.startswith(b"\x7fELF")


def test_newt_debug_prints_when_a_binary_is_compiled(fresh_cache, monkeypatch, capsys):
    monkeypatch.setenv("NEWT_DEBUG", "1")
    _binary()
    assert "// ---- newt: add" in capsys.readouterr().err


def _compile_in_process(cache_dir, barrier, results):
    import os

    os.environ["NEWT_CACHE_DIR"] = cache_dir
    import newtc as nt

    mod = nt.load(ADD)
    x = torch.empty(1000)
    barrier.wait(60)  # both compile at the same moment
    b = mod.add.binary((x, x, x, 1000), {"BLOCK": 1024}, ARCH)
    results.put((b.name, b.cubin[:4], len(b.cubin)))


def test_two_processes_compiling_at_once(fresh_cache, monkeypatch):
    ctx = multiprocessing.get_context("spawn")  # fork from a threaded process can deadlock
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_compile_in_process, args=(str(fresh_cache), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    got = [results.get(timeout=5) for _ in procs]
    assert got[0] == got[1] and got[0][:2] == ("nk_add", b"\x7fELF")
    assert not list(fresh_cache.glob("*.tmp")) and not list(fresh_cache.glob(".*"))  # no temp files left
    refuse_compile(monkeypatch)  # the entry they left is valid: this process reads it
    b = _binary()
    assert (b.name, b.cubin[:4], len(b.cubin)) == got[0]


# ---- the AST cache --------------------------------------------------------------------------------
def test_ast_cache_returns_an_equal_ast(fresh_cache, monkeypatch):
    text = (STDLIB / "softmax.nk").read_text()
    first = syntax.parse_cached(text, "cached.nk")
    assert first == syntax.parse(text, "cached.nk")
    assert entries(fresh_cache)

    def no_parse(*a, **kw):
        raise AssertionError("parsed again although the AST is cached")

    real_parse = syntax.parse
    monkeypatch.setattr(syntax, "parse", no_parse)
    second = syntax.parse_cached(text, "cached.nk")
    assert second == first and second is not first
    assert second.defs[0].body[0].span.source == text  # diagnostics can still quote the source
    assert {"softmax", "row_stats", "softmax_looped", "cross_entropy"} <= {d.name for d in second.defs}
    # another file name is another entry
    monkeypatch.setattr(syntax, "parse", real_parse)
    assert syntax.parse_cached(text, "other.nk").file == "other.nk"


def test_damaged_ast_entry_is_parsed_again(fresh_cache):
    text = ADD.read_text()
    first = syntax.parse_cached(text, "ast.nk")
    for path in fresh_cache.glob("*.bin"):
        path.write_bytes(path.read_bytes()[:-3])
    assert syntax.parse_cached(text, "ast.nk") == first


class RunsOnLoad:
    """A pickle of this writes a file if anything unpickles it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def forged_entries(ast_json: bytes, marker) -> list:
    good = json.loads(ast_json)
    renamed = json.loads(ast_json)
    renamed[0]["node"] = "Exec"
    extra = json.loads(ast_json)
    extra[0]["extra"] = 1
    bad_span = json.loads(ast_json)
    bad_span[0]["span"] = [1, 2, "3", 4]
    bool_for_int = json.loads(ast_json)
    bool_for_int[0]["span"][0] = True
    wrong_child = json.loads(ast_json)
    wrong_child[0]["body"] = [good[0]]  # a definition where statements belong
    return [pickle.dumps(RunsOnLoad(marker)), b"\xff\xfe", b"[" * 100000 + b"]" * 100000, b'{"a": 1}',
            *(json.dumps(v).encode() for v in (renamed, extra, bad_span, bool_for_int, wrong_child))]


def test_ast_entries_are_validated_data(fresh_cache, tmp_path):
    """A parsed module is cached as JSON; an entry that is not a well-formed AST (a pickle among them, which
    never runs) is parsed again and overwritten (issue 14, item 7)."""
    text = ADD.read_text()
    first = syntax.parse_cached(text, "forged.nk")
    key = cache.key(syntax._format(), "ast", "forged.nk", text)
    ast_json = cache.DiskCache(fresh_cache).get(key)
    assert json.loads(ast_json)[0]["node"] == "FuncDef"
    marker = tmp_path / "ran"
    for forged in forged_entries(ast_json, marker):
        cache.DiskCache(fresh_cache).put(key, forged)  # a valid header: only the payload is wrong
        assert syntax.parse_cached(text, "forged.nk") == first
        assert cache.DiskCache(fresh_cache).get(key) == ast_json  # rewritten
    assert not marker.exists()


def test_inspection_compiles_and_leaves_the_binary_cache_alone(fresh_cache, monkeypatch):
    """k.ptx / k.sass (and newtc --emit) always run the pipeline; only launches read and write binaries
    (issue 14, item 8; docs/architecture.md says why)."""
    k = newtc.load(ADD).add
    before = entries(fresh_cache)
    calls = counting_compile(monkeypatch)
    for _ in range(2):
        k.ptx(*add_args(), BLOCK=1024, arch="sm_80")
    assert calls == ["sm_80", "sm_80"] and entries(fresh_cache) == before


# ---- CPU launches (the interpreter) ---------------------------------------------------------------
def test_cpu_launch_matches_torch_and_leaves_masked_lanes():
    add = newtc.load(ADD).add
    n, block = 1000, 256
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((1024,), float("nan"))  # poisoned; 24 elements past n must stay poisoned
    add[(cdiv(n, block),)](x, y, out, n, BLOCK=block)
    assert torch.equal(out[:n], x + y)
    assert out[n:].isnan().all()


def test_grid_as_a_callable_of_meta():
    add = newtc.load(ADD).add
    n = 1000
    x, y, out = torch.randn(n), torch.randn(n), torch.full((n,), float("nan"))
    seen = []

    def grid(meta):
        seen.append(dict(meta))
        return (cdiv(n, meta["BLOCK"]),)

    add[grid](x, y, out, n, BLOCK=128)
    assert seen and seen[0]["BLOCK"] == 128
    assert torch.equal(out, x + y)
    out.fill_(float("nan"))
    add[lambda meta: (cdiv(n, meta["BLOCK"]),)](x, y, out, n, BLOCK=512, num_warps=2)
    assert torch.equal(out, x + y)


def test_constexpr_default_and_helper():
    mod = newtc.compile(TWO, "two.nk")
    x = torch.randn(100)
    out = torch.empty(100)
    mod.scale[(1,)](x, out, 100, BLOCK=128)
    assert torch.equal(out, x)
    mod.scale[(1,)](x, out, 100, BLOCK=128, TWICE=True)
    assert torch.equal(out, x * 2)


LOC = r"add\.nk:(\d+):(\d+): error: "


def test_missing_constexpr_is_located():
    add = newtc.load(ADD).add
    with pytest.raises(NkError, match=LOC + "missing constexpr 'BLOCK'") as info:
        add[(1,)](*add_args())
    assert info.value.span.line == 2 and info.value.span.col == ADD.read_text().splitlines()[1].index("BLOCK") + 1


@pytest.mark.parametrize("args", [lambda a: a[:3], lambda a: a + (5,)], ids=["too-few", "too-many"])
def test_wrong_argument_count_is_located(args):
    add = newtc.load(ADD).add
    given = args(add_args())
    msg = rf"kernel 'add' takes 4 runtime arguments \(x, y, out, n\), got {len(given)}"
    with pytest.raises(NkError, match=LOC + msg):
        add[(1,)](*given, BLOCK=256)


def test_unknown_constexpr():
    add = newtc.load(ADD).add
    with pytest.raises(NkError, match=r"no constexpr parameter 'BLOK'") as info:
        add[(1,)](*add_args(), BLOCK=256, BLOK=4)
    assert "constexpr parameters: BLOCK" in str(info.value)
    assert re.search(LOC, str(info.value))
    with pytest.raises(NkError, match="no constexpr parameter 'n'"):  # runtime parameters are positional
        add[(1,)](*add_args()[:3], BLOCK=256, n=1000)


def test_unsupported_argument_type():
    add = newtc.load(ADD).add
    x, y, out, n = add_args()
    with pytest.raises(NkError, match="cannot pass str"):
        add[(1,)](x, y, out, "1000", BLOCK=256)


FILL = """\
kernel fill(out, v, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(out + offs, full([BLOCK], v, f32), mask=offs < n)
"""


def test_launch_paths_follow_the_argument_kinds():
    """One generated launch path per mix of argument kinds; switching kinds between launches stays correct."""
    import enum
    import numpy as np

    class Level(enum.IntEnum):
        FIVE = 5

    fill = newtc.compile(FILL, "fill.nk").fill
    out = torch.full((8,), float("nan"))
    for v, n, want in [(3, 8, 3.0), (2.5, 8, 2.5), (True, 8, 1.0), (np.float64(-1.5), 8, -1.5), (7, Level.FIVE, 7.0)]:
        out.fill_(float("nan"))
        fill[(1,)](out, v, n, BLOCK=8)
        assert torch.equal(out[:n], torch.full((int(n),), want)), (v, n)
    assert {k[1] for k in fill.launch_fns} == {"int", "float", "bool"}  # numpy and IntEnum went in as plain
    first = newtc.compile(FILL, "fill.nk").fill  # a numpy scalar on the very first launch, too
    first[(1,)](out, np.float64(0.5), 8, BLOCK=8)
    assert torch.equal(out, torch.full((8,), 0.5))


@pytest.mark.parametrize("kinds", [(), ("float",), ("tensor",), ("tensor", "int", "bool", "float", "tensor")])
def test_launch_source_compiles_and_keys_on_the_kinds(kinds):
    src = jit.launch_source(kinds)
    compile(src, "<launch>", "exec")
    assert f"key = ({kinds!r}" in src
    assert src.count("data_ptr()") == kinds.count("tensor")


def test_ints_specialize_on_alignment_unity_and_sign():
    """Each int argument's facts, as the launch key reads them: a multiple of 16, equal to 1, above 0 (TMA tensor maps
    need sizes and strides so)."""
    ints = dict(a=-16, b=0, c=1, d=5, e=32)
    k = newtc.compile("kernel f(x, a, b, c, d, e):\n    store(x, a + b + c + d + e)\n", "f.nk").f
    spec = k.specialize([torch.empty(1, dtype=torch.int32), *ints.values()], {})
    assert (spec.aligned, spec.ones, spec.positive) == (("a", "b", "e", "x"), ("c",), ("c", "d", "e"))


def test_the_launch_key_separates_exactly_the_specializations():
    """Two ints share a launch key only where they share a specialization: a key that missed a fact would launch a
    kernel compiled for 1000 (an odd multiple of 8: 16-byte rows of halves) on 1001."""
    k = newtc.compile("kernel f(x, n):\n    store(x, n)\n", "f.nk").f
    scope = {"Tensor": torch.Tensor, "launchers": {}, "miss": lambda grid, args, meta, key: key}
    exec(jit.launch_source(("tensor", "int")), scope)
    x = torch.empty(1, dtype=torch.int32)
    values = [-24, -16, -8, -1, 0, 1, 2, 5, 8, 16, 24, 1000, 1001, 1008, 2**31 - 8, 2**31, 2**40 + 8]
    keys = {n: scope["launch"]((1,), x, n) for n in values}
    specs = {n: repr(k.specialize([x, n], {})) for n in values}
    for a in values:
        for b in values:
            assert (keys[a] == keys[b]) == (specs[a] == specs[b]), (a, b)


BAD_GRIDS = [(1, 1, 1, 1), (-1,), (), ("two",), 2**31, (2**31,), (1, 65536), (1000 / 1024,), (1.9,), (0.0,),
             (np.float64(3.0),), "12", (None,), lambda meta: (2.5,), lambda meta: "3"]


@pytest.mark.parametrize("grid", BAD_GRIDS)
def test_bad_grids_are_named(grid):
    """A grid takes ints: a float is never truncated, a string never split (issue 14, item 2)."""
    add = newtc.load(ADD).add
    x, y, out, n = add_args()
    out.fill_(float("nan"))
    for _ in range(2):  # the first launch goes through the general path, the second through the generated one
        with pytest.raises(NkError, match=LOC + r"kernel 'add': bad launch grid") as info:
            add[grid](x, y, out, n, BLOCK=256)
        assert "a grid is a tuple of 1 to 3 ints" in info.value.render()
        add[(4,)](x, y, out, n, BLOCK=256)  # a good grid caches the launch path between the two rounds
    assert torch.equal(out, x + y)


def test_integer_grids_of_other_types():
    add = newtc.load(ADD).add
    x, y, out, n = add_args()
    for grid in [(np.int64(4),), (torch.tensor(4),), [4], (4, np.int32(1)), lambda meta: (np.int64(4),)]:
        out.fill_(float("nan"))
        add[grid](x, y, out, n, BLOCK=256)
        assert torch.equal(out, x + y), grid


# ---- 64-bit indices -------------------------------------------------------------------------------
def test_needs_idx64_from_tensor_bytes():
    big = torch.empty(2**31, dtype=torch.uint8, device="meta")  # no memory behind it
    assert jit.needs_idx64([big, 3])
    assert not jit.needs_idx64([torch.empty(2**31 - 1, dtype=torch.uint8, device="meta")])
    assert jit.needs_idx64([torch.empty(2**29, dtype=torch.float32, device="meta")])  # 2 GiB of f32
    assert not jit.needs_idx64([torch.empty(10), 2**40])  # a big int is an i64 argument, not a big tensor
    assert jit.arg_type(2**40, False) == i64 and jit.arg_type(7, False) == i32 and jit.arg_type(7, True) == i64


def test_idx64_specialization_has_i64_program_ids():
    module = newtc.load(ADD).ast
    sig = {"x": Ptr(f32), "y": Ptr(f32), "out": Ptr(f32), "n": i64}
    text = ir.print_kernel(compiler.compile(module, "add", Spec.of(sig, {"BLOCK": 1024}, idx64=True), "ir").kernel)
    assert "program_id() {axis=0} : i64" in text
    assert re.search(r"%offs\d+ = add\(.*\) : i64\[1024\]", text)
    narrow = ir.print_kernel(compiler.compile(module, "add", Spec.of({**sig, "n": i32}, {"BLOCK": 1024}), "ir").kernel)
    assert "program_id() {axis=0} : i32" in narrow


def test_kernel_specializes_to_idx64_for_a_big_tensor():
    big = torch.empty(2**31, dtype=torch.uint8, device="meta")
    mod = newtc.compile(TWO, "two.nk")
    text = mod.copy.ir(big, big, 2**31, BLOCK=1024)
    assert "program_id() {axis=0} : i64" in text and "%n" in text and ": i64" in text.splitlines()[0]
    small = torch.empty(16, dtype=torch.uint8)
    assert "program_id() {axis=0} : i32" in mod.copy.ir(small, small, 16, BLOCK=1024)


# ---- ops on CPU tensors (tests/test_ops.py has the rest) -------------------------------------------
def test_ops_softmax_on_cpu():
    x = torch.randn(37, 1000)
    torch.testing.assert_close(ops.softmax(x), torch.softmax(x, dim=-1))


def test_ops_add_broadcasts_on_cpu():
    x, y = torch.randn(3, 333), torch.randn(333)
    torch.testing.assert_close(ops.add(x, y), x + y, rtol=0, atol=0)


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False), ("yes", True)])
def test_newt_interpret_flag_is_read_at_import(value, on):
    code = "import newtc.jit as j; print(j.INTERPRET)"
    env = {**os.environ, "NEWT_INTERPRET": value, "PYTHONPATH": str(Path(newtc.__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == str(on), done.stderr


@pytest.mark.gpu
def test_interpret_flag_runs_cuda_tensors_on_the_host_and_copies_back():
    code = ("import torch, newtc; m = newtc.load('stdlib/add.nk'); x = torch.randn(1000, device='cuda'); "
            "out = torch.full_like(x, float('nan')); m.add[(1,)](x, x, out, 1000, BLOCK=1024); "
            "assert torch.equal(out, x + x); print('ok')")
    root = Path(newtc.__file__).parent.parent
    env = {**os.environ, "NEWT_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=root)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.gpu
def test_empty_grid_launches_nothing():
    x = torch.randn(0, device="cuda")
    newtc.load(Path(newtc.__file__).parent.parent / "stdlib" / "add.nk").add[(0,)](x, x, x, 0, BLOCK=1024)
    assert newtc.ops.softmax(torch.randn(0, 7, device="cuda")).shape == (0, 7)


@pytest.mark.gpu
def test_launch_past_two_gib_of_elements_uses_64_bit_indices():
    """2**31 + 4096 one-byte elements: element offsets themselves overflow i32, so only the automatic
    64-bit specialization reaches the tail."""
    n = 2**31 + 4096
    x = torch.randint(0, 100, (n,), dtype=torch.uint8, device="cuda")
    y = torch.randint(0, 100, (n,), dtype=torch.uint8, device="cuda")
    out = torch.full((n,), 255, dtype=torch.uint8, device="cuda")  # poisoned: x + y never reaches 255
    add = newtc.load(ADD).add
    add[(cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    assert torch.equal(out, x + y)
    assert any(key[4] == torch.uint8 and key[7] for key in add.launchers)  # the 2 GiB bit: i64 ran


@pytest.mark.gpu
def test_launch_without_a_current_context_runs_on_the_device():
    """With no context current in the thread (as after another library cleared it), the launch runs in the
    device's context. The ctypes path switches for that launch only; torch's compiled launcher leaves the
    primary context current, as torch's own next call would."""
    from newtc import driver
    add = newtc.load(ADD).add
    x = torch.randn(1000, device="cuda")
    out = torch.full_like(x, float("nan"))
    add[(1,)](x, x, out, 1000, BLOCK=1024)  # compiled, loaded and cached first
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    previous = driver.current_context()
    driver.set_context(None)
    try:
        add[(1,)](x, x, out, 1000, BLOCK=1024)
        assert driver.current_context() in (None, previous)
    finally:
        driver.set_context(previous)
    torch.cuda.synchronize()
    assert torch.equal(out, x + x)


# ---- the generated launch path with the driver call replaced (no GPU needed) ------------------------------
class FakeGpu:
    """Loads nothing and records each cuLaunchKernelEx as (grid, packed slots); CPU tensors stand in for CUDA
    ones, so a launcher is installed under the key the generated path computes for them."""

    def __init__(self, monkeypatch):
        self.launches = []
        monkeypatch.setattr(jit.driver, "load_module", lambda cubin: 1)
        monkeypatch.setattr(jit.driver, "get_function", lambda module, name: 1)
        monkeypatch.setattr(jit.driver, "fast_launch_function", lambda: self.cu_launch)
        monkeypatch.setattr(jit, "_stream", lambda device: 0)  # absent from CPU builds of torch

    def cu_launch(self, buf, func, params, extra):
        self.launches.append(bytes(buf))
        return 0

    def install(self, kernel, types):
        """Launches of `kernel` with new keys get a Launcher for a kernel with these parameter types."""
        binary, general = jit.Binary("nk_" + kernel.name, b"", 128, 0, types), kernel.miss

        def miss(grid, args, meta, key):
            if key is None or key in kernel.launchers:
                return general(grid, args, meta, key)
            kernel.launchers[key] = jit.Launcher(binary, 0).function()
            return kernel.current(grid, *args, **meta)  # again through the generated path: now a hit

        kernel.miss = miss
        kernel.current = kernel.run


def unpack(buf: bytes, slots: str) -> tuple:
    return struct.unpack_from(jit.driver.LAUNCH_CONFIG + slots, buf)


def test_the_generated_path_never_packs_a_value_that_does_not_fit(monkeypatch):
    gpu = FakeGpu(monkeypatch)
    k = newtc.compile(SCALAR_KERNEL, "fast.nk").k
    gpu.install(k, [Ptr(f32), i32, jit.DTYPES["u8"]])
    x = torch.zeros(4)
    for u in (7, 255, 0):
        k[(3, 2)](x, 5, u, B=4)
    assert [unpack(b, "Qi4xB7x")[:3] + unpack(b, "Qi4xB7x")[-2:] for b in gpu.launches] == [
        (3, 2, 1, 5, 7), (3, 2, 1, 5, 255), (3, 2, 1, 5, 0)]
    for args, message in [((5, 300), "argument 'u' = 300 does not fit u8"),
                          ((5, -1), "argument 'u' = -1 does not fit u8"),
                          ((2**31, 1), "argument 'm' = 2147483648 does not fit i32"),
                          ((5, 1.5), "argument 'u' = 1.5 is not an integer")]:
        with pytest.raises(NkError, match=message):
            k[(1,)](x, *args, B=4)
    for grid in [(1.5,), (0.0,), ("2",), (2**32,), (1, -1)]:
        with pytest.raises(NkError, match="bad launch grid"):
            k[grid](x, 5, 7, B=4)
    k[(0,)](x, 5, 7, B=4)  # an empty grid launches nothing
    assert len(gpu.launches) == 3


SCALAR_KERNEL = "kernel k(x, m: i32, u: u8, B: constexpr):\n    store(x + arange(0, B), (m + u.to(i32)).to(f32))\n"


@pytest.mark.gpu
def test_gpu_launches_check_scalars_and_grids():
    """On the GPU, bad scalars and grids are named through the cached launch path too; good ones run."""
    k = newtc.compile(SCALAR_KERNEL, "gpufast.nk").k
    x = torch.full((4,), float("nan"), device="cuda")
    for m, u in [(5, 7), (-3, 255), (2**31 - 1, 0)]:
        k[(1,)](x, m, u, B=4)
        torch.cuda.synchronize()
        assert torch.equal(x, torch.full((4,), float(m + u), device="cuda").to(torch.float32))
    for args in [(5, 300), (2**31, 1), (5, 1.5)]:
        with pytest.raises(NkError, match="argument '[mu]' = "):
            k[(1,)](x, *args, B=4)
    for grid in [(1.5,), ("2",), (0.0,), (1, 65536)]:
        with pytest.raises(NkError, match="bad launch grid"):
            k[grid](x, 5, 7, B=4)


@pytest.mark.gpu
def test_compiled_launcher_runs_and_leaves_what_it_cannot_take_to_the_checks():
    """Pointers, i32 and f32 go through torch's compiled launcher where torch has one: good values run; a float
    beyond f32's range and a grid beyond the device's are still named, not cast or refused by the driver."""
    k = newtc.compile("kernel s(x, m, v, B: constexpr):\n    store(x + arange(0, B), v + m.to(f32))\n", "static.nk").s
    x = torch.full((4,), float("nan"), device="cuda")
    for m, v in [(5, 0.5), (-3, 3.0e38), (2**31 - 1, -1.5)]:
        k[(1,)](x, m, v, B=4)
        torch.cuda.synchronize()
        assert torch.equal(x, torch.full((4,), v, device="cuda") + m)
        x.fill_(float("nan"))
    launcher = next(iter(k.launchers.values()))
    assert getattr(launcher, "kinds", None) == ("Kif" if hasattr(torch._C, "_StaticCudaLauncher") else None)
    for v in (1e39, -1e300):
        with pytest.raises(NkError, match="is outside the range of f32"):
            k[(1,)](x, 1, v, B=4)
    with pytest.raises(NkError, match="bad launch grid"):
        k[(1, 65536)](x, 1, 0.5, B=4)
    assert torch.isnan(x).all()


@pytest.mark.parametrize("path", ["missing.nk", "."], ids=["missing", "a-folder"])
def test_load_of_a_file_that_cannot_be_read(tmp_path, path):
    with pytest.raises(NkError, match="cannot read"):
        newtc.load(tmp_path / path)


def test_load_reports_the_compilers_own_missing_files_as_themselves(tmp_path, monkeypatch):
    """A file that reads fine but whose compile hits an OSError of newt's own (an install without its grammar folder)
    says so, not "cannot read" the user's file."""
    from newtc import jit
    path = tmp_path / "k.nk"
    path.write_text("kernel k(x):\n    pass\n")

    def broken(*_):
        raise FileNotFoundError("newt data folder 'grammar' not found")
    monkeypatch.setattr(jit, "Module", broken)
    with pytest.raises(FileNotFoundError, match="grammar"):
        newtc.load(path)
