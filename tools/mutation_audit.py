"""Run mutmut on one module of the package against the test files that cover it, and keep its score.

    python tools/mutation_audit.py access            # mutate hugginggpt/access.py; resumes where it stopped
    python tools/mutation_audit.py access --recheck  # run the survivors again (after adding tests)
    python tools/mutation_audit.py --quick --check   # what CI runs: the `quick` modules, exit 1 below goal
    python tools/mutation_audit.py --table           # the score table from what has been run, into docs/TESTING.md
    python tools/mutation_audit.py access --survivors  # each survivor's diff

Modules, their covering test files and goals are in pyproject.toml ([tool.mutation-audit.modules]); mutmut's
own settings are under [tool.mutmut]. Every .py file under hugginggpt/ is named by a module's `path` (a glob as
mutmut reads it) or listed in `faces` ([tool.mutation-audit]): a file with nothing to mutate, never run. Each
module runs in its own copy of the tree, .mutmut/<module>/, so results of one module are never mixed with another's
and a stopped run resumes. Nothing here mutates code: mutmut does. See docs/TESTING.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutmut"
TABLE = ROOT / "docs" / "TESTING.md"
TABLE_START, TABLE_END = "<!-- mutation-table:start -->", "<!-- mutation-table:end -->"
CAUGHT = ("killed", "timeout", "caught by type check")
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"  # the frames mutmut's progress line starts with


@dataclass(frozen=True)
class Module:
    name: str
    path: str
    goal: float
    tests: tuple[str, ...]


@dataclass(frozen=True)
class Face:
    """A file of the package with nothing for mutmut to mutate (a docstring, a re-export): not run, for `why`."""

    path: str
    why: str


@dataclass
class Score:
    module: str
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    timeout: int = 0
    other: int = 0
    not_checked: int = 0
    excluded: int = 0
    decorated: int = 0
    minutes: float = 0.0
    day: str = ""

    @property
    def caught(self) -> int:
        return self.killed + self.timeout

    @property
    def ratio(self) -> float:
        return self.caught / self.mutants if self.mutants else 0.0


def settings() -> tuple[dict, dict[str, Module], dict[str, list[str]], tuple[Face, ...]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    audit = data["tool"]["mutation-audit"]
    modules = {name: Module(name, m["path"], float(m["goal"]), tuple(m["tests"]))
               for name, m in audit["modules"].items()}
    quick = dict(audit.get("quick", {}))
    faces = tuple(Face(f["path"], f["why"]) for f in audit.get("faces", []))
    base = dict(data["tool"]["mutmut"])
    base["quick_timeout_constant"] = audit.get("quick_timeout_constant", base.get("timeout_constant"))
    return base, modules, quick, faces


def package_files() -> list[str]:
    """Every .py file under hugginggpt/, relative to the tree (tracked or not: a new module counts at once)."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "hugginggpt").rglob("*.py")
                  if "__pycache__" not in p.parts)


def audited_by(rel: str, modules: dict[str, Module]) -> list[str]:
    """The modules whose `path` names `rel`, matched as mutmut's only_mutate is (fnmatch: `*` spans folders)."""
    from fnmatch import fnmatch

    return [m.name for m in modules.values() if fnmatch(rel, m.path)]


def unaudited(modules: dict[str, Module], faces: tuple[Face, ...]) -> list[str]:
    """The package's .py files that no module's path names and that are not faces: outside the audit."""
    face_paths = {f.path for f in faces}
    return [rel for rel in package_files() if rel not in face_paths and not audited_by(rel, modules)]


def tree_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and (ROOT / f).is_file() and not f.startswith(".mutmut/")]


def toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def prepare(module: Module, base: dict) -> Path:
    """Bring .mutmut/<module>/ up to date with the working tree; a changed file is copied again into mutants/."""
    folder = WORK / module.name
    folder.mkdir(parents=True, exist_ok=True)
    wanted = set(tree_files())
    for rel in wanted:
        src, dst = ROOT / rel, folder / rel
        if dst.exists() and dst.read_bytes() == src.read_bytes():
            continue
        if rel.startswith("hugginggpt/") and dst.exists():
            forget_reformatted(folder / "mutants" / f"{rel}.meta", dst.read_text(), src.read_text())
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        if rel.startswith("hugginggpt/"):  # mutmut copies (or mutates) it again; tests/ etc. it copies every run
            (folder / "mutants" / rel).unlink(missing_ok=True)
    for path in list(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not rel.startswith(("mutants/", "audit.json", "preload.")) and rel not in wanted \
                and "__pycache__" not in rel and rel != "pyproject.toml":
            path.unlink()
    config = dict(base, only_mutate=[module.path], pytest_add_cli_args_test_selection=list(module.tests),
                  forkserver_warmup="import", preload_modules_file=str(preload(module, folder)))
    keep_verdicts_when_tests_are_added(folder, module.tests)
    forget_stats_older_than_tests(folder, module.tests)
    (folder / "pyproject.toml").write_text(
        "# written by tools/mutation_audit.py from the repository's pyproject.toml\n[tool.mutmut]\n"
        + "".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()))
    return folder


def function_texts(source: str) -> dict[str, str]:
    """mutmut's name for each function (x_f, xǁClassǁmethod) -> its whole lines, comments and layout included
    (a comment after its last statement too)."""
    import ast

    from mutmut.mutation.trampoline_templates import mangle_function_name

    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    lines = source.splitlines()
    texts: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, functions):
            members, class_name = [node], None
        elif isinstance(node, ast.ClassDef):
            members, class_name = [m for m in node.body if isinstance(m, functions)], node.name
        else:
            continue
        for fn in members:
            name = mangle_function_name(name=fn.name, class_name=class_name)
            texts[name] = "\n".join(lines[fn.lineno - 1:fn.end_lineno])
    return texts


def forget_reformatted(meta: Path, old: str, new: str) -> None:
    """Unjudge the mutants of each function whose text changed. mutmut keeps a function's verdicts while its
    AST is the same, by mutant number; a marker added there (a comment, a line split) removes mutants and
    shifts the numbers after it, so a verdict would stick to another mutant."""
    if not meta.exists():
        return
    try:
        before, after = function_texts(old), function_texts(new)
    except SyntaxError:
        return
    changed = {name for name, text in after.items() if before.get(name) not in (None, text)}
    if not changed:
        return
    data = json.loads(meta.read_text())
    codes = data["exit_code_by_key"]
    for key in codes:
        if key.rpartition("__mutmut_")[0].rpartition(".")[2] in changed:
            codes[key] = None
    meta.write_text(json.dumps(data))


def keep_verdicts_when_tests_are_added(folder: Path, tests: tuple[str, ...]) -> None:
    """mutmut resets every verdict when the test selection changes, unless it collects its stats afresh. With
    files only added, what was killed stays killed: drop the stats to keep the verdicts (--recheck runs the
    survivors). Called before the folder's configuration is written anew."""
    written = folder / "pyproject.toml"
    if not written.exists():
        return
    before = tomllib.loads(written.read_text())["tool"]["mutmut"].get("pytest_add_cli_args_test_selection", [])
    if before != list(tests) and set(before) <= set(tests):
        (folder / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)


def forget_stats_older_than_tests(folder: Path, tests: tuple[str, ...]) -> None:
    """mutmut picks a mutant's tests from its stats (which test reaches which function): a test added to a listed
    file after they were collected is never chosen, so a survivor it would kill survives every --recheck. When a
    listed file changed since, drop the stats (the verdicts stay; mutmut collects them afresh)."""
    stats = folder / "mutants" / "mutmut-stats.json"
    if not stats.exists():
        return
    collected = stats.stat().st_mtime
    if any((ROOT / test).is_file() and (ROOT / test).stat().st_mtime > collected for test in tests):
        stats.unlink()


def clean_env() -> dict[str, str]:
    """This environment without mutmut's marker: what starts here chooses its own mutant, or none."""
    return {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}


# Not preloaded: the code under test (the fork server would hold the unmutated copy), the tests, the runners.
NOT_PRELOADED = ("hugginggpt", "tests", "conftest", "__main__", "mutmut", "pytest", "_pytest", "pluggy", "py")
_RECORD = ("import sys, pytest\n"
           "pytest.main(sys.argv[2:])\n"
           "open(sys.argv[1], 'w').write('\\n'.join(sorted(sys.modules)))\n")
