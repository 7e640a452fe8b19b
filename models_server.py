"""The local models server (JARVIS-compatible entry point).

    python models_server.py --config configs/config.default.yaml [--preload] [--port 8005]
"""

from __future__ import annotations

import argparse
import sys

from hugginggpt.config import load_config
from hugginggpt.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.default.yaml")
    parser.add_argument("--host", help="override local_inference_endpoint.host")
    parser.add_argument("--port", type=int, help="override local_inference_endpoint.port")
    parser.add_argument("--preload", action="store_true", help="load every servable model at start")
    args = parser.parse_args(argv)

    from hugginggpt.logs import setup_logging

    try:
        config = load_config(args.config, need_llm=False)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.debug, None)
    from hugginggpt.modelhost.app import create_app
    from hugginggpt.modelhost.pool import ModelPool
    from hugginggpt.modelhost.registry import Registry

    registry = Registry(config.local_deployment, config.local_models_dir)
    budget = int(config.memory_budget_gb * 1024**3) if config.memory_budget_gb else None
    pool = ModelPool(registry, config.device, budget)
    servable = [s for s in registry.specs.values() if registry.servable(s)]
    print(f"models server: {len(servable)}/{len(registry.specs)} models servable at level {config.local_deployment} "
          f"from {config.local_models_dir} on {config.device}", file=sys.stderr, flush=True)
    if args.preload:
        pool.preload(servable)
    from waitress import serve

    serve(create_app(pool, config.public_dir), host=args.host or config.models_host, port=args.port or config.models_port,
          threads=16, ident="hugginggpt-models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
