"""``cluster-dq``: serve, token, pipeline, version, and the operator commands (stats, jobs,
dlq, pause, resume; run by ``ops.py``; groups, group: ``ops_groups.py``). Parses arguments and
calls the package."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import re
import sys
import time
from collections.abc import AsyncIterator

import cluster_dq
from cluster_dq import logs, settings as settings_mod
from cluster_dq.dashboard import times
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.errors import ClusterDQError, ConfigError
from cluster_dq.progress import spark_progress
from cluster_dq.routing import build_routes
from cluster_dq.settings import PoolSettings, Settings
from cluster_dq.terminal import shown
from cluster_dq.tokens import TokenStore, custom_route, mask


def _settings(args: argparse.Namespace) -> Settings:
    s = settings_mod.load(args.config)
    overrides = {
        k: v
        for k, v in (
            ("Port", getattr(args, "port", None)),
            ("AdminPort", getattr(args, "admin_port", None)),
            ("EmbeddedRedisPort", getattr(args, "redis_port", None)),
            ("Host", getattr(args, "host", None)),
            ("Workers", getattr(args, "workers", None)),
        )
        if v is not None
    }
    return dataclasses.replace(s, **overrides) if overrides else s


def _banner(s: Settings, data_port: int, admin_port: int, embedded: bool) -> None:
    token = ""
    if embedded:  # a newcomer's first run: hand them a token for namespace "demo"
        token = asyncio.run(_create_token(s, "demo", "embedded demo token", None))
    data = f"http://{s.Host}:{data_port}"
    print(
        f"cluster-dq {cluster_dq.__version__}: data API {data}, admin API http://{s.AdminHost}:{admin_port}"
    )
    if s.Pool["default"].Addr:
        print(f"redis (pool default): {s.Pool['default'].Addr}")
    if token:
        print(
            f"""
A token for namespace "demo": {token}
  curl -X PUT -H 'X-Token: {token}' '{data}/api/demo/hello?delay=2' -d 'hi there'
  curl -H 'X-Token: {token}' '{data}/api/demo/hello?timeout=5'
  curl -X DELETE -H 'X-Token: {token}' '{data}/api/demo/hello/job/<job_id>'
Stop with Ctrl-C.""",
            flush=True,
        )


@contextlib.asynccontextmanager
async def _token_store(s: Settings) -> AsyncIterator[TokenStore]:
    """The token store of the default pool, on a client of its own for one command; it knows
    the pools and rings of the settings, as the service's does."""
    from cluster_dq.engine.aio import AsyncEngine
    from cluster_dq.pools import close_client, make_client

    engine = AsyncEngine(make_client(s.Pool["default"]), EngineConfig.from_settings(s))
    try:
        yield TokenStore(engine, routes=set(build_routes(s, s.Pool)))
    finally:
        await close_client(engine.client)


async def _create_token(s: Settings, ns: str, description: str, token: str | None) -> str:
    async with _token_store(s) as store:
        return await store.create("default", ns, description, token)


async def _token_cmd(s: Settings, args: argparse.Namespace) -> int:
    async with _token_store(s) as store:
        if args.action == "create":  # checked by the store, as for the admin API
            tok = await store.create(args.pool, args.namespace, args.description, args.token)
            pool, _ = custom_route(args.pool, args.token)  # --pool, or the token's pool: prefix
            print(f"{pool}:{tok}" if pool != "default" else tok)
            return 0
        pool = args.pool or "default"
        if args.action == "list":
            for tok, desc in sorted((await store.list(pool, args.namespace)).items()):
                print(f"{shown(tok)}\t{shown(desc)}")
        elif not await store.delete(pool, args.namespace, args.token):
            print(
                f"cluster-dq: no token {shown(mask(args.token))} in namespace "
                f"{shown(args.namespace)} (pool {shown(pool)})",
                file=sys.stderr,
            )
            return 1
    return 0


