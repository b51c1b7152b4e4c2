"""Builds benchmarks/cpp/inside.cpp on first use and calls it through ctypes.

The shared library goes to $FOLDAX_CACHE (default ~/.cache/foldax), named by a
hash of the source, the flags and the CPU model: -march=native code must not be
reused on another CPU. ctypes drops the GIL during the call, so timings are of
the C++ alone.
"""
import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).parent / "cpp" / "inside.cpp"
# No -ffast-math: it would let the compiler assume -inf never occurs. The split
# loops vectorise anyway through `#pragma omp simd` (-fopenmp-simd) reductions.
FLAGS = ["-std=c++17", "-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd",
         "-fPIC", "-shared", "-pthread"]
_lib = None


def _cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


def build(force=False):
    """Compile (if needed) and load the library; returns the ctypes handle."""
    global _lib
    if _lib is not None and not force:
        return _lib
    cxx = os.environ.get("CXX", "g++")
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join([cxx] + FLAGS).encode() + _cpu_model().encode()
    ).hexdigest()[:16]
    cache = Path(os.environ.get("FOLDAX_CACHE", Path.home() / ".cache" / "foldax"))
    cache.mkdir(parents=True, exist_ok=True)
    so = cache / f"inside_{key}.so"
    if force or not so.exists():
        # Build to a temp name and rename, so a concurrent process never loads half a file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], check=True)
        os.replace(tmp, so)
    lib = ctypes.CDLL(str(so))
    vp, c_int = ctypes.c_void_p, ctypes.c_int  # pointers are checked in Python, see _prep
    for name, scalar in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        single = getattr(lib, f"inside_{name}")
        single.argtypes = [vp, vp, vp, scalar, vp, vp, c_int, c_int]
        single.restype = scalar
        batch = getattr(lib, f"inside_batch_{name}")
        batch.argtypes = [vp, vp, vp, scalar, vp, vp, vp, c_int, c_int, c_int, vp, c_int]
        batch.restype = None
    _lib = lib
    return lib


def _ptr(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def _prep(params, dtype):
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError("dtype must be float32 or float64")
    arrs = [np.ascontiguousarray(np.asarray(params[k]), dtype) for k in ("stack", "pair", "unpaired")]
    assert arrs[0].shape == (5, 5, 5, 5) and arrs[1].shape == (5, 5) and arrs[2].shape == (5,)
    return dtype, arrs, float(np.asarray(params["loop"]))


def cpp_log_partition(params, tokens, min_hairpin=3, phi=None, dtype=np.float32):
    """log Z of one sequence (tokens int [n]); runs on the calling thread."""
    dtype, (s, p, u), loop = _prep(params, dtype)
    x = np.ascontiguousarray(tokens, np.int32)
    n = x.shape[0]
    if phi is not None:
        phi = np.ascontiguousarray(phi, dtype)
        assert phi.shape == (n, n)
    f = build().inside_f32 if dtype == np.float32 else build().inside_f64
    return f(_ptr(s), _ptr(p), _ptr(u), loop, _ptr(phi), _ptr(x), n, int(min_hairpin))


def cpp_log_partition_batch(params, tokens, lengths=None, min_hairpin=3, phi=None,
                            dtype=np.float32, threads=2):
    """log Z of each row of tokens int [B, L] (first lengths[b] tokens) -> [B], on `threads` std::threads."""
    dtype, (s, p, u), loop = _prep(params, dtype)
    x = np.ascontiguousarray(tokens, np.int32)
    B, L = x.shape
    if lengths is not None:
        lengths = np.ascontiguousarray(lengths, np.int32)
        assert lengths.shape == (B,) and lengths.min(initial=0) >= 0 and lengths.max(initial=0) <= L
    if phi is not None:
        phi = np.ascontiguousarray(phi, dtype)
        assert phi.shape == (B, L, L)
    out = np.empty(B, dtype)
    f = build().inside_batch_f32 if dtype == np.float32 else build().inside_batch_f64
    f(_ptr(s), _ptr(p), _ptr(u), loop, _ptr(phi), _ptr(x), _ptr(lengths), B, L,
      int(min_hairpin), _ptr(out), int(threads))
    return out