_CHECK = ("import importlib, sys, threading\n"
          "ok = []\n"
          "for name in open(sys.argv[1]).read().split():\n"
          "    before = threading.active_count()\n"
          "    try:\n"
          "        importlib.import_module(name)\n"
          "    except BaseException:\n"
          "        continue\n"
          "    if threading.active_count() == before:\n"
          "        ok.append(name)\n"
          "open(sys.argv[2], 'w').write('\\n'.join(ok))\n")


def preload(module: Module, folder: Path) -> Path:
    """The third-party modules the module's tests import while they run, for mutmut's fork server to import once.

    transformers and diffusers import most of themselves lazily, at the first pipeline, so mutmut's default
    warm-up (collecting the tests) leaves each mutant's process to import them again: seconds per mutant.
    Recorded once per folder by running the tests; a module whose import fails or starts a thread is left out
    (a thread does not survive the fork)."""
    target = folder / "preload.txt"
    if target.exists():
        return target
    seen = folder / "preload.seen"
    env = clean_env()
    subprocess.run([sys.executable, "-c", _RECORD, str(seen), "-q", "-x", "-p", "no:cacheprovider", *module.tests],
                   cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    names = [n for n in (seen.read_text().split() if seen.exists() else [])
             if n.split(".")[0] not in NOT_PRELOADED and not n.startswith("test_")]
    seen.write_text("\n".join(names))
    subprocess.run([sys.executable, "-c", _CHECK, str(seen), str(target)], cwd=folder, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if not target.exists():
        target.write_text("")
    return target


def mutmut(folder: Path, *args: str, log: Path | None = None) -> int:
    exe = Path(sys.executable).with_name("mutmut")
    env = clean_env()
    if log is None:
        return subprocess.run([str(exe), *args], cwd=folder, env=env).returncode
    with log.open("a") as out:
        return subprocess.run([str(exe), *args], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def source_of(meta: Path, mutants: Path) -> str:
    """The file a mutmut result file speaks of, relative to the tree: `hugginggpt/access.py` for its `.meta`."""
    return meta.relative_to(mutants).as_posix()[: -len(".meta")]


def verdicts(folder: Path, module: Module) -> dict[str, tuple[str, float | None]]:
    """Mutant name -> (mutmut's status, seconds its tests took), read from its own result files: a mutant run
    again gets a new duration."""
    from fnmatch import fnmatch

    from mutmut.stats import status_by_exit_code

    found: dict[str, tuple[str, float | None]] = {}
    for meta in (folder / "mutants").rglob("*.py.meta"):
        rel = source_of(meta, folder / "mutants")
        if not fnmatch(rel, module.path):
            continue
        data = json.loads(meta.read_text())
        took = data.get("durations_by_key", {})
        for name, code in data["exit_code_by_key"].items():
            found[name] = (status_by_exit_code[code], took.get(name))
    return found


def statuses(folder: Path, module: Module) -> dict[str, str]:
    """Mutant name -> mutmut's status."""
    return {name: status for name, (status, _took) in verdicts(folder, module).items()}


def module_files(module: Module, root: Path = ROOT) -> list[Path]:
    """The .py files a module's `path` names (in the project, or in a run's copy of it)."""
    return sorted(p for p in root.glob(module.path) if p.suffix == ".py")


def excluded_lines(module: Module, root: Path = ROOT) -> int:
    count = 0
    for path in module_files(module, root):
        count += sum("pragma: no mutate" in line for line in path.read_text().splitlines())
    return count


def decorated_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function mutmut leaves unmutated because it is decorated (anything but
    staticmethod / classmethod: mutmut 3 skips them, since decorators run at definition time). Their lines are
    outside the score: the table shows how many, so a module's 100% is not read as covering them."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
            names = [ast.unparse(d) for d in node.decorator_list]
            if names not in (["staticmethod"], ["classmethod"]):
                found.append((node.name, node.end_lineno - node.lineno + 1))  # from `def` (lineno) to its end
    return found


def decorated_lines(module: Module, root: Path = ROOT) -> int:
    return sum(lines for path in module_files(module, root) for _name, lines in decorated_functions(path.read_text()))


def score_of(folder: Path, module: Module) -> Score:
    """The run's figures; its excluded and decorated lines counted in the source it ran on (the folder's copy),
    so a function wrapped since (mutated now, not in that run) is not read as covered by it."""
    state = statuses(folder, module)
    audit = json.loads((folder / "audit.json").read_text()) if (folder / "audit.json").exists() else {}
    ran_on = folder if module_files(module, folder) else ROOT
    s = Score(module.name, mutants=len(state), excluded=excluded_lines(module, ran_on),
              decorated=decorated_lines(module, ran_on),
              minutes=audit.get("minutes", 0.0), day=audit.get("date", ""))
    for status in state.values():
        field = {"killed": "killed", "survived": "survived", "no tests": "no_tests", "timeout": "timeout",
                 "not checked": "not_checked"}.get(status, "other")
        if status == "caught by type check":
            field = "killed"
        setattr(s, field, getattr(s, field) + 1)
    return s


def seed_from_fast(module: Module, folder: Path) -> None:
    """Start a module's full run from its --fast run's verdicts, where it has none of its own.

    The full run's tests are a superset of the fast ones, so what the fast tests killed stays killed; mutmut
    collects which test reaches which function afresh (only the verdicts are copied, no stats, so a changed
    test selection does not reset them) and runs only what the fast run left unchecked, then --recheck runs
    the survivors against every covering file. A function changed since is judged again: mutmut mutates it again
    when its AST changed (it compares a hash), and the driver unjudges it when only its text did."""
    fast = WORK / f"{module.name}-fast"  # a -fast or -quick module has no such folder
    if (folder / "mutants").exists() or not (fast / "mutants").exists():
        return
    for found in (fast / "mutants").rglob("*.py.meta"):
        # the verdicts only: mutmut mutates the files again, and what a test or mutant left in the fast run's
        # folder (a download into the project's models/) must not meet this run's tests
        rel = source_of(found, fast / "mutants")
        meta = folder / "mutants" / f"{rel}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found, meta)
        if (fast / rel).is_file() and (ROOT / rel).is_file():  # the fast run's verdicts on a text changed since
            forget_reformatted(meta, (fast / rel).read_text(), (ROOT / rel).read_text())
    if (fast / "audit.json").exists():  # the minutes the fast run took count toward this row
        shutil.copy2(fast / "audit.json", folder / "audit.json")


def clean_run_failed(log: Path, since: int) -> bool:
    """Whether mutmut's run logged from byte `since` on stopped because the tests failed with no mutant applied."""
    with log.open("rb") as f:
        f.seek(since)
        return b"Failed to run clean test" in f.read()


def run_module(module: Module, base: dict, *, recheck: bool, max_children: int | None, restat: bool = False) -> Score:
    folder = prepare(module, base)
    seed_from_fast(module, folder)
    if restat:  # which test reaches which function is collected again (mutmut keeps it otherwise)
        (folder / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    log = folder / "mutmut.log"
    before = verdicts(folder, module)
    started = time.monotonic()
    args = ["run"] + ([f"--max-children={max_children}"] if max_children else [])
    logged = log.stat().st_size if log.exists() else 0
    code = mutmut(folder, *args, log=log)
    if code != 0 and (folder / "mutants").exists() and clean_run_failed(log, logged):
        # results kept from before a source or test change can name mutants that no longer exist, and mutmut
        # then stops ("Failed to run clean test"): start this module afresh once (from its --fast verdicts, if any).
        # Only then: a run stopped by a signal or a crash keeps every verdict it reached, for the next run.
        shutil.rmtree(folder / "mutants")
        seed_from_fast(module, folder)
        code = mutmut(folder, *args, log=log)
    if code == 0 and recheck:
        again = rerun(before, verdicts(folder, module))
        for i in range(0, len(again), 200):
            code = mutmut(folder, *args, *again[i:i + 200], log=log) or code
    minutes = (time.monotonic() - started) / 60
    audit_file = folder / "audit.json"
    audit = json.loads(audit_file.read_text()) if audit_file.exists() else {}
    audit_file.write_text(json.dumps({"minutes": round(audit.get("minutes", 0.0) + minutes, 1),
                                      "date": date.today().isoformat()}))
    if code != 0:
        raise SystemExit(stopped(module, folder, log, code, base))
    # no mutant judged, none could leave anything behind: mutmut's own clean run before them passed
    failing = clean_check(module, folder, base) if verdicts(folder, module) != before else None
    if failing is not None:
        raise SystemExit(f"after the run, {module.name}'s tests fail with no mutant applied in {folder / 'mutants'}: "
                         "something a mutant or a test left there fails them, so every mutant run since counts "
                         "as killed. Remove it (or the folder, to start afresh) and run again.\n" + failing)
    return score_of(folder, module)


def pytest_command(module: Module, base: dict) -> list[str]:
    """The module's tests as mutmut runs them with no mutant: its configured pytest arguments, its test files."""
    return [sys.executable, "-m", "pytest", "-x", "-q", *base.get("pytest_add_cli_args", []), *module.tests]


def clean_check(module: Module, folder: Path, base: dict) -> str | None:
    """The module's tests once more, with no mutant applied, in the folder the mutants ran in. mutmut checks them
    only before its run; a mutant that wrote into the project (a download into models/) once made tests fail for
    every mutant after it, each counted as killed. None when they pass, else the end of pytest's output."""
    done = subprocess.run(pytest_command(module, base), cwd=folder / "mutants", env=clean_env(),
                          capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else "\n".join((done.stdout + done.stderr).splitlines()[-15:])


def stopped(module: Module, folder: Path, log: Path, code: int, base: dict) -> str:
    """What to tell when mutmut stops: its log without the spinner, and how to see the test that failed ("failed to
    collect stats" means a test fails with no mutant applied; mutmut's log has shown no pytest output then)."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip() and ln.lstrip()[:1] not in SPINNER]
    return (f"mutmut stopped on {module.name} (exit {code}); the end of {log}:\n" + "\n".join(lines[-30:])
            + f"\nto see the failing test: cd {folder / 'mutants'} && MUTANT_UNDER_TEST=stats "
            + shlex.join(pytest_command(module, base)))


def rerun(before: dict[str, tuple[str, float | None]], after: dict[str, tuple[str, float | None]]) -> list[str]:
    """What --recheck runs again: the unchecked, and survivors whose verdict (status and duration) is older than
    this run. A mutant the run itself just judged (its function changed, or it was new) is not run twice."""
    return [n for n, (st, took) in after.items()
            if st == "not checked" or (st in ("survived", "no tests") and before.get(n) == (st, took))]


def row(s: Score, goal: float) -> str:
    mark = "yes" if s.ratio >= goal and not s.not_checked else "no"
    checked = f"{s.mutants - s.not_checked}" + (" (run stopped)" if s.not_checked else "")
    return (f"| {s.module} | {s.mutants} | {checked} | {s.killed} | {s.survived} | {s.no_tests} | {s.timeout} "
            f"| {s.excluded} | {s.decorated} | {s.ratio:.0%} | {goal:.0%} | {mark} | {s.minutes:.0f} | {s.day} |")


HEADER = ("| module | mutants | checked | killed | survived | no tests | timeouts | excluded lines | decorated lines "
          "| caught | goal | met | minutes | date |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
DECORATED_CELL = 8  # its place in a row (0-based); rows written before it existed get it on the next --table


def recorded_rows() -> dict[str, str]:
    """The rows docs/TESTING.md holds now, by module: a module run on another machine keeps its row."""
    text = TABLE.read_text()
    body = text[text.index(TABLE_START) + len(TABLE_START): text.index(TABLE_END)]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 1 and cells[1] != "mutants" and not cells[0].startswith("---"):
            rows[cells[0].split(" (")[0]] = line.strip()
    return rows


def table(modules: dict[str, Module]) -> str:
    lines, kept = [HEADER], recorded_rows()
    for m in modules.values():
        folder = WORK / m.name
        fast = WORK / f"{m.name}-fast"
        if (folder / "mutants").exists():
            lines.append(row(score_of(folder, m), m.goal))
        elif (fast / "mutants").exists():  # a lower bound: the full run adds the server-level files
            fast_module = Module(m.name, m.path, m.goal, ())
            lines.append(row(score_of(fast, fast_module), m.goal).replace(
                f"| {m.name} |", f"| {m.name} (in-process files only) |", 1))
        elif m.name in kept and "not run yet" not in kept[m.name]:
            cells = kept[m.name].strip().strip("|").split("|")
            if len(cells) == HEADER.split("\n")[0].count("|") - 2:  # written before the column existed:
                cells.insert(DECORATED_CELL, f" {decorated_lines(m)} ")  # counted from the source as it is now
            # else the count stays as recorded: the lines that run left unmutated (a function wrapped since, not
            # decorated, has mutants that run never made: its row does not cover them until the module runs again)
            lines.append("|" + "|".join(cells) + "|")
        else:
            lines.append(f"| {m.name} | not run yet | | | | | | {excluded_lines(m)} | {decorated_lines(m)} | | "
                         f"{m.goal:.0%} | no | | |")
    return "\n".join(lines)


def write_table(modules: dict[str, Module]) -> None:
    text = TABLE.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    TABLE.write_text(text[:start] + "\n" + table(modules) + "\n" + text[end:])


def survivors(module: Module) -> None:
    folder = WORK / module.name
    for name, status in sorted(statuses(folder, module).items()):
        if status in ("survived", "no tests"):
            print(f"## {name} ({status})")
            mutmut(folder, "show", name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="module names from pyproject.toml, or 'all'")
    parser.add_argument("--quick", action="store_true", help="the modules CI runs")
    parser.add_argument("--fast", action="store_true",
                        help="against the module's in-process *_units.py files only, in .mutmut/<module>-fast/: "
                             "finds survivors in minutes; the full run can only catch more")
    parser.add_argument("--check", action="store_true", help="exit 1 when a module is below its goal")
    parser.add_argument("--recheck", action="store_true", help="run survivors and untested mutants again")
    parser.add_argument("--restat", action="store_true",
                        help="find again which tests reach which function (after adding tests or changing the harness)")
    parser.add_argument("--table", action="store_true",
                        help="update docs/TESTING.md's table (after running the named modules, if any)")
    parser.add_argument("--survivors", action="store_true", help="show the diff of each survivor")
    parser.add_argument("--list", action="store_true", help="the modules, their tests and goals")
    parser.add_argument("--max-children", type=int, help="mutants run at once (mutmut's default: every core)")
    args = parser.parse_args()
    base, modules, quick, faces = settings()
    outside = unaudited(modules, faces)
    if outside:  # tests/test_mutation_audit.py fails on it too
        print(f"not in the audit (name each in pyproject.toml's [tool.mutation-audit]): {', '.join(outside)}",
              file=sys.stderr)
    if args.list:
        for m in modules.values():
            print(f"{m.name:20} {m.goal:.0%}  {m.path}  <- {' '.join(m.tests)}")
        for f in faces:  # never run: nothing in them for mutmut to mutate
            print(f"{'(face)':20}       {f.path}: {f.why}")
        return 0
    quick_constant = base.pop("quick_timeout_constant")
    if args.quick:  # each quick module in its own folder (.mutmut/<name>-quick), against its fast tests only
        base = dict(base, timeout_constant=quick_constant)
        modules = {n + "-quick": Module(n + "-quick", modules[n].path, modules[n].goal, tuple(tests))
                   for n, tests in quick.items()}
    # `all`: every module entry (a face is not one: it has nothing to run)
    names = list(modules) if "all" in args.modules or args.quick else list(args.modules)
    if args.fast:
        if args.table:
            parser.error("--fast runs are not the table's figures: leave out --table")
        modules = {n + "-fast": Module(n + "-fast", modules[n].path, modules[n].goal,
                                       tuple(t for t in modules[n].tests if t.endswith("_units.py"))
                                       or modules[n].tests[:1])
                   for n in names if n in modules}
        names = [n + "-fast" if n + "-fast" in modules else n for n in names]
    unknown = [n for n in names if n not in modules]
    if unknown:
        print(f"unknown module(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    if args.survivors:
        for n in names:
            survivors(modules[n])
        return 0
    if not names:
        if args.table:  # from what has been run here (and the rows recorded for the rest)
            write_table(modules)
        print(table(modules))
        return 0
    failed = []
    for n in names:
        m = modules[n]
        s = run_module(m, base, recheck=args.recheck, max_children=args.max_children,
                         restat=args.restat)
        print(row(s, m.goal), flush=True)
        if s.ratio < m.goal or s.not_checked:
            failed.append(f"{n}: {s.caught} of {s.mutants} caught ({s.ratio:.1%}), goal {m.goal:.0%}"
                          f"; survivors: python tools/mutation_audit.py {n} --survivors")
    if args.table:
        write_table(modules)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
