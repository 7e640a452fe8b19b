"""Fetch the registry's models into local_models_dir (on your GPU box; needs the Hub).

    python -m hugginggpt.modelhost.download --deployment standard [--models-dir models] [--only ID ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .registry import LEVELS, REGISTRY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployment", choices=list(LEVELS), default="standard")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--only", nargs="*", help="download just these ids")
    parser.add_argument("--dry-run", action="store_true", help="list what would be fetched")
    args = parser.parse_args(argv)
    wanted = [s for s in REGISTRY if s.needs_weights and s.included_in(args.deployment)]
    if args.only:
        wanted = [s for s in wanted if s.id in args.only]
    ids = sorted({s.id for s in wanted} | {s.base_model for s in wanted if s.base_model})
    for mid in ids:
        target = Path(args.models_dir) / mid
        print(f"{'would fetch' if args.dry_run else 'fetching'} {mid} -> {target}", flush=True)
        if args.dry_run:
            continue
        from huggingface_hub import snapshot_download

        try:
            snapshot_download(repo_id=mid, local_dir=target)
        except Exception as exc:  # noqa: BLE001
            print(f"  failed: {exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
