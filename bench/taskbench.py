"""Plan quality on TaskBench's HuggingFace-tools sample: node-F1, edge-F1, t-F1, v-F1, parse and valid-plan
rates, plan latency.

Runs our planner on each request of a sample folder in the shared layout (`--data`, default
`../shared/taskbench/`, kept out of this repository) through the very code a request runs
(`Planner.propose` and its repair round: the config's prompts, picked demos, grammar, token cap and LLM),
converts every plan to TaskBench's format and scores it with TaskBench's resource-mode definitions
(`hugginggpt/evaluation.py`), on all samples and on the "clean" ones. A plan that cannot be read counts as an
empty plan. Prints a table beside the published GPT-4 / gpt-3.5 figures and writes `taskbench.json` and
`taskbench.png` into --out. With no flags it plans as the config does (what a user gets).

    python bench/taskbench.py --config configs/config.llama.yaml [--structured auto|on|off] [--limit 20]
    python bench/taskbench.py --config ... --jarvis-prompt JARVIS/hugginggpt/server/configs/config.default.yaml

--jarvis-prompt plans with JARVIS's own planning prompt and demos (read from a JARVIS checkout, never
copied into this repository) and the same LLM and plan reader, to compare the prompts alone. The ablation
flags (--structured, --demos, --no-repair, --max-tokens) each change one setting of the config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hugginggpt.config import Config, load_config  # noqa: E402
from hugginggpt.errors import ConfigError, HuggingGPTError  # noqa: E402
from hugginggpt.evaluation import Scores, ToolSet, score, to_taskbench  # noqa: E402
from hugginggpt.llm import LLMClient  # noqa: E402
from hugginggpt.planner import Planner, PlanTooLarge  # noqa: E402
from hugginggpt.prompts import PromptSet  # noqa: E402
from hugginggpt.replan import Replanner  # noqa: E402
from hugginggpt.request import ChatRequest, RequestState  # noqa: E402

DATA = ROOT.parent / "shared" / "taskbench"
PUBLISHED = {"gpt-4 (published, full domain)": (81.54, 54.70, 77.31, 60.86),
             "gpt-3.5-turbo (published, full domain)": (69.49, 33.36, 55.88, 36.32)}


def plan_one(planner: Planner, llm: LLMClient, config: Config, instruction: str) -> dict:
    """One request through the planner as the server runs it (no conversational fallback: a plan is scored)."""
    state = RequestState(ChatRequest(messages=[{"role": "user", "content": instruction}]), llm, None,
                         config.request_timeout)
    started = time.perf_counter()
    try:
        plan = planner.propose(state)
        parsed = plan is not None
        if plan is not None:
            plan = planner.repair(state, plan)
    except PlanTooLarge as exc:
        return {"reply": state.plan_reply, "error": str(exc), "seconds": time.perf_counter() - started,
                "plan": None, "parsed": True, "replanned": bool(state.replans)}
    except HuggingGPTError as exc:
        return {"reply": None, "error": str(exc), "seconds": time.perf_counter() - started, "plan": None,
                "parsed": False, "replanned": False}
    return {"reply": state.plan_reply, "error": None if parsed else "no task list in the reply",
            "seconds": time.perf_counter() - started, "plan": plan, "parsed": parsed,
            "replanned": bool(state.replans)}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run(config_path: str, data: Path, structured: str | None, limit: int | None, workers: int, stride: int = 1,
        jarvis_prompt: Path | None = None, demos: int | None = None, repair: bool = True,
        max_tokens: int | None = None) -> dict:
    config = load_config(config_path)
    changes = {}
    if structured is not None:
        changes["structured_output"] = structured
    if demos is not None:
        changes["planner_demos"] = demos
    if not repair:
        changes["max_replans"] = 0
    if max_tokens is not None:
        changes["planner_max_tokens"] = max_tokens
    config = dataclasses.replace(config, **changes)
    tools = ToolSet.load(data / "tool_mapping.json")
    samples = read_jsonl(data / "huggingface_sample.jsonl")
    gold = read_jsonl(data / "huggingface_sample_gold.jsonl")
    samples, gold = samples[::stride], gold[::stride]
    if limit:
        samples, gold = samples[:limit], gold[:limit]
    llm = LLMClient(config.llm, proxy=config.proxy)
    prompts = PromptSet.from_jarvis(jarvis_prompt) if jarvis_prompt else PromptSet.from_config(config)
    planner = Planner(config, prompts, Replanner(config.max_replans))
    if prompts.pool is not None:
        prompts.pool.vectors()  # embedded once before the clock starts, as a server does at its first request
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(lambda s: plan_one(planner, llm, config, s["instruction"]), samples))
    predicted, valid, parsed, latency = {}, {}, {}, []
    for sample, out in zip(samples, outcomes, strict=True):
        plan = out["plan"]
        predicted[sample["id"]] = to_taskbench(plan, tools)
        valid[sample["id"]] = plan is not None and bool(plan.tasks) and all(t.error is None for t in plan.tasks)
        parsed[sample["id"]] = out["parsed"]
        latency.append(out["seconds"])
    gold_nodes = {s["id"]: s["task_nodes"] for s in samples}
    clean = [g for g in gold if g["clean"]]
    return {"all": summary(score(gold, predicted, valid, tools, parsed, gold_nodes)),
            "clean": summary(score(clean, predicted, valid, tools, parsed, gold_nodes)),
            "latency": {"median_s": statistics.median(latency),
                        "p90_s": sorted(latency)[max(0, math.ceil(0.9 * len(latency)) - 1)]},
            "replanned": sum(o["replanned"] for o in outcomes),
            "llm": {k: v for k, v in config.llm.redacted().items() if k != "api_key"},
            "structured": config.structured_output, "demos_picked": config.planner_demos,
            "repair": config.max_replans > 0, "max_tokens": planner.chat_kwargs(config.llm.api_type)["max_tokens"],
            "prompt": f"JARVIS ({jarvis_prompt})" if jarvis_prompt else "ours",
            "samples": len(samples), "predictions": {s["id"]: predicted[s["id"]] for s in samples},
            "replies": {s["id"]: {"reply": (o["reply"] or "")[:600], "error": o["error"], "seconds": o["seconds"]}
                        for s, o in zip(samples, outcomes, strict=True)}}


def summary(scores: Scores) -> dict:
    return {"node_f1": scores.nodes.f1, "edge_f1": scores.edges.f1, "t_f1": scores.types.f1,
            "v_f1": scores.values.f1, "valid_rate": scores.valid_rate, "parse_rate": scores.parse_rate,
            "samples": scores.samples, "nodes": vars(scores.nodes), "edges": vars(scores.edges)}


def table(result: dict) -> str:
    rows = ["| run | samples | node-F1 | edge-F1 | t-F1 | v-F1 | valid plans |", "|---|---|---|---|---|---|---|"]
    who = "JARVIS prompt" if result["prompt"] != "ours" else "ours"
    for subset in ("all", "clean"):
        r = result[subset]
        rows.append(f"| {who}, {subset} | {r['samples']} | {100 * r['node_f1']:.2f} | {100 * r['edge_f1']:.2f} | "
                    f"{100 * r['t_f1']:.2f} | {100 * r['v_f1']:.2f} | {100 * r['valid_rate']:.1f}% |")
    for name, (n, e, t, v) in PUBLISHED.items():
        rows.append(f"| {name} | 7546 | {n:.2f} | {e:.2f} | {t:.2f} | {v:.2f} | - |")
    lat = result["latency"]
    rows.append(f"\nreplies with a task list (parse rate): {100 * result['all']['parse_rate']:.1f}% "
                f"({result['replanned']} plans replanned once)")
    rows.append(f"plan latency: p50 {lat['median_s']:.2f} s, p90 {lat['p90_s']:.2f} s "
                f"(LLM: {result['llm']['model']}; structured output: {result['structured']}; demos picked: "
                f"{result['demos_picked']}; repair: {'on' if result['repair'] else 'off'}; token cap: "
                f"{result['max_tokens']})")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    """A grouped bar chart drawn with Pillow (no plotting dependency): node-F1 and edge-F1 per run."""
    from PIL import Image, ImageDraw

    who = "JARVIS prompt" if result["prompt"] != "ours" else "ours"
    runs = [(f"{who} ({s})", 100 * result[s]["node_f1"], 100 * result[s]["edge_f1"]) for s in ("all", "clean")]
    runs += [(name.split(" (")[0], n, e) for name, (n, e, _t, _v) in PUBLISHED.items()]
    width, height, left, bottom = 640, 360, 50, 300
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw.text((left, 10), "TaskBench HuggingFace tools: node-F1 (dark) and edge-F1 (light), %", fill="black")
    for pct in (0, 25, 50, 75, 100):
        y = bottom - pct * 2.5
        draw.line((left, y, width - 10, y), fill=(225, 225, 225))
        draw.text((10, y - 6), str(pct), fill="black")
    slot = (width - left - 20) / len(runs)
    for i, (name, n, e) in enumerate(runs):
        x = left + 10 + i * slot
        for j, (value, color) in enumerate(((n, (40, 90, 160)), (e, (140, 180, 230)))):
            x0 = x + j * slot * 0.4
            draw.rectangle((x0, bottom - value * 2.5, x0 + slot * 0.38, bottom), fill=color)
            draw.text((x0, bottom - value * 2.5 - 12), f"{value:.0f}", fill="black")
        draw.text((x, bottom + 8), name[:18], fill="black")
    img.save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.default.yaml", help="the LLM and prompts to plan with")
    parser.add_argument("--data", type=Path, default=DATA, help="the TaskBench sample folder (default %(default)s)")
    parser.add_argument("--structured", choices=["auto", "on", "off"],
                        help="override structured_output (JSON-schema-constrained plans); default: the config's")
    parser.add_argument("--demos", type=int, help="override planner_demos (demos picked per request)")
    parser.add_argument("--no-repair", action="store_true", help="no repair round (max_replans: 0)")
    parser.add_argument("--max-tokens", type=int, help="override planner_max_tokens")
    parser.add_argument("--jarvis-prompt", type=Path, metavar="CONFIG",
                        help="plan with JARVIS's prompt and demos, read from this JARVIS config file")
    parser.add_argument("--limit", type=int, help="only the first N samples")
    parser.add_argument("--stride", type=int, default=1, help="every Nth sample (a spread-out subset for slow LLMs)")
    parser.add_argument("--workers", type=int, default=1,
                        help="requests in flight (default %(default)s: a llama.cpp server runs one at a time)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for taskbench.json/.png")
    args = parser.parse_args(argv)
    if not (args.data / "huggingface_sample.jsonl").is_file():
        print(f"error: no TaskBench sample in {args.data} (it lives outside the repository, in ../shared/taskbench)",
              file=sys.stderr)
        return 2
    try:
        result = run(args.config, args.data, args.structured, args.limit, args.workers, args.stride,
                     args.jarvis_prompt, args.demos, not args.no_repair, args.max_tokens)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "taskbench.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "taskbench.png")
    print(table(result))
    print(f"wrote {args.out / 'taskbench.json'} and {args.out / 'taskbench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
