"""``orcasim serve``: a scenario's engine as a simulated OpenAI-compatible endpoint.

Serves one variant in real time until SIGINT or SIGTERM; requests in flight
then are aborted (``shutdown``) and the usual outputs (summary, per-request
table, plots) are written for the served traffic. Needs the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from orcasim.commands.common import check_input_file, check_output_dir, non_negative_int, seed_arg
from orcasim.errors import UsageError

#: seconds a thread may hold the interpreter while another waits (Python's default: 0.005)
SWITCH_INTERVAL = 0.0005


def _port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port must be in [0, 65535], got {text!r}")
    return value


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("serve", help="serve a scenario's engine as an OpenAI-compatible "
                       "endpoint in real time")
    r.add_argument("scenario", nargs="?", default=None,
                   help="scenario YAML file or built-in name (default: seed_orca)")
    r.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; "
                   "0.0.0.0 for every interface)")
    r.add_argument("--port", type=_port, default=8000,
                   help="port to listen on (default 8000; 0 picks a free port, printed)")
    r.add_argument("--variant", default=None, metavar="NAME",
                   help="the variant to serve (default: the first)")
    r.add_argument("--model", default=None,
                   help="the model name served and listed by /v1/models "
                   "(default: the scenario's name)")
    r.add_argument("--tokenizer", type=Path, default=None, metavar="TOKENIZER.json",
                   help="count prompt tokens with this tokenizers file (the tokenizers extra); "
                   "default: ceil(characters / 4)")
    r.add_argument("--time-scale", type=_factor, default=1.0, metavar="FACTOR",
                   help="wall seconds per simulated second (default 1: real time)")
    r.add_argument("--seed", type=seed_arg, default=None,
                   help="override the scenario's seed (the drawn output lengths)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field (repeatable)")
    r.add_argument("--out", type=Path, default=None,
                   help="output directory for the served run (default: orcasim-out/<name>-serve)")
    r.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    r.set_defaults(handler=serve)


def token_counter(path: Path):
    """Count a text's tokens with the ``tokenizers`` file at ``path`` (no special tokens)."""
    check_input_file(path)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--tokenizer needs the 'tokenizers' package: "
                         "pip install 'orcasim[tokenizers]'") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the library raises its own exception types
        raise UsageError(f"--tokenizer {path}: cannot load tokenizer: {err}") from None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def serve(args: argparse.Namespace) -> int:
    """Check everything, serve until a signal, then print and write the served run's results."""
    try:
        import aiohttp  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError("orcasim serve needs the 'serve' extra: "
                         "pip install 'orcasim[serve]'") from None
    from orcasim.commands.preflight import check_scenario
    from orcasim.metrics.results import Results
    from orcasim.scenario import load_scenario
    from orcasim.serve.run import finish_result, make_server, serve_until_signal

    sc = load_scenario(args.scenario, args.overrides or None)
    name = args.variant or sc.variant_names[0]
    if name not in sc.variant_names:
        raise UsageError(f"--variant {name}: no variant {name!r} in {sc.source} "
                         f"(have: {', '.join(sc.variant_names)})")
    out = check_output_dir(args.out if args.out is not None
                           else Path("orcasim-out") / f"{sc.name}-serve")
    count = token_counter(args.tokenizer) if args.tokenizer is not None else None
    seed = sc.seed if args.seed is None else args.seed
    drawn = check_scenario(sc, seed, [name])[name]
    model = args.model or sc.name
    server = make_server(sc.variant(name), seed=seed, lengths=drawn.output_len.tolist(),
                         model=model, count=count, factor=args.time_scale)

    def ready(s) -> None:
        print(f"serving {model!r} (scenario {sc.name}, variant {name}) on "
              f"http://{args.host}:{s.port}  (Ctrl-C to stop)", flush=True)

    # the simulation thread must get the interpreter soon after its timer expires, not after
    # the default 5 ms the HTTP thread may hold it: that wait would be real-time lag
    import asyncio  # here, not at the top: every command builds this module's parser

    sys.setswitchinterval(SWITCH_INTERVAL)
    asyncio.run(serve_until_signal(server, args.host, args.port, ready))
    result = finish_result(server)
    res = Results(sc, {name: result}, seed=seed)
    from orcasim.commands.run import TABLE_METRICS

    keys = [m for m in [*TABLE_METRICS, "realtime_lag_p50", "realtime_lag_p99",
                        "realtime_lag_max"] if m in result.summary]
    print(res.table(keys))
    written = res.write(out, plots=not args.no_plots and server.sim.num_submitted > 0,
                        requests_csv=True)  # requests.csv: what replay reads
    print(f"\nwrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")
    sys.stdout.flush()
    return 0
