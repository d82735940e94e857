"""Building and caching the fused CPU kernel's shared library safely (used by fused_cpu.py).

A cached library is code this process will run, so nothing found in the cache is loaded blind:

* The cache directory (~/.cache/graphattn/kernels, or $GRAPHATTN_CACHE/kernels) is made private
  (0700); a directory or library that another user owns, or that others may write, is refused
  (`UnsafeCache`), and so is a directory whose parent others may write without the sticky bit.
* Each library is built by torch.utils.cpp_extension in a fresh temporary directory inside the
  cache (`build_extension`), and written beside a sha256 digest of its bytes only after a whole
  build (rename), under an flock on the directory's lock file; a library whose bytes differ from
  its digest (cut short, overwritten) or that has none is rebuilt.
* The key of a build (fused_cpu.py) names everything its bytes depend on: the sources and flags,
  the compiler and its `--version`, torch's version and directory, the C++ ABI, Python's version,
  and the instruction-set level it is built for (`isa_level`: AVX-512, AVX2 or baseline x86-64
  by the running CPU's flags, the baseline elsewhere), never -march=native, so a cache shared by
  machines with different CPUs holds one build per level, each runnable on every CPU of it.
* The build runs in a child process in its own process group, bounded by
  GRAPHATTN_BUILD_TIMEOUT seconds (default 300): a build that takes longer than NOTICE_SECONDS
  says so once, and one that runs out of time or is interrupted (Ctrl-C) has its whole group
  (the compiler included) killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from graphattn.errors import GraphattnWarning

NOTICE_SECONDS = 10.0  # a build still running after this says so
DEFAULT_TIMEOUT = 300.0
VERSION_TIMEOUT = 30.0


class UnsafeCache(OSError):
    """The cache directory or a file in it is not this user's alone: nothing is loaded from it."""


def compiler_command(compiler: str) -> list[str]:
    """$CXX (or the compiler found) as an argument list; an unsplittable one is one clear error."""
    try:
        words = shlex.split(compiler)
    except ValueError as error:
        raise OSError(f"$CXX ({compiler!r}) cannot be read as a command: {error}") from None
    if not words:
        raise OSError("$CXX is set but names no compiler")
    return words


