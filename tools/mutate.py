"""Hand-written mutations for what the mutmut audit (tools/mutation_audit.py) cannot state: break one behaviour at a
time and check that the named test fails.

    python tools/mutate.py            # every mutation in the list, report survivors (exit 1 if any)
    python tools/mutate.py --list     # names only
    python tools/mutate.py redirects-not-rechecked watchdog-never-fires   # just these
    python tools/mutate.py --quick     # the QUICK subset (what `make test` runs after pytest)

mutmut audits every module of hugginggpt/ against its covering tests and makes the one-line operator, constant
and argument changes itself; the tests hold the behaviours. What stays here is only (a) a change over several
lines that no mutmut operator makes, (b) a behaviour between modules, seen only by another module's test or a
server-level test, and (c) a change to a file the audit does not cover. Each entry names the test that kills
it (docs/TESTING.md, "The hand-written list"). A mutation "survives" when those tests still pass. The source
file is restored after each run, whatever happens.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


# cli.py's progress printer between the two lines `progress-lines-unlocked` changes (the write of a line, now in two
# pieces, and the lock around it): the same in the old text and the new.
_PRINTER_BODY = (
    '        width = max(20, shutil.get_terminal_size().columns - 1)  # a wrapped line would throw the count off\n'
    '        for line in live.values():\n'
    '            out.write(line[:width] + "\\n")\n'
    '        drawn[0] = len(live)\n'
    '        out.flush()\n'
    '\n'
    '    def say(text: str) -> None:\n'
)

MUTATIONS: tuple[Mutation, ...] = (
    # -- (a) Changes over several lines that none of mutmut's operators makes (it swaps operators, bumps numbers and
    #        strings, drops or blanks arguments, flips keywords, `x = ...` to `x = None`): a fallback that takes the
    #        wrong candidate, work moved out from under a lock, a guard and its answer changed together. ------------
    Mutation("invalid-llm-choice-takes-last", "hugginggpt/select.py",
             "        if chosen is None:\n            final.reason = ",
             "        if chosen is None:\n            chosen = question.kept[-1][0]\n"
             "        if False:\n            final.reason = ",
             ("tests/test_selection.py::test_an_invalid_llm_choice_falls_back_to_the_top_ranked",)),
    Mutation("redirects-not-rechecked", "hugginggpt/urlpolicy.py",
             "    for _ in range(MAX_REDIRECTS + 1):\n        target = policy.check(url)",
             "    first = policy.check(url)\n    for _ in range(MAX_REDIRECTS + 1):\n"
             "        target = first if url == first.url else UrlPolicy(resolver=policy.resolver, "
             "allow_networks=(__import__('ipaddress').ip_network('0.0.0.0/0'),)).check(url)",
             ("tests/test_urlpolicy_units.py::test_fetch_checks_each_redirect_hop",
              "tests/test_urlpolicy.py::test_each_redirect_hop_is_checked_again")),
    Mutation("held-events-released-outside-the-lock", "hugginggpt/request.py",
             "            held, self._held = self._held, None\n            for name, event",
             "            held, self._held = self._held, None\n        for name, event",
             ("tests/test_plan_streaming.py::test_held_events_go_out_before_any_event_that_comes_while_they_are_released",)),
    Mutation("progress-lines-unlocked", "hugginggpt/cli.py",
             '        if text is not None:\n'
             '            out.write(text + "\\n")\n' + _PRINTER_BODY +
             '        with lock:\n'
             "            redraw(one_line(text))  # a peer's words (an error, a model name) never move the cursor\n",
             '        if text is not None:\n'
             '            out.write(text)\n'
             '            out.write("\\n")\n' + _PRINTER_BODY +
             '        if True:\n'
             "            redraw(one_line(text))  # a peer's words (an error, a model name) never move the cursor\n",
             ("tests/test_cli_pty.py::test_progress_lines_from_many_threads_are_never_glued",)),
    Mutation("drain-after-done-unbounded", "hugginggpt/llm.py",
             "        with deadline_scope(time.monotonic() + DRAIN_SECONDS):\n            for n, _ in enumerate(events):\n"
             "                if n >= 8:\n                    return",
             "        with deadline_scope(None):\n            for n, _ in enumerate(events):\n                pass",
             ("tests/test_llm_connections.py::test_a_peer_writing_on_after_done_loses_its_connection_not_the_requests_time",)),
    Mutation("batch-failure-fails-everyone", "hugginggpt/modelhost/batching.py",
             "        if len(items) == 1:\n            return [exc]",
             "        if True:\n            return [exc] * len(items)",
             ("tests/test_batching_units.py::test_a_bad_item_fails_only_its_caller",
              "tests/test_models_batching.py::test_one_bad_input_among_them_fails_only_its_caller")),
    Mutation("evicted-model-kept-in-memory", "hugginggpt/modelhost/pool.py",
             "                if self._loaded.pop(mid, None) is None:\n                    return False",
             "                self.__dict__.setdefault(\"kept\", []).append(self._loaded.pop(mid, None))",
             ("tests/test_pool.py::test_what_a_load_takes_and_an_eviction_gives_back_is_measured",)),
    Mutation("index-compiled-by-two-at-once", "hugginggpt/catalog/store.py",
             "        with locked_folder(self.index_dir):\n            return self._compile_index()",
             "        return self._compile_index()",
             ("tests/test_catalog_store.py::test_one_process_at_a_time_compiles_the_index",)),
    # -- (b) Behaviour that lives between modules: the change is in one module, and only a test of another module
    #        or a server-level test sees it (a deadline or a cancel handed to another module's transport, a module
    #        constant another module reads, the route guard of a route another module mounts, the import graph,
    #        a lock or a parent-death signal across processes). -------------------------------------------------
    Mutation("json-as-is-escapes-non-ascii", "hugginggpt/textsafe.py",
             "JSON_AS_IS = json.JSONEncoder(ensure_ascii=False)",
             "JSON_AS_IS = json.JSONEncoder()",
             ("tests/test_replan_units.py::test_context_sums_up_the_plan_and_each_result_for_the_planner",
              "tests/test_execute_units.py::test_a_text_task_for_the_llm_is_answered_by_the_llm_with_the_task_and_request_in_its_prompt")),
    Mutation("admission-slot-leaks-on-streams", "hugginggpt/server.py",
             "        resp.call_on_close(lambda: slot.done(\"response\"))",
             "        pass",
             ("tests/test_pipeline.py::test_past_max_concurrent_requests_a_client_gets_429_not_a_queue",)),
    Mutation("pool-imports-handlers-back", "hugginggpt/modelhost/pool.py",
             "    def preload(self, specs",
             "    def infer(self, spec, inputs):\n        from .handlers import handle\n\n"
             "        return handle(spec.task, spec, inputs)\n\n    def preload(self, specs",
             ("tests/test_architecture.py::test_lazy_imports_count_too",)),
    Mutation("llm-read-deadline-not-clamped", "hugginggpt/urlpolicy.py",
             "        timeout = self._clamp(timeout, httpcore2.ReadTimeout)",
             "        pass",
             ("tests/test_deadlines_and_secrets.py::test_a_dribbling_llm_is_cut_at_the_request_deadline",)),
    Mutation("watchdog-never-fires", "hugginggpt/urlpolicy.py",
             "            watch.fire()\n",
             "            pass\n",
             ("tests/test_deadlines_and_secrets.py::test_a_dribbling_models_server_is_cut_at_the_task_deadline",)),
    Mutation("hosted-hub-client-not-bounded", "hugginggpt/backends/hubclient.py",
             "            client._transport = ProviderFiles(bound_by_deadlines(client._transport))\n",
             "            client._transport = ProviderFiles(client._transport)\n",
             ("tests/test_deadlines_and_secrets.py::test_a_dribbling_hosted_inference_endpoint_is_cut_at_the_deadline",)),
    Mutation("models-server-calls-unbounded", "hugginggpt/backends/local.py",
             "        self._http.pool_classes_by_scheme = WATCHED_POOL_CLASSES\n",
             "",
             ("tests/test_deadlines_and_secrets.py::test_a_dribbling_models_server_is_cut_at_the_task_deadline",)),
    Mutation("cancel-leaves-io-running", "hugginggpt/urlpolicy.py",
             "        with token.hooked(watch.cancel) if token is not None else nullcontext():",
             "        with nullcontext():",
             ("tests/test_hostile_round3.py::test_a_stream_client_that_leaves_stops_its_work",)),
    Mutation("mcp-route-unguarded", "hugginggpt/server.py",
             'API_ROUTES = (*MODES, "/upload", "/models/search", "/mcp", "/metrics", *OPENAI_ROUTES)',
             'API_ROUTES = (*MODES, "/upload", "/models/search", "/metrics", *OPENAI_ROUTES)',
             ("tests/test_mcp.py::test_http_needs_the_token_and_an_allowed_origin",)),
    Mutation("folder-lock-only-in-process", "hugginggpt/folderlock.py",
             "            fcntl.flock(fd, fcntl.LOCK_EX)",
             "            pass",
             ("tests/test_catalog_store.py::test_one_process_at_a_time_compiles_the_index",
              "tests/test_workers.py::test_the_upload_quota_is_checked_under_a_lock_every_worker_takes")),
    Mutation("worker-outlives-a-killed-supervisor", "hugginggpt/workers.py",
             "    _exit_with_parent()\n    signal.signal",
             "    signal.signal",
             ("tests/test_workers.py::test_stopping_the_supervisor_stops_its_workers_even_when_it_is_killed",)),
    # -- (c) Files the mutmut audit does not cover (it mutates the package's Python only): the entry scripts, tools/,
    #        bench/, the Makefile, the web page and the audit's own harness. ---------------------------------------
    Mutation("jarvis-prompt-ignored", "bench/taskbench.py",
             "    prompts = PromptSet.from_jarvis(jarvis_prompt) if jarvis_prompt else PromptSet.from_config(config)",
             "    prompts = PromptSet.from_config(config)",
             ("tests/test_taskbench.py::test_jarvis_prompt_plans_with_their_prompt_and_demos",)),
    Mutation("models-search-box-unescaped", "hugginggpt/web/index.html",
             "data.map(c => `<div class=\"card\" data-id=\"${esc(c.id)}\"><b>${esc(c.id)}</b>",
             "data.map(c => `<div class=\"card\" data-id=\"${esc(c.id)}\"><b>${c.id}</b>",
             ("tests/test_web.py::test_the_models_box_searches_the_catalog_and_shows_cards_safely",)),
    Mutation("models-server-listens-everywhere-without-token", "models_server.py",
             '        return "127.0.0.1"\n',
             "        return host\n",
             ("tests/test_models_server_cross_site.py::test_without_a_token_it_listens_on_loopback_and_says_how_to_open_it",)),
    Mutation("demo-port-not-checked", "tools/demo.py",
             "    if not args.cli:  # before 20 s of building models",
             "    if False:  # before 20 s of building models",
             ("tests/test_first_hour.py::test_a_taken_port_is_one_line_at_once_never_ready",)),
    Mutation("server-port-checked-after-build", "awesome_chat.py",
             "            problem = port_problem(host, port)\n",
             "            problem = None\n",
             ("tests/test_first_hour.py::test_the_server_checks_its_port_before_building_anything",)),
    Mutation("demo-plans-ignore-files", "tools/demo_planner.py",
             "    images = IMAGE_RE.findall(request)\n",
             "    images = []\n",
             ("tests/test_first_hour.py::test_the_demo_planner_follows_the_words_and_the_files",)),
    Mutation("demo-speech-ignores-caption", "tools/demo_planner.py",
             "        if source is not None:\n",
             "        if False:\n",
             ("tests/test_first_hour.py::test_the_demo_planner_follows_the_words_and_the_files",)),
    Mutation("demo-llm-access-log", "tools/demo.py",
             '    logging.getLogger("werkzeug").setLevel(logging.WARNING)',
             '    logging.getLogger("werkzeug").setLevel(logging.INFO)',
             ("tests/test_cli_pty.py::test_make_cli_chats_on_the_demo_stack_offline",)),
    Mutation("no-start-checks", "awesome_chat.py",
             '        threading.Thread(target=start_checks, args=(engine,), name="start-checks", daemon=True).start()\n',
             "",
             ("tests/test_first_hour.py::test_start_checks_and_health_say_what_is_down",
              "tests/test_first_hour.py::test_start_checks_and_health_when_all_is_up")),
    Mutation("make-run-installs-ray", "Makefile",
             "setup: $(VENV)/.installed\n",
             "setup: $(VENV)/.installed-ray\n",
             ("tests/test_first_hour.py::test_make_run_does_not_install_ray_but_make_test_does",)),
    Mutation("page-keeps-old-graph", "hugginggpt/web/index.html",
             "  tasks = {}; drawTasks();  // a new request starts from an empty graph",
             "  // a new request starts from an empty graph",
             ("tests/test_web.py::test_first_hour_page_examples_graph_uploads_clips_and_a_failure",)),
    Mutation("page-graph-scaled-down", "hugginggpt/web/index.html",
             "  const across = levels * (150 + GX) + 20 <= box;",
             "  const across = true;",
             ("tests/test_web.py::test_first_hour_page_examples_graph_uploads_clips_and_a_failure",)),
    Mutation("page-no-examples", "hugginggpt/web/index.html",
             "showExamples();\ndrawGraph();",
             "drawGraph();",
             ("tests/test_web.py::test_first_hour_page_examples_graph_uploads_clips_and_a_failure",)),
    Mutation("page-upload-as-text", "hugginggpt/web/index.html",
             "  att.append(media, note);",
             "  att.append(note);",
             ("tests/test_web.py::test_first_hour_page_examples_graph_uploads_clips_and_a_failure",)),
    Mutation("page-clip-no-length", "hugginggpt/web/index.html",
             '  a.parentElement.querySelector(".dur").textContent = ',
             '  a.parentElement.querySelector(".dur").title = ',
             ("tests/test_web.py::test_first_hour_page_examples_graph_uploads_clips_and_a_failure",)),
    Mutation("page-header-stretched", "hugginggpt/web/index.html",
             "grid-template-rows: auto auto 1fr; align-content:start;",
             "grid-template-rows: auto auto auto;",
             ("tests/test_web.py::test_first_hour_page_examples_graph_uploads_clips_and_a_failure",)),
    Mutation("workers-setting-ignored", "awesome_chat.py",
             '    if args.mode == "server" and config.http_workers > 1:',
             '    if False:',
             ("tests/test_workers.py::test_two_workers_answer_on_one_port_and_metrics_count_them_all",)),
    Mutation("gpu-check-black-images-pass", "tools/gpu_check.py",
             "    if pixels.max() == 0:",
             "    if False:",
             ("tests/test_gpu_check.py::test_the_validators_catch_what_half_precision_breaks",)),
    Mutation("gpu-check-nan-audio-passes", "tools/gpu_check.py",
             "        if not np.isfinite(samples).all():",
             "        if False:",
             ("tests/test_gpu_check.py::test_the_validators_catch_what_half_precision_breaks",)),
    Mutation("gpu-check-eviction-leak-unseen", "tools/gpu_check.py",
             "    if any(abs(x) > 0.25 * smallest for x in leaks):",
             "    if False:",
             ("tests/test_gpu_check.py::test_the_validators_catch_what_half_precision_breaks",)),
    Mutation("audit-seed-copies-the-whole-fast-folder", "tools/mutation_audit.py",
             "    for found in (fast / \"mutants\").rglob(\"*.py.meta\"):\n",
             "    shutil.copytree(fast / \"mutants\", folder / \"mutants\")\n"
             "    for found in (fast / \"mutants\").rglob(\"*.py.meta\"):\n",
             ("tests/test_mutation_audit.py::test_a_full_run_starts_from_the_fast_runs_verdicts_without_its_stats",)),
    Mutation("audit-seed-over-own-verdicts", "tools/mutation_audit.py",
             "    if (folder / \"mutants\").exists() or not (fast / \"mutants\").exists():",
             "    if not (fast / \"mutants\").exists():",
             ("tests/test_mutation_audit.py::test_a_full_run_with_verdicts_of_its_own_keeps_them",)),
    Mutation("audit-added-files-reset-the-verdicts", "tools/mutation_audit.py",
             "    if before != list(tests) and set(before) <= set(tests):",
             "    if before != list(tests) and set(before) >= set(tests):",
             ("tests/test_mutation_audit.py::test_stats_are_dropped_only_when_files_are_added",)),
    Mutation("fixture-reach-counted-for-the-first-test-only", "tests/mutmut_hits.py",
             "    state()._stats.update(hits.collect() | shared.used_by(item))",
             "    state()._stats.update(hits.collect())",
             ("tests/test_mutation_audit.py::test_what_a_module_fixture_reached_counts_for_every_test_that_uses_it",)),
    Mutation("recheck-reruns-what-the-run-just-judged", "tools/mutation_audit.py",
             "            if st == \"not checked\" or (st in (\"survived\", \"no tests\") and before.get(n) == (st, took))]",
             "            if st == \"not checked\" or st in (\"survived\", \"no tests\")]",
             ("tests/test_mutation_audit.py::test_a_recheck_runs_again_only_verdicts_older_than_the_run",)),
    Mutation("seed-keeps-verdicts-on-changed-text", "tools/mutation_audit.py",
             "        if (fast / rel).is_file() and (ROOT / rel).is_file():",
             "        if False:",
             ("tests/test_mutation_audit.py::test_a_seeded_run_judges_again_the_functions_whose_text_changed_since_the_fast_run",)),
    Mutation("no-clean-check-after-the-run", "tools/mutation_audit.py",
             "    failing = clean_check(module, folder, base) if verdicts(folder, module) != before else None\n",
             "    failing = None\n",
             ("tests/test_mutation_audit.py::test_a_run_whose_tests_then_fail_with_no_mutant_is_not_scored",)),
    Mutation("clean-check-after-every-run", "tools/mutation_audit.py",
             "    failing = clean_check(module, folder, base) if verdicts(folder, module) != before else None\n",
             "    failing = clean_check(module, folder, base)\n",
             ("tests/test_mutation_audit.py::test_the_clean_check_runs_only_after_a_run_that_judged_a_mutant",)),
    Mutation("stopped-run-shows-the-spinner", "tools/mutation_audit.py",
             "if ln.strip() and ln.lstrip()[:1] not in SPINNER]",
             "if ln.strip()]",
             ("tests/test_mutation_audit.py::test_a_stopped_run_says_what_mutmut_said_and_how_to_see_the_failing_test",)),
    Mutation("stopped-hint-without-the-configured-arguments", "tools/mutation_audit.py",
             '    return [sys.executable, "-m", "pytest", "-x", "-q", *base.get("pytest_add_cli_args", []), *module.tests]',
             '    return [sys.executable, "-m", "pytest", "-x", "-q", *module.tests]',
             ("tests/test_mutation_audit.py::test_a_stopped_run_says_what_mutmut_said_and_how_to_see_the_failing_test",)),
    Mutation("function-text-ends-at-its-last-statement", "tools/mutation_audit.py",
             '            texts[name] = "\\n".join(lines[fn.lineno - 1:fn.end_lineno])',
             '            texts[name] = ast.get_source_segment(source, fn) or ""',
             ("tests/test_mutation_audit.py::test_a_changed_method_is_unjudged_under_mutmuts_own_name_for_it",)),
)

# A few fast entries, one of each kind, on focused tests: `make test` runs them after pytest.
QUICK: tuple[str, ...] = (
    "batch-failure-fails-everyone",  # (a) modelhost/batching.py, a unit test
    "redirects-not-rechecked",  # (a) urlpolicy.py
    "json-as-is-escapes-non-ascii",  # (b) textsafe.py, seen by replan's and execute's tests
    "pool-imports-handlers-back",  # (b) the import graph
    "watchdog-never-fires",  # (b) urlpolicy.py's watchdog under the task deadline of a models server call
    "gpu-check-black-images-pass",  # (c) tools/gpu_check.py
    "audit-seed-over-own-verdicts",  # (c) tools/mutation_audit.py
)


def run(m: Mutation, timeout: float) -> tuple[str, float]:
    path = ROOT / m.path
    original = path.read_text()
    count = original.count(m.old)
    if count != 1:
        return f"STALE (the text to mutate occurs {count} times in {m.path})", 0.0
    started = time.monotonic()
    try:
        path.write_text(original.replace(m.old, m.new))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        # 1: a test failed (killed); 0: all passed (survived); anything else: the run itself broke
        verdict = {0: "SURVIVED", 1: "killed"}.get(proc.returncode, f"ERROR (pytest exit {proc.returncode})")
    except subprocess.TimeoutExpired:
        verdict = "killed (timeout)"
    finally:
        path.write_text(original)
    return verdict, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="run only these mutations")
    parser.add_argument("--list", action="store_true", help="print the mutation names and exit")
    parser.add_argument("--quick", action="store_true", help="only the QUICK subset (a few minutes; CI runs it)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation (default %(default)s)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS
              if (not args.names or m.name in args.names) and (not args.quick or m.name in QUICK)]
    unknown = (set(args.names) | (set(QUICK) if args.quick else set())) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"unknown mutation(s): {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(m.name for m in chosen))
        return 0
    survivors = 0
    started = time.monotonic()
    for m in chosen:
        verdict, seconds = run(m, args.timeout)
        survivors += not verdict.startswith("killed")
        print(f"{m.name:34s} {verdict} ({seconds:.0f}s)", flush=True)
    print(f"{len(chosen) - survivors} of {len(chosen)} mutations killed, {survivors} survived, stale or broken "
          f"({time.monotonic() - started:.0f}s)")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
