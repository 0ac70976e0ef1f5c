"""Take what the GPU machine never reads out of what a device call carries, and put it back after.

    .venv/bin/python benchmarks/gpu/slim_index.py slim data/suites/vllm-h200.yaml    # before pack.py and the calls
    .venv/bin/python benchmarks/gpu/slim_index.py restore                           # after the calls, before a commit

A device call carries the working tree as git sees it (tracked files and untracked ones it does not ignore, 64 MiB
with the carried part). The rendered references, the other suites' stores and the test fixtures grew past 50 MiB, which
left pack.py 1 MiB parts (95 calls). Nothing on the GPU machine reads them: the suite continues its own store
(data/reference/<name>/store), and that stays. `slim` removes the others from git's index (the files stay on disk)
and lists them in .git/info/exclude between two marker lines, so git, and so the device tool, no longer sees them;
`restore` puts the index and the exclude file back as they were. While slimmed, `git status` shows the paths as
deleted: a commit then would delete them, so `restore` comes first (pack.py and `slim` say so).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "# servescope slim_index: begin (benchmarks/gpu/slim_index.py restore)", "# servescope slim_index: end"
RECORD = "servescope-slim-index.txt"  # in .git: the paths taken out, for restore


def git(root: Path, *args: str) -> str:
    """A git command's stdout (raises on failure)."""
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def git_dir(root: Path) -> Path:
    """The repository's .git folder."""
    return (root / git(root, "rev-parse", "--git-dir").strip()).resolve()


def slimmed(root: Path) -> bool:
    """Whether the index is slimmed now (restore not yet run)."""
    return (git_dir(root) / RECORD).is_file()


def unneeded(root: Path, suite_name: str, compared: tuple[str, ...] = ()) -> list[str]:
    """The tracked folders the GPU machine never reads for this suite: every other reference folder, this one's
    rendered report and logs (its store stays: the suite continues it; so do the stores it compares against, its
    compare_with, given as reference names), the embedded reference and the fixtures."""
    tracked = git(root, "ls-files", "--", "data/reference", "tests/fixtures").splitlines()
    read = (suite_name, *compared)
    keep = tuple(f"data/reference/{name}/store/" for name in read)
    out: set[str] = set()
    for p in tracked:
        if p.startswith(keep):
            continue
        parts = p.split("/")
        if parts[0] == "tests":
            out.add("tests/fixtures")
        elif len(parts) > 3 and parts[2] in read:
            out.add("/".join(parts[:4]))  # report/, gpu-logs/, ... of a reference read: not its store
        elif len(parts) > 3:
            out.add("/".join(parts[:3]))
    return sorted(out)


def compared_references(root: Path, suite: Path, compare_with: list[str]) -> tuple[str, ...]:
    """The reference names (data/reference/<name>/store) of a suite's compare_with stores."""
    refs = (root / "data" / "reference").resolve()
    names = []
    for given in compare_with:
        store = (suite.resolve().parent / given).resolve()
        if store.parent.parent != refs or store.name != "store":
            raise SystemExit(f"{suite}: compare_with {given!r} is not a data/reference/<name>/store: the GPU machine "
                             "would not have it")
        names.append(store.parent.name)
    return tuple(names)


def slim(root: Path, suite: Path) -> list[str]:
    """Take the unneeded folders out of git's index and hide them from it; the paths taken out."""
    if slimmed(root):
        raise SystemExit(f"the index is slimmed already ({git_dir(root) / RECORD}): restore first")
    raw = yaml.safe_load(suite.read_text())
    paths = unneeded(root, raw["name"], compared_references(root, suite, raw.get("compare_with") or []))
    if not paths:
        return []
    record = git_dir(root) / RECORD
    git(root, "rm", "-r", "-q", "--cached", "--", *paths)
    exclude = git_dir(root) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    before = exclude.read_text() if exclude.is_file() else ""
    sep = "" if not before or before.endswith("\n") else "\n"
    patterns = [f"/{p}/" if (root / p).is_dir() else f"/{p}" for p in paths]  # a trailing / matches folders only
    exclude.write_text(before + sep + "\n".join([BEGIN, *patterns, END]) + "\n")
    record.write_text("\n".join(paths) + "\n")
    return paths


def restore(root: Path) -> list[str]:
    """Put the slimmed paths back into git's index and the exclude file as it was; the paths put back."""
    record = git_dir(root) / RECORD
    if not record.is_file():
        return []
    paths = record.read_text().split()
    exclude = git_dir(root) / "info" / "exclude"
    if exclude.is_file():
        lines, kept, inside = exclude.read_text().splitlines(), [], False
        for ln in lines:
            if ln == BEGIN:
                inside = True
            elif ln == END:
                inside = False
            elif not inside:
                kept.append(ln)
        exclude.write_text("".join(f"{ln}\n" for ln in kept))
    git(root, "reset", "-q", "--", *paths)
    record.unlink()
    return paths


def main() -> int:
    """slim SUITE | restore."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("slim").add_argument("suite", type=Path)
    sub.add_parser("restore")
    a = ap.parse_args()
    if a.cmd == "slim":
        paths = slim(ROOT, a.suite)
        print(f"taken out of git's index ({len(paths)}): {', '.join(paths) or 'nothing'}")
        print("pack next (pack.py); after the device calls, before any commit: "
              "benchmarks/gpu/slim_index.py restore")
    else:
        paths = restore(ROOT)
        print(f"put back ({len(paths)}): {', '.join(paths) or 'nothing was slimmed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
