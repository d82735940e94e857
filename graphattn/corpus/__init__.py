"""Compile whole corpora into Parquet shards, on a local process pool or on Ray actors.

`graphattn compile` (cli.py) plans the inputs (sources.py), cuts them into shards of fixed
document ranges (pipeline.py), compiles each shard in a worker (worker.py; ray_engine.py for
Ray), writes it atomically with a done-marker (output.py), in the format of `graphattn.shards`,
which also holds the readers (`graphattn inspect`, the training datasets).
Importing this package stays light: the CLI imports it to build its --help.
"""
