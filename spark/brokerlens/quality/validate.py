"""`brokerlens validate`: the Great Expectations suites in ``expectations/`` on a day's partitions.

One suite (JSON) per bronze and silver table, named after the table; ``layer`` runs only the
suites of that layer's tables (the daily DAG validates bronze after land and silver before gold
is built). An expectation's ``meta.severity`` is ``critical`` or ``warning`` (the default);
``meta.critical_when_landed`` (landing kinds) makes it critical on a day when one of those kinds
had files: every suite expects the day to have rows, which is only a warning on a day nothing
landed for the table. Every result is kept: a row per expectation in the ``validation_results``
table (appended, with the run time and the rows validated) and the run's JSON under
``<reports>/validation/<day>/``. A failed critical expectation raises ``StageFailed`` with a
summary of what failed; warnings are reported and do not stop the day.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from datetime import date, datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerlens.platform.frames import rows_frame
from brokerlens.platform.redact import redact
from brokerlens.platform.schemas import package_data, table_schemas
from brokerlens.platform.settings import PlatformSettings
from brokerlens.platform.spark import in_parallel, persisted
from brokerlens.platform.stage import StageFailed, StageResult
from brokerlens.platform.tables import read_table, write_table
from brokerlens.platform.times import json_default

if TYPE_CHECKING:  # Great Expectations is imported when a validation runs: it takes seconds
    from great_expectations.core import ExpectationSuiteValidationResult

log = logging.getLogger(__name__)

CRITICAL, WARNING = "critical", "warning"
ROW_COUNT = "expect_table_row_count_to_be_between"
LAYERS = ("bronze", "silver")


def expectations_dir() -> Path:
    explicit = os.environ.get("BROKERLENS_EXPECTATIONS_DIR")
    return Path(explicit) if explicit else package_data("expectations")


def load_suites(folder: Path | None = None) -> dict[str, dict]:
    folder = folder or expectations_dir()
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _context():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def _suite_run(context, table: str, suite_doc: dict, frame: DataFrame) -> Callable[[], tuple[int, ExpectationSuiteValidationResult]]:
    """A call that validates ``frame`` (the table's day) with its suite: (rows, GE's result). The
    suites run at once in threads; each table gets a data source of its own, so each has its own
    execution engine and batch (GE 1.x builds concurrent validators independently)."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=suite_doc.get("name", table), expectations=suite_doc["expectations"])
    asset = context.data_sources.add_spark(f"brokerlens-{table}").add_dataframe_asset(table)
    batch = asset.add_batch_definition_whole_dataframe("day").get_batch(batch_parameters={"dataframe": frame})

    def run() -> tuple[int, ExpectationSuiteValidationResult]:
        # Persisted only while its suite runs: a suite that never starts (an earlier one failed)
        # leaves nothing cached. The batch holds the same frame, so it reads the cache.
        with persisted(frame):
            return frame.count(), batch.validate(suite)

    return run


def _columns_read(suite_doc: dict) -> list[str] | None:
    """The columns a suite's expectations read, or None when one may read others (an expectation
    of a type that names no column and is not a row count). The verbatim JSON columns are most
    of a bronze row, and a suite's frame is cached whole while the suite runs."""
    names: list[str] = []
    for expectation in suite_doc["expectations"]:
        named = _named_columns(expectation["kwargs"])
        if named is None and expectation["type"] != ROW_COUNT:
            return None
        names += named or []
    return list(dict.fromkeys(names))


def _suite_frame(spark: SparkSession, table: str, suite_doc: dict, day: date, settings: PlatformSettings) -> DataFrame:
    """The table's day, with only the columns its suite reads (``day`` when it reads none)."""
    frame = read_table(table, spark=spark, settings=settings).where(F.col("day") == F.lit(day))
    columns = _columns_read(suite_doc)
    return frame if columns is None else frame.select(*(columns or ["day"]))


def _named_columns(kwargs: dict) -> list[str] | None:
    """The columns an expectation's arguments name (``column``, ``column_list``); None: neither."""
    if "column" in kwargs:
        return [kwargs["column"]]
    if "column_list" in kwargs:
        return list(kwargs["column_list"])
    return None


