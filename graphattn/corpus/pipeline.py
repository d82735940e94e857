"""Compile a corpus into shards: plan in the driver, compile shards in workers, write atomically.

    run_compile(CompileOptions(inputs=["data/"], schema="hotpotqa", out="shards/",
                               tokenizer="tokenizer.json", workers=4))

The driver expands the inputs, numbers every document in input order and cuts the numbers into
shards of `shard_size` documents (`plan`). Each shard is compiled by one worker (a local process
pool by default, Ray actors with ``engine="ray"``) into Parquet bytes, written atomically and
followed by the shard's done-marker: by the driver for the local pool, by the Ray actors
themselves on a cluster (the driver then only counts). Since shard contents follow from the document
numbers alone, the bytes are the same for any number of workers and for either engine, and a
killed run resumes (``resume=True``) by compiling only the shards without a valid marker.

The local engine never imports Ray.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import graphattn
from graphattn.corpus.output import OutputDir, documents_line, plural
from graphattn.corpus.sources import (
    DEFAULT_MAX_REJECTED,
    DEFAULT_SHARD_SIZE,
    FORMATS,
    InputFile,
    expand_inputs,
    import_readers,
    plan_file,
    segment_of,
)
from graphattn.corpus.worker import ShardResult, ShardTask, ShardWritten, WorkerState, compile_shard
from graphattn.errors import GraphattnError
from graphattn.shards.format import COMPRESSION, COMPRESSION_LEVEL, FORMAT, ROWS_PER_GROUP, ShardColumns
from graphattn.shards.runfile import RUN_FORMAT  # run.json's format and version (read by version there)

THROTTLE_ENV = "GRAPHATTN_COMPILE_THROTTLE"  # seconds to sleep after each shard write (tests interrupt runs with it)


@dataclass
class CompileOptions:
    """Everything `graphattn compile` takes. Only some of it shapes the output (see `settings`)."""

    inputs: list[str]
    schema: str
    out: str
    tokenizer: str | None = None
    workers: int | None = None  # local: 1 when None; ray: every CPU of the Ray instance or cluster
    engine: str = "local"
    ray_address: str | None = None
    resume: bool = False
    shard_size: int = DEFAULT_SHARD_SIZE
    format: str = "auto"
    mapping: str | None = None
    progress: bool = True
    max_rejected: float = DEFAULT_MAX_REJECTED  # share of documents rejected before the run counts as failed
    html_options: dict[str, Any] = field(default_factory=dict)  # read_html options (encoding, errors)
    strict: bool = False  # a label that matches nothing rejects its document (else it goes to warnings.jsonl)
    sets: list[str] = field(default_factory=list)  # --set KEY=VALUE schema overrides (graphattn.schema.overrides)


@dataclass
class Summary:
    """What a run produced, over every shard of the directory (a resumed run's earlier ones too)."""

    documents: int = 0
    instances: int = 0
    truncated: int = 0
    rejected: int = 0
    warnings: int = 0  # labels that matched nothing (warnings.jsonl)
    long_tokens: int = 0
    global_tokens: int = 0
    shards: int = 0
    shards_resumed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    compiled_documents: int = 0  # documents compiled by this invocation (not by the run resumed)
    compiled_tokens: int = 0
    skipped_files: list[str] = field(default_factory=list)
    out: str = ""
    max_rejected: float = DEFAULT_MAX_REJECTED
    reasons: list[str] = field(default_factory=list)  # every rejection message, in input order

    @property
    def rejected_file(self) -> Path:
        return Path(self.out) / "rejected.jsonl"

    @property
    def too_many_rejected(self) -> bool:
        return self.documents > 0 and self.rejected / self.documents > self.max_rejected

    @property
    def failed(self) -> bool:
        """Nothing compiled, or more rejected than --max-rejected allows: the command exits 1."""
        return self.instances == 0 or self.too_many_rejected

    def lines(self) -> list[str]:
        rate = lambda n: n / self.seconds if self.seconds > 0 else 0.0  # noqa: E731
        out = [
            documents_line(self.documents, self.rejected) + (f" (see {self.rejected_file})" if self.rejected else ""),
            f"  {plural(self.instances, 'instance')} ({self.truncated:,} truncated) in {plural(self.shards, 'shard')} "
            f"under {self.out}",
            f"  {plural(self.warnings, 'label')} matched nothing"
            + (f" (see {Path(self.out) / 'warnings.jsonl'})" if self.warnings else ""),
            f"  {self.long_tokens:,} long and {self.global_tokens:,} global tokens; "
            f"{self.bytes / 1e6:.2f} MB"
            + (f", {self.bytes / self.long_tokens:.2f} bytes per long token" if self.long_tokens else ""),
            f"  this run: {plural(self.compiled_documents, 'document')} in {self.seconds:.1f} s, "
            f"{rate(self.compiled_documents):,.1f} docs/s, {rate(self.compiled_tokens):,.0f} tokens/s",
        ]
        if self.shards_resumed:
            out.append(f"  resumed: {self.shards_resumed} of {plural(self.shards, 'shard')} were already complete")
        if self.skipped_files:
            shown = ", ".join(self.skipped_files[:5]) + (" ..." if len(self.skipped_files) > 5 else "")
            files = plural(len(self.skipped_files), "file")
            out.append(f"  skipped {files} with unknown suffixes in input directories: {shown}")
        return out

    def problem_lines(self, reasons: int | None = 3) -> list[str]:
        """For stderr: the first `reasons` rejections (None: all), and why the run failed if it did."""
        out = []
        if self.rejected:
            shown = self.reasons if reasons is None else self.reasons[:reasons]
            first = f"; the first {len(shown)}:" if len(shown) < self.rejected else ":"
            out.append(f"rejected {plural(self.rejected, 'document')}{first}")
            out += [f"  {_one_line(reason)}" for reason in shown]
            out.append(f"  every rejected document, with where it is and why: {self.rejected_file}")
        if self.instances == 0:
            hint = "check --schema and --format against the data" if self.documents else "the inputs hold no document"
            out.append(f"error: no instance was compiled from {plural(self.documents, 'document')}; {hint}")
        elif self.too_many_rejected:
            out.append(
                f"error: rejected {self.rejected / self.documents:.0%} of the documents, "
                f"more than --max-rejected {self.max_rejected:g} allows"
            )
        return out


def _one_line(text: str, width: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# -- preparing a run -------------------------------------------------------------------------
def _file_sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _load_fixed_tokenizer(spec: str | None):
    """The run's tokenizer and a fingerprint of everything that decides its ids."""
    from graphattn.tokenize import HFTokenizer, load_tokenizer
    from graphattn.tokenize.files import DEFAULT_TOKENIZER

    if spec is not None and spec.startswith("spacy:"):
        raise GraphattnError(
            f"--tokenizer {spec}: a growing spaCy vocabulary numbers words in the order it meets them, which differs "
            "between workers and resumed runs; give a fixed tokenizer (a tokenizer.json or a model directory) instead"
        )
    tokenizer = load_tokenizer(DEFAULT_TOKENIZER if spec is None else spec)
    if not isinstance(tokenizer, HFTokenizer):
        raise GraphattnError(
            f"--tokenizer {spec}: compile needs a fixed vocabulary (a tokenizer.json or a model directory)"
        )
    return tokenizer, hashlib.sha256(tokenizer.tokenizer.to_str().encode()).hexdigest()


@dataclass
class Run:
    """A planned run: worker state, shard tasks, and what run.json records."""

    state: WorkerState
    tasks: list[ShardTask]
    files: list[InputFile]
    skipped: list[str]
    documents: int

    def manifest(self) -> dict[str, Any]:
        return {
            "format": RUN_FORMAT,
            "settings": self.state.settings,
            "inputs": [f.fingerprint() for f in self.files],
            "documents": self.documents,
            "shards": len(self.tasks),
        }


def plan_run(options: CompileOptions) -> Run:
    """Load schema and tokenizer, plan the inputs, cut them into shard tasks (no compiling yet)."""
    from graphattn.compile.compiler import special_token_ids
    from graphattn.schema import load_effective_schema

    if options.shard_size < 1:
        raise GraphattnError(f"--shard-size must be at least 1 document, got {options.shard_size}")
    if options.workers is not None and options.workers < 1:
        raise GraphattnError(f"--workers must be at least 1, got {options.workers}")
    if options.format not in FORMATS:
        raise GraphattnError(f"--format must be one of {', '.join(FORMATS)}, got {options.format!r}")
    if options.html_options.get("encoding") is not None:  # a wrong label: one mistake of the command, not one per page
        from graphattn.ingest.encoding import sniff_encoding

        try:
            sniff_encoding(b"", encoding=options.html_options["encoding"])
        except GraphattnError as err:
            raise GraphattnError(f"--encoding: {err.reason}") from None
    if not 0.0 <= options.max_rejected <= 1.0:
        raise GraphattnError(f"--max-rejected is a share of the documents, from 0 to 1; got {options.max_rejected:g}")
    schema, schema_text = load_effective_schema(options.schema, options.sets)  # the text after --set is recorded
    tokenizer, tokenizer_sha256 = _load_fixed_tokenizer(options.tokenizer)
    mapping = None
    if options.mapping is not None:
        from graphattn.ingest.mapping import load_mapping

        mapping = load_mapping(options.mapping)
    files, skipped = expand_inputs(list(options.inputs))
    planned = [plan_file(path, options.format, options.mapping) for path in files]
    import_readers({f.format for f in planned})
    settings = {
        "graphattn_version": graphattn.__version__,
        "shard_format": FORMAT,
        "inputs": list(options.inputs),
        "files": files,
        "format": options.format,
        "mapping": options.mapping,
        "mapping_sha256": _file_sha256(options.mapping) if options.mapping else None,
        "html_options": dict(sorted(options.html_options.items())),
        "schema": options.schema,
        "schema_name": schema.name,
        "schema_sha256": hashlib.sha256(schema_text.encode()).hexdigest(),
        "tokenizer": options.tokenizer or "default",
        "tokenizer_sha256": tokenizer_sha256,
        "tokenizer_vocab_size": tokenizer.vocab_size,
        "special_token_ids": special_token_ids(schema, tokenizer),  # the schema's token names, resolved
        "shard_size": options.shard_size,
        "packing": schema.max_documents > 1,
        "strict": options.strict,
        "rows_per_row_group": ROWS_PER_GROUP,
        "compression": f"{COMPRESSION}:{COMPRESSION_LEVEL}",
    }
    state = WorkerState(
        schema=schema,
        tokenizer=tokenizer,
        schema_text=schema_text,
        settings=settings,
        layout=ShardColumns.for_run(schema, tokenizer.vocab_size),
        mapping=mapping,
        html_options=dict(options.html_options),
        strict=options.strict,
    )
    tasks = plan(planned, options.shard_size)
    return Run(state, tasks, planned, skipped, sum(f.documents for f in planned))


def plan(files: list[InputFile], shard_size: int) -> list[ShardTask]:
    """Cut the numbered documents into shards of `shard_size` (the last may be shorter)."""
    tasks: list[ShardTask] = []
    segments: list = []
    shard_first = number = 0
    for file in files:
        start = 0
        while start < file.documents:
            take = min(file.documents - start, shard_first + shard_size - number)
            segments.append(segment_of(file, start, start + take, number))
            start += take
            number += take
            if number - shard_first == shard_size:
                tasks.append(ShardTask(len(tasks), shard_first, shard_size, tuple(segments)))
                segments, shard_first = [], number
    if segments:
        tasks.append(ShardTask(len(tasks), shard_first, number - shard_first, tuple(segments)))
    return tasks


# -- the local engine: a process pool ----------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(state: WorkerState, progress_queue) -> None:
    # Ctrl-C reaches the whole process group; the driver alone answers it (it stops the pool and
    # says how to resume), so a worker ignores it instead of printing its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the pool ends its workers with SIGTERM: no Python handler
    _WORKER["state"], _WORKER["queue"] = state, progress_queue


def _run_in_worker(task: ShardTask) -> ShardResult:
    progress_queue = _WORKER["queue"]
    return compile_shard(task, _WORKER["state"], lambda docs, tokens: progress_queue.put((docs, tokens)))


def run_local(
    tasks: list[ShardTask], state: WorkerState, out: OutputDir, workers: int, progress: Callable[[int, int], None]
) -> Iterator[ShardWritten]:
    """Compile shards in `workers` processes (in this process when 1), and write each as it finishes."""
    for result in _compile_local(tasks, state, workers, progress):
        out.write_shard(result.index, result.data, result.sha256, result.rejected, result.stats, result.warnings)
        yield ShardWritten(result.index, result.stats)


def _compile_local(
    tasks: list[ShardTask], state: WorkerState, workers: int, progress: Callable[[int, int], None]
) -> Iterator[ShardResult]:
    if workers == 1 or len(tasks) <= 1:
        for task in tasks:
            yield compile_shard(task, state, progress)
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    progress_queue = ctx.Queue()
    pending: set[Future] = set()
    todo = iter(tasks)
    with ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), mp_context=ctx, initializer=_init_worker, initargs=(state, progress_queue)
    ) as pool:
        try:
            while True:
                while len(pending) < 2 * workers and (task := next(todo, None)) is not None:
                    pending.add(pool.submit(_run_in_worker, task))
                if not pending:
                    break
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(progress_queue, progress)
                for future in done:
                    yield future.result()
            _drain(progress_queue, progress)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _drain(progress_queue, progress: Callable[[int, int], None]) -> None:
    while True:
        try:
            docs, tokens = progress_queue.get_nowait()
        except queue.Empty:
            return
        progress(docs, tokens)


