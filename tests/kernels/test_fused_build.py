"""The fused CPU kernel's build and cache (fused_build.py): nothing found in the cache is loaded
blind, the build is bounded, and every refusal is one warning and the PyTorch path."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from kernel_cases import RESULT_NAMES, assert_all_close, run, synthetic_case

from graphattn.kernels import blocked, dense, fused_build, fused_cpu

HAS_COMPILER = bool(shutil.which("c++") or shutil.which("g++")) and shutil.which("ninja") is not None
needs_kernel = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler or ninja to build the fused kernel")
FALLBACK = "slower PyTorch path"

# A child that loads the kernel from $GRAPHATTN_CACHE and checks one call against the oracle:
# damaged caches are tried in children, as the damage would meet a later process.
CHILD = textwrap.dedent(
    """
    import torch
    from graphattn.kernels import blocked, dense, fused_cpu, synthetic
    side, layout = synthetic.synthetic_side_inputs(1, 24, 3, 2, 2)
    states = [torch.randn(1, 2, n, 8, dtype=torch.float64) for n in (3, 3, 3, 24, 24, 24)]
    table = torch.randn(layout.vocab_size, 2, 8, dtype=torch.float64)
    want = dense.attention(*states, side, table, None, 0.35)
    got = blocked.attention(*(s.float() for s in states), side, table.float(), None, 0.35, fused=True)
    print(fused_cpu.available(), all(torch.allclose(g.double(), w, atol=1e-4) for g, w in zip(got, want)))
    """
)


def _child(cache: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "GRAPHATTN_CACHE": str(cache), **env}
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=environment, timeout=600)


def _library(cache: Path) -> Path:
    (found,) = (cache / "kernels").glob("graphattn_cpu_*.so")
    return found


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A fresh load of the kernel in this process from an empty cache; the usual build is loaded
    again afterwards."""
    monkeypatch.setenv("GRAPHATTN_CACHE", str(tmp_path))
    fused_cpu.reset()
    yield monkeypatch
    monkeypatch.undo()
    fused_cpu.reset()


def _refused(match: str) -> None:
    case = synthetic_case(dtype=torch.float32, num_long=30, num_global=3, radius=3)
    with pytest.warns(UserWarning, match=f"(?s){match}.*{FALLBACK}") as said:
        results = run(blocked.attention, case)
    assert len([w for w in said if FALLBACK in str(w.message)]) == 1, "one warning"
    assert_all_close(
        results, run(dense.attention, synthetic_case(num_long=30, num_global=3, radius=3)), 1e-5, RESULT_NAMES
    )
    assert not fused_cpu.available()


@needs_kernel
@pytest.mark.slow
def test_a_damaged_or_foreign_cached_library_is_rebuilt_not_loaded(tmp_path) -> None:
    """A library cut to its first 4 KiB (SIGBUS when loaded) and another valid library under the
    expected name (no kernel functions) are both rebuilt by the next process, which runs right."""
    first = _child(tmp_path)
    assert first.returncode == 0 and first.stdout.split() == ["True", "True"], first.stderr[-2000:]
    library = _library(tmp_path)
    whole = library.read_bytes()
    library.write_bytes(whole[:4096])
    again = _child(tmp_path)
    assert again.returncode == 0 and again.stdout.split() == ["True", "True"], again.stderr[-2000:]
    assert library.read_bytes() == whole or library.stat().st_size > 4096
    shutil.copyfile(Path(torch.__file__).parent / "lib" / "libc10.so", library)
    third = _child(tmp_path)
    assert third.returncode == 0 and third.stdout.split() == ["True", "True"], third.stderr[-2000:]
    assert fused_build.intact(library)


