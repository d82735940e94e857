"""Structured prompts at inference: `BlockCache` (passages encoded once, moved to any offset by
re-rotating RoPE) equals one eager forward of the whole prompt under the explicit block-attention
mask, and `generate_tree` decodes N continuations from one prefill as N generations would."""

from __future__ import annotations

import pytest
import torch
from hf_models import VOCAB, random_docs, tiny_model

import graphattn.hf as gh

MIN = torch.finfo(torch.float32).min
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _model(family: str, seed: int = 0, **extra):
    """The shared tiny models, plus families only this file needs (Qwen3, Gemma 3, GPT-2, GPT-OSS)."""
    import transformers as tf

    if family in ("llama", "qwen2", "mistral"):
        return tiny_model(family, seed, **extra)
    torch.manual_seed(seed)
    if family == "qwen3":
        config = tf.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8, attention_dropout=0.0, **extra)
        return tf.Qwen3ForCausalLM(config).eval()
    if family == "gemma3":  # a sliding layer (window 4, its own rope base) beside a full one
        config = tf.Gemma3TextConfig(
            **SMALL, num_key_value_heads=2, head_dim=8, sliding_window=4, layer_types=["sliding_attention",
            "full_attention"], attention_dropout=0.0, **extra,
        )  # fmt: skip
        return tf.Gemma3ForCausalLM(config).eval()
    if family == "stablelm":  # partial rotary applied by the attention module (half of each head turns)
        config = tf.StableLmConfig(**SMALL, num_key_value_heads=2, partial_rotary_factor=0.5, **extra)
        return tf.StableLmForCausalLM(config).eval()
    if family == "phi3":  # partial rotary applied by apply_rotary_pos_emb itself
        config = tf.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0, partial_rotary_factor=0.5, **extra)
        return tf.Phi3ForCausalLM(config).eval()
    if family == "gpt_neox":  # model.gpt_neox, layer.attention
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**SMALL, **extra)).eval()
    if family == "smollm3":  # layer 1 has no RoPE: its keys stay where they are
        config = tf.SmolLM3Config(**SMALL, num_key_value_heads=2, pad_token_id=0, no_rope_layers=[1, 0], **extra)
        return tf.SmolLM3ForCausalLM(config).eval()
    if family == "deepseek_v3":
        config = tf.DeepseekV3Config(
            **SMALL, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
            q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1,
            topk_group=1,
        )  # fmt: skip
        return tf.DeepseekV3ForCausalLM(config).eval()
    if family == "falcon_alibi":
        config = tf.FalconConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True
        )
        return tf.FalconForCausalLM(config).eval()
    if family == "gptj":  # interleaved RoPE with its own (tensor, sin, cos) function
        return tf.GPTJForCausalLM(tf.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4)).eval()
    if family == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)).eval()
    if family == "gpt_oss":
        config = tf.GptOssConfig(
            **{**SMALL, "intermediate_size": 32}, num_key_value_heads=2, head_dim=8, num_local_experts=2,
            num_experts_per_tok=1, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        return tf.GptOssForCausalLM(config).eval()
    raise ValueError(family)


def _block_mask(blocks, total: int, window: int | None = None, parents=None) -> torch.Tensor:
    """[1, 1, N, N] additive mask: a block's token sees its own block (causally) and its ancestor
    blocks (`parents`: -1 for a root), a tail or generated token sees every earlier token; a window
    keeps keys less than `window` slots back."""
    parents = parents if parents is not None else [-1] * len(blocks)
    sees = torch.eye(len(blocks) + 1, dtype=torch.bool)  # block a sees block b; the last row / column: the tail
    for index, parent in enumerate(parents):
        if parent >= 0:
            sees[index] |= sees[parent]
    sees[-1] = True
    segment = torch.full((total,), len(blocks))
    start = 0
    for index, block in enumerate(blocks):
        segment[start : start + len(block)] = index
        start += len(block)
    q = torch.arange(total)
    allowed = (q[None] <= q[:, None]) & sees[segment[:, None], segment[None]]
    if window is not None:
        allowed &= q[:, None] - q[None] < window
    return torch.zeros(total, total).masked_fill(~allowed, MIN)[None, None]


def _reference(model, blocks, tail, new=(), position_ids=None, parents=None) -> torch.Tensor:
    """Logits of one eager forward of `blocks + tail + new` under the explicit block mask."""
    ids = torch.tensor([t for b in blocks for t in b] + list(tail) + list(new))[None]
    total = ids.shape[1]
    window = getattr(model.config, "sliding_window", None)
    types = getattr(model.config, "layer_types", None)
    mask = _block_mask(blocks, total, window if window and not types else None, parents)  # Mistral: all slide
    if "sliding_attention" in (types or []):
        mask = {"full_attention": mask, "sliding_attention": _block_mask(blocks, total, window, parents)}
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
    finally:
        model.set_attn_implementation(previous)


def _prompt(seed: int = 3, lengths=(7, 5, 9), tail: int = 4):
    return random_docs(lengths, seed=seed), random_docs((tail,), seed=seed + 100)[0]


FAMILIES = ["llama", "qwen2", "mistral", "qwen3", "gemma3", "stablelm", "phi3", "gpt_neox", "smollm3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_equals_one_forward_under_the_block_mask(family):
    model = _model(family)
    blocks, tail = _prompt()
    out = gh.BlockCache(model).prefill(blocks, tail)
    reference = _reference(model, blocks, tail)
    assert out.logits.shape == (1, len(tail), VOCAB)
    torch.testing.assert_close(out.logits, reference[:, -len(tail) :], rtol=1e-5, atol=1e-5)
    assert out.input_ids.shape == (1, 25) and out.cache.get_seq_length() == 24  # all but the last prompt token
    assert torch.equal(out.position_ids, torch.arange(25)[None])


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "rope_theta": 10000.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ],
    ids=lambda r: r["rope_type"],
)
def test_the_rotation_is_the_models_own_rope_scaling_included(rope):
    """yarn scales cos / sin by an attention factor: the re-rotation must not apply it twice."""
    model = _model("llama", rope_parameters=rope)
    blocks, tail = _prompt(seed=8, lengths=(20, 30, 11))
    out = gh.BlockCache(model).prefill(blocks, tail)
    torch.testing.assert_close(out.logits, _reference(model, blocks, tail)[:, -len(tail) :], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_greedy_generation_matches_the_block_mask_reference_token_for_token(family):
    model = _model(family)
    blocks, tail = _prompt(seed=5)
    tokens = gh.BlockCache(model).generate(blocks, tail, max_new_tokens=10, do_sample=False, pad_token_id=0)
    new: list[int] = []
    for _ in range(10):  # the reference: one full forward per step, every generated token sees everything
        new.append(int(_reference(model, blocks, tail, new)[0, -1].argmax()))
    assert tokens.shape == (1, 25 + 10)
    assert tokens[0, :25].tolist() == [t for b in blocks for t in b] + tail
    assert tokens[0, 25:].tolist() == new


def test_generate_continues_from_the_prefill_cache():
    model = _model("llama")
    blocks, tail = _prompt(seed=6)
    cache = gh.BlockCache(model)
    out = cache.prefill(blocks, tail)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    ours = model.generate(input_ids=out.input_ids, position_ids=out.position_ids, cache=out.cache, **kwargs)
    assert torch.equal(ours, cache.generate(blocks, tail, **kwargs))
    assert int(ours[0, 25]) == int(out.logits[0, -1].argmax())  # the first new token is the prefill's argmax
    last = cache.prefill(blocks, tail, logits_to_keep=1).logits
    assert last.shape == (1, 1, VOCAB)
    torch.testing.assert_close(last, out.logits[:, -1:], rtol=1e-5, atol=1e-5)


def test_a_model_set_to_graphattn_and_sampled_rows_share_the_prefill():
    """The cache runs through graphattn's ordinary path (SDPA's); num_return_sequences rows all
    decode from the one prefill, as from its cache repeated per row."""
    model = _model("llama")
    model.set_attn_implementation(gh.register())
    blocks, tail = _prompt(seed=14)
    cache = gh.BlockCache(model)
    out = cache.prefill(blocks, tail)
    torch.testing.assert_close(out.logits, _reference(model, blocks, tail)[:, -4:], rtol=1e-5, atol=1e-5)
    kwargs = dict(max_new_tokens=6, do_sample=True, top_k=0, num_return_sequences=3, pad_token_id=0)
    torch.manual_seed(4)
    ours = cache.generate(blocks, tail, **kwargs)
    out.cache.batch_repeat_interleave(3)
    torch.manual_seed(4)
    theirs = model.generate(input_ids=out.input_ids, cache=out.cache, **kwargs)
    assert ours.shape == (3, 31) and torch.equal(ours, theirs)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_cached_passages_reused_at_other_offsets_equal_encoding_them_there(family):
    model = _model(family)
    a, b, c = random_docs((6, 9, 4), seed=11)
    tail = [5, 6, 7]
    cache = gh.BlockCache(model)
    cache.prefill([a, b], tail)  # a at 0, b at 6
    assert (cache.misses, cache.hits, len(cache)) == (2, 0, 2)
    out = cache.prefill([c, b, a], tail)  # b now at 4, a at 13: moved, not recomputed
    assert (cache.misses, cache.hits) == (3, 2)
    fresh = gh.BlockCache(_model(family)).prefill([c, b, a], tail)  # same weights (seed 0), nothing cached
    torch.testing.assert_close(out.logits, fresh.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits, _reference(model, [c, b, a], tail)[:, -3:], rtol=1e-5, atol=1e-5)
    for layer, fresh_layer in zip(out.cache.layers, fresh.cache.layers):  # the moved keys are the keys at b's offset
        torch.testing.assert_close(layer.keys, fresh_layer.keys, rtol=1e-5, atol=1e-5)


def test_restart_keeps_passages_at_zero_and_equals_the_mask_with_restarted_positions():
    model = _model("llama")
    blocks, tail = _prompt(seed=12)
    out = gh.BlockCache(model).prefill(blocks, tail, positions="restart")
    positions = torch.tensor([list(range(7)) + list(range(5)) + list(range(9)) + list(range(9, 13))])
    assert torch.equal(out.position_ids, positions)  # the tail after the longest passage (APE)
    reference = _reference(model, blocks, tail, position_ids=positions)
    torch.testing.assert_close(out.logits, reference[:, -4:], rtol=1e-5, atol=1e-5)
    tokens = gh.BlockCache(model).generate(blocks, tail, positions="restart", max_new_tokens=4, do_sample=False)
    new: list[int] = []
    for step in range(4):
        extended = torch.cat([positions, torch.arange(13, 13 + step)[None]], dim=1)
        new.append(int(_reference(model, blocks, tail, new, position_ids=extended)[0, -1].argmax()))
    assert tokens[0, 25:].tolist() == new


def test_restart_refuses_a_sliding_window_that_a_block_edge_crosses():
    blocks, tail = _prompt()
    with pytest.raises(gh.GraphattnMaskError, match="layer 1's sliding window of 4 tokens would cross a block edge"):
        gh.BlockCache(_model("qwen2")).prefill(blocks, tail, positions="restart")
    out = gh.BlockCache(_model("qwen2")).prefill([blocks[0]], tail, positions="restart")  # one block: no edge
    assert out.logits.shape == (1, 4, VOCAB)


def test_least_recently_used_passages_are_evicted_past_max_tokens():
    model = _model("llama")
    a, b, c, big = random_docs((5, 5, 5, 13), seed=21)
    cache = gh.BlockCache(model, max_tokens=12)
    keys, values = cache.encode(a)
    assert len(keys) == len(values) == 2 and keys[0].shape == (1, 2, 5, 8)
    cache.encode(b)
    cache.encode(a)  # a is now the most recent
    assert cache.hits == 1 and cache.num_tokens == 10
    cache.encode(c)  # 15 > 12: b goes
    assert a in cache and c in cache and b not in cache and cache.num_tokens == 10
    assert cache.nbytes == 2 * 2 * 10 * 2 * 8 * 4  # layers x (k, v) x tokens x kv heads x head dim x fp32
    cache.encode(big)  # longer than max_tokens: computed, not kept
    assert big not in cache and len(cache) == 2 and cache.misses == 4


def test_generate_tree_decodes_from_one_prefill_as_separate_generations_do():
    model = _model("qwen2")
    prompt = random_docs((11,), seed=5)[0]
    seen: list[tuple[int, int]] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        kwargs = dict(max_new_tokens=8, pad_token_id=0)
        ours = gh.generate_tree(model, prompt, 4, do_sample=False, **kwargs)
        assert seen[:2] == [(1, 10), (4, 1)]  # the prompt once, then one token per row per step
        seen.clear()
        repeated = model.generate(input_ids=torch.tensor([prompt]).expand(4, -1), do_sample=False, **kwargs)
        assert seen[0] == (4, 11)  # what generate does without it: the prompt 4 times
    finally:
        hook.remove()
    assert torch.equal(ours, repeated)


def test_generate_tree_samples_draw_from_the_same_logits_as_num_return_sequences():
    model = _model("llama")
    model.lm_head.weight.data *= 20  # peaked distributions: a differing logit would show in the samples
    prompt = random_docs((9,), seed=9)[0]
    kwargs = dict(max_new_tokens=12, do_sample=True, top_k=0, pad_token_id=0)
    torch.manual_seed(3)
    ours = gh.generate_tree(model, prompt, 5, **kwargs)
    torch.manual_seed(3)
    theirs = model.generate(input_ids=torch.tensor([prompt]), num_return_sequences=5, **kwargs)
    assert torch.equal(ours, theirs)
    assert len({tuple(row) for row in ours[:, 9:].tolist()}) > 1  # the rows really sampled differently
    torch.manual_seed(3)
    beams = gh.generate_tree(model, prompt, 2, num_beams=3, max_new_tokens=5, pad_token_id=0)
    reference = model.generate(input_ids=torch.tensor([prompt]).expand(2, -1), num_beams=3, max_new_tokens=5)
    assert torch.equal(beams, reference)


def test_generate_tree_needs_no_rope():
    model = _model("gpt2")
    prompt = random_docs((7,), seed=2)[0]
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    ours = gh.generate_tree(model, prompt, 3, **kwargs)
    assert torch.equal(ours, model.generate(input_ids=torch.tensor([prompt]).expand(3, -1), **kwargs))


def test_the_shared_prompt_is_held_once_by_reference():
    from graphattn.hf.kv import new_cache, shared_prefix_cache

    model = _model("llama")
    cache = new_cache()
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), cache=cache, use_cache=True)
    shared = shared_prefix_cache(cache, 6)
    layer = shared.layers[0]
    assert layer.prefix_keys is cache.layers[0].keys and layer.prefix_keys.shape[0] == 1
    keys, _ = layer.update(torch.zeros(6, 2, 1, 8), torch.zeros(6, 2, 1, 8))
    assert keys.shape == (6, 2, 5, 8) and layer.keys.shape == (6, 2, 1, 8) and shared.get_seq_length() == 5


