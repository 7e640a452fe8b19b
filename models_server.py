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
    parser.add_argument("--strict", action="store_true", help="an unknown config key is an error, not a warning")
    args = parser.parse_args(argv)

    from hugginggpt.logs import setup_logging

    try:
        config = load_config(args.config, need_llm=False, strict=args.strict)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    setup_logging(config.debug, None)
    from hugginggpt.modelhost.app import create_app
    from hugginggpt.modelhost.device import resolve_device
    from hugginggpt.modelhost.pool import ModelPool
    from hugginggpt.modelhost.registry import Registry

    device, warning = resolve_device(config.device)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    registry = Registry(config.local_deployment, config.local_models_dir, catalog_path=config.catalog_path)
    budget = int(config.memory_budget_gb * 1024**3) if config.memory_budget_gb else None
    pool = ModelPool(registry, device, budget)
    servable = [s for s in registry.specs.values() if registry.servable(s)]
    print(f"models server: {len(servable)}/{len(registry.specs)} models servable at level {config.local_deployment} "
          f"from {config.local_models_dir} on {device}", file=sys.stderr, flush=True)
    if len(servable) < len(registry.specs):
        print(f"  the other {len(registry.specs) - len(servable)} need weights in {config.local_models_dir}: "
              f"python -m hugginggpt.modelhost.download --config {args.config} --dry-run lists them "
              "(drop --dry-run to fetch)", file=sys.stderr, flush=True)
    if args.preload:
        pool.preload(servable)
    from hugginggpt.server import serve

    host = args.host or config.models_host
    if not config.models_server_token and host not in ("localhost", "127.0.0.1", "::1"):
        print(f"warning: listening on {host} without models_server_token: anyone who can reach this port can run "
              "models; set models_server_token (or HUGGINGGPT_MODELS_TOKEN) here and in the orchestrator's config",
              file=sys.stderr, flush=True)
    app = create_app(pool, config.public_dir, token=config.models_server_token, policy=config.url_policy(),
                     max_pixels=config.max_image_pixels)
    return serve(app, host, args.port or config.models_port, ident="hugginggpt-models",
                 port_option="local_inference_endpoint.port")


if __name__ == "__main__":
    sys.exit(main())
