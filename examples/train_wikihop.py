"""Fine-tune a candidate-scoring head on the bundled WikiHop records, end to end.

    records -> DocGraphs -> compile_instance(schemas/wikihop.yaml) -> targets -> TaskModel -> Trainer

The bundled sample has two questions, so this shows the path (and that the model can fit them),
not accuracy. With --init-from, the encoder is lifted from a local BERT/RoBERTa checkpoint
directory (config.json + weights; give its tokenizer.json with --tokenizer); otherwise it is a
small random encoder with the schema's local radius and relative vocabulary.

Run: python examples/train_wikihop.py [--steps 30] [--init-from DIR --tokenizer DIR/tokenizer.json]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from _common import DATA, TOKENIZER, schema_path

from graphattn.compile import compile_instance
from graphattn.ingest.json import read_json
from graphattn.nn import EtcConfig, EtcEncoder
from graphattn.nn.lift import lift_pretrained
from graphattn.schema import load_schema
from graphattn.tokenize import load_tokenizer
from graphattn.train import InstanceLoader, TaskExample, TaskModel, TrainConfig, Trainer, collate_examples, wikihop_targets


def build_encoder(args, schema, vocab_size: int) -> EtcEncoder:
    geometry = dict(local_radius=schema.local_radius, relative_pos_max_distance=schema.relative_pos_max_distance,
                    relative_vocab_size=schema.relative_vocab_size)
    if args.init_from:
        encoder, report = lift_pretrained(args.init_from, **geometry)
        print(report)
        return encoder
    return EtcEncoder(EtcConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=128, hidden_dropout_prob=0.0, **geometry))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--init-from", help="local HF BERT/RoBERTa checkpoint directory to lift")
    parser.add_argument("--tokenizer", default=str(TOKENIZER), help="tokenizer.json matching the encoder's vocabulary")
    parser.add_argument("--out", help="checkpoint directory (default: a temporary one)")
    args = parser.parse_args()

    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.tokenizer)
    schema = load_schema(schema_path("wikihop"))
    graphs = list(read_json(DATA / "wikihop_sample.json", "wikihop"))
    examples = []
    for graph in graphs:
        instance = compile_instance(graph, schema, tokenizer)
        examples.append(TaskExample(instance, wikihop_targets(instance, graph)))
        print(f"{graph.doc_id}: long {instance.long_length}, globals {instance.global_length}, "
              f"{int(examples[-1].targets['candidate_mask'].sum())} candidates")

    model = TaskModel(build_encoder(args, schema, tokenizer.vocab_size), "wikihop")
    data = InstanceLoader(examples, batch_size=2, collate_fn=collate_examples, shuffle=True)
    with tempfile.TemporaryDirectory() as scratch:
        config = TrainConfig(max_steps=args.steps, learning_rate=args.lr, warmup_steps=max(1, args.steps // 10),
                             log_every=max(1, args.steps // 5), checkpoint_dir=args.out or scratch, weight_decay=0.0)
        result = Trainer(model, config).fit(data)
        for record in result.history:
            print(f"step {int(record['step']):4d}  loss {record['loss']:.4f}  accuracy {record['accuracy']:.2f}  lr {record['lr']:.2e}")
        print(f"checkpoint: {result.checkpoint}" if args.out else "checkpoint written to a temporary directory (use --out to keep it)")

    model.eval()
    batch, targets = collate_examples(examples)
    predicted = model.predict(batch, targets)
    for example, graph, position in zip(examples, graphs, predicted.tolist()):
        chosen = graph.node(example.instance.global_node_ids[position]).attrs["text"]
        print(f"{graph.doc_id}: predicted {chosen!r}, answer {graph.node('q').attrs['answer']!r}")


if __name__ == "__main__":
    main()
