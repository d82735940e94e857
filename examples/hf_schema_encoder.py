"""A structured encoder from a schema: HotpotQA records (a question, paragraphs, titles and
sentences as a DocGraph) compiled with schemas/hotpotqa.yaml into one flat sequence per record
for a Hugging Face BERT built from a config.

Each record's globals (question tokens, one per paragraph, title and sentence) come first as real
positions, its wordpieces follow; the schema's hard masks decide who attends whom, and each
pair's relative label (distance, belongs, does-not-belong, cross-paragraph) selects a learned
bias per layer and head. The tables start at zero, so before training the model computes what it
computes on the same tokens with the same mask and no bias (checked below); a few steps
predicting each sentence global's `supporting` flag (the schema's target) then move them.

Run: python examples/hf_schema_encoder.py
"""

from __future__ import annotations

import torch
from _common import DATA, schema_path, tokenizer
from transformers import BertConfig, BertModel

import graphattn.hf as gh
from graphattn.ingest.json import read_json


def main() -> None:
    torch.manual_seed(0)
    graphs = list(read_json(DATA / "hotpotqa_sample.json", "hotpotqa"))
    batch, targets = gh.compile_schema(graphs, schema_path("hotpotqa"), tokenizer(), return_targets=True)
    structure = batch["attention_mask"]
    print(
        f"{len(graphs)} records -> rows of {structure.global_length} globals + "
        f"{structure.shape[1] - structure.global_length} long tokens, {structure.num_labels} relative labels"
    )
    config = BertConfig(
        vocab_size=3000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        type_vocab_size=8,
        max_position_embeddings=1024,
        attention_probs_dropout_prob=0.0,
    )
    model = BertModel(config)
    tables = gh.attach_relative_bias(model, structure.num_labels)
    name = gh.register()
    model.set_attn_implementation(name)
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "position_ids", "attention_mask")}

    model.eval()
    with torch.no_grad():
        ours = model(**inputs).last_hidden_state
        mask, _ = gh.dense_mask(structure)
        model.set_attn_implementation("eager")
        additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)[:, None]
        plain = model(**dict(inputs, attention_mask=additive)).last_hidden_state
        model.set_attn_implementation(name)
    rows = mask.any(-1)
    gap = (ours - plain)[rows].abs().max().item()
    print(
        "zero-initialised bias: equals BERT without graphattn on the same tokens and mask "
        f"(max gap {gap:.1e}): {gap < 2e-4}"
    )

    head = torch.nn.Linear(64, 1)
    optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-2)
    target = targets["supporting"]  # [B, G]: 1/0 on sentence globals, -100 elsewhere
    weight = (target >= 0).float()
    model.train()
    for step in range(3):
        out = model(**inputs).last_hidden_state[:, : structure.global_length]
        logits = head(out)[..., 0]
        loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(logits, target.clamp(min=0).float(), reduction="none")
            * weight
        ).sum() / weight.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}, bias table |b| layer 0 {tables[0].abs().sum().item():.4f}")


if __name__ == "__main__":
    main()
