"""Shared writer of benchmarks/RESULTS.md: each benchmark owns one `## ` section (and may own
`### ` subsections inside it); writing one leaves every other section as it is."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def _replace_block(text: str, level: str, title: str, block: str) -> str:
    pattern = re.compile(rf"^{level} {re.escape(title)}\n.*?(?=^{level} |\Z)", re.S | re.M)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + "\n\n" + block


def write_section(title: str, body: str, subsection: str | None = None, path: Path = RESULTS) -> None:
    """Replace `## title` (or `### subsection` inside it) with `body`, re-reading the file first."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if subsection is None:
        text = _replace_block(text, "##", title, f"## {title}\n\n{body.strip()}\n\n")
    else:
        match = re.search(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", text, re.S | re.M)
        section = match.group(0) if match else f"## {title}\n\n"
        section = _replace_block(section, "###", subsection, f"### {subsection}\n\n{body.strip()}\n\n")
        text = (text[: match.start()] + section + text[match.end():]) if match else text.rstrip("\n") + "\n\n" + section
    path.write_text(re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n")
