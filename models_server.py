"""The local models server (JARVIS-compatible entry point).

    python models_server.py --config configs/config.default.yaml [--preload] [--port 8005]
"""

from __future__ import annotations

import argparse
import signal
import sys

from hugginggpt.config import load_config
from hugginggpt.errors import ConfigError


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def discovery_of(config, registry, engine: str):
    """Hub models outside the catalog this server may download and run (`discovered_models: local`)."""
    from hugginggpt.modelhost.discover import Discovery, DiscoveryPolicy

    mode = config.discovered_models
    if mode == "local" and engine != "flask":
        print("warning: discovered_models: local works with --engine flask only; Ray replicas serve the catalog",
              file=sys.stderr, flush=True)
        mode = "off"
    cap = config.max_model_size_mb
    policy = DiscoveryPolicy(mode=mode, allow=config.discovered_authors_allow, deny=config.discovered_authors_deny,
                             max_size_mb=float(cap) if isinstance(cap, (int, float)) and cap > 0 else None)
    discovery = Discovery(policy, config.local_models_dir, token=config.huggingface_token,
                          curated_ids=registry.catalog_ids)
    if discovery.enabled:
        from huggingface_hub import constants

        authors = f"only {', '.join(policy.allow)}" if policy.allow else "any"
        denied = f", never {', '.join(policy.deny)}" if policy.deny else ""
        cap_text = f", at most {policy.max_size_mb:g} MB of weights" if policy.max_size_mb else ""
        print(f"models server: Hub models outside the catalog are downloaded on first use from {constants.ENDPOINT} "
              f"into {config.local_models_dir} (authors: {authors}{denied}{cap_text}); "
              f"{len(discovery.listed())} already there", file=sys.stderr, flush=True)
    return discovery


LOOPBACK = ("localhost", "127.0.0.1", "::1")


def listen_host(config, cli_host: str | None) -> str:
    """Where to listen: without models_server_token, loopback only unless --host says otherwise (issue 20)."""
    host = cli_host or config.models_host
    if config.models_server_token or host in LOOPBACK:
        return host
    if cli_host is None:
        print(f"warning: listening on 127.0.0.1, not {host}, because no models_server_token is set; set "
              "models_server_token (or HUGGINGGPT_MODELS_TOKEN) here and in the orchestrator's config to open it "
              f"to the network, or pass --host {host} to open it without one", file=sys.stderr, flush=True)
        return "127.0.0.1"
    print(f"warning: listening on {host} without models_server_token: anyone who can reach this port can run "
          "models (web pages are held back by JSON-only, Origin and Host checks: models_server_hosts lists the "
          "names clients use); set models_server_token (or HUGGINGGPT_MODELS_TOKEN) here and in the "
          "orchestrator's config", file=sys.stderr, flush=True)
    return host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.default.yaml")
    parser.add_argument("--host", help="override local_inference_endpoint.host")
    parser.add_argument("--port", type=int, help="override local_inference_endpoint.port")
    parser.add_argument("--preload", action="store_true", help="load every servable model at start")
    parser.add_argument("--strict", action="store_true", help="an unknown config key is an error, not a warning")
    parser.add_argument("--engine", choices=["flask", "ray"], default="flask",
                        help="flask: models in this process; ray: models in Ray Serve replicas (pip install "
                             "-r requirements-ray.txt)")
    parser.add_argument("--address", help="ray: join this Ray cluster (e.g. ray://head:10001 or auto) instead of "
                                          "starting a local instance")
    parser.add_argument("--replicas", type=int, default=1, help="ray: replicas per deployment (default 1)")
    parser.add_argument("--models-per-replica", type=int, default=3,
                        help="ray: models one replica holds before the least recently used is unloaded (default 3)")
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
    from hugginggpt.modelhost.batching import Batcher
    from hugginggpt.modelhost.compute import for_device
    from hugginggpt.modelhost.device import free_memory_reader, resolve_device, version_problems
    from hugginggpt.modelhost.engine import LocalEngine
    from hugginggpt.modelhost.pool import ModelPool
    from hugginggpt.modelhost.registry import Registry

    for problem in version_problems():
        print(f"warning: {problem}", file=sys.stderr, flush=True)
    device, warning = resolve_device(config.device)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    registry = Registry(config.local_deployment, config.local_models_dir, catalog_path=config.catalog_path)
    budget = int(config.memory_budget_gb * 1024**3) if config.memory_budget_gb else None
    servable = [s for s in registry.specs.values() if registry.servable(s)]
    if args.engine == "ray":
        try:
            from hugginggpt.modelhost.ray_engine import RayEngine
        except ImportError:
            print("error: --engine ray needs Ray Serve: pip install -r requirements-ray.txt", file=sys.stderr)
            return 2
        engine = RayEngine(registry, device, config.catalog_path, config.public_dir, address=args.address,
                           replicas=args.replicas, models_per_replica=args.models_per_replica,
                           max_pixels=config.max_image_pixels, timeout=config.task_timeout,
                           max_batch_size=config.max_batch_size, batch_wait_ms=config.batch_wait_ms,
                           compute_threads=config.compute_threads)
    else:
        compute = for_device(device, config.compute_threads)
        pool = ModelPool(registry, device, budget, free_memory=free_memory_reader(device), compute=compute)
        engine = LocalEngine(pool, Batcher(config.max_batch_size, config.batch_wait_ms / 1000))
    computing = f", {pool.compute.threads} compute thread{'s' if pool.compute.threads > 1 else ''}" \
        if args.engine == "flask" else ""
    print(f"models server: {len(servable)}/{len(registry.specs)} models servable at level {config.local_deployment} "
          f"from {config.local_models_dir} on {device}{computing}", file=sys.stderr, flush=True)
    if len(servable) < len(registry.specs):
        print(f"  the other {len(registry.specs) - len(servable)} need weights in {config.local_models_dir}: "
              f"python -m hugginggpt.modelhost.download --config {args.config} --dry-run lists them "
              "(drop --dry-run to fetch)", file=sys.stderr, flush=True)
    if args.preload and args.engine == "flask":
        pool.preload(servable)
    discovery = discovery_of(config, registry, args.engine)
    from hugginggpt.server import serve

    host = listen_host(config, args.host)
    signal.signal(signal.SIGTERM, _stop)  # SIGTERM ends like Ctrl-C, so the engine (Ray too) shuts down
    app = create_app(engine, config.public_dir, token=config.models_server_token, policy=config.url_policy(),
                     max_pixels=config.max_image_pixels, discovery=discovery, listen_host=config.models_host,
                     hosts=config.models_server_hosts, fetch_bytes=config.max_fetch_bytes,
                     fetch_timeout=config.fetch_timeout)
    try:
        # enough threads that every caller a batch may hold reaches the batcher (http_threads overrides)
        threads = config.http_threads or config.max_concurrent_requests + 16
        return serve(app, host, args.port or config.models_port, threads=threads, ident="hugginggpt-models",
                     port_option="local_inference_endpoint.port", limits=config.http_limits())
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    sys.exit(main())
