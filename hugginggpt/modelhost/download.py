"""Fetch the models server's weights into local_models_dir (run it on your GPU box; it needs the Hub).

    python -m hugginggpt.modelhost.download --config configs/config.default.yaml           # level and folder from the config
    python -m hugginggpt.modelhost.download --deployment standard --models-dir models --dry-run
    python -m hugginggpt.modelhost.download --only dslim/bert-base-NER
    python -m hugginggpt.modelhost.download --config CONFIG --hub some-org/some-ner   # a Hub model outside the catalog

Exits 0 when everything wanted is on disk, 1 when a download failed, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from .registry import DEFAULT_CATALOG, LEVELS, ModelSpec, Registry


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _human(n: float | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


# Approximate download sizes in MB (one copy of the weights, float32 unless the repository ships half
# precision), for a dry run without the Hub. The Hub's own figure wins when it can be asked; a repository
# that holds several formats (PyTorch, safetensors, TF) downloads more than this.
KNOWN_MB: dict[str, float] = {
    "sentence-transformers/all-MiniLM-L6-v2": 90, "sentence-transformers/all-mpnet-base-v2": 438,
    "distilbert/distilbert-base-uncased-finetuned-sst-2-english": 268,
    "cardiffnlp/twitter-roberta-base-sentiment-latest": 499, "dslim/bert-base-NER": 433,
    "deepset/roberta-base-squad2": 496, "distilbert/distilbert-base-cased-distilled-squad": 261,
    "facebook/bart-large-cnn": 1630, "sshleifer/distilbart-cnn-12-6": 1220, "Helsinki-NLP/opus-mt-en-de": 298,
    "Helsinki-NLP/opus-mt-en-fr": 301, "google/flan-t5-base": 990, "openai-community/gpt2": 548,
    "microsoft/DialoGPT-medium": 1440, "google/vit-base-patch16-224": 346, "microsoft/resnet-50": 102,
    "facebook/detr-resnet-50": 167, "hustvl/yolos-tiny": 26, "nvidia/segformer-b0-finetuned-ade-512-512": 15,
    "facebook/detr-resnet-50-panoptic": 172, "Intel/dpt-large": 1370, "Intel/dpt-hybrid-midas": 490,
    "nlpconnect/vit-gpt2-image-captioning": 982, "Salesforce/blip-image-captioning-large": 1880,
    "dandelin/vilt-b32-finetuned-vqa": 470, "impira/layoutlm-document-qa": 511, "openai/whisper-base": 290,
    "facebook/wav2vec2-base-960h": 378, "MIT/ast-finetuned-audioset-10-10-0.4593": 346,
    "microsoft/speecht5_tts": 585, "microsoft/speecht5_vc": 580, "microsoft/speecht5_hifigan": 50,
    "facebook/mms-tts-eng": 145, "stable-diffusion-v1-5/stable-diffusion-v1-5": 4270,
    "stabilityai/stable-diffusion-xl-base-1.0": 6940, "timbrooks/instruct-pix2pix": 4270,
    "damo-vilab/text-to-video-ms-1.7b": 5700,
    **{f"lllyasviel/sd-controlnet-{c}": 1445 for c in ("canny", "depth", "hed", "mlsd", "normal", "openpose", "seg")},
}
KNOWN_FILE_MB: dict[str, float] = {  # single checkpoints of lllyasviel/Annotators
    "ControlNetHED.pth": 29, "mlsd_large_512_fp32.pth": 6, "body_pose_model.pth": 209,
    "hand_pose_model.pth": 147, "facenet.pth": 154,
}


def known_size(model_id: str, files: list[str], hub: HubSizes | None = None) -> tuple[int | None, bool]:
    """(bytes, exact): the Hub's figure when it answers (exact), else the table's estimate, else (None, False)."""
    if files:
        sizes = [KNOWN_FILE_MB.get(f) for f in files]
        return (int(sum(sizes) * 1024 * 1024), False) if all(s is not None for s in sizes) else (None, False)
    if hub is not None:
        exact = hub(model_id)
        if exact:
            return exact, True
    mb = KNOWN_MB.get(model_id)
    return (int(mb * 1024 * 1024), False) if mb is not None else (None, False)


class HubSizes:
    """Repository sizes from the Hub's file metadata; after one failure (offline) it stops asking."""

    def __init__(self):
        self.reachable = True

    def __call__(self, model_id: str) -> int | None:
        if not self.reachable:
            return None
        try:
            from huggingface_hub import HfApi

            info = HfApi().model_info(model_id, files_metadata=True, timeout=5)
            return sum(s.size or 0 for s in info.siblings or []) or None
        except Exception:  # noqa: BLE001 - offline or unknown: the size is simply not known
            self.reachable = False  # pragma: no mutate: only its truth is read (None is as false)
            return None


