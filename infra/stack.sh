#!/usr/bin/env bash
# The local stack: Airflow standalone (web UI on 127.0.0.1), an SMTP server that keeps received
# mail as files, the Spark Connect server the DAG's tasks are clients of (one Spark application,
# `brokerlens connect-server`, warmed up on a small generated day), and Spark defaults from
# infra/spark/. Everything lives under $BROKERLENS_HOME
# (default ./var): airflow/ (AIRFLOW_HOME, sqlite), mail/ (received mail), stack/ (pids, logs).
#
#   infra/stack.sh up            start the SMTP sink, the Spark Connect server and Airflow standalone,
#                                print the UI address
#   infra/stack.sh down          stop what `up` started
#   infra/stack.sh status        what is running
#   infra/stack.sh run-day DAY [--demo-data] [--spark-submit]
#                                run the daily DAG once for DAY (airflow dags test), with the
#                                SMTP sink receiving the mail, first writing demo data for DAY
#                                if asked; say step k of n as it goes; print where outputs are.
#                                --spark-submit: run brokerlens_daily_spark_submit instead (each
#                                task its own spark-submit, StageSubmitOperator), no Connect server
#
# Ports: AIRFLOW_PORT (8080), BROKERLENS_SMTP__PORT (8025), BROKERLENS_SPARK__CONNECT_PORT
# (15002). Connections come from the environment (AIRFLOW_CONN_SPARK_CONNECT_DEFAULT,
# AIRFLOW_CONN_SPARK_DEFAULT, AIRFLOW_CONN_SMTP_DEFAULT) unless already set.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
export BROKERLENS_HOME="${BROKERLENS_HOME:-$REPO/var}"
mkdir -p "$BROKERLENS_HOME"
BROKERLENS_HOME="$(cd "$BROKERLENS_HOME" && pwd)"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$BROKERLENS_HOME/airflow}"
STATE="$BROKERLENS_HOME/stack"
MAILDIR="$BROKERLENS_HOME/mail"
AIRFLOW_PORT="${AIRFLOW_PORT:-8080}"
SMTP_PORT="${BROKERLENS_SMTP__PORT:-8025}"
CONNECT_PORT="${BROKERLENS_SPARK__CONNECT_PORT:-15002}"

# spark-submit and the python it starts are the virtualenv's.
export PATH="$REPO/.venv/bin:$PATH"
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$REPO/infra/spark}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="$AIRFLOW_PORT"
export AIRFLOW__API__BASE_URL="http://127.0.0.1:$AIRFLOW_PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$AIRFLOW_PORT/execution/"
local_spark='{"conn_type": "spark", "host": "local[*]"}'
local_smtp='{"conn_type": "smtp", "host": "127.0.0.1", "port": '"$SMTP_PORT"', "extra": {"disable_tls": true, "disable_ssl": true, "from_email": "brokerlens@localhost"}}'
local_connect='{"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": '"$CONNECT_PORT"'}'
export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-$local_spark}"
export AIRFLOW_CONN_SPARK_CONNECT_DEFAULT="${AIRFLOW_CONN_SPARK_CONNECT_DEFAULT:-$local_connect}"
export AIRFLOW_CONN_SMTP_DEFAULT="${AIRFLOW_CONN_SMTP_DEFAULT:-$local_smtp}"
export BROKERLENS_SMTP__HOST="${BROKERLENS_SMTP__HOST:-127.0.0.1}"
export BROKERLENS_SMTP__PORT="$SMTP_PORT"
# The daily DAG run-day runs: the tasks Spark Connect clients, or each a spark-submit.
DAG_ID=brokerlens_daily

alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "stack: $what did not come up; see $STATE/" >&2; return 1; fi
    sleep 1
  done
}

start_smtp() {
  mkdir -p "$STATE" "$MAILDIR"
  if alive smtp; then return 0; fi
  # setsid: its own process group, so that `down` stops it and nothing else.
  setsid python "$REPO/infra/smtp_sink.py" --port "$SMTP_PORT" --maildir "$MAILDIR" \
    >"$STATE/smtp.log" 2>&1 </dev/null &
  echo $! >"$STATE/smtp.pid"
  wait_for 20 "SMTP sink" grep -q "^listening on" "$STATE/smtp.log"
}

uses_connect() { [ "$DAG_ID" != brokerlens_daily_spark_submit ]; }

