"""Command line: `python -m nanoserve demo | serve | loadgen | bench | roofline | grade | fetch`."""

from __future__ import annotations

import argparse
import sys


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
    ap = argparse.ArgumentParser(prog="nanoserve", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="stream text from the default model and print latencies")
    d.add_argument("--model", default=None, help="checkpoint folder or preset:NAME (default: demo model)")
    d.add_argument("--max-tokens", type=int, default=48)
    d.add_argument("--device", default=None)
    sub.add_parser("bench", help="replay a workload and print TTFT/ITL/TPOT/E2E, goodput, MBU/MFU")
    sub.add_parser("serve", help="serve a model over HTTP with the OpenAI API (vLLM's flags)")
    sub.add_parser("loadgen", help="measure any OpenAI-compatible server (vllm bench serve's flags)")
    sub.add_parser("grade", help="score exercises/ against the graded tests: grade [exNN ...]")
    r = sub.add_parser("roofline", help="measure (or show cached) device ceilings")
    r.add_argument("--device", default="cpu")
    r.add_argument("--refresh", action="store_true", help="measure again even if cached")
    r.add_argument("--quick", action="store_true", help="smaller, faster measurements")
    f = sub.add_parser("fetch", help="download and convert a named model once (smollm2-135m)")
    f.add_argument("name", help="a named model, e.g. smollm2-135m, or a .gguf file")
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        from nanoserve.course.demo import run_demo
        run_demo(args.model, args.max_tokens, args.device)
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