def build_timeout() -> float:
    raw = os.environ.get("GRAPHATTN_BUILD_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86400:
        raise OSError(f"GRAPHATTN_BUILD_TIMEOUT must be a number of seconds in (0, 86400], got {raw!r}")
    return seconds


def run_bounded(
    command: list[str], timeout: float, what: str, notice: float | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """(status, stdout, stderr) of `command` run in its own process group, which is killed when
    it runs past `timeout` seconds (OSError naming `what`) or the caller is interrupted; after
    `notice` seconds one warning says that it is still running."""
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=env,
        )
    except (OSError, ValueError) as error:
        raise OSError(f"{command[0]} could not be started for {what}: {error}") from None
    try:
        try:
            out, err = process.communicate(timeout=notice if notice is not None and notice < timeout else timeout)
        except subprocess.TimeoutExpired:
            if notice is None or notice >= timeout:
                raise
            warnings.warn(
                f"graphattn: still {what} (first use; up to {timeout:g} s, GRAPHATTN_BUILD_TIMEOUT; "
                "Ctrl-C stops it and the PyTorch path runs)",
                GraphattnWarning,
                stacklevel=2,
            )
            out, err = process.communicate(timeout=timeout - notice)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise OSError(
            f"{command[0]} did not finish {what} within {timeout:g} s (GRAPHATTN_BUILD_TIMEOUT); it was stopped"
        ) from None
    except BaseException:
        _kill_group(process)
        raise
    return process.returncode, out, err


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        process.communicate(timeout=10)


def compiler_version(command: list[str]) -> str:
    """The compiler's `--version` output, part of the cache key (another compiler or version,
    another build); a compiler without the option gives its status and message instead."""
    status, out, err = run_bounded([*command, "--version"], VERSION_TIMEOUT, "answering --version")
    return out if status == 0 else f"status {status}: {out}{err}"


# The instruction sets a build may use, from the most capable down: (name, /proc/cpuinfo flags
# the running CPU must have, compiler flags). A build is made for the first level the CPU has,
# not for the CPU itself (-march=native), so every CPU of that level can run it and one cache
# holds one build per level. The AVX-512 paths of the C sources are written for 16 lanes.
X86_LEVELS = (
    (
        "x86-64-avx512",
        {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx2", "fma", "bmi2", "f16c"},
        ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512cd", "-mavx2", "-mfma", "-mbmi2", "-mf16c"]
        + ["-mprefer-vector-width=512"],
    ),
    ("x86-64-avx2", {"avx2", "fma", "bmi2", "f16c"}, ["-mavx2", "-mfma", "-mbmi2", "-mf16c"]),
    ("x86-64", set(), []),
)


def isa_level(cpuinfo: str | None = None, machine: str | None = None) -> tuple[str, list[str]]:
    """(name, compiler flags) of the instruction-set level this CPU runs, for the build and its
    cache key: x86 by the flags /proc/cpuinfo lists; aarch64 and others their baseline (the
    compiler's default target), so Graviton2 and Graviton3 share one build that both can run."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return machine or "unknown", []
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "flags":
            flags = set(value.split())
            break
    return next((name, list(options)) for name, need, options in X86_LEVELS if need <= flags)


def cache_key(parts: list[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _check_private(path: Path, what: str) -> os.stat_result:
    info = os.lstat(path)
    if info.st_uid != os.getuid():
        raise UnsafeCache(f"the {what} {path} belongs to user id {info.st_uid}, not this user ({os.getuid()})")
    if info.st_mode & 0o022:
        raise UnsafeCache(f"the {what} {path} may be written by others (mode {stat.S_IMODE(info.st_mode):o})")
    return info


def private_dir(directory: Path) -> Path:
    """The cache directory, made (0700) if missing, checked to be this user's alone."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    parent = os.stat(directory.parent)
    if parent.st_mode & 0o002 and not parent.st_mode & stat.S_ISVTX and parent.st_uid != os.getuid():
        raise UnsafeCache(f"the cache directory's parent {directory.parent} may be written by anyone (no sticky bit)")
    if not stat.S_ISDIR(_check_private(directory, "cache directory").st_mode):
        raise UnsafeCache(f"the cache directory {directory} is not a directory")
    return directory


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digest_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def intact(target: Path) -> bool:
    """The library is a regular file of this user's, unwritable by others, whose bytes match the
    digest written after its build; False (rebuild) when it or its digest is missing or differs."""
    if not os.path.lexists(target):
        return False
    info = _check_private(target, "cached library")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeCache(f"the cached library {target} is not a regular file")
    digest = _digest_path(target)
    if not os.path.lexists(digest):
        return False
    _check_private(digest, "cached digest")
    try:
        return digest.read_text().strip() == _digest(target)
    except (OSError, UnicodeDecodeError):
        return False


@contextlib.contextmanager
def locked(directory: Path):
    """An flock on the directory's lock file, so that processes sharing the cache build in turn."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# Run in a child process (bounded, killable with its compiler): torch.utils.cpp_extension builds
# the extension (its include paths, ABI flags and ninja; its own lock in the build directory).
_BUILD_CHILD = """
import sys
from torch.utils import cpp_extension
name, build, flags, ldflags, *sources = sys.argv[1:]
cpp_extension.load(name=name, sources=sources, extra_cflags=flags.split(), extra_ldflags=ldflags.split(),
                   build_directory=build, is_python_module=False, verbose=False)
"""


def tool_path() -> str:
    """$PATH with this interpreter's directory first: the `ninja` package installs its binary
    there, which a virtual environment that is not activated leaves off $PATH."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def build_extension(
    name: str, sources: list[Path], flags: tuple[list[str], list[str]], compiler: str, target: Path, timeout: float
) -> None:
    """Build the extension `name` from `sources` (flags: compiler's and linker's) with
    torch.utils.cpp_extension in a temporary
    directory beside `target` (a fresh build: nothing half-made is reused), in a child process
    bounded by `timeout`, and move the library and its digest into place."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        what = "compiling the fused CPU kernel"
        command = [sys.executable, "-c", _BUILD_CHILD, name, tmp, *(" ".join(f) for f in flags), *map(str, sources)]
        env = {**os.environ, "CXX": compiler, "PATH": tool_path()}
        status, _, err = run_bounded(command, timeout, what, NOTICE_SECONDS, env=env)
        if status != 0:
            said = err.strip()[-2000:] or "no message"
            raise OSError(f"the C++ compiler ({compiler}) failed {what}, status {status}: {said}")
        out = Path(tmp) / f"{name}.so"
        os.chmod(out, 0o700)
        digest = Path(tmp) / "digest"
        digest.write_text(_digest(out) + "\n")
        os.chmod(digest, 0o600)
        os.replace(out, target)
        os.replace(digest, _digest_path(target))
