"""Real trainers with PackingCollator: transformers.Trainer and TRL's SFTTrainer train a tiny Llama
(built from a config, a tokenizer built here with `tokenizers`); the rows' completion-only labels
reach the model packed beside their tokens; the structure answers `.sum()` as the trainers count
tokens; an encoder's batch holds no causal-LM labels."""

from __future__ import annotations

import pytest
import torch
from hf_models import VOCAB, tiny_model

import graphattn.hf as gh

NAME = gh.register()


class Recording(gh.PackingCollator):
    """The collator, keeping what it was given and what it returned."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[dict], dict]] = []

    def __call__(self, rows):
        batch = super().__call__(rows)
        self.seen.append(([dict(r) for r in rows], batch))
        return batch


def _rows(count: int, seed: int) -> list[dict]:
    """Prompt + completion rows: token ids and TRL's completion_mask (0 on the prompt)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        prompt, completion = (int(n) for n in torch.randint(2, 7, (2,), generator=g))
        ids = torch.randint(2, VOCAB, (prompt + completion,), generator=g).tolist()
        rows.append({"input_ids": ids, "completion_mask": [0] * prompt + [1] * completion})
    return rows


def _packed_labels_match(collator: Recording) -> int:
    """Each batch's labels on its real tokens are the rows' labels in order, -100 on each row's first
    token (a shifted loss never crosses documents); returns the real tokens seen."""
    tokens = 0
    for rows, batch in collator.seen:
        real = batch["attention_mask"].real_tokens()
        expected = [label for r in rows for label in [-100] + list(r["labels"][1:])]
        assert batch["labels"][real].tolist() == expected
        assert batch["input_ids"][real].tolist() == [t for r in rows for t in r["input_ids"]]
        assert (batch["labels"][~real] == -100).all()
        assert batch["attention_mask"].sum().item() == real.sum().item() == len(expected)
        tokens += len(expected)
    return tokens


def _trained(model, before: dict) -> bool:
    return any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


# the few steps both trainers take, on CPU, saving nothing
SHORT_RUN = dict(
    max_steps=3,
    per_device_train_batch_size=4,
    learning_rate=1e-2,
    report_to=[],
    use_cpu=True,
    save_strategy="no",
    logging_steps=1,
)


def test_transformers_trainer_trains_with_the_collator_and_counts_real_tokens(tmp_path):
    pytest.importorskip("accelerate")
    datasets = pytest.importorskip("datasets")
    from transformers import Trainer, TrainingArguments

    rows = _rows(12, seed=1)
    for r in rows:  # completion-only labels brought by the rows
        r["labels"] = [t if m else -100 for t, m in zip(r["input_ids"], r.pop("completion_mask"))]
    model = tiny_model("llama").train()
    model.set_attn_implementation(NAME)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    collator = Recording(max_length=16)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        **SHORT_RUN,
        include_num_input_tokens_seen="non_padding",
    )
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), data_collator=collator)
    trainer.train()
    assert trainer.state.global_step == 3
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert _trained(model, before)
    assert trainer.state.num_input_tokens_seen == _packed_labels_match(collator)


def test_trl_sft_trainer_trains_with_the_collator_on_completion_only_labels(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[EOS]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[PAD]")), pad_token="[PAD]", eos_token="[EOS]"
    )
    rows = _rows(12, seed=2)
    model = tiny_model("llama").train()
    model.set_attn_implementation(NAME)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    collator = Recording(max_length=16)
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        **SHORT_RUN,
        max_length=None,
        completion_only_loss=True,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        data_collator=collator,
    )
    trainer.train()
    assert trainer.state.global_step == 3 and _trained(model, before)
    # TRL built completion-only labels from completion_mask; the collator kept them, never its own
    by_ids = {tuple(r["input_ids"]): r["completion_mask"] for r in rows}
    for seen_rows, _ in collator.seen:
        for r in seen_rows:
            mask = by_ids[tuple(r["input_ids"])]
            assert r["labels"] == [t if m else -100 for t, m in zip(r["input_ids"], mask)]
    tokens = _packed_labels_match(collator)
    logged = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    assert logged[-1] == tokens  # TRL counts attention_mask.sum(): the real tokens