def _tree():
    """A system prompt, two passages under it (the first with a note of its own), a third root passage."""
    system, a, note, b, other = random_docs((6, 7, 3, 5, 4), seed=31)
    return [system, a, note, b, other], [-1, 0, 1, 0, -1], [9, 8, 7]


def _tree_positions(blocks, parents, tail: int) -> torch.Tensor:
    """restart: a block starts at its parent's end (a root at 0), the tail after the longest path."""
    starts: list[int] = []
    for parent in parents:
        starts.append(starts[parent] + len(blocks[parent]) if parent >= 0 else 0)
    end = max(s + len(b) for s, b in zip(starts, blocks))
    ranges = [torch.arange(s, s + len(b)) for s, b in zip(starts, blocks)] + [torch.arange(end, end + tail)]
    return torch.cat(ranges)[None]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("positions", ["continue", "restart"])
def test_tree_blocks_equal_the_tree_mask_reference(family, positions):
    model = _model(family)
    blocks, parents, tail = _tree()
    cache = gh.BlockCache(model)
    out = cache.prefill(blocks, tail, positions=positions, parents=parents)
    position_ids = _tree_positions(blocks, parents, len(tail)) if positions == "restart" else None
    reference = _reference(model, blocks, tail, position_ids=position_ids, parents=parents)
    torch.testing.assert_close(out.logits, reference[:, -3:], rtol=1e-5, atol=1e-5)
    expected = position_ids if position_ids is not None else torch.arange(28)[None]
    assert torch.equal(out.position_ids, expected)
    tokens = cache.generate(blocks, tail, positions=positions, parents=parents, max_new_tokens=5, do_sample=False)
    assert cache.hits == 5  # the second call found every block
    new: list[int] = []
    for step in range(5):
        extended = None
        if position_ids is not None:
            extended = torch.cat([position_ids, position_ids[:, -1:] + 1 + torch.arange(step)[None]], dim=1)
        new.append(int(_reference(model, blocks, tail, new, extended, parents)[0, -1].argmax()))
    assert tokens[0, 28:].tolist() == new


