"""A trained run's answers for new documents: `Predictor` (and `graphattn predict`).

    predictor = Predictor.from_run("runs/hotpotqa", device="cpu", batch_size=8)
    for record in predictor.predict(["dev.json"]):      # raw records, or compiled shards
        print(record["id"], record["answer"]["text"], record["supporting"]["facts"])

Raw documents (every input `graphattn compile` reads: files, directories, globs; Python record
dicts and DocGraphs too) are compiled with the run's own schema (run.json's `schema_text`) and
tokenizer (the copy `train` keeps in the run directory, else the path run.json names; checked
against the sha256 run.json records), a shard of documents at a time by the compiler's own
worker code, so predicting from records and from the shards
`graphattn compile` makes of them gives the same records. Compiled shards are checked against
the run first (`graphattn.train.run_match`): shards compiled with another schema setting or
tokenizer are refused in one line.

`predict` is a generator: instances are read, batched and decoded as they come, a document's
instances (its windows) are merged into one record as soon as its last one is decoded
(`graphattn.train.predict_records`), so memory stays bounded by a shard of documents whatever the
input size. A tqdm bar counts documents; `stats` says how many were predicted and which were
rejected (a record that does not compile), and a line with documents/s ends the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphattn.errors import GraphattnError
from graphattn.train.spans import DEFAULT_N_BEST, MAX_ANSWER_LENGTH_LIMIT, MAX_N_BEST

MAX_BATCH_SIZE = 65_536
PREDICT_SHARD_SIZE = 256  # raw documents compiled (and held) at a time
PYTHON_SOURCE = "<python>"  # the source of documents given as Python records


@dataclass
class PredictionStats:
    """What one `predict` call did: documents predicted, documents that did not compile."""

    documents: int = 0  # documents read (predicted + rejected)
    predicted: int = 0
    rejected: list[dict] = field(default_factory=list)  # rejected.jsonl-style entries: source, doc_id, message
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.predicted / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return f"predicted {self.predicted:,} of {self.documents:,} document(s) in {self.seconds:.1f} s, " + (
            f"{self.rate:,.1f} documents/s"
        )


def _tokenizer_sha256(tokenizer: Any) -> str:
    return hashlib.sha256(tokenizer.tokenizer.to_str().encode()).hexdigest()


def run_tokenizer(run: dict, run_file: str, override: str | None = None) -> str | None:
    """The tokenizer spec to compile raw documents with: `override`, else the run's own copy
    (RUN/tokenizer.json, kept by `graphattn train`), else the path run.json records (or
    "default"); checked against the run's tokenizer sha256 when it records one. None for the
    compiler's default."""
    from graphattn.tokenize import load_tokenizer
    from graphattn.train.rundir import TOKENIZER_FILE

    kept = Path(run_file).parent / TOKENIZER_FILE
    if override is not None:
        spec, flag = override, "tokenizer"
    elif kept.is_file():
        spec, flag = str(kept), "the run's tokenizer"
    else:
        spec, flag = run.get("tokenizer"), f"{run_file}: tokenizer"
    if spec is None:
        raise GraphattnError(
            f"{run_file} records no tokenizer (its shards were written from Python): give the tokenizer the shards "
            "were compiled with (--tokenizer / tokenizer=), or predict on compiled shards"
        )
    if spec != "default" and not os.path.exists(spec):
        raise GraphattnError(
            f"{flag} {spec!r}: no such file or directory here (the run records the path it was compiled with); "
            f"give it with --tokenizer / tokenizer= (or copy it to {kept}), or predict on compiled shards"
        )
    sha = run.get("tokenizer_sha256")
    if isinstance(sha, str):
        try:
            found = _tokenizer_sha256(load_tokenizer(spec))
        except GraphattnError as err:
            raise GraphattnError(f"{flag} {spec!r}: {err.reason}") from None
        if found != sha:
            raise GraphattnError(
                f"{flag} {spec!r} is not the tokenizer the run was trained with (sha256 {found[:12]}..., the run's "
                f"{sha[:12]}...): give the run's tokenizer"
            )
    return None if spec == "default" else spec


def _is_shards(item: Any) -> bool:
    from graphattn.train.cli import is_shard_source

    return isinstance(item, (str, os.PathLike)) and is_shard_source(str(item))