# -- the driver ----------------------------------------------------------------------------------
class _Progress:
    """tqdm bar over documents, with tokens and tokens/s in its postfix."""

    def __init__(self, total: int, done: int, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=done,
            unit="doc",
            desc="compile",
            disable=not enabled,
            dynamic_ncols=True,
            file=sys.stderr,
            smoothing=0.1,
        )
        self.tokens = 0
        self.start = time.perf_counter()

    def __call__(self, docs: int, tokens: int) -> None:
        self.tokens += tokens
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens:,} tok, {self.tokens / elapsed:,.0f} tok/s", refresh=False)
        self.bar.update(docs)

    def close(self) -> None:
        self.bar.close()


def _engine(options: CompileOptions) -> Callable[..., Iterable[ShardWritten]]:
    if options.engine == "local":
        if options.ray_address:
            raise GraphattnError("--ray-address applies to --engine ray only")
        return lambda tasks, state, out, progress: run_local(tasks, state, out, options.workers or 1, progress)
    if options.engine == "ray":
        from graphattn.corpus.ray_engine import run_ray

        return lambda tasks, state, out, progress: run_ray(
            tasks, state, out, options.workers, options.ray_address, progress
        )
    raise GraphattnError(f"--engine must be local or ray, got {options.engine!r}")


