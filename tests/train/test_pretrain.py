"""MLM + CPC pre-training (graphattn.train.pretrain): losses by hand, CPC positives matched by
identity, gradients through both CPC branches, and both losses falling on a generated corpus."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scripted_rng import ScriptedRng
from torch.utils.data import DataLoader

from graphattn.compile import compile_instance
from graphattn.compile.batching import collate
from graphattn.compile.masking import (
    IGNORE_INDEX,
    MaskingConfig,
    PretrainingDataset,
    TokenInfo,
    collate_pretraining,
    mask_instance,
    sentence_instance,
)
from graphattn.errors import GraphattnError
from graphattn.graph import DocGraph
from graphattn.nn import EtcConfig, EtcEncoder
from graphattn.tokenize import load_tokenizer
from graphattn.train.pretrain import PretrainingConfig, PretrainingModel, info_nce_loss, mlm_loss

TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "data" / "tokenizer.json"
SCHEMA = {
    "name": "tiny-sentences",
    "local_radius": 8,
    "relative_pos_max_distance": 4,
    "relative_vocab_size": 16,
    "max_long_length": 256,
    "max_global_length": 32,
    "special_tokens": {"global": "[unused0]"},
    "node_types": {"document": {}, "sentence": {"global": "node", "long": True}},
    "relations": {"contains": {"hierarchy": True}},
    "masks": {"hard_g2l": True},
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(TOKENIZER))


@pytest.fixture(scope="module")
def info(tok):
    return TokenInfo.from_tokenizer(tok)


def sentence_graph(sentences: list[str], doc_id: str = "doc") -> DocGraph:
    text = " ".join(sentences)
    graph = DocGraph(text, doc_id=doc_id)
    graph.add_node("doc", "document", (0, len(text)))
    start = 0
    for i, sentence in enumerate(sentences):
        graph.add_child("doc", f"s{i}", "sentence", (start, start + len(sentence)))
        start += len(sentence) + 1
    return graph


def tiny_encoder(vocab_size: int, hidden: int = 32, seed: int = 0) -> EtcEncoder:
    torch.manual_seed(seed)
    return EtcEncoder(
        EtcConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=2 * hidden,
            local_radius=8,
            relative_pos_max_distance=4,
            relative_vocab_size=16,
            hidden_dropout_prob=0.0,
            attention_backend="blocked",
        )
    )


# -- losses by hand ----------------------------------------------------------------------------


def test_info_nce_by_hand():
    predictions = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    targets = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # scores [[2, 0], [0, 1]]
    loss, accuracy = info_nce_loss(predictions, targets)
    expected = (-math.log(math.exp(2) / (math.exp(2) + 1)) - math.log(math.e / (1 + math.e))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert accuracy.item() == 1.0
    loss_t, _ = info_nce_loss(predictions, targets, temperature=0.5)  # scores [[4, 0], [0, 2]]
    expected_t = (-math.log(math.exp(4) / (math.exp(4) + 1)) - math.log(math.exp(2) / (math.exp(2) + 1))) / 2
    assert loss_t.item() == pytest.approx(expected_t, rel=1e-6)


def test_info_nce_leaves_excluded_negatives_out_never_the_positive():
    predictions = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    targets = predictions.clone()  # rows 0 and 1 are the same sentence twice
    exclude = torch.tensor([[False, True, False], [True, False, False], [False, False, False]])
    loss, accuracy = info_nce_loss(predictions, targets, exclude | torch.eye(3, dtype=torch.bool))
    per_row = [-math.log(math.e / (math.e + 1)), -math.log(math.e / (math.e + 1)), -math.log(math.e / (math.e + 2))]
    assert loss.item() == pytest.approx(sum(per_row) / 3, rel=1e-6)
    assert accuracy.item() == 1.0
    with pytest.raises(GraphattnError, match="must both be \\[S, D\\]"):
        info_nce_loss(predictions, targets[:2])


def test_mlm_loss_over_predicted_positions_only():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    loss, accuracy = mlm_loss(logits, torch.tensor([0, 1]))
    expected = (-math.log(math.exp(2) / (math.exp(2) + 2)) - math.log(1 / (math.exp(3) + 2))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6) and accuracy.item() == 0.5
    empty_loss, empty_acc = mlm_loss(torch.zeros(0, 3, requires_grad=True), torch.zeros(0, dtype=torch.long))
    assert empty_loss.item() == 0.0 and empty_acc.item() == 0.0


def test_pretraining_config_checks():
    with pytest.raises(GraphattnError, match="not both 0"):
        PretrainingConfig(mlm_weight=0.0, cpc_weight=0.0)
    with pytest.raises(GraphattnError, match="must be > 0"):
        PretrainingConfig(cpc_temperature=0.0)


# -- CPC positives are matched by identity, not by text ------------------------------------------

MOON = "The Moon pulls the sea."


def identical_sentence_batch(tok, info):
    """Two documents; the MOON sentence is sentences 0 and 2 of the first and 1 of the second.
    The script selects exactly those three for CPC and masks no MLM word."""
    first = compile_instance(sentence_graph([MOON, "Tides rise.", MOON, "Earth rotates."], "a"), SCHEMA, tok)
    second = compile_instance(sentence_graph(["Earth rotates.", MOON, "The Sun shines."], "b"), SCHEMA, tok)
    config = MaskingConfig(mlm_probability=0.0, cpc_probability=0.5)
    # floor(0.5 * 4 + 0.0) = 2 sentences: globals 0 and 2; floor(0.5 * 3 + 0.0) = 1: global 1.
    examples = [
        mask_instance(first, info, ScriptedRng(picks=[[0, 2]], uniforms=[0.0]), config),
        mask_instance(second, info, ScriptedRng(picks=[[1]], uniforms=[0.0]), config),
    ]
    return (first, second), examples


def test_cpc_index_and_sentence_rows_follow_the_selected_globals(tok, info):
    (first, second), examples = identical_sentence_batch(tok, info)
    batch = collate_pretraining(examples)
    assert batch.cpc_index.tolist() == [[0, 0], [0, 2], [1, 1]]
    moon_ids = first.long_token_ids[first.long_owners["sentence"] == 0].tolist()
    for row, (b, g) in enumerate(batch.cpc_index.tolist()):
        source = (first, second)[b]
        expected = source.long_token_ids[source.long_owners["sentence"] == g].tolist()
        assert expected == moon_ids  # the same text three times ...
        n = len(expected)
        assert batch.sentences.long_token_ids[row, :n].tolist() == expected
        assert batch.sentences.global_token_ids[row].tolist() == [int(source.global_token_ids[g])]
        masked = batch.batch.long_token_ids[b, : source.long_length].numpy()
        assert np.all(masked[source.long_owners["sentence"] == g] == tok.mask_id)
    # ... so each is a duplicate of the other two, and never of itself
    assert batch.cpc_duplicates.tolist() == [[False, True, True], [True, False, True], [True, True, False]]
    assert torch.all(batch.mlm_labels == IGNORE_INDEX)


def test_cpc_targets_are_each_sentence_encoded_alone_by_position(tok, info):
    """Row s of the targets is the encoder's output for instance `sentence_instance(b, g)` built
    independently for cpc_index[s]; the positive of prediction s is target s (the diagonal)."""
    (first, second), examples = identical_sentence_batch(tok, info)
    model = PretrainingModel(tiny_encoder(tok.vocab_size)).eval()
    batch = collate_pretraining(examples)
    with torch.no_grad():
        global_hidden, _ = model.encoder(batch.batch)
        predictions, targets = model.cpc_vectors(global_hidden, batch)
        for row, (b, g) in enumerate(batch.cpc_index.tolist()):
            alone = collate([sentence_instance((first, second)[b], g)])
            expected_target = model.encoder(alone)[0][0, 0]
            torch.testing.assert_close(targets[row], expected_target, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(predictions[row], model.cpc(global_hidden[b, g]), rtol=1e-5, atol=1e-5)
    # Positions differ in context, so the predictions differ although the sentences are identical.
    assert not torch.allclose(predictions[0], predictions[2], atol=1e-4)


def test_identical_sentences_as_negatives_change_the_loss_only_when_kept(tok, info):
    _, examples = identical_sentence_batch(tok, info)
    batch = collate_pretraining(examples)
    encoder = tiny_encoder(tok.vocab_size)
    excluded = PretrainingModel(encoder, PretrainingConfig(exclude_duplicate_negatives=True)).eval()
    kept = PretrainingModel(encoder, PretrainingConfig(exclude_duplicate_negatives=False)).eval()
    kept.load_state_dict(excluded.state_dict())
    with torch.no_grad():
        out_excluded, out_kept = excluded(batch), kept(batch)
    # Every negative here is a duplicate: excluded, each row's softmax has only its positive.
    assert out_excluded["cpc_loss"].item() == pytest.approx(0.0, abs=1e-6)
    assert out_kept["cpc_loss"].item() == pytest.approx(math.log(3), rel=1e-3)  # three identical encodings


# -- the model: outputs and gradients ----------------------------------------------------------


def test_model_output_and_gradients_reach_both_cpc_branches(tok, info):
    text = [
        "Tides rise and fall twice every day.",
        "The Moon pulls the sea.",
        "The Sun pulls it too.",
        "Earth rotates.",
    ]
    inst = compile_instance(sentence_graph(text), SCHEMA, tok)
    data = PretrainingDataset([inst, inst, inst], info, MaskingConfig(cpc_probability=0.5), seed=3)
    batch = collate_pretraining([data[i] for i in range(3)])
    assert batch.num_cpc >= 3
    model = PretrainingModel(tiny_encoder(tok.vocab_size), PretrainingConfig(mlm_weight=0.0, cpc_weight=1.0))
    out = model(batch)
    assert set(out) == {"loss", "mlm_loss", "cpc_loss", "mlm_accuracy", "cpc_accuracy", "cpc_sentences"}
    assert all(v.ndim == 0 for v in out.values()) and out["cpc_sentences"].item() == batch.num_cpc
    assert out["loss"].item() == pytest.approx(out["cpc_loss"].item())
    # the loss reaches the targets' side alone (sentence instances) and the predictions' side alone
    predictions, targets = model.cpc_vectors(model.encoder(batch.batch)[0], batch)
    grad_targets = torch.autograd.grad(
        info_nce_loss(predictions.detach(), targets)[0], model.encoder.embeddings.word_embeddings.weight
    )[0]
    grad_predictions = torch.autograd.grad(
        info_nce_loss(predictions, targets.detach())[0], model.cpc.projection.weight
    )[0]
    assert grad_targets.abs().sum() > 0 and grad_predictions.abs().sum() > 0
    out["loss"].backward()
    assert model.mlm.bias.grad is None or model.mlm.bias.grad.abs().sum() == 0  # weight 0: no MLM signal


def test_a_batch_without_cpc_sentences_keeps_every_parameter_in_the_graph(tok, info):
    inst = compile_instance(sentence_graph(["Tides rise and fall.", "Earth rotates."]), SCHEMA, tok)
    example = mask_instance(inst, info, np.random.default_rng(0), MaskingConfig(cpc_probability=0.0))
    batch = collate_pretraining([example])
    assert batch.num_cpc == 0 and batch.sentences is None and batch.cpc_duplicates.shape == (0, 0)
    model = PretrainingModel(tiny_encoder(tok.vocab_size))
    out = model(batch)
    assert out["cpc_loss"].item() == 0.0
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters())


def test_mlm_head_is_tied_and_loads_lifted_weights(tok):
    encoder = tiny_encoder(tok.vocab_size)
    model = PretrainingModel(encoder)
    assert model.mlm.word_embeddings.weight is encoder.embeddings.word_embeddings.weight
    hidden = 32
    lifted = {
        "cls.predictions.transform.dense.weight": torch.full((hidden, hidden), 0.5),
        "cls.predictions.transform.LayerNorm.bias": torch.full((hidden,), 0.25),
        "cls.predictions.bias": torch.arange(tok.vocab_size, dtype=torch.float32),
    }
    copied = model.mlm.load_lifted(lifted)
    assert sorted(copied) == sorted(lifted)
    assert torch.all(model.mlm.dense.weight == 0.5) and torch.all(model.mlm.layer_norm.bias == 0.25)
    assert torch.equal(model.mlm.bias, lifted["cls.predictions.bias"])
    with pytest.raises(GraphattnError, match="lm_head.bias has shape"):
        model.mlm.load_lifted({"lm_head.bias": torch.zeros(3)})


# -- both losses fall on a generated corpus ------------------------------------------------------

NAMES = (
    "alice bob carol david emma frank grace henry irene jack karen liam mary nora oscar paul rita sam tina victor"
).split()
VERBS = "met called visited helped thanked".split()


def generated_corpus(count: int, seed: int) -> list[list[str]]:
    """Documents of six sentences forming a chain of people ("Alice met bob." "Bob called
    carol." ...): a CPC-masked sentence is predictable from its neighbours (the one before ends
    with its first person, the one after starts with its second), which is what the sentence
    global must learn to read through g2g; words are many-piece ("al ##ice") for whole-word MLM."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        people = rng.choice(NAMES, size=7, replace=False)
        docs.append([f"{people[i].capitalize()} {rng.choice(VERBS)} {people[i + 1]}." for i in range(6)])
    return docs