class Predictor:
    """A trained TaskModel with what it needs to read new documents (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        run: dict,
        *,
        device: str = "cpu",
        batch_size: int = 8,
        tokenizer: str | None = None,
        n_best: int = DEFAULT_N_BEST,
        max_answer_length: int | None = None,
        progress: bool = True,
        print_fn: Callable[[str], None] | None = None,
    ):
        from graphattn.train.finetune import schema_from_text
        from graphattn.train.rundir import RUN_FILE

        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise GraphattnError(f"batch_size must be in [1, {MAX_BATCH_SIZE:,}], got {batch_size}")
        if not 1 <= n_best <= MAX_N_BEST:
            raise GraphattnError(f"n_best must be in [1, {MAX_N_BEST}], got {n_best}")
        if max_answer_length is not None and not 1 <= max_answer_length <= MAX_ANSWER_LENGTH_LIMIT:
            raise GraphattnError(
                f"max_answer_length must be in [1, {MAX_ANSWER_LENGTH_LIMIT:,}] tokens, got {max_answer_length}"
            )
        self.model, self.run, self.device = model, run, device
        self.batch_size, self.n_best, self.max_answer_length = batch_size, n_best, max_answer_length
        self.run_file = str(Path(run["checkpoint"]).parent / RUN_FILE)
        self.schema = schema_from_text(run["schema_text"], self.run_file)
        self.specs = {name: head.spec for name, head in model.targets.items()}
        self.tokenizer = tokenizer
        self.progress = progress
        self.print_fn = print_fn if print_fn is not None else (lambda line: print(line, file=sys.stderr))
        self.stats = PredictionStats()

    @classmethod
    def from_run(
        cls,
        path: str | os.PathLike,
        device: str = "cpu",
        batch_size: int = 8,
        *,
        tokenizer: str | None = None,
        n_best: int = DEFAULT_N_BEST,
        max_answer_length: int | None = None,
        progress: bool = True,
        trust_undigested: bool = False,
        print_fn: Callable[[str], None] | None = None,
    ) -> Predictor:
        """The newest checkpoint of a `graphattn train --out` directory (or a checkpoint inside one)."""
        from graphattn.train.evaluate import check_device
        from graphattn.train.finetune import load_task_model

        if not Path(path).exists():
            raise GraphattnError(f"--model {path}: no such directory")
        check_device(device)
        model, run = load_task_model(path, device, trust_undigested=trust_undigested)
        return cls(
            model,
            run,
            device=device,
            batch_size=batch_size,
            tokenizer=tokenizer,
            n_best=n_best,
            max_answer_length=max_answer_length,
            progress=progress,
            print_fn=print_fn,
        )

    # -- the stream of (document head, instance) ------------------------------------------------------
    def _check_packing(self, where: str) -> None:
        if self.schema.max_documents > 1:
            raise GraphattnError(
                f"the run's schema {self.schema.name!r} packs up to {self.schema.max_documents} documents per "
                "instance; predict answers per document: compile with packing off",
                file=where,
            )

    def _shard_instances(self, source: str, verify_sha256: bool) -> Iterator[tuple[tuple, dict, Any]]:
        from graphattn.shards.dataset import ShardDataset
        from graphattn.train.finetune import open_shards
        from graphattn.train.run_match import check_shards_fit_run

        shards = open_shards(source, verify_sha256=verify_sha256)
        check_shards_fit_run(self.run, shards, flag="the inputs", where=self.run_file)
        dataset = ShardDataset(shards.paths, compact=True, classes=shards.classes, verify_sha256=verify_sha256)
        for i in range(len(dataset)):  # one instance at a time: the batcher groups them
            where = dataset.provenance(i)
            inst = dataset[i]
            if len(where.doc_numbers) > 1:
                self._check_packing(shards.paths[0])
            head = {
                "id": inst.doc_ids[0],
                "document": where.doc_numbers[0],
                "source": where.sources[0],
            }
            if where.lines[0] is not None:
                head["line"] = where.lines[0]
            yield (source, head["document"]), head, inst

    def _raw_instances(self, inputs: list[str], format: str) -> Iterator[tuple[tuple, dict, Any]]:
        from graphattn.corpus.pipeline import CompileOptions, plan_run
        from graphattn.corpus.worker import compile_shard

        self._check_packing(self.run_file)
        tokenizer = run_tokenizer(self.run, self.run_file, self.tokenizer)
        with tempfile.TemporaryDirectory(prefix="graphattn-predict-") as tmp:
            text = self.run["schema_text"]
            schema_file = Path(tmp) / ("schema.json" if text.lstrip().startswith("{") else "schema.yaml")
            schema_file.write_text(text, encoding="utf-8")
            planned = plan_run(
                CompileOptions(
                    inputs=inputs,
                    schema=str(schema_file),
                    out=tmp,
                    tokenizer=tokenizer,
                    format=format,
                    shard_size=PREDICT_SHARD_SIZE,
                )
            )
            if planned.skipped and not planned.files:
                raise GraphattnError(f"{inputs[0]}: no document file in it (skipped {planned.skipped[0]})")
            self._total = (self._total or 0) + planned.documents
            state = planned.state
            for task in planned.tasks:
                result = compile_shard(task, state)
                self.stats.rejected.extend(result.rejected)
                self.stats.documents += len(result.rejected)
                self._advance(len(result.rejected))
                if result.stats["instances"] == 0:
                    continue
                path = Path(tmp) / f"shard-{task.index:05d}.parquet"
                path.write_bytes(result.data)
                try:
                    yield from self._shard_instances(str(path), verify_sha256=False)
                finally:
                    path.unlink()

    def _instances(self, documents: Any, format: str, verify_sha256: bool) -> Iterator[tuple[tuple, dict, Any]]:
        single = isinstance(documents, (str, os.PathLike, dict)) or _is_graph(documents)
        items = iter([documents] if single else documents)
        first = next(items, None)
        if first is None:
            raise GraphattnError("no documents to predict")
        if not isinstance(first, (str, os.PathLike)):
            yield from self._object_instances(itertools.chain([first], items), format)
            return
        paths = [str(first), *map(str, items)]
        from graphattn.train.arguments import path_exists

        missing = next((p for p in paths if not path_exists(p)), None)
        if missing is not None:
            raise GraphattnError(f"{missing}: no such file or directory (nor a glob that matches one)")
        shards = [p for p in paths if _is_shards(p)]
        if shards and len(shards) != len(paths):
            raw = next(p for p in paths if p not in shards)
            raise GraphattnError(
                f"the inputs mix compiled shards ({shards[0]}) and raw records ({raw}): one kind per call"
            )
        if shards:
            for source in shards:
                yield from self._shard_instances(source, verify_sha256)
        else:
            yield from self._raw_instances(paths, format)

    def _object_instances(self, objects: Iterable, format: str) -> Iterator[tuple[tuple, dict, Any]]:
        """Python records and DocGraphs, streamed through a JSON-lines file the compiler reads."""
        with tempfile.TemporaryDirectory(prefix="graphattn-records-") as tmp:
            path = Path(tmp) / "records.jsonl"
            with path.open("w", encoding="utf-8") as handle:
                for k, item in enumerate(objects):
                    record = item.to_dict() if _is_graph(item) else item
                    if not isinstance(record, dict):
                        raise GraphattnError(
                            f"documents[{k}]: expected a record (dict), a DocGraph or a path (all of one kind), "
                            f"got {type(item).__name__}"
                        )
                    handle.write(json.dumps(record) + "\n")
            for key, head, inst in self._raw_instances([str(path)], format):
                head = {k: v for k, v in head.items() if k != "line"}
                yield key, {**head, "source": PYTHON_SOURCE}, inst

    # -- batches, decoding, documents ---------------------------------------------------------------
    def _advance(self, documents: int) -> None:
        if self._bar is not None and documents:
            self._bar.update(documents)

    def predict(self, documents: Any, *, format: str = "auto", verify_sha256: bool = True) -> Iterator[dict[str, Any]]:
        """One record per document, in input order (see `graphattn.train.predict_records`).
        `documents`: paths (raw files, directories, globs, or compiled shards), or Python records
        (dicts in a format compile reads, DocGraphs). `format`: compile's --format for raw files."""
        import torch

        from graphattn.compile.batching import collate
        from graphattn.train.predict_records import document_record, instance_part, open_candidates

        self.stats = PredictionStats()
        self._total, self._bar = None, None
        started = time.perf_counter()
        current: tuple | None = None
        parts: dict[str, list] = {}
        head: dict = {}
        held: list = []
        try:
            for batch in _batched(self._instances(documents, format, verify_sha256), self.batch_size):
                if self.progress and self._bar is None:  # once the inputs have passed their checks
                    from tqdm import tqdm

                    self._bar = tqdm(desc="predict", unit="doc", total=self._total, file=sys.stderr, leave=False)
                for _, _, inst in batch:
                    for spec in self.specs.values():
                        if spec.kind == "choice":
                            open_candidates(inst, spec)
                with torch.no_grad():
                    predictions = self.model.predict(collate([inst for _, _, inst in batch]).to(self.device))
                predictions = {name: _on_cpu(value) for name, value in predictions.items()}  # one copy per batch
                for b, (key, doc_head, inst) in enumerate(batch):
                    if key != current:
                        if current is not None:
                            yield self._finish(document_record(head, self.specs, parts, held, self.n_best))
                        current, head, held = key, doc_head, []
                        parts = {name: [] for name in self.specs}
                    held.append(inst)
                    for name, spec in self.specs.items():
                        parts[name].append(
                            instance_part(
                                spec,
                                predictions[name],
                                b,
                                inst,
                                n_best=self.n_best,
                                max_answer_length=self.max_answer_length,
                            )
                        )
            if current is not None:
                yield self._finish(document_record(head, self.specs, parts, held, self.n_best))
        finally:
            if self._bar is not None:
                self._bar.close()
            self.stats.seconds = time.perf_counter() - started
        if self.print_fn is not None:
            self.print_fn(self.stats.line())

    def _finish(self, record: dict) -> dict:
        self.stats.documents += 1
        self.stats.predicted += 1
        self._advance(1)
        return record


def _is_graph(item: Any) -> bool:
    from graphattn.graph import DocGraph

    return isinstance(item, DocGraph)


def _batched(stream: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in stream:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _on_cpu(value: Any) -> Any:
    """A head's prediction (a tensor, or a dataclass of tensors) on the CPU, where it is decoded."""
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(
            value, **{f.name: _on_cpu(getattr(value, f.name)) for f in dataclasses.fields(value)}
        )
    return value.cpu() if hasattr(value, "cpu") else value
