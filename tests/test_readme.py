"""The README stays a newcomer's page: short, no dated or measured figure (those live beside their data and in
docs/), and every file it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# the one path the README names that the reader makes (its example suite)
THE_READERS = {"data/suites/my-vllm.yaml"}


def test_the_readme_is_short():
    assert len(README.splitlines()) < 250


def test_the_readme_holds_no_date_and_no_measured_figure():
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", README)
    # a method's setting (90% confidence intervals) is no measurement
    figures = re.findall(r"[+-]?\d[\d,.]*\s?(?:%(?! confidence)|ms\b|tok/s|req/s|GiB|GB\b|minutes\b|s of\b)", README)
    assert not figures, figures


def test_every_file_the_readme_names_exists():
    linked = re.findall(r"\]\(([^)#]+)\)", README)
    named = re.findall(r"`((?:docs|data|lib|tests|benchmarks|notebooks)/[^`\s<>*]+)`", README)
    missing = [p for p in {*linked, *named} - THE_READERS if not p.startswith("http") and not (ROOT / p).exists()]
    assert not missing, missing
