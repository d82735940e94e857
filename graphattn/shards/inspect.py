"""`graphattn inspect SHARD_OR_DIR [--instance N]`: what a compile produced, at a glance.

Prints the run's settings, counts (shards, instances, documents, rejected, label warnings),
histograms of long and global lengths, a histogram of the relative labels actually attended (by
LabelVocab name, split by l2l / g2g / l2g / g2l), truncation totals, the task targets (how many
labels each array holds, how many truncation cut), and one instance laid out readably: its
global tokens with the nodes they stand for, and its first long tokens with their text, owners
and segment. Counts come from the plain columns; labels need the dense tensors, so they are
counted over the first `--label-instances` instances only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from graphattn.cli import add_verbosity_arguments

KINDS = ("l2l", "g2g", "l2g", "g2l")


def add_verify_argument(parser: argparse.ArgumentParser) -> None:
    """--no-verify-sha256, the same for every command that reads shards."""
    parser.add_argument(
        "--no-verify-sha256",
        dest="verify_sha256",
        action="store_false",
        help="do not compare each shard with the size and sha256 its done marker records (storage you trust; "
        "hashing reads every byte, about 0.5 GB/s); footers and rows are checked either way",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SHARD_OR_DIR", help="a shard (.parquet) or a compile output directory")
    parser.add_argument(
        "--instance", type=int, default=0, metavar="N", help="which instance to print (default 0; -1: none)"
    )
    parser.add_argument(
        "--label-instances",
        type=int,
        default=200,
        metavar="N",
        help="count relative labels over the first N instances (default 200; 0: skip)",
    )
    parser.add_argument("--bins", type=int, default=8, help="bars per length histogram (default 8)")
    add_verify_argument(parser)
    parser.add_argument(
        "--tokens", type=int, default=24, metavar="N", help="long and global tokens shown of the instance (default 24)"
    )
    add_verbosity_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from graphattn.errors import GraphattnError

    try:
        lines = inspect_lines(
            args.source,
            instance=args.instance,
            label_instances=args.label_instances,
            bins=args.bins,
            tokens=args.tokens,
            verify_sha256=args.verify_sha256,
        )
    except (OSError, pa.ArrowException) as err:  # footers that read, pages that do not
        why = " ".join(str(err).split())
        raise GraphattnError(f"damaged shard data ({why}); compile it again", file=str(args.source)) from None
    print("\n".join(lines))
    return 0


def inspect_lines(
    source: str,
    *,
    instance: int = 0,
    label_instances: int = 200,
    bins: int = 8,
    tokens: int = 24,
    verify_sha256: bool = True,
) -> list[str]:
    """The report as lines of text (what `graphattn inspect` prints). Every row is checked first
    (`graphattn.shards.verify`), the counts come from the checked row groups."""
    from graphattn.errors import GraphattnError
    from graphattn.shards.dataset import ShardDataset, shard_paths

    if bins < 1 or tokens < 0 or label_instances < 0:
        raise GraphattnError("--bins must be >= 1, --tokens and --label-instances >= 0")
    paths = shard_paths(source)
    dataset = ShardDataset(paths, compact=True, cache_row_groups=2, verify_sha256=verify_sha256)
    info = dataset.info
    target_columns = [f"target:{name}" for name, _, _ in info.layout.targets]
    table = _checked_table(
        dataset,
        [
            "doc_numbers",
            "long_length",
            "global_length",
            "truncated",
            "long_tokens_before",
            "long_tokens_after",
            "globals_before",
            "globals_after",
            "dropped_nodes",
            "dropped_targets",
            *target_columns,
        ],
    )
    settings = info.settings
    out = [
        f"{len(paths)} shard(s) from {source}",
        f"schema {settings.get('schema_name')} ({settings.get('schema')}), tokenizer {settings.get('tokenizer')}, "
        f"shard size {settings.get('shard_size')}, packing {'on' if settings.get('packing') else 'off'}",
    ]
    out += _document_counts(source, paths)
    out.append(f"instances {table.num_rows:,}")
    out.append(f"label warnings {_warnings_count(source, paths)} (task labels that matched nothing: warnings.jsonl)")
    long_lengths = np.asarray(table.column("long_length").to_pylist(), np.int64)
    global_lengths = np.asarray(table.column("global_length").to_pylist(), np.int64)
    out += _histogram("long length", long_lengths, bins)
    out += _histogram("global length", global_lengths, bins)
    out += _truncation(table)
    out += _targets(table, info.layout.targets)
    if label_instances and len(dataset):
        out += _label_table(dataset, min(label_instances, len(dataset)))
    if instance >= 0 and len(dataset):
        if instance >= len(dataset):
            raise GraphattnError(f"--instance {instance} is out of range: {len(dataset)} instances", file=str(source))
        out += describe_instance(dataset, instance, tokens)
    return out


def _checked_table(dataset, columns: list[str]):
    """`columns` of every row of the dataset's shards, each row group checked as it is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from graphattn.shards.reader import read_row_group
    from graphattn.shards.verify_rows import check_rows

    shards = dataset.shards
    parts = []
    for index, (path, info) in enumerate(zip(shards.paths, shards.infos)):
        pf = pq.ParquetFile(pa.memory_map(path, "r"))
        for group in range(len(info.row_groups)):
            table = read_row_group(pf, info, group)
            check_rows(table, info, shards.classes, shards.first_rows[index][group])
            parts.append(table.select(columns))
    return pa.concat_tables(parts) if parts else pa.table({c: [] for c in columns})


