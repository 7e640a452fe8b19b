"""tools/mutate.py's hand-written mutations still apply: an entry whose line was rewritten would be reported
"stale" only when someone runs it; here it fails at once. Each names the test functions that kill it, and
those exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_mutate():
    spec = importlib.util.spec_from_file_location("hand_mutations", ROOT / "tools" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hand_mutations"] = module  # its dataclass looks itself up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("hand_mutations", None)
    return module


def test_every_hand_mutation_finds_its_line_once_and_names_existing_tests():
    mutate = load_mutate()
    stale = [(m.name, m.path) for m in mutate.MUTATIONS if (ROOT / m.path).read_text().count(m.old) != 1]
    assert stale == []
    missing = [(m.name, t) for m in mutate.MUTATIONS for t in m.tests
               if not (ROOT / t.split("::")[0]).is_file()]
    assert missing == []
    whole_files = [(m.name, t) for m in mutate.MUTATIONS for t in m.tests if "::" not in t]
    assert whole_files == []  # a test id, not a file: the entry says which test kills it
    unknown = [(m.name, t) for m in mutate.MUTATIONS for t in m.tests
               if f"def {t.split('::')[-1]}(" not in (ROOT / t.split("::")[0]).read_text()]
    assert unknown == []
    names = {m.name for m in mutate.MUTATIONS}
    assert len(names) == len(mutate.MUTATIONS)  # no two entries share a name
    assert set(mutate.QUICK) <= names
