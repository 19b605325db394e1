"""The newtc command, run in-process through main() and once as `python -m newtc`."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from newtc.cli import main

ROOT = Path(__file__).resolve().parent.parent
ADD = str(ROOT / "stdlib" / "add.nk")
ADD_SPEC = ["--sig", "x=*f32,y=*f32,out=*f32,n=i32", "-D", "BLOCK=1024"]

BROKEN = """\
kernel scale(x, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(x + offs, load(x + offs) * undefined_name, mask=offs < n)
"""


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_emit_ir(capsys):
    rc, out, err = run(capsys, ADD, *ADD_SPEC, "--emit", "ir")
    assert rc == 0, err
    assert out.startswith("kernel @add(")
    assert "load(" in out and "store(" in out and "[BLOCK=1024]" in out


def test_emit_cuda_is_the_default(capsys):
    rc, out, err = run(capsys, ADD, *ADD_SPEC)
    assert rc == 0, err
    assert "__global__" in out and '#line' in out


def test_emit_ast(capsys):
    rc, out, err = run(capsys, ADD, "--emit", "ast")
    assert rc == 0, err
    assert "FuncDef(kind='kernel', name='add'" in out and "Assign(" in out
    assert "span" not in out


def test_emit_ptx(capsys):
    rc, out, err = run(capsys, ADD, *ADD_SPEC, "--emit", "ptx", "--arch", "sm_90a")
    assert rc == 0, err
    assert ".target sm_90a" in out and ".entry" in out


def test_emit_sass_has_vector_loads(capsys):
    rc, out, err = run(capsys, ADD, *ADD_SPEC, "--emit", "sass")
    assert rc == 0, err
    assert "LDG.E.128" in out


def test_cubin_to_file(capsys, tmp_path):
    path = tmp_path / "add.cubin"
    rc, out, err = run(capsys, ADD, *ADD_SPEC, "--emit", "cubin", "-o", str(path))
    assert rc == 0, err
    assert out == ""
    assert path.read_bytes().startswith(b"\x7fELF")


def test_output_file_for_text(capsys, tmp_path):
    path = tmp_path / "add.cu"
    rc, out, err = run(capsys, ADD, *ADD_SPEC, "-o", str(path))
    assert rc == 0, err
    assert "__global__" in path.read_text()


def test_check_ok(capsys):
    rc, out, err = run(capsys, "--check", ADD, *ADD_SPEC)
    assert (rc, out, err) == (0, "", "")


def test_check_without_sig_parses_only(capsys):
    rc, out, err = run(capsys, "--check", ADD)
    assert rc == 0
    assert "not checked" in err and "--sig for x, y, out, n" in err and "-D for BLOCK" in err


@pytest.mark.parametrize("text, line_col", [
    (BROKEN, ":3:38:"),  # a check error: the unknown name
    ("kernel k(x):\n    y = x +\n", ":2:12:"),  # a syntax error
], ids=["check-error", "syntax-error"])
def test_check_broken_file(capsys, tmp_path, text, line_col):
    path = tmp_path / "file.nk"
    path.write_text(text)
    rc, out, err = run(capsys, "--check", str(path), "--sig", "x=*f32,n=i32", "-D", "BLOCK=128")
    assert rc == 1
    assert f"file.nk{line_col}" in err and "error:" in err
    assert "Traceback" not in err


def test_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(Path(ADD).read_text()))
    rc, out, err = run(capsys, "-", *ADD_SPEC, "--emit", "ir")
    assert rc == 0, err
    assert out.startswith("kernel @add(")


def test_missing_sig_names_the_param(capsys):
    rc, out, err = run(capsys, ADD, "--sig", "x=*f32,y=*f32,out=*f32", "-D", "BLOCK=1024")
    assert rc == 1
    assert "'n'" in err and "--sig n=*f32" in err and "add.nk:2:" in err


def test_missing_constexpr(capsys):
    rc, out, err = run(capsys, ADD, "--sig", "x=*f32,y=*f32,out=*f32,n=i32")
    assert rc == 1 and "BLOCK" in err and "-D BLOCK=" in err


def test_several_kernels_need_k(capsys, tmp_path):
    path = tmp_path / "two.nk"
    path.write_text("kernel a(x: *f32):\n    store(x, 1.0)\n\nkernel b(x: *f32):\n    store(x, 2.0)\n")
    rc, out, err = run(capsys, str(path))
    assert rc == 1 and "-k" in err and "a, b" in err
    rc, out, err = run(capsys, str(path), "-k", "b", "--emit", "ir")  # annotations give the types
    assert rc == 0, err
    assert out.startswith("kernel @b(")
    rc, out, err = run(capsys, str(path), "-k", "c")
    assert rc == 1 and "no kernel named 'c'" in err


@pytest.mark.parametrize("argv", [
    [],
    [ADD, "--emit", "llvm"],
    [ADD, "--sig", "x=float"],
    [ADD, "-D", "BLOCK=abc"],
    [ADD, "-D", "BLOCK"],
    [ADD, "--num-warps", "four"],
])
def test_bad_usage_exits_2(capsys, argv):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert "usage:" in err


def test_help_has_examples(capsys):
    rc, out, err = run(capsys, "--help")
    assert rc == 0
    assert "examples:" in out and "--emit sass" in out


def test_missing_file(capsys, tmp_path):
    rc, out, err = run(capsys, str(tmp_path / "nope.nk"))
    assert rc == 1 and "cannot read" in err and "Traceback" not in err


def test_python_dash_m(tmp_path):
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "newtc", ADD, *ADD_SPEC, "--emit", "ir"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kernel @add(")
    broken = tmp_path / "file.nk"
    broken.write_text(BROKEN)
    done = subprocess.run([sys.executable, "-m", "newtc", "--check", str(broken), "--sig", "x=*f32,n=i32",
                           "-D", "BLOCK=128"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert "file.nk:3:" in done.stderr and "\033[" not in done.stderr and "Traceback" not in done.stderr


def test_cubin_to_stdout_when_redirected(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "newtc", ADD, *ADD_SPEC, "--emit", "cubin"],
                          capture_output=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"\x7fELF")


def test_aligned_specialization_gives_bare_vector_accesses(capsys):
    args = [ADD, *ADD_SPEC, "--emit", "cuda"]
    assert main(args) == 0
    checked = capsys.readouterr().out
    assert main(args + ["--aligned", "all"]) == 0
    proven = capsys.readouterr().out
    assert "& 15) == 0" in checked and "& 15) == 0" not in proven


def test_eights_specialization_proves_the_mask_of_8_halves_uniform(capsys):
    """n an odd multiple of 8 (a launch with n = 1000): each 16-byte group of halves lies on one side of n."""
    args = [ADD, "--sig", "x=*f16,y=*f16,out=*f16,n=i32", "-D", "BLOCK=1024", "--aligned", "x,y,out", "--emit", "cuda"]
    assert main(args) == 0
    checked = capsys.readouterr().out
    assert main(args + ["--eights", "n"]) == 0
    proven = capsys.readouterr().out
    assert "mask_7[0] && mask_7[1]" in checked and "mask_7[0] && mask_7[1]" not in proven


NO_TORCH = """
import sys
{body}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton"))
assert not heavy, heavy
"""


@pytest.mark.parametrize("body", [
    "from newtc.cli import main; main(['--help'])",
    f"from newtc.cli import main; assert main([{ADD!r}, *{ADD_SPEC!r}, '--emit', 'ptx']) == 0",
    f"from newtc.cli import main; assert main(['--check', {ADD!r}]) == 0",
    "import newtc, newtc.compiler, newtc.syntax; newtc.NkError",
])
def test_the_command_never_imports_torch(body, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NEWT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", NO_TORCH.format(body=body)], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_python_dash_m_help_imports_no_torch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "newtc", "--help"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "usage: newtc" in done.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    assert "newtc.cli" in imported and not [m for m in imported if m.split(".")[0] == "torch"]


def test_lazy_names_still_work(tmp_path):
    code = ("import newtc, torch; m = newtc.compile('kernel k(x):\\n    store(x, 2.0)\\n'); x = torch.zeros(1); "
            "m.k[(1,)](x); assert x.item() == 2.0; assert newtc.ops.add(x, x).item() == 4.0; "
            "assert newtc.load is newtc.jit.load and isinstance(m, newtc.Module) and 'Kernel' in dir(newtc)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NEWT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# ---- newtc does what it is asked or says why (issue 14, item 10) ------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--check", ADD, "-k", "nope"], "no kernel named 'nope'"),
    (["--check", ADD, "--sig", "zz=i32"], "--sig zz: kernel 'add' has no parameter 'zz'"),
    (["--check", ADD, "-D", "ZZ=1"], "-D ZZ: kernel 'add' has no parameter 'ZZ'"),
    ([ADD, *ADD_SPEC, "--aligned", "zz"], "--aligned zz: kernel 'add' has no parameter 'zz'"),
    ([ADD, *ADD_SPEC, "--eights", "BLOCK"], "--eights BLOCK: 'BLOCK' is a constexpr parameter"),
    ([ADD, *ADD_SPEC, "--sig", "BLOCK=i32"], "--sig BLOCK: 'BLOCK' is a constexpr parameter"),
    ([ADD, "--sig", "x=*f32,y=*f32,out=*f32", "-D", "BLOCK=1024", "-D", "n=3"], "-D n: 'n' is a runtime parameter"),
])
def test_names_the_command_line_cannot_use(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 1 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, message", [
    ([ADD, *ADD_SPEC, "--num-stages", "0"], "--num-stages: expected from 1 to 32, got '0'"),
    ([ADD, *ADD_SPEC, "--num-stages", "-5"], "expected from 1 to 32"),
    ([ADD, *ADD_SPEC, "--num-stages", "100000"], "expected from 1 to 32"),
    ([ADD, *ADD_SPEC, "--num-warps", "3"], "--num-warps: expected a power of two from 1 to 32, got '3'"),
    ([ADD, *ADD_SPEC, "--arch", "hopper"], "--arch: expected sm_XY or compute_XY"),
    ([ADD, *ADD_SPEC, "--emit", "cubin", "--arch", "compute_90", "-o", "f.cubin"], "--arch compute_90 is virtual"),
    ([ADD, *ADD_SPEC, "--emit", "sass", "--arch", "compute_90"], "--emit sass needs sm_XY"),
])
def test_bad_options_are_usage_errors(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and message in err, err
    assert not (tmp_path / "f.cubin").exists()


def test_ptx_for_a_virtual_arch(capsys):
    rc, out, err = run(capsys, ADD, *ADD_SPEC, "--emit", "ptx", "--arch", "compute_90")
    assert rc == 0 and ".target sm_90" in out, err


def test_check_of_several_kernels_takes_the_union_of_their_parameters(capsys, tmp_path):
    path = tmp_path / "two.nk"
    path.write_text("kernel a(x, n: i32):\n    store(x, 1.0)\n\nkernel b(y, B: constexpr):\n    store(y, 2.0)\n")
    rc, out, err = run(capsys, "--check", str(path), "--sig", "x=*f32,y=*f32", "-D", "B=4")
    assert (rc, err) == (0, "")
    rc, out, err = run(capsys, "--check", str(path), "--sig", "z=*f32")
    assert rc == 1 and "--sig z: no kernel checked here has a parameter 'z'" in err


@pytest.mark.parametrize("redirect", ["full", "closed-out", "closed-in"])
def test_closed_or_full_standard_streams_are_errors_not_tracebacks(tmp_path, redirect):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NEWT_CACHE_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "newtc", "-" if redirect == "closed-in" else ADD, *ADD_SPEC]
    if redirect == "full":
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this system")
        with open("/dev/full", "w") as full:
            done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env)
        assert "cannot write the output: No space left on device" in done.stderr
    else:
        fd = 1 if redirect == "closed-out" else 0
        done = subprocess.run(argv, stderr=subprocess.PIPE, text=True, env=env, pass_fds=(),
                              preexec_fn=lambda: os.close(fd))
        assert ("standard output is closed" if fd == 1 else "the standard input: it is closed") in done.stderr
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
