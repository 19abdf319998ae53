"""The command line of the embedded engine: ``agentrt sim serve``'s arguments and what it
runs, and the engine's options that ``agentrt bench`` and ``agentrt tune`` share. Its
imports of the engine happen when the command runs."""

from __future__ import annotations

import argparse
import errno
from typing import Final

from .._cliparts import Command, CommandError, Formatter, Parser, examples, positive, print_help

__all__ = [
    "FINAL_POLICIES",
    "KV_POLICIES",
    "PRESETS",
    "SCHEDULING",
    "add_sim",
    "engine_args",
    "gateway_name",
]

PRESETS: Final = {
    "h100-8b": "an 8B model on one H100 (vLLM's defaults)",
    "cpu-tiny": "the tiny test model on vLLM's CPU engine",
}
"""The embedded engine's presets (tests check them against ``agentrt.sim.PRESETS``)."""

KV_POLICIES: Final = ("lru", "keep", "pin", "offload", "drop", "adaptive", "resume")
SCHEDULING: Final = ("fcfs", "priority")
FINAL_POLICIES: Final = ("lru", "drop")


def engine_args(p: argparse.ArgumentParser, *, serve: bool) -> None:
    """The embedded engine's options, shared by ``bench`` and ``sim serve``."""
    p.add_argument(
        "--preset",
        default="h100-8b",
        choices=tuple(PRESETS),
        help="the engine's cost model and limits: "
        + "; ".join(f"{k}: {v}" for k, v in PRESETS.items()),
    )
    p.add_argument(
        "--gpu-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks on each replica's accelerator (default: the preset's)",
    )
    p.add_argument(
        "--host-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks in each replica's host tier (default: the preset's, none)",
    )
    p.add_argument(
        "--tool-wait-policy",
        default=None,
        choices=KV_POLICIES,
        metavar="POLICY",
        help="what a replica does with a session's KV during a declared tool wait: "
        + ", ".join(KV_POLICIES)
        + " (default: the preset's, lru; docs/sim.md)",
    )
    p.add_argument(
        "--retention-directives",
        action="store_true",
        help="the replicas honour retention directives: a session's declared end and "
        "expected idle order their evictions (ended first, then LRU, then the session "
        "waking latest); default: plain LRU, as released vLLM (docs/sim.md)",
    )
    if serve:
        p.add_argument(
            "--scheduling",
            default="fcfs",
            choices=SCHEDULING,
            help="the replicas' queue order: fcfs, or priority (the request's priority "
            "field, as vLLM's --scheduling-policy priority)",
        )
        p.add_argument(
            "--final-policy",
            default=None,
            choices=FINAL_POLICIES,
            metavar="POLICY",
            help="what a replica does with a session's KV when its declared last call "
            "(final) finishes: lru (leave it to LRU, as vLLM) or drop (free the "
            "session's own blocks at once; shared prefixes stay) (default: the preset's, "
            "lru; docs/sim.md)",
        )


def gateway_name(name: str | None) -> str | None:
    if name is None:
        return None
    from .peers import peer_name

    try:
        return peer_name(name)
    except ValueError as exc:
        raise CommandError(f"--gateway: {exc}") from None


