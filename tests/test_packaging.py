"""What `pip install graphattn` (not editable) gives a user: the wheel holds the schemas, the viewer
and the default tokenizer, and the installed command compiles with no --tokenizer, with a Hugging
Face model directory, and with a tokenizer it trained itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
TEXT = "The river runs past old mills. People trade grain and wool in quiet towns.\n\nStorms pass over the bridges."


def test_project_metadata_packaging_rules():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"  # an SPDX expression, not the table form
    (setuptools,) = project["build-system"]["requires"]
    assert setuptools.startswith("setuptools>=") and "<" in setuptools  # bounded both ways
    assert not any(dep.startswith("triton") for dep in project["project"]["dependencies"])  # 1 GB only where used
    extras = project["project"]["optional-dependencies"]
    assert any(dep.startswith("triton") for dep in extras["cuda"]) and any(
        dep.startswith("triton") for dep in extras["test"]
    )


def test_kernels_import_and_run_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # as if triton were not installed
        "import torch, graphattn.kernels as k\n"
        "print(k.triton_available(), k.resolve_backend('auto', torch.device('cuda')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "blocked"]  # even on CUDA, auto falls back to the blocked backend


def _copy_tracked_tree(target: Path) -> Path:
    """The repository's tracked files (symlinks kept as links), as a clean checkout would have them."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    )
    for name in filter(None, files):
        source, dest = REPO / name, target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, dest)
    return target


def _site_packages(python: Path | str) -> list[str]:
    code = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return list(dict.fromkeys(json.loads(out)))


def _see_this_environments_packages(python: Path) -> None:
    """Plain path lines, so the running environment's own `.pth` files (the editable install of this
    checkout among them) are not run: graphattn comes from the wheel, everything else from here."""
    own = _site_packages(python)[0]
    ours = [p for p in _site_packages(sys.executable) if Path(p).is_dir()]
    (Path(own) / "_graphattn_test_environment.pth").write_text("".join(f"{p}\n" for p in ours))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A wheel built from a clean copy, installed (not editable) into a fresh venv whose dependencies
    are this test run's own packages: a `.pth` file puts the running environment's site-packages
    after the venv's own (no download). Not venv's option to see the system's site-packages: run
    inside a venv, it sees the *base* interpreter's packages, which on a fresh machine hold no torch."""
    root = tmp_path_factory.mktemp("pip-user")
    source = _copy_tracked_tree(root / "src")
    wheels = root / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("graphattn-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _see_this_environments_packages(python)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests run with the checkout on PYTHONPATH
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    work = root / "work"
    work.mkdir()
    return {"wheel": wheel, "python": python, "graphattn": venv / "bin" / "graphattn", "env": env, "work": work}


@pytest.mark.slow
def test_wheel_holds_the_schemas_viewer_and_default_tokenizer(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for name in (
        "graphattn/schemas/relation-schema.json",
        "graphattn/schemas/hotpotqa.yaml",
        "graphattn/schemas/etc-sentences.yaml",
        "graphattn/assets/default-tokenizer.json",
        "graphattn/viz/viewer.js",
        "graphattn/viz/viewer.html",
        "graphattn/kernels/cpu/fused.cpp",
        "graphattn/kernels/cpu/labels.cpp",
        "graphattn/kernels/cpu/kernel.h",
        "graphattn/kernels/cpu/passes.h",
    ):
        assert name in names, name
    where = subprocess.run(
        [str(installed["python"]), "-c", "import graphattn; print(graphattn.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=installed["env"],
        cwd=installed["work"],
    ).stdout.strip()
    assert str(REPO) not in where and "site-packages" in where  # the installed copy, not this checkout


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="no C++ compiler")
def test_the_installed_package_builds_and_runs_its_fused_cpu_kernel(installed, tmp_path):
    code = (
        "import torch\n"
        "from graphattn.kernels import blocked, fused_cpu, synthetic\n"
        "print(fused_cpu.available(), ','.join(map(str, fused_cpu.SOURCES)))\n"
        "side, layout = synthetic.synthetic_side_inputs(1, 20, 3, 2, 2)\n"
        "states = [torch.randn(1, 2, n, 8) for n in (3, 3, 3, 20, 20, 20)]\n"
        "table = torch.randn(layout.vocab_size, 2, 8)\n"
        "g, l = blocked.attention(*states, side, table, None, 0.35, fused=True)\n"
        "print(bool(torch.isfinite(l).all()), torch.ops.graphattn.fused_forward.default.name())\n"
    )
    env = {**installed["env"], "GRAPHATTN_CACHE": str(tmp_path)}
    done = subprocess.run(
        [str(installed["python"]), "-c", code], capture_output=True, text=True, env=env, cwd=installed["work"]
    )
    assert done.returncode == 0, done.stderr
    available, source, finite, operator = done.stdout.split()
    sources = source.split(",")
    assert available == "True" and len(sources) == 2 and all("site-packages" in s for s in sources) and finite == "True"
    assert operator == "graphattn::fused_forward", "the fused passes run as a registered PyTorch operator"
    assert list(tmp_path.glob("kernels/graphattn_cpu_*.so")), "the build should land in GRAPHATTN_CACHE"


def _compile(installed, name: str, *tokenizer: str) -> subprocess.CompletedProcess:
    work = installed["work"]
    (work / "story.txt").write_text(TEXT)
    return subprocess.run(
        [
            str(installed["graphattn"]),
            "compile",
            "story.txt",
            "--schema",
            "etc-sentences",
            "--out",
            name,
            "-q",
            *tokenizer,
        ],
        capture_output=True,
        text=True,
        env=installed["env"],
        cwd=work,
    )


@pytest.mark.slow
def test_installed_command_compiles_with_the_default_tokenizer(installed):
    proc = _compile(installed, "default")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("compiled 1 of 1 document; rejected 0")
    run = json.loads((installed["work"] / "default" / "run.json").read_text())
    assert run["settings"]["tokenizer"] == "default" and run["settings"]["tokenizer_vocab_size"] == 3000


@pytest.mark.slow
def test_installed_command_compiles_with_a_model_directory_and_a_trained_tokenizer(installed):
    work = installed["work"]
    model = work / "my-bert"
    model.mkdir()
    vocab = json.loads((REPO / "graphattn" / "assets" / "default-tokenizer.json").read_text())["model"]["vocab"]
    (model / "vocab.txt").write_text("".join(f"{t}\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    proc = _compile(installed, "bert", "--tokenizer", str(model))
    assert proc.returncode == 0, proc.stderr

    (work / "corpus.txt").write_text((REPO / "examples" / "data" / "corpus.txt").read_text())
    trained = subprocess.run(
        [
            str(installed["graphattn"]),
            "tokenizer",
            "train",
            "corpus.txt",
            "--vocab-size",
            "500",
            "--out",
            "mine/tokenizer.json",
        ],
        capture_output=True,
        text=True,
        env=installed["env"],
        cwd=work,
    )
    assert trained.returncode == 0, trained.stderr
    proc = _compile(installed, "trained", "--tokenizer", "mine/tokenizer.json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((work / "trained" / "run.json").read_text())["settings"]["tokenizer_vocab_size"] == 500
    hub = _compile(installed, "hub", "--tokenizer", "bert-base-uncased")
    assert hub.returncode == 2 and "save a local copy first" in hub.stderr and "Traceback" not in hub.stderr
