"""Optimizers and learning-rate schedules for fine-tuning and pre-training.

torch has AdamW but no LAMB, which BERT/ETC-style pre-training with large batches uses, so a
compact LAMB lives here. Schedules are BERT's: linear warm-up, then linear (or cosine) decay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from graphattn.errors import GraphattnError

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "cosine", "constant")


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019): Adam's update with decoupled weight decay, rescaled per tensor by
    the trust ratio ||w|| / ||update||, so every layer moves by a similar relative amount
    whatever its gradient scale. Tensors whose norm or update norm is zero use ratio 1."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        max_trust_ratio: float = 10.0,
    ):
        if lr <= 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or weight_decay < 0:
            raise GraphattnError(
                f"invalid LAMB hyper-parameters: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}"
            )
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            max_trust_ratio=max_trust_ratio,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise GraphattnError("LAMB does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                grad = p.grad
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat, v_hat = exp_avg, exp_avg_sq
                if group["bias_correction"]:
                    m_hat = exp_avg / (1 - beta1 ** state["step"])
                    v_hat = exp_avg_sq / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update = update.add(p, alpha=group["weight_decay"])
                weight_norm, update_norm = p.norm(), update.norm()
                trust = torch.where(
                    (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
                )
                trust = trust.clamp(max=group["max_trust_ratio"])
                p.add_(update * trust, alpha=-group["lr"])
        return loss


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """BERT's split: no weight decay on biases and LayerNorm scales (every tensor under 2-D)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    name: str = "adamw",
    lr: float = 5e-5,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.Optimizer:
    """AdamW or LAMB over the model's trainable parameters with BERT's weight-decay split."""
    groups = parameter_groups(model, weight_decay)
    if not groups:
        raise GraphattnError("the model has no trainable parameters")
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    raise GraphattnError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}", path=("optimizer",))


class WarmupDecay:
    """Learning-rate multiplier: 0 -> 1 linearly over `warmup_steps`, then `decay` to
    `final_ratio` at `total_steps` (constant stays at 1). A class, not a lambda, so it pickles."""

    def __init__(self, warmup_steps: int, total_steps: int, decay: str = "linear", final_ratio: float = 0.0):
        if decay not in DECAYS:
            raise GraphattnError(f"unknown decay {decay!r}; expected one of {', '.join(DECAYS)}", path=("decay",))
        if warmup_steps < 0 or total_steps < 1:
            raise GraphattnError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps} and {total_steps}")
        self.warmup_steps, self.total_steps, self.decay, self.final_ratio = (
            warmup_steps,
            total_steps,
            decay,
            final_ratio,
        )

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.decay == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        shape = 1.0 - progress if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_ratio + (1.0 - self.final_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    total_steps: int,
    decay: str = "linear",
    final_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupDecay(warmup_steps, total_steps, decay, final_ratio))