def fetch_discovered(ids: list[str], models_dir: Path, registry: Registry, config, dry_run: bool) -> int:
    """Hub models outside the catalog, fetched ahead of their first request (discover.py does the checks)."""
    import os

    from .discover import Discovery, DiscoveryPolicy, DiscoveryRefused

    cap = config.max_model_size_mb if config is not None else None
    policy = DiscoveryPolicy(mode="local", allow=config.discovered_authors_allow if config else (),
                             deny=config.discovered_authors_deny if config else (),
                             max_size_mb=float(cap) if isinstance(cap, (int, float)) and cap > 0 else None)
    discovery = Discovery(policy, models_dir, endpoint=os.environ.get("HF_ENDPOINT") or None,
                          token=config.huggingface_token if config else None, curated_ids=registry.catalog_ids)
    refused: list[str] = []
    for mid in ids:
        try:
            if dry_run:
                state = discovery.status(mid)
                if not state["loadable"]:
                    raise DiscoveryRefused(state["problem"])
                if state["loaded"]:  # on disk: its size there (the Hub is not asked about a model already here)
                    print(f"{mid}: already in {models_dir / mid} ({_human(_size(models_dir / mid))})")
                else:
                    print(f"{mid}: would fetch ({state['task']}, {state.get('size_mb', '?')} MB of weights)")
                continue
            spec = discovery.ensure(mid)
            print(f"{mid}: in {models_dir / mid} ({spec.task}, {_human(_size(models_dir / mid))})", flush=True)
        except DiscoveryRefused as exc:
            refused.append(mid)
            print(f"{mid}: refused: {exc}", file=sys.stderr)
    if refused:
        print(f"{len(refused)} of {len(ids)} refused: {', '.join(refused)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="take local_deployment, local_models_dir and the catalog from this config")
    parser.add_argument("--deployment", choices=list(LEVELS), help="minimal | standard | full (default: standard)")
    parser.add_argument("--models-dir", help="where the weights go (default: models/)")
    parser.add_argument("--only", nargs="*", help="download just these ids")
    parser.add_argument("--dry-run", action="store_true", help="list what would be fetched, with sizes, and stop")
    parser.add_argument("--hub", nargs="+", metavar="ID",
                        help="fetch these Hub models outside the catalog now, with the checks the models server makes "
                             "on first use (generic loader, no remote code, not gated; the config's author lists "
                             "and size cap)")
    args = parser.parse_args(argv)
    deployment, models_dir, catalog = "standard", Path("models"), DEFAULT_CATALOG
    config = None
    if args.config:
        from ..config import load_config
        from ..errors import ConfigError

        try:
            config = load_config(
                args.config,
                need_llm=False,  # pragma: no mutate: None is false too (read as `if need_llm`)
            )
        except ConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return 2
        deployment, models_dir, catalog = config.local_deployment, config.local_models_dir, config.catalog_path
    deployment = args.deployment or deployment
    models_dir = Path(args.models_dir) if args.models_dir else models_dir
    registry = Registry(deployment, models_dir, catalog_path=catalog)
    if args.hub:
        return fetch_discovered(args.hub, models_dir, registry, config, args.dry_run)
    wanted: list[ModelSpec] = [s for s in registry.specs.values() if s.needs_weights]
    if args.only:
        known = {s.id for s in wanted}
        unknown = [m for m in args.only if m not in known]
        for mid in unknown:
            close = difflib.get_close_matches(mid, sorted(known))  # the best first, at most 3
            hint = f"; did you mean {' or '.join(close)}?" if close else f"; see --dry-run for the {deployment} list"
            print(f"error: {mid} is not a model of the {deployment} level{hint}", file=sys.stderr)
        if unknown:
            return 2
        wanted = [s for s in wanted if s.id in args.only]
    # repository -> the files needed from it, or None for the whole repository
    needed: dict[str, set[str] | None] = {}
    for s in wanted:
        repo = s.weights_from or s.id
        whole = not s.files or (repo in needed and needed[repo] is None)
        needed[repo] = None if whole else (needed.get(repo) or set()) | set(s.files)
        if s.base_model:
            needed[s.base_model] = None
    ids = sorted(needed)
    failed: list[str] = []
    hub_size = HubSizes()
    plan: list[int | None] = []  # dry run: the size of each download, None when unknown
    for mid in ids:
        target = models_dir / mid
        spec = registry.get(mid)
        files = sorted(needed[mid] or ())
        packaged = spec is not None and registry.weights_path(spec) not in (None, target)
        if packaged:
            print(f"{mid}: ships inside a Python package ({registry.weights_path(spec)}), nothing to fetch")
            continue
        there = all((target / f).is_file() for f in files) if files else target.is_dir() and any(target.iterdir())
        if there:
            print(f"{mid}: already in {target} ({_human(_size(target))})")
            continue
        what = f"{', '.join(files)} of {mid}" if files else mid
        if args.dry_run:
            size, exact = known_size(mid, files, hub_size)
            plan.append(size)
            shown = _human(size) if size is None or exact else "about " + _human(size)
            print(f"{mid}: would fetch {', '.join(files) + ' ' if files else ''}into {target} ({shown})", flush=True)
            continue
        print(f"{mid}: fetching {what} into {target} ...", flush=True)
        from huggingface_hub import snapshot_download

        try:
            snapshot_download(repo_id=mid, local_dir=target, allow_patterns=files or None)
            print(f"{mid}: done ({_human(_size(target))})", flush=True)
        except Exception as exc:  # noqa: BLE001 - report every failure, then exit non-zero
            failed.append(mid)
            print(f"{mid}: failed: {exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    if args.dry_run:
        known = [n for n in plan if n is not None]
        unknown = len(plan) - len(known)
        print(f"total: {len(plan)} download(s), about {_human(sum(known))}"
              + (f" ({unknown} size(s) unknown, not counted)" if unknown else ""))
    if failed:
        print(f"{len(failed)} of {len(ids)} downloads failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
