"""Every rendered answer of an offline render, as data, against the one recorded for its reference store
(tests/fixtures/answers/NAME.json): the suite's code can be rearranged without changing what it says.

A sentence changed on purpose is recorded again with `SERVESCOPE_RECORD_ANSWERS=1 make test` and the difference
reviewed in the diff of the fixture."""

from __future__ import annotations

import json
import os
from pathlib import Path

from servescope.findings import collect, failures_of, read_findings, tier

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "answers"
# the fields that carry an answer: what a reader or thread 07 and the summary act on
FIELDS = ("title", "claim", "applies", "reason", "confidence", "direction", "recommended_flags", "recommendation")


def answers(out_dir: Path) -> dict[str, list[dict]]:
    """Per notebook of the render, each finding's answer fields, its effect in words and its summary tier; the index's
    first line."""
    by_thread = collect(out_dir)
    summary = out_dir / "99_summary.findings.json"
    if summary.is_file():
        by_thread["99_summary"] = read_findings(summary)
    failed = failures_of(by_thread)
    got: dict[str, list[dict]] = {}
    for thread, fs in sorted(by_thread.items()):
        got[thread] = [{**{k: getattr(f, k) for k in FIELDS}, "effect": f.effect.text() if f.effect else "",
                        "tier": tier(f, failed)} for f in fs]
    index = (out_dir / "index.html").read_text()
    start = index.find('id="verified"')
    got["index"] = [{"first_line": index[start:index.find("</b>", start)] if start >= 0 else ""}]
    return got


def check_answers(out_dir: Path, name: str) -> None:
    """Assert the render's answers are the recorded ones (or record them, SERVESCOPE_RECORD_ANSWERS=1)."""
    path = FIXTURES / f"{name}.json"
    got = json.loads(json.dumps(answers(out_dir)))
    if os.environ.get("SERVESCOPE_RECORD_ANSWERS") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert path.is_file(), f"no answers recorded for {name}: SERVESCOPE_RECORD_ANSWERS=1 records them"
    want = json.loads(path.read_text())
    for thread in sorted(set(want) | set(got)):
        assert got.get(thread) == want.get(thread), f"{name}: {thread}'s answers changed (see {path})"