def _columns(kwargs: dict) -> str | None:
    named = _named_columns(kwargs)
    return None if named is None else ",".join(named)


def _detail(result: dict) -> str:
    if result.get("exception_info", {}).get("raised_exception"):
        return str(result["exception_info"].get("exception_message"))[:500]
    values = result.get("result", {}).get("partial_unexpected_list")
    if values:
        return "e.g. " + json.dumps(values[:5], default=str)
    observed = result.get("result", {}).get("observed_value")
    return "" if observed is None else f"observed {observed}"


def _landed(settings: PlatformSettings, day: date, kinds: list[str]) -> list[str]:
    """The landing kinds among ``kinds`` that have files for the day."""
    return [k for k in kinds if any(p.is_file() for p in (settings.landing / day.isoformat() / k).rglob("*"))]


def _severity(meta: dict, settings: PlatformSettings, day: date) -> str:
    if _landed(settings, day, meta.get("critical_when_landed", [])):
        return CRITICAL
    return meta.get("severity", WARNING)


def validate_day(spark: SparkSession, day: date, settings: PlatformSettings, layer: str | None = None) -> StageResult:
    if layer is not None and layer not in LAYERS:
        raise ValueError(f"validate layer must be one of {', '.join(LAYERS)}, not {layer!r}")
    result = StageResult(f"validate {layer}" if layer else "validate", day)
    run_at = datetime.now(timezone.utc).replace(microsecond=0)
    context = _context()
    rows, failures, warnings = [], [], []
    layers = {name: schema.layer for name, schema in table_schemas().items()}
    suites = {t: doc for t, doc in load_suites().items() if layer in (None, layers.get(t))}
    # A suite is many small Spark jobs whose time is mostly the driver's: the tables' suites run
    # at once, and their results are read in the suites' order.
    runs = [_suite_run(context, table, doc, _suite_frame(spark, table, doc, day, settings)) for table, doc in suites.items()]
    for table, (count, outcome) in zip(suites, in_parallel(spark, runs)):
        for item in outcome.results:
            doc: dict[str, Any] = item.to_json_dict()
            config = doc["expectation_config"]
            meta = config.get("meta") or {}
            severity = _severity(meta, settings, day)
            row = {
                "day": day,
                "run_at": run_at,
                "table_name": table,
                "expectation": config["type"],
                "column_name": _columns(config["kwargs"]),
                "severity": severity,
                "success": bool(item.success),
                "rows": count,
                "unexpected_count": doc.get("result", {}).get("unexpected_count"),
                "detail": _detail(doc),
            }
            rows.append(row)
            if item.success:
                continue
            if config["type"] == ROW_COUNT and count == 0:
                landed = _landed(settings, day, meta.get("critical_when_landed", []))
                line = f"{table} has no rows for {day}" + (f" although {', '.join(landed)} files landed for it" if landed else " (nothing landed for it)")
                log.warning("%s: %s", severity, line)
            else:
                line = (
                    f"{table}: {row['expectation']}({row['column_name']}) failed"
                    f" on {row['unexpected_count'] if row['unexpected_count'] is not None else '?'} of {count} rows"
                    f" {row['detail']}".rstrip()
                )
            (failures if severity == CRITICAL else warnings).append(line)
    history = rows_frame(spark, rows, read_table("validation_results", spark=spark, settings=settings).schema)
    result.writes.append(write_table(history, "validation_results", mode="append", settings=settings))
    folder = settings.reports / "validation" / day.isoformat()
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / f"{run_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    report.write_text(redact(json.dumps(rows, default=json_default, indent=1)))
    result.metrics.update(tables=len(suites), expectations=len(rows), critical_failed=len(failures), warnings=len(warnings))
    result.lines += [f"warning: {w}" for w in warnings]
    result.lines.append(f"results: {report}")
    if failures:
        raise StageFailed(f"{len(failures)} critical expectation(s) failed (results: {report}):\n" + "\n".join(f"  {f}" for f in failures))
    return result