def run_compile(
    options: CompileOptions,
    print_fn: Callable[[str], None] | None = print,
    on_shard: Callable[[ShardWritten], None] | None = None,
) -> Summary:
    """Compile (or finish compiling, with `resume`) a corpus; returns the closing summary.

    `on_shard(written)` is called as each shard is on disk (its index, counts and where it was made).
    """
    started = time.perf_counter()
    engine = _engine(options)
    run = plan_run(options)
    out = OutputDir(Path(options.out))
    lock = out.lock()
    try:
        return _compile_locked(options, run, out, engine, started, print_fn, on_shard)
    finally:
        lock.release()


def _compile_locked(
    options: CompileOptions,
    run: Run,
    out: OutputDir,
    engine: Callable[..., Iterable[ShardWritten]],
    started: float,
    print_fn: Callable[[str], None] | None,
    on_shard: Callable[[ShardWritten], None] | None,
) -> Summary:
    done = out.start(run.manifest(), options.resume)
    todo = [task for task in run.tasks if task.index not in done]
    done_documents = sum(task.documents for task in run.tasks if task.index in done)
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    progress = _Progress(run.documents, done_documents, options.progress)
    summary = Summary(
        shards=len(run.tasks),
        shards_resumed=len(done),
        skipped_files=run.skipped,
        out=str(out.path),
        max_rejected=options.max_rejected,
    )
    try:
        for written in engine(todo, run.state, out, progress):  # each shard is on disk by now
            summary.compiled_documents += written.stats["documents"]
            summary.compiled_tokens += written.stats["long_tokens"]
            if on_shard is not None:
                on_shard(written)
            if throttle:
                time.sleep(throttle)
    finally:
        progress.close()
    summary.rejected = out.finish(len(run.tasks))
    summary.warnings = out.warned
    for marker in out.markers(len(run.tasks)):
        stats = marker["stats"]
        summary.documents += stats["documents"]
        summary.instances += stats["instances"]
        summary.truncated += stats["truncated"]
        summary.long_tokens += stats["long_tokens"]
        summary.global_tokens += stats["global_tokens"]
        summary.bytes += marker["bytes"]
        summary.reasons += [entry["message"] for entry in marker["rejected"]]
    summary.seconds = time.perf_counter() - started
    if print_fn is not None:
        for line in summary.lines():
            print_fn(line)
    return summary