@needs_kernel
@pytest.mark.slow
@pytest.mark.skipif(os.getuid() != 0, reason="handing a file to another user needs root")
def test_a_cached_library_another_user_owns_is_refused(fresh, tmp_path) -> None:
    built = _child(tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    os.chown(_library(tmp_path), 65534, 65534)  # nobody's, as a planted library would be
    _refused("cache is refused.*belongs to user id 65534")


@pytest.mark.parametrize("mode", [0o777, 0o720])
def test_a_cache_directory_others_may_write_is_refused(fresh, tmp_path, mode) -> None:
    (tmp_path / "kernels").mkdir()
    os.chmod(tmp_path / "kernels", mode)
    _refused(rf"cache is refused.*may be written by others \(mode {mode:o}\)")


def test_a_hanging_compiler_is_stopped_with_its_children_and_says_so(fresh, tmp_path) -> None:
    pids = tmp_path / "pids"
    compiler = tmp_path / "slowcc"
    compiler.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && exec echo slowcc 1.0\nsleep 600 &\necho $! > {pids}\nwait\n'
    )
    compiler.chmod(0o700)
    fresh.setenv("CXX", str(compiler))
    fresh.setenv("GRAPHATTN_BUILD_TIMEOUT", "3")
    fresh.setattr(fused_build, "NOTICE_SECONDS", 1.0)
    with pytest.warns(UserWarning, match="still compiling the fused CPU kernel.*Ctrl-C"):
        _refused(r"did not finish compiling the fused CPU kernel within 3 s \(GRAPHATTN_BUILD_TIMEOUT\)")
    child = int(pids.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or "Z" in _state(child), "the compiler's child was left running"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_cxx_with_an_unbalanced_quote_is_one_clear_warning(fresh) -> None:
    fresh.setenv("CXX", 'g++ "-O2')
    _refused(r"\$CXX \('g\+\+ \"-O2'\) cannot be read as a command: No closing quotation")


def test_a_bad_build_timeout_is_named(fresh) -> None:
    fresh.setenv("GRAPHATTN_BUILD_TIMEOUT", "soon")
    if not HAS_COMPILER:
        pytest.skip("no compiler: the timeout is never read")
    _refused(r"GRAPHATTN_BUILD_TIMEOUT must be a number of seconds in \(0, 86400\], got 'soon'")


@needs_kernel
@pytest.mark.slow
def test_the_key_names_the_compiler_version(fresh, tmp_path) -> None:
    """Two compilers that differ only in what --version says get two builds."""
    real = shutil.which("c++") or shutil.which("g++")
    for version in ("1.0", "2.0"):
        wrapper = tmp_path / f"cxx{version}"
        wrapper.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec echo fakecc {version}\nexec {real} "$@"\n')
        wrapper.chmod(0o700)
    for version in ("1.0", "2.0"):
        child = _child(tmp_path, CXX=str(tmp_path / f"cxx{version}"))
        assert child.returncode == 0 and child.stdout.split() == ["True", "True"], child.stderr[-2000:]
    assert len(list((tmp_path / "kernels").glob("graphattn_cpu_*.so"))) == 2


XEON = "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu sse2 avx avx2 fma bmi2 f16c avx512f avx512bw "
XEON += "avx512dq avx512vl avx512cd\ncpu MHz\t\t: 2100.0\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve sve2 bf16\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n"


def test_builds_are_made_for_an_instruction_set_level_not_for_the_cpu() -> None:
    """No -march=native: a shared cache holds one build per level, each runnable on every CPU
    of its level (a Graviton2 and a Graviton3 both run the aarch64 baseline's)."""
    assert fused_build.isa_level(XEON, "x86_64")[0] == "x86-64-avx512"
    assert "-mavx512f" in fused_build.isa_level(XEON, "x86_64")[1]
    assert fused_build.isa_level(XEON.replace(" avx512f", ""), "x86_64") == fused_build.X86_LEVELS[1][::2]
    assert fused_build.isa_level("flags\t: fpu sse2\n", "x86_64") == ("x86-64", [])
    assert fused_build.isa_level(GRAVITON3, "aarch64") == fused_build.isa_level("", "aarch64") == ("aarch64", [])
    assert not any("native" in flag for flag in fused_cpu.FLAGS + fused_build.isa_level()[1])


def test_no_fork_hook_is_registered() -> None:
    """Neither importing the model nor loading the kernel registers a fork hook (a forked child
    is told by its process id)."""
    code = textwrap.dedent(
        """
        import os
        hooks = []
        real = os.register_at_fork
        os.register_at_fork = lambda **kw: (hooks.append(kw), real(**kw))
        import graphattn.nn, graphattn.kernels.blocked
        from graphattn.kernels import fused_cpu
        mine = lambda kw: any("kernels" in (getattr(f, "__module__", "") or "") for f in kw.values())
        ours = lambda: sum(map(mine, hooks))
        print(ours())
        fused_cpu.available(), fused_cpu.available()
        print(ours() if fused_cpu.available() else 1)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "0"]


def test_the_cache_directory_is_made_private(tmp_path) -> None:
    made = fused_build.private_dir(tmp_path / "a" / "kernels")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_the_kernel_can_be_built_ahead_of_time() -> None:
    """`python -m graphattn.kernels.fused_cpu` builds into the cache a first call would use (here the
    usual one, already built by this run's other tests) and says where; turned off, it says why."""
    run = lambda **env: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "graphattn.kernels.fused_cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    if HAS_COMPILER:
        done = run()
        assert done.returncode == 0 and Path(done.stdout.strip()).name.startswith("graphattn_cpu_"), done.stderr
    off = run(GRAPHATTN_FUSED_CPU="0")
    assert off.returncode == 1 and "GRAPHATTN_FUSED_CPU=0" in off.stdout


def test_a_command_says_the_fallback_in_one_line(tmp_path) -> None:
    """`graphattn train` without a compiler: one line of its own on stderr, not Python's two-line warning."""
    data = Path(__file__).resolve().parents[2] / "examples" / "data"
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "GRAPHATTN_CACHE": str(tmp_path / "cache")}
    compile_ = ["compile", str(data / "hotpotqa_sample.json"), "--schema", "hotpotqa", "--out", str(tmp_path / "s")]
    train = ["train", "--data", str(tmp_path / "s"), "--out", str(tmp_path / "run"), "--steps", "1"]
    train += ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "2", "--no-progress"]
    for argv in (compile_ + ["--tokenizer", str(data / "tokenizer.json"), "-q"], train):
        done = subprocess.run(["graphattn", *argv], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphattn train: warning: the fused CPU kernel"), done.stderr
    assert "no-such-compiler" in lines[0] and FALLBACK in lines[0]