start_connect_server() {  # in the background; ready once it answers and has warmed up (connect_server_ready)
  uses_connect || return 0
  mkdir -p "$STATE"
  if alive connect-server; then return 0; fi
  CONNECT_SERVER_STARTED=$SECONDS
  # setsid: its own process group; `brokerlens connect-server` execs spark-submit, which execs
  # the JVM, so the pid is the server's.
  setsid brokerlens connect-server --port "$CONNECT_PORT" >"$STATE/connect-server.log" 2>&1 </dev/null &
  echo $! >"$STATE/connect-server.pid"
}

connect_server_ready() {  # wait for the server's port, then warm it up once (a few minutes)
  uses_connect || return 0
  [ -n "${CONNECT_SERVER_STARTED:-}" ] || return 0  # up before this command: warm already
  local deadline=$((SECONDS + 300))
  until (exec 3<>"/dev/tcp/127.0.0.1/$CONNECT_PORT") 2>/dev/null; do
    if ! alive connect-server || [ "$SECONDS" -ge "$deadline" ]; then
      echo "stack: the Spark Connect server did not come up; see $STATE/connect-server.log:" >&2
      tail -5 "$STATE/connect-server.log" >&2; return 1
    fi
    sleep 1
  done
  BROKERLENS_SPARK__REMOTE="sc://127.0.0.1:$CONNECT_PORT" brokerlens --quiet warm-up >>"$STATE/connect-server.log" 2>&1 \
    || { echo "stack: warming up the Spark Connect server failed; see $STATE/connect-server.log" >&2; return 1; }
  echo "stack: Spark Connect server ready on sc://127.0.0.1:$CONNECT_PORT in $((SECONDS - CONNECT_SERVER_STARTED)) s (warm-up included; $STATE/connect-server.log)"
  CONNECT_SERVER_STARTED=""
}

group_alive() {  # any live (non-zombie) process left in process group $1
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ {found = 1} END {exit !found}'
}

stop() {  # stop NAME: TERM its process group (Airflow's scheduler, API server...), KILL after 60 s
  local name="$1" pid
  [ -f "$STATE/$name.pid" ] || return 0
  pid="$(cat "$STATE/$name.pid")"
  if group_alive "$pid"; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 60); do group_alive "$pid" || break; sleep 1; done
    if group_alive "$pid"; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
    echo "stack: stopped $name"
  fi
  rm -f "$STATE/$name.pid"
}

migrate_once() {
  [ -f "$AIRFLOW_HOME/airflow.db" ] && return 0
  mkdir -p "$AIRFLOW_HOME"
  echo "stack: creating the Airflow database in $AIRFLOW_HOME" >&2
  airflow db migrate >"$STATE/migrate.log" 2>&1 || { cat "$STATE/migrate.log" >&2; return 1; }
}

up() {
  start_smtp
  echo "stack: SMTP sink on 127.0.0.1:$SMTP_PORT, mail kept in $MAILDIR"
  start_connect_server
  connect_server_ready
  if ! alive airflow; then
    mkdir -p "$AIRFLOW_HOME"
    # Two cores are enough for one day's run: a few task slots, not Airflow's default 32.
    AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}" \
      setsid airflow standalone >"$STATE/airflow.log" 2>&1 </dev/null &
    echo $! >"$STATE/airflow.pid"
    wait_for 300 "Airflow" curl -fsS "http://127.0.0.1:$AIRFLOW_PORT/api/v2/monitor/health"
  fi
  echo "stack: Airflow UI on http://127.0.0.1:$AIRFLOW_PORT (user admin; password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
  echo "stack: DAGs from $REPO/dags (paused at creation: unpause brokerlens_daily, or brokerlens_daily_spark_submit, not both, to start catch-up from \$BROKERLENS_START_DATE); logs in $STATE/"
}

status() {
  for name in smtp connect-server airflow; do
    if alive "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
  done
}

dag_run_tasks() {  # tasks of the DAG's latest run, from the stack's sqlite metastore
  python - "$AIRFLOW_HOME/airflow.db" "$DAG_ID" <<'PY'
import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as db:
    print(db.execute("SELECT count(*) FROM task_instance WHERE dag_id = ? AND run_id = (SELECT run_id FROM dag_run "
                     "WHERE dag_id = ? ORDER BY id DESC LIMIT 1)", (sys.argv[2], sys.argv[2])).fetchone()[0])
PY
}

