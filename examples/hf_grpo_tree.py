"""GRPO-style training on a prefix tree: one prompt, 8 sampled completions, one row.

The prompt's tokens are computed once instead of 8 times: `pack_tree` lays out the prompt then
each completion as a child segment; every completion token sees the prompt and its own earlier
tokens, with positions continuing from the prompt's end. The completions' log-probabilities come
from one forward (the first token of each completion is predicted from the prompt's last token,
`predecessor`); the check: they equal those of each prompt + completion run alone. Then one
policy-gradient step with group-normalised rewards (the GRPO advantage, no KL or clipping: a
single on-policy step).

Run: python examples/hf_grpo_tree.py
"""

from __future__ import annotations

import torch
from _common import tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

import graphattn.hf as gh

PROMPT = "Question: why did the townspeople of Alderford keep a second bridge in a barn? Answer:"


def token_logprobs(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """log p(token j | its ancestors) for every token with a predecessor, [B, N] (0 elsewhere)."""
    pred = batch["predecessor"].clamp(min=0)
    logp = torch.log_softmax(logits.float(), -1)
    picked = logp.gather(1, pred[..., None].expand(-1, -1, logp.shape[-1]))
    out = picked.gather(2, batch["input_ids"][..., None])[..., 0]
    return torch.where(batch["predecessor"] >= 0, out, 0.0)


def main() -> None:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=3000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,
    )
    model = Qwen2ForCausalLM(config)
    model.set_attn_implementation(gh.register())
    prompt = [int(t) for t in tokenizer().encode(PROMPT).ids]
    g = torch.Generator().manual_seed(1)
    completions = [
        torch.randint(5, 3000, (int(torch.randint(6, 20, (1,), generator=g)),), generator=g).tolist() for _ in range(8)
    ]
    rewards = torch.rand(8, generator=g)
    tree = gh.pack_tree([(-1, prompt)] + [(0, c) for c in completions])
    segment = torch.repeat_interleave(torch.arange(9), torch.tensor([len(prompt)] + [len(c) for c in completions]))

    logits = model(
        input_ids=tree["input_ids"],
        position_ids=tree["position_ids"],
        attention_mask=tree["attention_mask"],
        use_cache=False,
    ).logits
    logp = token_logprobs(logits, tree)[0]
    sums = torch.zeros(9).index_add(0, segment, logp)[1:]  # log p(completion | prompt), per completion

    model.set_attn_implementation("eager")
    with torch.no_grad():
        alone = []
        for c in completions:
            ids = torch.tensor([prompt + c])
            lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].float(), -1)
            alone.append(lp[len(prompt) - 1 :].gather(1, ids[0, len(prompt) :, None]).sum())
    gap = (sums.detach() - torch.stack(alone)).abs().max().item()
    print(f"8 completions: log-probs from one tree forward = each run alone (max gap {gap:.2e}): {gap < 1e-3}")

    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    loss = -(advantages * sums).mean()
    loss.backward()
    moved = sum(p.grad.abs().sum().item() for p in model.parameters() if p.grad is not None)
    flat = sum(len(prompt) + len(c) for c in completions)
    print(f"policy-gradient loss {loss.item():.4f}, gradient norm-1 {moved:.3f}")
    print(
        f"tokens: tree {tree['input_ids'].numel()} vs 8 sequences {flat} "
        f"({1 - tree['input_ids'].numel() / flat:.0%} fewer)"
    )


if __name__ == "__main__":
    main()
