"""`make bench`: speed and memory of the dispatch stages at scale, against reference points.

For each size (a generated day of one-second throttling periods for broker, topic-partition
and subscription scopes), on the same Parquet input:

* ``plain_pass``: read, repartition by scope, sort by period within partitions, write
  Parquet. The floor for any computation that needs each scope's periods in order.
* ``dispatch_periods``: the gold computation (``brokerlens.gold.dispatch.periods.dispatch_periods``).
* ``duckdb``: the same over-delivery and debt computation in DuckDB SQL (one row per record,
  empty periods drained through the integrated quota, running sum and running minimum:
  Lindley's recursion), same cores, output also to Parquet.
* at the ``variant_sizes``: dispatch_periods again under candidate Spark settings (``VARIANTS``).

Then three consecutive days through the real table layer (is day N+1 slower as history
accumulates?), the landing stage on demo data, and windows of a large cluster's generated day
(``large_cluster``, ``large_files``) through every daily step, projected to 50,000 partitions.
Then the demo day through the real daily DAG (``dag``): its tasks Spark Connect clients, each a
spark-submit, and alternated with the last commit whose tasks ran on brokerlens' own stage server.
Last, the interceptor section (``interceptor``): a live Pulsar 4.0.7 standalone's dispatch
throughput without and with brokerlens' broker interceptor, alternated round by round.
Results: ``var/bench/results.json``.

Memory: peak RSS of the driver JVM (in ``local[*]`` it also runs the tasks), of the Python
driver process and of Spark's Python workers, and the JVM's heap in use, sampled every 0.1 s by a
thread; the peak of the JVM's old generation per stage from its memory pool MXBeans (reset before
each stage).
"""

from .dag import spark_applications, task_fixed_cost
from .generate import CLUSTER, Topology, generate_day, write_input
from .harness import VARIANTS
from .large import project_day
from .markdown import markdown, write_page
from .run import failed_sections, run, targets
from .stages import duckdb_dispatch, spark_dispatch

__all__ = [
    "CLUSTER",
    "VARIANTS",
    "Topology",
    "duckdb_dispatch",
    "failed_sections",
    "generate_day",
    "markdown",
    "project_day",
    "run",
    "spark_applications",
    "spark_dispatch",
    "targets",
    "task_fixed_cost",
    "write_input",
    "write_page",
]