async def _widen(s: Settings) -> int:
    """``wheel widen``: every queue of every pool gets its short wheel entries rewritten whole
    (engine.control.widen_wheel), before a downgrade to a version without them; with no
    instance of this version running. Queues are found as the pump's reconcile sweep finds
    them, by SCANning every queue's META (on a Cluster, every master): a wheel with a job, or a
    short-only mark, has one; a queue whose registration was lost is found all the same."""
    from cluster_dq.engine import control
    from cluster_dq.engine.aio import AsyncEngine
    from cluster_dq.keys import META_PATTERN, queue_of_key
    from cluster_dq.pools import close_client, make_client

    cfg = EngineConfig.from_settings(s)
    for name, pool in sorted(s.Pool.items()):
        engine = AsyncEngine(make_client(pool), cfg)
        try:
            found = {queue_of_key(k) async for k in engine.client.scan_iter(match=META_PATTERN)}
            widened = 0
            for qk in sorted(found, key=lambda k: k.qualified):
                op = control.widen_wheel(cfg, qk.namespace, qk.queue)
                widened += await engine.run(op, idempotent=True)
            print(f"pool {name}: {widened:,} wheel entries widened in {len(found):,} queues")
        finally:
            await close_client(engine.client)
    return 0


def _pipeline(s: Settings, args: argparse.Namespace) -> int:
    from cluster_dq import pipeline

    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigError("the pipeline needs pyspark: pip install 'cluster_dq[spark]'") from None
    spark = pipeline.spark_session(master=args.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        route = build_routes(s, s.Pool).get(args.pool)
        config = EngineConfig.from_settings(s)  # the service's: same shards, same ack memory
        if route is None:
            raise ConfigError(f"--pool: no pool or ring named {args.pool!r}")
        if args.action == "schedule":
            from cluster_dq.pipeline.schedule import schedule

            where = ", ".join(f"{p.name} ({p.Addr})" for p in route.pools())
            print(f"schedule: {args.inputs[0]} -> {args.pool}: {where}", flush=True)
            with spark_progress(spark, "schedule"):
                counts = schedule(
                    spark,
                    args.inputs[0],
                    route,
                    config=config,
                    rejects_path=args.rejects,
                    reference_ms=args.at,
                    progress=True,
                )
            print(f"schedule: {counts}")
            if counts.rejected and args.rejects:
                print(f"schedule: refused rows and reasons in {args.rejects}")
        elif args.action == "export":
            from cluster_dq.pipeline.export import export

            queues = []
            for name in args.inputs:
                ns, _, q = name.partition("/")
                if not q:
                    raise ConfigError(f"export: {name!r} is not namespace/queue")
                queues.append((ns, q))
            with spark_progress(spark, "export"):
                df = export(spark, route, queues, args.states.split(","), args.out, config)
                summary = (
                    df.groupBy("namespace", "queue", "state")
                    .count()
                    .orderBy("namespace", "queue", "state")
                    .collect()
                )
            for row in summary:
                print(f"export: {row['namespace']}/{row['queue']} {row['state']}: {row['count']:,}")
            if args.out:
                print(f"export: written to {args.out}")
        else:
            from cluster_dq.pipeline.analyze import analyze

            df = analyze(spark, args.inputs[0], args.out)
            df.show(100, False)
            if args.out:
                print(f"analyze: written to {args.out}")
        return 0
    finally:
        spark.stop()


# -- argument types of the operator commands -------------------------------------------------

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
LATEST_S = (2**48 - 1) // 1000  # the latest time the service takes (Unix ms in a u48), whole s
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def when_arg(text: str) -> float:
    """A time for --since / --until: epoch seconds, an ISO 8601 date or time (UTC unless it
    says otherwise, or as the dashboard shows it: ``2026-11-23 08:00:00.000 UTC``), or a
    duration ago (``90s``, ``30m``, ``2h``, ``7d``)."""
    ago = _AGO.match(text)
    try:
        seconds = time.time() - float(ago[1]) * _UNIT[ago[2]] if ago else float(text)
    except ValueError:
        at = times.moment(text)
        if at is None:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time: give epoch seconds, ISO 8601 (2026-11-23T08:00)"
                " or 2h / 30m"
            ) from None
        seconds = at.timestamp()
    # NaN included; and no later than the service takes (a due time's u48 of ms), so that a dry
    # run refuses what the real run would
    if not 0 <= seconds <= LATEST_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time from 1970-01-01 UTC to the year 10889 (2^48 - 1 ms)"
        )
    return seconds


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return n


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if not 0 < x < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return x


class _Parser(argparse.ArgumentParser):
    """Options and positionals in any order (``token create demo --description x TOKEN``):
    a command without subcommands parses intermixed, one with subcommands as usual."""

    _mixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._subparsers is not None or self._mixing:
            return super().parse_known_args(args, namespace)
        self._mixing = True  # parse_known_intermixed_args calls parse_known_args itself
        try:
            return super().parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


