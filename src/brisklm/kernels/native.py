"""Builds and loads brisklm's native CPU kernels (``cpu_forward.c``) with the system C compiler.

The library is compiled once per source, compiler and machine into a cache folder
(``$BRISKLM_CACHE_DIR``, else ``$XDG_CACHE_HOME/brisklm``, else ``~/.cache/brisklm``) and loaded
with ctypes: no torch headers; a build takes ~8 s on two cores (once per machine and compiler: a
model loaded with ``show_progress`` says so on stderr while it builds). Everything that uses it
has a plain-torch path, taken when the library is unavailable: no C compiler, a failed build or
probe, or ``BRISKLM_NATIVE_KERNELS=0`` in the environment. The reason is logged once.

The library is built with ``-fopenmp`` and so links ``libgomp.so.1``; torch's wheel has already
loaded its own copy under that name, which the dynamic linker reuses, so torch's ops and these
kernels share one OpenMP thread pool (two pools on two cores make every parallel kernel wait for
sleeping threads: see ``brisklm.engine.scratch_thread``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from brisklm.engine.scratch_thread import call_in_scratch_thread
from brisklm.kernels import huge_pages

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_forward.c")
ENV_SWITCH = "BRISKLM_NATIVE_KERNELS"
# Tokens one forward call may carry (MAX_TOKENS in the C source).
MAX_TOKENS = 512


def attention_space(max_seq_len: int, head_dim: int) -> int:
    """Floats of attention scratch one thread of the forward pass uses: the library's
    ``brisk_attention_floats`` (each of up to 16 queries' scores over the cache, then
    head_dim + 16 more)."""
    lib = library()
    if lib is None:
        raise RuntimeError("the native kernels are not available")
    return int(lib.brisk_attention_floats(max_seq_len, head_dim))


# -mtune=generic: gcc 12 tunes unknown AMD CPUs as znver3, which (measured with an earlier
# row-dot product tile) reloaded a tile's weight vectors for every token: 1.5x slower.
_FLAGS = [
    "-O3",
    "-march=native",
    "-mtune=generic",
    "-ffp-contract=fast",
    "-fopenmp",
    "-shared",
    "-fPIC",
]

# Every pointer field is a plain address (c_void_p): assigning an int costs less than a cast.
_ptr = ctypes.c_void_p


class ForwardArgs(ctypes.Structure):
    """Mirror of ``brisk_forward_args`` in cpu_forward.c (field order and types must match)."""

    _fields_ = [
        *[
            (name, ctypes.c_int)
            for name in (
                "n_tokens",
                "n_layers",
                "hidden",
                "n_heads",
                "n_kv_heads",
                "head_dim",
                "inter",
                "vocab",
                "n_logits",
                "n_threads",
            )
        ],
        ("max_seq_len", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        *[
            (name, _ptr)
            for name in ("token_ids", "slots", "positions", "logit_tokens", "rope_rows")
        ],
        ("embed", _ptr),
        ("cos", _ptr),
        ("sin", _ptr),
        *[
            (name, _ptr)
            for name in ("hidden_states", "xn", "qkv", "attn", "gate_up", "act", "scores", "normed")
        ],
        ("logits", _ptr),
        *[
            (name, _ptr)
            for name in (
                "in_norm",
                "qkv_w",
                "qkv_b",
                "o_w",
                "o_b",
                "post_norm",
                "gu_w",
                "gu_b",
                "down_w",
                "down_b",
                "k_cache",
                "v_cache",
            )
        ],
        ("window", _ptr),
        ("final_norm", _ptr),
        ("head_w", _ptr),
        ("weight_type", ctypes.c_int),
        ("cache_type", ctypes.c_int),
        ("argmax_cols", ctypes.c_int),
        ("argmax", _ptr),
        ("layer_types", _ptr),
        ("head_type", ctypes.c_int),
        ("n_steps", ctypes.c_int),
        ("step_tokens", _ptr),
        ("step_uniforms", _ptr),
        ("sampled_rows", _ptr),
        ("temperature", _ptr),
        ("top_k", _ptr),
        ("top_p", _ptr),
        ("min_p", _ptr),
        ("steps_done", _ptr),
        ("q_norm", _ptr),
        ("k_norm", _ptr),
        ("n_bias", ctypes.c_int64),
        ("bias_rows", _ptr),
        ("bias_ids", _ptr),
        ("bias_values", _ptr),
        ("repetition", _ptr),
        ("seen", _ptr),
        ("frequency", _ptr),
        ("presence", _ptr),
        ("counts", _ptr),
        ("step_logits", _ptr),
    ]


class Q4Weight(ctypes.Structure):
    """Mirror of ``q4_weight`` in cpu_forward.c: an int4 product's packed weight."""

    _fields_ = [
        ("codes", _ptr),
        ("zs", _ptr),
        ("group_at", _ptr),
        ("zs_panel", ctypes.c_int64),
    ]


