"""The test-run side of `tests/mutmut_child/sitecustomize.py`: only active while mutmut runs the tests.

At the start of the run the environment that child processes inherit names this runner and a folder for
hits; after each test, the functions the children reached are added to what mutmut recorded for it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

CHILD_SITE = Path(__file__).resolve().parent / "mutmut_child"


class ChildHits:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mutmut-hits-"))
        self.offsets: dict[Path, int] = {}
        self.reached: dict[Path, set[str]] = {}  # by child: every function it ever reached
        (self.folder / "epoch").touch()

    def collect(self) -> set[str]:
        """What the children reached during the test that just ended.

        A child the test talked to counts with everything it ever reached: a server started once for many
        tests (a session fixture) builds its routes at start-up, and a mutant there changes every later
        request, not only the first test's."""
        names: set[str] = set()
        for path in self.folder.glob("*.hits"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next test
            self.offsets[path] = self.offsets.get(path, 0) + end
            new = {line for line in data[:end].decode("utf-8").splitlines() if line}
            if new:
                reached = self.reached.setdefault(path, set())
                reached |= new
                names |= reached
        stamp = time.time_ns()
        os.utime(self.folder / "epoch", ns=(stamp, stamp))
        return names


class SharedFixtureHits:
    """Functions reached while a fixture wider than one test (module, session) was set up, by fixture.

    mutmut counts them for the one test during whose setup they ran. A module's app built once
    (`create_app` in a module fixture) serves every later test of the file through its routes, so a mutant
    there changes them all: each test that uses the fixture counts with what its setup reached."""

    def __init__(self) -> None:
        self.by_fixture: dict[int, set[str]] = {}

    @staticmethod
    def reached_so_far() -> set[str]:
        from mutmut.state import state

        return set(state()._stats)

    def set_up(self, fixturedef, before: set[str]) -> None:
        new = self.reached_so_far() - before
        if new:
            self.by_fixture.setdefault(id(fixturedef), set()).update(new)

    def used_by(self, item) -> set[str]:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        names: set[str] = set()
        for name in getattr(item, "fixturenames", ()):
            for fixturedef in defs.get(name, ()):
                names |= self.by_fixture.get(id(fixturedef), set())
        return names


def start() -> ChildHits | None:
    """Called at session start. Every process the tests start (servers, CLIs, and what they start in turn) exits
    when this test run is gone, however it ended (killed, timed out, a mutant stopped): `mutmut_child/
    sitecustomize.py` watches this pid in each of them. Under mutmut's stats run it also collects the functions
    they reach (the ChildHits returned; None otherwise)."""
    os.environ["HUGGINGGPT_TEST_RUNNER"] = str(os.getpid())
    path = os.environ.get("PYTHONPATH", "")
    if str(CHILD_SITE) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHILD_SITE), path) if p)
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return None
    hits = ChildHits()
    os.environ["HUGGINGGPT_MUTMUT_HITS"] = str(hits.folder)
    return hits


def hand_to_mutmut(hits: ChildHits, shared: SharedFixtureHits, item) -> None:
    from mutmut.state import state

    state()._stats.update(hits.collect() | shared.used_by(item))


def fastest_files_first(items: list) -> None:
    """While mutmut runs a mutant: the test files that ran fastest in its stats go first.

    mutmut stops at the first failing test (-x) but hands pytest its tests in no order, so a mutant the unit
    tests kill in a second could first wait for a file that starts servers. Files stay whole, so their
    fixtures are set up once; a survivor still runs every test."""
    mode = os.environ.get("MUTANT_UNDER_TEST")
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from its mutants/ folder
    if not mode or mode == "stats" or not stats.is_file():
        return
    import json

    durations = json.loads(stats.read_text()).get("duration_by_test", {})
    per_file: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        per_file[path] = per_file.get(path, 0.0) + durations.get(item.nodeid, 1.0)
    first_seen = {path: n for n, path in enumerate(dict.fromkeys(i.nodeid.split("::")[0] for i in items))}
    items.sort(key=lambda i: (per_file[i.nodeid.split("::")[0]], first_seen[i.nodeid.split("::")[0]]))
