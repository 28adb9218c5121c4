"""WGSL kernels: each declares its interface once; the shader header and the parameter packing follow.

A kernel family lives in one ``.wgsl`` file under ``shaders/`` that holds only its code. Its
interface is declared once, in Python next to the code that launches it (:class:`Kernel`): the
storage buffers (name, access), the parameter block (name and WGSL type of each field) and the
WGSL ``override`` constants (the workgroup size, tile sizes). From that declaration come the
shader header (``enable f16;`` when f16 is used, the buffer bindings, ``struct Params`` and its
uniform binding, the ``override`` declarations), the bind group layout, the bytes of each call's
parameters (:meth:`Params.pack`) and the ``constants=`` of the pipeline. A file's ``{{NAME}}``
placeholders take per-specialisation code (an op's expression, a loop body). Parameters travel
through a dynamic offset into the device's parameter arena, so one cached bind group serves every
call with the same buffers. ``WGPAR_DUMP_WGSL=dir`` writes every shader built (``Device``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

WORKGROUP = 256  # threads per workgroup of the 1-D kernels: their override constant WG
MAX_DIMS = 8
PARAM_SLOT = 256  # bytes per dispatch in the arena; a multiple of every uniform offset alignment
# Most loop iterations one shader invocation may run. lavapipe (llvmpipe) silently leaves its loops
# once an invocation has run 65535 iterations (nested loops counted together), so kernels whose
# loops grow with the data (reductions, softmax, matmul's K) split the work on the host to stay
# below this, with room to spare.
MAX_LOOP = 32768


@functools.cache
def _shader_dir() -> Path:
    shipped = resources.files("wgpar") / "shaders"
    if shipped.is_dir():  # installed wheel: shaders/ is force-included into the package
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "shaders"  # source checkout


@functools.cache
def load_source(family: str) -> str:
    path = _shader_dir() / f"{family}.wgsl"
    try:
        return path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"wgpar shader {family!r} not found at {path}") from None


# -- the parameter block --------------------------------------------------------------------------
# WGSL type -> (struct format of its words, words, alignment in words)
_SCALARS = {"u32": "I", "i32": "i", "f32": "f"}
_ARRAY = re.compile(r"array<vec4<(u32|i32|f32)>,\s*(\d+)>")
_VEC4 = re.compile(r"vec4<(u32|i32|f32)>")


def _layout(wgsl_type: str) -> tuple[str, int, int]:
    if wgsl_type in _SCALARS:
        return _SCALARS[wgsl_type], 1, 1
    m = _VEC4.fullmatch(wgsl_type)
    if m:
        return _SCALARS[m.group(1)], 4, 4
    m = _ARRAY.fullmatch(wgsl_type)
    if m:
        return _SCALARS[m.group(1)], 4 * int(m.group(2)), 4
    raise ValueError(f"parameter type {wgsl_type!r}: use u32, i32, f32, vec4<T> or array<vec4<T>, N>")


def _split_decl(text: str) -> list[tuple[str, str]]:
    """``"rows: u32, off: vec4<u32>"`` -> [("rows", "u32"), ("off", "vec4<u32>")] (commas inside <> kept)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            item = text[start:i].strip()
            start = i + 1
            if item:
                name, _, typ = item.partition(":")
                out.append((name.strip(), typ.strip()))
    return out


