"""benchmarks/results.py, the one way benchmarks write their pages: sections are replaced in
place, the prose around them stays, a missing section is appended, an old open marker runs to
the end of the page."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from results import append_json_line, write_json, write_page, write_sections  # noqa: E402


def test_sections_replaced_in_place_and_prose_kept(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    write_sections(page, {"summary": ["| a |", "|---|", "| 1 |"], "measured": "rows 1"},
                   title="A benchmark")
    text = page.read_text()
    assert text.startswith("# A benchmark\n") and text.index("summary") < text.index("rows 1")
    page.write_text(text.replace("<!-- measured -->", "Prose the script never writes.\n\n"
                                 "<!-- measured -->"))
    write_sections(page, {"summary": ["| a |", "|---|", "| 2 |"], "measured": "rows 2"})
    again = page.read_text()
    assert "| 2 |" in again and "| 1 |" not in again and "rows 1" not in again
    assert "Prose the script never writes." in again and again.count("<!-- /measured -->") == 1
    write_sections(page, {"summary": ["| a |", "|---|", "| 2 |"], "measured": "rows 2"})
    assert page.read_text() == again  # writing the same results changes nothing


def test_old_open_marker_runs_to_the_end(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Old\n\nProse.\n\n<!-- measured -->\n\nold rows\n")
    write_sections(page, {"measured": ["new rows"]})
    assert page.read_text() == ("# Old\n\nProse.\n\n<!-- measured -->\n\nnew rows\n\n"
                                "<!-- /measured -->\n")


def test_whole_page_and_json(tmp_path: Path) -> None:
    write_page(tmp_path / "new" / "page.md", ["# T", "", "| x |"])
    assert (tmp_path / "new" / "page.md").read_text() == "# T\n\n| x |\n"
    write_json(tmp_path / "r.json", {"path": tmp_path})
    assert json.loads((tmp_path / "r.json").read_text()) == {"path": str(tmp_path)}
    for k in (1, 2):
        append_json_line(tmp_path / "r.jsonl", {"row": k})
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"row": 1}, {"row": 2}]
