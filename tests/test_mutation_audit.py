"""tools/mutation_audit.py keeps mutmut's verdicts where they stay sound: a full run starts from its fast run's,
and files added to a module's list do not make mutmut discard them (docs/TESTING.md, "How to run it")."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def audit(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mutation_audit", ROOT / "tools" / "mutation_audit.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "mutation_audit", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "WORK", tmp_path)
    return module


def fast_folder(work: Path, name: str) -> Path:
    mutants = work / f"{name}-fast" / "mutants" / "hugginggpt"
    mutants.mkdir(parents=True)
    (mutants / "access.py.meta").write_text(json.dumps({"exit_code_by_key": {"a__mutmut_1": 1, "a__mutmut_2": 0}}))
    (mutants.parent / "mutmut-stats.json").write_text("{}")
    (mutants.parent / "models" / "t").mkdir(parents=True)  # what a test or mutant left in the fast run's folder
    (work / f"{name}-fast" / "audit.json").write_text(json.dumps({"minutes": 12.5, "date": "2026-11-26"}))
    return work / f"{name}-fast"


def test_a_full_run_starts_from_the_fast_runs_verdicts_without_its_stats(audit, tmp_path):
    fast_folder(tmp_path, "access")
    full = tmp_path / "access"
    module = audit.Module("access", "hugginggpt/access.py", 0.95, ("tests/test_access_units.py",))
    audit.seed_from_fast(module, full)
    meta = json.loads((full / "mutants" / "hugginggpt" / "access.py.meta").read_text())
    assert meta["exit_code_by_key"] == {"a__mutmut_1": 1, "a__mutmut_2": 0}
    assert not (full / "mutants" / "mutmut-stats.json").exists()  # mutmut collects them for the full list
    assert not (full / "mutants" / "models").exists()  # the verdicts only
    assert json.loads((full / "audit.json").read_text())["minutes"] == 12.5  # the fast run's minutes count


def test_a_seeded_run_judges_again_the_functions_whose_text_changed_since_the_fast_run(audit, tmp_path, monkeypatch):
    fast = fast_folder(tmp_path, "access")
    (fast / "mutants" / "hugginggpt" / "access.py.meta").write_text(json.dumps({"exit_code_by_key": {
        "hugginggpt.access.x_f__mutmut_1": 1, "hugginggpt.access.x_g__mutmut_1": 0}}))
    (fast / "hugginggpt").mkdir()
    (fast / "hugginggpt" / "access.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    root = tmp_path / "root"
    (root / "hugginggpt").mkdir(parents=True)
    (root / "hugginggpt" / "access.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2  # pragma: no mutate\n")
    monkeypatch.setattr(audit, "ROOT", root)
    audit.seed_from_fast(audit.Module("access", "hugginggpt/access.py", 0.95, ()), tmp_path / "access")
    meta = json.loads((tmp_path / "access" / "mutants" / "hugginggpt" / "access.py.meta").read_text())
    assert meta["exit_code_by_key"] == {"hugginggpt.access.x_f__mutmut_1": 1, "hugginggpt.access.x_g__mutmut_1": None}


def test_a_full_run_with_verdicts_of_its_own_keeps_them(audit, tmp_path):
    fast_folder(tmp_path, "access")
    own = tmp_path / "access" / "mutants" / "hugginggpt"
    own.mkdir(parents=True)
    (own / "access.py.meta").write_text("mine")
    audit.seed_from_fast(audit.Module("access", "hugginggpt/access.py", 0.95, ()), tmp_path / "access")
    assert (own / "access.py.meta").read_text() == "mine"
    assert not (tmp_path / "access" / "audit.json").exists()


def selection(folder: Path, tests: list[str]) -> None:
    (folder / "mutants").mkdir(parents=True)
    (folder / "mutants" / "mutmut-stats.json").write_text("{}")
    (folder / "pyproject.toml").write_text(f"[tool.mutmut]\npytest_add_cli_args_test_selection = {json.dumps(tests)}\n")


@pytest.mark.parametrize(("before", "now", "kept"), [
    (["tests/a.py"], ("tests/a.py", "tests/b.py"), False),  # a file added: stats dropped, verdicts kept
    (["tests/a.py", "tests/b.py"], ("tests/a.py",), True),  # a file removed: mutmut's own reset
    (["tests/a.py"], ("tests/b.py",), True),  # another file: mutmut's own reset
    (["tests/a.py"], ("tests/a.py",), True),  # unchanged
])
def test_stats_are_dropped_only_when_files_are_added(audit, tmp_path, before, now, kept):
    selection(tmp_path, before)
    audit.keep_verdicts_when_tests_are_added(tmp_path, now)
    assert (tmp_path / "mutants" / "mutmut-stats.json").exists() == kept


def test_stats_older_than_a_listed_test_file_are_dropped(audit, tmp_path, monkeypatch):
    """A test added to a listed file after the stats were collected would never be chosen for a mutant."""
    import os

    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "a.py").write_text("def test_old(): pass\n")
    monkeypatch.setattr(audit, "ROOT", root)
    folder = tmp_path / "module"
    selection(folder, ["tests/a.py"])
    stats = folder / "mutants" / "mutmut-stats.json"
    os.utime(root / "tests" / "a.py", (stats.stat().st_mtime - 60,) * 2)
    audit.forget_stats_older_than_tests(folder, ("tests/a.py", "tests/gone.py"))
    assert stats.exists()  # collected after the file's last change
    os.utime(root / "tests" / "a.py", (stats.stat().st_mtime + 60,) * 2)
    audit.forget_stats_older_than_tests(folder, ("tests/a.py",))
    assert not stats.exists()
    audit.forget_stats_older_than_tests(folder, ("tests/a.py",))  # nothing left to drop: no error


def test_a_folder_without_a_configuration_yet_is_left_alone(audit, tmp_path):
    audit.keep_verdicts_when_tests_are_added(tmp_path / "new", ("tests/a.py",))
    assert not (tmp_path / "new").exists()


SHARED_FIXTURE_TESTS = '''
import pytest
from mutmut.state import state


@pytest.fixture(scope="module")
def app():
    state()._stats.add("hugginggpt.modelhost.app.x_create_app")  # what mutmut's trampoline records
    return "app"


def test_first(app):
    state()._stats.add("hugginggpt.plan.x_parse")


def test_second(app):
    pass


def test_without_it():
    pass
'''

COLLECTOR = '''
import json, os
import pytest
from mutmut.state import state

SEEN = {}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):  # as mutmut's stats collector: after the project's own hook
    SEEN[item.name] = sorted(state()._stats)
    state()._stats.clear()


def pytest_sessionfinish(session):
    with open(os.environ["SEEN_FILE"], "w") as f:
        json.dump(SEEN, f)
'''


def test_what_a_module_fixture_reached_counts_for_every_test_that_uses_it(tmp_path):
    """Under mutmut's stats a function reached while a module fixture was set up counts for each test using
    that fixture, not only the first (docs/TESTING.md, "Code the tests reach only inside a server they start")."""
    import os
    import subprocess

    (tmp_path / "test_shared.py").write_text(SHARED_FIXTURE_TESTS)
    (tmp_path / "collector.py").write_text(COLLECTOR)
    seen = tmp_path / "seen.json"
    env = {**os.environ, "MUTANT_UNDER_TEST": "stats", "SEEN_FILE": str(seen),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "collector",
                          "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_shared.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    app = "hugginggpt.modelhost.app.x_create_app"
    assert json.loads(seen.read_text()) == {"test_first": [app, "hugginggpt.plan.x_parse"], "test_second": [app],
                                            "test_without_it": []}


def test_a_recheck_runs_again_only_verdicts_older_than_the_run(audit):
    before = {"kept": ("survived", 4.0), "judged": ("survived", 4.0), "new": ("killed", 1.0), "stopped": ("not checked", None)}
    after = {"kept": ("survived", 4.0), "judged": ("survived", 9.5), "fresh": ("survived", 3.0),
             "new": ("killed", 1.0), "stopped": ("not checked", None), "untested": ("no tests", 0.0)}
    assert audit.rerun(before, after) == ["kept", "stopped"]


def test_a_function_whose_text_changed_is_judged_again_even_with_the_same_ast(audit, tmp_path):
    # mutmut keeps verdicts by mutant number while a function's AST is unchanged; a marker added there shifts
    # the numbers, so the driver unjudges that function (and only it)
    old = 'def f(x):\n    return g(x, "A")\n\n\nclass C:\n    def m(self):\n        return 1\n'
    new = ('def f(x):\n    return g(x,\n             "A",  # pragma: no mutate: a reason\n             )\n\n\n'
           'class C:\n    def m(self):\n        return 1\n')
    meta = tmp_path / "m.py.meta"
    meta.write_text(json.dumps({"exit_code_by_key": {"pkg.m.x_f__mutmut_1": 1, "pkg.m.x_f__mutmut_2": 0,
                                                     "pkg.m.xǁCǁm__mutmut_1": 1}}))
    audit.forget_reformatted(meta, old, new)
    assert json.loads(meta.read_text())["exit_code_by_key"] == {
        "pkg.m.x_f__mutmut_1": None, "pkg.m.x_f__mutmut_2": None, "pkg.m.xǁCǁm__mutmut_1": 1}
    audit.forget_reformatted(meta, new, new)  # nothing changed: nothing forgotten
    assert json.loads(meta.read_text())["exit_code_by_key"]["pkg.m.xǁCǁm__mutmut_1"] == 1


def test_a_changed_method_is_unjudged_under_mutmuts_own_name_for_it(audit, tmp_path):
    old = "class C:\n    def m(self):\n        return 1\n\n    async def n(self):\n        return 2\n"
    new = "class C:\n    def m(self):\n        return 1  # a comment\n\n    async def n(self):\n        return 2\n"
    meta = tmp_path / "m.py.meta"
    meta.write_text(json.dumps({"exit_code_by_key": {"pkg.m.xǁCǁm__mutmut_1": 1, "pkg.m.xǁCǁn__mutmut_1": 0}}))
    audit.forget_reformatted(meta, old, new)
    assert json.loads(meta.read_text())["exit_code_by_key"] == {"pkg.m.xǁCǁm__mutmut_1": None,
                                                                "pkg.m.xǁCǁn__mutmut_1": 0}


def test_verdicts_are_read_with_their_durations_for_the_modules_files_only(audit, tmp_path):
    mutants = tmp_path / "mutants" / "hugginggpt"
    mutants.mkdir(parents=True)
    (mutants / "access.py.meta").write_text(json.dumps({
        "exit_code_by_key": {"a__mutmut_1": 1, "a__mutmut_2": 0, "a__mutmut_3": None, "a__mutmut_4": 36,
                             "a__mutmut_5": -11},
        "durations_by_key": {"a__mutmut_1": 0.5, "a__mutmut_2": 4.0, "a__mutmut_4": 30.0, "a__mutmut_5": 1.0}}))
    (mutants / "other.py.meta").write_text(json.dumps({"exit_code_by_key": {"o__mutmut_1": 0}}))
    module = audit.Module("access", "hugginggpt/access.py", 0.95, ("tests/test_access.py",))
    assert audit.verdicts(tmp_path, module) == {
        "a__mutmut_1": ("killed", 0.5), "a__mutmut_2": ("survived", 4.0), "a__mutmut_3": ("not checked", None),
        "a__mutmut_4": ("timeout", 30.0), "a__mutmut_5": ("segfault", 1.0)}  # mutmut's own names
    assert audit.statuses(tmp_path, module) == {name: st for name, (st, _) in audit.verdicts(tmp_path, module).items()}


def test_a_stopped_run_says_what_mutmut_said_and_how_to_see_the_failing_test(audit, tmp_path):
    log = tmp_path / "mutmut.log"
    log.write_text("⠴ Generating mutants\n    done in 8265ms (1 files mutated)\n\n" + "⠏ Running stats\n" * 40
                   + "failed to collect stats. runner returned 1\n")
    module = audit.Module("dl", "hugginggpt/modelhost/download.py", 0.85, ("tests/a.py", "tests/b.py"))
    said = audit.stopped(module, tmp_path, log, 1, {"pytest_add_cli_args": ["-p", "no:randomly"]}).splitlines()
    assert said[0] == f"mutmut stopped on dl (exit 1); the end of {log}:"
    assert said[1:3] == ["    done in 8265ms (1 files mutated)", "failed to collect stats. runner returned 1"]
    assert said[3].startswith(f"to see the failing test: cd {tmp_path / 'mutants'} && MUTANT_UNDER_TEST=stats ")
    # the tests as mutmut runs them: with the configured pytest arguments
    assert said[3].endswith(" -m pytest -x -q -p no:randomly tests/a.py tests/b.py") and len(said) == 4


def test_tests_failing_with_no_mutant_after_the_run_are_reported(audit, tmp_path):
    """A mutant that leaves a file behind can fail the tests of every mutant after it, each counted as killed:
    the driver runs the tests once more, with no mutant, in the folder the mutants ran in."""
    tests = tmp_path / "mutants" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_left.py").write_text("from pathlib import Path\n\n\n"
                                        "def test_nothing_left_behind():\n    assert not Path('models').exists()\n")
    module = audit.Module("m", "hugginggpt/m.py", 0.85, ("tests/test_left.py",))
    base = {"pytest_add_cli_args": ["-p", "no:cacheprovider"]}
    assert audit.clean_check(module, tmp_path, base) is None
    (tmp_path / "mutants" / "models").mkdir()  # what a mutant left
    said = audit.clean_check(module, tmp_path, base)
    assert said is not None and "1 failed" in said


def judging(folder: Path):
    """A mutmut run that went through and judged one more mutant."""
    def run(cwd, *args, log=None):
        meta = folder / "mutants" / "hugginggpt" / "m.py.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        seen = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        meta.write_text(json.dumps({"exit_code_by_key": {**seen, f"m__mutmut_{len(seen) + 1}": 1}}))
        return 0
    return run


def test_a_run_whose_tests_then_fail_with_no_mutant_is_not_scored(audit, tmp_path, monkeypatch):
    folder = tmp_path / "m"
    (folder / "mutants" / "tests").mkdir(parents=True)
    (folder / "mutants" / "tests" / "test_left.py").write_text("def test_fails():\n    assert False\n")
    monkeypatch.setattr(audit, "prepare", lambda module, base: folder)
    monkeypatch.setattr(audit, "mutmut", judging(folder))
    module = audit.Module("m", "hugginggpt/m.py", 0.85, ("tests/test_left.py",))
    with pytest.raises(SystemExit, match="tests fail with no mutant applied"):
        audit.run_module(module, {"pytest_add_cli_args": []}, recheck=False, max_children=None)
    (folder / "mutants" / "tests" / "test_left.py").write_text("def test_passes():\n    pass\n")
    score = audit.run_module(module, {"pytest_add_cli_args": []}, recheck=False, max_children=None)
    assert (score.mutants, score.killed) == (2, 2)


def test_the_clean_check_runs_only_after_a_run_that_judged_a_mutant(audit, tmp_path, monkeypatch):
    """A resumed run with nothing left to judge ran no mutant that could leave anything behind, and mutmut ran the
    tests clean before it: the minutes of a second clean pass are saved."""
    folder = tmp_path / "m"
    (folder / "mutants").mkdir(parents=True)
    checked = []
    monkeypatch.setattr(audit, "prepare", lambda module, base: folder)
    monkeypatch.setattr(audit, "clean_check", lambda module, folder, base: checked.append(module.name))
    module = audit.Module("m", "hugginggpt/m.py", 0.85, ("tests/test_left.py",))
    monkeypatch.setattr(audit, "mutmut", judging(folder))
    audit.run_module(module, {}, recheck=False, max_children=None)
    assert checked == ["m"]
    monkeypatch.setattr(audit, "mutmut", lambda cwd, *args, log=None: 0)  # all judged before: nothing run
    assert audit.run_module(module, {}, recheck=False, max_children=None).mutants == 1
    assert checked == ["m"]


def test_every_file_of_the_package_is_in_the_audit_and_every_file_it_names_exists(audit):
    """A new module cannot be missed (named by a module's `path`, globs as mutmut reads them, or a face), nor can
    a renamed test or module leave an entry naming nothing (docs/TESTING.md, "Covering the whole package")."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    _base, modules, quick, faces = audit.settings()
    files = audit.package_files()
    assert "hugginggpt/server.py" in files and "hugginggpt/modelhost/pool.py" in files  # the package is read
    assert audit.unaudited(modules, faces) == []
    twice = {rel: by for rel in files if len(by := audit.audited_by(rel, modules)) > 1}
    assert twice == {}  # one row per file: its mutants judged against one list of tests
    assert [m.name for m in modules.values() if not any(audit.audited_by(rel, {m.name: m}) for rel in files)] == []
    tests = {t for m in modules.values() for t in m.tests} | {t for ts in quick.values() for t in ts}
    assert sorted(t for t in tests if not (ROOT / t).is_file()) == []
    assert all(m.tests for m in modules.values()) and set(quick) <= set(modules)
    assert {m.goal for m in modules.values()} <= {0.85, 0.95}
    for face in faces:  # nothing for mutmut to mutate, a reason, and in no module as well
        assert (ROOT / face.path).is_file() and face.why.strip(), face
        assert audit.audited_by(face.path, modules) == [], face
        assert mutate_file_contents(face.path, (ROOT / face.path).read_text()).mutant_names == [], face
    assert len({f.path for f in faces}) == len(faces)


def test_a_module_left_out_of_the_audit_is_named(audit):
    """What the check above reads: drop one entry, or one face, and its file is reported."""
    _base, modules, _quick, faces = audit.settings()
    without = {name: m for name, m in modules.items() if name != "httpbody"}
    assert audit.unaudited(without, faces) == ["hugginggpt/httpbody.py"]
    assert audit.unaudited(modules, faces[1:]) == [faces[0].path]
    glob = {name: m for name, m in modules.items() if name != "gradio_ui"}
    assert audit.unaudited(glob, faces) == [f for f in audit.package_files() if f.startswith("hugginggpt/gradio_ui/")]


def test_the_lines_mutmut_leaves_unmutated_are_counted_as_mutmut_skips_them(audit):
    """mutmut makes no mutant of a decorated function (a context manager, a property); the table says how many
    lines each module has there, counted as mutmut decides, so a 100% row is not read as covering them."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    source = '''import contextlib


def plain(a):
    return a + 1


@contextlib.contextmanager
def held(a):
    yield a + 1


class Box:
    @property
    def size(self):
        return 2 * 3

    @staticmethod
    def make(a):
        return a - 1


opened = contextlib.contextmanager(plain)
'''
    mutated = {name.split("__mutmut")[0].split("ǁ")[-1].removeprefix("x_") for name in
               mutate_file_contents("sample.py", source).mutant_names}
    found = audit.decorated_functions(source)
    assert {name for name, _ in found} == {"held", "size"}  # the ones mutmut left alone
    assert not {name for name, _ in found} & mutated and {"plain", "make"} <= mutated
    assert dict(found) == {"held": 2, "size": 2}  # their lines from `def` on
    rows = audit.table(audit.settings()[1])
    progress_row = next(line for line in rows.splitlines() if line.startswith("| modelhost_progress "))
    expected = audit.decorated_lines(audit.settings()[1]["modelhost_progress"])
    assert progress_row.split("|")[9].strip() == str(expected)


def test_a_recorded_row_keeps_the_decorated_lines_its_run_left_unmutated(audit, tmp_path, monkeypatch):
    """A row run on another day keeps its own count of unmutated lines: a context manager wrapped since then (so
    mutmut now mutates it) was not in that run, and the row must not read as if it had been; a row written before
    the column existed gets the count of the source as it is now."""
    table = tmp_path / "TESTING.md"
    header = audit.HEADER
    old = "| admission | 19 | 19 | 19 | 0 | 0 | 0 | 0 | 7 | 100% | 95% | yes | 8 | 2026-11-28 |"
    older = "| cancel | 20 | 20 | 18 | 0 | 0 | 2 | 0 | 100% | 95% | yes | 9 | 2026-11-28 |"
    table.write_text(f"{audit.TABLE_START}\n{header}\n{old}\n{older}\n{audit.TABLE_END}\n")
    monkeypatch.setattr(audit, "TABLE", table)
    modules = audit.settings()[1]
    rows = audit.table({name: modules[name] for name in ("admission", "cancel")}).splitlines()
    assert rows[2] == old
    assert rows[3].split("|")[9].strip() == str(audit.decorated_lines(modules["cancel"]))
    assert [c.strip() for c in rows[3].split("|")[7:9]] == ["2", "0"]  # timeouts, excluded: in place


def test_a_runs_unmutated_lines_are_counted_in_the_source_it_ran_on(audit, tmp_path):
    """A run folder holds the copy of the source its run mutated: a context manager decorated then and wrapped
    since counts as unmutated in that run's row, and its pragma markers are the ones that run saw."""
    module = audit.settings()[1]["admission"]
    folder = tmp_path / "admission"
    (folder / "mutants" / "hugginggpt").mkdir(parents=True)
    (folder / "mutants" / "hugginggpt" / "admission.py.meta").write_text(
        json.dumps({"exit_code_by_key": {"hugginggpt.admission.x_take__mutmut_1": 1}}))
    then = (ROOT / module.path).read_text().replace("def _admitted(", "@contextlib.contextmanager\ndef admitted(")
    then = then.replace("    take(slots, limit)\n", "    take(slots, limit)  # pragma: no mutate\n", 1)
    (folder / "hugginggpt").mkdir()
    (folder / module.path).write_text(then)
    score = audit.score_of(folder, module)
    assert score.decorated == audit.decorated_lines(module) + 7 and score.excluded == audit.excluded_lines(module) + 1
    assert score.mutants == 1 and score.killed == 1
    (folder / module.path).unlink()  # a folder without its copy (an older layout): the project's source
    assert audit.score_of(folder, module).decorated == audit.decorated_lines(module)


def test_a_not_run_row_is_counted_again_from_the_source(audit, tmp_path, monkeypatch):
    table = tmp_path / "TESTING.md"
    stale = "| admission | not run yet | | | | | | 0 | 99 | | 95% | no | | |"
    table.write_text(f"{audit.TABLE_START}\n{audit.HEADER}\n{stale}\n{audit.TABLE_END}\n")
    monkeypatch.setattr(audit, "TABLE", table)
    module = audit.settings()[1]["admission"]
    [row] = audit.table({"admission": module}).splitlines()[2:]
    assert row.split("|")[9].strip() == str(audit.decorated_lines(module)) != "99"


@pytest.mark.parametrize(("said", "kept"), [
    ("⠋ 673/2479  🎉 439\n", True),  # stopped by a signal (Ctrl-C, kill) midway: what it judged stays
    ("Running clean tests\nFailed to run clean test\n", False),  # results naming mutants gone: afresh, once
])
def test_a_stopped_run_keeps_its_verdicts_unless_mutmut_could_not_run_the_tests_clean(audit, tmp_path, monkeypatch,
                                                                                       said, kept):
    folder = tmp_path / "m"
    meta = folder / "mutants" / "hugginggpt" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"m__mutmut_1": 1, "m__mutmut_2": None}}))
    (folder / "mutmut.log").write_text("Failed to run clean test\n")  # an earlier run's: not this one's
    monkeypatch.setattr(audit, "prepare", lambda module, base: folder)
    runs = []

    def stopped(cwd, *args, log=None):
        runs.append(args)
        with log.open("a") as out:
            out.write(said)
        return -15 if kept else 1

    monkeypatch.setattr(audit, "mutmut", stopped)
    module = audit.Module("m", "hugginggpt/m.py", 0.85, ("tests/test_m.py",))
    with pytest.raises(SystemExit):
        audit.run_module(module, {"pytest_add_cli_args": []}, recheck=False, max_children=None)
    assert meta.exists() is kept and len(runs) == (1 if kept else 2)