class Params:
    """A kernel's parameter block, declared once as WGSL fields: ``Params("rows: u32, scale: f32")``.

    ``wgsl()`` is the ``struct Params`` (vec4 and array fields aligned to 16 bytes, the size padded
    to 16); ``pack(**values)`` gives the bytes of one call, each field by name (a vector field takes
    a sequence of its words). ``struct`` packs the flat words in declaration order, padding
    implied: for the hottest callers, which pre-flatten their words.
    """

    def __init__(self, decl: str) -> None:
        self.decl = decl
        self.fields = tuple(_split_decl(decl))
        self.offsets: dict[str, int] = {}  # field -> its byte offset in the block
        fmt, self._words, lines, used = "<", [], [], 0
        for name, typ in self.fields:
            code, n, align = _layout(typ)
            pad = -used % align
            if pad:
                fmt += f"{4 * pad}x"
                lines += [f"  _pad{used + k}: u32," for k in range(pad)]
                used += pad
            fmt += f"{n}{code}" if n > 1 else code
            lines.append(f"  {name}: {typ},")
            self.offsets[name] = 4 * used
            self._words.append((name, n, code))
            used += n
        tail = -used % 4
        fmt += f"{4 * tail}x" if tail else ""
        lines += [f"  _pad{used + k}: u32," for k in range(tail)]
        self.size = 4 * (used + tail)
        if self.size > PARAM_SLOT:
            raise ValueError(f"kernel parameters {decl!r} take {self.size} bytes, more than the {PARAM_SLOT}-byte slot")
        self.struct = struct.Struct(fmt)
        self._names = tuple(name for name, _ in self.fields)
        self._scalars_only = all(n == 1 for _, n, _ in self._words)  # flat() is then one lookup per field
        self._bits = struct.Struct(fmt.replace("i", "I").replace("f", "I"))
        self._body = "\n".join(lines)

    def wgsl(self) -> str:
        return f"struct Params {{\n{self._body}\n}}"

    def flat(self, values: Mapping[str, object]) -> list:
        """The words of ``values`` in declaration order (every field must be given, no other)."""
        if self._scalars_only and len(values) == len(self._names):
            try:
                return [values[name] for name in self._names]
            except KeyError:
                pass  # an unknown name in place of a missing one: the loop below names the missing one
        words: list = []
        for name, n, _ in self._words:
            try:
                v = values[name]
            except KeyError:
                raise TypeError(f"kernel parameters {self.decl!r}: no value for {name!r}") from None
            if n == 1:
                words.append(v)
            elif len(v) != n:
                raise ValueError(f"kernel parameter {name!r} takes {n} words, got {len(v)}")
            else:
                words.extend(v)
        if len(values) != len(self._words):
            extra = sorted(set(values) - {w[0] for w in self._words})
            raise TypeError(f"kernel parameters {self.decl!r}: unknown {extra}")
        return words

    def pack(self, **values) -> bytes:
        return self.pack_flat(self.flat(values))

    def pack_flat(self, words: Sequence) -> bytes:
        try:
            return self.struct.pack(*words)
        except (struct.error, OverflowError):  # a negative u32, a float beyond f32's range, ...
            bits, k = [], 0
            for _, n, code in self._words:
                for v in words[k:k + n]:
                    bits.append(f32_bits(float(v)) if code == "f" else int(v) & 0xFFFFFFFF)
                k += n
            return self._bits.pack(*bits)

    def __eq__(self, other) -> bool:
        return isinstance(other, Params) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(self.fields)

    def __repr__(self) -> str:
        return f"Params({self.decl!r})"


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def f32_bits(x: float) -> int:
    """The bits of ``x`` rounded to float32 (as NumPy's cast rounds: beyond the range, an infinity)."""
    try:
        return _U32.unpack(_F32.pack(x))[0]
    except OverflowError:  # beyond float32's range: round to inf as a cast would
        with np.errstate(over="ignore"):
            return int(np.array(x, dtype=np.float32).view(np.uint32))


# -- kernels --------------------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_SPECS_MAX = 1024  # specialisations remembered per kernel
_F16 = re.compile(r"\bf16\b")
_COMMENT = re.compile(r"//[^\n]*")
# A loop the source asks to have written out: `for (var i = 0u; i < N; i = i + 1u) {  // @unroll`, N an
# integer literal or a `const N: u32 = <n>u;` of the source. naga's SPIR-V output guards every loop with a
# 64-bit iteration counter in function-local variables (gfx-rs/wgpu#7080), and the NVIDIA compiler then
# left 16-step loops rolled (the matmul gained 9-12 points of torch's rate written out): straight-line
# copies with constant indices need no driver unrolling.
_UNROLL = re.compile(r"for \(var (\w+) = 0u; \1 < (\w+); \1 = \1 \+ 1u\) \{[ \t]*// @unroll[^\n]*\n")


