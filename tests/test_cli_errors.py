"""Every sub-command with bad input: one line naming the file and what was expected, the right exit
status (2 bad usage or input, 1 nothing or too little produced, 130 Ctrl-C), and never a traceback.

Most cases call `graphattn.cli.main` in this process (an exception escaping it fails the test as
a traceback would); the ones about processes (Ctrl-C, a full disk, the installed command) run
`graphattn` in a subprocess as a user does.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import run_main as _run

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "data"
TRAIN = ["train", "--schema", "wikihop", "--tokenizer", "default"]  # raw records: compiled into --out/compiled first
RECORDS = str(DATA / "wikihop_sample.json")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "notes.txt").write_text("A first sentence here. And a second one.")
    (root / "empty.json").write_text("")
    (root / "binary.html").write_bytes(bytes(range(256)) * 8)
    (root / "binary.parquet").write_bytes(bytes(range(256)) * 8)
    (root / "broken.json").write_text('{"text": "a",\n "nodes": [')
    (root / "bad.yaml").write_text("name: x\nnode_types: [oops\n")
    (root / "badtok.json").write_text('{"model": 1}')
    (root / "emptydir").mkdir()
    from graphattn.corpus.pipeline import CompileOptions, run_compile

    run_compile(
        CompileOptions(
            inputs=[str(root / "notes.txt")], schema="etc-sentences", out=str(root / "good"), progress=False
        ),
        print_fn=None,
    )
    shard = bytearray((root / "good" / "shard-00000.parquet").read_bytes())
    shard[100:2000] = bytes((b * 7 + 3) % 256 for b in shard[100:2000])  # pages garbled, footer intact
    (root / "damaged.parquet").write_bytes(bytes(shard))
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("[1, 2]")
    return root


CASES = [
    # (argv with {d} for the fixture directory, exit status, text the first error line holds)
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o", "--bogus"],
        2,
        "unrecognized arguments: --bogus",
    ),
    (["compile", "{d}/missing.txt", "--schema", "etc-sentences", "--out", "{d}/o1"], 2, "missing.txt: no such file"),
    (["compile", "{d}/notes.txt", "--schema", "hotpotq", "--out", "{d}/o2"], 2, "did you mean 'hotpotqa'?"),
    (["compile", "{d}/notes.txt", "--schema", "{d}/bad.yaml", "--out", "{d}/o3"], 2, "bad.yaml:3: not valid YAML"),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o4", "--tokenizer", "{d}/badtok.json"],
        2,
        "badtok.json: not a valid tokenizers tokenizer.json",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o5", "--tokenizer", "{d}/emptydir"],
        2,
        "emptydir: no tokenizer here: expected tokenizer.json, vocab.txt (BERT), vocab.json + merges.txt (RoBERTa), "
        "or an ETC checkpoint's vocab_bert_uncased_english.txt or one SentencePiece *.model; found nothing",
    ),
    (
        [
            "compile",
            "{d}/notes.txt",
            "--schema",
            "etc-sentences",
            "--out",
            "{d}/o6",
            "--tokenizer",
            "bert-base-uncased",
        ],
        2,
        "graphattn never downloads, so save a local copy first",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o7", "--tokenizer", "spacy:en"],
        2,
        "growing spaCy vocabulary",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o8", "--mapping", "{d}/bad.yaml"],
        2,
        "bad.yaml:3: not valid YAML/JSON",  # mapping files are read like schema files (schema_io)
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o9", "--max-rejected", "2"],
        2,
        "--max-rejected is a share of the documents, from 0 to 1",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o10", "--shard-size", "0"],
        2,
        "--shard-size must be",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/o11", "--resume"],
        2,
        "nothing to resume here",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/notes.txt"],
        2,
        "--out must be a directory",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/notes.txt/shards"],
        2,
        "notes.txt/shards: cannot write the output here: a part of the path is a file",
    ),
    (
        ["compile", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "/proc/graphattn-shards"],
        2,
        "/proc/graphattn-shards: cannot write the output here",
    ),
    (["compile", "{d}/emptydir", "--schema", "etc-sentences", "--out", "{d}/o12"], 2, "no document files found"),
    (["compile", "{d}/empty.json", "--schema", "etc-sentences", "--out", "{d}/o13"], 1, "rejected 1 document"),
    (["compile", "{d}/binary.html", "--schema", "etc-sentences", "--out", "{d}/o14"], 1, "rejected 1 document"),
    (["inspect", "{d}/missing"], 2, "no such shard file or directory"),
    (["inspect", "{d}/emptydir"], 2, "no *.parquet shards"),
    (["inspect", "{d}/binary.parquet"], 2, "binary.parquet: not a readable Parquet file"),
    (["inspect", "{d}/notes.txt"], 2, "notes.txt: not a readable Parquet file"),
    (["inspect", "{d}/o13", "--bins", "0"], 2, "--bins must be >= 1"),
    (["inspect", "{d}/damaged.parquet"], 2, "damaged.parquet: damaged shard: row group 0 cannot be read"),
    (["viz", "{d}/binary.parquet"], 2, "binary.parquet: not a readable Parquet file"),
    (["viz", "{d}/damaged.parquet"], 2, "damaged.parquet: damaged shard: row group 0 cannot be read"),
    (["viz", "{d}/broken.json", "--schema", "etc-sentences"], 2, "broken.json:2: not valid JSON"),
    (["viz", "{d}/notes.txt"], 2, "--schema is required"),
    (["viz", "{d}/notes.txt", "--schema", "etc-sentences", "--queries", "5:2"], 2, "--queries '5:2'"),
    (["viz", "{d}/notes.txt", "--schema", "etc-sentences", "--window", "3"], 2, "--window 3 is out of range"),
    (["viz", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/x.pdf"], 2, "use .png or .svg"),
    (
        ["viz", "{d}/notes.txt", "--schema", "etc-sentences", "--out", "{d}/notes.txt/x.png"],
        2,
        "a part of the path is a file",
    ),
    (["viz", "{d}/binary.html", "--schema", "etc-sentences"], 2, "binary.html"),
    (["viz", "{d}/notes.txt", "--schema", "etc-sentences", "--format", "parquet"], 2, "invalid choice: 'parquet'"),
    ([*TRAIN, "--data", "{d}/missing.json", "--out", "{d}/t1", "--steps", "1"], 2, "missing.json"),
    (
        [*TRAIN, "--data", RECORDS, "--out", "{d}/t2", "--steps", "1", "--init-from", "{d}/ckpt"],
        2,
        "config.json: config.json must hold a JSON object, got a list",
    ),
    (["tokenizer", "train", "{d}/missing.txt", "--out", "{d}/t.json"], 2, "missing.txt: no such file or directory"),
    (["tokenizer", "train", "{d}/binary.html", "--out", "{d}/t.json"], 2, "binary.html: not UTF-8 text"),
    (
        ["tokenizer", "train", "{d}/notes.txt", "--out", "{d}/t.json", "--vocab-size", "3"],
        2,
        "--vocab-size must be from 11 (the special and reserved tokens, and a piece)",
    ),
    (["tokenizer", "train", "{d}/notes.txt", "--out", "{d}/emptydir"], 2, "--out names a directory"),
    (["compil"], 2, "unknown command 'compil'; did you mean 'compile'?"),
    ([], 2, "the following arguments are required: COMMAND"),
]


@pytest.mark.parametrize(
    "argv, status, says", CASES, ids=[" ".join(a[:2]) + f" {i}" for i, (a, _, _) in enumerate(CASES)]
)
def test_bad_input_gets_one_line_and_an_exit_status(files, capsys, argv, status, says):
    code, out, err = _run(capsys, [a.replace("{d}", str(files)) for a in argv])
    assert code == status, (out, err)
    assert "Traceback" not in out + err
    assert says in err, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) <= 1 and all(len(line) < 600 for line in errors), err


def test_compile_that_rejects_everything_says_why_and_where(files, capsys):
    code, out, err = _run(
        capsys,
        [
            "compile",
            str(DATA / "hotpotqa_sample.json"),
            "--schema",
            "wikihop",
            "--out",
            str(files / "wrong-schema"),
            "-q",
        ],
    )
    assert code == 1
    assert (
        out.splitlines()[0]
        == f"compiled 0 of 2 documents; rejected 2 (see {files / 'wrong-schema' / 'rejected.jsonl'})"
    )
    lines = err.splitlines()
    assert lines[0] == "rejected 2 documents:"
    assert "node type 'question' is not declared in schema 'wikihop'" in lines[1]
    assert f"every rejected document, with where it is and why: {files / 'wrong-schema' / 'rejected.jsonl'}" in err
    assert lines[-1] == "error: no instance was compiled from 2 documents; check --schema and --format against the data"


def test_rejected_share_over_max_rejected_fails_and_singular_counts(files, capsys):
    docs = files / "mixed"
    docs.mkdir()
    (docs / "a.txt").write_text("One good sentence. And one more.")
    (docs / "b.txt").write_text("   ")  # empty: rejected
    argv = ["compile", str(docs), "--schema", "etc-sentences", "-q"]
    code, out, err = _run(capsys, [*argv, "--out", str(files / "mixed-out")])
    assert code == 1 and "compiled 1 of 2 documents; rejected 1" in out
    assert "1 instance (0 truncated) in 1 shard under" in out
    assert (
        "rejected 1 document:" in err and "rejected 50% of the documents, more than --max-rejected 0.25 allows" in err
    )
    code, out, err = _run(capsys, [*argv, "--out", str(files / "mixed-out-2"), "--max-rejected", "0.5"])
    assert code == 0 and "error:" not in err
    code, out, _ = _run(capsys, ["inspect", str(files / "mixed-out-2"), "--instance", "-1", "--label-instances", "0"])
    assert code == 0 and "compiled 1 of 2 documents; rejected 1" in out  # inspect agrees with the summary


# -- processes: the installed command, Ctrl-C, a full disk ------------------------------------------
def _command(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["graphattn", *argv], capture_output=True, text=True, timeout=300, **kw)


def test_installed_command_reports_bad_input_without_a_traceback(files):
    for argv, status, says in [
        (
            ["compile", str(files / "notes.txt"), "--schema", "nope", "--out", str(files / "p1")],
            2,
            "shipped: etc-sentences",
        ),
        (["inspect", str(files / "binary.parquet")], 2, "not a readable Parquet file"),
        (["viz", str(files / "broken.json"), "--schema", "etc-sentences"], 2, "not valid JSON"),
        (
            ["compile", str(files / "empty.json"), "--schema", "etc-sentences", "--out", str(files / "p2"), "-q"],
            1,
            "no instance",
        ),
    ]:
        proc = _command(*argv)
        assert proc.returncode == status, proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr and says in proc.stderr


def _interrupt(argv: list[str], ready, env=None) -> subprocess.CompletedProcess:
    """Start `graphattn argv` in its own process group, wait for `ready()`, then Ctrl-C the group."""
    proc = subprocess.Popen(
        ["graphattn", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    deadline = time.monotonic() + 120
    try:
        while not ready(proc):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "never got going"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    docs = tmp_path_factory.mktemp("many")
    for i in range(40):
        (docs / f"d{i:02d}.txt").write_text(f"Sentence number {i} is here. And another one follows it.")
    return docs


@pytest.mark.slow
def test_ctrl_c_in_a_parallel_compile_is_one_message_and_130(many, tmp_path):
    out = tmp_path / "shards"
    done = lambda proc: len(glob.glob(str(out / "*.done.json"))) >= 2  # noqa: E731
    argv = ["compile", str(many), "--schema", "etc-sentences", "--out", str(out), "--shard-size", "2", "--workers", "2"]
    proc = _interrupt([*argv, "-q"], done, env={"GRAPHATTN_COMPILE_THROTTLE": "0.3"})
    assert proc.returncode == 130
    assert "Traceback" not in proc.stdout + proc.stderr  # the workers leave Ctrl-C to the driver
    assert "interrupted; finished shards are kept" in proc.stderr and "--resume" in proc.stderr


@pytest.mark.slow
def test_ctrl_c_in_train_is_130_without_a_traceback(tmp_path):
    lines: list[str] = []

    def started(proc) -> bool:
        lines.append(proc.stdout.readline())
        return "training instances" in lines[-1]

    tiny = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "2", "-q"]
    argv = [*TRAIN, "--data", RECORDS, "--out", str(tmp_path / "run"), "--steps", "100000", *tiny]
    proc = _interrupt(argv, started)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "interrupted" in proc.stderr


# A child that runs graphattn with os.fsync failing as a full disk does, from its N-th call on
# (write_atomic fsyncs once per file: run.json, then shard 0, marker 0, shard 1, marker 1, ...).
FULL_DISK = """
import errno, os, sys
real, calls, fail_from = os.fsync, [0], int(sys.argv[1])
def fsync(fd):
    calls[0] += 1
    if calls[0] >= fail_from:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(fd)
