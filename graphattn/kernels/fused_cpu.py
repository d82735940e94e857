"""The blocked backend's fused CPU kernel (fused_cpu.c): built at first use, called per chunk.

The PyTorch path (blocked.py) makes a dozen PyTorch calls per chunk, and between its matmuls every
score tile crosses memory three more times (label gather, softmax, copies). The C kernel does the
same arithmetic one block of rows at a time, with the block's scores kept in cache: 1.5-2x faster
on CPU (issue 29). It is compiled with the machine's C compiler (`cc`, or $CC) on first use,
for the instruction-set level of this CPU (fused_build.isa_level: AVX-512, AVX2 or baseline),
and cached under ~/.cache/graphattn (or $GRAPHATTN_CACHE) by
fused_build.py, which checks what it finds there before loading it (owner, permissions, digest);
its matmuls are the BLAS sgemm_ that PyTorch's CPU library exports. Where that cannot be done (no
compiler, no sgemm_ export, another OS, an unsafe cache), `available()` is False and the blocked
backend runs its PyTorch path, the same results within fp32 rounding. GRAPHATTN_FUSED_CPU=0
turns it off.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import sys
import threading
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from graphattn.kernels import fused_build
from graphattn.kernels.structure_runs import Runs

SOURCES = [Path(__file__).with_name(name) for name in ("fused_cpu.c", "fused_cpu_labels.c")]
# The instruction set comes from fused_build.isa_level (the running CPU's level, not
# -march=native), added after these. No -ffast-math: masked scores are -inf.
# -fopenmp: the workers are OpenMP threads; the library is linked against PyTorch's own libgomp
# (the same soname, found first through the rpath), so they are PyTorch's intra-op threads.
FLAGS = ["-O3", "-fPIC", "-shared", "-std=c11", "-fopenmp"]
FLAGS += ["-fno-math-errno", "-fno-trapping-math"]
_BUILD_LOCK = threading.Lock()
INT_LIMIT = 2**31  # sgemm_ (LP64) takes int sizes and strides
# A process forked from the one that imported this module: libgomp's threads of the parent do not
# exist there and a parallel region waits for them forever (PyTorch's own multi-threaded ops hang
# there too; a DataLoader worker sets one thread), so a forked child runs each pass on its
# calling thread, with MKL's sgemm single-threaded for the pass's calls (fused_cpu.c's
# sequential_blas_begin). Told by the process id (a process forked after this module was
# imported), not by a hook run in the child; "child": True makes a process run its passes so
# (tests compare the two schedules).
_FORKED = {"child": False, "parent": os.getpid()}  # the process that imported this module


def _forked() -> bool:
    return _FORKED["child"] or _FORKED["parent"] != os.getpid()


@cache
def _mkl_free_buffers():
    """MKL's call that empties its memory pool; None where PyTorch's BLAS is not MKL (the
    internal name: libtorch_cpu exports no public one)."""
    try:
        free = ctypes.CDLL(str(_torch_lib() / "libtorch_cpu.so")).mkl_serv_free_buffers
    except (OSError, AttributeError):
        return None
    free.restype = None
    return free


def _before_fork() -> None:
    """MKL's pool emptied before a fork: a child's first sgemm otherwise spun forever in MKL's
    per-thread accounting of that pool (mm_account_ptr_by_tid; 2 of 8 runs of the kernel tests
    on a 2-core AMD machine, none of 26 with this)."""
    free = _mkl_free_buffers()
    if free is not None:
        free()


_FORK_HOOK = {"registered": False}


def _register_fork_hook() -> None:
    """The fork hook (MKL's pool emptied), registered once the kernel is loaded (not by importing: a
    process that never runs the kernel needs none)."""
    if not _FORK_HOOK["registered"]:
        _FORK_HOOK["registered"] = True
        os.register_at_fork(before=_before_fork)


_LABEL_BYTES = {torch.int8: 1, torch.int16: 2, torch.int32: 4}  # blocked_tiles.label_dtype's choices


class Chunk(ctypes.Structure):
    """Mirror of the C struct `Chunk` (field for field, same order)."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in ("heads", "rows", "valid_rows", "block", "dim")),
        ("scale", ctypes.c_float),
        ("q", ctypes.c_void_p),
        ("q_bh", ctypes.c_int64),
        ("ka", ctypes.c_void_p),
        ("va", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("a_bh", "a_rows", "a_start", "a_step", "na", "a_parts")),
        ("kb", ctypes.c_void_p),
        ("vb", ctypes.c_void_p),
        ("b_bh", ctypes.c_int64),
        ("nb", ctypes.c_int64),
        ("dense", ctypes.c_void_p),
        ("dense_bytes", ctypes.c_int64),
        ("dense_batch", ctypes.c_int64),
        ("sink", ctypes.c_void_p),
        *((name, ctypes.c_void_p) for name in ("run_ptr", "run_start", "run_label")),
        ("rel_key", ctypes.c_void_p),
        ("rel_bias", ctypes.c_void_p),
        ("vocab", ctypes.c_int64),
        ("out", ctypes.c_void_p),
        ("out_bh", ctypes.c_int64),
        ("key_block", ctypes.c_int64),
        ("stats", ctypes.c_void_p),
        ("stats_bh", ctypes.c_int64),
        ("d_out", ctypes.c_void_p),
        ("d_out_bh", ctypes.c_int64),
        ("o", ctypes.c_void_p),
        ("o_bh", ctypes.c_int64),
        *((name, ctypes.c_void_p) for name in ("d_ka", "d_va", "d_kb", "d_vb", "d_rel_key", "d_rel_bias")),
    ]