def _document_counts(source: str, paths: list[str]) -> list[str]:
    """The compile summary's own count line, from the shard footers; for a run directory also
    where rejected.jsonl is and whether the run finished."""
    from graphattn.corpus.output import OutputDir, documents_line
    from graphattn.shards.reader import read_info

    shards = [read_info(p).shard for p in paths]
    line = documents_line(sum(s.get("documents", 0) for s in shards), sum(s.get("rejected", 0) for s in shards))
    run_dir = OutputDir(Path(source))
    if not run_dir.run_file.is_file():
        return [line + " (from shard footers)"]
    rejected = sum(s.get("rejected", 0) for s in shards)
    out = [line + (f" (see {run_dir.rejected_file})" if rejected and run_dir.rejected_file.is_file() else "")]
    try:
        planned = json.loads(run_dir.run_file.read_text(encoding="utf-8")).get("shards")
    except (OSError, ValueError):
        planned = None
    if isinstance(planned, int) and planned > len(paths):
        out.append(
            f"run incomplete: {len(paths)} of {planned} shards written; finish it with the same "
            "graphattn compile command and --resume"
        )
    return out


def _warnings_count(source: str, paths: list[str]) -> str:
    """Label warnings: the lines of DIR/warnings.jsonl for a run directory, the shard footers' count otherwise."""
    listing = Path(source) / "warnings.jsonl"
    if listing.is_file():
        return f"{sum(1 for line in listing.read_text(encoding='utf-8').splitlines() if line.strip()):,}"
    from graphattn.shards.reader import read_info

    return f"{sum(read_info(p).shard.get('warnings', 0) for p in paths):,} (from shard footers)"


def _targets(table, targets) -> list[str]:
    """Per target array: instances with a label, labelled values; and what truncation cut."""
    if not targets:
        return ["targets: none (the schema declares no targets:)"]
    out = ["targets (-100 = no label):"]
    for name, axis, shape in targets:
        values = table.column(f"target:{name}").to_pylist()
        flat = [np.asarray(v, np.int64).reshape(-1) for v in values]
        labelled = [v[v != -100] for v in flat]
        with_label = sum(1 for v in labelled if v.size)
        kind = "per global" if axis == "global" else (f"rows {list(shape)}" if shape else "scalar")
        counts = np.unique(np.concatenate(labelled or [np.zeros(0, np.int64)]), return_counts=True)
        shown = ", ".join(f"{int(k)}: {int(c):,}" for k, c in zip(*counts) if axis != "" or not shape)
        if shape:
            shown = f"{sum(v.size for v in labelled) // 2:,} span(s)"
        out.append(
            f"  {name:<20} {kind:<12} {with_label:,} of {len(values):,} instance(s) labelled; values {shown or 'none'}"
        )
    cut = sum(len(d) for d in table.column("dropped_targets").to_pylist())
    labels = "label" if cut == 1 else "labels"
    out.append(f"  {cut:,} {labels} cut away by truncation (their targets became null or -100)")
    return out


def _histogram(title: str, values: np.ndarray, bins: int, width: int = 40) -> list[str]:
    if values.size == 0:
        return [f"{title}: no instances"]
    lo, hi = int(values.min()), int(values.max())
    edges = np.linspace(lo, hi + 1, min(bins, hi - lo + 1) + 1).round().astype(np.int64)
    counts, _ = np.histogram(values, bins=edges)
    out = [f"{title}: min {lo}, mean {values.mean():.1f}, max {hi}"]
    scale = width / max(int(counts.max()), 1)
    for (a, b), n in zip(zip(edges[:-1], edges[1:]), counts):
        out.append(f"  [{a:>6}, {b:>6})  {n:>7,}  {'#' * int(round(n * scale))}")
    return out


def _truncation(table) -> list[str]:
    column = lambda name: np.asarray(table.column(name).to_pylist(), np.int64)  # noqa: E731
    truncated = int(np.count_nonzero(table.column("truncated").to_pylist()))
    long_cut = int((column("long_tokens_before") - column("long_tokens_after")).clip(min=0).sum())
    global_cut = int((column("globals_before") - column("globals_after")).clip(min=0).sum())
    nodes = sum(len(d) for d in table.column("dropped_nodes").to_pylist())
    return [
        f"truncation: {truncated:,} instance(s) truncated; {long_cut:,} long and {global_cut:,} global tokens cut; "
        f"{nodes:,} node(s) dropped"
    ]


