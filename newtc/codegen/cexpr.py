"""C types and the C expression of each elementwise op, one register at a time."""
from __future__ import annotations

from ..types import FP8, DType, Ptr, bf16, f16, f32, f64, i32, u32

CTYPES = {"bool": "bool", "i8": "signed char", "i16": "short", "i32": "int", "i64": "long long",
          "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned", "u64": "unsigned long long",
          "f16": "nk_f16", "bf16": "nk_bf16", "f32": "float", "f64": "double", "f8e4m3": "nk_f8e4m3",
          "f8e5m2": "nk_f8e5m2"}
HALF = (f16, bf16, *FP8)  # storage types: math on them runs in f32
MATH_F32 = {"exp": "nk_exp", "exp2": "nk_exp2", "log": "nk_log", "log2": "nk_log2", "sqrt": "sqrtf", "rsqrt": "rsqrtf",
            "sin": "sinf", "cos": "cosf", "tanh": "tanhf", "erf": "erff", "floor": "floorf", "ceil": "ceilf",
            "abs": "fabsf"}
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "shl": "<<", "shr": ">>", "lt": "<", "le": "<=",
         "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def ctype(dt) -> str:
    if isinstance(dt, Ptr):
        return CTYPES[dt.elem.name] + "*"
    return CTYPES[dt.name]


def accumulator(dt: DType) -> DType:
    """The dtype a reduction accumulates in: f32 for 16-bit floats, 32 bits for narrow integers (as C promotes)."""
    if dt in HALF:
        return f32
    if dt.kind == "b" or (dt.is_int and dt.bits < 32):
        return u32 if dt.kind == "u" else i32
    return dt


def widen(x: str, dt) -> str:
    return f"nk_tof({x})" if dt in HALF else x


def narrow(x: str, dt) -> str:
    """Round a compute-type expression back to dt."""
    if dt in HALF:
        return f"nk_to_{dt.name}({x})"
    if isinstance(dt, DType) and (dt.kind == "b" or dt.bits < 32):
        return f"({ctype(dt)})({x})"
    return x


def literal(value, dt) -> str:
    if dt.kind == "b":
        return "true" if value else "false"
    if dt.is_float:
        if value != value:
            text = "__int_as_float(0x7fc00000)" if dt != f64 else "__longlong_as_double(0x7ff8000000000000ll)"
        elif value in (float("inf"), float("-inf")):
            sign = "-" if value < 0 else ""
            text = f"{sign}__int_as_float(0x7f800000)" if dt != f64 else f"{sign}__longlong_as_double(0x7ff0000000000000ll)"
        else:
            text = repr(float(value)) + ("" if dt == f64 else "f")
        return narrow(text, dt) if dt in HALF else text
    suffix = {"i64": "ll", "u64": "ull", "u32": "u"}.get(dt.name, "")
    return f"({ctype(dt)}){int(value)}{suffix}" if dt.bits < 32 else f"{int(value)}{suffix}"


def cast(x: str, src, dst) -> str:
    if src == dst:
        return x
    if dst.kind == "b":
        return f"({widen(x, src)} != 0)"
    if dst in HALF:
        return narrow(f"(float)({widen(x, src)})", dst)
    return f"({ctype(dst)})({widen(x, src)})"


F64 = {"exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2"}


def math_fn(kind: str, dt: DType) -> str:
    name = MATH_F32[kind]
    return F64.get(kind, name[:-1]) if dt == f64 else name


# libm functions whose CUDA names do not follow NAMEf / NAME: (32-bit, 64-bit)
LIBM_C = {"div_rn": ("__fdiv_rn", "__ddiv_rn"), "umulhi": ("__umulhi", "__umul64hi")}


