"""Command line: `python -m nanoserve demo | serve | loadgen | bench | roofline | grade | fetch`."""

from __future__ import annotations

import argparse
import sys

from nanoserve.cli import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    """demo and roofline; the other subcommands are listed here and parse their own flags."""
    ap = argparse.ArgumentParser(prog="nanoserve", description=__doc__, formatter_class=HelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="sample a few prompts together, print their texts and latencies",
                       description="Sample four prompts together (continuous batching), print each "
                       "one's text,\nthen a table of its latencies.", formatter_class=HelpFormatter)
    d.add_argument("--model", default=None,
                   help="checkpoint folder or preset:NAME (default: the embedded demo-model)")
    d.add_argument("--max-tokens", type=int, default=48, help="tokens to sample per request")
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    d.add_argument("--verbose", action="store_true", help="also print every token as it streams in")
    for name, what in (("bench", "replay a workload in-process: TTFT/ITL/TPOT/E2E, goodput, MBU/MFU"),
                       ("serve", "serve a model over HTTP with the OpenAI API (vLLM's flags)"),
                       ("loadgen", "measure any OpenAI-compatible server (vllm bench serve's flags)"),
                       ("grade", "score exercises/ against the graded tests: grade [exNN ...]")):
        sub.add_parser(name, help=f"{what}; `nanoserve {name} --help` lists its flags")
    r = sub.add_parser("roofline", help="measure (or show cached) device ceilings",
                       description="This device's ceilings (memory bandwidth, matmul FLOP/s), "
                       "measured once and cached.", formatter_class=HelpFormatter)
    r.add_argument("--device", default="cpu", help="cpu or cuda")
    r.add_argument("--refresh", action="store_true", help="measure again even if cached")
    r.add_argument("--quick", action="store_true", help="smaller, faster measurements")
    f = sub.add_parser("fetch", help="download and convert a named model once (smollm2-135m)",
                       formatter_class=HelpFormatter)
    f.add_argument("name", help="a named model, e.g. smollm2-135m, or a .gguf file")
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "grade":  # grade, bench, serve and loadgen have their own parsers
        from nanoserve.course.grade import main as grade_main
        return grade_main(argv[1:])
    if argv and argv[0] == "bench":
        from nanoserve.measure.bench import main as bench_main
        return bench_main(argv[1:])
    if argv and argv[0] == "serve":
        from nanoserve.serve.server import main as serve_main
        return serve_main(argv[1:])
    if argv and argv[0] == "loadgen":
        from nanoserve.measure.loadgen import main as loadgen_main
        return loadgen_main(argv[1:])
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        from nanoserve.course.demo import run_demo
        run_demo(args.model, args.max_tokens, args.device, args.verbose)
    elif args.cmd == "roofline":
        from nanoserve.measure.roofline import format_ceilings, load_or_measure_ceilings
        print(format_ceilings(load_or_measure_ceilings(args.device, args.refresh, args.quick)))
    elif args.cmd == "fetch":
        from nanoserve.model.fetch import is_fetchable, resolve
        if not is_fetchable(args.name):
            from nanoserve.model.fetch import NAMED_MODELS
            ap.error(f"fetch {args.name!r}: not a named model {sorted(NAMED_MODELS)} nor a .gguf file")
        print(resolve(args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
