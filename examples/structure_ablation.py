"""Does the structure graphattn encodes pay off? A WikiHop-like task, structured vs flat schema.

ETC's WikiHop ablation (ETC Table 3): removing structure (context boundaries and the
candidate-mention links) cost 2.5 points (73.2 -> 70.7), with encoders lifted from BERT and
pre-trained. This script repeats the comparison on a task it generates, training small encoders
from scratch on a CPU (about 35 minutes on 2 cores for the full table).

The task ("two-fact"). Each example is a WikiHop record: query "shared_country <p1> <p2>", four
candidate countries, and eight shuffled one-fact documents, two per country, each naming one
person ("<person> visited <country> .", "<country> welcomed <person> .", "<person> lives in
<country> ."). The answer is the one country whose two documents name p1 and p2. Each of p1 and
p2 also appears with one distractor country (a different one each), so no single fact decides:
the answer needs the facts of two sentences in different documents, joined through the entity
they share, the candidate. Every country appears exactly twice, every example draws its facts
afresh, and candidate and document order are shuffled (chance: 25%).

The control. The same records with the answer country named in the query ("shared_country
<k0>"): no document is needed. It shows that encoder, head and loop train in both schemas, so a
two-fact accuracy at chance means the reasoning was not learned, not that the plumbing is broken.

The two schemas differ only in the structure ETC's "flat" ablation removes; encoder, head
(graphattn.nn.heads.CandidateScoringHead on the candidate globals), data, steps and seeds match:

    structured   candidate globals linked to their mentions (label mention_of), document and
                 sentence globals, every document / candidate / the query its own l2l segment
                 (context blocking), sentence globals of different documents blocked in g2g,
                 hard g2l (query globals exempt, as in ETC)
    flat         one unsegmented long sequence, sentence globals only (sentence-level labels),
                 no mention links, hard g2l (query globals exempt)

Choices, the same in both schemas, without which nothing but the control trained on a CPU:
candidate globals carry their own word (`per_token`) instead of ETC's shared [CAND] id; width 64
with initializer_range 0.1 (BERT's 0.02 is sized for width 768: at width 32-64 it leaves
attention outputs ~1e-3 of the residual stream); candidate globals obey hard g2l (ETC exempts
them; --candidates-exempt restores that). The answer needs three stages found together (mention
-> its person through l2l, mention -> the query's people, candidate -> its mentions through the
link or, flat, through content matches), and a from-scratch encoder finds them only after a long
plateau at loss ln 4: at width 32 the structured encoder left it after ~10k steps, at width 64
after 3.9k-8.3k (three seeds, 16k steps); the flat one had not left it after 16k (nor, two seeds,
after 40k). The table reports the step at which each run's training loss first fell below 1.0.
ETC's encoders start from lifted, pre-trained weights and need no such plateau.

Training goes the way of every graphattn task: the schemas declare the task label (`targets:
answer`, a choice among the candidate globals), the compiled instances are written as shards
(`graphattn.shards.writer`), and the Trainer streams them (`shard_loader`) into a TaskModel whose
head reads `batch.targets`, as `graphattn train --data` does.

Run: python examples/structure_ablation.py            (the README table: 3 seeds x 2 schemas)
     python examples/structure_ablation.py --quick    (seconds: a smoke run)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from _common import ROOT  # noqa: F401  (puts the checkout on sys.path)

from graphattn.compile import compile_instance
from graphattn.graph import DocGraph
from graphattn.ingest.text import MENTION_OF
from graphattn.nn import EtcConfig, EtcEncoder
from graphattn.schema import load_schema
from graphattn.shards.dataset import read_table
from graphattn.shards.writer import write_shards
from graphattn.tokenize import SpacyWordTokenizer
from graphattn.train import TaskModel, TrainConfig, Trainer, shard_loader

PEOPLE = "alice bob carol david emma frank grace henry irene jack karen liam mary nora oscar paul".split()
COUNTRIES = "albania belgium chile denmark estonia finland greece hungary iceland japan".split()
FACTS = ("{p} visited {k} .", "{k} welcomed {p} .", "{p} lives in {k} .")
FILLERS = ("the weather was mild .", "it is an old place .", "many people know it .", "records are incomplete .")
QUERY_RELATION = "shared_country"
CANDIDATES = 4
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[SENT]", "[DOC]")


# -- the task ------------------------------------------------------------------------------------


def generate_records(count: int, seed: int, filler_probability: float = 0.0, control: bool = False) -> list[dict]:
    """`count` WikiHop-format records (query, candidates, supports, answer), facts fresh each.

    Countries k0 (the answer) .. k3, people p1, p2 (the query) and x, y, z, w: k0 is named with
    p1 and p2, k1 with p1 and x, k2 with p2 and y, k3 with z and w. A filler sentence follows a
    fact with probability `filler_probability`. `control`: the query names the answer country
    itself ("shared_country <k0>"), a question that needs no document at all."""
    rng = np.random.default_rng(seed)
    records = []
    for index in range(count):
        countries = [str(k) for k in rng.choice(COUNTRIES, CANDIDATES, replace=False)]
        p1, p2, x, y, z, w = (str(p) for p in rng.choice(PEOPLE, 6, replace=False))
        named = [p1, p2, p1, x, p2, y, z, w]  # two people per country, in country order
        supports = []
        for person, country in zip(named, [k for k in countries for _ in range(2)]):
            fact = str(rng.choice(FACTS)).format(p=person, k=country)
            if filler_probability and rng.random() < filler_probability:
                fact += " " + str(rng.choice(FILLERS))
            supports.append(fact)
        order = rng.permutation(len(supports))
        query = f"{QUERY_RELATION} {countries[0]}" if control else f"{QUERY_RELATION} {p1} {p2}"
        records.append(
            {
                "id": f"synthetic-{seed}-{index}",
                "query": query,
                "candidates": [countries[i] for i in rng.permutation(CANDIDATES)],
                "supports": [supports[i] for i in order],
                "answer": countries[0],
            }
        )
    return records


def record_graph(record: dict) -> DocGraph:
    """The DocGraph `graphattn.ingest.json.wikihop_graph` builds for a record, by construction:
    the generated text is tokenized by spaces and its sentences end with " .", so spans are known
    without running spaCy's sentencizer and phrase matcher (which would dominate the run time).
    Same node ids, types, spans, attrs and edges (a smoke test checks they agree)."""
    parts: list[str] = []
    cursor = 0

    def add(piece: str, separator: str) -> tuple[int, int]:
        nonlocal cursor
        if parts:
            parts.append(separator)
            cursor += len(separator)
        parts.append(piece)
        cursor += len(piece)
        return cursor - len(piece), cursor

    candidate_spans = [add(c, "\n") for c in record["candidates"]]
    query_span = add(record["query"], "\n")
    document_spans = [add(s, "\n\n") for s in record["supports"]]
    graph = DocGraph("".join(parts), doc_id=record["id"])
    answer = record["candidates"].index(record["answer"])
    for i, (candidate, span) in enumerate(zip(record["candidates"], candidate_spans)):
        graph.add_node(f"c{i}", "candidate", span, text=candidate, index=i, is_answer=i == answer)
    graph.add_node("q", "query", query_span, answer=record["answer"])
    text = graph.text
    candidate_of = {c: f"c{i}" for i, c in enumerate(record["candidates"])}
    mentions = []
    for d, span in enumerate(document_spans):
        graph.add_node(f"d{d}", "document", span, index=d)
    for d, (start, end) in enumerate(document_spans):
        for j, sentence in enumerate(re.finditer(r"\S[^.]*\.", text[start:end])):
            graph.add_child(
                f"d{d}", f"d{d}.s{j}", "sentence", (start + sentence.start(), start + sentence.end()), index=j
            )
        position = start
        for word in text[start:end].split(" "):
            if word in candidate_of:
                mentions.append((position, position + len(word), candidate_of[word]))
            position += len(word) + 1
    for k, (m_start, m_end, candidate) in enumerate(sorted(mentions)):
        graph.add_node(f"m{k}", "mention", (m_start, m_end), candidate=candidate, text=text[m_start:m_end])
        graph.add_edge(f"m{k}", MENTION_OF, candidate)
    return graph


def tokenizer() -> SpacyWordTokenizer:
    """A fixed word vocabulary: every word the generator uses is one token."""
    words = sorted(
        {w for text in (*PEOPLE, *COUNTRIES, *FACTS, *FILLERS, QUERY_RELATION) for w in text.split()} - {"{p}", "{k}"}
    )
    return SpacyWordTokenizer(words, special_tokens=SPECIAL)


# -- the two schemas --------------------------------------------------------------------------------


def _common(name: str, radius: int) -> dict:
    return {
        "name": name,
        "local_radius": radius,
        "relative_pos_max_distance": 4,
        "relative_vocab_size": 16,
        "max_long_length": 256,
        "max_global_length": 64,
        "special_tokens": {"global": "[SENT]"},
        "targets": {"answer": {"kind": "choice", "node_types": "candidate", "attr": "is_answer"}},
    }


def _candidate(exempt: bool, **extra) -> dict:
    """One global per candidate, carrying the candidate's own word (`per_token`; candidates here
    are one word) rather than ETC's shared [CAND] id: trained from scratch, identical inputs leave
    the candidate globals indistinguishable for thousands of steps. `exempt`: ETC's exemption
    from hard g2l (the candidate global then reads the whole long input)."""
    return {
        "global": "per_token",
        "long": True,
        "type_id": 1,
        **({"ignore_hard_masks": True} if exempt else {}),
        **extra,
    }


def structured_schema(radius: int, candidates_exempt: bool = False) -> dict:
    """schemas/wikihop.yaml at toy sizes (candidate globals as `_candidate` says)."""
    return {
        **_common("ablation-structured", radius),
        "node_types": {
            "candidate": _candidate(candidates_exempt, segment=True),
            "query": {"global": "per_token", "long": True, "type_id": 2, "segment": True, "ignore_hard_masks": True},
            "document": {"global": "node", "global_token": "[DOC]", "global_type_id": 3, "segment": True},
            "sentence": {"global": "node", "long": True, "type_id": 4},
            "mention": {},
        },
        "relations": {"contains": {"hierarchy": True}, "mention_of": {"link": "l2g", "label": "mention_of"}},
        "masks": {"hard_g2l": True},
        "segments": {"block_g2g": ["sentence"]},
        "global_order": ["candidate", "query", ["document", "sentence"]],
    }


def flat_schema(radius: int, candidates_exempt: bool = False) -> dict:
    """No segments (nothing blocks l2l or g2g), no document globals, mentions not linked."""
    return {
        **_common("ablation-flat", radius),
        "node_types": {
            "candidate": _candidate(candidates_exempt),
            "query": {"global": "per_token", "long": True, "type_id": 2, "ignore_hard_masks": True},
            "document": {},
            "sentence": {"global": "node", "long": True, "type_id": 4},
            "mention": {},
        },
        "relations": {"contains": {"hierarchy": True}, "mention_of": {}},
        "masks": {"hard_g2l": True},
        "global_order": ["candidate", "query", "sentence"],
    }


SCHEMAS = {"structured": structured_schema, "flat": flat_schema}
TASKS = ("two-fact", "control")
PLATEAU_EXIT_LOSS = 1.0  # training loss below this (chance is ln 4 = 1.386): the run left the plateau


def compile_shards(records: list[dict], schema: dict, tok, out: Path) -> Path:
    """The records compiled with `schema` and written as shards under `out` (the task label included)."""
    loaded = load_schema(schema)
    instances = (compile_instance(record_graph(record), loaded, tok, compact=True) for record in records)
    write_shards(
        instances, out, loaded, vocab_size=tok.vocab_size, schema_text=yaml.safe_dump(schema), rows_per_shard=512
    )
    return out


# -- one training run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Everything a run depends on besides the schema and the seed."""

    train: int
    test: int
    steps: int
    batch: int
    hidden: int
    layers: int
    radius: int
    lr: float
    init_std: float
    fillers: float
    candidates_exempt: bool
    data_seed: int
    control_steps: int = 400


