"""graphattn.shards.dataset: Dataset / IterableDataset over shards, with DataLoader workers and shuffling."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from corpus_helpers import TOKENIZER, assert_same_instance, make_corpus, reference_instances, small_schema
from torch.utils.data import DataLoader

from graphattn.compact import CompactSideInputs
from graphattn.compile import collate as compile_collate
from graphattn.corpus.pipeline import CompileOptions, run_compile
from graphattn.errors import GraphattnError
from graphattn.schema import load_schema
from graphattn.shards.dataset import ShardDataset, ShardIterableDataset, collate, read_instance, read_table
from graphattn.tokenize import load_tokenizer

SHARD_SIZE = 5


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    expected = make_corpus(root / "docs", seed=1)
    schema = small_schema(root / "small.yaml")
    out = root / "shards"
    run_compile(
        CompileOptions(
            inputs=[str(root / "docs")],
            schema=schema,
            out=str(out),
            tokenizer=TOKENIZER,
            shard_size=SHARD_SIZE,
            progress=False,
        ),
        print_fn=None,
    )
    reference = [
        i
        for shard in reference_instances(expected, load_schema(schema), load_tokenizer(TOKENIZER), SHARD_SIZE)
        for i in shard
    ]
    return out, reference


def keys(instances) -> list[tuple]:
    """DataLoader collate_fn that keeps only what identifies an instance: its packed documents."""
    return [tuple(i.doc_ids) + (i.long_length,) for i in instances]


def test_random_access_matches_the_in_memory_compile(shards):
    out, reference = shards
    dataset = ShardDataset(out)
    assert len(dataset) == len(reference) > SHARD_SIZE
    for i in [0, len(reference) - 1, 3, 1, len(reference) // 2, -1]:  # out of order: row groups are cached and evicted
        assert_same_instance(dataset[i], reference[i])
    with pytest.raises(IndexError):
        dataset[len(reference)]
    compact = ShardDataset(out, compact=True)[2]
    assert isinstance(compact.side, CompactSideInputs)
    assert_same_instance(read_instance(out, 2), reference[2])


def test_collate_gives_the_batch_of_the_in_memory_instances(shards):
    out, reference = shards
    dense = collate([ShardDataset(out)[i] for i in range(4)])
    compact = collate([ShardDataset(out, compact=True)[i] for i in range(4)], pad_to_long=64)
    want = compile_collate(reference[:4])
    for got in (dense, compact):
        for name in (
            "long_token_ids",
            "long_type_ids",
            "global_token_ids",
            "global_type_ids",
            "long_input_mask",
            "global_input_mask",
        ):
            assert torch.equal(
                getattr(got, name)[:, : want.long_token_ids.shape[1] if "long" in name else None], getattr(want, name)
            ), name
    for name, value in want.side.as_dict().items():
        assert torch.equal(getattr(dense.side, name), value), name
    assert compact.long_token_ids.shape[1] == 64


def test_dataloader_workers_and_shuffle_give_every_instance_once_per_epoch(shards):
    out, reference = shards
    everything = Counter(keys(reference))
    assert len(everything) == len(reference)
    loader = DataLoader(
        ShardDataset(out),
        batch_size=3,
        shuffle=True,
        num_workers=2,
        collate_fn=keys,
        generator=torch.Generator().manual_seed(0),
    )
    orders = []
    for _ in range(2):
        seen = [k for batch in loader for k in batch]
        assert Counter(seen) == everything
        orders.append(seen)
    assert orders[0] != orders[1]


@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_dataset_splits_row_groups_across_workers(shards, shuffle):
    out, reference = shards
    everything = Counter(keys(reference))
    stream = ShardIterableDataset(out, shuffle=shuffle, buffer_size=4, seed=3)
    loader = DataLoader(stream, batch_size=2, num_workers=2, collate_fn=keys)
    orders = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        seen = [k for batch in loader for k in batch]
        assert Counter(seen) == everything
        orders.append(seen)
    if shuffle:
        assert orders[0] != orders[1] and orders[0] != list(everything)
    else:
        assert orders[0] == orders[1]
        single = [k for batch in DataLoader(stream, batch_size=2, collate_fn=keys) for k in batch]
        assert single == keys(reference)  # one reader, no shuffle: input order


def test_ranks_split_the_stream_without_overlap(shards):
    out, reference = shards
    parts = [keys(ShardIterableDataset(out, rank=r, world_size=3, shuffle=True, seed=1)) for r in range(3)]
    assert Counter(k for part in parts for k in part) == Counter(keys(reference))
    with pytest.raises(GraphattnError):
        ShardIterableDataset(out, rank=3, world_size=3)


def test_shards_are_plain_tables(shards):
    out, reference = shards
    table = read_table(out)
    assert table.num_rows == len(reference)
    assert table.column("doc_ids").to_pylist() == [i.doc_ids for i in reference]
    assert table.column("long_length").to_pylist() == [i.long_length for i in reference]
    first = pq.read_table(sorted(out.glob("*.parquet"))[0])
    assert str(first.schema.field("long_token_ids").type) == "list<element: uint16>"
    assert str(first.schema.field("owner_sentence").type) == "list<element: int16>"
    assert np.array_equal(np.asarray(first.column("long_token_ids")[0].as_py()), reference[0].long_token_ids)
    assert b"graphattn.label_vocab" in first.schema.metadata


def test_hugging_face_datasets_reads_the_shards(shards, tmp_path, monkeypatch):
    """`datasets.load_dataset("parquet", data_files=...)` opens the shards as a table, locally (no
    download: offline mode on, the cache in a temporary directory)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # read when datasets is first imported
    import datasets

    out, reference = shards
    loaded = datasets.load_dataset(
        "parquet",
        data_files=sorted(str(p) for p in out.glob("*.parquet")),
        split="train",
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert loaded.num_rows == len(reference)
    assert loaded[0]["doc_ids"] == reference[0].doc_ids
    assert loaded[0]["long_token_ids"] == reference[0].long_token_ids.tolist()
    assert loaded.features["long_token_ids"].feature.dtype == "uint16"


def test_mixing_shards_of_different_runs_is_refused(shards, tmp_path):
    out, _ = shards
    other = tmp_path / "other"
    run_compile(
        CompileOptions(
            inputs=[str(out.parent / "docs" / "d_notes")],
            schema="etc-sentences",
            out=str(other),
            tokenizer=TOKENIZER,
            progress=False,
        ),
        print_fn=None,
    )
    expected = r"other/.*\.parquet: this shard.s (label vocabulary|layout).* differ from those of .*different runs"
    with pytest.raises(GraphattnError, match=expected):
        ShardDataset([out, other])
