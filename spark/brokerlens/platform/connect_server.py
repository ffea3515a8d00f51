"""A Spark Connect server for brokerlens: ``brokerlens connect-server``.

Spark's own long-running driver (Spark Connect, shipped in pyspark's JARs), started by pyspark's
``spark-submit`` with brokerlens' JARs (Delta's and our own) and the application's and sessions'
settings (``platform.spark``). Its main class is ours (``ConnectServer.scala``): Spark's own
(``SparkConnectServer``) gives each session a class loader of its own, so each new session,
each stage, compiled its queries' code again. A stage then runs in its caller's process, an Airflow
task or a shell, as a client of it (``spark.remote``): each client is a session of its own, so
several days run at once on one driver, and its Spark jobs carry the client's tags, by which they
are cancelled.

It listens on 127.0.0.1 unless ``spark.connect_host`` says otherwise; Spark Connect has no
authentication of its own, so a server on another address belongs behind an authenticating
proxy (docs/operations.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyspark

from .jars import session_jars
from .settings import PlatformSettings
from .spark import application_conf, java_options, split_application_conf

SERVER_CLASS = "brokerlens.jvm.ConnectServer"
SPARK_HOME = Path(pyspark.__file__).parent


def server_command(settings: PlatformSettings, port: int | None = None) -> list[str]:
    """spark-submit's command line for the server of ``settings`` (on ``port`` if given)."""
    spark = settings.spark
    conf = {
        "spark.driver.host": spark.connect_host,
        "spark.driver.bindAddress": spark.connect_host,
        "spark.connect.grpc.binding.address": spark.connect_host,
        "spark.connect.grpc.binding.port": str(port or spark.connect_port),
        "spark.executor.extraJavaOptions": java_options(),
        # Each client's session sets the rest itself (connect(), SESSION_CONF).
        **split_application_conf(application_conf(settings))[0],
    }
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", spark.app_name]
    command += ["--master", spark.master, "--driver-memory", spark.driver_memory]
    command += ["--driver-java-options", f"{java_options()} {spark.driver_java_options}".strip()]
    command += ["--jars", ",".join(str(p) for p in session_jars())]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def server_environ() -> dict[str, str]:
    """The server's environment: pyspark's Spark, and this Python for its Python workers (a
    client's Python functions are unpickled there, brokerlens' own among them)."""
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}


def exec_server(settings: PlatformSettings, port: int | None = None) -> None:
    """Become the server: this process's pid is the server's (spark-submit execs the JVM), so
    whatever started it stops it by that pid."""
    command = server_command(settings, port)
    os.execve(command[0], command, server_environ())