# Element types of packed weights and KV caches and their codes on the C side (WT_F32, WT_BF16,
# WT_F16): half-precision elements are widened to float32 as they are read (exactly), and every
# product computes in float32.
WEIGHT_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
HALF_TYPES = (torch.bfloat16, torch.float16)
WT_INT4 = 3  # GPTQ int4 products (Int4Weight): weights dequantized as they are read
# The C function of each weight type's product on its own.
_PRODUCTS = {
    torch.float32: "brisk_linear_f32",
    torch.bfloat16: "brisk_linear_bf16",
    torch.float16: "brisk_linear_f16",
}
_ALLOWED = "float32, bfloat16 or float16"


def enabled_by_environment() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def _cache_dir() -> Path:
    root = os.environ.get("BRISKLM_CACHE_DIR")
    if root:
        return Path(root) / "native"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "brisklm" / "native"


def _compiler() -> str | None:
    """The C compiler command: ``$CC`` (a program, or a command line such as ``ccache gcc``),
    else the first of cc, gcc and clang on the PATH."""
    chosen = os.environ.get("CC", "").strip()
    if chosen:
        words = _command(chosen)
        if words and shutil.which(words[0]):
            return chosen
        logger.warning("$CC=%r is not a command brisklm can run: trying cc, gcc, clang", chosen)
    return next((name for name in ("cc", "gcc", "clang") if shutil.which(name)), None)


def _command(compiler: str) -> list[str]:
    """A compiler setting as the words to run: one program (a path may hold spaces), else the
    words of a shell-quoted command line; [] if it is neither."""
    if shutil.which(compiler):
        return [compiler]
    try:
        return shlex.split(compiler)
    except ValueError:  # unbalanced quotes
        return []


# Whether a build says so on stderr (``announcing_build``, in its thread).
_show_build = threading.local()


@contextlib.contextmanager
def announcing_build(on: bool = True) -> Iterator[None]:
    """While in it, a build of the kernels in this thread says so on stderr (``on``): the first
    load on a machine takes ~8 s more (``LLM.from_pretrained`` with ``show_progress``)."""
    before = getattr(_show_build, "on", False)
    _show_build.on = on
    try:
        yield
    finally:
        _show_build.on = before


def _build(compiler: str) -> Path:
    version = subprocess.run(
        [*_command(compiler), "--version"], capture_output=True, text=True, timeout=30
    ).stdout
    key = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), compiler, version, " ".join(_FLAGS), platform.machine()]
            + _cpu_flags()
        ).encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"brisk_cpu_forward_{key}.so"
    _make_private_folder(target.parent)
    _check_private(target.parent)
    if target.exists():
        return target
    if getattr(_show_build, "on", False):
        print(
            "brisklm: building the native CPU kernels (once per machine and compiler, ~8 s)",
            file=sys.stderr,
            flush=True,
        )
    # Build beside the target and rename: another process may be building the same file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        compile_library(compiler, SOURCE, built)
        os.replace(built, target)
    return target


def compile_library(
    compiler: str, source: Path, output: Path, extra_flags: tuple[str, ...] = ()
) -> None:
    """Compile a version of cpu_forward.c into a shared library with brisklm's flags and then
    ``extra_flags`` (also used by bench/native_kernel_ab.py, and by the tests to build the AVX2
    variant on an AVX-512 machine); RuntimeError with the compiler's message if it fails."""
    result = subprocess.run(
        [*_command(compiler), *_FLAGS, *extra_flags, str(source), "-o", str(output), "-lm"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:2000]}")


