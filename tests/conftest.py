"""Shared test configuration: tests marked `gpu` are skipped on a machine without a CUDA GPU; the fixture that
poisons what the ops allocate; NEWT_SIMT=1, which runs CPU launches through their generated code."""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every tensor the ops allocate starts as NaN (or -1), so an element the kernel fails to write shows."""
    from newtc import ops
    for name in ("empty", "empty_like", "empty_strided"):
        real = getattr(ops.torch, name)

        def poisoned(*args, _real=real, **kwargs):
            t = _real(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)
        monkeypatch.setattr(ops.torch, name, poisoned)


@pytest.fixture(autouse=os.environ.get("NEWT_SIMT") == "1")
def generated_code_on_the_cpu(monkeypatch):
    """NEWT_SIMT=1: every CPU launch runs its generated CUDA (tests/simt.py) where the CPU can, else the interpreter.
    Tests of the interpreter's own diagnostics (bounds, device_assert, print) then fail or stop, as on a GPU."""
    import simt
    from newtc import jit
    monkeypatch.setattr(jit.Kernel, "interpret", simt.run_or_interpret)
