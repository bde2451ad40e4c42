"""`python3 -m eplb.plot`: eplb's pictures from the shell.

  python3 -m eplb.plot rank-loads --load LOAD (--after PLACEMENT.json | --policy NAME)
                       [--before PLACEMENT.json] [--replicas R --groups G --nodes N --ranks P] -o FILE
  python3 -m eplb.plot evaluate RESULTS.json [--max-input-bytes SIZE] -o FILE
  python3 -m eplb.plot timeline RUN.json [--round N] [--max-input-bytes SIZE] -o FILE

Input files are read as untrusted: regular files only, at most --max-input-bytes (default 1GiB), UTF-8
JSON whose drawn fields have their types; anything else is exit 3 with one line naming the file (and
the field).

Exit codes as the eplb command: 0 done, 2 bad argument, 3 bad input file, 1 other.
"""
import argparse
import sys

from eplb import files, plot
from eplb.plot import _inputs
from eplb.errors import Error
from eplb.policy import policies, rebalance_experts

_EXIT_CODES = {"invalid argument": 2, "I/O error": 3, "parse error": 3, "unsupported": 3}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m eplb.plot", description="Draw eplb's pictures (PNG or SVG).")
    commands = parser.add_subparsers(dest="command", required=True)
    ranks = commands.add_parser("rank-loads", help="rank loads before and after a rebalance, per layer",
                                description="Rank loads before and after a rebalance, per layer: heatmaps of "
                                            "rank load / mean and the per-layer balancedness.")
    ranks.add_argument("--load", required=True, help="expert loads [L][E] or a trace [W][L][E] (.npy, .csv, .json)")
    ranks.add_argument("--after", help="the new placement (JSON from `eplb rebalance --out`)")
    ranks.add_argument("--before", help="the placement in force (JSON; default: slot s holds expert s mod E)")
    ranks.add_argument("--policy", default="deepseek", choices=policies(),
                       help="without --after: compute the new placement with this policy (default: deepseek)")
    for flag, what in (("--replicas", "slots per layer"), ("--groups", "expert groups"), ("--nodes", "nodes"),
                       ("--ranks", "ranks")):
        ranks.add_argument(flag, type=int, help=f"{what} (default: from --after or --before)")
    ranks.add_argument("-o", "--out", required=True, help="the picture to write (.png, .svg, .pdf)")
    evaluate = commands.add_parser("evaluate", help="`eplb evaluate --json` results: balancedness and bytes moved",
                                   description="Balancedness per window per policy, and bytes moved per "
                                               "rebalance, from the JSON written by `eplb evaluate --json`.")
    evaluate.add_argument("results", help="the JSON file written by `eplb evaluate --json FILE`")
    evaluate.add_argument("-o", "--out", required=True, help="the picture to write (.png, .svg, .pdf)")
    _max_input_bytes(evaluate)
    timeline = commands.add_parser("timeline", help="an async `eplb run --json` report: serving step times, commits",
                                   description="Serving step times over each round of an async `eplb run` (the "
                                               "report's serving_timeline), the time stalled in eplb calls and "
                                               "each layer's commit marked: did rebalancing hurt latency?")
    timeline.add_argument("report", help="the JSON file written by `eplb run --async ... --json FILE`")
    timeline.add_argument("--round", type=int, help="draw only this round (from 1; default: every round)")
    timeline.add_argument("-o", "--out", required=True, help="the picture to write (.png, .svg, .pdf)")
    _max_input_bytes(timeline)
    return parser


def _max_input_bytes(command) -> None:
    command.add_argument("--max-input-bytes", default="1GiB",
                         help="largest input file read, e.g. 256MiB (default 1GiB); a larger one is refused before "
                              "it is read. Inputs must be regular files (not a FIFO or a device)")


_FLAGS = {"num_replicas": "replicas", "num_groups": "groups", "num_nodes": "nodes", "num_ranks": "ranks"}


def _topology(arguments, placement) -> dict:
    """Slots, groups, nodes and ranks: from the flags, else from a placement file."""
    counts = {}
    for key, flag in _FLAGS.items():
        value = getattr(arguments, flag)
        if value is None:
            if placement is None:
                raise Error(f"--{flag} is needed (or --after / --before to take it from)")
            value = placement[key]
        counts[key] = value
    return counts


def _rank_loads(arguments) -> None:
    load = files.read_load(arguments.load)
    after = files.read_placement(arguments.after) if arguments.after else None
    before = files.read_placement(arguments.before) if arguments.before else None
    topology = _topology(arguments, after or before)
    before_phy2log = before["phy2log"] if before else None
    if after is not None:
        after_phy2log = after["phy2log"]
    else:
        after_phy2log, _, _ = rebalance_experts(load, topology["num_replicas"], topology["num_groups"],
                                                topology["num_nodes"], topology["num_ranks"],
                                                policy=arguments.policy, current=before_phy2log)
    plot.rank_loads(load, after_phy2log, topology["num_ranks"], before=before_phy2log, out=arguments.out)


def main(argv=None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        if arguments.command == "rank-loads":
            _rank_loads(arguments)
        elif arguments.command == "timeline":
            cap = _inputs.parse_byte_size(arguments.max_input_bytes)
            plot.timeline(arguments.report, round=arguments.round, out=arguments.out, max_input_bytes=cap)
        else:
            cap = _inputs.parse_byte_size(arguments.max_input_bytes)
            plot.evaluate(arguments.results, out=arguments.out, max_input_bytes=cap)
    except Error as failure:
        print(f"eplb.plot: {failure.code}: {' '.join(str(failure).split())}", file=sys.stderr)
        return _EXIT_CODES.get(failure.code, 1)
    print(f"wrote {arguments.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
