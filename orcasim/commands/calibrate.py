"""``orcasim calibrate``: fit a latency model's coefficients to measured step times."""

from __future__ import annotations

import argparse

from orcasim.commands.common import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "calibrate", help="fit latency-model coefficients to measured step times",
        description="Fit the linear or roofline step-latency model to a CSV of measured steps "
        "(batch_size, prefill_tokens, decode_tokens, kv_tokens, seconds) and print the "
        "coefficients as a scenario's engine section, with confidence intervals and the fit "
        "error as comments.")
    c.add_argument("measurements", help="CSV of measured steps")
    c.add_argument("--model", choices=("linear", "roofline"), default="linear",
                   help="latency model to fit (default: linear)")
    c.add_argument("--llm", default="llama-2-7b", help="roofline: model preset")
    c.add_argument("--gpu", default="a100-80gb", help="roofline: GPU preset")
    c.add_argument("--tp", type=positive_int, default=1, help="roofline: tensor-parallel GPUs")
    c.add_argument("--confidence", type=float, default=0.95,
                   help="confidence level of the intervals (default 0.95)")
    c.set_defaults(handler=calibrate)


def calibrate(args: argparse.Namespace) -> int:
    """Fit the chosen model to the measurements and print it as an engine section."""
    from pydantic import ValidationError

    from orcasim.errors import OrcasimError, UsageError, as_usage_error
    from orcasim.latency.fit import fit_linear, fit_roofline, format_fit
    from orcasim.latency.measurements import load_measurements
    from orcasim.latency.roofline import RooflineParams
    from orcasim.spec import format_validation_error

    if not 0 < args.confidence < 1:
        raise UsageError(f"--confidence must be between 0 and 1 (got {args.confidence})")
    meas = load_measurements(args.measurements)
    if args.model == "roofline":
        try:
            RooflineParams(model=args.llm, gpu=args.gpu, tp=args.tp)
        except ValidationError as err:
            raise UsageError(format_validation_error(err, "")[1]) from None
    try:
        if args.model == "linear":
            fit = fit_linear(meas, args.confidence)
        else:
            fit = fit_roofline(meas, args.llm, args.gpu, args.tp, args.confidence)
    except OrcasimError as err:  # too few or degenerate measurements
        raise as_usage_error(err) from None
    print(format_fit(fit, meas.source))
    return 0