@pytest.mark.slow
def test_mlm_and_cpc_losses_fall_on_a_generated_corpus(tok, info):
    """A few hundred steps of a tiny encoder through graphattn.train's loop. CPC has a plateau
    before the globals learn to summarise (about 150 steps here), hence equal loss weights
    (configurable; ETC's 0.8 / 0.2 needs more steps to get past it)."""
    from graphattn.train import TrainConfig, Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only adds synchronisation on a busy machine
    try:
        instances = [
            compile_instance(sentence_graph(doc, f"d{i}"), SCHEMA, tok)
            for i, doc in enumerate(generated_corpus(160, seed=0))
        ]
        data = PretrainingDataset(instances, info, MaskingConfig(cpc_probability=0.3), seed=0)
        loader = DataLoader(
            data, batch_size=8, shuffle=True, collate_fn=collate_pretraining, generator=torch.Generator().manual_seed(0)
        )
        model = PretrainingModel(tiny_encoder(tok.vocab_size), PretrainingConfig(mlm_weight=0.5, cpc_weight=0.5))
        config = TrainConfig(
            max_steps=400, learning_rate=2e-3, warmup_steps=20, log_every=20, progress=False, device="cpu", seed=0
        )
        history = Trainer(model, config).fit(loader).history
    finally:
        torch.set_num_threads(threads)
    first = history[0]
    last = {name: np.mean([record[name] for record in history[-3:]]) for name in first}
    assert last["mlm_loss"] < first["mlm_loss"] - 1.0  # from ~ln(3000) = 8 towards word statistics
    assert last["cpc_loss"] < first["cpc_loss"] - 0.3  # from ~ln(14), the CPC sentences per batch
    assert last["cpc_accuracy"] > first["cpc_accuracy"] + 0.1
