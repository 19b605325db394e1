"""deuteron on the CPU: each example tile program lowered for several configs, checked and compiled by NVRTC
(sm_80 and sm_90a), run in newt's interpreter against the eager oracle; the oracle against torch; errors at
the tile program's lines; the API and the `deuteron` command."""
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import deuteron
import newtc.ops
from deuteron.cli import main
from newtc.errors import NkError

ROOT = Path(__file__).resolve().parent.parent
TILES = str(ROOT / "examples" / "tiles.nk")


@pytest.fixture(scope="module")
def prog():
    return deuteron.load(TILES)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def attention_ref(q, k, v, causal=False):
    s = (q.double() @ k.double().transpose(1, 2)) / q.shape[2] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.double()).to(q.dtype)


# name -> (arguments: ragged shapes, then shapes every block divides; the torch reference; configs)
CASES = {
    "add": (lambda even: [rand(1024 if even else 1000), rand(1024 if even else 1000)], torch.add,
            [dict(block_t=128), dict(block_t=1024, num_warps=8), dict(block_t=32, num_warps=1)]),
    "softmax": (lambda even: [rand(32 if even else 37, 64 if even else 100)], lambda x: torch.softmax(x, -1),
                [dict(block_tm=1), dict(block_tm=4, num_warps=2), dict(block_tm=16, num_warps=8)]),
    "layernorm": (lambda even: [rand(32 if even else 37, 64 if even else 100), rand(64 if even else 100),
                                rand(64 if even else 100), 1e-5],
                  lambda x, w, b, eps: F.layer_norm(x, x.shape[-1:], w, b, eps),
                  [dict(block_tm=1), dict(block_tm=8, num_warps=2)]),
    "matmul": (lambda even: [rand(64 if even else 37, 32 if even else 70, dtype=torch.float16),
                             rand(32 if even else 70, 64 if even else 45, dtype=torch.float16)],
               lambda x, y: (x.float() @ y.float()).half(),
               [dict(block_tm=16, block_tn=16, block_tk=16, group=1),
                dict(block_tm=32, block_tn=16, block_tk=16, group=4, num_stages=1, num_warps=2),
                dict(block_tm=16, block_tn=32, block_tk=16, persistent=True)]),
    "linear_gelu": (lambda even: [rand(64 if even else 37, 32 if even else 70), rand(32 if even else 70, 64 if even else 45),
                                  rand(64 if even else 45)],
                    lambda x, y, b: F.gelu(x @ y + b),
                    [dict(block_tm=16, block_tn=16, block_tk=16), dict(block_tm=16, block_tn=32, block_tk=32, group=1, persistent=True)]),
    "matmul_splitk": (lambda even: [rand(64 if even else 37, 64 if even else 70), rand(64 if even else 70, 32 if even else 45)],
                      lambda x, y: x @ y,
                      [dict(block_tm=16, block_tn=16, block_tk=16), dict(block_tm=32, block_tn=16, block_tk=32, group=1)]),
    "attention": (lambda even: [rand(2, 64 if even else 50, 32), rand(2, 32 if even else 40, 32), rand(2, 32 if even else 40, 32)],
                  attention_ref, [dict(block_tm=16, block_tk=16), dict(block_tm=32, block_tk=16, persistent=True, num_warps=8)]),
}
CONFIGS = [(name, i) for name, case in CASES.items() for i in range(len(case[2]))]


def close(got, want, dtype):
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("even", [False, True], ids=["ragged", "even"])
@pytest.mark.parametrize("name,i", CONFIGS)
def test_lowered_kernel_checks_compiles_and_matches_the_oracle(prog, name, i, even):
    make, _, configs = CASES[name]
    fn = getattr(prog, name)
    args = make(even)
    config = {**fn.space(*args).default(), **configs[i]}
    result, plan = fn.plan(args, {}, config, poison=True)  # outputs start as NaN: every element must be written
    assert len(plan) == 1
    for arch in ("sm_80", "sm_90a"):
        assert plan[0].compile("cubin", arch).binary.cubin
    plan[0]()  # CPU tensors: newt's interpreter
    close(result, fn(*args, eager=True), args[0].dtype)
    text = plan[0].low.text
    assert f"config {{\"{next(iter(config))}\"" in text.splitlines()[0] and "  # tiles.nk:" in text
    assert ("mask=" not in text) == even  # masks only where the specialization cannot prove them away


