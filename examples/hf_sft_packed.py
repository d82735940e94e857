"""SFT with packed documents on a Hugging Face decoder (a tiny Llama built from a config).

Rows of a datasets.Dataset are packed by graphattn.hf.PackingCollator into rows of at most 128
tokens; no token sees another document, positions restart per document, and the labels never
predict across a boundary. The check at the end: the packed loss equals the token-weighted mean
of each document's own loss with transformers' eager attention.

Run: python examples/hf_sft_packed.py
"""

from __future__ import annotations

import torch
from _common import DATA, tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

import graphattn.hf as gh


def documents(count: int = 48) -> list[list[int]]:
    """The first `count` lines of the bundled corpus, tokenized with the shipped WordPiece."""
    tok = tokenizer()
    lines = [line for line in (DATA / "corpus.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    return [tok.encode(line).ids[:200] for line in lines[:count]]


def main() -> None:
    from datasets import Dataset

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=3000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    name = gh.register()
    model.set_attn_implementation(name)
    rows = Dataset.from_dict({"input_ids": documents()})
    collator = gh.PackingCollator(max_length=128, return_labels=True)  # next-token labels: this is a causal LM
    loader = torch.utils.data.DataLoader(rows, batch_size=8, collate_fn=collator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step, batch in enumerate(loader):
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: {tuple(batch['input_ids'].shape)} rows x tokens, loss {loss.item():.4f}")

    batch = collator([rows[i] for i in range(4)])
    with torch.no_grad():
        packed = model(**batch, use_cache=False).loss.item()
        model.set_attn_implementation("eager")
        total, count = 0.0, 0
        for i in range(4):
            ids = torch.tensor([rows[i]["input_ids"]])
            total += model(input_ids=ids, labels=ids, use_cache=False).loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    print(f"packed loss {packed:.6f} = documents alone {total / count:.6f}: {abs(packed - total / count) < 1e-4}")


if __name__ == "__main__":
    main()