def _cache_dir() -> Path:
    root = os.environ.get("GRAPHATTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "graphattn")
    return Path(root) / "kernels"


def _torch_lib() -> Path:
    return Path(torch.__file__).parent / "lib"


_REASON = {"why": "it has not been loaded yet"}


def _unavailable(why: str, warn: bool = True) -> None:
    _REASON["why"] = why
    if warn:
        warnings.warn(f"graphattn: {why}; the blocked backend runs its slower PyTorch path on CPU", stacklevel=4)


_LOADED: dict[str, ctypes.CDLL | None] = {}  # "lib": the outcome of the first load (reset() forgets it)


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be, with one warning that
    says why (the PyTorch path is slower) and the reason kept for `why_not()`. Kept in a plain
    dict, not functools.cache, so that torch.compile reads it as a constant."""
    if "lib" not in _LOADED:
        _LOADED["lib"] = _library()
    return _LOADED["lib"]


def reset() -> None:
    """Forget the loaded kernel: the next use loads it again (tests change its settings)."""
    _LOADED.clear()


def _library() -> ctypes.CDLL | None:
    if os.environ.get("GRAPHATTN_FUSED_CPU", "1") == "0":
        return _unavailable("the fused CPU kernel is turned off (GRAPHATTN_FUSED_CPU=0)", warn=False)
    if sys.platform != "linux":
        return _unavailable(f"the fused CPU kernel is built on Linux only, not {sys.platform}", warn=False)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return _unavailable("no C compiler (cc, gcc or $CC) was found to build the fused CPU kernel")
    try:
        lib = _load(fused_build.compiler_command(compiler))
    except fused_build.UnsafeCache as error:
        return _unavailable(f"the fused CPU kernel's cache is refused ({error})")
    except OSError as error:
        return _unavailable(f"the fused CPU kernel could not be built or loaded ({error})")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    chunks, int64s = ctypes.POINTER(Chunk), ctypes.POINTER(i64)
    lib.graphattn_forward_all.argtypes = [chunks, int64s, i64, i64, i64, int64s, i64]
    lib.graphattn_backward_all.argtypes = [chunks, int64s, int64s, i64, i64, i64, ctypes.POINTER(ptr), int64s, i64]
    lib.graphattn_backward_all.argtypes += [int64s, i64]
    for name in ("graphattn_forward_all", "graphattn_backward_all"):
        getattr(lib, name).restype = ctypes.c_int
    if lib.graphattn_self_check() != 0:
        blas = _torch_lib() / "libtorch_cpu.so"
        return _unavailable(f"the BLAS in {blas} multiplied a 2x3 by a 3x2 matrix wrongly through sgemm_")
    _register_fork_hook()
    _REASON["why"] = ""
    return lib


_SYMBOLS = ("graphattn_forward_all", "graphattn_backward_all", "graphattn_self_check", "graphattn_chunk_labels")


def _load(compiler: list[str]) -> ctypes.CDLL:
    """The cached build for this key, rebuilt when missing or damaged (fused_build.intact), then
    loaded and checked to have the kernel's functions."""
    lib = _torch_lib()
    texts = [source.read_text() for source in SOURCES]
    version = fused_build.compiler_version(compiler)
    level, isa = fused_build.isa_level()
    flags = [*FLAGS, *isa]
    parts = [*texts, " ".join(flags), " ".join(compiler), version, torch.__version__, str(lib), level]
    target = _cache_dir() / f"fused_cpu_{level}_{fused_build.cache_key(parts)}.so"
    command = [*compiler, *flags, *map(str, SOURCES), f"-L{lib}", "-ltorch_cpu", "-lm", f"-Wl,-rpath,{lib}"]
    with _BUILD_LOCK:
        directory = fused_build.private_dir(target.parent)
        with fused_build.locked(directory):
            if not fused_build.intact(target):
                fused_build.build(command, target, fused_build.build_timeout())
            loaded = ctypes.CDLL(str(target))
    missing = [name for name in _SYMBOLS if not hasattr(loaded, name)]
    if missing:
        raise OSError(f"the cached library {target} lacks {', '.join(missing)}")
    return loaded


def available() -> bool:
    return library() is not None


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


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def chunk(
    *,
    heads: int,
    rows: int,
    valid_rows: int,
    block: int,
    scale: float,
    q: torch.Tensor,
    keys_a: tuple[torch.Tensor, torch.Tensor],
    a_start: int,
    a_step: int,
    na: int,
    a_parts: int = 1,
    keys_b: tuple[torch.Tensor, torch.Tensor],
    labels: Labels,
    tables: tuple[torch.Tensor, torch.Tensor | None],
    out: torch.Tensor,
    stats: torch.Tensor,
    key_block: int,
) -> Chunk:
    """Describe one chunk. q and out are [BH, n, d] views starting at the chunk's first row;
    keys_a are whole [BH, n_a, d] key and value tensors (the block at chunk row i sees rows
    a_start + a_step*i .. + na; a band's blocks, a_step 1, may take them in a_parts sub-blocks
    of rows, row r of a block seeing only columns r .. r + na - block), keys_b [BH, nb, d] views
    of the chunk's second key set, read `key_block` keys at a time. tables are the relative key
    table [V, heads, d] and bias [V, heads] (or None) of the labels' score terms. stats [BH, n,
    2] (fp32) takes each row's max score and the log of its softmax sum. Rows (the last dim)
    must be contiguous, as must the tables and the labels' tensors."""
    ka, va = keys_a
    kb, vb = keys_b
    key_table, bias_table = tables
    dense = labels.dense
    _check_chunk(heads, rows, valid_rows, block, q, keys_a, a_parts, a_step, na, keys_b, labels, tables, out, stats)
    if key_block < 1:
        raise ValueError(f"fused CPU kernel: key_block must be at least 1, got {key_block}")
    if max(na + kb.shape[1] + 1, ka.shape[1], q.shape[-1]) >= INT_LIMIT:
        too_wide = f"a chunk of {na + kb.shape[1] + 1} keys is too wide"
        raise ValueError(f"the fused CPU kernel's BLAS takes 32-bit sizes; {too_wide}")
    described = Chunk(
        heads=heads,
        rows=rows,
        valid_rows=valid_rows,
        block=block,
        dim=q.shape[-1],
        scale=scale,
        q=_ptr(q),
        q_bh=q.stride(0),
        ka=_ptr(ka),
        va=_ptr(va),
        a_bh=ka.stride(0),
        a_rows=ka.shape[1],
        a_start=a_start,
        a_step=a_step,
        na=na,
        a_parts=a_parts,
        kb=_ptr(kb),
        vb=_ptr(vb),
        b_bh=kb.stride(0),
        nb=kb.shape[1],
        dense=_ptr(dense),
        dense_bytes=_LABEL_BYTES[dense.dtype],
        dense_batch=dense.stride(0),
        sink=_ptr(labels.sink),
        run_ptr=_ptr(labels.run_ptr),
        run_start=_ptr(labels.run_start),
        run_label=_ptr(labels.run_label),
        rel_key=_ptr(key_table),
        rel_bias=_ptr(bias_table),
        vocab=key_table.shape[0],
        out=_ptr(out),
        out_bh=out.stride(0),
        key_block=key_block,
        stats=_ptr(stats),
        stats_bh=stats.stride(0),
    )
    # What the pointers point into, for prepare_backward's checks (and kept alive with it).
    described.tensors = (q, ka, va, kb, vb, key_table, bias_table)
    return described


def _fail(what: str) -> None:
    raise ValueError(f"fused CPU kernel: {what}")


def _rows(name: str, t: torch.Tensor, bh: int, dim: int, rows: int, dtype: torch.dtype = torch.float32) -> None:
    """t is a CPU [bh, >= rows, dim] tensor of `dtype` whose rows are contiguous (the kernel
    reads row i of head h at h * t.stride(0) + i * dim); checked always, not by assert."""
    if t.device.type != "cpu" or t.dtype != dtype:
        _fail(f"{name} must be a CPU {dtype} tensor, got {t.dtype} on {t.device}")
    if t.dim() != 3 or t.shape[0] != bh or t.shape[2] != dim or t.shape[1] < rows:
        _fail(f"{name} must be [{bh}, >= {rows}, {dim}], got {list(t.shape)}")
    if (t.stride(2) != 1 and dim > 1) or (t.stride(1) != dim and t.shape[1] > 1):
        _fail(f"{name}'s rows must be contiguous (strides [*, {dim}, 1]), got {list(t.stride())}")
    if t.numel() and t.storage_offset() + (bh - 1) * t.stride(0) + t.shape[1] * dim > t.untyped_storage().nbytes() // 4:
        _fail(f"{name} reaches past its storage")


def _like(name: str, grad: torch.Tensor | None, like: torch.Tensor | None) -> None:
    """An accumulator laid out as the tensor it is the gradient of (the kernel indexes both alike)."""
    if (grad is None) != (like is None):
        _fail(f"{name} must be given exactly when its tensor is")
    if grad is None:
        return
    if grad.device.type != "cpu" or grad.dtype != torch.float32 or grad.shape != like.shape:
        _fail(f"{name} must be CPU float32 {list(like.shape)}, got {grad.dtype} {list(grad.shape)} on {grad.device}")
    if grad.stride() != like.stride():
        _fail(f"{name} must have its tensor's strides {list(like.stride())}, got {list(grad.stride())}")
    reach = grad.storage_offset() + sum((n - 1) * st for n, st in zip(grad.shape, grad.stride())) + 1
    if grad.numel() and reach * 4 > grad.untyped_storage().nbytes():
        _fail(f"{name} reaches past its storage")


def _check_chunk(heads, rows, valid_rows, block, q, keys_a, a_parts, a_step, na, keys_b, labels, tables, out, stats):
    """Every shape, dtype, device and layout the kernel relies on for one chunk: raised as
    ValueError, so that `python -O` keeps them."""
    ka, va = keys_a
    kb, vb = keys_b
    key_table, bias_table = tables
    if q.dim() != 3:
        _fail(f"q must be [BH, rows, dim], got {list(q.shape)}")
    bh, dim = q.shape[0], q.shape[2]
    if heads < 1 or bh % heads or not 0 <= valid_rows <= rows or block < 1 or na < 0:
        _fail(
            f"heads {heads}, rows {rows}, valid rows {valid_rows}, block {block}, na {na} do not fit q {list(q.shape)}"
        )
    for name, t, need in (("q", q, valid_rows), ("out", out, valid_rows), ("keys_a", ka, 0), ("values_a", va, 0)):
        _rows(name, t, bh, dim, need)
    for name, t in (("keys_b", kb), ("values_b", vb)):
        _rows(name, t, bh, dim, 0)
    if va.shape != ka.shape or va.stride() != ka.stride() or vb.shape != kb.shape or vb.stride() != kb.stride():
        _fail("keys and values of a key set must share their shapes and strides")
    _rows("stats", stats, bh, 2, valid_rows)
    if key_table.device.type != "cpu" or key_table.dtype != torch.float32 or not key_table.is_contiguous():
        _fail(f"the relative key table must be contiguous CPU float32, got {key_table.dtype} on {key_table.device}")
    if key_table.dim() != 3 or key_table.shape[1:] != (heads, dim):
        _fail(f"the relative key table must be [V, {heads}, {dim}], got {list(key_table.shape)}")
    if bias_table is not None and (
        bias_table.dtype != torch.float32
        or bias_table.device.type != "cpu"
        or not bias_table.is_contiguous()
        or bias_table.shape != key_table.shape[:2]
    ):
        _fail(f"the relative bias table must be contiguous CPU float32 [{key_table.shape[0]}, {heads}]")
    dense, sink = labels.dense, labels.sink
    batch = bh // heads
    if dense.dtype not in _LABEL_BYTES or dense.device.type != "cpu":
        _fail(f"labels must be int8, int16 or int32 on the CPU, got {dense.dtype} on {dense.device}")
    if dense.dim() != 3 or tuple(dense.shape) != (batch, rows, na) or (rows * na and dense.stride()[1:] != (na, 1)):
        _fail(f"key set A's labels must be [{batch}, {rows}, {na}] with contiguous rows, got {list(dense.shape)}")
    if sink.dtype != dense.dtype or not sink.is_contiguous() or tuple(sink.shape) != (batch, rows):
        _fail(
            f"the sink labels must be contiguous {dense.dtype} [{batch}, {rows}], got {sink.dtype} {list(sink.shape)}"
        )
    run_ptr, run_start, run_label = labels.run_ptr, labels.run_start, labels.run_label
    if run_ptr.dtype != torch.int64 or not run_ptr.is_contiguous() or run_ptr.numel() != batch * rows + 1:
        _fail(f"run_ptr must be contiguous int64 of {batch * rows + 1}, got {run_ptr.dtype} of {run_ptr.numel()}")
    for name, t in (("run_start", run_start), ("run_label", run_label)):
        if t.dtype != torch.int32 or not t.is_contiguous() or t.device.type != "cpu":
            _fail(f"{name} must be contiguous CPU int32, got {t.dtype} on {t.device}")
    if run_start.numel() != run_label.numel():
        _fail(f"run_start and run_label differ in length ({run_start.numel()} and {run_label.numel()})")
    if not (a_parts == 1 or (a_step == 1 and 1 <= a_parts <= block)):
        _fail(f"a band may take key set A in 1 ..= block ({block}) parts, got {a_parts} (step {a_step})")


def prepare_backward(c: Chunk, out: torch.Tensor, d_out: torch.Tensor, d_keys_a, d_keys_b, d_tables) -> None:
    """Point a chunk at what its backward reads and accumulates into. out (the forward's output,
    whose rows' statistics the forward left in c.stats) and d_out are laid out as c.out (the
    query gradient goes to c.out), d_keys_* as the key sets, d_tables as the key table and bias
    (None when there is none): all accumulate except the query gradient."""
    q, *likes = c.tensors
    bh, dim = q.shape[0], q.shape[2]
    for name, t in (("the forward's output", out), ("the output's gradient", d_out)):
        _rows(name, t, bh, dim, c.valid_rows)
    grads = (*d_keys_a, *d_keys_b, *d_tables)
    for name, grad, like in zip(("d_ka", "d_va", "d_kb", "d_vb", "d_key_table", "d_bias_table"), grads, likes):
        _like(name, grad, like)
    c.o, c.o_bh = _ptr(out), out.stride(0)
    c.d_out, c.d_out_bh = _ptr(d_out), d_out.stride(0)
    (c.d_ka, c.d_va), (c.d_kb, c.d_vb) = (map(_ptr, d_keys_a), map(_ptr, d_keys_b))
    c.d_rel_key, c.d_rel_bias = map(_ptr, d_tables)


def _int64s(values: list[int]):
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def _threads(workers: int) -> int:
    return 1 if _forked() else workers


def _failed(code: int, failed: ctypes.c_int64) -> int | None:
    if code == 1:
        raise MemoryError("graphattn: the fused CPU kernel could not allocate its score block")
    return failed.value if code == 2 else None


def _check_pass(chunks: list[Chunk], bh: int) -> None:
    if library() is None:
        _fail(f"it is not available ({why_not()})")
    for c in chunks:
        if getattr(c, "tensors", None) is None or c.tensors[0].shape[0] != bh:
            _fail(f"every chunk must be described by chunk() for {bh} heads x batch")


def forward_all(chunks: list[Chunk], order: list[int], workers: int, bh: int) -> int | None:
    """The forward of every chunk in one call, taken in `order` by up to `workers` OpenMP
    threads as they come (in a forked child all on the calling thread; any schedule gives the
    same bits). Returns the number of the chunk that had a label outside its table (the kernel
    read nothing there), or None."""
    _check_pass(chunks, bh)
    if len(set(order)) != len(order) or not all(0 <= i < len(chunks) for i in order):
        _fail(f"the forward's order must name chunks 0 ..< {len(chunks)} at most once each")
    failed = ctypes.c_int64(-1)
    code = library().graphattn_forward_all(
        (Chunk * len(chunks))(*chunks),
        _int64s(order),
        len(order),
        _threads(max(1, min(workers, len(order)))),
        bh,
        ctypes.byref(failed),
        _forked(),  # MKL sequential there
    )
    return _failed(code, failed)


def backward_all(
    chunks: list[Chunk],
    parts: list[list[int]],
    bh: int,
    accumulators: list[list[torch.Tensor | None]],
) -> int | None:
    """The backward of every chunk in one call: parts[w] are worker w's chunk numbers, in order,
    each worker an OpenMP thread (in a forked child all on the calling thread, with the same
    result), accumulating into accumulators[w] (fp32, contiguous, the same list of shapes per
    worker; None for one the pass does not have), which the kernel zeroes and finally sums
    into worker 0's. Returns as forward_all."""
    flat = [t for worker in accumulators for t in worker]
    _check_pass(chunks, bh)
    if len({len(worker) for worker in accumulators}) != 1 or len(accumulators) != len(parts):
        _fail("every worker needs the same list of accumulators")
    for t, like in zip(flat, accumulators[0] * len(accumulators)):
        if t is not None and (not t.is_contiguous() or t.dtype != torch.float32 or t.device.type != "cpu"):
            _fail("the backward's accumulators must be contiguous CPU float32")
        if (t is None) != (like is None) or t is not None and t.shape != like.shape:
            _fail("every worker's accumulators must have the first worker's shapes")
    if sorted(i for part in parts for i in part) != list(range(len(chunks))):
        _fail("the workers' parts must hold every chunk once")
    per_worker = len(accumulators[0])
    failed = ctypes.c_int64(-1)
    code = library().graphattn_backward_all(
        (Chunk * len(chunks))(*chunks),
        _int64s([0, *itertools.accumulate(map(len, parts))]),
        _int64s([i for part in parts for i in part]),
        len(parts),
        _threads(len(parts)),
        bh,
        (ctypes.c_void_p * max(len(flat), 1))(*map(_ptr, flat)),
        _int64s([0 if t is None else t.numel() for t in flat[:per_worker]]),
        per_worker,
        ctypes.byref(failed),
        _forked(),  # MKL sequential there
    )
    return _failed(code, failed)
