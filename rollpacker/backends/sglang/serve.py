"""`rollpacker serve`: the embedded engine behind SGLang's native HTTP API (the server: `server`).

    rollpacker serve --model PATH --port 30000 --host 127.0.0.1
"""

from __future__ import annotations

import argparse
import logging
import socket

from rollpacker.backends.sglang.server import EngineServer, web

log = logging.getLogger(__name__)


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help="serve the embedded engine through SGLang's native HTTP API",
                            description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--capacity", type=int, default=64, help="most requests decoded at once")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress-every", type=int, default=4, help="stream a progress chunk every N tokens")
    parser.add_argument("--ignore-eos", action="store_true", help="never stop on EOS (exact lengths)")
    parser.add_argument("--log-calls", action="store_true", help="log every HTTP call with its wall-clock time")


def run(args: argparse.Namespace) -> int:
    if web is None:
        from rollpacker.core.errors import ConfigError

        raise ConfigError("rollpacker serve needs aiohttp, which is not installed: pip install 'rollpacker[serve]'")
    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.models import resolve_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    check_port_free(args.host, args.port)  # before the model loads, not after
    model_dir = resolve_model(args.model)
    engine = EmbeddedEngine(
        model_dir, capacity=args.capacity, dtype=args.dtype, seed=args.seed,
        progress_every=args.progress_every, stop_token_ids=() if args.ignore_eos else None,
    )
    server = EngineServer(engine, str(model_dir), ignore_eos=args.ignore_eos, tokenizer=engine.tokenizer,
                          log_calls=args.log_calls)
    try:
        web.run_app(server.app, host=args.host, port=args.port, print=lambda *a: log.info(*a),
                    handle_signals=True, shutdown_timeout=2.0, handler_cancellation=True)
    finally:
        engine.close()
    return 0


def check_port_free(host: str, port: int) -> None:
    """A `ConfigError` naming --port when it cannot be bound (in use, or not ours to bind)."""
    from rollpacker.core.errors import ConfigError

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            probe.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"--port {port} on {host}: cannot listen there ({exc.strerror}); pick another --port") from None
