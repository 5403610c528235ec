"""The README and the docs/ pages: their examples run and do what their text says, the README stays a
page, and every relative link points at a file (and heading) that exists."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def doc_files() -> list[Path]:
    """The README and every docs/ page."""
    return [README, *sorted(DOCS.glob("*.md"))]


def example(name: str) -> str:
    """The code block under `<!-- example: NAME -->`, in whichever of the README and docs/*.md holds it
    (exactly one must)."""
    pattern = re.compile(rf"<!-- example: {re.escape(name)} -->\n```\w+\n(.*?)```", re.S)
    found = [(path, m.group(1)) for path in doc_files() for m in pattern.finditer(path.read_text())]
    assert found, f"no <!-- example: {name} --> code block in README.md or docs/*.md"
    places = [str(path.relative_to(ROOT)) for path, _ in found]
    assert len(found) == 1, f"<!-- example: {name} --> is in {len(found)} places: {places}"
    return found[0][1]


def test_readme_loop_example_runs_short_and_long_rounds(tmp_path):
    block = example("loop")
    script = tmp_path / "example.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    rounds = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own README's output
    kinds = [kind for kind, _ in rounds]
    assert len(rounds) == 10 and "long" in kinds and kinds.count("short") >= 3 * kinds.count("long")


def test_readme_shows_make_train_and_make_test_first():
    commands = re.findall(r"^make (\w+)", README.read_text(), re.M)
    assert commands[:2] == ["train", "test"]


def test_readme_train_on_your_data_runs_both_layouts_and_the_custom_reward(tmp_path):
    """docs/your-data.md's commands, as written, on the tiny model for 2 steps (tiny_debug)."""
    import json

    from rollpacker.backends.models import tiny_random_llama

    root = ROOT
    (tmp_path / "my_reward.py").write_text(example("my_reward.py"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "qa.jsonl").write_text(example("data/qa.jsonl"))
    tiny = ["--preset", "tiny_debug", "--model", str(tiny_random_llama()), "--trainer", "torch"]
    commands = example("data").replace("\\\n", " ").splitlines()
    for line in (c.split("#")[0].split() for c in commands if c.strip()):
        assert line[0] == ".venv/bin/python", line  # the Makefile's environment: rollpacker is there
        script = str(root / line[1])
        args = line[2:] + (tiny if line[1] == "reference/train.py" else [])
        proc = subprocess.run([sys.executable, script, *args], cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    for run in ("math", "qa"):
        records = [json.loads(r) for r in (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [0, 1] and all(r["reward_num_failed"] == 0 for r in records)
    assert all("reward_metric_answered" in r for r in records), "the dict's other keys are metrics"


def test_readme_fits_on_a_page_and_the_docs_pages_open_with_a_title():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md is {len(lines)} lines: move the detail into a docs/ page"
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        assert re.match(r"# \S.*\n\n\S", text), f"{path.name} must open with a one-line H1 and a sentence"
    for path in doc_files():
        assert "../shared/" not in path.read_text(), f"{path.name} names ../shared/, which is not the project's"


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lowercased, punctuation other than `-` and
    `_` removed, spaces to `-`, a repeated one suffixed -1, -2, ... (headings inside code blocks are not)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", strip_code_blocks(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def strip_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)


def relative_links(text: str) -> list[str]:
    """The targets of the text's Markdown links and images, outside code, that are not URLs."""
    prose = re.sub(r"`[^`\n]*`", "", strip_code_blocks(text))
    targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose)
    return [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t)]


def test_every_relative_link_in_the_readme_and_docs_points_at_a_file_and_heading_that_exist():
    broken = []
    for path in doc_files():
        for target in relative_links(path.read_text()):
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in github_anchors(dest.read_text()):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_checker_sees_a_broken_link_and_github_anchors():
    assert relative_links("[a](docs/x.md#y) `[b](no.md)` [c](https://e.org) ![d](p.png)") == ["docs/x.md#y", "p.png"]
    anchors = github_anchors("# What would it save? `rollpacker advise`\n## TRL's GRPOTrainer\n## Faults\n## Faults\n"
                             "```bash\n# a comment\n```\n")
    assert anchors == {"what-would-it-save-rollpacker-advise", "trls-grpotrainer", "faults", "faults-1"}
