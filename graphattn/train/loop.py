"""The training loop: batches in, optimizer steps out, with checkpoints you can resume exactly.

    trainer = Trainer(model, TrainConfig(max_steps=1000, learning_rate=1e-4, checkpoint_dir="ckpt"),
                      loss_fn=lambda model, batch: model.loss(batch))
    result = trainer.fit(loader)            # any re-iterable of batches: DataLoader, list, ...

`loss_fn(model, batch)` returns a scalar loss tensor, or a dict with "loss" and any other numbers
to log (e.g. {"loss": total, "mlm": mlm, "cpc": cpc}). Without a loss_fn, `model(batch)` must
return one of those. Batches may be an EtcBatch, tensors, or dicts / lists / tuples / dataclasses
of them; they are moved to the training device as a whole.

Under torch.distributed (see `graphattn.train.distributed`) the model is wrapped in
DistributedDataParallel: each rank feeds its own share of the data (`instance_loader` and
`shard_loader` split by rank) and its loss is the mean over its local batch, so equal local
batches give exactly the gradient of the mean over the combined batch.

Exact resume: a checkpoint stores the epoch and how many batches of it were consumed, plus every
random generator both now and at the start of that epoch. Resuming re-creates the epoch's data
order from the epoch-start state, skips the consumed batches, then restores the current state.
This needs the data to give the same order when iterated again from the same generator state
(true of DataLoaders, shuffled or not, and of anything with `set_epoch`).

Ctrl-C (SIGINT) and SIGTERM (what `kill` and batch schedulers send), in the main thread, do not
kill a step half-way: the step under way finishes, a checkpoint is saved at it (with
checkpoint_dir) and `fit` raises `TrainingInterrupted` (a KeyboardInterrupt) naming the step, the
signal and the checkpoint, from which `resume` continues exactly as from any other. A second
signal stops at once. Under DDP the ranks agree after every step, so they stop at the same one.

With `log_dir`, every logged record (loss, each target's `loss/<name>`, learning rate, gradient
norm) is appended to `log_dir/log.jsonl`, and to TensorBoard when it is installed
(`graphattn.train.runlog`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from graphattn.contract import EtcBatch
from graphattn.errors import GraphattnError
from graphattn.train import checkpoint as ckpt
from graphattn.train.distributed import (
    all_ranks_agree,
    all_reduce_sum,
    get_rank,
    get_world_size,
    is_distributed,
    local_rank,
    raise_together,
)
from graphattn.train.optim import DECAYS, OPTIMIZERS, build_optimizer, build_scheduler
from graphattn.train.runlog import RunLog
from graphattn.train.trainer_checkpoints import TrainerCheckpoints

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
LossFn = Callable[[nn.Module, Any], Any]


@dataclass
class TrainConfig:
    """How long, how fast, in what precision, and where checkpoints go.

    Length: `max_steps` optimizer steps, or `epochs` passes over data with a len(); one step
    consumes `gradient_accumulation_steps` batches. Warm-up: `warmup_steps`, or when that is 0,
    `warmup_ratio` of all steps. precision "auto" is bf16 on CUDA devices that support it and
    fp32 elsewhere; "bf16" also works on CPU; "fp16" (CUDA only) uses a GradScaler."""

    max_steps: int | None = None
    epochs: int | None = None
    learning_rate: float = 5e-5
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    decay: str = "linear"
    max_grad_norm: float | None = 1.0
    gradient_accumulation_steps: int = 1
    precision: str = "auto"
    device: str = "auto"
    seed: int = 0
    log_every: int = 10
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps between saves; 0 saves only at the end (when checkpoint_dir is set)
    keep_checkpoints: int = 2  # newest complete checkpoints kept; 0 keeps all
    resume: str | bool = False  # True / "latest": newest under checkpoint_dir if any; or a checkpoint path
    progress: bool = True
    find_unused_parameters: bool = False  # DDP: set when some parameters get no gradient in a step
    stop_on_interrupt: bool = True  # Ctrl-C / SIGTERM: finish the step, checkpoint, raise TrainingInterrupted
    log_dir: str | None = None  # log.jsonl (and TensorBoard events, when installed) go here
    trust_undigested: bool = False  # resume from a newest checkpoint without digest.json after checking it loads

    def __post_init__(self) -> None:
        def fail(name: str, message: str) -> None:
            raise GraphattnError(message, path=("TrainConfig", name))

        if self.max_steps is None and self.epochs is None:
            fail("max_steps", "give max_steps or epochs")
        if self.max_steps is not None and self.max_steps < 1:
            fail("max_steps", f"must be >= 1, got {self.max_steps}")
        if self.epochs is not None and self.epochs < 1:
            fail("epochs", f"must be >= 1, got {self.epochs}")
        if self.learning_rate <= 0:
            fail("learning_rate", f"must be > 0, got {self.learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"{self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.decay not in DECAYS:
            fail("decay", f"{self.decay!r} is not one of {', '.join(DECAYS)}")
        if self.precision not in PRECISIONS:
            fail("precision", f"{self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.gradient_accumulation_steps < 1:
            fail("gradient_accumulation_steps", f"must be >= 1, got {self.gradient_accumulation_steps}")
        if not 0.0 <= self.warmup_ratio < 1.0 or self.warmup_steps < 0:
            fail("warmup_steps", "warmup_steps must be >= 0 and warmup_ratio in [0, 1)")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            fail("max_grad_norm", f"must be > 0 or None (no clipping), got {self.max_grad_norm}")
        if self.log_every < 1 or self.checkpoint_every < 0:
            fail("log_every", "log_every must be >= 1 and checkpoint_every >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped `fit` after a whole step; `checkpoint` holds it (None without
    checkpoint_dir); `signal` is the signal's number (SIGINT or SIGTERM)."""

    def __init__(self, step: int, checkpoint: Path | None, signum: int = signal.SIGINT, *, unsaved: bool = False):
        super().__init__(f"interrupted at step {step}" + (f"; checkpoint {checkpoint}" if checkpoint else ""))
        self.step, self.checkpoint, self.signal = step, checkpoint, signum
        self.unsaved = unsaved  # the data ended half-way through a step: `checkpoint` is an earlier one (or None)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _InterruptFlag:
    """While active (main thread only), the first SIGINT or SIGTERM sets `requested` (and
    `signum`) instead of stopping the process; a second one acts as it would without this.

    From the first signal on, a DataLoader worker that exits is no error of its own: torch's
    SIGCHLD handler (which raises "DataLoader worker ... killed by signal" wherever the main
    thread happens to be, a checkpoint save included) is set aside until the flag is left, and
    `fit` ends at the step it reached when the data stops coming."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self.signum = signal.SIGINT
        self._previous: dict[int, Any] = {}
        self._sigchld: Any = None

    def _handle(self, signum, frame) -> None:
        self.requested, self.signum = True, signum
        self._restore()
        if _SIGCHLD is not None:
            self._sigchld = signal.signal(_SIGCHLD, signal.SIG_DFL)

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def __enter__(self) -> _InterruptFlag:
        if self.enabled:
            self._previous = {signum: signal.signal(signum, self._handle) for signum in _STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._restore()
            if self._sigchld is not None:
                signal.signal(_SIGCHLD, self._sigchld)
                self._sigchld = None


_SIGCHLD = getattr(signal, "SIGCHLD", None)


@dataclass
class TrainResult:
    """What a fit did: the final step, one record per logged step, the last checkpoint."""

    step: int
    history: list[dict[str, float]] = field(default_factory=list)
    checkpoint: Path | None = None
    seconds: float = 0.0  # wall-clock time of the steps this fit ran (loading and saving excluded)
    steps_run: int = 0  # steps this fit ran (after a resume: fewer than `step`)

    @property
    def final_loss(self) -> float:
        return self.history[-1]["loss"] if self.history else math.nan


def move_to_device(obj: Any, device: torch.device) -> Any:
    """Move a tensor, anything with its own .to(device) (EtcBatch, PretrainingBatch), or any
    dict / list / tuple / dataclass of them."""
    if isinstance(obj, (torch.Tensor, EtcBatch)) or (
        callable(getattr(obj, "to", None)) and not isinstance(obj, (nn.Module, type))
    ):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: move_to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(move_to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to_device(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: move_to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init}
        )
    return obj


def split_output(output: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """(loss, other metrics) from a loss tensor, a dict with "loss", or an object with .loss."""
    if isinstance(output, torch.Tensor):
        loss, metrics = output, {}
    elif isinstance(output, Mapping):
        if "loss" not in output:
            raise GraphattnError(
                f"the loss function returned a dict without 'loss' (keys: {', '.join(map(str, output))})"
            )
        loss, metrics = output["loss"], {k: v for k, v in output.items() if k != "loss"}
    elif isinstance(getattr(output, "loss", None), torch.Tensor):
        loss, metrics = output.loss, {}
    else:
        raise GraphattnError(
            f"the loss function must return a scalar tensor or a dict with 'loss', got {type(output).__name__}"
        )
    if loss.ndim != 0:
        raise GraphattnError(f"the loss must be a scalar tensor, got shape {tuple(loss.shape)}")
    return loss, metrics


class _LossModule(nn.Module):
    """model + loss_fn as one module, so DistributedDataParallel sees the whole forward."""

    def __init__(self, model: nn.Module, loss_fn: LossFn | None):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> Any:
        return self.loss_fn(self.model, batch) if self.loss_fn is not None else self.model(batch)


def _resolve_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def _resolve_precision(precision: str, device: torch.device) -> str:
    cuda = device.type == "cuda"
    if precision == "auto":
        return "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "fp16" and not cuda:
        raise GraphattnError(
            "fp16 training needs a CUDA device (use bf16 or fp32 on CPU)", path=("TrainConfig", "precision")
        )
    if precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise GraphattnError(
            "this CUDA device does not support bf16; use fp16 or fp32", path=("TrainConfig", "precision")
        )
    return precision


def _set_epoch(data: Any, epoch: int) -> None:
    """Tell the data (and its sampler / dataset, for DataLoaders) which epoch starts."""
    for owner in (
        data,
        getattr(data, "sampler", None),
        getattr(getattr(data, "batch_sampler", None), "sampler", None),
        getattr(data, "dataset", None),
    ):
        if owner is not None and callable(getattr(owner, "set_epoch", None)):
            owner.set_epoch(epoch)


class Trainer(TrainerCheckpoints):
    """Owns the device placement, DDP wrapper, optimizer, schedule, precision and checkpoints."""

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        loss_fn: LossFn | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        callbacks: Sequence[Callable[[Trainer, dict], None]] = (),
    ):
        self.config = config
        self.device = _resolve_device(config.device)
        self.precision = _resolve_precision(config.precision, self.device)
        self.rank, self.world_size = get_rank(), get_world_size()
        self.model = model.to(self.device)
        self.module = _LossModule(self.model, loss_fn)
        self.wrapped: nn.Module = self.module
        if is_distributed():
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = DistributedDataParallel(
                self.module, device_ids=device_ids, find_unused_parameters=config.find_unused_parameters
            )
        self.optimizer = optimizer or build_optimizer(
            self.model, config.optimizer, config.learning_rate, config.weight_decay, config.betas, config.eps
        )
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.callbacks = list(callbacks)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.history: list[dict[str, float]] = []
        self._epoch_rng: dict[str, Any] | None = None
        self._pending_rng: dict[str, Any] | None = None  # set by a resume, consumed by the data iterator
        self._saved_step: int | None = None  # the step this trainer last saved a checkpoint at
        self._run_log: RunLog | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    # -- length and schedule ---------------------------------------------------------------

    def total_steps(self, data: Iterable) -> int:
        cfg = self.config
        if cfg.max_steps is not None:
            return cfg.max_steps
        try:
            batches = len(data)  # type: ignore[arg-type]
        except TypeError:
            raise GraphattnError(
                "epochs needs data with a len(); give max_steps for streams", path=("TrainConfig", "epochs")
            ) from None
        return max(1, cfg.epochs * batches // cfg.gradient_accumulation_steps)

    def _build_scheduler(self, total: int) -> None:
        cfg = self.config
        warmup = cfg.warmup_steps or int(cfg.warmup_ratio * total)
        self.scheduler = build_scheduler(self.optimizer, warmup, total, cfg.decay)

    # -- data ------------------------------------------------------------------------------

    def _batches(self, data: Iterable) -> Iterator[Any]:
        """Batches forever, epoch after epoch, honouring a pending resume position."""
        while True:
            _set_epoch(data, self.epoch)
            if self._pending_rng is not None:
                ckpt.restore_rng(self._pending_rng["epoch_start"])
            self._epoch_rng = ckpt.capture_rng()
            iterator = iter(data)
            if self._pending_rng is not None:
                for skipped in range(self.batch_in_epoch):
                    if next(iterator, _END) is _END:
                        raise GraphattnError(
                            f"resuming needs {self.batch_in_epoch} batches of epoch {self.epoch}, "
                            f"but the data gave only {skipped}: "
                            "is it the same data as before?"
                        )
                ckpt.restore_rng(self._pending_rng["now"])
                self._pending_rng = None
            start = self.batch_in_epoch
            while True:
                batch = next(iterator, _END)
                if not all_ranks_agree(batch is not _END, self.device):
                    break
                self.batch_in_epoch += 1
                yield batch
            if self.batch_in_epoch == start == 0:
                raise GraphattnError("the training data yielded no batches")
            self.epoch += 1
            self.batch_in_epoch = 0

    def _next_batch(
        self, batches: Iterator[Any], interrupt: _InterruptFlag, micro: int, last_checkpoint: Path | None
    ) -> Any:
        """The next batch; after a stop signal, data that ends (DataLoader workers that exited
        with the signal: a worker outside graphattn's shard loader may not ignore it) ends the
        run at the step reached, saved when no batch of the next step was consumed yet."""
        try:
            return next(batches)
        except (RuntimeError, OSError):
            if not interrupt.requested or is_distributed():
                raise
        if micro:
            raise TrainingInterrupted(self.step, last_checkpoint, interrupt.signum, unsaved=True)
        saved = self.save_checkpoint() if self.config.checkpoint_dir else None
        raise TrainingInterrupted(self.step, saved, interrupt.signum)

    # -- one optimizer step ----------------------------------------------------------------

    def _micro_step(self, batch: Any, last: bool) -> tuple[torch.Tensor, dict[str, Any]]:
        sync = (
            contextlib.nullcontext()
            if last or not isinstance(self.wrapped, DistributedDataParallel)
            else self.wrapped.no_sync()
        )
        with sync:
            with self.autocast():
                loss, metrics = split_output(self.wrapped(move_to_device(batch, self.device)))
            self.scaler.scale(loss.float() / self.config.gradient_accumulation_steps).backward()
        return loss.detach().float(), metrics

    def _optimizer_step(self) -> tuple[torch.Tensor, float]:
        """Unscale, clip, step, advance the schedule; (gradient norm before clipping, lr used)."""
        lr = self.scheduler.get_last_lr()[0]
        self.scaler.unscale_(self.optimizer)
        limit = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), limit)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm.detach().float(), lr

    # -- fit -------------------------------------------------------------------------------

    def fit(self, data: Iterable, resume: str | bool | None = None) -> TrainResult:
        """Train until the configured number of steps; returns the logged history."""
        cfg = self.config
        total = self.total_steps(data)
        self._build_scheduler(total)
        resume = cfg.resume if resume is None else resume
        found = self._resolve_resume(resume)
        if found is not None:
            failure = None
            try:
                self.load_checkpoint(found)
            except Exception as err:  # noqa: BLE001 - a rank's damaged file ends every rank (no hang at step 1)
                failure = err
            raise_together(failure)
        else:
            ckpt.seed_everything(cfg.seed + self.rank)
        self.model.train()
        if cfg.log_dir and self.is_main:
            self._run_log = RunLog(cfg.log_dir, resumed_step=self.step if found is not None else None)
        batches = self._batches(data)
        last_checkpoint, resumed_at = found, self.step
        window: dict[str, torch.Tensor] = {}
        bar = tqdm(
            total=total,
            initial=self.step,
            disable=not (cfg.progress and self.is_main),
            desc="train",
            dynamic_ncols=True,
        )
        started = time.perf_counter()
        with _InterruptFlag(cfg.stop_on_interrupt) as interrupt:
            try:
                while self.step < total:
                    accum = cfg.gradient_accumulation_steps
                    for i in range(accum):
                        batch = self._next_batch(batches, interrupt, i, last_checkpoint)
                        loss, metrics = self._micro_step(batch, last=i == accum - 1)
                        _accumulate(window, {"loss": loss, **metrics}, 1.0 / accum)
                    grad_norm, lr = self._optimizer_step()
                    self.step += 1
                    _accumulate(window, {"steps": torch.ones((), device=self.device)}, 1.0)
                    bar.update(1)
                    if self.step % cfg.log_every == 0 or self.step == total:
                        record = self._log(window, grad_norm, lr)
                        window = {}
                        bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
                        for callback in self.callbacks:
                            callback(self, record)
                    periodic = cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0
                    if cfg.checkpoint_dir and periodic and self.step < total:
                        last_checkpoint = self.save_checkpoint()
                    if cfg.stop_on_interrupt and not all_ranks_agree(not interrupt.requested, self.device):
                        saved = self.save_checkpoint() if cfg.checkpoint_dir else None
                        raise TrainingInterrupted(self.step, saved, interrupt.signum)
            finally:
                batches.close()  # DataLoader workers shut down here, before torch's SIGCHLD handler is back
                bar.close()
                if self._run_log is not None:
                    self._run_log.close()
        seconds = time.perf_counter() - started
        if cfg.checkpoint_dir and (
            found is None or self.step > resumed_at
        ):  # resuming a finished run leaves its checkpoint as it was
            last_checkpoint = self.save_checkpoint()
        return TrainResult(
            step=self.step,
            history=list(self.history),
            checkpoint=last_checkpoint,
            seconds=seconds,
            steps_run=self.step - resumed_at,
        )

    def _log(self, window: dict[str, torch.Tensor], grad_norm: torch.Tensor, lr: float) -> dict[str, float]:
        """Mean of each metric since the last log, over steps and ranks; the last step's
        learning rate and gradient norm (before clipping)."""
        names = sorted(window)
        values = all_reduce_sum(torch.stack([window[n].to(self.device) for n in names]))
        totals = dict(zip(names, values.tolist()))
        steps = totals.pop("steps")
        record = {"step": float(self.step), "epoch": float(self.epoch), "lr": lr, "grad_norm": float(grad_norm)}
        record.update({name: value / steps for name, value in totals.items()})
        if not math.isfinite(record["loss"]):
            raise GraphattnError(
                f"the loss became {record['loss']} by step {self.step} (lower the learning rate, check the inputs, "
                "or use fp32/bf16 instead of fp16)"
            )
        self.history.append(record)
        if self._run_log is not None:
            self._run_log.write(record)
        return record

    # -- evaluation --------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, data: Iterable, loss_fn: LossFn | None = None) -> dict[str, float]:
        """Mean loss (and other returned numbers) over `data`, in eval mode, on this rank's data."""
        fn = loss_fn or self.module.loss_fn or (lambda model, batch: model(batch))
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        try:
            for batch in data:
                with self.autocast():
                    loss, metrics = split_output(fn(self.model, move_to_device(batch, self.device)))
                _accumulate(sums, {"loss": loss.float(), **metrics}, 1.0)
                count += 1
        finally:
            self.model.train(was_training)
        if not count:
            raise GraphattnError("evaluate got no batches")
        return {name: float(value) / count for name, value in sums.items()}


_END = object()


def _accumulate(into: dict[str, torch.Tensor], values: Mapping[str, Any], weight: float) -> None:
    """Running weighted sums of scalar metrics, kept as tensors (no device sync per step)."""
    for name, value in values.items():
        tensor = value.detach().float().reshape(()) if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        into[name] = into.get(name, torch.zeros(())).to(tensor.device) + tensor * weight


def train(
    model: nn.Module,
    data: Any,
    config: TrainConfig | None = None,
    loss_fn: LossFn | None = None,
    *,
    batch_size: int = 8,
    num_workers: int = 0,
    buffer_size: int = 1024,
    **overrides: Any,
) -> TrainResult:
    """One call: `train(model, "shards/", max_steps=100, learning_rate=1e-4)`.

    `data` is any re-iterable of batches, or compiled shards (a directory, a .parquet file, a
    glob, or a list of them), which are streamed through `ShardIterableDataset` (shuffled with a
    buffer of `buffer_size` instances, split across `num_workers` DataLoader workers and DDP
    ranks) in batches of `batch_size`; nothing is compiled again and memory does not grow with
    the corpus."""
    config = dataclasses.replace(config, **overrides) if config is not None else TrainConfig(**overrides)
    if _is_shard_source(data):
        from graphattn.train.batches import shard_loader

        data = shard_loader(
            data,
            batch_size,
            shuffle=True,
            seed=config.seed,
            buffer_size=buffer_size,
            num_workers=num_workers,
            compact=True,
        )
    return Trainer(model, config, loss_fn=loss_fn).fit(data)


def _is_shard_source(data: Any) -> bool:
    import os

    if isinstance(data, (str, os.PathLike)):
        return True
    return isinstance(data, (list, tuple)) and bool(data) and all(isinstance(item, (str, os.PathLike)) for item in data)