def test_the_collator_packs_trl_masks_beside_the_tokens_and_folds_them_only_into_labels_it_makes():
    rows = _rows(3, seed=3)
    for r, assistant in zip(rows, ([1] * 20, [0] + [1] * 20, [1] * 20)):
        r["assistant_masks"] = assistant[: len(r["input_ids"])]
    lengths = [len(r["input_ids"]) for r in rows]
    plain = gh.PackingCollator()(rows)
    assert "labels" not in plain  # nothing asked, nothing brought
    assert plain["completion_mask"][0].tolist() == sum((r["completion_mask"] for r in rows), [])
    assert plain["assistant_masks"][0].tolist() == sum((r["assistant_masks"] for r in rows), [])
    made = gh.PackingCollator(return_labels=True)(rows)
    keep = [c and a for r in rows for c, a in zip(r["completion_mask"], r["assistant_masks"])]
    ids = sum((r["input_ids"] for r in rows), [])
    expected = [t if k else -100 for t, k in zip(ids, keep)]
    for start in torch.tensor([0, *lengths[:-1]]).cumsum(0).tolist():
        expected[start] = -100
    assert made["labels"][0].tolist() == expected
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    assert torch.isfinite(model(**made, use_cache=False).loss)  # the mask columns travel with the batch


def test_rows_packed_by_trl_with_seq_lengths_are_split_into_their_documents():
    rows = [
        {"input_ids": [5, 6, 7, 8, 9], "labels": [5, 6, 7, 8, 9], "seq_lengths": [3, 2]},
        {"input_ids": [10, 11], "labels": [-100, 11], "seq_lengths": [2]},
    ]
    batch = gh.PackingCollator(return_flash_kwargs=True)(rows)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, 11]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 7]
    mask, _ = gh.dense_mask(gh.PackingCollator(causal=False)(rows)["attention_mask"])
    assert mask[0, 3].tolist() == [False, False, False, True, True, False, False]


def test_an_encoder_is_not_handed_causal_lm_labels():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    model = BertForMaskedLM(config).eval()
    model.set_attn_implementation(NAME)
    batch = gh.PackingCollator()([{"input_ids": [2, 5, 6, 7]}, {"input_ids": [2, 8, 9]}])
    assert "labels" not in batch
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    )
    assert out.loss is None and out.logits.shape == (1, 7, VOCAB)


def test_the_structure_answers_what_trainers_ask_of_an_attention_mask():
    batch = gh.pack_documents([[1, 2, 3], [4, 5], [6, 7, 8, 9]], max_length=5)
    structure = batch["attention_mask"]
    assert structure.shape == (2, 5) and structure.device == torch.device("cpu")
    assert structure.sum().item() == 9 and structure.sum(dim=1).tolist() == [5, 4]
    assert structure.to("cpu") is structure and structure.to(torch.float16) is structure
    assert not isinstance(structure, torch.Tensor)  # no dense mask is pretended
    assert torch.as_tensor(structure.sum()).dtype == torch.int64


def test_token_type_ids_travel_beside_the_tokens_and_are_not_masks():
    rows = [{"input_ids": [5, 6, 7], "token_type_ids": [0, 1, 1]}, {"input_ids": [8, 9], "token_type_ids": [0, 2]}]
    batch = gh.PackingCollator(max_length=3, return_labels=True)(rows)
    assert batch["token_type_ids"].tolist() == [[0, 1, 1], [0, 2, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, 9, -100]]
    with pytest.raises(ValueError, match=r"rows\[1\]\['token_type_ids'\]\[0\]: value -1 is negative"):
        gh.PackingCollator()([rows[0], {"input_ids": [8], "token_type_ids": [-1]}])