def _make_private_folder(folder: Path) -> None:
    """Create ``folder`` (and its missing parents) if it is not there, itself writable by this user
    only: a umask such as 002 (many distributions' default for users with their own group) made
    it group-writable, and ``_check_private`` then refused the folder brisklm had just made."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:  # another process made it first
        return
    os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask; chmod's is not


def _check_private(folder: Path) -> None:
    """Refuse a cache folder that another user could write: its libraries are loaded as code."""
    if not hasattr(os, "getuid"):
        return
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(
            f"cache folder {str(folder)!r} is not private to this user (owner or group/other "
            f"write permission): run `chmod go-w {shlex.quote(str(folder))}` if it is yours, or "
            "set BRISKLM_CACHE_DIR to a folder only you can write"
        )


def _cpu_flags() -> list[str]:
    # -march=native code is only valid on a CPU with the same features: key the cache on them.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return [line]
    except OSError:
        pass
    return [platform.processor()]


# Signatures of the library's functions: (argument types, result type). Each but the forward pass
# may be missing from an older source (native_kernel_ab.py builds those), and is then skipped.
_PTR, _I32, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
_PRODUCT_SIGNATURE = ([_PTR, _I32, _I32, _PTR, _PTR, _I32, _PTR, _I32], _I32)
_SIGNATURES = {
    "brisk_forward_f32": ([ctypes.POINTER(ForwardArgs)], _I32),
    "brisk_adjust_logits": ([ctypes.POINTER(ForwardArgs), _PTR], _I32),
    "brisk_forward_args_bytes": ([], _I64),
    "brisk_q4_weight_bytes": ([], _I64),
    "brisk_test_argmax": ([_PTR, _I64, _I32, _I64, _PTR, _I32], _I32),
    "brisk_apply_bitmask_f32": ([_PTR, _I64, _I64, _PTR, _I64, _PTR, _I64], None),
    "brisk_sample_rows": ([_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR], _I32),
    "brisk_rejection_rows": (
        [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR],
        None,
    ),
    "brisk_attention_floats": ([_I64, _I32], _I64),
    **{name: _PRODUCT_SIGNATURE for name in (*_PRODUCTS.values(), "brisk_linear_int4")},
}


def _declare(lib: ctypes.CDLL) -> None:
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(lib, name) if name == "brisk_forward_f32" else getattr(lib, name, None)
        if function is not None:
            function.argtypes = argtypes
            function.restype = restype


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (the reason logged once) where they cannot be used."""
    if not enabled_by_environment():
        logger.info("native CPU kernels disabled by %s", ENV_SWITCH)
        return None
    compiler = _compiler()
    if compiler is None:
        # A warning, not info: CPU decoding through torch's ops instead runs several times slower
        # (a slim container without gcc got that silently).
        logger.warning(
            "no C compiler found (cc, gcc, clang or $CC): native CPU kernels not used, torch ops "
            "run instead (several times slower on CPU); install one (e.g. gcc) to use them"
        )
        return None
    try:
        path = _build(compiler)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:  # a damaged file from an interrupted copy: build it again, once
            path.unlink(missing_ok=True)
            lib = ctypes.CDLL(str(_build(compiler)))
        _declare(lib)
        # In a thread of its own: the probe's parallel region would otherwise leave an OpenMP
        # pool on the caller's thread, and with the engine's own pool that makes libgomp put
        # idle workers to sleep (bench/native_kernel_ab.py's calls took 2.3 ms instead of 0.6 after
        # a native.available() on its main thread).
        call_in_scratch_thread(lambda: _probe(lib), name="brisklm-native-probe")
    except Exception as error:  # any failure means "not on this machine", never a crash
        logger.warning("native CPU kernels unavailable (%s): using torch ops", error)
        return None
    return lib


def available() -> bool:
    return library() is not None


def function(name: str) -> Any:
    """The kernels' C function ``name`` (declared), or None where they cannot be used."""
    lib = library()
    return getattr(lib, name, None) if lib is not None else None


