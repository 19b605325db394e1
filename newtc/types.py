"""dtypes, pointer types, value types and the promotion rules."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    kind: str  # 'b' bool, 'i' signed, 'u' unsigned, 'f' float
    bits: int

    def __repr__(self) -> str:
        return self.name

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)


@dataclass(frozen=True)
class Ptr:
    elem: DType

    @property
    def name(self) -> str:
        return f"*{self.elem.name}"

    def __repr__(self) -> str:
        return self.name

    kind = "p"
    bits = 64
    itemsize = 8
    is_float = False
    is_int = False


bool_ = DType("bool", "b", 8)
i8, i16, i32, i64 = (DType(f"i{b}", "i", b) for b in (8, 16, 32, 64))
u8, u16, u32, u64 = (DType(f"u{b}", "u", b) for b in (8, 16, 32, 64))
f16, bf16, f32, f64 = DType("f16", "f", 16), DType("bf16", "f", 16), DType("f32", "f", 32), DType("f64", "f", 64)
f8e4m3, f8e5m2 = DType("f8e4m3", "f", 8), DType("f8e5m2", "f", 8)  # torch's float8_e4m3fn and float8_e5m2
FP8 = (f8e4m3, f8e5m2)
DTYPES = {d.name: d for d in (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, f8e4m3, f8e5m2)}


@dataclass(frozen=True)
class Type:
    """The type of an IR value: a scalar when shape == (), else a block."""

    shape: tuple[int, ...]
    dtype: DType | Ptr

    @property
    def is_block(self) -> bool:
        return bool(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def with_dtype(self, dtype) -> "Type":
        return Type(self.shape, dtype)

    def __str__(self) -> str:
        if not self.shape:
            return str(self.dtype)
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


def parse_type(text: str) -> DType | Ptr | None:
    """`f32` or `*f16` as written in the language (and in `newtc --sig`)."""
    text = text.strip()
    if text.startswith("*"):
        inner = DTYPES.get(text[1:].strip())
        return Ptr(inner) if inner else None
    return DTYPES.get(text)


def promote(a: DType, b: DType) -> DType:
    """The common dtype of two operands (Triton's rules, without the weak-literal case)."""
    if a == b:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            if {a, b} == {f16, bf16} or bf16 in (a, b) and (a in FP8 or b in FP8):
                return f32
            if a in FP8 and b in FP8:  # two different fp8 formats meet in f16
                return f16
            return a if a.bits > b.bits else b
        return a if a.is_float else b
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if a.kind == "u" else b  # same width, one unsigned: unsigned wins, as in C


def torch_dtype_name(t) -> str:
    """Map a torch dtype to ours ('torch.float32' -> 'f32')."""
    names = {
        "torch.bool": "bool", "torch.int8": "i8", "torch.int16": "i16", "torch.int32": "i32",
        "torch.int64": "i64", "torch.uint8": "u8", "torch.uint16": "u16", "torch.uint32": "u32",
        "torch.uint64": "u64", "torch.float16": "f16", "torch.bfloat16": "bf16",
        "torch.float32": "f32", "torch.float64": "f64", "torch.float8_e4m3fn": "f8e4m3", "torch.float8_e5m2": "f8e5m2",
    }
    return names.get(str(t), "")