def add_sim(command: Command) -> None:
    """``agentrt sim`` and its ``serve``."""
    sim = command(
        "sim",
        "the embedded engine",
        "The embedded engine: simulated vLLM-like replicas (docs/sim.md).",
        examples("agentrt sim serve --replicas 2"),
    )
    sim.set_defaults(run=lambda _: print_help(sim))
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    serve: Parser = sim_sub.add_parser(
        "serve",
        help="serve simulated replicas over HTTP (the OpenAI API)",
        description="Serves simulated replicas in wall-clock time with the OpenAI API "
        "(chat and text completions, streaming, /v1/models, /metrics), for agent code and "
        "frameworks to run against. Prints the URLs it serves. Needs the serve extra: pip "
        "install 'agentjct[serve]'.",
        epilog=examples(
            "agentrt sim serve",
            "agentrt sim serve --replicas 2 --port 8100 --replies agent",
            "agentrt sim serve --gpu-blocks 2048 --host-blocks 8192 --tool-wait-policy pin",
            "agentrt sim serve --replicas 4 --gateway vllm-router:cache_aware",
        ),
        formatter_class=Formatter,
    )
    serve.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas served")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on; 0 picks a free one"
    )
    serve.add_argument(
        "--replies",
        choices=("filler", "agent"),
        default="filler",
        help="filler: random words; agent: follow CALL/ANSWER directives in the last user "
        "message and answer tools=[...] with tool calls, so agents run real tool loops "
        "(docs/sim.md)",
    )
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model names requests may ask for, as vLLM's option (the first is listed "
        "by /v1/models); others get 404 model_not_found (default: the preset's model name)",
    )
    serve.add_argument(
        "--gateway",
        default=None,
        metavar="PEER",
        help="a modelled router at the front door /v1 instead of round-robin, e.g. "
        "vllm-router:cache_aware (docs/sim.md, Peers; the list: --gateway list)",
    )
    serve.add_argument(
        "--kv-events-port",
        type=int,
        default=None,
        metavar="PORT",
        help="publish each replica's KV-cache events on ZMQ as vLLM's --kv-events-config "
        "does: replica i on tcp://HOST:PORT+i, listed at /replica-i/kv_event_sources "
        "(read them with Endpoint(kv_events='auto'); the kv-events extra)",
    )
    engine_args(serve, serve=True)
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    positive(args.replicas, "--replicas")
    positive(args.gpu_blocks, "--gpu-blocks")
    if args.host_blocks is not None and args.host_blocks < 0:
        raise CommandError(f"--host-blocks must be 0 or more, got {args.host_blocks}")
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be between 0 and 65535, got {args.port}")
    events = args.kv_events_port
    if events is not None:
        if not 1 <= events <= 65535 - args.replicas + 1:
            raise CommandError(
                f"--kv-events-port must leave a port for each replica (1 to "
                f"{65535 - args.replicas + 1}), got {events}"
            )
        try:
            import msgspec  # noqa: F401
            import zmq  # noqa: F401
        except ImportError:
            raise CommandError(
                "--kv-events-port needs pyzmq and msgspec: pip install 'agentjct[kv-events]'"
            ) from None
    gateway = None
    if args.gateway is not None:
        from .peers import PEERS, peer_name

        if args.gateway == "list":
            print("\n".join(sorted(PEERS)))
            return 0
        try:
            gateway = peer_name(args.gateway)
        except ValueError as exc:
            raise CommandError(f"--gateway: {exc}") from None
    import uvicorn  # noqa: F401  # the serve extra: a one-line error below when missing

    from . import ServedURLs, serve
    from ._config import resolve_config

    given = {
        "num_gpu_blocks": args.gpu_blocks,
        "num_host_blocks": args.host_blocks,
        "tool_wait_policy": args.tool_wait_policy,
        "final_policy": args.final_policy,
        "retention_directives": args.retention_directives or None,
    }
    config = resolve_config(args.preset)
    names = tuple(args.served_model_name or (config.model_name,))
    config = config.replace(
        model_name=names[0],
        served_model_names=names,
        replies=args.replies,
        scheduling=args.scheduling,
        **{name: value for name, value in given.items() if value is not None},
    )

    def ready(urls: ServedURLs) -> None:
        print("serving (Ctrl-C to stop):", flush=True)
        for line in urls.lines():
            print(f"  {line}", flush=True)

    try:
        serve(
            args.replicas,
            args.host,
            args.port,
            config,
            log_level="warning",
            on_ready=ready,
            gateway=gateway,
            kv_events_port=events,
        )
    except RuntimeError as exc:  # the server did not start (the reason is one line)
        raise CommandError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(
                f"port {args.port} on {args.host} is in use; pick another with --port"
            ) from None
        raise CommandError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    except KeyboardInterrupt:
        pass
    return 0