@pytest.mark.parametrize("name", CASES)
def test_oracle_matches_torch(prog, name):
    make, ref, _ = CASES[name]
    args = make(False)
    close(getattr(prog, name)(*args, eager=True), ref(*args), args[0].dtype)


def test_fp8_operands(prog):
    """fp8 tensors: the oracle's `@` of fp8 tiles in f32, the kernel's dot of fp8 blocks (compiled for both archs);
    each rounds its fp8 output once, to within half an e4m3 step (1/16) of the exact product."""
    x, y = rand(37, 70, dtype=torch.float8_e4m3fn), rand(70, 45, dtype=torch.float8_e4m3fn)
    want = x.double() @ y.double()
    result, plan = prog.matmul.plan([x, y], {}, dict(block_tm=16, block_tn=16, block_tk=32), poison=True)
    for arch in ("sm_80", "sm_90a"):
        assert plan[0].compile("cubin", arch).binary.cubin
    plan[0]()
    for got in (result, prog.matmul(x, y, eager=True)):
        assert got.dtype == torch.float8_e4m3fn
        torch.testing.assert_close(got.double(), want, rtol=1 / 16, atol=2 ** -10)


def test_causal_attention(prog):
    q, k, v = rand(2, 50, 32), rand(2, 50, 32), rand(2, 50, 32)
    want = attention_ref(q, k, v, True)
    close(prog.attention(q, k, v, True, eager=True), want, q.dtype)
    close(prog.attention(q, k, v, True, config=dict(block_tm=16, block_tk=32, num_warps=4)), want, q.dtype)


def test_generated_kernel_reads_like_a_hand_written_one(prog):
    x, y = rand(37, 70), rand(70, 45)
    text = prog.matmul.source(x, y, config=dict(block_tm=32, block_tn=16, block_tk=16, group=8, num_warps=4))
    assert "kernel matmul(x, y, out, " in text and "BLOCK_TM: constexpr" in text and "GROUP: constexpr" in text
    assert "acc = dot(load(x + tm[:, None] * x_stride0 + tk[None, :]" in text  # @ accumulates in the dot
    assert "first = pid // group * GROUP" in text  # program-id grouping
    assert "for tk_begin in range(0, x_size1, BLOCK_TK):" in text
    persistent = prog.matmul.source(x, y, config=dict(block_tm=16, block_tn=16, block_tk=16, persistent=True))
    assert "in range(program_id(0), n_tm * n_tn, num_programs(0)):" in persistent


def test_reductions_mask_ragged_dims_with_their_identity(prog):
    text = prog.softmax.source(rand(37, 100), config=dict(block_tm=4))
    assert "max(where(r0[None, :] < x_size1, v, -inf), axis=1)" in text
    assert "sum(where(r0[None, :] < x_size1, num, 0), axis=1)" in text


def test_index_reductions_and_kept_dims():
    src = """\
tile rowstats(x):
    idx = empty([x.shape[0]], i32)
    top = empty([x.shape[0], 1], f32)
    for tm in tiles(x.shape[0]):
        v = x[tm, :]
        idx[tm] = argmax(v, axis=1)
        top[tm, :] = max(v, axis=1, keep_dims=True) - min(v, axis=1, keep_dims=True)
    return idx, top
"""
    fn = deuteron.compile(src, "rowstats.nk").rowstats
    x = -rand(37, 100).abs()  # all negative: padding that is not masked away would win the max
    want = (torch.argmax(x, 1).int(), x.amax(1, keepdim=True) - x.amin(1, keepdim=True))
    for got in (fn(x, eager=True), fn(x, config=dict(block_tm=8))):
        assert torch.equal(got[0], want[0])
        close(got[1], want[1], x.dtype)



