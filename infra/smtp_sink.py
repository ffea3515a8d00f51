"""A local SMTP server that keeps every message it receives as a file: the local stack's relay.

    python infra/smtp_sink.py --port 8025 --maildir var/mail

Each message becomes ``<maildir>/<received-at>-<n>.eml`` (RFC 5322, as sent, with the envelope
recipients added as ``X-Envelope-To``), written to a temporary name and renamed, so a reader never
sees half a message. It prints ``listening on HOST:PORT`` once it accepts connections and stops
cleanly on SIGTERM or Ctrl-C. It accepts any sender and recipient, without authentication:
bind it to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from aiosmtpd.controller import Controller


class MaildirHandler:
    def __init__(self, maildir: Path) -> None:
        self.maildir = maildir
        self.counter = itertools.count(1)
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope) -> str:
        with self.lock:
            n = next(self.counter)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.maildir / f"{stamp}-{n:05d}.eml"
        header = "".join(f"X-Envelope-To: {rcpt}\r\n" for rcpt in envelope.rcpt_tos)
        data = envelope.original_content or envelope.content
        partial = target.with_suffix(".part")
        partial.write_bytes(header.encode() + data)
        os.replace(partial, target)
        print(f"received {target.name}: from {envelope.mail_from} to {', '.join(envelope.rcpt_tos)}", flush=True)
        return "250 Message accepted for delivery"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8025)
    parser.add_argument("--maildir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.maildir.mkdir(parents=True, exist_ok=True)
    controller = Controller(MaildirHandler(args.maildir), hostname=args.host, port=args.port)
    controller.start()  # returns once the server accepts connections
    print(f"listening on {args.host}:{args.port}, keeping mail in {args.maildir}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    controller.stop()


if __name__ == "__main__":
    sys.exit(main())
