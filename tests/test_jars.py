"""The Delta Lake JARs: coordinates from the pinned packages, fetched once, a clear line when
they cannot be had."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile

import pyspark

from brokerlens.platform import jars


def test_coordinates_match_the_pinned_delta_spark_and_pyspark():
    delta = importlib.metadata.version("delta-spark")
    minor = ".".join(pyspark.__version__.split(".")[:2])
    assert jars.coordinates() == [f"io.delta:delta-spark_{minor}_2.13:{delta}", f"io.delta:delta-storage:{delta}"]


def test_cached_jars_are_used_without_fetching(monkeypatch):
    cached = jars.delta_jars()  # the session's SparkSession already fetched them
    assert [p.name for p in cached] == [
        f"io.delta_delta-spark_{c.split(':')[1].split('_', 1)[1]}-{c.split(':')[2]}.jar" if "spark" in c else f"io.delta_delta-storage-{c.split(':')[2]}.jar"
        for c in jars.coordinates()
    ]

    def no_fetch(*args, **kwargs):
        raise AssertionError("fetched although the JARs are cached")

    monkeypatch.setattr(subprocess, "run", no_fetch)
    assert jars.delta_jars() == cached


def test_unreachable_repository_is_one_clear_line(tmp_path):
    """An Ivy settings file pointing at a closed port on loopback stands for a repository that
    cannot be reached (the documented way to use a mirror: spark.jars.ivySettings)."""
    settings = tmp_path / "ivysettings.xml"
    settings.write_text(
        '<ivysettings><settings defaultResolver="dead"/><resolvers>'
        '<ibiblio name="dead" m2compatible="true" root="http://127.0.0.1:9/maven2/"/>'
        "</resolvers></ivysettings>"
    )
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.jars.ivySettings {settings}\n")
    env = {**os.environ, "BROKERLENS_JARS_DIR": str(tmp_path / "cache"), "SPARK_CONF_DIR": str(conf)}
    proc = subprocess.run([sys.executable, "-m", "brokerlens.platform.jars"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "could not fetch the Delta Lake JARs io.delta:delta-spark_" in errors[0]
    assert "Maven Central" in errors[0] and "BROKERLENS_JARS_DIR" in errors[0]
    assert proc.stdout == ""


def test_a_local_session_maps_the_class_archive_the_bootstrap_recorded(spark):
    from brokerlens.platform.jars import session_jars
    from brokerlens.platform.spark import class_archive

    archive = class_archive(session_jars())
    assert archive.is_file(), "infra/bootstrap.sh records it (python -m brokerlens.platform.spark)"
    jvm = spark.sparkContext._jvm
    assert f"-XX:SharedArchiveFile={archive}" in list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    # "sharing": the JVM mapped an archive ("mixed mode" alone with a file that is no archive).
    assert "sharing" in jvm.java.lang.System.getProperty("java.vm.info")


def test_the_connect_servers_command_has_our_jars_and_settings():
    """``brokerlens connect-server``: Spark Connect's server (our main class) by spark-submit, with
    the session's JARs, the application's and the sessions' Spark settings, on the settings'
    address and port."""
    from brokerlens.platform.connect_server import SERVER_CLASS, server_command
    from brokerlens.platform.settings import PlatformSettings, SparkSettings
    from brokerlens.platform.spark import APPLICATION_CONF, SESSION_CONF

    settings = PlatformSettings(spark=SparkSettings(master="spark://m:7077", driver_memory="3g", conf={"spark.executor.memory": "1g"}))
    command = server_command(settings, 15555)
    assert command[0].endswith("/bin/spark-submit") and command[-1] == "spark-internal"
    options = dict(zip(command[1:-1:2], command[2:-1:2]))
    assert (options["--class"], options["--master"], options["--driver-memory"]) == (SERVER_CLASS, "spark://m:7077", "3g")
    assert options["--jars"].split(",") == [str(p) for p in jars.session_jars()]
    with zipfile.ZipFile(jars.jvm_jar()) as jar:  # the main class comes with our JAR
        assert SERVER_CLASS.replace(".", "/") + ".class" in jar.namelist()
    conf = dict(value.split("=", 1) for flag, value in zip(command[1:-1], command[2:-1]) if flag == "--conf")
    spark_keys = {k: v for k, v in {**APPLICATION_CONF, **SESSION_CONF}.items() if k.startswith("spark.")}
    assert conf.items() >= spark_keys.items()
    # spark-submit would drop another key with a warning: each client's session sets it.
    assert "parquet.enable.dictionary" not in conf and SESSION_CONF["parquet.enable.dictionary"] == "false"
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1" and conf["spark.connect.grpc.binding.port"] == "15555"
    assert conf["spark.executor.memory"] == "1g" and conf["spark.sql.session.timeZone"] == "UTC"


def test_a_local_sessions_python_workers_run_this_interpreter(spark):
    """Spark starts its Python workers with PYSPARK_PYTHON: this process's interpreter (its
    packages), not the first `python3` on the PATH."""
    from pyspark.sql.functions import udf

    worker = spark.range(1).select(udf(lambda _: sys.prefix, "string")("id")).first()[0]
    assert worker == sys.prefix  # the venv, not the Python it was made from


def test_local_paths_go_through_brokerlens_file_system_without_crc_side_files(spark, tmp_path):
    """brokerlens.jvm.LocalFileSystem (file:): what Hadoop's does with a chmod or readlink
    process, with Java's file API; a Delta table written through it has no .crc side files."""
    jvm = spark.sparkContext._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == "brokerlens.jvm.LocalFileSystem"
    fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(jvm.java.net.URI("file:///"), conf)
    assert fc.getDefaultFileSystem().getClass().getName() == "brokerlens.jvm.LocalFileSystem$Fs"

    target, link = tmp_path / "target", tmp_path / "link"
    target.write_text("x")
    link.symlink_to(target)
    path = jvm.org.apache.hadoop.fs.Path
    fs.setPermission(path(str(target)), jvm.org.apache.hadoop.fs.permission.FsPermission(0o640))
    assert target.stat().st_mode & 0o7777 == 0o640
    plain, linked = fs.getFileLinkStatus(path(str(target))), fs.getFileLinkStatus(path(str(link)))
    assert (plain.isSymlink(), plain.getLen()) == (False, 1)
    assert linked.isSymlink() and linked.getSymlink().toUri().getPath() == str(target)

    table = tmp_path / "table"
    spark.range(3).write.format("delta").save(str(table))
    spark.range(3).write.format("delta").mode("overwrite").save(str(table))
    assert spark.read.format("delta").load(str(table)).count() == 3
    assert not [p.name for p in table.rglob(".*.crc")]
    assert sorted(p.name for p in (table / "_delta_log").glob("*.json")) == ["00000000000000000000.json", "00000000000000000001.json"]
