"""Airflow, SMTP and the Spark Connect server for the DAG tests, each in its own process.

Airflow reads its configuration once per process, so it never runs inside the pytest process:
every Airflow command runs as a subprocess with an isolated ``AIRFLOW_HOME`` (sqlite), the
repository's ``dags/`` folder, and the connections given as ``AIRFLOW_CONN_*`` variables.
The SMTP server is ``infra/smtp_sink.py``, the local stack's own, keeping each message as a file.
The Spark Connect server is ``brokerlens connect-server``, as ``infra/stack.sh`` starts it.
"""

from __future__ import annotations

import contextlib
import email
import json
import os
import signal
import socket
import subprocess
import sys
import time
from email.message import Message
from email.policy import default as default_policy
from pathlib import Path

from pulsar_broker import free_port  # below the ephemeral range (infra/pulsar/standalone.py)

REPO = Path(__file__).resolve().parents[1]
# The JVM options conftest.py gives the brokerlens processes tests start.
JIT_ENV = "BROKERLENS_SPARK__DRIVER_JAVA_OPTIONS"
VENV_BIN = Path(sys.executable).parent


def airflow_env(airflow_home: Path, brokerlens_home: Path, smtp_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BROKERLENS_")) or k == JIT_ENV}
    env.update(
        {
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",  # spark-submit and python3
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(
                {
                    "conn_type": "smtp",
                    "host": "127.0.0.1",
                    "port": smtp_port,
                    "extra": {"disable_tls": True, "disable_ssl": True, "from_email": "brokerlens@localhost", "retry_limit": 0, "timeout": 10},
                }
            ),
            "BROKERLENS_HOME": str(brokerlens_home),
            # brokerlens's own SMTP settings, for code that reads them rather than the connection.
            "BROKERLENS_SMTP__HOST": "127.0.0.1",
            "BROKERLENS_SMTP__PORT": str(smtp_port),
            "SPARK_CONF_DIR": str(REPO / "infra" / "spark"),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
    )
    env.update(extra)
    return env


def airflow(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "airflow"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=env["AIRFLOW_HOME"],
    )


class SmtpSink:
    """``infra/smtp_sink.py`` on a free port of 127.0.0.1, for the duration of a ``with``."""

    def __init__(self, maildir: Path) -> None:
        self.maildir = maildir
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "SmtpSink":
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "infra" / "smtp_sink.py"), "--port", str(self.port), "--maildir", str(self.maildir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        first = self.process.stdout.readline()  # printed once the server accepts connections
        if not first.startswith("listening on"):
            self.process.kill()
            raise RuntimeError(f"SMTP sink did not start: {first}{self.process.stdout.read()}")
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.process.stdout.close()

    def messages(self) -> list[Message]:
        return [email.message_from_bytes(p.read_bytes(), policy=default_policy) for p in sorted(self.maildir.glob("*.eml"))]


def body_text(message: Message) -> str:
    """All text parts of a message, decoded."""
    return "\n".join(part.get_content() for part in message.walk() if part.get_content_maintype() == "text")


def connect_environ(url: str) -> dict[str, str]:
    """What the DAG's tasks need to be clients of the Spark Connect server at ``url`` (sc://host:port)."""
    host, port = url.rsplit(":", 1)
    return {"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)})}


class ConnectServer:
    """``brokerlens connect-server`` on a free port (not warmed up) for the duration of a
    ``with``; :attr:`url` reaches it, :attr:`environ` is what the DAG's tasks need to."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env, self.log, self.port = env, folder / "connect-server.log", free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.environ = connect_environ(self.url)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "ConnectServer":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [str(VENV_BIN / "brokerlens"), "connect-server", "--port", str(self.port)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"Spark Connect server did not start: {self.log.read_text()[-3000:]}") from None
                time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)