EMBEDDED_PORT_HELP = "no pool configured: the data port of the embedded serve to use"
OPERATOR_COMMANDS = ("stats", "jobs", "dlq", "pause", "resume", "workers")
GROUP_COMMANDS = ("groups", "group")
REASONS = ("ttr_expired", "tries_exhausted", "buried", "unknown")


def _operator_parsers(sub: argparse._SubParsersAction[_Parser]) -> None:
    """stats, jobs, dlq, pause, resume, workers: they talk to a running service (``ops.py``)."""
    conn = _Parser(add_help=False)
    c = conn.add_argument_group("service")
    c.add_argument("--url", help="data API (default: $CLUSTER_DQ_URL)")
    c.add_argument("--token", help="namespace token (default: $CLUSTER_DQ_TOKEN)")
    c.add_argument("--namespace", help="namespace (default: $CLUSTER_DQ_NAMESPACE)")
    c.add_argument("--timeout", type=positive_float, default=30.0, help="per request, seconds")
    conn.add_argument("--json", action="store_true", help="print JSON")
    st = sub.add_parser("stats", parents=[conn], help="queue sizes and rates of a namespace")
    st.add_argument("--admin-url", help="admin API, for rates (default: $CLUSTER_DQ_ADMIN_URL)")
    st.add_argument("--admin-auth", help="user:password (default: $CLUSTER_DQ_ADMIN_AUTH)")
    st.add_argument(
        "--watch", type=positive_float, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C"
    )
    st.add_argument(
        "--interval",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="rate window without --watch (default 1)",
    )
    sub.add_parser("workers", parents=[conn], help="who is running what: workers, held jobs")
    jp = sub.add_parser("jobs", help="look at jobs: peek, get, dead")
    jsub = jp.add_subparsers(dest="action", required=True)
    jsub.add_parser("peek", parents=[conn], help="the head of the ready queue").add_argument(
        "queue"
    )
    jg = jsub.add_parser("get", parents=[conn], help="one job by id")
    jg.add_argument("queue")
    jg.add_argument("id")
    jd = jsub.add_parser("dead", parents=[conn], help="the dead letter, oldest death first")
    jd.add_argument("queue")
    jd.add_argument("--limit", type=positive_int, help="at most this many jobs")
    jd.add_argument("--reason", choices=REASONS)
    dp = sub.add_parser("dlq", help="redrive or delete dead jobs")
    dsub = dp.add_subparsers(dest="action", required=True)
    for action, what in (("redrive", "back to ready"), ("delete", "for good")):
        d = dsub.add_parser(action, parents=[conn], help=f"dead jobs that match, {what}")
        d.add_argument("queue")
        d.add_argument("--reason", choices=REASONS)
        d.add_argument("--since", type=when_arg, help="died at or after (epoch s, ISO, 2h)")
        d.add_argument("--until", type=when_arg, help="died at or before (epoch s, ISO, 2h)")
        d.add_argument("--limit", type=positive_int, help="at most this many jobs")
        d.add_argument("--dry-run", action="store_true", help="count the jobs that match")
        d.add_argument("--yes", "-y", action="store_true", help="do not ask")
    for name, what in (("pause", "stop deliveries"), ("resume", "deliver again")):
        p = sub.add_parser(name, parents=[conn], help=f"{what} from a queue")
        p.add_argument("queue")
        if name == "pause":  # a queue that does not exist (a typo?) is refused without it
            p.add_argument("--create", action="store_true", help="pause a queue not yet used")
    _group_parsers(sub, conn)