follow_steps() {  # follow_steps STEPS_BEFORE: read `airflow dags test` output, say which step is
  # running, how long the last one took, the stages' progress and error lines; the full output
  # is in the log file (tee).
  local k="$1" n="?" task="" state="" started=$SECONDS line
  while IFS= read -r line; do
    case "$line" in
      *"[DAG TEST] starting task_id="*)
        # The run's task instances exist once its first task starts (not yet at "Created dag run").
        [ "$n" != "?" ] || n=$(( $1 + $(dag_run_tasks 2>/dev/null || echo 0) ))
        task="${line#*task_id=}"; task="${task%% *}"; k=$((k + 1)); started=$SECONDS; state=""
        echo "step $k of $n: $task" ;;
      *"new_state="*) state="${line#*new_state=}"; state="${state%% *}" ;;
      *"[DAG TEST] end task task_id="*)
        echo "step $k of $n: $task ${state:-finished} in $((SECONDS - started)) s" ;;
      *"INFO brokerlens.platform.progress: "*) line="${line#*INFO brokerlens.platform.progress: }"; echo "    ${line%% \[airflow.*}" ;;
      *"] error: "*) line="${line#*] error: }"; echo "    error: ${line%% \[airflow.*}" ;;
    esac
  done
}

run_day() {  # run_day DAY [--demo-data] [--spark-submit]
  local day="$1" demo="" marker first=0 started arg
  shift
  for arg in "$@"; do
    case "$arg" in
      --demo-data) demo="$arg" ;;
      --spark-submit) DAG_ID=brokerlens_daily_spark_submit ;;
      *) echo "usage: $0 run-day YYYY-MM-DD [--demo-data] [--spark-submit]" >&2; return 2 ;;
    esac
  done
  mkdir -p "$STATE"
  # What this run starts, it stops at the end (a stack that is `up` keeps running).
  RUN_STARTED=()
  if uses_connect && ! alive connect-server; then start_connect_server; RUN_STARTED+=(connect-server); fi
  if ! alive smtp; then start_smtp; RUN_STARTED+=(smtp); fi
  trap 'for name in "${RUN_STARTED[@]}"; do stop "$name" >/dev/null; done' EXIT
  migrate_once
  marker="$STATE/run-$day.started"; touch "$marker"
  if [ "$demo" = "--demo-data" ]; then
    first=1; started=$SECONDS
    echo "step 1: demo-data $day"
    brokerlens --quiet demo-data --date "$day" >"$STATE/demo-$day.log" || { cat "$STATE/demo-$day.log" >&2; return 1; }
    echo "step 1: demo-data done in $((SECONDS - started)) s ($STATE/demo-$day.log)"
  fi
  connect_server_ready
  echo "stack: airflow dags test $DAG_ID $day (full log: $STATE/run-$day.log)"
  local rc=0
  airflow dags test "$DAG_ID" "$day" 2>&1 | tee "$STATE/run-$day.log" | follow_steps "$first" || rc=$?
  echo
  echo "tables:   $BROKERLENS_HOME/lake/ ($(find "$BROKERLENS_HOME/lake" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l) Delta tables; brokerlens tables, brokerlens sql \"...\")"
  echo "report:   $(find "$BROKERLENS_HOME/reports" -type f -newer "$marker" 2>/dev/null | sort | tr '\n' ' ')"
  echo "mail:     $(find "$MAILDIR" -name '*.eml' -newer "$marker" 2>/dev/null | wc -l) message(s) received in $MAILDIR:"
  find "$MAILDIR" -name '*.eml' -newer "$marker" 2>/dev/null | sort | while read -r f; do
    echo "          $f  $(grep -m1 '^Subject:' "$f" | cut -c1-100)"
  done
  echo "task log: $STATE/run-$day.log"
  return "$rc"
}

case "${1:-}" in
  up) up ;;
  down) stop airflow; stop connect-server; stop smtp ;;
  status) status ;;
  run-day) [ -n "${2:-}" ] || { echo "usage: $0 run-day YYYY-MM-DD [--demo-data] [--spark-submit]" >&2; exit 2; }; shift; run_day "$@" ;;
  *) echo "usage: $0 up|down|status|run-day YYYY-MM-DD [--demo-data] [--spark-submit]" >&2; exit 2 ;;
esac
