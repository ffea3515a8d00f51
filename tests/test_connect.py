"""Gold dispatch's scan from a Spark Connect client: a Connect server started by spark-submit
with the session's JARs and SQL settings (Delta's and brokerlens' extensions) runs
``periods.scan`` for a client that has no py4j, and gives the hand-worked day's numbers
(test_dispatch_scan's)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest
from airflow_harness import REPO, free_port

from brokerlens.platform.jars import session_jars
from brokerlens.platform.spark import SESSION_ZONE, SQL_CONF

pytestmark = pytest.mark.slow

SPARK_HOME = Path(pyspark.__file__).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# The client: test_dispatch_scan's worked day through periods.scan, printed as JSON rows.
CLIENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pyspark.sql import SparkSession
from test_dispatch_scan import SCHEMA, row
from brokerlens.gold.dispatch.periods import scan

spark = SparkSession.builder.getOrCreate()
rows = spark.createDataFrame([row("s1", 0, "record", 12), row("s1", 0, "debt", 5), row("s2", 0, "record", 3)], SCHEMA)
got = scan(rows).select("subscription", "t0_us", "counted_msgs", "_x_in_msgs", "_x_out_msgs").collect()
print(json.dumps({"remote": type(spark).__module__, "rows": sorted(list(r) for r in got)}))
"""


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server on loopback with brokerlens' JARs and SQL settings; its URL."""
    log = tmp_path_factory.mktemp("connect") / "server.log"
    port = free_port()
    conf = {
        **SQL_CONF,
        SESSION_ZONE: "UTC",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", "local[2]"]
    command += ["--jars", ",".join(str(p) for p in session_jars())]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    server = subprocess.Popen([*command, "spark-internal"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"the Spark Connect server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"no Spark Connect server on port {port} after 180 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


def test_a_connect_client_runs_the_dispatch_scan(connect_server):
    env = {**os.environ, "SPARK_REMOTE": connect_server}
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(REPO / "tests")], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["remote"] == "pyspark.sql.connect.session"
    # s1: the opening debt of 5, then 12 on a quota of 10 with 5 owed: 7 carried; s2: 3 of 10
    assert got["rows"] == [["s1", 0, 5, 0, 5], ["s1", 0, 12, 5, 7], ["s2", 0, 3, 0, 0]]
