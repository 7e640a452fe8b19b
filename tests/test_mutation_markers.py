"""Every `# pragma: no mutate` marker in the package excludes its own line, as mutmut reads it.

mutmut (mutation/pragma_handling.py) takes a marker at the end of a statement for the statement's first line:
one written after the closing bracket of a call that spans lines leaves its own line mutated and hides the
first line's mutants instead, killable ones included (docs/TESTING.md, "How to run it")."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def marked_and_excluded(path: Path) -> tuple[set[int], set[int]]:
    """Lines with a marker; lines mutmut takes a one-line marker for (a `block` marker's range aside)."""
    import libcst as cst
    from mutmut.mutation.pragma_handling import PragmaVisitor

    source = path.read_text(encoding="utf-8")
    visitor = PragmaVisitor(str(path))
    cst.MetadataWrapper(cst.parse_module(source)).visit(visitor)
    marked = {n for n, line in enumerate(source.splitlines(), 1) if "pragma: no mutate" in line}
    return marked, visitor.no_mutate_lines


def test_each_marker_excludes_the_line_it_is_written_on():
    pytest.importorskip("mutmut")
    wrong = []
    for path in sorted((ROOT / "hugginggpt").rglob("*.py")):
        if "no mutate" not in path.read_text(encoding="utf-8"):
            continue
        marked, excluded = marked_and_excluded(path)
        rel = path.relative_to(ROOT)
        wrong += [f"{rel}:{n}: marked, but mutmut mutates it" for n in sorted(marked - excluded)]
        wrong += [f"{rel}:{n}: unmarked, but mutmut skips it" for n in sorted(excluded - marked)]
    assert wrong == []


def test_a_marker_after_a_closing_bracket_is_caught(tmp_path):
    pytest.importorskip("mutmut")
    code = tmp_path / "m.py"
    code.write_text("x = f(1,\n      2)  # pragma: no mutate: said of the 2\n"
                    "y = g(1,\n      2,  # pragma: no mutate: ok\n      )\n")
    assert marked_and_excluded(code) == ({2, 4}, {1, 4})