PANEL = 32  # output rows per panel (NB in the C source)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The (out, in) float32, bfloat16 or float16 weight in the kernels' layout, in its own dtype:
    panels of 32 output rows, each stored k-major (a bfloat16 row's 32 outputs paired, in the order
    ``_BF16_ORDER``; float32 and float16 rows in order), the last one zero-padded; shape
    (ceil(out / 32), in, 32), contiguous. On CPU on huge pages where the machine gives them
    (``huge_pages``): every decode step streams these."""
    if weight.dtype not in WEIGHT_TYPES:
        raise ValueError(f"native.pack takes {_ALLOWED} weights, got {weight.dtype}")
    rows, k = weight.shape
    panels = -(-rows // PANEL)
    full = rows // PANEL
    out = huge_pages.empty((panels, k, PANEL), weight.dtype, weight.device)

    def put(first: int, grouped: torch.Tensor) -> None:
        """Panels (n, PANEL, in) into ``out`` from panel ``first`` on, in one strided copy."""
        if weight.dtype == torch.bfloat16:  # memory position 2j + h holds output 16h + j
            n = len(grouped)
            target = out[first : first + n].view(n, k, PANEL // 2, 2)
            target.copy_(grouped.view(n, 2, PANEL // 2, k).permute(0, 3, 2, 1))
        else:
            out[first : first + len(grouped)].copy_(grouped.transpose(1, 2))

    # Straight from the weight: a padded copy of the whole matrix (and for bfloat16 a reordered
    # one) held it three times at once (a 128k-token vocabulary's head: 750 MB for 250 MB).
    put(0, weight[: full * PANEL].reshape(full, PANEL, k))
    if full < panels:  # the last panel, zero-padded
        last = torch.zeros(1, PANEL, k, dtype=weight.dtype, device=weight.device)
        last[0, : rows - full * PANEL] = weight[full * PANEL :]
        put(full, last)
    return out


# A bfloat16 panel row's outputs in memory order: 0, 16, 1, 17, ..., 15, 31 (each 32-bit word
# holds output w and output w + 16: see cpu_forward.c's wrow), and back.
_BF16_ORDER = torch.arange(PANEL).view(2, PANEL // 2).t().reshape(-1)
_BF16_INVERSE = torch.argsort(_BF16_ORDER)


def unpack(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """The (rows, in) matrix of a weight made by ``pack`` (a copy)."""
    panels, k, _ = packed.shape
    if packed.dtype == torch.bfloat16:
        packed = packed[:, :, _BF16_INVERSE.to(packed.device)]
    return packed.transpose(1, 2).reshape(panels * PANEL, k)[:rows].contiguous()


def linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    rows: int,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors, 2-D x and ``packed = pack(weight)``
    of ``rows`` output rows, computed in float32 (a bfloat16 or float16 weight widened as it is
    read: the bits of the product over the same values stored in float32); each row's result
    independent of the other rows. Through ``lib`` (default: ``library()``, which must load)."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the native CPU kernels are not available")
    tensors = [x, packed] + ([bias] if bias is not None else [])
    if any(t.device.type != "cpu" for t in tensors) or packed.dtype not in WEIGHT_TYPES:
        raise ValueError(f"native.linear takes CPU tensors and a {_ALLOWED} weight")
    if any(t.dtype != torch.float32 for t in tensors if t is not packed):
        raise ValueError("native.linear takes float32 inputs and bias")
    if packed.dim() != 3 or packed.shape[2] != PANEL or not packed.is_contiguous():
        raise ValueError(f"native.linear: weight of shape {tuple(packed.shape)} is not packed")
    k = packed.shape[1]
    if x.dim() != 2 or x.shape[1] != k or not 0 < rows <= packed.shape[0] * PANEL:
        raise ValueError(
            f"native.linear: x {tuple(x.shape)} against a packed weight {tuple(packed.shape)}"
        )
    if bias is not None and (bias.shape != (rows,) or not bias.is_contiguous()):
        raise ValueError(f"native.linear: bias {tuple(bias.shape)} for {rows} rows")
    return _product(getattr(lib, _PRODUCTS[packed.dtype]), x, packed.data_ptr(), bias, rows)


def _product(
    function: ctypes._CFuncPtr, x: torch.Tensor, weight: int, bias: torch.Tensor | None, rows: int
) -> torch.Tensor:
    """(n, rows) float32 = the library's product ``function`` of x (n, k) over the weight at
    address ``weight`` (+ bias), on torch's thread count; shapes checked by the caller."""
    x = x.contiguous()
    n = x.shape[0]
    out = torch.empty(n, rows, dtype=torch.float32)
    if n == 0:
        return out
    status = function(
        x.data_ptr(),
        n,
        x.shape[1],
        weight,
        bias.data_ptr() if bias is not None else None,
        rows,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"native linear refused its arguments (status {status})")
    return out


_INT4_BLOCK = 8  # inputs whose codes share a panel's words
INT4_BIAS = 2.0**23  # added to stored zero points (cpu_forward.c: INT4_BIAS)
_INT4_ZERO_LIMIT = 2**22  # zero points the biased form holds exactly, and then some


