"""A real Spark standalone cluster on 127.0.0.1 (master and worker from pyspark's own launcher
classes): the daily stages run through the same spark-submit command the DAG's
StageSubmitOperator uses, with only the master changed, and as clients of a Spark Connect server
whose application runs on the cluster (the DAG's StageOperator); every gold table comes out row
for row as in local mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import pyspark
import pytest
from airflow_harness import REPO, ConnectServer, free_port
from deltalake import DeltaTable

from brokerlens.platform.jars import session_jars
from brokerlens.platform.schemas import table_schemas

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

DAY = date(2026, 11, 21)
SPARK_HOME = Path(pyspark.__file__).parent
GOLD = sorted(name for name, schema in table_schemas().items() if schema.layer == "gold")


def launch(cls: str, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(log.parent / "work")}
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), cls, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One master and one worker (2 cores, 2 GB) on loopback; the master URL."""
    logs = tmp_path_factory.mktemp("spark-cluster")
    port, ui = free_port(), free_port()
    master = launch("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui), log=logs / "master.log")
    url = f"spark://127.0.0.1:{port}"
    worker = launch(
        "org.apache.spark.deploy.worker.Worker",
        url,
        "--host",
        "127.0.0.1",
        "--cores",
        "2",
        "--memory",
        "2g",
        "--webui-port",
        str(free_port()),
        log=logs / "worker.log",
    )
    try:
        deadline = time.time() + 180
        while True:  # the master's JSON status lists the worker once it has registered
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as response:
                    if json.load(response).get("aliveworkers", 0) >= 1:
                        break
            except OSError:
                pass
            assert time.time() < deadline, (logs / "master.log").read_text()[-3000:] + (logs / "worker.log").read_text()[-3000:]
            time.sleep(1)
        yield url
    finally:
        for process in (worker, master):
            os.killpg(process.pid, 15)
            process.wait(timeout=60)


def submit(master: str, home: Path, *args: str) -> None:
    """What StageSubmitOperator runs, with the master of the spark_default connection."""
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        master,
        "--properties-file",
        str(REPO / "infra" / "spark" / "spark-defaults.conf"),
        "--conf",
        "spark.executor.memory=1g",
        "--jars",
        ",".join(str(p) for p in session_jars()),
        str(REPO / "spark" / "brokerlens" / "submit.py"),
        *args,
    ]
    env = {**os.environ, "BROKERLENS_HOME": str(home), "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def gold_rows(home: Path) -> dict[str, list[str]]:
    out = {}
    for table in GOLD:
        path = home / "lake" / table
        rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").is_dir() else []
        out[table] = sorted(repr(sorted((k, v) for k, v in r.items() if k != "ingested_at")) for r in rows)
    return out


def test_daily_stages_on_a_standalone_cluster_match_local_mode(cluster, tmp_path):
    homes = {"local": tmp_path / "local", "cluster": tmp_path / "cluster"}
    subprocess.run(
        [str(Path(sys.executable).with_name("brokerlens")), "demo-data", "--date", DAY.isoformat(), "--scale", "0.01"],
        env={**os.environ, "BROKERLENS_HOME": str(homes["local"])},
        check=True,
        capture_output=True,
        timeout=600,
    )
    (homes["cluster"]).mkdir()
    os.symlink(homes["local"] / "landing", homes["cluster"] / "landing")  # the same landing files

    def land_and_build(mode: str, master: str) -> None:
        for stage in ("land", "build"):
            submit(master, homes[mode], stage, "--date", DAY.isoformat())

    # Both modes at once: most of a spark-submit's time is one JVM's start and planning, not cores.
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(land_and_build, "local", "local[2]"), pool.submit(land_and_build, "cluster", cluster)]:
            done.result()
    # Then as Spark Connect clients, the server's application on the cluster (after the others:
    # an application takes all of the worker's cores).
    homes["connect"] = tmp_path / "connect"
    homes["connect"].mkdir()
    os.symlink(homes["local"] / "landing", homes["connect"] / "landing")
    env = {
        **os.environ,
        "BROKERLENS_HOME": str(homes["connect"]),
        "BROKERLENS_SPARK__MASTER": cluster,
        "BROKERLENS_SPARK__CONF": json.dumps({"spark.executor.memory": "1g"}),
    }
    with ConnectServer(env, tmp_path / "connect-server") as server:
        for stage in ("land", "build"):
            command = [str(Path(sys.executable).with_name("brokerlens")), stage, "--date", DAY.isoformat()]
            proc = subprocess.run(command, env={**env, "BROKERLENS_SPARK__REMOTE": server.url}, capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, proc.stderr[-5000:]
    local = gold_rows(homes["local"])
    assert local["dispatch_periods"] and local["cursor_ranges"] and local["hole_alerts"]
    for mode in ("cluster", "connect"):
        got = gold_rows(homes[mode])
        for table in GOLD:
            assert got[table] == local[table], (mode, table)
