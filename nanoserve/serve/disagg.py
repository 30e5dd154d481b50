"""`python -m nanoserve serve MODEL --disaggregated`: a prefill instance, a decode instance and the
router in front of them, on one machine; and `Deployment`, the same as three processes
(lessons, benchmarks).

The two instances are `nanoserve serve` processes (serve/launch.py) with the model and every
engine flag given here, one --kv-transfer-config each (kv_producer, kv_consumer; the
SharedMemoryConnector, or the JSON given with --kv-transfer-config, its kv_role replaced), on free
loopback ports; this process runs the router (serve/router.py) on --host/--port. On a CPU each
instance gets half of the CPUs this process may use (one each on a 2-core machine: pinned, one
torch thread per CPU), unless --prefill-cpus / --decode-cpus say otherwise; with GPUs,
--prefill-device / --decode-device place them (default: --device for both: two processes sharing
one GPU). SIGTERM or Ctrl-C stops the router, then both instances; if this process is killed,
the kernel stops them (PR_SET_PDEATHSIG).

The same deployment by hand, one process each (what this command runs):

    python -m nanoserve serve MODEL --port 8100 --cpu-omp-threads-bind 0 \\
        --kv-transfer-config '{"kv_connector": "SharedMemoryConnector", "kv_role": "kv_producer"}'
    python -m nanoserve serve MODEL --port 8200 --cpu-omp-threads-bind 1 \\
        --kv-transfer-config '{"kv_connector": "SharedMemoryConnector", "kv_role": "kv_consumer"}'
    python -m nanoserve.serve.router --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from nanoserve import cli
from nanoserve.serve.launch import ServerProcess, is_loopback, parse_cpus
from nanoserve.serve.router import Router, add_router_args, build_router_app

log = logging.getLogger("nanoserve.serve")
SHM = {"kv_connector": "SharedMemoryConnector"}


def split_cpus(cpus: list[int] | None = None) -> tuple[str | None, str | None]:
    """Half of `cpus` (default: those this process may use) each, as --cpu-omp-threads-bind
    specs; (None, None) when there is only one."""
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None, None
    half = len(cpus) // 2
    return ",".join(map(str, cpus[:half])), ",".join(map(str, cpus[half:]))


def instance(model_args, role: str, kv_config: dict, cpus: str | None = None,
             device: str | None = None, **kw) -> ServerProcess:
    """One instance (not started): `nanoserve serve *model_args` with its connector role, pinned
    to `cpus` (one torch thread each) and on `device` if given."""
    args = [*model_args, "--kv-transfer-config", json.dumps({**kv_config, "kv_role": role})]
    env = {}
    if cpus is not None:
        args += ["--cpu-omp-threads-bind", cpus]
        env["OMP_NUM_THREADS"] = str(len(parse_cpus(cpus)))
    if device is not None:
        args += ["--device", device]
    return ServerProcess(None, *args, env={**env, **kw.pop("env", {})}, **kw)


def start_all(servers: list[ServerProcess], timeout: float) -> None:
    """Launch every server, so that they load at once; wait until all are healthy (or stop all)."""
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_healthy(timeout)
    except BaseException:
        for s in servers:
            s.stop()
        raise


class Deployment:
    """Prefill instance, decode instance and router as three processes on free loopback ports
    (a context manager). model_args: the model and the engine flags both instances get;
    cpus / devices: (prefill, decode), default split_cpus() and no --device."""

    def __init__(self, model_args, cpus=None, devices=(None, None), kv_config: dict = SHM,
                 router_args=(), env: dict | None = None, startup_timeout: float = 600.0):
        cpus = split_cpus() if cpus is None else cpus
        self.prefill, self.decode = (
            instance(model_args, role, kv_config, c, d, env=dict(env or {}), startup_timeout=startup_timeout)
            for role, c, d in zip(("kv_producer", "kv_consumer"), cpus, devices))
        self.router = ServerProcess(None, "--prefill", self.prefill.base_url, "--decode",
                                    self.decode.base_url, *router_args, env=env,
                                    startup_timeout=startup_timeout, entry=("nanoserve.serve.router",))
        self.startup_timeout = startup_timeout

    @property
    def base_url(self) -> str:
        return self.router.base_url

    def start(self) -> Deployment:
        start_all([self.prefill, self.decode], self.startup_timeout)
        try:
            self.router.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for s in (self.router, self.decode, self.prefill):
            s.stop()

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def add_disagg_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--disaggregated", action="store_true", required=True,
                    help="a prefill and a decode instance of MODEL behind a router")
    ap.add_argument("--host", default="127.0.0.1", help="the router's interface")
    ap.add_argument("--port", type=int, default=8000, help="the router's port")
    ap.add_argument("--api-key", default=None, help="required by the router on /v1 (the instances "
                    "listen on loopback only, without a key)")
    ap.add_argument("--kv-transfer-config", default=json.dumps(SHM),
                    help="JSON of KVTransferConfig for both instances (kv_role is set for each)")
    ap.add_argument("--prefill-cpus", default=None, help="CPUs of the prefill instance (default: "
                    "half)")
    ap.add_argument("--decode-cpus", default=None, help="CPUs of the decode instance (default: "
                    "the other half)")
    ap.add_argument("--prefill-device", default=None, help="its --device (default: --device)")
    ap.add_argument("--decode-device", default=None, help="its --device (default: --device)")
    ap.add_argument("--startup-timeout", type=float, default=600.0,
                    help="seconds each instance may take to load and become healthy")
    ap.add_argument("--uvicorn-log-level", default="info", help="uvicorn's log level, for all three")
    return add_router_args(ap)


def main(argv: list[str]) -> int:
    """`python -m nanoserve serve MODEL --disaggregated [flags]`: every flag not listed here goes
    to both instances."""
    import uvicorn

    ap = add_disagg_args(cli.parser("nanoserve serve MODEL --disaggregated", __doc__))
    args, rest = ap.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per proxied request
    if not is_loopback(args.host) and not args.api_key:
        log.warning("the router serves %s without --api-key: anyone who can reach it can use the "
                    "model", args.host)
    auto = split_cpus()
    kv_config = json.loads(args.kv_transfer_config)
    rest = [*rest, "--uvicorn-log-level", args.uvicorn_log_level]
    prefill, decode = (instance(rest, role, kv_config, cpus or default, device,
                                startup_timeout=args.startup_timeout)
                       for role, cpus, default, device in (
                           ("kv_producer", args.prefill_cpus, auto[0], args.prefill_device),
                           ("kv_consumer", args.decode_cpus, auto[1], args.decode_device)))
    start_all([prefill, decode], args.startup_timeout)
    log.info("prefill instance %s (log %s), decode instance %s (log %s)", prefill.base_url,
             prefill.log_path, decode.base_url, decode.log_path)

    def stop_instances():
        decode.stop()
        prefill.stop()

    try:  # uvicorn re-raises SIGTERM after its shutdown: the instances stop in on_stop before that
        router = Router(prefill.base_url, decode.base_url, args.prefill_timeout, args.decode_timeout,
                        args.request_timeout)
        uvicorn.run(build_router_app(router, args.api_key, stop_instances), host=args.host,
                    port=args.port, log_level=args.uvicorn_log_level)
    finally:
        stop_instances()  # idempotent
    return 0
