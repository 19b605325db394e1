"""newtc.ops as torch custom ops (torch.ops.newt.*): their schemas, fake implementations and autograd pass
torch.library.opcheck, torch.compile traces them into one graph (fullgraph=True: no graph break), which then
runs newt's kernels: in the interpreter on the CPU, and on the GPU (marker gpu); and an input that requires a
gradient gets torch's, eagerly and compiled."""
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import newtc
from newtc import ops


def cases(device: str):
    """(name, newt function, torch function, inputs) for every op."""
    x, y = torch.randn(5, 70, device=device), torch.randn(5, 70, device=device)
    w, b = torch.randn(70, device=device), torch.randn(70, device=device)
    t = torch.randint(0, 70, (5,), device=device)
    # small integers: the product is exact in f32, tf32 (the GPU's f32 matmul) and the interpreter alike
    a, m = (torch.randint(-3, 4, shape, device=device).float() for shape in ((5, 70), (70, 9)))
    return [
        ("softmax", ops.softmax, lambda x: torch.softmax(x, -1), (x,)),
        ("log_softmax", ops.log_softmax, lambda x: torch.log_softmax(x, -1), (x,)),
        ("cross_entropy", ops.cross_entropy, lambda x, t: F.cross_entropy(x, t, reduction="none"), (x, t)),
        ("layernorm", lambda x, w, b: ops.layernorm(x, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, (70,), w, b),
         (x, w, b)),
        ("rmsnorm", lambda x, w: ops.rmsnorm(x, w, 1e-6), lambda x, w: F.rms_norm(x, (70,), w, 1e-6), (x, w)),
        ("sum", ops.sum, lambda x: x.sum(-1), (x,)),
        ("mean", ops.mean, lambda x: x.mean(-1), (x,)),
        ("amax", ops.amax, lambda x: x.amax(-1), (x,)),
        ("add", ops.add, torch.add, (x, y)),
        ("bias_gelu", ops.bias_gelu, lambda x, b: F.gelu(x + b), (x, b)),
        ("transpose", ops.transpose, lambda x: x.t(), (x,)),
        ("matmul", ops.matmul, torch.matmul, (a, m)),
    ]


def test_every_public_op_is_a_custom_op():
    for name, *_ in cases("cpu"):
        assert hasattr(torch.ops.newt, name), name


@pytest.mark.parametrize("case", cases("cpu"), ids=lambda c: c[0])
def test_opcheck(case):
    """Schema, fake tensors and AOT dispatch agree with the real kernels (which run in the interpreter)."""
    name, _, _, args = case
    torch.library.opcheck(getattr(torch.ops.newt, name).default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic",
                                      "test_autograd_registration"))


def compiled_graph_ops(fn, args, backend_after="aot_eager"):
    """Compile fn with fullgraph=True through a backend that records the FX graph's call targets."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend(backend_after)(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return out, seen


@pytest.mark.parametrize("case", cases("cpu"), ids=lambda c: c[0])
def test_compile_traces_without_graph_break(case):
    name, newt, ref, args = case

    def fn(*a):
        return newt(*a) * 2 + 1  # torch ops around it, in the same graph

    out, seen = compiled_graph_ops(fn, args)
    assert any(f"newt.{name}" in s for s in seen), seen
    torch.testing.assert_close(out, ref(*args) * 2 + 1, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases("cuda") if torch.cuda.is_available() else [], ids=lambda c: c[0])
def test_compile_on_the_gpu(case):
    """The default backend (inductor) on CUDA tensors, with fullgraph=True."""
    name, newt, ref, args = case
    torch._dynamo.reset()
    out = torch.compile(lambda *a: newt(*a) * 2 + 1, fullgraph=True)(*args)
    torch.testing.assert_close(out, ref(*args) * 2 + 1, rtol=1e-4, atol=1e-4)


def test_eager_calls_skip_the_dispatcher(monkeypatch):
    """Outside torch.compile the ops run directly (the custom op's dispatch costs ~50 us a call)."""
    monkeypatch.setattr(torch.ops.newt, "softmax", None)  # any use of it would fail
    x = torch.randn(3, 9)
    torch.testing.assert_close(newtc.ops.softmax(x), torch.softmax(x, -1))


def leaves(args: tuple) -> list:
    """Fresh copies of the inputs, the floating ones requiring a gradient."""
    return [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]


def gradients(fn, args: tuple, g: Tensor | None = None) -> tuple:
    """fn's output and the gradients of its floating inputs for an upstream gradient g (random if None)."""
    inputs = leaves(args)
    out = fn(*inputs)
    g = torch.randn_like(out) if g is None else g
    (out * g).sum().backward()
    return out, g, [a.grad for a in inputs if a.is_floating_point()]


@pytest.mark.parametrize("case", cases("cpu"), ids=lambda c: c[0])
def test_gradients_are_torchs(case):
    """An input that requires a gradient takes the custom op, whose backward is the torch op's: the output carries a
    grad_fn (it did not: training through ops.* lost every gradient before it, silently)."""
    name, newt, ref, args = case
    out, g, got = gradients(newt, args)
    assert out.grad_fn is not None
    want, _, expected = gradients(ref, args, g)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [c for c in cases("cpu") if c[0] in ("layernorm", "cross_entropy", "matmul")],
                         ids=lambda c: c[0])
def test_compiled_gradients_are_torchs(case):
    """The same through torch.compile (one graph, forward and backward)."""
    name, newt, ref, args = case
    torch._dynamo.reset()
    out, g, got = gradients(torch.compile(newt, backend="aot_eager", fullgraph=True), args)
    want, _, expected = gradients(ref, args, g)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_no_grad_keeps_the_direct_path(monkeypatch):
    """Inputs that require a gradient, under torch.no_grad (inference with a model's parameters): no custom op."""
    monkeypatch.setattr(torch.ops.newt, "layernorm", None)
    x, w = torch.randn(3, 9, requires_grad=True), torch.randn(9, requires_grad=True)
    with torch.no_grad():
        out = newtc.ops.layernorm(x, w, None)
    assert out.grad_fn is None
    torch.testing.assert_close(out, F.layer_norm(x.detach(), (9,), w.detach()))
