"""Re-render the lab page's stored grids with this version's statistics, without rerunning anything.

    python scripts/restate_lab.py

For each stored grid (``docs/lab/*.json``, ``docs/lab/smollm2/results.json``): restate its statistics from
its runs' summaries and, where they were kept (``docs/lab/<grid>/steps.json.gz``), their per-step rows
(``rlstab.lab.analysis.restate_published``); write it back; and replace its report's sections in
``docs/lab.md`` (the regime sections of ``rlstab.lab.report.markdown``, as the page quotes them) by the new
ones. tests/lab/test_analysis.py checks that every stored grid is its own restatement, and
tests/docs/test_lab_page.py that the page quotes each one's report.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlstab.lab.analysis import restate_published
from rlstab.lab.checkpoint import write_json
from rlstab.lab.report import markdown

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "lab.md"


def quoted(report: str) -> str:
    """The regime sections of a report as the page quotes them: ``## Regime`` and its paired headings one level down."""
    sections = report[report.index("## Regime"):report.index("## Definitions")].rstrip()
    return sections.replace("\n## ", "\n#### ").replace("## Regime", "#### Regime", 1)


def main() -> None:
    page = PAGE.read_text()
    for path in sorted((ROOT / "docs" / "lab").glob("**/*.json")):
        old = quoted(markdown(json.loads(path.read_text())))
        data = restate_published(path)
        new = quoted(markdown(data))
        if page.count(old) != 1:
            raise SystemExit(f"{path.relative_to(ROOT)}: its report is not on the page exactly once; nothing written")
        page = page.replace(old, new)
        write_json(path, data)
        print(f"{path.relative_to(ROOT)}: restated")
    PAGE.write_text(page)


if __name__ == "__main__":
    main()