class Int4Weight:
    """A GPTQ int4 weight of ``rows`` outputs in the kernels' layout (``WT_INT4`` in
    cpu_forward.c): ``codes`` int32 (panels, in / 8, 32), word o of a block holding output o's
    codes of the block's eight inputs (input 8b + r in bits 4r..4r + 3; the last panel
    zero-padded); ``zs`` float32 (panels, groups, 64), each group's 32 zero points (stored as
    2^23 + zero: the kernels turn a code into the float 2^23 + code with one bit operation) then
    32 scales; ``group_at`` int32 (in,), input i's group times 64. A weight is
    (code - zero) * scale in float32, GPTQ's dequantization. ``struct`` is the C side's
    ``q4_weight`` over these tensors (kept alive with it)."""

    def __init__(
        self, codes: torch.Tensor, zs: torch.Tensor, group_at: torch.Tensor, rows: int
    ) -> None:
        self.codes, self.zs, self.group_at, self.rows = codes, zs, group_at, rows
        self.in_features = codes.shape[1] * _INT4_BLOCK
        self.struct = Q4Weight(
            codes.data_ptr(), zs.data_ptr(), group_at.data_ptr(), zs.shape[1] * zs.shape[2]
        )

    def __reduce__(self) -> tuple[type, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
        """Pickled and copied as its tensors (``struct`` holds addresses): a copy's struct
        points at its own."""
        return (Int4Weight, (self.codes, self.zs, self.group_at, self.rows))

    @property
    def address(self) -> int:
        """The address of ``struct`` (what a WT_INT4 product's weight pointer points to), its
        pointers first set again from the tensors (``share_memory_`` moves a tensor's data)."""
        struct = self.struct
        struct.codes = self.codes.data_ptr()
        struct.zs = self.zs.data_ptr()
        struct.group_at = self.group_at.data_ptr()
        return ctypes.addressof(struct)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.zs, self.group_at))

    def dequantize(self) -> torch.Tensor:
        """The (rows, in) float32 weight the kernels compute with (a copy; for tests)."""
        shifts = (4 * torch.arange(_INT4_BLOCK, dtype=torch.int32)).view(1, 1, -1, 1)
        q = (self.codes.unsqueeze(2) >> shifts) & 15  # (panels, in / 8, 8, 32)
        q = q.reshape(len(self.codes), self.in_features, PANEL)  # outputs in order
        blocks = self.zs[:, self.group_at.long() // 64]  # (panels, in, 64)
        weight = ((q.float() + INT4_BIAS) - blocks[..., :PANEL]) * blocks[..., PANEL:]
        return weight.transpose(1, 2).reshape(-1, self.in_features)[: self.rows].contiguous()


def pack_int4(
    codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor
) -> Int4Weight:
    """A GPTQ weight as ``Int4Weight``: ``codes`` (in, out) of 0..15 (``unpack_qweight``),
    ``zeros`` and ``scales`` (groups, out) (true zero points, float scales), ``g_idx`` (in,)
    each input's group, in any order (act-order included); ``in`` a multiple of 8, as GPTQ
    packs it; zero points whole numbers of magnitude at most 2^22 (stored as 2^23 + zero). CPU
    tensors."""
    k, rows = codes.shape
    groups = scales.shape[0]
    if k % _INT4_BLOCK or not k:
        raise ValueError(f"native.pack_int4: inputs must be a positive multiple of 8, got {k}")
    shapes_fit = tuple(zeros.shape) == tuple(scales.shape) == (groups, rows)
    if not shapes_fit or tuple(g_idx.shape) != (k,) or groups < 1:
        raise ValueError(
            f"native.pack_int4: codes {tuple(codes.shape)}, zeros {tuple(zeros.shape)}, "
            f"scales {tuple(scales.shape)} and g_idx {tuple(g_idx.shape)} do not fit together"
        )
    if int(codes.min()) < 0 or int(codes.max()) > 15:
        raise ValueError("native.pack_int4: codes must be in 0..15")
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
        raise ValueError(f"native.pack_int4: g_idx must be in [0, {groups})")
    # Compared in float64: in an integer type abs() of its minimum overflows, and the limit
    # itself wraps in a narrow one (int8, uint8, int16).
    wide = zeros.double()
    whole = bool((wide == wide.round()).all())
    out_of_range = (wide < -_INT4_ZERO_LIMIT) | (wide > _INT4_ZERO_LIMIT)
    if not whole or bool(out_of_range.any()):
        raise ValueError(
            f"native.pack_int4: zero points must be whole numbers of magnitude at most "
            f"{_INT4_ZERO_LIMIT} (GPTQ's are 0..16)"
        )
    panels = -(-rows // PANEL)
    pad = panels * PANEL - rows
    padded = torch.nn.functional.pad(codes.to(torch.int32), (0, pad))
    blocks_of_rows = padded.view(k // _INT4_BLOCK, _INT4_BLOCK, panels, PANEL)
    words = blocks_of_rows[:, 0].clone()
    for r in range(1, _INT4_BLOCK):  # disjoint bit fields (row 7's sets the sign bit)
        words |= blocks_of_rows[:, r] << (4 * r)
    packed = huge_pages.empty((panels, k // _INT4_BLOCK, PANEL), torch.int32, torch.device("cpu"))
    packed.copy_(words.transpose(0, 1))
    blocks = [
        torch.nn.functional.pad(t, (0, pad)).view(groups, panels, PANEL)
        for t in (zeros.float() + INT4_BIAS, scales.float())
    ]
    zs = torch.cat(blocks, dim=2).transpose(0, 1).contiguous()  # (panels, groups, 64)
    group_at = (g_idx.to(torch.int32) * (2 * PANEL)).contiguous()
    return Int4Weight(packed, zs, group_at, rows)


def linear_int4(
    x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None, lib: ctypes.CDLL | None = None
) -> torch.Tensor:
    """``F.linear(x, weight.dequantize(), bias)`` for a float32 CPU 2-D x: the bits the float32
    product over the dequantized weight gives (``linear``), each row's independent of the
    others. Through ``lib`` (default: ``library()``, which must load)."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the native CPU kernels are not available")
    k, rows = weight.in_features, weight.rows
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(
            f"native.linear_int4 takes float32 CPU rows of {k} inputs, got {tuple(x.shape)} "
            f"{x.dtype} on {x.device}"
        )
    if bias is not None and (
        bias.dtype != torch.float32 or bias.shape != (rows,) or not bias.is_contiguous()
    ):
        raise ValueError(f"native.linear_int4: bias {tuple(bias.shape)} for {rows} float32 rows")
    return _product(lib.brisk_linear_int4, x, weight.address, bias, rows)


def _check_layouts(lib: ctypes.CDLL) -> None:
    """Refuse a library whose argument structs are longer than their mirrors here (it would read
    past their end). One that is shorter reads a prefix of them: an older source that
    bench/native_kernel_ab.py builds, whose fields are those here up to its end."""
    for name, mirror in (
        ("brisk_forward_args_bytes", ForwardArgs),
        ("brisk_q4_weight_bytes", Q4Weight),
    ):
        size = getattr(lib, name, None)
        if size is not None and size() > ctypes.sizeof(mirror):
            raise RuntimeError(
                f"the library's {mirror.__name__} is {size()} bytes, longer than the "
                f"{ctypes.sizeof(mirror)} of kernels/native.py's mirror: the C source and the "
                "Python package disagree"
            )


def _probe(lib: ctypes.CDLL) -> None:
    """Check the built library against torch on a small product with tails, before any use."""
    _check_layouts(lib)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(37, 75, generator=generator)
    bias = torch.randn(37, generator=generator)
    x = torch.randn(7, 75, generator=generator)
    got = linear(x, pack(weight), bias, 37, lib)
    expected = torch.nn.functional.linear(x.double(), weight.double(), bias.double()).float()
    if not torch.allclose(got, expected, atol=1e-4, rtol=0):
        raise RuntimeError("the probe product disagrees with torch")
    # Half-precision weights: the float32 product's bits over the same values, in tiles and (from
    # 64 rows with AVX2) over a widened panel.
    many = torch.randn(70, 75, generator=generator)
    for dtype in HALF_TYPES:
        rounded = weight.to(dtype)
        for rows in (x, many):
            got = linear(rows, pack(rounded), bias, 37, lib)
            if not torch.equal(got, linear(rows, pack(rounded.float()), bias, 37, lib)):
                raise RuntimeError(f"the {dtype} probe product disagrees with the float32 one")
    # Int4 weights (groups out of order, as act-order leaves them): the float32 product's bits
    # over the dequantized weight.
    codes = torch.randint(0, 16, (72, 37), generator=generator)
    zeros = torch.randint(0, 16, (3, 37), generator=generator)
    scales = torch.rand(3, 37, generator=generator) / 8
    int4 = pack_int4(codes, zeros, scales, torch.randint(0, 3, (72,), generator=generator))
    for rows in (x, many):
        rows = rows[:, :72]
        got = linear_int4(rows, int4, bias, lib)
        if not torch.equal(got, linear(rows, pack(int4.dequantize()), bias, 37, lib)):
            raise RuntimeError("the int4 probe product disagrees with the float32 one")