def unroll_marked(code: str) -> str:
    """``code`` with every ``// @unroll`` loop (see _UNROLL) replaced by one ``{ ... }`` block per step, the
    loop variable a constant in each; inner marked loops first. Raises ValueError on a bound that is no
    literal or const, a loop without its closing brace, or a continue / break in a marked loop's body."""
    while True:
        found = None
        for m in _UNROLL.finditer(code):
            found = m  # the last marked loop starts after every enclosing one: no marked loop inside it
        if found is None:
            return code
        var, bound = found[1], found[2]
        value, seen = bound[:-1] if bound[:-1].isdigit() and bound[-1] == "u" else bound, set()
        while not value.isdigit():  # a const, maybe defined as another const
            c = re.search(rf"\bconst {value}\s*:\s*u32\s*=\s*(\w+?)u?\s*;", code)
            if c is None or value in seen:
                raise ValueError(f"@unroll loop over {var} < {bound}: {bound} is no integer literal or u32 const")
            seen.add(value)
            value = c[1]
        n = int(value)
        depth, end = 1, found.end()
        while depth:
            if end >= len(code):
                raise ValueError(f"@unroll loop over {var}: no closing brace")
            if code.startswith("//", end):  # a brace in a comment is no brace
                end = code.find("\n", end) % (len(code) + 1)
                continue
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            end += 1
        body = code[found.end():end - 1]
        if re.search(r"\b(continue|break)\b", _COMMENT.sub("", body)):  # would leave the enclosing loop instead
            raise ValueError(f"@unroll loop over {var}: its body has a continue or break")
        word = re.compile(rf"\b{var}\b")
        copies = "".join(f"{{\n{word.sub(f'{i}u', body)}}}\n" for i in range(n))
        code = code[:found.start()] + copies + code[end:]


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """One specialised kernel: its family file, buffers, parameter block, fills and constants.

    ``buffers`` lists the storage bindings in order as (name, access, element type), access
    ``"r"`` (read-only) or ``"w"`` (read-write); the parameter uniform ``p`` is the binding after
    them. ``constants`` are the WGSL ``override`` values the pipeline is built with.
    """

    family: str
    buffers: tuple[tuple[str, str, str], ...]
    params: Params
    fills: tuple[tuple[str, str], ...] = ()
    constants: tuple[tuple[str, int], ...] = ()
    _hash: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        # Hashed on every dispatch (the device's pipeline cache): once here, not field by field there.
        object.__setattr__(self, "_hash", hash((self.family, self.buffers, self.params, self.fills, self.constants)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, KernelSpec) and self._hash == other._hash and
                                 (self.family, self.buffers, self.params, self.fills, self.constants) ==
                                 (other.family, other.buffers, other.params, other.fills, other.constants))

    @property
    def access(self) -> tuple[str, ...]:
        return tuple(b[1] for b in self.buffers)

    @property
    def label(self) -> str:
        tag = ",".join([f"{k}={v}" for k, v in self.fills if len(v) < 24] +
                       [f"{n}:{t}" for n, _, t in self.buffers])
        return f"wgpar:{self.family}[{tag}]"

    def header(self) -> str:
        """The declarations generated from the interface: bindings, Params, overrides."""
        lines = [f"@group(0) @binding({i}) var<storage, {'read_write' if a == 'w' else 'read'}> {n}: array<{t}>;"
                 for i, (n, a, t) in enumerate(self.buffers)]
        lines += [self.params.wgsl(), f"@group(0) @binding({len(self.buffers)}) var<uniform> p: Params;"]
        lines += [f"override {k}: u32;" for k, _ in self.constants]
        return "\n".join(lines)

    def source(self) -> str:
        fills = dict(self.fills)

        def sub(m: re.Match[str]) -> str:
            try:
                return fills[m.group(1)]
            except KeyError:
                raise KeyError(f"{self.label}: no fill for {{{{{m.group(1)}}}}}") from None

        code = unroll_marked(self.header() + "\n\n" + _PLACEHOLDER.sub(sub, load_source(self.family)))
        uses_f16 = _F16.search(_COMMENT.sub("", code))  # a comment mentioning f16 must not enable it
        return ("enable f16;\n" if uses_f16 else "") + code


