"""A peer's Spark options for a cluster: masters, --spark-conf, the driver's address, the
checkpoint directory, the executors' code and versions. No JVM."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from peer.cli import UsageError, build_parser
from peer.cli.join import engine_options
from peer.engine.checkpoint_home import RECORD, CheckpointDirError, parse_checkpoint_uri, resolve
from peer.engine.cluster_conf import (
    ClusterError,
    Versions,
    driver_conf,
    is_cluster,
    parse_master,
    parse_spark_conf,
    version_mismatch,
)
from peer.engine.shipping import build_zip, executor_modules


@pytest.mark.parametrize("url", ["local", "local[1]", "local[*]", "local[4,2]", "spark://h:7077"])
def test_masters_a_peer_can_drive(url: str) -> None:
    assert parse_master(url) == url


def test_spark_connect_is_refused_with_why() -> None:
    with pytest.raises(ClusterError, match=r"Spark Connect.*foreachBatch.*spark://HOST:PORT"):
        parse_master("sc://h:15002")


@pytest.mark.parametrize("url", ["spark://h", "local[0]", "mesos://h:5050", "h:7077", ""])
def test_malformed_masters_say_what_to_give(url: str) -> None:
    with pytest.raises(ClusterError, match="--spark-master"):
        parse_master(url)


def test_only_local_masters_are_local() -> None:
    assert not is_cluster("local[2]") and not is_cluster("local")
    assert is_cluster("spark://h:7077") and is_cluster("yarn")


def test_spark_conf_parses_in_order_and_the_last_wins() -> None:
    conf = parse_spark_conf(
        ["spark.driver.port=7078", "spark.executor.memory=1g", "spark.executor.memory=2g"]
    )
    assert conf == {"spark.driver.port": "7078", "spark.executor.memory": "2g"}
    assert parse_spark_conf(["spark.executor.extraJavaOptions=-Da=b -Dc=d"]) == {
        "spark.executor.extraJavaOptions": "-Da=b -Dc=d"
    }


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("spark.driver.port", "KEY=VALUE"),
        ("=7078", "KEY=VALUE"),
        ("spark driver=1", "KEY=VALUE"),
        ("driver.port=1", "not a Spark setting"),
        ("spark.driver.port=", "has no value"),
    ],
)
def test_malformed_spark_conf_is_named(item: str, says: str) -> None:
    with pytest.raises(ClusterError, match=says):
        parse_spark_conf([item])


def test_a_local_master_keeps_the_loopback_driver() -> None:
    assert driver_conf("local[2]", "10.0.0.5", None) == {}
    with pytest.raises(ClusterError, match="only for a cluster master"):
        driver_conf("local[2]", "127.0.0.1", "10.0.0.5")


def test_a_cluster_driver_binds_the_listen_host_or_the_given_one() -> None:
    assert driver_conf("spark://m:7077", "10.0.0.5", None) == {
        "spark.driver.bindAddress": "10.0.0.5",
        "spark.driver.host": "10.0.0.5",
    }
    assert driver_conf("spark://m:7077", "127.0.0.1", "10.0.0.5") == {
        "spark.driver.bindAddress": "10.0.0.5",
        "spark.driver.host": "10.0.0.5",
    }
    assert driver_conf("spark://m:7077", "0.0.0.0", "peer.example") == {
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.host": "peer.example",
    }


def test_a_cluster_driver_on_loopback_or_everywhere_is_refused() -> None:
    with pytest.raises(ClusterError, match=r"loopback.*--spark-driver-host"):
        driver_conf("spark://10.1.1.1:7077", "127.0.0.1", None)
    with pytest.raises(ClusterError, match=r"every address.*--spark-driver-host"):
        driver_conf("spark://10.1.1.1:7077", "0.0.0.0", None)
    # workers of a master on loopback share this host: loopback reaches them
    assert driver_conf("spark://127.0.0.1:7077", "127.0.0.1", None)["spark.driver.host"] == (
        "127.0.0.1"
    )


def test_versions_must_agree_in_major_minor() -> None:
    driver = Versions("3.11.7", "26.0.1")
    assert version_mismatch(driver, [("w1", Versions("3.11.2", "26.0.0"))]) is None
    problem = version_mismatch(
        driver, [("w1", Versions("3.11.2", "26.0.0")), ("w2", Versions("3.10.1", "26.0.1"))]
    )
    assert problem is not None
    assert "w2 (Python 3.10.1 and pyarrow 26.0.1)" in problem
    assert "Python 3.11.7 and pyarrow 26.0.1" in problem and "w1" not in problem
    arrow = version_mismatch(driver, [("w3", Versions("3.11.7", "15.0.2"))])
    assert arrow is not None and "pyarrow 15.0.2" in arrow


def test_checkpoint_uris() -> None:
    assert parse_checkpoint_uri("file:///shared/ck") == Path("/shared/ck")
    assert parse_checkpoint_uri("/shared/ck") == Path("/shared/ck")
    assert parse_checkpoint_uri("rel/ck") == Path.cwd() / "rel" / "ck"
    with pytest.raises(CheckpointDirError, match=r"hdfs:// is not supported yet.*Mount"):
        parse_checkpoint_uri("hdfs://nn:8020/ck")
    with pytest.raises(CheckpointDirError, match="not a host"):
        parse_checkpoint_uri("file://other/ck")


def test_each_peer_takes_its_own_directory_and_finds_it_again(tmp_path: Path) -> None:
    shared = tmp_path / "nfs"
    a = resolve(tmp_path / "a", str(shared))
    b = resolve(tmp_path / "b", f"file://{shared}")
    assert a.root != b.root and a.root.parent.parent == b.root.parent.parent == shared
    assert a.root.is_dir() and b.root.is_dir()
    assert resolve(tmp_path / "a", str(shared)) == a  # restarted with the option
    assert resolve(tmp_path / "a", None) == a  # and without it
    assert resolve(tmp_path / "c", None).root == tmp_path / "c" / "checkpoints"
    record = json.loads((tmp_path / "a" / RECORD).read_text())
    assert record["base"] == str(shared)


def test_a_different_checkpoint_dir_later_is_refused(tmp_path: Path) -> None:
    resolve(tmp_path / "a", str(tmp_path / "nfs1"))
    with pytest.raises(CheckpointDirError, match=r"checkpoints are in .*nfs1"):
        resolve(tmp_path / "a", str(tmp_path / "nfs2"))
    (tmp_path / "b" / "checkpoints" / "q-1").mkdir(parents=True)
    with pytest.raises(CheckpointDirError, match="has checkpoints in"):
        resolve(tmp_path / "b", str(tmp_path / "nfs1"))
    assert not (tmp_path / "b" / RECORD).exists()  # refused: nothing changed


def _join(tmp_path: Path, *argv: str) -> tuple[dict[str, str], Path]:
    args = build_parser().parse_args(["join", "--data-dir", str(tmp_path / "d"), *argv])
    return engine_options(args, args.listen.rpartition(":")[0])


def test_join_options_become_spark_settings(tmp_path: Path) -> None:
    conf, root = _join(tmp_path)
    assert conf == {} and root == tmp_path / "d" / "checkpoints"
    conf, root = _join(
        tmp_path,
        *("--spark-master", "spark://10.1.1.1:7077", "--listen", "10.1.1.2:7700"),
        *("--spark-conf", "spark.driver.port=7078", "--checkpoint-dir", str(tmp_path / "nfs")),
    )
    assert conf == {
        "spark.driver.bindAddress": "10.1.1.2",
        "spark.driver.host": "10.1.1.2",
        "spark.driver.port": "7078",
    }
    assert root.parent.parent == tmp_path / "nfs"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--spark-master", "sc://h:15002"], "Spark Connect"),
        (["--spark-conf", "spark.executor.memory"], "KEY=VALUE"),
        (["--spark-master", "spark://10.1.1.1:7077"], "loopback"),
        (["--checkpoint-dir", "hdfs://nn/ck"], "not supported yet"),
    ],
)
def test_join_refuses_what_cannot_work(tmp_path: Path, argv: list[str], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        _join(tmp_path, *argv)


def test_help_no_longer_offers_spark_connect() -> None:
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "sc://" not in sub.choices["join"].format_help()


def test_executor_modules_hold_what_executors_import() -> None:
    modules = executor_modules()
    for name in (
        "peer",
        "peer.engine",
        "peer.engine.source",
        "peer.engine.lane_source",
        "peer.engine.lanewin",
        "peer.storage.spool_format",
        "peer.model.schema",
        "peer.engine.shipping",
    ):
        assert name in modules, name
    assert "peer.node" not in modules and "peer.federation" not in modules
    assert all(name.split(".")[0] in ("peer", "overlay", "contracts") for name in modules)


def test_the_zip_imports_on_its_own(tmp_path: Path) -> None:
    archive = build_zip(tmp_path)
    assert build_zip(tmp_path).read_bytes() == archive.read_bytes()  # same code, same bytes
    names = zipfile.ZipFile(archive).namelist()
    assert "peer/__init__.py" in names and "peer/engine/source.py" in names
    import subprocess

    # a fresh interpreter with nothing but the zip for this project (cwd elsewhere, no
    # PYTHONPATH; the editable install's finder runs after the path's): the executors' view
    code = (
        f"import sys; sys.path.insert(0, {str(archive)!r}); import peer.engine.source as s, "
        "peer.engine.lanewin, peer.engine.stateful; print(s.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(archive))


def test_doctor_checks_a_checkpoint_dir_only_with_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from peer.cli import main

    assert main(["doctor", "--quick", "--checkpoint-dir", "/shared/ck"]) == 2
    assert "give --spark-master too" in capsys.readouterr().err
