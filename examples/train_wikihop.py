"""Fine-tune a candidate-scoring head on the bundled WikiHop records, end to end, through shards.

    records -> graphattn compile (schemas/wikihop.yaml: its `answer` target) -> shards -> fine_tune -> evaluate

The bundled sample has two questions, so this shows the path (and that the model can fit them),
not accuracy. With --init-from, the encoder is lifted from a local BERT/RoBERTa checkpoint
directory (config.json + weights; give its tokenizer.json with --tokenizer); otherwise it is a
small random encoder with the schema's local radius and relative vocabulary. The same run from
the command line: `graphattn compile ... --out SHARDS`, `graphattn train --data SHARDS ...`,
`graphattn evaluate --model RUN --data SHARDS` (docs/WALKTHROUGH-train.md).

Run: python examples/train_wikihop.py [--steps 30] [--init-from DIR --tokenizer DIR/tokenizer.json]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import DATA, TOKENIZER, schema_path

from graphattn.corpus.pipeline import CompileOptions, run_compile
from graphattn.train.evaluate import evaluate_model, report_lines
from graphattn.train.finetune import fine_tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--init-from", help="local HF BERT/RoBERTa checkpoint directory to lift")
    parser.add_argument("--tokenizer", default=str(TOKENIZER), help="tokenizer.json matching the encoder's vocabulary")
    parser.add_argument("--out", help="directory for the shards and the run (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.out or scratch)
        run_compile(
            CompileOptions(
                inputs=[str(DATA / "wikihop_sample.json")],
                schema=schema_path("wikihop"),
                out=str(root / "shards"),
                tokenizer=args.tokenizer,
                progress=False,
            )
        )
        result = fine_tune(
            [root / "shards"],
            root / "run",
            steps=args.steps,
            batch_size=2,
            learning_rate=args.lr,
            warmup_ratio=0.1,
            init_from=args.init_from,
            hidden_size=64,
            layers=2,
            heads=2,
            dropout=0.0,
            precision="fp32",
            progress=False,
            log_every=max(1, args.steps // 5),
        )
        for record in result.history:
            print(
                f"step {int(record['step']):4d}  loss {record['loss']:.4f}  accuracy {record['accuracy/answer']:.2f}  "
                f"lr {record['lr']:.2e}"
            )
        print("\n".join(report_lines(evaluate_model(str(root / "run"), [str(root / "shards")]))))
        print(
            f"checkpoint: {result.checkpoint}"
            if args.out
            else "run written to a temporary directory (use --out to keep it)"
        )


if __name__ == "__main__":
    main()