def label_counts(instance) -> dict[str, np.ndarray]:
    """Per kind (l2l, g2g, l2g, g2l): how often each label id is attended (mask 1) in one instance."""
    side = instance.side.to_dense() if hasattr(instance.side, "to_dense") else instance.side
    size = len(instance.label_vocab)
    out = {}
    for kind in KINDS:
        mask = np.asarray(getattr(side, f"{kind}_att_mask")) == 1
        ids = np.asarray(getattr(side, f"{kind}_relative_att_ids"))[mask]
        out[kind] = np.bincount(ids.astype(np.int64), minlength=size)[:size]
    return out


def _label_table(dataset, n: int) -> list[str]:
    vocab = dataset.info.label_vocab
    totals = {kind: np.zeros(len(vocab), np.int64) for kind in KINDS}
    for i in range(n):
        for kind, counts in label_counts(dataset[i]).items():
            totals[kind] += counts
    out = [
        f"relative labels attended (mask 1) over the first {n} instance(s):",
        f"  {'label':<20}" + "".join(f"{k:>12}" for k in KINDS) + f"{'total':>13}",
    ]
    for label_id, name in enumerate(vocab.names):
        row = [int(totals[k][label_id]) for k in KINDS]
        if sum(row):
            out.append(f"  {name:<20}" + "".join(f"{v:>12,}" for v in row) + f"{sum(row):>13,}")
    return out


def _short(text: str, width: int = 24) -> str:
    text = json.dumps(text, ensure_ascii=False)[1:-1]
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_instance(dataset, index: int, tokens: int = 24) -> list[str]:
    """One instance, readably: provenance, truncation, globals, long tokens, links."""
    inst = dataset[index]
    side, vocab = inst.side, inst.label_vocab
    where = dataset.provenance(index)
    out = [
        f"instance {index}: L={inst.long_length}, G={inst.global_length}, documents {inst.doc_ids}"
        + (f", window {where.window + 1} of {where.windows}" if where.windows > 1 else "")
    ]
    for number, src, line, rec in zip(where.doc_numbers, where.sources, where.lines, where.records):
        place = f"line {line}" if line is not None else (f"record {rec}" if rec is not None else "whole file")
        out.append(f"  document #{number}: {src} ({place})")
    for message in inst.truncation.messages:
        out.append(f"  truncation: {message}")
    if inst.truncation.dropped_nodes:
        out.append(
            f"  dropped nodes: {', '.join(inst.truncation.dropped_nodes[:10])}"
            + (" ..." if len(inst.truncation.dropped_nodes) > 10 else "")
        )
    levels = list(inst.long_owners)
    out.append(f"  global tokens (first {min(tokens, inst.global_length)} of {inst.global_length}):")
    out.append(f"    {'pos':>5} {'token':>7} {'type':>5} {'doc':>4}  node")
    for g in range(min(tokens, inst.global_length)):
        out.append(
            f"    {g:>5} {int(inst.global_token_ids[g]):>7} "
            f"{int(inst.global_type_ids[g]):>5} {int(side.global_doc[g]):>4}  "
            f"{inst.global_node_ids[g]} ({inst.global_node_types[g]})"
        )
    out.append(
        f"  long tokens (first {min(tokens, inst.long_length)} of {inst.long_length}); owners are global positions:"
    )
    out.append(
        f"    {'pos':>5} {'token':>7} {'type':>5} {'seg':>4}  {'text':<24} " + " ".join(f"{lv:>10}" for lv in levels)
    )
    for i in range(min(tokens, inst.long_length)):
        owners = " ".join(f"{int(inst.long_owners[lv][i]):>10}" for lv in levels)
        out.append(
            f"    {i:>5} {int(inst.long_token_ids[i]):>7} "
            f"{int(inst.long_type_ids[i]):>5} {int(side.long_segment[i]):>4}  "
            f"{_short(inst.long_token_text(i)):<24} {owners}"
        )
    out += _edges("links long -> global", side.link_long, side.link_global, side.link_label, vocab.name, tokens)
    out += _edges("g2g edges", side.g2g_src, side.g2g_dst, side.g2g_label, vocab.name, tokens)
    return out


def _edges(
    title: str, src: np.ndarray, dst: np.ndarray, labels: np.ndarray, name: Callable[[int], str], limit: int
) -> list[str]:
    if src.size == 0:
        return [f"  {title}: none"]
    out = [f"  {title} (first {min(limit, src.size)} of {src.size}):"]
    out += [
        f"    {int(a):>6} -> {int(b):<6} {name(int(c))}" for a, b, c in zip(src[:limit], dst[:limit], labels[:limit])
    ]
    return out