def libm(fn: str, dt: DType, ws: list[str]) -> str:
    if fn == "umulhi":  # unsigned, whatever the operands' signedness (as Triton's)
        u = "unsigned" if dt.bits == 32 else "unsigned long long"
        return f"({ctype(dt)}){LIBM_C[fn][dt.bits == 64]}(({u}){ws[0]}, ({u}){ws[1]})"
    name = LIBM_C[fn][dt == f64] if fn in LIBM_C else fn + ("" if dt == f64 else "f")
    return f"{name}({', '.join(ws)})"


def cstring(s: str) -> str:
    """A C string literal of s's UTF-8 bytes: octal escapes outside printable ASCII, quotes, backslashes and '?'."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}" for b in s.encode()) + '"'


def opaque(x: str, dt) -> str:
    """x as a value ptxas cannot see a negation in, where an integer min, max or where of 32 bits or less chooses it
    (prelude's nk_opaque, an identity unless compiler.compile_cuda asks for it)."""
    return f"nk_opaque({x})" if isinstance(dt, DType) and dt.is_int and dt.bits <= 32 else x


def elementwise(kind: str, dts: list, out, xs: list[str], fn: str | None = None) -> str:
    """C expression for one register of an elementwise op; dts are the operand dtypes (fn: a libm op's function)."""
    dt = dts[0]
    if kind == "hint":  # a promise to the compiler, no code
        return xs[0]
    if kind == "cast":
        return cast(xs[0], dt, out)
    if kind == "bitcast":
        return f"nk_bitcast<{ctype(out)}>({xs[0]})"
    if kind == "where":
        e = f"({xs[0]} ? {opaque(xs[1], out)} : {opaque(xs[2], out)})"
        return narrow(e, out) if isinstance(out, DType) and out.is_int else e  # (nk_opaque widens narrow ones)
    if kind == "ptradd":
        return f"({xs[0]} + {xs[1]})"
    ws = [widen(x, d) for x, d in zip(xs, dts)]
    flt = isinstance(dt, DType) and dt.is_float
    if kind == "div" and dt != f64:
        e = f"nk_div({ws[0]}, {ws[1]})"
    elif kind in INFIX:
        e = f"({ws[0]} {INFIX[kind]} {ws[1]})"
    elif kind in ("and", "or", "xor"):
        op = {"and": "&", "or": "|", "xor": "^"}[kind] if dt.kind != "b" else {"and": "&&", "or": "||", "xor": "!="}[kind]
        e = f"({ws[0]} {op} {ws[1]})"
    elif kind == "floordiv":
        e = f"{math_fn('floor', dt)}({ws[0]} / {ws[1]})" if flt else f"nk_idiv<{ctype(dt)}>({ws[0]}, {ws[1]})"
    elif kind == "mod":
        e = f"{'fmod' if dt == f64 else 'fmodf'}({ws[0]}, {ws[1]})" if flt else f"nk_imod<{ctype(dt)}>({ws[0]}, {ws[1]})"
    elif kind in ("minimum", "maximum"):
        if flt:
            e = f"{'f' + kind[:3] + ('' if dt == f64 else 'f')}({ws[0]}, {ws[1]})"
        else:
            a, b = (opaque(w, dt) for w in ws)
            e = f"({a} {'<' if kind == 'minimum' else '>'} {b} ? {a} : {b})"
    elif kind == "neg":
        e = f"(-{ws[0]})"
    elif kind == "not":
        e = f"(!{ws[0]})" if dt.kind == "b" else f"(~{ws[0]})"
    elif kind == "abs" and not flt:
        e = f"({ws[0]} < 0 ? -{ws[0]} : {ws[0]})"
    elif kind == "sigmoid":
        one = "1.0" if dt == f64 else "1.0f"
        e = f"({one} / ({one} + {math_fn('exp', dt)}(-{ws[0]})))"
    elif kind == "libm":
        e = libm(fn, dt, ws)
    elif kind == "fma":
        e = f"{'fma' if dt == f64 else 'fmaf'}({ws[0]}, {ws[1]}, {ws[2]})"
    else:
        e = f"{math_fn(kind, dt)}({ws[0]})"
    return narrow(e, out) if out.kind != "b" else e
