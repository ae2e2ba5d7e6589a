"""Settings: TOML + CLUSTER_DQ_* overrides, every bad key or value refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_dq.errors import ConfigError
from cluster_dq.settings import load


def test_toml_and_env_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'Port = 9000\nTTRSecond = 30\n[Accounts]\nadmin = "pw"\n'
        '[Pool.default]\nAddr = "127.0.0.1:7000"\n[Pool.other]\nAddr = "127.0.0.1:7001"\n'
        'MasterName = "m"\n'
    )
    s = load(
        cfg,
        {
            "CLUSTER_DQ_PORT": "9100",
            "CLUSTER_DQ_POOL__OTHER__DB": "2",
            "CLUSTER_DQ_ENABLEACCESSLOG": "true",
        },
    )
    assert (s.Port, s.TTRSecond, s.EnableAccessLog) == (9100, 30, True)
    assert s.Accounts == {"admin": "pw"}
    assert s.Pool["other"].DB == 2 and s.Pool["other"].kind == "sentinel"
    assert s.Pool["default"].addresses() == [("127.0.0.1", 7000)]
    assert load(None, {}).embedded


def test_rings_and_migration(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[Pool.default]\nAddr = "127.0.0.1:7000"\n[Pool.a]\nAddr = "127.0.0.1:7001"\n'
        '[Pool.b]\nAddr = "127.0.0.1:7002"\nMigrateTo = "a"\n'
        '[Ring.big]\nPools = ["a", "default"]\n'
    )
    s = load(
        cfg, {"CLUSTER_DQ_RING__BIG__PREVIOUSPOOLS": "a, b", "CLUSTER_DQ_RING__SMALL__POOLS": "b"}
    )
    assert s.Ring["big"].Pools == ("a", "default") and s.Ring["big"].PreviousPools == ("a", "b")
    assert s.Ring["small"].Pools == ("b",)
    assert s.Pool["b"].MigrateTo == "a"


@pytest.mark.parametrize(
    ("text", "env", "names"),
    [
        ("Prot = 1", {}, "Prot"),
        ('Port = "x"', {}, "Port"),
        ("", {"CLUSTER_DQ_PORT": "seven"}, "Port"),
        ("", {"CLUSTER_DQ_NOPE": "1"}, "CLUSTER_DQ_NOPE"),
        ("Workers = 0", {}, "Workers"),
        ('[Pool.default]\nAddr = "nohost"', {}, "Pool.default.Addr"),
        ('[Pool.x]\nAddr = "127.0.0.1:1"', {}, "Pool.default"),
        ('[Pool.default]\nAddr = "127.0.0.1:1"\nColor = 1', {}, "Pool.default.Color"),
        ("TTLSecond = 5\nDelaySecond = 10", {}, "TTLSecond"),
        ("Port = [", {}, "c.toml"),
        ("SizeIntervalSecond = 0", {}, "SizeIntervalSecond"),
        ("ReconcileSecond = -1", {}, "ReconcileSecond"),
        ('[Pool.default]\nAddr = "127.0.0.1:1"\nWaitReplicas = -1', {}, "WaitReplicas"),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.new]\nAddr = "127.0.0.1:2"\n'
            "[Pool.default.x]\n",
            {},
            "Pool.default",
        ),
        ('[Pool.default]\nAddr = "127.0.0.1:1"\nMigrateTo = "nope"', {}, "Pool.default.MigrateTo"),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\nMigrateTo = "default"',
            {},
            "Pool.default.MigrateTo",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\nMigrateTo = "default"\n[Pool.b]\nAddr = "127.0.0.1:3"\nMigrateTo = "a"',
            {},
            "Pool.b.MigrateTo",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.a]\nPools = ["default"]',
            {},
            "Ring.a",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.r]\nPools = []',
            {},
            "Ring.r.Pools",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.r]\nPools = ["a", "zz"]',
            {},
            "Ring.r.Pools: unknown pool 'zz'",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.r]\nPools = ["a", "a"]',
            {},
            "Ring.r.Pools: a pool is listed twice",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.r]\nPools = ["a"]\nPreviousPools = ["x"]',
            {},
            "Ring.r.PreviousPools",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.r]\nPools = 3',
            {},
            "Ring.r.Pools: expected a list",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring.r]\nPools = ["a"]\nWeight = 2',
            {},
            "Ring.r.Weight",
        ),
        (
            '[Pool.default]\nAddr = "127.0.0.1:1"\n[Pool.a]\nAddr = "127.0.0.1:2"\n[Ring]\nr = 1',
            {},
            "Ring.r",
        ),
    ],
)
def test_bad_settings_name_the_key(
    tmp_path: Path, text: str, env: dict[str, str], names: str
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        load(cfg, env)
    assert names in str(e.value)


P = '[Pool.default]\nAddr = "127.0.0.1:1"\n'


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("TTRSecond = -1", "TTRSecond"),
        ("TTRSecond = 0", "TTRSecond"),
        ("TTRSecond = 4294967296", "TTRSecond"),
        ("TimeoutSecond = 700", "TimeoutSecond"),
        ("TimeoutSecond = -1", "TimeoutSecond"),
        ("MaxTimeoutSecond = -1", "MaxTimeoutSecond"),
        ("MaxTimeoutSecond = 99999999", "MaxTimeoutSecond"),
        ("TokenCacheSecond = -1", "TokenCacheSecond"),
        ("TokenCacheSecond = nan", "TokenCacheSecond"),
        ("TokenCacheSecond = inf", "TokenCacheSecond"),
        ("DelaySecond = -10", "DelaySecond"),
        ("DelaySecond = 4294967296\nTTLSecond = 0", "DelaySecond"),
        ("TTLSecond = -1", "TTLSecond"),
        ("TTLSecond = 4294967296", "TTLSecond"),
        ("TTLSecond = 10\nDelaySecond = 10", "TTLSecond"),
        ("TriesNum = 0", "TriesNum"),
        ("MaxBodyBytes = 0", "MaxBodyBytes"),
        ("MaxBodyBytes = 1099511627776", "MaxBodyBytes"),
        ("Workers = 100000", "Workers"),
        ("SizeIntervalSecond = inf", "SizeIntervalSecond"),
        ("ReconcileSecond = nan", "ReconcileSecond"),
        ("AckedIdMemorySecond = -1", "AckedIdMemorySecond"),
        (P + "PoolSize = 0", "Pool.default.PoolSize"),
        (P + "PoolSize = -5", "Pool.default.PoolSize"),
        (P + "WaitTimeoutMs = 100000000000", "Pool.default.WaitTimeoutMs"),
        (P + "WaitTimeoutMs = -1", "Pool.default.WaitTimeoutMs"),
        # 0: WAIT blocks until the replicas answer, however long; 5000 and more: the socket
        # timeout (5 s) ends the WAIT first, so each durable write answered 503 at once
        (P + "WaitTimeoutMs = 0", "Pool.default.WaitTimeoutMs"),
        (P + "WaitTimeoutMs = 5000", "Pool.default.WaitTimeoutMs"),
        (P + "WaitReplicas = 1000", "Pool.default.WaitReplicas"),
        (P + "DB = -1", "Pool.default.DB"),
    ],
)
def test_settings_outside_the_api_bounds_are_refused(tmp_path: Path, text: str, names: str) -> None:
    """Every setting is checked against what the API applies to the same value (issue 14)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        load(cfg, {})
    assert names in str(e.value)