def test_the_oracle_reduces_a_nan_as_the_kernels_do():
    """A NaN among a row's values: max and argmax ignore it, and atomic_max keeps the larger operand, in the oracle
    as in the kernels (maximum's fmaxf; torch.amax and torch.maximum keep a NaN). A row of NaN alone gives NaN where
    its block has no padding, and the padding's -inf where it has: not a case the oracle can follow."""
    fn = deuteron.compile("""\
tile nanstats(x):
    top = empty([x.shape[0]], f32)
    idx = empty([x.shape[0]], i32)
    best = full([1], -inf, f32)
    for tm in tiles(x.shape[0]):
        top[tm] = max(x[tm, :], axis=1)
        idx[tm] = argmax(x[tm, :], axis=1)
        atomic_max(best[0], max(max(x[tm, :], axis=1), axis=0))
    return top, idx, best
""", "nanstats.nk").nanstats
    x = rand(9, 40)
    x[1, 3], x[4, :39], x[6, 39] = float("nan"), float("nan"), float("nan")
    clean = torch.where(x.isnan(), float("-inf"), x)
    want = (clean.amax(1), clean.argmax(1).int(), clean.amax().reshape(1))
    for got in (fn(x, eager=True), fn(x, config=dict(block_tm=4))):
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (got, want)


def test_the_oracle_casts_a_float_to_an_int_as_the_kernels_do():
    """A float out of an int's range saturates and NaN gives 0 (PTX cvt.rzi), in the oracle as in the kernels (torch's
    cast wraps or gives the type's minimum)."""
    fn = deuteron.compile("""\
tile toint(x):
    wide = empty([x.shape[0], x.shape[1]], i32)
    narrow = empty([x.shape[0], x.shape[1]], u8)
    for tm in tiles(x.shape[0]):
        wide[tm, :] = x[tm, :].to(i32)
        narrow[tm, :] = x[tm, :].to(u8)
    return wide, narrow
""", "toint.nk").toint
    x = rand(6, 8) * 400 - 200
    x[0, 0], x[1, 1], x[2, 2], x[3, 3], x[4, 4] = float("nan"), 3e9, -3e9, float("inf"), float("-inf")
    exact = x.double().nan_to_num(0.0, 1e300, -1e300)
    want = exact.clamp(-2 ** 31, 2 ** 31 - 1).long().int(), exact.clamp(0, 255).long().to(torch.uint8)
    for got in (fn(x, eager=True), fn(x, config=dict(block_tm=4))):
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (got, want)

BMM = """\
tile bmm(x, y):
    out = empty([x.shape[0], x.shape[1], y.shape[2]], f32)
    for b, tm, tn in tiles(grid(x.shape[0]), x.shape[1], y.shape[2]):
        acc = zeros([tm, tn], f32)
        for tk in tiles(x.shape[2]):
            acc += x[b, tm, tk] @ y[b, tk, tn]
        out[b, tm, tn] = acc
    return out
"""


@pytest.mark.parametrize("config", [dict(group=1), dict(group=4), dict(group=4, persistent=True)])
def test_a_batch_index_and_grouped_tiles(config):
    fn = deuteron.compile(BMM, "bmm.nk").bmm
    x, y = rand(3, 70, 40), rand(3, 40, 50)
    config = {**fn.space(x, y).default(), "block_tm": 16, "block_tn": 16, "block_tk": 16, **config}
    close(fn(x, y, config=config), x @ y, x.dtype)
    text = fn.source(x, y, config=config)
    assert ("inner = pid % (n_tm * n_tn)" in text) == (config["group"] > 1) and "b = pid // " in text


def test_strided_operands_and_a_scalar_atomic(prog):
    x, y = rand(37, 70), rand(45, 70).t()  # y's unit stride is along its first dimension
    config = dict(block_tm=16, block_tn=16, block_tk=16)
    close(prog.matmul(x, y, config=config), x @ y, x.dtype)
    assert "y + tk[:, None] + tn[None, :] * y_stride1" in prog.matmul.source(x, y, config=config)
    total = deuteron.compile("""\
tile total(x):
    out = zeros([1], f32)
    for t in tiles(x.shape[0]):
        atomic_add(out[0], sum(x[t], axis=0))
    return out
""", "total.nk").total
    v = rand(1000)
    close(total(v, config=dict(block_t=64)), v.sum().reshape(1), v.dtype)


# The instruction families of a generated kernel's body: tensor core ops, the cp.async ring, the epilogue's stores.
INSTRUCTIONS = r"wgmma\.[\w.]+|cp\.async\.[\w.]+(?: \d)?|nk_cp_async<\d+>|nk_pack<\w+, \d+>|nk_store_if|nk_desc|__syncthreads"


