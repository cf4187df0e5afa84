"""The results directory: metrics.jsonl (a line per step, flushed as each step ends, so a killed
run keeps every step it finished) and summary.json (one object per config)."""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from .records import summarize

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


class ResultsStore:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / METRICS_FILE
        # A new run starts a new file: results of different runs are never mixed in one file.
        self._fh = open(self.path, "w", encoding="utf-8")
        self.records: list[dict] = []

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records.append(record)

    def summaries(self) -> list[dict]:
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in self.records:
            groups[(r.get("experiment"), r["config"])].append(r)
        return [{"experiment": exp, **summarize(recs, cfg)} for (exp, cfg), recs in groups.items()]

    def close(self) -> list[dict]:
        self._fh.close()
        summaries = self.summaries()
        (self.out / SUMMARY_FILE).write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
        return summaries
