"""A model set to graphattn runs ordinary inputs (a [B, N] padding mask or none, `generate` with
its KV cache) exactly as transformers' SDPA does, so the model that trains packed also generates."""

from __future__ import annotations

import pytest
import torch
from hf_models import outputs, random_docs, tiny_model

import graphattn.hf as gh

NAME = gh.register()


def _pair(family: str, **extra):
    ours, sdpa = tiny_model(family, **extra), tiny_model(family, **extra)
    sdpa.load_state_dict(ours.state_dict())
    ours.set_attn_implementation(NAME)
    sdpa.set_attn_implementation("sdpa")
    return ours, sdpa


def _prompts():
    ids = torch.tensor(random_docs((9, 9), seed=1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # the second prompt left-padded
    return ids, mask


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_greedy_generate_equals_sdpa_token_for_token(family):
    ours, sdpa = _pair(family)
    ids, mask = _prompts()
    kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    tokens = ours.generate(input_ids=ids, **kwargs)
    assert tokens.shape == (2, 25)  # 16 new tokens each, past qwen2's and mistral's windows
    assert torch.equal(tokens, sdpa.generate(input_ids=ids, **kwargs))


@pytest.mark.parametrize("family", ["llama", "qwen2", "bert", "modernbert"])
def test_a_forward_without_a_structure_is_sdpa_bit_for_bit(family):
    ours, sdpa = _pair(family)
    ids, mask = _prompts()
    with torch.no_grad():
        for extra in ({"attention_mask": mask}, {}):
            assert torch.equal(outputs(ours, input_ids=ids, **extra), outputs(sdpa, input_ids=ids, **extra))


def test_the_model_that_trains_packed_generates_like_its_sdpa_twin():
    ours, sdpa = _pair("qwen2")
    ours.train()
    batch = gh.PackingCollator(max_length=24)([{"input_ids": d} for d in random_docs((10, 12, 7, 15), seed=2)])
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    logits = ours(**batch, use_cache=False).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["input_ids"][:, 1:].flatten()).backward()
    optimizer.step()
    ours.eval()
    sdpa.load_state_dict(ours.state_dict())
    ids, mask = _prompts()
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(input_ids=ids, **kwargs), sdpa.generate(input_ids=ids, **kwargs))


def test_a_structure_is_still_refused_after_a_kv_cache():
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    ids, _ = _prompts()
    cache = model(input_ids=ids[:1], use_cache=True).past_key_values  # an ordinary prefill
    step = gh.pack_documents([[7]])
    with pytest.raises(gh.GraphattnMaskError, match="without a KV cache"):
        model(input_ids=step["input_ids"], attention_mask=step["attention_mask"], cache=cache)
