"""The error every reader of traces raises for input that is not a trace: TraceError, naming file,
record, step and field. ir.py re-exports it (`from .ir import TraceError` is how the package
imports it); task.py raises it too, below ir.py. Imports nothing from the package."""
from __future__ import annotations


class TraceError(ValueError):
    """A trace that does not follow the schema. `str()` names file, record/step and field."""

    def __init__(self, message: str, *, file: str | None = None, record: int | str | None = None,
                 step: int | None = None, field: str | None = None):
        self.file, self.record, self.step, self.field, self.reason = file, record, step, field, message
        where = ", ".join(w for w in (file,
                                      f"record {record}" if record is not None else None,
                                      f"step {step}" if step is not None else None,
                                      f"field '{field}'" if field else None) if w)
        super().__init__(f"{where}: {message}" if where else message)
