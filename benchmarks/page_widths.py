"""Which elements of rendered report pages run past the right edge of a 1280-px browser window (tables, code, images,
plots), not counting those inside a box that scrolls sideways: headless Chromium loads each page with a probe script
and prints what it found. Usage: .venv/bin/python benchmarks/page_widths.py [PAGE.html | REPORT_DIR ...]
(default: every committed reference's report). Exit 1 when any page has such an element."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1280
PROBE = """<script>window.addEventListener('load', () => {
  const W = document.documentElement.clientWidth, out = [];
  const scrolls = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
    const o = getComputedStyle(p).overflowX;
    if ((o === 'auto' || o === 'scroll') && p.getBoundingClientRect().right <= W + 1) return true; } return false; };
  for (const el of document.querySelectorAll('table, pre, img, svg')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > W + 1 && !scrolls(el))
      out.push({tag: el.tagName.toLowerCase(), right_px: Math.round(r.right),
                text: (el.innerText || el.getAttribute('alt') || '').slice(0, 80).replace(/\\s+/g, ' ')});
  }
  document.body.dataset.cut = JSON.stringify({width_px: W, cut: out});
});</script>"""


def cut_elements(page: Path, chromium: str, width: int = WIDTH) -> dict:
    """What runs past the right edge of page at width px: {'width_px': the viewport, 'cut': [elements]}."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / page.name
        probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},1000",
                              "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'data-cut="([^"]*)"', dom)
    if m is None:
        raise RuntimeError(f"{page}: the probe did not run (Chromium printed no page)")
    return json.loads(html.unescape(m.group(1)))


def pages(args: list[str]) -> list[Path]:
    """The pages named, or every page of the report folders named (default: every committed reference's)."""
    found = []
    for a in args or [str(p) for p in sorted((ROOT / "data" / "reference").glob("**/report"))]:
        p = Path(a)
        found += sorted(p.glob("*.html")) if p.is_dir() else [p]
    return found


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium: `make browser` installs Debian's", file=sys.stderr)
        return 2
    bad = 0
    for page in pages(sys.argv[1:]):
        got = cut_elements(page, chromium)
        rel = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        for el in got["cut"]:
            bad += 1
            print(f"{rel}: <{el['tag']}> ends at {el['right_px']} px of {got['width_px']}: {el['text']}")
    print(f"cut_elements={bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