def test_settings_at_the_bounds_are_accepted(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "TTRSecond = 1\nTimeoutSecond = 600\nTokenCacheSecond = 0\nDelaySecond = 0\n"
        "TTLSecond = 0\nMaxBodyBytes = 1048576\n" + P + "PoolSize = 1\nWaitTimeoutMs = 4000\n"
    )
    s = load(cfg, {})
    assert s.TTRSecond == 1 and s.Pool["default"].PoolSize == 1


def test_the_engine_config_comes_from_the_settings() -> None:
    """One frozen engine config per deployment, from its settings: the service, the pump, the
    CLI and the Spark pipeline all place a queue on the same shard."""
    import asyncio
    import dataclasses

    from cluster_dq.engine.commands import EngineConfig
    from cluster_dq.server import Runtime

    s = load(
        None,
        {
            "CLUSTER_DQ_SHARDS": "4",
            "CLUSTER_DQ_ACKEDIDMEMORYSECOND": "5",
            "CLUSTER_DQ_POOL__DEFAULT__ADDR": "127.0.0.1:1",
        },
    )
    config = EngineConfig.from_settings(s)
    assert (config.shards, config.remember_acked_ms) == (4, 5_000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.shards = 16  # type: ignore[misc]
    runtime = Runtime(s, run_pump=False)  # nothing connects before start()
    try:
        engine = runtime.pools["default"].engine
        assert (engine.config.shards, engine.config.remember_acked_ms) == (4, 5_000)
    finally:
        asyncio.run(runtime.close())


# What the README tells a user to export for the Python client, the worker and the operator
# commands: the same shell then runs `cluster-dq serve` and `cluster-dq token`.
README_CLIENT_VARIABLES = {
    "CLUSTER_DQ_URL": "http://127.0.0.1:7777",
    "CLUSTER_DQ_TOKEN": "01M84CYB1XRC6XC6YRM8P6CD3H",
    "CLUSTER_DQ_NAMESPACE": "demo",
    "CLUSTER_DQ_ADMIN_URL": "http://127.0.0.1:7778",
    "CLUSTER_DQ_ADMIN_AUTH": "ops:secret",
}


def test_the_client_variables_are_left_to_the_client() -> None:
    s = load(None, {**README_CLIENT_VARIABLES, "CLUSTER_DQ_PORT": "9100"})
    assert s.Port == 9100 and s == load(None, {"CLUSTER_DQ_PORT": "9100"})


@pytest.mark.parametrize(
    "name", ["CLUSTER_DQ_PROT", "CLUSTER_DQ_URLS", "CLUSTER_DQ_ADMINURL", "CLUSTER_DQ_TOKEN__X"]
)
def test_a_near_miss_of_a_client_variable_or_a_setting_is_still_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown environment setting {name}$"):
        load(None, {**README_CLIENT_VARIABLES, name: "1"})


def test_the_embedded_redis_port() -> None:
    assert load(None, {}).EmbeddedRedisPort == 0  # a free port
    assert load(None, {"CLUSTER_DQ_EMBEDDEDREDISPORT": "17555"}).EmbeddedRedisPort == 17555
    for env, message in (
        ({"CLUSTER_DQ_EMBEDDEDREDISPORT": "70000"}, "EmbeddedRedisPort: 70000 is not a port"),
        (
            {"CLUSTER_DQ_EMBEDDEDREDISPORT": "17555", "CLUSTER_DQ_POOL__DEFAULT__ADDR": "h:1"},
            "EmbeddedRedisPort: only in embedded mode",
        ),
    ):
        with pytest.raises(ConfigError, match=message):
            load(None, env)
