"""The shard format, in one place: what a shard holds, how it is read, and the datasets over it.

    format.py    columns, dtypes and footer of a shard (`ShardColumns`, `instance_row`, `read_info`)
    arrow.py     Arrow columns built from buffers (no pandas import in workers)
    verify.py    checks of what is read back: footer, column set, done-marker sha256, one run
    stamp.py     verified stamps: a shard's sha256 checked once per version of the file
    runfile.py   a compile directory's run.json, read by its format version
    verify_rows.py  checks of every decoded row group: lengths, index ranges, spans, targets
    dataset.py   `ShardDataset`, `ShardIterableDataset`, `read_instance`, `read_table`, `collate`
    inspect.py   `graphattn inspect`: summaries and one instance, printed
    writer.py    `write_shards`: instances compiled in Python, as shards

Writing a whole corpus (planning, workers, resume) is `graphattn.corpus`, which sits above this
package; readers of shards (training, viz, inspect) need only this one. See docs/SHARDS.md.
"""