def _group_parsers(sub: argparse._SubParsersAction[_Parser], conn: _Parser) -> None:
    """groups, group: a queue's groups, one group's pause and limits (``ops_groups.py``)."""
    gs = sub.add_parser("groups", parents=[conn], help="a queue's groups: sizes and limits")
    gs.add_argument("queue")
    g = sub.add_parser("group", parents=[conn], help="one group: look, pause, resume, limits")
    g.add_argument("queue")
    g.add_argument("name")
    paused = g.add_mutually_exclusive_group()
    paused.add_argument(
        "--pause", dest="paused", action="store_const", const=True, help="hold its jobs back"
    )
    paused.add_argument(
        "--resume", dest="paused", action="store_const", const=False, help="deliver them again"
    )
    most = g.add_mutually_exclusive_group()
    most.add_argument(
        "--concurrency", type=positive_int, metavar="N", help="at most N of its jobs reserved"
    )
    most.add_argument("--no-concurrency", action="store_true", help="no concurrency limit")
    rate = g.add_mutually_exclusive_group()
    rate.add_argument(
        "--rate", metavar="JOBS/WINDOW", help="at most JOBS deliveries per WINDOW: 10/1s, 600/1m"
    )
    rate.add_argument("--no-rate", action="store_true", help="no rate limit")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="cluster-dq", description="A delayed task queue on Redis")
    ap.add_argument("-c", "--config", help="TOML file (default: $CLUSTER_DQ_CONFIG)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("serve", help="run the data and admin APIs")
    sp.add_argument("--host")
    sp.add_argument("--port", type=int)
    sp.add_argument("--admin-port", type=int)
    sp.add_argument("--workers", type=int)
    sp.add_argument("--redis-port", type=int, help="no pool configured: the embedded Redis's port")
    tp = sub.add_parser("token", help="create, list or delete namespace tokens")
    tp.add_argument("action", choices=["create", "list", "delete"])
    tp.add_argument("namespace")
    tp.add_argument("token", nargs="?", help="delete: the token; create: an optional custom one")
    tp.add_argument("--description", default="created by cluster-dq token")
    tp.add_argument("--pool", help="default: the token's pool: prefix, else default")
    tp.add_argument("--port", type=int, help=EMBEDDED_PORT_HELP)
    pp = sub.add_parser("pipeline", help="Spark: bulk schedule, export, analyze (extra [spark])")
    pp.add_argument("action", choices=["schedule", "export", "analyze"])
    pp.add_argument(
        "inputs", nargs="+", help="schedule: Parquet path; export: ns/q ...; analyze: events dir"
    )
    pp.add_argument("--out", help="export/analyze: Parquet output path")
    pp.add_argument("--rejects", help="schedule: Parquet path for refused rows (with reasons)")
    pp.add_argument(
        "--at", type=int, help="schedule: reference time (ms) for delay_s; reuse it to rerun"
    )
    pp.add_argument(
        "--states", default="ready,delayed,reserved,dead", help="export: states to read"
    )
    pp.add_argument("--master", default="local[2]", help="Spark master")
    pp.add_argument("--port", type=int, help=EMBEDDED_PORT_HELP)
    pp.add_argument(
        "--pool", default="default", help="schedule/export: a pool or ring, as tokens name them"
    )
    wp = sub.add_parser("wheel", help="maintenance of the wheel buckets (a downgrade)")
    wp.add_argument("action", choices=["widen"], help="widen: short entries back to whole ones")
    wp.add_argument("--port", type=int, help=EMBEDDED_PORT_HELP)
    sub.add_parser("version", help="print the version")
    _operator_parsers(sub)
    args = ap.parse_args(argv)
    if args.cmd == "version":
        print(cluster_dq.__version__)
        return 0
    if args.cmd in OPERATOR_COMMANDS:
        from cluster_dq import ops

        return ops.run(args)
    if args.cmd in GROUP_COMMANDS:
        from cluster_dq import ops_groups

        return ops_groups.run(args)
    try:
        s = _settings(args)
        logs.setup(s.LogLevel, s.LogFormat)
        if args.cmd == "serve":
            from cluster_dq import supervisor

            return supervisor.run(s, on_ready=_banner)
        if args.cmd == "pipeline" and args.action == "analyze":
            return _pipeline(s, args)
        if s.embedded:  # the Redis of the embedded serve on the named data port, or the only one
            from cluster_dq import embedded

            named = args.port is not None or s.Port != Settings().Port
            addr = embedded.find(s.Port if named else None).addr
            s = dataclasses.replace(s, Pool={"default": PoolSettings("default", Addr=addr)})
        if args.cmd == "pipeline":
            return _pipeline(s, args)
        if args.cmd == "wheel":
            return asyncio.run(_widen(s))
        if args.action == "delete" and not args.token:
            raise ConfigError("token delete needs the token")
        return asyncio.run(_token_cmd(s, args))
    except ClusterDQError as e:
        print(f"cluster-dq: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
