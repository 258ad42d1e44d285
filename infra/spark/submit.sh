#!/usr/bin/env bash
# Runs `bkaudit stream` on a Spark cluster (standalone, YARN) with spark-submit, driver in client mode on
# this host: the driver does the sink work (Delta writes to the lakehouse, bookie probes, alerts), so this
# host needs the lakehouse disk and network access to Kafka and to every bookie's bookie-rpc port.
#
# Prerequisites (infra/README.md, "On a Spark cluster"):
#   - a virtualenv on this host with bkaudit installed (the driver's Python), same Python version as the
#     executors' (3.11 or 3.12);
#   - that environment packed for the executors (venv-pack -p /opt/bkaudit/venv -o bkaudit-env.tar.gz);
#   - an executor settings file with the `kafka:` section (the executors read the changes topic themselves);
#   - BKAUDIT_* settings for the driver in the environment or BKAUDIT_CONFIG_FILE;
#   - the checkpoint root on storage every executor reaches (HDFS, or NFS mounted at the same path).
#
# Usage: SPARK_MASTER=spark://spark-master:7077 infra/spark/submit.sh [--available-now]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${SPARK_MASTER:?set SPARK_MASTER to the master URL of the cluster (spark://host:7077, yarn)}"
: "${BKAUDIT_VENV:=/opt/bkaudit/venv}"
: "${BKAUDIT_ENV_ARCHIVE:=/opt/bkaudit/bkaudit-env.tar.gz}"
: "${BKAUDIT_EXECUTOR_CONFIG:=/etc/bkaudit/executor.yaml}"
: "${DRIVER_MEMORY:=4g}"
: "${EXECUTOR_MEMORY:=2g}"
: "${EXECUTOR_CORES:=2}"
: "${TOTAL_EXECUTOR_CORES:=4}"

for required in "$BKAUDIT_VENV/bin/python" "$BKAUDIT_ENV_ARCHIVE" "$BKAUDIT_EXECUTOR_CONFIG"; do
  [[ -e "$required" ]] || { echo "submit.sh: $required does not exist (see infra/README.md)" >&2; exit 2; }
done
case "$BKAUDIT_EXECUTOR_CONFIG" in
  *.yaml | *.yml | *.toml | *.json) ;;
  *) echo "submit.sh: BKAUDIT_EXECUTOR_CONFIG must end in .yaml, .yml, .toml or .json" >&2; exit 2 ;;
esac

# The session helper sets the master itself (streaming/session.py): keep it equal to --master. Executors
# run the packed environment's Python; the session would otherwise point them at this host's interpreter.
export BKAUDIT_SPARK__MASTER="$SPARK_MASTER"
export BKAUDIT_SPARK__EXTRA_CONF='{"spark.executorEnv.PYSPARK_PYTHON": "./environment/bin/python"}'

# --files puts the executor settings file in every executor's working directory; BKAUDIT_CONFIG_FILE
# names it relative to that directory. Secrets in it stay out of command lines and the Spark UI.
exec "$BKAUDIT_VENV/bin/spark-submit" \
  --master "$SPARK_MASTER" \
  --deploy-mode client \
  --name bkaudit-stream \
  --driver-memory "$DRIVER_MEMORY" \
  --executor-memory "$EXECUTOR_MEMORY" \
  --executor-cores "$EXECUTOR_CORES" \
  --total-executor-cores "$TOTAL_EXECUTOR_CORES" \
  --archives "$BKAUDIT_ENV_ARCHIVE#environment" \
  --files "$BKAUDIT_EXECUTOR_CONFIG" \
  --conf spark.pyspark.python=./environment/bin/python \
  --conf spark.pyspark.driver.python="$BKAUDIT_VENV/bin/python" \
  --conf spark.executorEnv.BKAUDIT_CONFIG_FILE="$(basename "$BKAUDIT_EXECUTOR_CONFIG")" \
  --conf spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage=true \
  --conf spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB=512 \
  "$here/bkaudit_stream.py" "$@"