@dataclass(frozen=True)
class Kernel:
    """A kernel family's interface, declared once next to the code that launches it.

    Arguments:
        family: the shader file, ``shaders/<family>.wgsl``.
        buffers: the storage bindings in order, ``"out: w, x: r"`` (w: read-write, r: read-only).
        params: the parameter block's fields, ``"rows: u32, scale: f32"`` (see :class:`Params`).
        constants: the ``override`` constants and their values (default: the workgroup size WG).
    """

    family: str
    buffers: str
    params: str
    constants: tuple[tuple[str, int], ...] = (("WG", WORKGROUP),)

    @functools.cached_property
    def _buffers(self) -> tuple[tuple[str, str], ...]:
        return tuple((n, a) for n, a in _split_decl(self.buffers))

    @functools.cached_property
    def param_block(self) -> Params:
        return Params(self.params)

    @functools.cached_property
    def _specs(self) -> dict:
        return {}

    def spec(self, types: Sequence[str], without: Sequence[str] = (), constants: Mapping[str, int] | None = None,
             **fills: str | int) -> KernelSpec:
        """Specialise: the element type of each buffer (in order, those in ``without`` left out, so
        their bindings do not exist), code for the file's placeholders, and constants that differ
        from the declared ones. Made once per distinct call (ops call this per dispatch)."""
        key = (types if type(types) is tuple else tuple(types), without if type(without) is tuple else tuple(without),
               tuple(constants.items()) if constants else (), tuple(fills.items()) if fills else ())
        hit = self._specs.get(key)
        if hit is None:
            if len(self._specs) >= _SPECS_MAX:
                self._specs.clear()
            hit = self._specs[key] = self._make(types, without, constants, fills)
        return hit

    def _make(self, types, without, constants, fills) -> KernelSpec:
        bufs = [b for b in self._buffers if b[0] not in without]
        if len(types) != len(bufs):
            raise ValueError(f"kernel {self.family}: {len(types)} element types for buffers {[b[0] for b in bufs]}")
        consts = dict(self.constants)
        consts.update(constants or {})
        return KernelSpec(self.family, tuple((n, a, t) for (n, a), t in zip(bufs, types)), self.param_block,
                          tuple(sorted((k, str(v)) for k, v in fills.items())), tuple(sorted(consts.items())))

    def pack(self, **values) -> bytes:
        block = self.param_block
        return block.pack_flat(block.flat(values))


def dump_wgsl(directory: str, kspec: KernelSpec, source: str) -> Path:
    """Write ``source`` to ``directory/<family>-<hash of source and constants>.wgsl`` (WGPAR_DUMP_WGSL).

    The file starts with comments naming the kernel and the override constants it is built with.
    """
    consts = ", ".join(f"{k}={v}" for k, v in kspec.constants)
    digest = hashlib.sha1(f"{source}\n{consts}".encode()).hexdigest()[:12]
    path = Path(directory) / f"{kspec.family}-{digest}.wgsl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(kspec)}.tmp")  # several devices may build one kernel at once
        tmp.write_text(f"// {kspec.label}\n// override constants: {consts or 'none'}\n{source}")
        tmp.replace(path)
    return path


def dims(values, fill: int = 0) -> list[int]:
    """Pad a per-dimension list to MAX_DIMS words (two vec4s in WGSL)."""
    values = list(values)
    if len(values) > MAX_DIMS:
        raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported (got {len(values)})")
    return values + [fill] * (MAX_DIMS - len(values))


def grid(n_groups: int, max_per_dim: int) -> tuple[int, int]:
    """Split a 1-D workgroup count into (x, y) within the per-dimension limit (``Device.max_workgroups``).

    Kernels recover the flat index as ``wid.x + wid.y * nwg.x`` and skip the overshoot of x * y.
    """
    if n_groups <= max_per_dim:
        return max(n_groups, 1), 1
    y = -(-n_groups // max_per_dim)
    x = -(-n_groups // y)
    return x, y