def train_and_test(train: Path, test: Path, schema: dict, vocab_size: int, seed: int, steps: int, s: Settings) -> dict:
    """Train one encoder + candidate head from scratch on the `train` shards; accuracy on `test`'s."""
    torch.manual_seed(seed)
    encoder = EtcEncoder(
        EtcConfig(
            vocab_size=vocab_size,
            hidden_size=s.hidden,
            num_hidden_layers=s.layers,
            num_attention_heads=4,
            intermediate_size=2 * s.hidden,
            local_radius=s.radius,
            relative_pos_max_distance=4,
            relative_vocab_size=16,
            hidden_dropout_prob=0.0,
            attention_backend="blocked",
            initializer_range=s.init_std,
        )
    )
    config = TrainConfig(
        max_steps=steps,
        learning_rate=s.lr,
        warmup_ratio=0.05,
        log_every=max(1, min(100, steps // 10)),
        progress=False,
        device="cpu",
        seed=seed,
        precision="fp32",
    )
    trainer = Trainer(TaskModel(encoder, load_schema(schema)), config)
    history = trainer.fit(shard_loader(train, s.batch, shuffle=True, seed=seed, compact=True)).history
    metrics = trainer.evaluate(shard_loader(test, 64, shuffle=False, compact=True))
    tail = history[-max(1, len(history) // 10) :]  # the last 10% of the logged steps
    learned = next((int(h["step"]) for h in history if h["loss"] < PLATEAU_EXIT_LOSS), None)
    return {
        "accuracy": metrics["accuracy/answer"],
        "test_loss": metrics["loss"],
        "train_loss": tail[-1]["loss"],
        "train_accuracy": statistics.mean(h["accuracy/answer"] for h in tail),
        "plateau_exit_step": learned,
    }


def run_setting(setting: str, seeds: list[int], s: Settings) -> list[dict]:
    """Compile the records once with this setting's schema, then one run per seed on the task and
    one on the control. One thread: the tensors are small, and two processes on two cores beat
    one process with two threads."""
    torch.set_num_threads(1)
    tok = tokenizer()
    schema = SCHEMAS[setting](s.radius, s.candidates_exempt)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for task, control, steps in (("two-fact", False, s.steps), ("control", True, s.control_steps)):
            started = time.time()
            where = Path(scratch) / task
            train_records = generate_records(s.train, s.data_seed, s.fillers, control)
            test_records = generate_records(s.test, s.data_seed + 1, s.fillers, control)
            train = compile_shards(train_records, schema, tok, where / "train")
            test = compile_shards(test_records, schema, tok, where / "test")
            compiled = time.time() - started
            lengths = read_table(test, ["long_length", "global_length"])
            sizes = tuple(np.mean(lengths.column(name).to_numpy()) for name in ("long_length", "global_length"))
            for seed in seeds:
                started = time.time()
                result = train_and_test(train, test, schema, tok.vocab_size, seed, steps, s)
                result.update(
                    task=task,
                    setting=setting,
                    seed=seed,
                    seconds=time.time() - started,
                    compile_seconds=compiled,
                    long=sizes[0],
                    globals=sizes[1],
                )
                results.append(result)
                _report(result)
    return results


def summarize(results: list[dict]) -> str:
    """The markdown table: held-out accuracy mean and spread (sample std, min - max) per task and
    schema, and the training accuracy (a gap to held-out accuracy is memorisation)."""
    lines = [
        "| task | schema | seeds | held-out accuracy % (mean) | std | min - max | "
        "per seed | train accuracy % (last 10% of steps) | left the plateau at step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        for setting in SCHEMAS:
            rows = [r for r in results if r["setting"] == setting and r["task"] == task]
            if not rows:
                continue
            acc = [r["accuracy"] * 100 for r in rows]
            std = statistics.stdev(acc) if len(acc) > 1 else 0.0
            train = statistics.mean(r["train_accuracy"] * 100 for r in rows)
            exits = ", ".join(str(r.get("plateau_exit_step") or "-") for r in rows)
            lines.append(
                f"| {task} | {setting} | {len(acc)} | {statistics.mean(acc):.1f} | {std:.1f} | "
                f"{min(acc):.1f} - {max(acc):.1f} | "
                + ", ".join(f"{a:.1f}" for a in acc)
                + f" | {train:.1f} | {exits} |"
            )
    return "\n".join(lines)


def verdict(results: list[dict]) -> str:
    """Plain words: on the two-fact task, does structured beat flat by more than the spread
    (max - min over seeds) of either?"""
    acc = {s: [r["accuracy"] * 100 for r in results if r["setting"] == s and r["task"] == TASKS[0]] for s in SCHEMAS}
    if min(len(a) for a in acc.values()) < 2:
        return "one seed per schema: no spread to compare the difference with (run with --seeds 3)."
    margin = statistics.mean(acc["structured"]) - statistics.mean(acc["flat"])
    spread = max(max(a) - min(a) for a in acc.values())
    if margin > spread:
        return f"structured beats flat by {margin:.1f} points, more than the largest seed spread ({spread:.1f})."
    return (
        f"structured does NOT beat flat by more than the seed spread: margin {margin:+.1f} points, "
        f"largest spread {spread:.1f}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one seed: a smoke run in seconds")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train", type=int, default=6000, help="training records")
    parser.add_argument("--test", type=int, default=1000, help="held-out records")
    parser.add_argument("--steps", type=int, default=16000)
    parser.add_argument(
        "--control-steps", type=int, default=400, help="steps of the control task (the answer named in the query)"
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--radius", type=int, default=4, help="local radius (long tokens see +-radius)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--init-std",
        type=float,
        default=0.1,
        help="initializer_range; BERT's 0.02 suits width 768, at width 64 it leaves attention outputs "
        "~1e-3 of the residual",
    )
    parser.add_argument("--fillers", type=float, default=0.0, help="probability of a filler sentence after each fact")
    parser.add_argument(
        "--candidates-exempt", action="store_true", help="candidate globals ignore hard g2l (ETC's choice)"
    )
    parser.add_argument("--data-seed", type=int, default=1234)
    parser.add_argument("--workers", type=int, default=2, help="processes (one per schema), one thread each")
    parser.add_argument("--json", help="also write every run's numbers to this file")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.train, args.test, args.steps, args.control_steps, args.batch, args.hidden, args.layers = (
            1,
            32,
            16,
            4,
            4,
            8,
            16,
            1,
        )

    settings = Settings(
        args.train,
        args.test,
        args.steps,
        args.batch,
        args.hidden,
        args.layers,
        args.radius,
        args.lr,
        args.init_std,
        args.fillers,
        args.candidates_exempt,
        args.data_seed,
        args.control_steps,
    )
    seeds = list(range(args.seeds))
    print(
        f"{len(seeds)} seeds x {len(SCHEMAS)} schemas: {args.train} training / {args.test} held-out records, "
        f"{args.steps} steps "
        f"of {args.batch}, encoder {args.layers} x {args.hidden}, radius {args.radius}, candidate globals "
        f"{'exempt from' if args.candidates_exempt else 'under'} hard g2l; {args.workers} process(es)",
        flush=True,
    )
    start = time.time()
    if args.workers > 1:
        with ProcessPoolExecutor(min(args.workers, len(SCHEMAS))) as pool:
            per_setting = list(pool.map(run_setting, SCHEMAS, [seeds] * len(SCHEMAS), [settings] * len(SCHEMAS)))
    else:
        per_setting = [run_setting(setting, seeds, settings) for setting in SCHEMAS]
    results = [r for rows in per_setting for r in rows]
    print(f"\n{summarize(results)}\n\n{verdict(results)}\nwall time {time.time() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def _report(result: dict) -> None:
    print(
        f"  {result['task']:8s} {result['setting']:10s} seed {result['seed']}: "
        f"held-out accuracy {result['accuracy'] * 100:5.1f}%  (train loss "
        f"{result['train_loss']:.3f}, left the plateau at step {result['plateau_exit_step'] or '-'}, "
        f"mean long {result['long']:.0f} / globals {result['globals']:.0f}, {result['seconds']:.0f} s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
