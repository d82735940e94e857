"""The blocked backend's fused CPU kernel (kernels/cpu/*.cpp): a PyTorch extension, built at first use.

The PyTorch path (blocked.py) makes a dozen PyTorch calls per chunk, and between its matmuls every
score tile crosses memory three more times (label gather, softmax, copies). The kernel does the
same arithmetic one block of rows at a time, with the block's scores kept in cache: 1.5-2x faster
on CPU (issue 29). It is a library of PyTorch operators (graphattn::fused_forward, fused_backward,
chunk_labels, dense_band, dense_extents; fused_op.py registers their fake implementations and
autograd): its threads are PyTorch's intra-op threads (at::parallel_for), its matmuls ATen's.

It is built by torch.utils.cpp_extension (its compiler flags, ABI and ninja) with the machine's
C++ compiler (`c++`, or $CXX) for the instruction-set level of this CPU (fused_build.isa_level:
AVX-512, AVX2 or baseline; never -march=native), in a child process bounded in time, and cached
under ~/.cache/graphattn/kernels (or $GRAPHATTN_CACHE/kernels) by fused_build.py, which checks
what it finds there before loading it (owner, permissions, digest). Where that cannot be done (no
compiler or ninja, another OS, an unsafe cache, a failed build), `available()` is False with one
warning, and the blocked backend runs its PyTorch path, the same results within fp32 rounding.
GRAPHATTN_FUSED_CPU=0 turns it off.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from graphattn.errors import GraphattnWarning
from graphattn.kernels import fused_build, fused_op
from graphattn.kernels.structure_runs import Runs

ROOT = Path(__file__).with_name("cpu")
SOURCES = [ROOT / "fused.cpp", ROOT / "labels.cpp"]
HEADERS = [ROOT / "kernel.h", ROOT / "passes.h"]
# The instruction set comes from fused_build.isa_level (the running CPU's level, not
# -march=native), added after these. No -ffast-math: masked scores are -inf. -fopenmp: ATen's
# at::parallel_for is a header template that opens its OpenMP region in the caller's code (on a
# PyTorch built with OpenMP; without the flag it runs serially), and the library then needs
# libgomp.so.1, which resolves to the one PyTorch loaded (the same soname): PyTorch's intra-op
# threads. The sources themselves use no OpenMP call or parallel pragma (`omp simd` only).
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
LDFLAGS = ["-fopenmp"]
_BUILD_LOCK = threading.Lock()
OPERATORS = ("fused_forward", "fused_backward", "chunk_labels", "dense_band", "dense_extents")


def _cache_dir() -> Path:
    root = os.environ.get("GRAPHATTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "graphattn")
    return Path(root) / "kernels"


_REASON = {"why": "it has not been loaded yet"}


def _unavailable(why: str, warn: bool = True) -> None:
    _REASON["why"] = why
    if warn:
        warnings.warn(
            f"graphattn: {why}; the blocked backend runs its slower PyTorch path on CPU", GraphattnWarning, stacklevel=4
        )


_LOADED: dict[str, Path | None] = {}  # "lib": the outcome of the first load (reset() forgets it)
_IN_PROCESS: list[Path] = []  # the build this process loaded (a library cannot be unloaded)


def library() -> Path | None:
    """The loaded kernel library, built on first use; None where it cannot be, with one warning
    that says why (the PyTorch path is slower) and the reason kept for `why_not()`. Kept in a
    plain dict, not functools.cache, so that torch.compile reads it as a constant."""
    if "lib" not in _LOADED:
        _LOADED["lib"] = _library()
    return _LOADED["lib"]


def reset() -> None:
    """Forget the outcome of the load: the next use checks the settings again (tests change them).
    The operators loaded stay loaded: a process can hold one build of them."""
    _LOADED.clear()


def _library() -> Path | None:
    if os.environ.get("GRAPHATTN_FUSED_CPU", "1") == "0":
        return _unavailable("the fused CPU kernel is turned off (GRAPHATTN_FUSED_CPU=0)", warn=False)
    if sys.platform != "linux":
        return _unavailable(f"the fused CPU kernel is built on Linux only, not {sys.platform}", warn=False)
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        return _unavailable("no C++ compiler (c++, g++ or $CXX) was found to build the fused CPU kernel")
    if shutil.which("ninja", path=fused_build.tool_path()) is None:
        return _unavailable("ninja (the build tool torch.utils.cpp_extension needs) was not found")
    try:
        target = _load(fused_build.compiler_command(compiler), compiler)
    except fused_build.UnsafeCache as error:
        return _unavailable(f"the fused CPU kernel's cache is refused ({error})")
    except (OSError, RuntimeError) as error:
        return _unavailable(f"the fused CPU kernel could not be built or loaded ({error})")
    fused_op.register()
    _REASON["why"] = ""
    return target


def _load(command: list[str], compiler: str) -> Path:
    """The cached build for this key, rebuilt when missing or damaged (fused_build.intact), then
    loaded and checked to hold the operators."""
    version = fused_build.compiler_version(command)
    level, isa = fused_build.isa_level()
    flags = [*FLAGS, *isa]
    texts = [source.read_text() for source in (*SOURCES, *HEADERS)]
    abi = str(torch._C._GLIBCXX_USE_CXX11_ABI)
    parts = [
        *texts,
        " ".join(flags),
        " ".join(LDFLAGS),
        compiler,
        version,
        torch.__version__,
        str(Path(torch.__file__).parent),
        abi,
    ]
    parts += [sys.version, level]
    name = f"graphattn_cpu_{level.replace('-', '_')}_{fused_build.cache_key(parts)}"
    target = _cache_dir() / f"{name}.so"
    timeout = fused_build.build_timeout()
    with _BUILD_LOCK:
        directory = fused_build.private_dir(target.parent)  # refused even where this process holds the build
        if _IN_PROCESS and _IN_PROCESS[0] == target:
            return target
        with fused_build.locked(directory):
            if not fused_build.intact(target):
                fused_build.build_extension(name, SOURCES, (flags, LDFLAGS), compiler, target, timeout)
            if _IN_PROCESS:  # the operators of a library stay registered: one build per process
                raise OSError(f"another build of the kernel ({_IN_PROCESS[0].name}) is loaded in this process already")
            torch.ops.load_library(str(target))
        _IN_PROCESS.append(target)
    missing = [op for op in OPERATORS if not hasattr(torch.ops.graphattn, op)]
    if missing:
        raise OSError(f"the cached library {target} lacks the operators {', '.join(missing)}")
    return target


def available() -> bool:
    return library() is not None


def loaded() -> bool:
    """Whether this process holds the operators (loads nothing)."""
    return bool(_IN_PROCESS)


def why_not() -> str:
    """Why the kernel is not available ("" when it is)."""
    library()
    return _REASON["why"]


@dataclass
class Labels:
    """A chunk's labels as the kernel reads them: one per column of key set A (`dense` [B, rows,
    na], rows contiguous: the long chunks' is a view of the plan's skewed band labels), the sink's
    per row (`sink` [B, rows]: V, or V + 1 for a row with no allowed key), and runs of equal labels
    over key set B (CSR over the B * rows rows: `run_ptr` [B*rows + 1] int64, `run_start` and
    `run_label` [runs] int32). A row of soft l2g or g2l labels is one or a few runs: memory per
    row O(runs), not O(G) or O(L)."""

    dense: torch.Tensor
    sink: torch.Tensor
    run_ptr: torch.Tensor
    run_start: torch.Tensor
    run_label: torch.Tensor

    @staticmethod
    def of(first: torch.Tensor, empty: torch.Tensor, runs: Runs, vocab: int, dtype: torch.dtype) -> Labels:
        """From key set A's labels [B, rows, na] (kept as they are when already `dtype` with
        contiguous rows), the rows with no allowed key [B, rows] and B's runs ([B, rows] counts)."""
        rows_contiguous = first.stride()[1:] == (first.shape[2], 1)
        dense = first if first.dtype == dtype and rows_contiguous else first.to(dtype).contiguous()
        run_ptr = torch.zeros(runs.counts.numel() + 1, dtype=torch.int64)
        torch.cumsum(runs.counts.flatten(), 0, out=run_ptr[1:])
        return Labels(dense, empty.to(dtype) + vocab, run_ptr, runs.start, runs.label)

    @property
    def nbytes(self) -> int:
        """Bytes these labels hold (a view of the plan's band labels holds none of its own)."""
        own = [self.sink, self.run_ptr, self.run_start, self.run_label]
        own += [self.dense] if self.dense._base is None else []
        return sum(t.numel() * t.element_size() for t in own)


def main() -> int:
    """`python -m graphattn.kernels.fused_cpu`: build the kernel ahead of time (an image's build
    step, say) into the cache the first attention call would use; says where, or why not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = library()
    print(built if built is not None else f"not built: {why_not()}")
    return 0 if built is not None else 1


if __name__ == "__main__":
    sys.exit(main())