def test_a_tree_block_is_kept_under_its_path():
    """restart places a passage right after the system prompt in any order: found again; with
    continue its distance to the system prompt changes with the order, so it is encoded again."""
    model = _model("llama")
    system, a, b, c = random_docs((6, 7, 5, 4), seed=33)
    tail = [3, 4]
    cache = gh.BlockCache(model)
    cache.prefill([system, a, b], tail, positions="restart", parents=[-1, 0, 0])
    assert (cache.misses, cache.hits) == (3, 0)
    out = cache.prefill([system, c, b], tail, positions="restart", parents=[-1, 0, 0])
    assert (cache.misses, cache.hits) == (4, 2)  # system and b found, c new
    positions = _tree_positions([system, c, b], [-1, 0, 0], 2)
    reference = _reference(model, [system, c, b], tail, position_ids=positions, parents=[-1, 0, 0])
    torch.testing.assert_close(out.logits, reference[:, -2:], rtol=1e-5, atol=1e-5)
    cache.prefill([system, c, b], tail, positions="continue", parents=[-1, 0, 0])
    assert (cache.misses, cache.hits) == (5, 4)  # b is 4 tokens further from the system prompt than before
    out = cache.prefill([system, b, a], tail, parents=[-1, 0, 0])  # continue: b right after system, as at first
    assert (cache.misses, cache.hits) == (6, 6)
    reference = _reference(model, [system, b, a], tail, parents=[-1, 0, 0])
    torch.testing.assert_close(out.logits, reference[:, -2:], rtol=1e-5, atol=1e-5)