def test_the_stdlib_matmul_config_lowers_to_the_stdlib_kernels_instructions(prog):
    """For the config newtc.ops.matmul picks at 4096^3 f16 on sm_90a, the tile program's kernel has the stdlib
    kernel's instruction mix: the same wgmma tiles, cp.async ring, waits and vector stores (its masks dropped), and
    the same loop over tiles (the stdlib kernel's programs walk the tiles one grid apart)."""
    n = 4096
    x = torch.empty(n, n, dtype=torch.float16, device="meta")
    cfg = newtc.ops._matmul_config(n, n, n, 2, "sm_90a")
    config = dict(block_tm=cfg["BM"], block_tn=cfg["BN"], block_tk=cfg["BK"], num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"], persistent=True, group=8)
    assert prog.matmul.space(x, x).contains(config)
    (launch,) = prog.matmul.plan((x, x), {}, config)[1]
    ours = launch.stage("cuda")
    stdlib = newtc.ops._stdlib("matmul").matmul.output((x, x, x, n, n, n, n, 1, n, 1, n, 1),
                                                         dict(GROUP_M=8, ACTIVATION="none", **cfg), "cuda", "sm_90a").cuda.source

    def mix(src):
        return Counter(re.findall(INSTRUCTIONS, src[src.index("__global__"):]))
    assert mix(ours) == mix(stdlib) and mix(ours)["wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16"]
    assert "mask=" not in launch.low.text


BAD = """\
tile shift(x):
    out = empty_like(x)
    for t in tiles(x.shape[0]):
        out[t] = x[t] << 1.5
    return out

tile ranged(x):
    out = empty_like(x)
    for t in tiles(x.shape[0]):
        out[t] = x[t, 1:3]
    return out

tile overrun(x):
    out = empty_like(x)
    for t in tiles(x.shape[0] + 5):
        out[t] = x[t]
    return out

tile grid_overrun(x):
    out = empty_like(x)
    for i in tiles(grid(x.shape[0] + 1)):
        out[i] = x[i]
    return out
"""


@pytest.mark.parametrize("name,line,message", [
    ("shift", 4, "needs integer operands"),  # newt's checker, on the generated kernel
    ("ranged", 10, "too many indices"),  # the lowering
    ("overrun", 16, "the index runs over 105, past x's dimension 0 of 100"),  # the lowering: on the GPU, a read past
    ("grid_overrun", 22, "the index runs over 101, past x's dimension 0 of 100"),  # x's end
])
def test_errors_point_at_the_tile_program(name, line, message):
    bad = deuteron.compile(BAD, "bad.nk")
    with pytest.raises(NkError) as e:
        getattr(bad, name)(rand(100), config=dict(block_t=32))
    span = e.value.diagnostics[0].span
    assert (span.file, span.line) == ("bad.nk", line) and message in str(e.value)
    assert e.value.render(color=False).startswith(f"bad.nk:{line}:")


def test_eager_by_environment_lowers_nothing(prog, monkeypatch):
    monkeypatch.setenv("DEUTERON_EAGER", "1")
    fn = deuteron.load(TILES).softmax
    x = rand(5, 30)
    close(fn(x), torch.softmax(x, -1), x.dtype)
    assert not fn.lowered


def test_cpu_calls_use_the_default_config(prog):
    x, y = rand(37, 70), rand(70, 45)
    assert prog.matmul.config(x, y) == prog.matmul.space(x, y).default()
    close(prog.matmul(x, y), x @ y, x.dtype)
    prog.matmul.pin(dict(block_tm=16, block_tn=16, block_tk=16, num_warps=2))
    try:
        assert prog.matmul.config(x, y)["block_tm"] == 16
        close(prog.matmul(x, y), x @ y, x.dtype)
    finally:
        prog.matmul.pin(None)


def test_tunable_parameters_join_the_config():
    src = """\
tile scaled(x, FACTOR: tunable = [2, 4]):
    out = empty_like(x)
    for t in tiles(x.shape[0]):
        out[t] = x[t] * FACTOR
    return out
"""
    fn = deuteron.compile(src, "tunable.nk").scaled
    x = rand(100)
    space = fn.space(x)
    assert space.choices["FACTOR"] == [2, 4] and space.default()["FACTOR"] == 2
    close(fn(x, eager=True), x * 2, x.dtype)
    text = fn.source(x, config={**space.default(), "FACTOR": 4})
    assert "FACTOR: constexpr" in text
    close(fn(x, config={**space.default(), "FACTOR": 4}), x * 4, x.dtype)


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_command_prints_the_kernel(capsys):
    rc, out, err = run(capsys, TILES, "-k", "matmul", "--sig", "x=f16[256,128], y=f16[128,64]",
                       "--config", '{"block_tm": 32}')
    assert rc == 0, err
    assert "kernel matmul(" in out and '"block_tm": 32' in out and "mask=" not in out


def test_command_emits_later_stages(capsys):
    rc, out, err = run(capsys, TILES, "-k", "layernorm", "--sig", "x=f32[64,100]", "--sig", "w=f32[100], b=f32[100], eps=1e-5",
                       "--emit", "cuda")
    assert rc == 0, err
    assert "__global__" in out


def test_command_errors(capsys):
    rc, out, err = run(capsys, TILES, "--sig", "x=f32[4]")
    assert rc == 1 and "pick a tile program" in err and "softmax" in err
    rc, out, err = run(capsys, TILES, "-k", "softmax", "--sig", "x=f32[4")
    assert rc == 2 and "NAME=DTYPE[SIZES]" in err


STMTS = """\
def sq(v):
    return v * v

def norm2(v):
    return sq(v) + 1.0

tile stmts(x, y, bias, flag, steps, MODE: constexpr = 1):
    out = empty([x.shape[0], y.shape[1]], f32)
    for tm, tn in tiles(x.shape[0], y.shape[1]):
        acc = zeros([tm, tn], f32)
        for tk in tiles(x.shape[1]):
            acc = dot(x[tm, tk], y[tk, tn], acc)
        extra = zeros([tm, tn], f32)
        for i in range(0, steps):
            extra += 0.5
        if flag:
            pass
            acc = acc + extra
        else:
            acc = acc - extra
        if MODE == 1:
            acc = acc * 2.0
        out[tm, tn] = norm2(acc) + bias[None, tn]
    return out
"""


@pytest.mark.parametrize("flag", [True, False])
def test_kernel_statements_and_helpers_of_helpers(flag):
    fn = deuteron.compile(STMTS, "stmts.nk").stmts
    x, y, b = rand(37, 40), rand(40, 45), rand(45)
    config = dict(block_tm=16, block_tn=32, block_tk=16)
    want = F.linear(x, y.t()).add(0.5 * 3 if flag else -0.5 * 3).mul(2).pow(2).add(1) + b
    close(fn(x, y, b, flag, 3, eager=True), want, x.dtype)
    close(fn(x, y, b, flag, 3, config=config), want, x.dtype)
    text = fn.source(x, y, b, flag, 3, config=config)
    assert "def sq(v):" in text and "def norm2(v):" in text  # a helper's helper is copied too
    assert f"if {flag}:" in text and "for i in range(0, steps):" in text and "bias + tn[None, :]" in text


LANG_ERRORS = """\
tile early(x):
    out = empty_like(x)
    for t in tiles(x.shape[0]):
        return out
    return out

tile unknown(x):
    return nope

tile attr(x):
    return x.nope

tile badcall(x):
    return exp(x, x, x)
"""


@pytest.mark.parametrize("name,eager,message", [
    ("early", False, "`return` belongs to the host code"), ("early", True, "`return` belongs to the host code"),
    ("unknown", True, "unknown name 'nope'"), ("attr", True, "no attribute 'nope'"),
    ("badcall", True, r"exp\(\): .* positional arguments"),
])
def test_errors_of_the_host_code_and_the_oracle(name, eager, message):
    fn = getattr(deuteron.compile(LANG_ERRORS, "errs.nk"), name)
    with pytest.raises(NkError, match=message):
        fn(rand(100), eager=eager, config=dict(block_t=32))
    with pytest.raises(AttributeError, match="no tile program 'missing'"):
        deuteron.compile(LANG_ERRORS, "errs.nk").missing
    assert repr(fn) == f"<deuteron tile program {name} from errs.nk>"


def test_short_circuits_and_floor_division():
    fn = deuteron.compile("""\
tile halve(x, a, b):
    out = empty_like(x)
    for t in tiles(x.shape[0]):
        if a > 0 and b > 0:
            out[t] = x[t] // 0.5
        else:
            out[t] = x[t]
    return out
""", "halve.nk").halve
    x = rand(100) * 4
    for a, b in ((1, 2), (0, 2)):
        want = torch.floor(x / 0.5) if a and b else x
        close(fn(x, a, b, eager=True), want, x.dtype)
        close(fn(x, a, b, config=dict(block_t=32)), want, x.dtype)
