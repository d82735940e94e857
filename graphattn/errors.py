"""Errors that tell the user where their input is wrong.

Every error raised for bad *input* (a graph, a schema file, a document, a batch) is a
`GraphattnError` carrying a location: the file, and inside it a line, a JSON/YAML key path or a
node id. The message reads ``<file>:<line>: <path>: <what was expected>`` so that it can be
pasted into an editor's "go to" box.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def format_path(path: Sequence[str | int]) -> str:
    """Render a key path like JSON Path: ``$.node_types.sentence.global``, ``$.items[3]``."""
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


@dataclass
class Location:
    """Where in the user's input something is: any of file, line, key path, node id."""

    file: str | None = None
    line: int | None = None
    path: Sequence[str | int] = field(default_factory=tuple)
    node: str | None = None

    def __str__(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file if self.line is None else f"{self.file}:{self.line}")
        elif self.line is not None:
            parts.append(f"line {self.line}")
        if self.path:
            parts.append(format_path(self.path))
        if self.node is not None:
            parts.append(f"node {self.node!r}")
        return ": ".join(parts)


class GraphattnError(ValueError):
    """Bad input, with where it is. Subclasses say which stage found it."""

    def __init__(self, message: str, location: Location | None = None, **where):
        self.location = location if location is not None else Location(**where)
        self.reason = message
        prefix = str(self.location)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class GraphError(GraphattnError):
    """A DocGraph that breaks its own rules (dangling edge, span past the text, ...)."""


class SchemaError(GraphattnError):
    """A relation-schema file that does not validate."""


class CompileError(GraphattnError):
    """A graph that the schema cannot lower (undeclared type or relation, cycle, ...)."""


class IngestError(GraphattnError):
    """A document that cannot be read into a DocGraph."""


class BatchError(GraphattnError):
    """Tensors handed to the encoder or kernels that disagree with each other."""


class TokenizerError(GraphattnError):
    """A tokenizer that cannot be loaded or used as asked (names the file where there is one)."""


class LabelError(IngestError):
    """A task label that matches nothing, refused (``graphattn compile --strict``)."""


class GraphattnWarning(UserWarning):
    """Something the user should know that does not stop the work (a schema's special token that
    is unk, the CPU kernel still building or unavailable). Every `graphattn` command says each
    one once, in one line on stderr (`graphattn.cli.one_line_warnings`); the Python API gives
    Python's own warning."""


class LabelWarning(UserWarning):
    """A task label in the input that matches nothing: a supporting fact naming a title no
    paragraph has, an answer string not in its context, a keyphrase not in the text, ...

    The document still compiles, without that label. Ingest adapters issue these through
    Python's `warnings` (`warn_label`); `graphattn compile` collects them per document into
    ``warnings.jsonl`` and, with ``--strict``, rejects the document instead.
    """

    def __init__(self, message: str, label: str, location: Location | None = None, **where):
        self.location = location if location is not None else Location(**where)
        self.reason, self.label = message, label
        prefix = str(self.location)
        super().__init__(f"{prefix}: {message}" if prefix else message)


def warn_label(message: str, label: str, **where) -> None:
    """Issue a LabelWarning (file, line, path or node say where; `label` names the label)."""
    import warnings

    warnings.warn(LabelWarning(message, label, **where), stacklevel=3)
