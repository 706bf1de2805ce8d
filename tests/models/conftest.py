"""Fixtures shared by the native-kernel tests."""

from __future__ import annotations

import ctypes
import platform

import pytest

# Builds of cpu_forward.c the kernel tests run, by name: extra compiler flags (None: the library
# brisklm itself loads). Its register tiles and attention follow the vector registers (6 tokens x
# 2 k-chains with AVX-512, 3 tokens x 1 chain with AVX2), so every x86 machine runs both:
# "avx2" turns AVX-512 off, and "avx512-code" compiles the AVX-512 paths (plain C vector
# extensions, no intrinsics) into AVX2 instructions (on an AVX-512 CPU too: -mno-avx512f, else that
# build was the default one there).
BUILDS = {
    "default": None,
    "avx2": ("-mno-avx512f",),
    "avx512-code": ("-D__AVX512F__", "-mno-avx512f"),
}
# A build without F16C: float16 weights widened lane by lane (CPUs without the instruction).
F16C_FALLBACK = "no-f16c"
# A build as gcc 11 and older make it, without __builtin_shufflevector (other attention code).
NO_SHUFFLEVECTOR = "no-shufflevector"
_ALL_BUILDS = {
    **BUILDS,
    F16C_FALLBACK: ("-mno-f16c",),
    NO_SHUFFLEVECTOR: ("-DBRISK_NO_SHUFFLEVECTOR",),
}


@pytest.fixture(scope="session")
def native_build(tmp_path_factory):
    """build name -> the loaded library of that build of cpu_forward.c (built once a session)."""
    from brisklm.kernels import native

    built: dict[str, ctypes.CDLL] = {}

    def get(name: str) -> ctypes.CDLL:
        flags = _ALL_BUILDS[name]
        if flags is None:
            lib = native.library()
            assert lib is not None
            return lib
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("x86 flags")
        if name not in built:
            output = tmp_path_factory.mktemp("native") / f"{name}.so"
            native.compile_library(native._compiler(), native.SOURCE, output, flags)
            lib = ctypes.CDLL(str(output))
            native._declare(lib)
            built[name] = lib
        return built[name]

    return get
