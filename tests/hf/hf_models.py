"""Tiny random Hugging Face models built from configs (no download), shared by the hf tests."""

from __future__ import annotations

import torch

VOCAB = 64


def _config(family: str, **extra):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if family == "llama":
        return tf.LlamaConfig(**{**common, "num_key_value_heads": 2, "attention_dropout": 0.0, **extra})
    if family == "qwen2":  # GQA and a sliding-window layer (layer 1) beside a full one
        return tf.Qwen2Config(
            **common,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            attention_dropout=0.0,
            **extra,
        )
    if family == "mistral":  # every layer a sliding window of 5
        mistral = dict(num_key_value_heads=2, sliding_window=5, attention_dropout=0.0)
        return tf.MistralConfig(**{**common, **mistral, **extra})
    if family == "bert":
        bert = dict(type_vocab_size=8, max_position_embeddings=512, attention_probs_dropout_prob=0.0)
        return tf.BertConfig(**{**common, **bert, "hidden_dropout_prob": 0.0, **extra})
    if family == "modernbert":  # layer 0 global, layer 1 local (bidirectional window of 2)
        return tf.ModernBertConfig(
            **common,
            global_attn_every_n_layers=2,
            local_attention=4,
            attention_dropout=0.0,
            embedding_dropout=0.0,
            mlp_dropout=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            **extra,
        )
    raise ValueError(family)


DECODERS = ("llama", "qwen2")
ENCODERS = ("bert", "modernbert")


def tiny_model(family: str, seed: int = 0, **extra):
    import transformers as tf

    torch.manual_seed(seed)
    config = _config(family, **extra)
    cls = {
        "llama": tf.LlamaForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM,
        "mistral": tf.MistralForCausalLM,
        "bert": tf.BertModel,
        "modernbert": tf.ModernBertModel,
    }[family]
    return cls(config).eval()


def outputs(model, **inputs) -> torch.Tensor:
    """Logits of a causal LM, last hidden states of an encoder."""
    out = model(**inputs, use_cache=False) if hasattr(model, "lm_head") else model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def random_docs(lengths, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]