os.fsync = fsync
from graphattn.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("fail_from, what", [(4, "shard 1"), (3, "marker 0")])
def test_full_disk_is_one_line_and_leaves_nothing_that_looks_complete(many, tmp_path, fail_from, what):
    from graphattn.corpus.output import OutputDir

    out = tmp_path / "shards"
    argv = ["compile", str(many), "--schema", "etc-sentences", "--out", str(out), "--shard-size", "10", "-q"]
    child = [sys.executable, "-c", FULL_DISK, str(fail_from), *argv]
    proc = subprocess.run(child, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert (
        line.startswith("graphattn compile: error: ") and "disk full: writing it needs" in line and "free there" in line
    )
    assert str(out / "shard-0000") in line
    assert not list(out.glob("*.tmp-*"))  # no half-written file under any name
    run = OutputDir(out)
    for shard in out.glob("shard-*.parquet"):  # every shard left is complete and has its marker
        assert run.is_done(int(shard.stem.split("-")[1])), shard
    assert len(list(out.glob("shard-*.parquet"))) == (1 if what == "shard 1" else 0)


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir()
    try:
        return (
            subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode
            == 0
        )
    except OSError:
        return False


@pytest.mark.slow
def test_a_real_full_disk_and_a_read_only_file_system(many, tmp_path):
    small, read_only = tmp_path / "small", tmp_path / "read-only"
    if not _mount_tmpfs(small, "size=96k"):
        pytest.skip("cannot mount a tmpfs here (needs root); the injected ENOSPC test covers the logic")
    try:
        proc = _command(
            "compile", str(many), "--schema", "etc-sentences", "--out", str(small / "shards"), "--shard-size", "2", "-q"
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
        assert "disk full" in proc.stderr and len(proc.stderr.splitlines()) == 1
        assert not list((small / "shards").glob("*.tmp-*"))
        if _mount_tmpfs(read_only, "ro,size=16k"):
            proc = _command("compile", str(many), "--schema", "etc-sentences", "--out", str(read_only / "shards"), "-q")
            assert (
                proc.returncode == 2
                and "the file system is read-only" in proc.stderr
                and "Traceback" not in proc.stderr
            )
    finally:
        for mount in (small, read_only):
            subprocess.run(["umount", str(mount)], capture_output=True)


def test_version_and_help_name_the_defaults_and_an_example(capsys):
    import graphattn

    code, out, _ = _run(capsys, ["--version"])
    assert code == 0 and out.strip() == f"graphattn {graphattn.__version__}"
    code, out, _ = _run(capsys, ["compile", "--help"])
    words = " ".join(out.split())  # help text wraps at the terminal's width
    assert (
        code == 0
        and "example:\n  graphattn compile" in out
        and "(default: 0.25)" in words
        and "(default: 1000)" in words
    )
    for command in ("inspect", "viz", "train", "tokenizer"):
        code, out, _ = _run(capsys, [command, "--help"])
        assert code == 0 and f"example:\n  graphattn {command}" in out, command
    for command in ("compile", "inspect", "viz", "train"):
        code, out, _ = _run(capsys, [command, "--help"])
        assert "-q, --quiet" in out and "-v, --verbose" in out, command
    code, out, _ = _run(capsys, ["tokenizer", "train", "--help"])
    assert "-q, --quiet" in out and "(default: 8000)" in " ".join(out.split())


@pytest.mark.parametrize("argv", [["--help"], ["compile", "--help"], ["inspect", "--help"]])
def test_help_does_not_import_torch(argv):
    code = (
        "import sys; from graphattn.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pyarrow', 'matplotlib', 'tokenizers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1].replace("'", '"')) == []


def test_bad_flag_shows_the_sub_commands_usage(files, capsys):
    code, _, err = _run(capsys, ["inspect", str(files), "--nope"])
    assert code == 2 and err.startswith("usage: graphattn inspect") and "unrecognized arguments: --nope" in err


def test_full_disk_message_names_the_space_needed(tmp_path):
    from graphattn.corpus.output import OutputError, writing

    with pytest.raises(
        OutputError, match=r"shard\.parquet: disk full: writing it needs 2\.5 MB, [\d,.]+ \S+ free there"
    ):
        with writing(tmp_path / "shard.parquet", 2_500_000):
            raise OSError(errno.ENOSPC, "No space left on device")


def test_encoding_and_errors_reach_the_html_reader(tmp_path, capsys):
    from graphattn.shards.dataset import ShardDataset

    page = tmp_path / "latin.html"
    page.write_bytes("<html><body><p>Café crème. A second sentence.</p></body></html>".encode("windows-1252"))

    def compile_with(*flags: str) -> tuple[int, str, str]:
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        code, _, err = _run(capsys, ["compile", str(page), "--schema", "openkp-dom", "--out", str(out), "-q", *flags])
        return code, out, err

    code, out, _ = compile_with()  # nothing declared, not UTF-8: windows-1252, as browsers read it
    assert code == 0 and "Café crème" in ShardDataset(out)[0].texts[0]
    code, out, err = compile_with("--encoding", "utf-8")  # strict: the page is refused, and says why
    assert code == 1 and "is not valid utf-8" in err
    code, out, _ = compile_with("--encoding", "utf-8", "--errors", "replace")
    assert code == 0 and "Caf\ufffd cr\ufffdme" in ShardDataset(out)[0].texts[0]
    code, _, err = compile_with("--encoding", "utf8x")  # a wrong label is one usage error, not a rejected page each
    assert code == 2 and "--encoding: unknown encoding 'utf8x'" in err and "did you mean" in err
    code, out, err = _run(
        capsys,
        [
            "viz",
            str(page),
            "--schema",
            "openkp-dom",
            "--encoding",
            "utf-8",
            "--errors",
            "replace",
            "--queries",
            "l0:l3",
            "--keys",
            "l0:l3",
            "--style",
            "plain",
        ],
    )
    assert code == 0 and "L0 Caf " in out  # (BERT normalization drops U+FFFD from the tokens; the text keeps it)


def test_api_papercuts_say_what_was_expected():
    import graphattn
    from graphattn.errors import CompileError, GraphError

    with pytest.raises(CompileError, match="expected a DocGraph or a list of DocGraphs, got dict; DocGraph.from_dict"):
        graphattn.compile_instance({"text": "a", "nodes": [], "edges": []}, "etc-sentences", "default")
    with pytest.raises(GraphError, match=r"node 's': span \[5, 2\) ends before it starts"):
        graphattn.DocGraph.from_dict(
            {"text": "hello world", "nodes": [{"id": "s", "type": "sentence", "span": [5, 2]}], "edges": []}
        )
    sentence = {"id": "s", "type": "sentence", "span": [0, 11]}
    graph = graphattn.DocGraph.from_dict({"text": "A sentence.", "nodes": [sentence], "edges": []})
    instance = graphattn.compile_instance(graph, "etc-sentences", "default")
    assert "\n" not in repr(instance) and len(repr(instance)) < 120  # a one-line summary, not the arrays
