"""Task heads: small cases by hand, shapes and gradients, and overfitting 8 compiled examples."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_cases import instances, task_targets, tiny_config  # noqa: E402

from graphattn.compile import collate  # noqa: E402
from graphattn.errors import GraphattnError  # noqa: E402
from graphattn.nn import EtcEncoder  # noqa: E402
from graphattn.nn.heads import CandidateScoringHead, KeyphraseHead, SpanExtractionHead, SpanLogits, SupportingFactsHead  # noqa: E402
from graphattn.train import InstanceLoader, TaskModel, TrainConfig, Trainer  # noqa: E402
from graphattn.train.tasks import ngram_labels  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- by hand -------------------------------------------------------------------------------------


def span_logits(start, end, types=(0.0,)) -> SpanLogits:
    return SpanLogits(torch.tensor([start]), torch.tensor([end]), torch.tensor([types]))


def test_span_decode_by_hand() -> None:
    head = SpanExtractionHead(8)
    logits = span_logits([0.0, 5.0, 1.0, 0.0], [0.0, 0.0, 3.0, 9.0], [0.1, 2.0, 0.0, 0.0, 0.0])
    everywhere = torch.ones(1, 4, dtype=torch.bool)
    best = head.decode(logits, everywhere, max_answer_length=2)  # (1,2)=8, (2,3)=10, (3,3)=9
    assert (best.start.item(), best.end.item(), best.score.item(), best.answer_type.item()) == (2, 3, 10.0, 1)
    best = head.decode(logits, everywhere, max_answer_length=1)  # single tokens: (1,1)=5, (3,3)=9
    assert (best.start.item(), best.end.item()) == (3, 3)
    best = head.decode(logits, torch.tensor([[True, True, True, False]]), max_answer_length=3)  # token 3 not allowed
    assert (best.start.item(), best.end.item(), best.score.item()) == (1, 2, 8.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5, width=32), min_size=2, max_size=9), st.integers(1, 4), st.integers(0, 2**16))
def test_span_decode_matches_brute_force(start, width, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    end = torch.randn(len(start), generator=gen)
    allowed = torch.rand(len(start), generator=gen) < 0.8
    allowed[0] = True
    best = SpanExtractionHead(4).decode(
        SpanLogits(torch.tensor([start]), end[None], torch.zeros(1, 5)), allowed[None], width
    )
    pairs = [
        (start[i] + float(end[j]), i, j)
        for i in range(len(start))
        for j in range(i, min(len(start), i + width))
        if allowed[i] and allowed[j]
    ]
    score, i, j = max(pairs)
    assert best.score.item() == pytest.approx(score, abs=1e-5)
    assert start[best.start.item()] + float(end[best.end.item()]) == pytest.approx(score, abs=1e-5)
    assert allowed[best.start.item()] and allowed[best.end.item()] and 0 <= best.end.item() - best.start.item() < width


def test_candidate_loss_is_softmax_over_candidates_only() -> None:
    head = CandidateScoringHead(4)
    with torch.no_grad():
        head.scorer[0].weight.copy_(torch.eye(4))
        head.scorer[0].bias.zero_()
        head.scorer[2].weight.copy_(torch.tensor([[1.0, 0, 0, 0]]))
        head.scorer[2].bias.zero_()
    hidden = torch.zeros(1, 3, 4)
    hidden[0, :, 0] = torch.tensor([0.5, 2.0, -1.0])  # scores tanh(0.5), tanh(2), tanh(-1)
    mask = torch.tensor([[1, 0, 1]])  # global 1 is not a candidate
    logits = head(hidden, mask)
    expected = -math.log(math.exp(math.tanh(-1.0)) / (math.exp(math.tanh(0.5)) + math.exp(math.tanh(-1.0))))
    assert head.loss(logits, torch.tensor([2]), mask).item() == pytest.approx(expected, rel=1e-6)
    assert head.predict(logits).tolist() == [0]
    with pytest.raises(GraphattnError, match=r"answer_positions\[0\] = 1 is not an allowed position"):
        head.loss(logits, torch.tensor([1]), mask)


def test_supporting_facts_loss_averages_over_sentences_only() -> None:
    head = SupportingFactsHead(4)
    logits = torch.tensor([[2.0, -1.0, 0.0, 7.0]])
    labels = torch.tensor([[1, 0, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    expected = (F.softplus(torch.tensor(-2.0)) + F.softplus(torch.tensor(-1.0)) + math.log(2)) / 3
    assert head.loss(logits, labels, mask).item() == pytest.approx(expected.item(), rel=1e-6)
    assert head.predict(logits, mask).tolist() == [[True, False, False, False]]  # p(0) = 0.5 is not above 0.5
    with pytest.raises(GraphattnError, match="no sentence globals"):
        head.loss(logits, labels, torch.zeros(1, 4))


def test_keyphrase_valid_ngrams_and_loss_by_hand() -> None:
    head = KeyphraseHead(4, max_ngram=3)
    valid = head.valid_ngrams(torch.tensor([[1, 1, 1, 0]]))
    assert valid.int().tolist() == [[[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]]]
    scores = torch.full((1, 2, 3), torch.finfo(torch.float32).min)
    scores[0, 0] = torch.tensor([1.0, 2.0, 0.0])  # unigrams
    scores[0, 1, 0] = 3.0  # bigram at 0
    labels = torch.zeros(1, 2, 3)
    labels[0, 0, 1] = labels[0, 1, 0] = 1  # gold: unigram 1 and bigram 0
    total = math.exp(1) + math.exp(2) + math.exp(0) + math.exp(3)
    expected = -math.log((math.exp(2) + math.exp(3)) / total)
    assert head.loss(scores, labels).item() == pytest.approx(expected, rel=1e-5)  # fp32 logsumexp
    top = head.predict(scores, top_k=2)
    assert top.start.tolist() == [[0, 1]] and top.length.tolist() == [[2, 1]]
    short = head(torch.randn(1, 2, 4), torch.ones(1, 2))  # 2 tokens, trigrams impossible: masked, not an error
    assert short.shape == (1, 3, 2) and (short[0, 2] == torch.finfo(torch.float32).min).all()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(1, 4))
def test_valid_ngrams_match_brute_force(real, max_ngram) -> None:
    valid = KeyphraseHead(4, max_ngram=max_ngram).valid_ngrams(torch.tensor([real]))
    L = len(real)
    expected = [[i + n <= L and all(real[i : i + n]) for i in range(L)] for n in range(1, max_ngram + 1)]
    assert valid[0].tolist() == expected


# -- shapes and gradients --------------------------------------------------------------------


def test_ngram_labels_from_span_rows_by_hand() -> None:
    rows = torch.tensor([[[0, 1], [3, 3], [-100, -100]], [[2, 6], [1, 2], [-100, -100]]])  # (first, last) per row
    labels = ngram_labels(rows, max_ngram=3, long_length=5)
    assert labels.shape == (2, 3, 5)
    assert labels[0].nonzero().tolist() == [[0, 3], [1, 0]]  # 1-gram at 3, 2-gram at 0
    assert labels[1].nonzero().tolist() == [[1, 1]]  # 2-6 is 5 tokens: longer than max_ngram, left out


@pytest.mark.parametrize("task", ["wikihop", "hotpotqa", "nq", "openkp"])
def test_head_shapes_and_gradients_reach_the_encoder(task) -> None:
    torch.manual_seed(0)
    model = TaskModel(EtcEncoder(tiny_config()), task_targets(task), max_ngram=5)
    batch = collate(instances(3))
    B, L, G = batch.batch_size, batch.long_token_ids.shape[1], batch.global_token_ids.shape[1]
    (name,) = model.targets
    logits = model.logits(batch)[name]
    shapes = {
        "wikihop": lambda x: [tuple(x.shape)] == [(B, G)],
        "hotpotqa": lambda x: [tuple(x.shape)] == [(B, G, 2)],
        "nq": lambda x: (
            (tuple(x.start.shape), tuple(x.end.shape), tuple(x.answer_type.shape)) == ((B, L), (B, L), (B, 2))
        ),
        "openkp": lambda x: tuple(x.shape) == (B, 5, L),
    }
    assert shapes[task](logits)
    output = model(batch)
    output["loss"].backward()
    assert torch.isfinite(output["loss"]) and {"loss", f"loss/{name}"} <= set(output)
    for param_name, param in model.named_parameters():  # weights only: a softmax over positions ignores a shared bias
        trained = param_name.startswith("heads.") or param_name.endswith("word_embeddings.weight")
        if param_name.endswith("weight") and trained:
            grad = param.grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, param_name
    assert model.predict(batch)[name] is not None


def test_a_target_without_labels_in_the_batch_adds_zero_not_nan() -> None:
    torch.manual_seed(0)
    model = TaskModel(EtcEncoder(tiny_config()), {**task_targets("wikihop"), **task_targets("nq")})
    batch = collate(instances(2))
    batch.targets["answer"][:] = -100
    for part in ("start", "end", "type"):
        batch.targets[f"span_{part}"][:] = -100
    output = model(batch)
    assert output["loss/answer"].item() == 0 and output["loss/span"].item() == 0
    output["loss"].backward()  # still a graph to step through
    unlabelled = collate(instances(1))
    unlabelled.targets = {}  # e.g. shards compiled with a schema without targets
    with pytest.raises(GraphattnError, match="the batch has no target 'answer'"):
        model(unlabelled)


# -- overfitting 8 examples ----------------------------------------------------------------------


@pytest.mark.parametrize("task, steps", [("wikihop", 60), ("hotpotqa", 60), ("nq", 100), ("openkp", 40)])
def test_each_head_overfits_eight_examples(task, steps) -> None:
    torch.manual_seed(0)
    model = TaskModel(EtcEncoder(tiny_config()), task_targets(task), max_ngram=5)
    data = InstanceLoader(instances(8), 8, collate)
    config = TrainConfig(
        max_steps=steps,
        learning_rate=1e-2,
        warmup_steps=5,
        decay="linear",
        log_every=1,
        weight_decay=0.0,
        progress=False,
        precision="fp32",
    )
    result = Trainer(model, config).fit(data)
    assert result.final_loss < 0.05, f"{task}: loss {result.final_loss:.4f} after {steps} steps"
    model.eval()
    batch = next(iter(data))
    (name,) = model.targets
    prediction = model.predict(batch)[name]
    targets = batch.targets
    if task == "wikihop":
        chosen = targets["answer"].gather(1, prediction.argmax(-1)[:, None]).squeeze(1)
        assert torch.equal(chosen, torch.ones(8, dtype=torch.long))
    elif task == "hotpotqa":
        labelled = targets["supporting"] != -100
        assert torch.equal(prediction.argmax(-1)[labelled], targets["supporting"][labelled])
    elif task == "nq":
        assert torch.equal(prediction.start.argmax(-1), targets["span_start"])
        assert torch.equal(prediction.answer_type.argmax(-1), targets["span_type"])
    else:
        gold = ngram_labels(targets["mentions"], 5, batch.long_token_ids.shape[1])
        assert gold.flatten(1).any(1).all()  # every example has a gold n-gram
        best = prediction.scores.flatten(1).argmax(1)  # index (n - 1) * L + start, as ngram_labels lays them out
        assert gold.flatten(1).gather(1, best[:, None]).all()
