"""Hybrid models (gated delta nets, Mamba2, Mamba1, short convolutions, lightning attention) on
graphattn: one sequence per row computes what each document computes alone (values and parameter
gradients); packed documents and prefix trees, which those layers cannot keep apart on CPU, are
refused in one line naming the layer. Tiny models built from configs, no download."""

from __future__ import annotations

import pytest
import torch

import graphattn.hf as gh
from graphattn.hf import hybrid

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

NAME = gh.register()
VOCAB = 64
TOL = 2e-4
ATTN = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    attention_dropout=0.0,
    pad_token_id=0,
)
MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=8, mamba_expand=2)
DELTA = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
MIXED = ["linear_attention", "full_attention"]


def _model(family: str, **extra):
    """A two-layer model: a non-attention layer, then an attention layer (unless `extra` says otherwise)."""
    tf = transformers
    torch.manual_seed(0)
    if family == "qwen3_next":
        moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
        config = tf.Qwen3NextConfig(**ATTN, **DELTA, **moe, num_hidden_layers=2, layer_types=MIXED, head_dim=8)
        config = tf.Qwen3NextConfig(**{**config.to_dict(), **extra})
        return tf.Qwen3NextForCausalLM(config).eval()
    if family == "qwen3_5":
        config = tf.Qwen3_5TextConfig(**ATTN, **DELTA, num_hidden_layers=2, layer_types=MIXED, head_dim=8)
        return tf.Qwen3_5ForCausalLM(config).eval()
    if family == "olmo_hybrid":
        config = tf.OlmoHybridConfig(**ATTN, **DELTA, num_hidden_layers=2, layer_types=MIXED)
        return tf.OlmoHybridForCausalLM(config).eval()
    if family == "bamba":
        config = tf.BambaConfig(**ATTN, **MAMBA2, num_hidden_layers=2, attn_layer_indices=[1])
        return tf.BambaForCausalLM(config).eval()
    if family == "falcon_h1":  # attention and Mamba2 side by side in every layer
        config = tf.FalconH1Config(**ATTN, **MAMBA2, num_hidden_layers=2, mamba_d_ssm=64, head_dim=8)
        return tf.FalconH1ForCausalLM(config).eval()
    if family == "granitemoehybrid":
        moe = dict(num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=32)
        config = tf.GraniteMoeHybridConfig(**ATTN, **MAMBA2, **moe, num_hidden_layers=2, layer_types=MIXED)
        return tf.GraniteMoeHybridForCausalLM(config).eval()
    if family == "nemotron_h":
        mamba = dict(mamba_num_heads=4, mamba_head_dim=16, n_groups=1, ssm_state_size=8, chunk_size=8, expand=2)
        config = tf.NemotronHConfig(**ATTN, **mamba, num_hidden_layers=2, layers_block_type=["mamba", "attention"])
        return tf.NemotronHForCausalLM(config).eval()
    if family == "zamba2":
        mamba = dict(mamba_headdim=16, n_mamba_heads=4, mamba_ngroups=1, mamba_d_state=8, chunk_size=8, mamba_expand=2)
        config = tf.Zamba2Config(**ATTN, **mamba, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"])
        return tf.Zamba2ForCausalLM(config).eval()
    if family == "jamba":  # Mamba1
        mamba = dict(mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False)
        layers = dict(
            expert_layer_period=2, expert_layer_offset=1, num_experts=2, attn_layer_period=2, attn_layer_offset=1
        )
        config = tf.JambaConfig(**ATTN, **mamba, **layers, num_hidden_layers=2)
        return tf.JambaForCausalLM(config).eval()
    if family == "lfm2":
        config = tf.Lfm2Config(**ATTN, num_hidden_layers=2, layer_types=["conv", "full_attention"])
        return tf.Lfm2ForCausalLM(config).eval()
    if family == "lfm2_moe":
        moe = dict(moe_intermediate_size=16, num_experts=2, num_experts_per_tok=1, num_dense_layers=1)
        config = tf.Lfm2MoeConfig(**ATTN, **moe, num_hidden_layers=2, layer_types=["conv", "full_attention"])
        return tf.Lfm2MoeForCausalLM(config).eval()
    if family == "kimi_linear":
        linear = dict(kda_layers=[1], full_attn_layers=[2], num_heads=4, head_dim=8, short_conv_kernel_size=4)
        attn = {**ATTN, "num_key_value_heads": 4}  # its attention is MLA
        config = tf.KimiLinearConfig(**attn, num_hidden_layers=2, linear_attn_config=linear)
        return tf.KimiLinearForCausalLM(config).eval()
    if family == "minimax":
        moe = dict(num_local_experts=2, num_experts_per_tok=1)
        config = tf.MiniMaxConfig(**ATTN, **moe, num_hidden_layers=2, layer_types=MIXED, head_dim=8, block_size=4)
        return tf.MiniMaxForCausalLM(config).eval()
    if family == "lfm3":
        config = tf.Lfm3Config(**ATTN, num_hidden_layers=2, layer_types=["conv", "full_attention"], head_dim=8)
        return tf.Lfm3ForCausalLM(config).eval()
    if family == "lara_mini":
        config = tf.LaraMiniConfig(**ATTN, **DELTA, num_hidden_layers=2, layer_types=MIXED, head_dim=8)
        return tf.LaraMiniForCausalLM(config).eval()
    if family == "qwen4_exp":
        config = tf.Qwen4ExpTextConfig(**ATTN, num_hidden_layers=2, head_dim=8)
        return tf.Qwen4ExpForCausalLM(config).eval()
    if family == "zaya":  # attention whose queries and keys pass a convolution
        return tf.ZayaForCausalLM(tf.ZayaConfig(**ATTN, num_hidden_layers=2, head_dim=8)).eval()
    if family == "bailing_hybrid":
        config = tf.BailingHybridConfig(**{**ATTN, "num_key_value_heads": 4}, num_hidden_layers=2, layer_types=MIXED)
        return tf.BailingHybridForCausalLM(config).eval()
    if family == "recurrent_gemma":
        config = tf.RecurrentGemmaConfig(
            **ATTN, num_hidden_layers=2, lru_width=32, attention_window_size=8, block_types=["recurrent", "attention"]
        )
        return tf.RecurrentGemmaForCausalLM(config).eval()
    raise ValueError(family)


# family -> (the non-attention layer, its layer type, what refuses packed documents)
FAMILIES = {
    "qwen3_next": ("Qwen3NextGatedDeltaNet", "linear_attention", "flash-linear-attention"),
    "qwen3_5": ("Qwen3_5GatedDeltaNet", "linear_attention", "flash-linear-attention"),
    "olmo_hybrid": ("OlmoHybridGatedDeltaNet", "linear_attention", "flash-linear-attention"),
    "bamba": ("BambaMixer", "linear_attention", "mamba-ssm"),
    "falcon_h1": ("FalconH1Mixer", "hybrid", "mamba-ssm"),
    "granitemoehybrid": ("GraniteMoeHybridMambaLayer", "linear_attention", "mamba-ssm"),
    "nemotron_h": ("NemotronHMamba2Mixer", "linear_attention", "mamba-ssm"),
    "zamba2": ("Zamba2MambaMixer", "linear_attention", "mamba-ssm"),
    "jamba": ("JambaMambaMixer", "linear_attention", "no seq_idx"),
    "lfm2": ("Lfm2ShortConv", "conv", "causal-conv1d"),
    "lfm2_moe": ("Lfm2MoeShortConv", "conv", "causal-conv1d"),
    "kimi_linear": ("KimiLinearDeltaAttention", "linear_attention", "KDA kernel"),
    "minimax": ("MiniMaxLightningAttention", "linear_attention", "lightning attention"),
    "lfm3": ("Lfm3ShortConv", "conv", "causal-conv1d"),
    "lara_mini": ("LaraMiniGatedDeltaNet", "linear_attention", "flash-linear-attention"),
    "qwen4_exp": ("Qwen4ExpTextGatedDeltaNet", "linear_attention", "flash-linear-attention"),
    "zaya": ("ZayaCCAProjection", "hybrid", "convolution of the queries and keys"),
    "bailing_hybrid": ("BailingHybridDeltaAttention", "linear_attention", "KDA kernel"),
    "recurrent_gemma": ("RecurrentGemmaRecurrentBlock", "linear_attention", "RG-LRU"),
}
MASKS_IN_SET_ORDER = ("lfm3", "lara_mini")  # builds its masks over set(layer_types): the recurrent one may come first
PADDING_REFUSAL = "attention_mask: a layer reads this structure as a padding mask"
LENGTHS = (11, 5, 9)  # longer than a chunk of the scans (8) and the convolutions' kernels (3-4)


def _docs(lengths=LENGTHS, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _logits(model, batch: dict) -> torch.Tensor:
    keys = ("input_ids", "position_ids", "attention_mask", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")
    return model(**{k: batch[k] for k in keys if k in batch}, use_cache=False).logits


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_document_per_row_equals_each_document_alone(family):
    model = _model(family)
    docs = _docs()
    batch = gh.pack_documents(docs, max_length=max(LENGTHS))  # a row each, padded to the longest
    assert batch["input_ids"].shape == (3, 11)
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        packed = _logits(model, batch)
    model.set_attn_implementation("eager")
    for row, doc in enumerate(docs):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([doc]), use_cache=False).logits[0]
        torch.testing.assert_close(packed[row, : len(doc)], alone, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", ["qwen3_next", "bamba", "jamba", "lfm2"])
def test_one_document_per_row_matches_the_parameter_gradients_of_each_alone(family):
    model = _model(family)
    docs = _docs(seed=2)
    weights = [torch.randn(len(d), VOCAB, generator=torch.Generator().manual_seed(i)) for i, d in enumerate(docs)]
    model.set_attn_implementation("eager")
    model.zero_grad()
    for doc, w in zip(docs, weights):
        (model(input_ids=torch.tensor([doc]), use_cache=False).logits[0] * w).sum().backward()
    alone = _grads(model)

    batch = gh.pack_documents(docs, max_length=max(LENGTHS))
    model.set_attn_implementation(NAME)
    model.zero_grad()
    packed = _logits(model, batch)
    sum((packed[row, : len(d)] * w).sum() for row, (d, w) in enumerate(zip(docs, weights))).backward()
    grads = _grads(model)
    assert grads.keys() == alone.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], alone[name], atol=TOL, rtol=TOL, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_documents_are_refused_in_one_line_naming_the_layer(family):
    layer, layer_type, why = FAMILIES[family]
    model = _model(family)
    model.set_attn_implementation(NAME)
    batch = gh.pack_documents(_docs())  # three documents in one row
    with pytest.raises(gh.GraphattnMaskError) as caught:
        _logits(model, batch)
    message = str(caught.value)
    assert "\n" not in message
    if family in MASKS_IN_SET_ORDER and message.startswith(PADDING_REFUSAL):
        return  # the recurrent layers' mask was built first: the structure refused it without naming them
    assert f"{layer} (layer type {layer_type!r}) cannot keep packed documents apart" in message
    assert why in message


@pytest.mark.parametrize("family", ["qwen3_next", "lfm2", "bamba"])
def test_a_prefix_tree_is_refused_and_a_single_chain_passes(family):
    layer = FAMILIES[family][0]
    model = _model(family)
    a, b, c, d = _docs((6, 4, 5, 3), seed=3)
    model.set_attn_implementation(NAME)
    tree = gh.pack_tree([(-1, a), (0, b), (0, c), (2, d)])  # a branches into b and c
    with pytest.raises(gh.GraphattnMaskError, match=f"^{layer} .*prefix tree") as caught:
        _logits(model, tree)
    assert "\n" not in str(caught.value)

    chain = gh.pack_tree([(-1, a), (0, b), (1, c)])  # one root-to-leaf path: one sequence
    with torch.no_grad():
        packed = _logits(model, chain)[0]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([a + b + c]), use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, atol=TOL, rtol=0)


def test_the_structure_answers_a_recurrent_layers_padding_questions():
    from transformers.masking_utils import create_recurrent_attention_mask

    batch = gh.pack_documents(_docs(), max_length=11)
    structure = batch["attention_mask"]
    real = torch.tensor([[True] * 11, [True] * 5 + [False] * 6, [True] * 9 + [False] * 2])
    assert torch.equal(structure == 1, real) and torch.equal(structure != 1, ~real)
    assert torch.equal(structure[:, -4:], real[:, -4:])
    config = _model("lfm2").config
    embeds = torch.zeros(3, 11, 32)
    assert torch.equal(create_recurrent_attention_mask(config, embeds, structure), real)
    full = gh.pack_documents(_docs((4, 4)), max_length=4)["attention_mask"]  # no padding: no mask to apply
    assert create_recurrent_attention_mask(config, torch.zeros(2, 4, 32), full) is None
    assert structure == structure and structure != full


@pytest.fixture
def kernels_present(monkeypatch):
    """As on CUDA with the family's kernels installed (not available here): nothing is missing."""
    monkeypatch.setattr(hybrid, "_kernels_missing", lambda mixer, device: [])


@pytest.mark.usefixtures("kernels_present")
def test_where_kernels_honour_boundaries_the_forward_must_carry_the_structures_own():
    model = _model("qwen3_next", layer_types=["full_attention", "linear_attention"])  # attention first
    model.set_attn_implementation(NAME)
    docs = _docs()
    bare = gh.pack_documents(docs)
    with pytest.raises(gh.GraphattnMaskError, match=r"needs the documents' boundaries as the forward's `seq_idx`"):
        _logits(model, bare)
    batch = gh.pack_documents(docs, return_seq_idx=True, return_flash_kwargs=True)
    wrong = dict(batch, seq_idx=torch.zeros_like(batch["seq_idx"]))
    with pytest.raises(gh.GraphattnMaskError, match=r"`seq_idx` does not match the structure's documents"):
        _logits(model, wrong)
    shifted = dict(batch, cu_seq_lens_q=batch["cu_seq_lens_q"] + 1)
    with pytest.raises(gh.GraphattnMaskError, match=r"`cu_seq_lens_q` does not match"):
        _logits(model, shifted)
    rows = gh.pack_documents(docs, max_length=16, return_seq_idx=True, return_flash_kwargs=True)
    with pytest.raises(gh.GraphattnMaskError, match=r"as one flattened row \(cu_seq_lens_q\), got 2 rows"):
        _logits(model, rows)
    from hf_models import tiny_model  # a model without recurrent layers asks nothing of the same structure

    llama = tiny_model("llama")
    llama.set_attn_implementation(NAME)
    with torch.no_grad():
        llama(**{k: bare[k] for k in ("input_ids", "position_ids", "attention_mask")}, use_cache=False)


def test_padding_inside_a_row_is_refused():
    model = _model("lfm2")
    model.set_attn_implementation(NAME)
    enter = torch.tensor([[0, 0, 0, -1, -1, 1, 1]], dtype=torch.int32)
    exit_ = torch.where(enter >= 0, enter + 1, enter)
    positions = torch.tensor([[0, 1, 2, 0, 0, 0, 1]])
    structure = gh.Structure("tree", positions, None, enter=enter, exit=exit_)
    batch = {"input_ids": torch.tensor([[5, 6, 7, 0, 0, 8, 9]]), "position_ids": positions, "attention_mask": structure}
    with pytest.raises(gh.GraphattnMaskError, match=r"^Lfm2ShortConv \(layer type 'conv'\) .*padding inside a row"):
        _logits(model, batch)


@pytest.mark.parametrize("attn_implementation", [NAME, None])
def test_a_model_without_attention_layers_cannot_read_packed_documents_as_one_sequence(attn_implementation):
    """Mamba2 never calls graphattn's mask function: the structure itself refuses to pass as a
    padding mask of rows that hold several documents, and answers one for rows of one document."""
    tf = transformers
    torch.manual_seed(0)
    mamba = dict(num_heads=4, head_dim=16, n_groups=1, state_size=8, chunk_size=8, expand=2)
    config = tf.Mamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, **mamba)
    model = tf.Mamba2ForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()
    docs = _docs()
    packed = gh.pack_documents(docs)
    with pytest.raises(gh.GraphattnMaskError, match=f"^{PADDING_REFUSAL}"):
        model(input_ids=packed["input_ids"], attention_mask=packed["attention_mask"])
    rows = gh.pack_documents(docs, max_length=11)
    with torch.no_grad():
        out = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits
        alone = model(input_ids=torch.tensor([docs[1]])).logits[0]
    torch.testing.assert_close(out[1, : len(docs[1])], alone, atol=TOL, rtol=0)
