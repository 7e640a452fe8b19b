"""Hand mutation audit: break one behaviour at a time and check that some test fails.

    python tools/mutate.py            # every mutation in the list, report survivors (exit 1 if any)
    python tools/mutate.py --list     # names only
    python tools/mutate.py ssrf-check-removed lru-evicts-newest   # just these

The list below is the spec: each entry names a behaviour we claim, the one-line change that breaks it,
and the tests that should catch it. A mutation "survives" when those tests still pass. The source file is
restored after each run, whatever happens.
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


MUTATIONS: tuple[Mutation, ...] = (
    # -- from the review's audit of main ----------------------------------------------------------------
    Mutation("ssrf-check-removed", "hugginggpt/urlpolicy.py",
             "                reason = blocked_reason(addr)\n",
             "                reason = None\n",
             ("tests/test_urlpolicy.py", "tests/test_bad_input.py::test_the_models_server_refuses_internal_urls")),
    Mutation("ranking-by-popularity", "hugginggpt/catalog/cards.py",
             "        return ranker.rank(query, cards)[:limit]",
             "        return sorted(((c, float(c.likes)) for c in cards), key=lambda cs: -cs[1])[:limit]",
             ("tests/test_ranking.py", "tests/test_selection.py")),
    Mutation("ranking-reversed", "hugginggpt/catalog/cards.py",
             "        return ranker.rank(query, cards)[:limit]",
             "        return ranker.rank(query, cards)[::-1][:limit]",
             ("tests/test_ranking.py", "tests/test_selection.py")),
    Mutation("invalid-llm-choice-takes-last", "hugginggpt/select.py",
             "        if chosen is None:\n            mid, b = kept[0]",
             "        if chosen is None:\n            mid, b = kept[-1]",
             ("tests/test_selection.py",)),
    Mutation("num-candidates-ignored", "hugginggpt/select.py",
             "                if len(kept) < self.num_candidates and m not in [k for k, _ in kept]:",
             "                if m not in [k for k, _ in kept]:",
             ("tests/test_selection.py",)),
    Mutation("status-cache-never-expires", "hugginggpt/select.py",
             "            if hit and hit[1] > now:",
             "            if hit:",
             ("tests/test_selection.py",)),
    Mutation("generated-priorities-reversed", "hugginggpt/execute.py",
             '                for k in keys:\n',
             '                for k in reversed(keys):\n',
             ("tests/test_generated_refs.py",)),
    Mutation("generated-fallback-removed", "hugginggpt/execute.py",
             '                if key in dep["task"]["args"] and "<GENERATED>" not in dep["task"]["args"][key]:',
             '                if False:',
             ("tests/test_generated_refs.py",)),
    Mutation("json-500-reraises", "hugginggpt/server.py",
             '        log.exception("unexpected error")\n        return error_response(',
             '        raise exc\n        return error_response(',
             ("tests/test_bad_input.py",)),
    Mutation("health-returns-key", "hugginggpt/config.py",
             '            "api_key": "set" if self.api_key else "unset",',
             '            "api_key": self.api_key,',
             ("tests/test_routes.py", "tests/test_keys_and_access.py")),
    Mutation("lru-evicts-newest", "hugginggpt/modelhost/pool.py",
             "            order = [mid for mid in self._loaded if mid != keep]",
             "            order = [mid for mid in reversed(self._loaded) if mid != keep]",
             ("tests/test_pool.py",)),
    Mutation("late-task-overwrites-outcome", "hugginggpt/scheduler.py",
             "        with self._lock:\n            if self._closed:\n                return\n            ready, skipped",
             "        with self._lock:\n            ready, skipped",
             ("tests/test_scheduler.py",)),
    Mutation("late-result-overwrites-record", "hugginggpt/execute.py",
             "            if not state.sealed and state.round == self.number:\n",
             "                if True:\n",
             ("tests/test_scheduler.py", "tests/test_pipeline.py")),
    Mutation("controlnet-availability-assumed", "hugginggpt/select.py",
             "            if not self.availability.check([model_id], [\"local\"]).get(\"local\"):",
             "            if False:",
             ("tests/test_pipeline.py::test_controlnet_rules",)),
    Mutation("cli-ctrl-c-does-not-cancel", "hugginggpt/cli.py",
             "        if state is not None:\n            state.cancel()",
             "        if state is not None:\n            pass",
             ("tests/test_cli_pty.py",)),
    Mutation("admission-slot-leaks-on-streams", "hugginggpt/server.py",
             "        resp.call_on_close(slots.release)",
             "        pass",
             ("tests/test_pipeline.py::test_past_max_concurrent_requests_a_client_gets_429_not_a_queue",)),
    Mutation("schema-sent-to-rejecting-backend", "hugginggpt/llm.py",
             "                    self.schema_format = index + 1  # remembered: this form is not asked again",
             "                    pass",
             ("tests/test_taskbench.py",)),
    Mutation("unreadable-plans-dropped", "hugginggpt/evaluation.py",
             "        nodes = predicted.get(row[\"id\"], [])  # missing = empty plan, counted",
             "        if not predicted.get(row[\"id\"]):\n            continue\n        nodes = predicted[row[\"id\"]]",
             ("tests/test_taskbench.py",)),
    Mutation("replan-budget-ignored", "hugginggpt/replan.py",
             "        return state.replan_attempts < self.max_replans",
             "        return True",
             ("tests/test_replan.py",)),
    Mutation("replan-cannot-use-finished-outputs", "hugginggpt/plan.py",
             "            if ref in finished and ref not in ids:\n                continue",
             "            if False:\n                continue",
             ("tests/test_replan.py",)),
    Mutation("plan-not-read-while-streaming", "hugginggpt/chat.py",
             '        streamed = StreamedStart(self, state) if mode in ("answer", "results") and self.config.stream_plan '
             'else None',
             "        streamed = None",
             ("tests/test_plan_streaming.py",)),
    # -- issue 16: selection in milliseconds ----------------------------------------------------------------
    Mutation("queries-embedded-one-by-one", "hugginggpt/catalog/semantic.py",
             "                for text, vector in zip(mine, self.embed(mine), strict=True):",
             "                for text, vector in zip(mine, [self.embed([m])[0] for m in mine], strict=True):",
             ("tests/test_embedding.py",)),
    Mutation("prepare-does-nothing", "hugginggpt/select.py",
             '        prepare = getattr(self.ranker, "prepare", None)',
             "        prepare = None",
             ("tests/test_embedding.py",)),
    Mutation("query-cache-unbounded", "hugginggpt/catalog/semantic.py",
             "            while len(self._data) > self.size:",
             "            while False:",
             ("tests/test_embedding.py",)),
    Mutation("query-cache-evicts-newest", "hugginggpt/catalog/semantic.py",
             "                self._data.popitem(last=False)",
             "                self._data.popitem(last=True)",
             ("tests/test_embedding.py",)),
    Mutation("query-not-cut", "hugginggpt/catalog/semantic.py",
             "    return query.text[:max_chars]",
             "    return query.text",
             ("tests/test_embedding.py",)),
    Mutation("tokens-not-truncated", "hugginggpt/catalog/embedding.py",
             "                tok.enable_truncation(max_length=max_tokens)",
             "                tok.no_truncation()",
             ("tests/test_embedding.py",)),
    Mutation("concurrent-queries-embedded-twice", "hugginggpt/catalog/semantic.py",
             "                event = self._inflight.get(text)\n",
             "                event = None\n",
             ("tests/test_embedding.py",)),
    Mutation("ranking-order-inverted", "hugginggpt/catalog/semantic.py",
             '        order = np.argsort(-scores, kind="stable")',
             '        order = np.argsort(scores, kind="stable")',
             ("tests/test_embedding.py",)),
    Mutation("popularity-prior-dropped", "hugginggpt/catalog/semantic.py",
             "                   np.array([POPULARITY_WEIGHT * popularity(c) for c in cards]))",
             "                   np.zeros(len(cards)))",
             ("tests/test_embedding.py",)),
    Mutation("card-stack-cached-by-size", "hugginggpt/catalog/semantic.py",
             '        key = tuple(c.id + "\\0" + c.task for c in cards)',
             "        key = len(cards)",
             ("tests/test_embedding.py",)),
    Mutation("padded-batch", "hugginggpt/catalog/embedding.py",
             "            groups.setdefault(len(enc.ids), []).append(i)",
             "            groups.setdefault(0, []).append(i); enc.pad(max(len(e.ids) for e in encodings))",
             ("tests/test_embedding.py",)),
    Mutation("resource-args-in-query", "hugginggpt/select.py",
             "                if k not in RESOURCE_ARGS and not is_reference(str(v)) and str(v).lower() not in lowered]",
             "                if str(v).lower() not in lowered]",
             ("tests/test_embedding.py",)),
    # -- this project's deployment checks ---------------------------------------------------------------
    Mutation("allowlist-prefix-compare", "hugginggpt/urlpolicy.py",
             "        return any(addr in net or (inner is not None and inner in net) for net in self.allow_networks)",
             "        return any(str(addr).startswith(str(net.network_address)) for net in self.allow_networks)",
             ("tests/test_urlpolicy.py",)),
    Mutation("redirects-not-rechecked", "hugginggpt/urlpolicy.py",
             "    for _ in range(MAX_REDIRECTS + 1):\n        target = policy.check(url)",
             "    first = policy.check(url)\n    for _ in range(MAX_REDIRECTS + 1):\n"
             "        target = first if url == first.url else UrlPolicy(resolver=policy.resolver, "
             "allow_networks=(__import__('ipaddress').ip_network('0.0.0.0/0'),)).check(url)",
             ("tests/test_urlpolicy.py",)),
    Mutation("ipv4-mapped-not-unwrapped", "hugginggpt/urlpolicy.py",
             "    if addr.ipv4_mapped is not None:\n        return addr.ipv4_mapped",
             "    if False:\n        return addr.ipv4_mapped",
             ("tests/test_urlpolicy.py",)),
    Mutation("connect-by-name", "hugginggpt/urlpolicy.py",
             "        return Target(url=url, scheme=scheme, host=host, port=port, address=addresses[0],",
             "        return Target(url=url, scheme=scheme, host=host, port=port, address=host,",
             ("tests/test_urlpolicy.py",)),
    Mutation("key-follows-request-endpoint", "hugginggpt/llm.py",
             "            changes.update(endpoint=endpoint, api_key=api_key, trusted=False)",
             "            changes.update(endpoint=endpoint, trusted=False)",
             ("tests/test_keys_and_access.py",)),
    Mutation("request-endpoint-errors-echoed", "hugginggpt/llm.py",
             "        if not self.settings.trusted:\n            return f\"{self.describe} answered HTTP {exc.status_code}\"",
             "        if False:\n            return f\"{self.describe} answered HTTP {exc.status_code}\"",
             ("tests/test_keys_and_access.py",)),
    Mutation("token-check-removed", "hugginggpt/server.py",
             "        if config.api_tokens:\n            header = request.headers.get(\"Authorization\")",
             "        if False:\n            header = request.headers.get(\"Authorization\")",
             ("tests/test_keys_and_access.py",)),
    Mutation("origin-check-removed", "hugginggpt/server.py",
             "        if origin and not origin_allowed(origin):",
             "        if False:",
             ("tests/test_keys_and_access.py",)),
    Mutation("text-plain-accepted", "hugginggpt/server.py",
             "        if not request.is_json:",
             "        if False:",
             ("tests/test_keys_and_access.py",)),
    Mutation("outputs-not-copied", "hugginggpt/backends/local.py",
             "        if (self.public_dir / folder / name).is_file():  # the two servers share one public/",
             "        if True:",
             ("tests/test_two_machines.py",)),
    Mutation("models-server-token-ignored", "hugginggpt/modelhost/app.py",
             "        if tokens and not bearer_ok(request.headers.get(\"Authorization\"), tokens):",
             "        if False:",
             ("tests/test_keys_and_access.py::test_the_models_server_needs_its_token",)),
    Mutation("llm-ignores-deadline", "hugginggpt/llm.py",
             "        kwargs.setdefault(\"deadline\", self.deadline)",
             "        kwargs.setdefault(\"deadline\", None)",
             ("tests/test_keys_and_access.py",)),
    Mutation("static-follows-symlinks", "hugginggpt/server.py",
             "        return send_public_file(public, filename)",
             "        return send_from_directory(public, filename)",
             ("tests/test_bad_input.py",)),
    Mutation("upload-not-decoded", "hugginggpt/uploads.py",
             "        if kind == \"image\":\n            decode_image(data, self.max_pixels, what=\"the uploaded image\")",
             "        if False:\n            decode_image(data, self.max_pixels, what=\"the uploaded image\")",
             ("tests/test_bad_input.py",)),
    Mutation("pixel-limit-removed", "hugginggpt/resources.py",
             "            if width * height > max_pixels:",
             "            if False:",
             ("tests/test_bad_input.py",)),
    Mutation("memory-budget-after-load", "hugginggpt/modelhost/pool.py",
             "                self._make_room(spec)\n",
             "",
             ("tests/test_pool.py",)),
    Mutation("cuda-without-fallback", "hugginggpt/modelhost/device.py",
             "        return \"cpu\", (f\"device {requested!r} is configured but this torch has no CUDA \"",
             "        return requested, (f\"device {requested!r} is configured but this torch has no CUDA \"",
             ("tests/test_pool.py",)),
    Mutation("annotator-weights-from-ignored", "hugginggpt/modelhost/registry.py",
             "        local = self.models_dir / (spec.weights_from or spec.id)",
             "        local = self.models_dir / spec.id",
             ("tests/test_models_server.py::test_normal_control_turns_a_depth_estimate_into_a_normal_map",)),
    Mutation("normal-background-kept", "hugginggpt/modelhost/handlers.py",
             "    gx[near < bg_threshold] = 0\n",
             "",
             ("tests/test_models_server.py::test_normals_from_depth_follow_the_slope_and_leave_the_background_flat",)),
    Mutation("jarvis-prompt-ignored", "bench/taskbench.py",
             "    prompts = PromptSet.from_jarvis(jarvis_prompt) if jarvis_prompt else PromptSet.from_config(config)",
             "    prompts = PromptSet.from_config(config)",
             ("tests/test_taskbench.py::test_jarvis_prompt_plans_with_their_prompt_and_demos",)),
    Mutation("cli-untimed-join", "hugginggpt/cli.py",
             "            worker.join(0.1)",
             "            worker.join()",
             ("tests/test_cli_pty.py::test_ctrl_c_lands_even_when_the_signal_hits_another_thread",)),
    Mutation("cli-keeps-ignored-sigint", "hugginggpt/cli.py",
             "        signal.signal(signal.SIGINT, signal.default_int_handler)",
             "        pass",
             ("tests/test_cli_pty.py::test_ctrl_c_cancels_the_running_request_and_history_keeps_files",)),
    Mutation("held-events-released-outside-the-lock", "hugginggpt/request.py",
             "            held, self._held = self._held, None\n            for name, event",
             "            held, self._held = self._held, None\n        for name, event",
             ("tests/test_plan_streaming.py::test_held_events_go_out_before_any_event_that_comes_while_they_are_released",)),
    # -- the catalog store, its health, sync and search (issue 17) ---------------------------------------
    Mutation("health-not-persisted", "hugginggpt/catalog/health.py",
             "            self.conn.execute(\n                \"INSERT OR REPLACE INTO health(",
             "            (lambda *a: None)(\n                \"INSERT OR REPLACE INTO health(",
             ("tests/test_catalog_store.py::test_a_failing_model_ranks_lower_and_that_survives_a_restart",)),
    Mutation("health-penalty-ignored", "hugginggpt/catalog/store.py",
             "                health=self.health.penalty(card.id),",
             "                health=0.0,",
             ("tests/test_catalog_store.py::test_a_failing_model_ranks_lower_and_that_survives_a_restart",)),
    Mutation("health-never-fades", "hugginggpt/catalog/health.py",
             " * 0.5 ** (age / self.half_life_s)",
             "",
             ("tests/test_catalog_store.py::test_the_health_penalty_fades_with_time",)),
    Mutation("bit-scan-not-rescored", "hugginggpt/catalog/store.py",
             "        sims = np.asarray(index.vectors[top], dtype=np.float32) @ q",
             "        sims = 1.0 - 2.0 * np.bitwise_count(np.bitwise_xor(index.bits[:, top].T, pack_bits(q[None, :])[0]))"
             ".sum(axis=1) / q.shape[0]",
             ("tests/test_catalog_store.py::test_the_bit_scan_then_exact_rescoring_finds_what_brute_force_finds",)),
    Mutation("index-not-rebuilt-for-a-changed-task", "hugginggpt/catalog/store.py",
             "            if tasks.get(task, {}).get(\"version\") == version:",
             "            if task in tasks:",
             ("tests/test_catalog_store.py::test_the_index_is_rebuilt_per_changed_task_and_swapped_whole",)),
    Mutation("new-embedder-keeps-old-vectors", "hugginggpt/catalog/store.py",
             "        if self.meta(\"embedder\") != name:",
             "        if self.meta(\"embedder\") is None:",
             ("tests/test_catalog_store.py::test_a_new_embedder_re_embeds_everything",)),
    Mutation("hub-overwrites-curated-rows", "hugginggpt/catalog/store.py",
             "            if old is not None and old[0] == \"curated\":",
             "            if False:",
             ("tests/test_catalog_sync.py::test_sync_pages_by_downloads_and_maps_the_fields",)),
    Mutation("sync-cursor-not-saved", "hugginggpt/catalog/sync.py",
             "                store.set_sync_state(task, next_url=page.next_url, fetched=fetched)",
             "                store.set_sync_state(task, fetched=fetched)",
             ("tests/test_catalog_sync.py::test_an_interrupted_sync_continues_where_it_stopped",)),
    Mutation("sync-always-full", "hugginggpt/catalog/sync.py",
             "        report.mode = \"full\" if full or stale or state[\"watermark\"] is None else \"changes\"",
             "        report.mode = \"full\"",
             ("tests/test_catalog_sync.py::test_a_second_sync_fetches_only_what_changed",)),
    Mutation("sync-ignores-per-task", "hugginggpt/catalog/sync.py",
             "            rows = rows[:max(per_task - fetched, 0)]",
             "            rows = rows",
             ("tests/test_catalog_sync.py::test_sync_pages_by_downloads_and_maps_the_fields",)),
    Mutation("search-limit-unchecked", "hugginggpt/server.py",
             "        if not 1 <= limit <= SEARCH_LIMIT:",
             "        if False:",
             ("tests/test_models_search.py",)),
    Mutation("close-input-without-cascade", "hugginggpt/scheduler.py",
             "for s in [tid, *skipped]]\n            if self._open == 0:",
             "for s in [tid]]\n            if self._open == 0:",
             ("tests/test_scheduler.py",)),
    # -- one room per stage (issue 22) -------------------------------------------------------------------
    Mutation("planner-keeps-streamed-tasks-on-error", "hugginggpt/planner.py",
             "            if plan is None:  # an error or a conversational answer",
             "            if False:  # an error or a conversational answer",
             ("tests/test_planner.py",)),
    Mutation("scheduler-starts-before-start", "hugginggpt/scheduler.py",
             "                start = not waiting and self._started",
             "                start = not waiting",
             ("tests/test_scheduler.py",)),
    Mutation("cancel-before-run-forgets-streamed-tasks", "hugginggpt/scheduler.py",
             "                if self._closed_as is not None:",
             "                if False:",
             ("tests/test_scheduler.py",)),
    Mutation("pool-imports-handlers-back", "hugginggpt/modelhost/pool.py",
             "    def preload(self, specs",
             "    def infer(self, spec, inputs):\n        from .handlers import handle\n\n"
             "        return handle(spec.task, spec, inputs)\n\n    def preload(self, specs",
             ("tests/test_architecture.py",)),
    # -- Hub models outside the catalog on the models server (issue 17, item 4) --------------------------
    Mutation("discover-auto-map-in-hub-info-allowed", "hugginggpt/modelhost/discover.py",
             '        if "custom_code" in (info.tags or ()) or _has_key(info.config or {}, "auto_map"):',
             "        if False:",
             ("tests/test_discover.py::test_refusals_name_the_reason_and_fetch_nothing",)),
    Mutation("discover-auto-map-in-config-file-allowed", "hugginggpt/modelhost/discover.py",
             '        if isinstance(data, dict) and "auto_map" in data:',
             "        if False:",
             ("tests/test_discover.py::test_auto_map_in_a_downloaded_config_stops_before_the_weights",)),
    Mutation("discover-author-deny-ignored", "hugginggpt/modelhost/discover.py",
             "        if author in {a.casefold() for a in self.deny}:",
             "        if False:",
             ("tests/test_discover.py",)),
    Mutation("discover-deny-loses-to-allow", "hugginggpt/modelhost/discover.py",
             "        if author in {a.casefold() for a in self.deny}:",
             "        if author in {a.casefold() for a in self.deny} and author not in {a.casefold() for a in self.allow}:",
             ("tests/test_discover.py",)),
    Mutation("discover-id-deeper-path-allowed", "hugginggpt/modelhost/discover.py",
             "    if len(parts) != 2:",
             "    if len(parts) < 2:",
             ("tests/test_discover.py",)),
    Mutation("discover-id-dot-dot-allowed", "hugginggpt/modelhost/discover.py",
             "    if \"..\" in name or \"--\" in name:",
             "    if \"--\" in name:",
             ("tests/test_discover.py",)),
    Mutation("discover-downloads-without-lock", "hugginggpt/modelhost/discover.py",
             "        with self._lock_for(model_id):",
             "        if True:",
             ("tests/test_discover.py::test_concurrent_first_requests_download_once",)),
    Mutation("discover-gated-allowed", "hugginggpt/modelhost/discover.py",
             "        if info.gated:",
             "        if False:",
             ("tests/test_discover.py",)),
    Mutation("discover-size-cap-ignored", "hugginggpt/modelhost/discover.py",
             "            if weight_bytes > cap * 1024 * 1024:",
             "            if False:",
             ("tests/test_discover.py::test_size_cap",)),
    Mutation("discover-bin-beside-safetensors", "hugginggpt/modelhost/discover.py",
             '        if name.endswith(".bin") and (any(k.endswith(".safetensors") for k in siblings)',
             '        if name.endswith(".bin") and (False',
             ("tests/test_discover.py",)),
    Mutation("discover-diffusers-custom-component-allowed", "hugginggpt/modelhost/discover.py",
             '        if not (library.isidentifier() and importlib.util.find_spec(f"diffusers.pipelines.{library}")):',
             "        if False:",
             ("tests/test_discover.py::test_diffusers_text_to_image_is_judged_by_its_components",)),
    Mutation("local-backend-ignores-loadable", "hugginggpt/backends/local.py",
             'bool(state.get("loaded") or state.get("loadable"))',
             'bool(state.get("loaded"))',
             ("tests/test_discover_server.py::test_a_model_nobody_listed_downloads_on_first_use_and_runs",)),
    Mutation("models-server-serves-unlisted-when-off", "hugginggpt/modelhost/app.py",
             "    discovering = discovery is not None and discovery.enabled",
             "    discovering = discovery is not None",
             ("tests/test_discover_server.py::test_without_local_discovery_an_unlisted_id_is_unknown",)),
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
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation (default %(default)s)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"unknown mutation(s): {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(m.name for m in chosen))
        return 0
    survivors = 0
    for m in chosen:
        verdict, seconds = run(m, args.timeout)
        survivors += not verdict.startswith("killed")
        print(f"{m.name:34s} {verdict} ({seconds:.0f}s)", flush=True)
    print(f"{len(chosen) - survivors} of {len(chosen)} mutations killed, {survivors} survived, stale or broken")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
