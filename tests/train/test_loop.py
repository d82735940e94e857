"""The training loop: schedule and LAMB by hand, exact resume, precision, logging, shards, errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_cases import TOKENIZER, instances, task_targets, tiny_config  # noqa: E402

from graphattn.compile import collate  # noqa: E402
from graphattn.contract import EtcBatch  # noqa: E402
from graphattn.errors import GraphattnError  # noqa: E402
from graphattn.nn import EtcEncoder  # noqa: E402
from graphattn.train import (  # noqa: E402
    InstanceLoader,
    Lamb,
    TaskModel,
    TrainConfig,
    Trainer,
    WarmupDecay,
    move_to_device,
    shard_loader,
    train,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def wikihop_model(seed: int = 0, dropout: float = 0.0) -> TaskModel:
    torch.manual_seed(seed)
    return TaskModel(EtcEncoder(tiny_config(hidden_dropout_prob=dropout)), task_targets("wikihop"))


def loader(batch_size: int = 2, shuffle: bool = True, n: int = 8) -> InstanceLoader:
    return InstanceLoader(instances(n), batch_size, collate, shuffle=shuffle, seed=3)


def quiet(**changes) -> TrainConfig:
    return TrainConfig(**{"progress": False, "precision": "fp32", "learning_rate": 1e-3, **changes})


def test_warmup_then_linear_and_cosine_decay_by_hand() -> None:
    linear = WarmupDecay(warmup_steps=2, total_steps=6)
    assert [linear(s) for s in range(7)] == pytest.approx([1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25, 0.0])
    cosine = WarmupDecay(warmup_steps=0, total_steps=4, decay="cosine")
    assert [cosine(s) for s in range(5)] == pytest.approx(
        [1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2, 0.0]
    )
    assert [WarmupDecay(1, 3, decay="constant")(s) for s in range(4)] == pytest.approx([0.5, 1, 1, 1])


def test_lamb_step_by_hand() -> None:
    """First step: m_hat = g, v_hat = g^2, so update = g / (|g| + eps) + wd * w, scaled by
    trust ratio ||w|| / ||update||."""
    weight = nn.Parameter(torch.tensor([3.0, 4.0]))
    weight.grad = torch.tensor([0.5, -2.0])
    Lamb([weight], lr=0.1, eps=0.0, weight_decay=0.1).step()
    update = torch.tensor([1.0, -1.0]) + 0.1 * torch.tensor([3.0, 4.0])
    expected = torch.tensor([3.0, 4.0]) - 0.1 * (5.0 / update.norm()) * update
    torch.testing.assert_close(weight.detach(), expected)
    zero = nn.Parameter(torch.zeros(2))  # ||w|| = 0: ratio 1, plain Adam-like step
    zero.grad = torch.tensor([1.0, -1.0])
    Lamb([zero], lr=0.1, eps=0.0, weight_decay=0.0).step()
    torch.testing.assert_close(zero.detach(), torch.tensor([-0.1, 0.1]))


def lamb_reference(w, grads, lr, beta1, beta2, eps, wd):
    """LAMB written straight from You et al. (2019), Algorithm 2, with bias correction, in float64 numpy."""
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        r = (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps) + wd * w
        w_norm, r_norm = np.linalg.norm(w), np.linalg.norm(r)
        ratio = min(w_norm / r_norm, 10.0) if w_norm > 0 and r_norm > 0 else 1.0
        w = w - lr * ratio * r
    return w


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.floats(0.0, 0.1), st.integers(0, 2**16))
def test_lamb_matches_the_papers_algorithm(size, steps, weight_decay, seed) -> None:
    rng = np.random.default_rng(seed)
    start = rng.normal(size=size)
    grads = [rng.normal(size=size) for _ in range(steps)]
    weight = nn.Parameter(torch.tensor(start))
    optimizer = Lamb([weight], lr=0.05, betas=(0.9, 0.99), eps=1e-6, weight_decay=weight_decay)
    for g in grads:
        weight.grad = torch.tensor(g)
        optimizer.step()
    np.testing.assert_allclose(
        weight.detach().numpy(),
        lamb_reference(start, grads, 0.05, 0.9, 0.99, 1e-6, weight_decay),
        rtol=1e-10,
        atol=1e-12,
    )


def test_lamb_and_adamw_fit_and_log_metrics() -> None:
    for optimizer in ("adamw", "lamb"):
        model = wikihop_model()
        result = Trainer(
            model, quiet(max_steps=24, log_every=8, optimizer=optimizer, learning_rate=3e-3, warmup_steps=2)
        ).fit(loader(4))
        assert [r["step"] for r in result.history] == [8, 16, 24]
        assert {"loss", "loss/answer", "accuracy/answer", "lr", "grad_norm", "epoch"} <= set(result.history[0])
        assert result.history[-1]["loss"] < result.history[0]["loss"]
        assert result.history[0]["lr"] == pytest.approx(
            3e-3 * 17 / 22
        )  # the rate step 8 used: (8 - 1 - 2) / 22 of the way down
        assert result.history[-1]["lr"] == pytest.approx(3e-3 / 22)  # the last step's: one step before zero


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path) -> None:
    """Dropout on, shuffled data, accumulation over an epoch boundary: the checkpoint at step 3
    sits mid-epoch (7 examples, batches of 2 -> 4 batches per epoch, 2 per step)."""
    config = quiet(max_steps=6, gradient_accumulation_steps=2, checkpoint_every=3, keep_checkpoints=0, log_every=1)
    data = lambda: InstanceLoader(instances(7), 2, collate, shuffle=True, seed=5)  # noqa: E731
    full = wikihop_model(dropout=0.1)
    full_result = Trainer(full, config.__class__(**{**config.to_dict(), "checkpoint_dir": str(tmp_path / "a")})).fit(
        data()
    )
    first = tmp_path / "a" / "step-00000003"
    assert (first / "trainer.pt").is_file() and (first / "rng-rank0.pt").is_file()

    resumed = wikihop_model(seed=99, dropout=0.1)  # different init: everything must come from the checkpoint
    resumed_config = config.__class__(
        **{**config.to_dict(), "checkpoint_dir": str(tmp_path / "b"), "resume": str(first)}
    )
    resumed_result = Trainer(resumed, resumed_config).fit(data())
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert [r["loss"] for r in resumed_result.history] == [r["loss"] for r in full_result.history]


def test_resume_latest_continues_and_a_finished_run_does_nothing_more(tmp_path) -> None:
    config = quiet(max_steps=2, checkpoint_dir=str(tmp_path), resume="latest")
    model = wikihop_model()
    assert Trainer(model, config).fit(loader()).step == 2  # nothing to resume yet: a fresh start
    assert (tmp_path / "latest").read_text().strip() == "step-00000002"
    saved = (tmp_path / "step-00000002" / "rng-rank0.pt").read_bytes()
    again = Trainer(wikihop_model(seed=1), config)  # already finished: loads, trains nothing, rewrites nothing
    assert again.fit(loader()).step == 2 and (tmp_path / "step-00000002" / "rng-rank0.pt").read_bytes() == saved
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), model.state_dict().values()))
    longer = Trainer(wikihop_model(seed=1), config.__class__(**{**config.to_dict(), "max_steps": 3})).fit(loader())
    assert longer.step == 3 and longer.checkpoint.name == "step-00000003"
    assert longer.history[-1]["lr"] == pytest.approx(
        1e-3 / 3
    )  # the decay follows the new length (1 - 2/3), not the old end
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003"]


def test_bf16_autocast_on_cpu_and_fp16_refused() -> None:
    trainer = Trainer(wikihop_model(), quiet(max_steps=2, precision="bf16", log_every=1))
    result = trainer.fit(loader())
    assert trainer.precision == "bf16" and all(math.isfinite(r["loss"]) for r in result.history)
    assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay fp32
    with pytest.raises(GraphattnError, match="fp16 training needs a CUDA device"):
        Trainer(wikihop_model(), quiet(max_steps=1, precision="fp16", device="cpu"))


def test_epochs_set_the_length() -> None:
    result = train(wikihop_model(), loader(3), quiet(epochs=2, log_every=1))
    assert result.step == 2 * 3  # 8 examples, batches of 3 -> 3 batches per epoch
    assert [r["epoch"] for r in result.history] == [0, 0, 0, 1, 1, 1]


def test_gradients_are_clipped_to_max_grad_norm() -> None:
    """Plain SGD with lr 1 moves the weights by exactly the clipped gradient."""
    model = wikihop_model()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    result = Trainer(model, quiet(max_steps=1, log_every=1, max_grad_norm=1e-5, decay="constant"), optimizer=sgd).fit(
        loader(4)
    )
    moved = torch.cat([p.detach().flatten() for p in model.parameters()]) - before
    norm = result.history[0]["grad_norm"]
    assert norm > 2e-5  # the norm before clipping is reported
    # torch's clip_grad_norm_ adds 1e-6; fp32 weights (~0.02) minus a 1e-5 step keep ~3 digits
    assert moved.norm().item() == pytest.approx(1e-5 * norm / (norm + 1e-6), rel=1e-3)


def test_move_to_device_walks_nested_batches() -> None:
    batch = collate(instances(2))
    moved = move_to_device({"pair": (batch, batch.targets), "list": [torch.ones(2)], "n": 3}, torch.device("cpu"))
    assert isinstance(moved["pair"][0], EtcBatch) and set(moved["pair"][1]) == set(batch.targets) and moved["n"] == 3
    assert set(moved["pair"][0].targets) == {"answer", "supporting", "span_start", "span_end", "span_type", "mentions"}


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(), "give max_steps or epochs"),
        (dict(max_steps=1, optimizer="sgd"), "TrainConfig.optimizer"),
        (dict(max_steps=1, precision="fp8"), "TrainConfig.precision"),
        (dict(max_steps=1, max_grad_norm=0.0), "TrainConfig.max_grad_norm"),
    ],
)
def test_config_errors_name_the_field(config, message) -> None:
    with pytest.raises(GraphattnError, match=message):
        TrainConfig(**config)


def test_errors_a_user_can_act_on(tmp_path) -> None:
    model = wikihop_model()
    with pytest.raises(GraphattnError, match="yielded no batches"):
        Trainer(model, quiet(max_steps=1)).fit([])
    with pytest.raises(GraphattnError, match="scalar"):
        Trainer(model, quiet(max_steps=1), loss_fn=lambda m, b: torch.ones(2, requires_grad=True)).fit([0])
    with pytest.raises(GraphattnError, match="without 'loss'"):
        Trainer(model, quiet(max_steps=1), loss_fn=lambda m, b: {"total": torch.ones(())}).fit([0])
    with pytest.raises(GraphattnError, match="not a complete checkpoint"):
        Trainer(model, quiet(max_steps=1, resume=str(tmp_path))).fit(loader())
    with pytest.raises(GraphattnError, match="epochs needs data with a len"):
        Trainer(model, quiet(epochs=1)).fit(iter(loader()))
    with pytest.raises(GraphattnError, match="loss became nan"):
        Trainer(model, quiet(max_steps=1, log_every=1), loss_fn=lambda m, b: next(m.parameters()).sum() * math.nan).fit(
            [0]
        )


def test_instance_loader_splits_ranks_like_one_combined_batch() -> None:
    items = list(range(10))
    whole = list(InstanceLoader(items, 4, list, shuffle=True, seed=1, rank=0, world_size=1))
    ranks = [list(InstanceLoader(items, 2, list, shuffle=True, seed=1, rank=r, world_size=2)) for r in range(2)]
    for step, combined in enumerate(whole[:2]):
        assert sorted(ranks[0][step] + ranks[1][step]) == sorted(combined)
    assert len(ranks[0]) == len(ranks[1]) == 3  # 10 items: 5 per rank, last batch of 1
    loader_ = InstanceLoader(items, 4, list, shuffle=True, seed=1)
    first = list(loader_)
    loader_.set_epoch(1)
    assert list(loader_) != first and sorted(sum(list(loader_), [])) == items


def test_trains_from_compiled_shards(tmp_path) -> None:
    """Text files -> `graphattn compile` shards -> shard_loader -> Trainer (an untargeted loss)."""
    import yaml

    from graphattn.corpus.pipeline import CompileOptions, run_compile
    from graphattn.schema import SCHEMA_DIR

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"{i}.txt").write_text(
            f"The river runs past old mills number {i}. People trade grain and wool. Quiet towns wait.\n"
        )
    schema = yaml.safe_load((SCHEMA_DIR / "etc-sentences.yaml").read_text())
    schema.update(
        name="small",
        local_radius=3,
        relative_pos_max_distance=2,
        relative_vocab_size=16,
        max_long_length=48,
        max_global_length=8,
    )
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(schema))
    run_compile(
        CompileOptions(
            inputs=[str(docs)],
            schema=str(tmp_path / "small.yaml"),
            out=str(tmp_path / "shards"),
            tokenizer=TOKENIZER,
            shard_size=2,
            progress=False,
        ),
        print_fn=None,
    )
    data = shard_loader(tmp_path / "shards", batch_size=2, seed=0)
    batches = list(data)
    assert all(isinstance(b, EtcBatch) for b in batches) and len(batches) >= 2
    assert sum(b.batch_size for b in batches) == len(
        data.dataset
    )  # every compiled instance once (documents may be packed)
    torch.manual_seed(0)
    encoder = EtcEncoder(tiny_config(type_vocab_size=16))

    def spread_loss(model, batch):  # pull real long states towards unit variance: any differentiable number will do
        _, long_hidden = model(batch)
        real = batch.long_input_mask.bool()
        return (long_hidden[real].var(dim=0) - 1).pow(2).mean()

    result = Trainer(encoder, quiet(max_steps=4, log_every=2), loss_fn=spread_loss).fit(data)
    assert result.step == 4 and all(math.isfinite(r["loss"]) for r in result.history)
    assert result.history[-1]["epoch"] >= 1  # fewer than 4 batches per epoch: the loop went round


def test_ctrl_c_finishes_the_step_checkpoints_and_resume_is_exact(tmp_path) -> None:
    """SIGINT during step 3 (sent from a callback): the step completes, a checkpoint is saved at it,
    TrainingInterrupted names both, and resuming gives the uninterrupted run bit for bit."""
    import os
    import signal

    from graphattn.train import TrainingInterrupted

    config = quiet(max_steps=6, log_every=1, checkpoint_dir=str(tmp_path / "a"))
    data = lambda: InstanceLoader(instances(7), 2, collate, shuffle=True, seed=5)  # noqa: E731
    interrupt = lambda trainer, record: os.kill(os.getpid(), signal.SIGINT) if trainer.step == 3 else None  # noqa: E731
    with pytest.raises(TrainingInterrupted) as stop:
        Trainer(wikihop_model(dropout=0.1), config, callbacks=[interrupt]).fit(data())
    assert stop.value.step == 3 and stop.value.checkpoint == tmp_path / "a" / "step-00000003"
    assert isinstance(stop.value, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = wikihop_model(seed=99, dropout=0.1)
    Trainer(resumed, config.__class__(**{**config.to_dict(), "resume": "latest"})).fit(data())
    full = wikihop_model(dropout=0.1)
    Trainer(full, config.__class__(**{**config.to_dict(), "checkpoint_dir": str(tmp_path / "b")})).fit(data())
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_train_api_streams_shards_with_their_targets(tmp_path) -> None:
    """`train(model, "shards/")`: the Python API reads compiled shards through ShardIterableDataset."""
    from graphattn.corpus.pipeline import CompileOptions, run_compile
    from graphattn.train.finetune import open_shards

    data = Path(TOKENIZER).parent
    options = CompileOptions(
        inputs=[str(data / "wikihop_sample.json")],
        schema="wikihop",
        out=str(tmp_path / "shards"),
        tokenizer=TOKENIZER,
        progress=False,
    )
    run_compile(options, print_fn=None)
    shards = open_shards(tmp_path / "shards")
    torch.manual_seed(0)
    geometry = dict(local_radius=84, relative_pos_max_distance=12, relative_vocab_size=32, type_vocab_size=8)
    model = TaskModel(EtcEncoder(tiny_config(**geometry)), shards.schema)
    result = train(
        model, str(tmp_path / "shards"), max_steps=3, batch_size=2, log_every=1, progress=False, precision="fp32"
    )
    assert result.step == 3 and all(math.isfinite(r["loss"]) and "loss/answer" in r for r in result.history)


class _FailingShards(torch.utils.data.IterableDataset):
    """Two items, then the error a shard that fails its checks raises (with its place)."""

    epoch = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        yield from (1, 2)
        raise GraphattnError("item 0 is 9\n(the schema has 4 globals)", file="s.parquet", path=("link_global", 3))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_workers_shard_error_comes_back_as_itself(num_workers) -> None:
    """Not torch's re-raise with the worker's traceback folded into the message: the same
    error type, its whole message (two lines) and its place; set_epoch still reaches the shards."""
    from graphattn.train.batches import _ShardLoader

    shards = _FailingShards()
    loader = _ShardLoader(shards, batch_size=2, num_workers=num_workers, collate_fn=list)
    loader.dataset.set_epoch(3)  # as the Trainer tells a DataLoader's dataset
    assert shards.epoch == 3
    batches = iter(loader)
    assert next(batches) == [1, 2]
    with pytest.raises(GraphattnError) as caught:
        next(batches)
    expected = GraphattnError("item 0 is 9\n(the schema has 4 globals)", file="s.parquet", path=("link_global", 3))
    assert type(caught.value) is GraphattnError and str(caught.value) == str(expected)
    assert caught.value.location == expected.location and "Traceback" not in str(caught.value)
