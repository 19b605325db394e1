"""A plain (non-editable) `pip install .` works: the installed package finds its grammar and stdlib/."""
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent("""\
    import sys
    from pathlib import Path
    import newtc
    from newtc import paths, syntax
    root = Path(sys.argv[1])
    here = Path(newtc.__file__).resolve().parent
    assert root not in here.parents, f"imported the source tree: {here}"
    assert paths.data_dir("grammar") == here / "grammar", paths.data_dir("grammar")
    assert (paths.data_dir("grammar") / "nk.lark").is_file()
    add = paths.data_dir("stdlib") / "add.nk"
    assert add == here / "stdlib" / "add.nk" and add.is_file(), add
    module = syntax.parse(add.read_text(), str(add))
    assert [d.name for d in module.defs] == ["add"]
    mod = newtc.compile("kernel k(x: *f32):\\n    store(x, 1.0)\\n", "probe.nk")
    assert "k" in mod.kernels
    from newtc import cli
    assert cli.main(["--check", str(add)]) == 0
    print("ok")
""")


def source_copy(dest: Path) -> Path:
    """The files a build reads, copied, so that the build leaves nothing (build/, *.egg-info) in the tree."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, dest / name)
    for name in ("newtc", "deuteron", "grammar", "stdlib"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def test_non_editable_install(tmp_path):
    src, target = source_copy(tmp_path / "src"), tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--quiet", "--target", str(target)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.append("--no-build-isolation")  # build with the setuptools already here: no network needed
    done = subprocess.run(cmd + [str(src)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "newtc" / "grammar" / "nk.lark").is_file()
    assert (target / "newtc" / "stdlib" / "add.nk").is_file()
    assert (target / "newtc" / "cli.py").is_file() and (target / "deuteron" / "__init__.py").is_file()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    shutil.rmtree(src)  # nothing but the installed copy is left to import
    done = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], capture_output=True, text=True,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"