def test_tree_blocks_refuse_a_sliding_window_and_bad_parents():
    blocks, parents, tail = _tree()
    with pytest.raises(gh.GraphattnMaskError, match="blocks with parents: layer 1's sliding window of 4 tokens"):
        gh.BlockCache(_model("qwen2")).prefill(blocks, tail, parents=parents)
    cache = gh.BlockCache(_model("llama"))
    for bad, message in (
        ([-1, 0], "parents: 2 entries for 5 blocks"),
        ([-1, 0, 2, 0, -1], r"parents\[2\] \(-1 or an earlier block\): expected an integer in -1..1, got 2"),
        ("01", "parents: expected a list of block indices"),
        ([-1, 0.0, 1, 0, -1], r"parents\[1\] \(-1 or an earlier block\): expected an integer"),
    ):
        with pytest.raises(ValueError, match=message):
            cache.prefill(blocks, tail, parents=bad)


def test_no_blocks_is_an_ordinary_prefill():
    model = _model("llama")
    out = gh.BlockCache(model).prefill([], [5, 6, 7])
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([[5, 6, 7]])).logits
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    assert out.cache.get_seq_length() == 2


@pytest.mark.parametrize(
    ("family", "extra", "message"),
    [
        ("gpt2", {}, "gpt2 model has no rotary position embedding"),
        ("gpt_oss", {}, "gpt_oss model has attention sinks"),
        ("deepseek_v3", {}, "deepseek_v3 model uses multi-head latent attention"),
        ("falcon_alibi", {}, "falcon model's positions are not RoPE"),
        ("gptj", {}, "gptj model's apply_rotary_pos_emb does not take"),
        (
            "llama",
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
            "rope_type 'dynamic' recomputes its frequencies from the sequence length",
        ),
        ("llama", {"is_causal": False}, r"llama model is set bidirectional \(config.is_causal=False\)"),
    ],
    ids=["gpt2", "gpt_oss", "mla", "alibi", "gptj", "dynamic", "bidirectional"],
)
def test_models_the_rotation_cannot_honour_are_refused_in_one_line(family, extra, message):
    with pytest.raises(gh.GraphattnMaskError, match=message) as caught:
        gh.BlockCache(_model(family, **extra))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.prefill([[1, 2]], [3], positions="middle"), "positions: expected one of"),
        (lambda c: c.prefill([[1, 2]], []), "tail: expected at least one token id"),
        (lambda c: c.prefill([[1, 2], [3, VOCAB]], [3]), r"blocks\[1\]\[1\]: token id 64 is not below the vocab"),
        (lambda c: c.prefill([1, 2], [3]), r"blocks\[0\]: expected a list of integer token ids"),
        (lambda c: c.prefill(torch.tensor([[1, 2]]), [3]), "blocks: expected a list of passages"),
        (lambda c: c.prefill([[1, -2]], [3]), r"blocks\[0\]\[1\]: token id -2 is negative"),
        (lambda c: c.prefill([list(range(1, 60))] * 40, [3]), "over the model's max_position_embeddings"),
        (lambda c: c.encode([1.5]), r"tokens\[0\]: expected an integer token id"),
        (lambda c: c.generate([[1]], [2], input_ids=[[1]]), "generate_kwargs: input_ids is built from blocks"),
        (lambda c: gh.BlockCache(c.model, max_tokens=0), "max_tokens: expected an integer in 1.."),
        (lambda c: gh.generate_tree(c.model, [1, 2], 0), "n: expected an integer in 1.."),
        (lambda c: gh.generate_tree(c.model, [1, 2], 2, num_return_sequences=2), "num_return_sequences is built"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_arguments_are_one_line_naming_the_argument(call, message):
    cache = gh.BlockCache(_model("llama", max_position_embeddings=2048))
    with pytest.raises(ValueError, match=message) as caught:
        call(cache)
    assert "\n" not in str(caught.value)


def test_a_model_in_training_mode_is_refused_before_a_passage_is_kept():
    model = _model("llama")
    cache = gh.BlockCache(model.train())
    with pytest.raises(ValueError, match="model: in training mode its dropout would make"):
        cache.encode([1, 2, 3])
    assert len(cache) == 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_generate_tree_decodes_every_leaf_of_a_segment_tree_from_one_prefill(family):
    """prompt -> {A -> {A1, A2}, B}: every segment computed once, n rows from each leaf equal to
    generate on that root-to-leaf path repeated n times."""
    model = _model(family)
    prompt, a, a1, a2, b = random_docs((6, 4, 3, 1, 5), seed=41)
    segments = [(-1, prompt), (0, a), (1, a1), (1, a2), (0, b)]
    seen: list[tuple[int, ...]] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    try:
        outs = gh.generate_tree(model, segments, 3, **kwargs)
    finally:
        hook.remove()
    assert seen[:5] == [(1, 6), (1, 4), (1, 3), (1, 1), (1, 5)]  # each segment once, before any decoding
    assert len(outs) == 3
    for out, path in zip(outs, ([prompt, a, a1], [prompt, a, a2], [prompt, b])):
        ids = torch.tensor([[t for seg in path for t in seg]]).expand(3, -1)
        assert torch.equal(out, model.generate(input_ids=ids, **kwargs))


def test_generate_tree_refuses_a_bad_segment_tree_in_one_line():
    model = _model("llama")
    for bad, message in (
        ([(-1, [1, 2]), (3, [4])], r"prompt\[1\]: parent 3 must be -1 or an earlier segment"),
        ([(-1, [1, 2]), (0, [])], r"prompt\[1\]: empty segment"),
        ([(-1, [1, VOCAB])], r"prompt\[0\] tokens\[1\]: token id 64 is not below the vocabulary size"),
        ([(0.5, [1])], r"prompt\[0\]: parent must be an integer"),
        ([(-1, 5)], r"prompt\[0\] tokens: expected a list of integer token ids"),
    ):
        with pytest.raises(ValueError, match=message) as caught:
            gh.generate_tree(model, bad, 2, max_new_tokens=2)
        assert "\n" not in str(caught.value)
