#!/usr/bin/env bash
# The real engines beam_agents runs on, fetched from the registries and cached under
# .cache/engines/ (re-running is cheap: what is cached is reused).
#
#   bash tools/engines.sh fetch           fetch and cache everything below (Go module, Maven jars)
#   bash tools/engines.sh prism           build Beam's Prism runner, print its path
#   bash tools/engines.sh prism-options   the pipeline options that run a pipeline on Prism
#   bash tools/engines.sh worker          build a Dataflow-like Python SDK worker, print the
#                                         command that starts one
#   bash tools/engines.sh worker-options  the pipeline options that run a job's Python code in
#                                         that worker (a PROCESS environment) instead of
#                                         LOOPBACK: staged packages installed as on Dataflow
#   bash tools/engines.sh start SERVICE   start kafka, java (the expansion service; each
#                                         job starts its own Java harness) or flink (session cluster and Beam job
#                                         server); waits until it is ready
#   bash tools/engines.sh start kafka --keep-data
#                                         restart the broker on the data of its last run
#   bash tools/engines.sh stop SERVICE [--kill]
#                                         stop it by the PIDs its start recorded (SIGTERM,
#                                         or SIGKILL: a crash, `stop kafka --kill` then
#                                         `start kafka --keep-data` a broker that died)
#   bash tools/engines.sh restart-taskmanager [--kill]
#                                         stop (SIGTERM, or SIGKILL) the Flink task manager
#                                         alone and start a new one
#   bash tools/engines.sh add-taskmanager | remove-taskmanager
#                                         start or stop a second task manager (for a job
#                                         at parallelism 2)
#   bash tools/engines.sh restart-jobmanager [--kill]
#                                         stop (SIGTERM, or SIGKILL) the Flink job manager
#                                         alone and start a new one; without HA it forgets
#                                         its jobs: restore them from their retained
#                                         checkpoints (`latest-checkpoint JOB_ID`)
#   bash tools/engines.sh restart-jobserver [--kill]
#                                         stop (SIGTERM, or SIGKILL) Beam's Flink job server
#                                         alone and start a new one
#   bash tools/engines.sh harnesses       the PIDs of the running jobs' Java SDK harnesses
#   bash tools/engines.sh kill-workers    SIGKILL the running jobs' Java SDK harnesses
#   bash tools/engines.sh freeze-workers | thaw-workers
#                                         SIGSTOP / SIGCONT the running jobs' Java SDK
#                                         harnesses: a Kafka read that emits nothing while
#                                         its job runs (a stall)
#   bash tools/engines.sh latest-checkpoint JOB_ID
#                                         the newest complete checkpoint of a job, a path to
#                                         pass as --savepoint_path
#   bash tools/engines.sh status          which services run, with their PIDs
#   bash tools/engines.sh endpoints       the addresses the services listen on (KEY=VALUE)
#   bash tools/engines.sh flink-options   the pipeline options that run a pipeline on Flink
#   bash tools/engines.sh flink-demo [ARGS]  start all three, run `beam-agents demo --bus kafka
#                                         ARGS` on Flink, stop what it started (`--console`:
#                                         a person approves in beam-agents console)
#
# The worker is what a Dataflow worker runs, without its container: Beam's own Python boot
# program (github.com/apache/beam/sdks/v2/python/container, the container's
# /opt/apache/beam/boot, built like Prism) over a virtual environment that holds apache-beam
# and its dependencies at the versions and hashes of requirements_lock.txt and nothing else.
# Each worker runs in a fresh environment layered over that one and deleted when it stops, as
# the boot program makes one per worker on Dataflow; the boot program installs the job's
# staged artifacts there with pip (--requirements_file, then --extra_package, then
# --setup_file's tarball) before it starts the SDK harness.
# Prism is github.com/apache/beam/sdks/v2/go/cmd/prism at the Beam version of
# requirements_lock.txt, built from the Go module proxy; `go install` checks every module
# against the Go checksum database. Pipelines start and stop Prism themselves.
# The Java engines are the runtime closures of the POMs under tools/engines/, every version
# pinned there, fetched with Maven's strict checksum policy (a jar whose registry checksum
# does not match fails the fetch). Logs go to .cache/engines/logs/SERVICE*.log and PIDs to
# .cache/engines/run/SERVICE.pids; everything listens on 127.0.0.1 only.
# BEAM_AGENTS_FLINK_TM_JAVA_FLAGS adds JVM flags to the task managers, for example
# -Dorg.slf4j.simpleLogger.log.org.apache.beam.runners.flink=debug to see Beam's runner set and
# fire its timers and start and finish its bundles.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/engines"
logs="$cache/logs"
run="$cache/run"
beam_version="$(sed -n 's/^apache-beam==\([0-9.]*\).*/\1/p' "$root/requirements_lock.txt")"

# BEAM_AGENTS_ENGINES_PORT_OFFSET moves every port, so two checkouts on one machine can each
# run their own engines.
offset="${BEAM_AGENTS_ENGINES_PORT_OFFSET:-0}"
kafka_port=$((19092 + offset))
kafka_controller_port=$((19093 + offset))
expansion_port=$((18096 + offset))
flink_rest_port=$((18081 + offset))
flink_rpc_port=$((16123 + offset))
job_port=$((18099 + offset))
artifact_port=$((18098 + offset))

die() { echo "tools/engines.sh: $*" >&2; exit 1; }

prism() {
  local home="$cache/prism-$beam_version"
  if [[ ! -x "$home/prism" ]]; then
    mkdir -p "$home"
    echo "tools/engines.sh: building Prism $beam_version with Go from the Go module proxy (about 3 CPU-minutes of compiling, once)" >&2
    GOBIN="$home" GOFLAGS=-mod=mod \
      go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v$beam_version" >&2
  fi
  echo "$home/prism"
}

# The lock's requirements that apache-beam needs: apache-beam and, transitively, every
# requirement whose "# via" names one already needed (the lock is uv's, annotated).
beam_closure() {
  python3 - "$root/requirements_lock.txt" <<'PY'
import re
import sys

entries = {}
for block in re.split(r"\n(?=[^\s#])", open(sys.argv[1]).read()):
    head = re.match(r"([A-Za-z0-9._-]+)==", block)
    if head:
        via = re.findall(r"#\s+(?:via\s+)?([A-Za-z0-9._-]+)\s*$", block, re.M)
        entries[head.group(1).lower()] = (block.rstrip(), {name.lower() for name in via})
needed, grew = {"apache-beam"}, True
while grew:
    grew = False
    for name, (_, via) in entries.items():
        if name not in needed and via & needed:
            needed.add(name)
            grew = True
print("\n".join(entries[name][0] for name in sorted(needed)))
PY
}

# The interpreter the project's .venv was made from (tools/dev.sh), so pickles cross one
# Python version.
interpreter() {
  if [[ -x "$root/.venv/bin/python" ]]; then
    "$root/.venv/bin/python" -c 'import sys; print(sys._base_executable)'
  else
    command -v python3
  fi
}

worker() {
  local home="$cache/worker-$beam_version" want
  want="$({ cat "$root/requirements_lock.txt"; declare -f beam_closure worker_script; } |
    sha256sum | cut -d' ' -f1)"
  if [[ "$(cat "$home/.stamp" 2>/dev/null)" != "$want" ]]; then
    echo "tools/engines.sh: building the Python worker of Beam $beam_version (once)" >&2
    rm -rf "$home"
    mkdir -p "$home"
    GOBIN="$home/bin" GOFLAGS=-mod=mod \
      go install "github.com/apache/beam/sdks/v2/python/container@v$beam_version" >&2
    mv "$home/bin/container" "$home/boot"
    rmdir "$home/bin"
    beam_closure >"$home/requirements.txt"
    "$(interpreter)" -m venv "$home/env"
    "$home/env/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      --require-hashes -r "$home/requirements.txt" >&2
    worker_script >"$home/worker"
    chmod +x "$home/worker"
    echo "$want" >"$home/.stamp"
  fi
  echo "$home/worker"
}

# The PROCESS environment's command. The runner starts it with the boot program's flags (--id,
# --provision_endpoint, ...) and stops it with SIGTERM (Flink) or SIGKILL (Prism).
worker_script() {
  cat <<'SH'
#!/usr/bin/env bash
# One SDK worker: Beam's boot program in a fresh virtual environment over the Beam-only one
# beside this script, removed when the worker stops. Written by tools/engines.sh worker.
set -euo pipefail
home="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# BEAM_AGENTS_WORKER_HOME holds the workers' folders (each named by its wrapper's PID);
# BEAM_AGENTS_WORKER_KEEP=1 keeps them after the job, to look at what a worker installed.
workers="${BEAM_AGENTS_WORKER_HOME:-$home/workers}"
mkdir -p "$workers"
if [[ -z "${BEAM_AGENTS_WORKER_KEEP:-}" ]]; then
  # Prism stops a worker with SIGKILL, which leaves its folder behind: the next one clears it.
  for stale in "$workers"/*/; do
    [[ -d "$stale" ]] && ! kill -0 "$(basename "$stale")" 2>/dev/null && rm -rf "$stale"
  done
fi
work="$workers/$$"
mkdir "$work"
"$home/env/bin/python" -m venv --without-pip "$work/venv"
purelib='import sysconfig; print(sysconfig.get_path("purelib"))'
# The Beam-only environment's packages (pip among them) show behind the fresh ones, as the
# image's packages show through --system-site-packages in the boot program's venv on Dataflow.
"$home/env/bin/python" -c "$purelib" >"$("$work/venv/bin/python" -c "$purelib")/beam-worker.pth"
export PATH="$work/venv/bin:$PATH" VIRTUAL_ENV="$work/venv" RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1
unset PYTHONPATH PYTHONHOME PYTHONSAFEPATH
args=()
for arg in "$@"; do
  # Prism 2.77 writes --id='ID' as for a shell but starts the command without one; the quotes
  # would make the id one its provisioning service does not know.
  [[ "$arg" == --id=\'*\' ]] && arg="--id=${arg:6:-1}"
  args+=("$arg")
done
cd "$work"
"$home/boot" "${args[@]}" --semi_persist_dir="$work" &
boot=$!
trap 'kill -TERM "$boot" 2>/dev/null || true' TERM INT
status=0
wait "$boot" || status=$?
# A TERM ends the first wait early; this one waits for the boot program to stop its workers.
wait "$boot" 2>/dev/null || true
[[ -n "${BEAM_AGENTS_WORKER_KEEP:-}" ]] || rm -rf "$work"
exit "$status"
SH
}

# The runtime jars of tools/engines/NAME/pom.xml in .cache/engines/NAME/lib, fetched again
# only when the POM changes.
jars() {
  local name="$1" pom="$root/tools/engines/$1/pom.xml" home="$cache/$1"
  local want
  want="$(sha256sum "$pom" | cut -d' ' -f1)"
  if [[ "$(cat "$home/.pom-sha256" 2>/dev/null)" != "$want" ]]; then
    echo "tools/engines.sh: fetching the $name jars from Maven Central" >&2
    rm -rf "$home/lib"
    mkdir -p "$home"
    mvn -q -B -Dstyle.color=never --strict-checksums -f "$pom" dependency:copy-dependencies \
      -DoutputDirectory="$home/lib" -DincludeScope=runtime >&2
    echo "$want" >"$home/.pom-sha256"
  fi
  echo "$home/lib"
}

fetch() {
  prism >/dev/null
  worker >/dev/null
  for name in flink kafka beam-java; do jars "$name" >/dev/null; done
}

alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

# A recorded PID alive and one of these engines' JVMs (their command lines name this cache):
# a PID file copied with another checkout's cache, or a PID reused, names a process that is
# not ours to stop or to count as running. (Not for a PID just started: until it execs, it is
# this script.)
ours() { alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$cache/"; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_java SERVICE LOGNAME MAIN_CLASS ARGS...: one JVM in the background, its PID appended
# to SERVICE's PID file. Extra JVM flags come in through JAVA_FLAGS (word-split on purpose).
start_java() {
  local service="$1" logname="$2" lib="$3"
  shift 3
  # shellcheck disable=SC2086
  nohup java ${JAVA_FLAGS:-} -cp "$lib/*" "$@" >"$logs/$logname.log" 2>&1 </dev/null &
  echo $! >>"$run/$service.pids"
}

# wait_for SERVICE WHAT CHECK...: runs CHECK every half second for 120 s while every PID of
# SERVICE lives; on failure stops SERVICE and shows the end of its logs.
wait_for() {
  local service="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + 120)) pid
  until "$@"; do
    for pid in $(cat "$run/$service.pids"); do
      alive "$pid" || { stop "$service"; tail -n 30 "$logs/$service"*.log >&2; die "$service exited before $what"; }
    done
    ((SECONDS < deadline)) || { stop "$service"; tail -n 30 "$logs/$service"*.log >&2; die "$service: no $what in 120 s"; }
    sleep 0.5
  done
}

running() {
  local pid
  [[ -s "$run/$1.pids" ]] || return 1
  for pid in $(cat "$run/$1.pids"); do ours "$pid" || return 1; done
}

start() {
  local service="$1"
  mkdir -p "$logs" "$run"
  if running "$service"; then
    echo "tools/engines.sh: $service is running already (PIDs $(tr '\n' ' ' <"$run/$service.pids"))" >&2
    return 0
  fi
  stop "$service" 2>/dev/null || true
  : >"$run/$service.pids"
  case "$service" in
    kafka) start_kafka "${2:-}" ;;
    java) start_beam_java ;;
    flink) start_flink ;;
    *) die "no service $service (kafka, java, flink)" ;;
  esac
  echo "tools/engines.sh: $service ready (PIDs $(tr '\n' ' ' <"$run/$service.pids"))" >&2
}

start_kafka() {
  local lib data="$run/kafka-data" conf="$run/kafka.properties"
  lib="$(jars kafka)"
  if [[ "${1:-}" == --keep-data && -f "$data/meta.properties" ]]; then
    # A restart (a broker outage ends): the same cluster, topics and offsets.
    JAVA_FLAGS="-Xms256m -Xmx512m" start_java kafka kafka "$lib" kafka.Kafka "$conf"
    wait_for kafka "broker" grep -q "Kafka Server started" "$logs/kafka.log"
    return
  fi
  [[ -z "${1:-}" || "$1" == --keep-data ]] || die "start kafka: unknown option $1"
  # A new cluster at every start: the tests make their own topics, and nothing of an earlier
  # run can leak into them.
  rm -rf "$data"
  cat >"$conf" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$kafka_controller_port
listeners=PLAINTEXT://127.0.0.1:$kafka_port,CONTROLLER://127.0.0.1:$kafka_controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$kafka_port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
EOF
  java -cp "$lib/*" kafka.tools.StorageTool format -c "$conf" \
    -t "$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')" \
    >"$logs/kafka-format.log" 2>&1 || { cat "$logs/kafka-format.log" >&2; die "kafka: format failed"; }
  JAVA_FLAGS="-Xms256m -Xmx512m" start_java kafka kafka "$lib" kafka.Kafka "$conf"
  wait_for kafka "broker" grep -q "Kafka Server started" "$logs/kafka.log"
}

start_beam_java() {
  local lib harness="$run/java-harness"
  lib="$(jars beam-java)"
  # Expanded Java transforms (the Kafka read and write) run in a Java SDK harness that Flink
  # starts for each job (PROCESS) and kills when the job ends, not in Docker, the default.
  # A shared worker pool (EXTERNAL) ran every job's harness as threads of one JVM, which
  # kept each cancelled job's Kafka clients (tools/engines/RESULTS.md). The harness's boot
  # program needs the venv: Flink runs it long after this script returns.
  [[ -x "$root/.venv/bin/python" ]] || bash "$root/tools/dev.sh" setup >&2
  # Flink's process manager drops a PROCESS environment's output: the harness's goes to a log.
  cat >"$harness" <<EOF
#!/usr/bin/env bash
exec >>"$logs/java-harness.log" 2>&1
exec "$root/.venv/bin/python" "$root/tools/engines/java_harness.py" --classpath "$lib" --engines "$run" "\$@"
EOF
  chmod +x "$harness"
  # The harness runs on the engines' classpath, so the environment stages only its boot
  # program, not the expansion service's classpath (140 MB a job, which the job server keeps).
  JAVA_FLAGS="-Xmx384m" start_java java java-expansion "$lib" \
    org.apache.beam.sdk.expansion.service.ExpansionService "$expansion_port" \
    --defaultEnvironmentType=PROCESS --defaultEnvironmentConfig="{\"command\": \"$harness\"}" \
    --filesToStage="$root/tools/engines/java_harness.py"
  wait_for java "expansion service" listening "$expansion_port"
}

# Ready once the cluster counts every task manager flink's PID file names (its lines past the
# job manager and the job server) and the job server listens.
flink_ready() {
  local want=$(($(wc -l <"$run/flink.pids") - 2))
  curl -sf "http://127.0.0.1:$flink_rest_port/overview" | grep -q "\"taskmanagers\":$want[,}]" \
    && listening "$job_port"
}

start_flink() {
  local lib conf="$run/flink-conf"
  lib="$(jars flink)"
  # Each job stages its environments' artifacts with the job server, which keeps them after a
  # cancelled job: here, not in /tmp, and emptied by a new cluster.
  rm -rf "$run/flink-artifacts"
  mkdir -p "$conf" "$run/flink-tmp" "$run/flink-savepoints" "$run/flink-checkpoints" "$run/flink-artifacts"
  # Flink without flink-dist computes no memory defaults: every component is set, sized for
  # a 2-core machine that runs Kafka and the jobs' Java harnesses too.
  cat >"$conf/config.yaml" <<EOF
jobmanager:
  rpc: {address: 127.0.0.1, port: $flink_rpc_port}
  bind-host: 127.0.0.1
  memory: {heap.size: 512m, off-heap.size: 128m, jvm-metaspace.size: 256m, jvm-overhead.min: 128m, jvm-overhead.max: 128m}
taskmanager:
  host: 127.0.0.1
  bind-host: 127.0.0.1
  numberOfTaskSlots: 4
  cpu.cores: 2
  memory: {framework.heap.size: 128m, task.heap.size: 768m, managed.size: 128m, framework.off-heap.size: 128m, task.off-heap.size: 0m, network.min: 128m, network.max: 128m, jvm-metaspace.size: 256m, jvm-overhead.min: 192m, jvm-overhead.max: 192m}
rest: {address: 127.0.0.1, bind-address: 127.0.0.1, port: $flink_rest_port}
io.tmp.dirs: $run/flink-tmp
parallelism.default: 1
state.savepoints.dir: file://$run/flink-savepoints
# Checkpoints on disk, outside the job manager, kept when a job is cancelled or its job
# manager dies, so a job can be restored from its last one. Keyed state in RocksDB, as
# production keeps large keyed state; BEAM_AGENTS_FLINK_STATE_BACKEND=hashmap puts it on the
# heap.
state.backend.type: ${BEAM_AGENTS_FLINK_STATE_BACKEND:-rocksdb}
state.backend.incremental: true
state.checkpoints.dir: file://$run/flink-checkpoints
execution.checkpointing.externalized-checkpoint-retention: RETAIN_ON_CANCELLATION
# The REST API's job metrics at most 1 s old, not 10 s: beam_agents.bus.flink.ReadWatchdog
# compares them with the records arriving on the topic.
metrics.fetcher.update-interval: 1000
# A dead job or task manager is noticed by a missed heartbeat: 15 s, not Flink's 50 s, so the
# cluster recovers from a kill in seconds (measured: a job manager restart 45 s -> 16 s).
heartbeat: {interval: 3000, timeout: 15000}
# A job's subtasks spread over the task managers rather than filling the first one's slots.
cluster.evenly-spread-out-slots: true
EOF
  start_jobmanager "$lib"
  start_taskmanager "$lib"
  start_jobserver "$lib"
  wait_for flink "task manager and job server" flink_ready
}

# The job server builds each job's graph, checkpoint retention included, from the cluster's
# configuration.
start_jobserver() {
  JAVA_FLAGS="-Xmx512m" start_java flink flink-jobserver "$1" \
    org.apache.beam.runners.flink.FlinkJobServerDriver --flink-master="127.0.0.1:$flink_rest_port" \
    --flink-conf-dir="$run/flink-conf" \
    --job-host=127.0.0.1 --job-port="$job_port" --artifact-port="$artifact_port" --expansion-port=0 \
    --artifacts-dir="$run/flink-artifacts"
}

start_jobmanager() {
  JAVA_FLAGS="-Xmx512m" start_java flink flink-jobmanager "$1" \
    org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint --configDir "$run/flink-conf"
}

# start_taskmanager LIB [LOGNAME]
start_taskmanager() {
  JAVA_FLAGS="-Xmx1280m -XX:MaxDirectMemorySize=512m ${BEAM_AGENTS_FLINK_TM_JAVA_FLAGS:-}" start_java flink "${2:-flink-taskmanager}" "$1" \
    org.apache.flink.runtime.taskexecutor.TaskManagerRunner --configDir "$run/flink-conf"
}

taskmanager_ids() {
  curl -sf "http://127.0.0.1:$flink_rest_port/taskmanagers" | python3 -c '
import json, sys
print(" ".join(sorted(t["id"] for t in json.load(sys.stdin)["taskmanagers"])))'
}

new_taskmanager() {
  local id
  for id in $(taskmanager_ids); do [[ " $1 " == *" $id "* ]] || return 0; done
  return 1
}

# restart_flink_process INDEX SIGNAL START: stops the process at line INDEX of flink's PID
# file (0 job manager, 1 task manager, 2 job server) with SIGNAL and runs START LIB, whose new
# PID takes the old one's line, so each keeps its place across restarts.
restart_flink_process() {
  local index="$1" signal="$2" starter="$3" pids lib
  mapfile -t pids <"$run/flink.pids"
  kill "-$signal" "${pids[$index]}"
  while alive "${pids[$index]}"; do sleep 0.2; done
  lib="$(jars flink)"
  : >"$run/flink.pids"
  "$starter" "$lib"
  pids[index]="$(cat "$run/flink.pids")"
  printf '%s\n' "${pids[@]}" >"$run/flink.pids"
}

# The task manager alone; ready once a task manager the cluster did not know has registered.
restart_taskmanager() {
  local signal=TERM old known
  [[ "${1:-}" == --kill ]] && signal=KILL
  running flink || die "flink is not running"
  old="$(sed -n 2p "$run/flink.pids")"
  known="$(taskmanager_ids)"
  restart_flink_process 1 "$signal" start_taskmanager
  wait_for flink "a new task manager" new_taskmanager "$known"
  echo "tools/engines.sh: task manager $old stopped (SIG$signal), new one ready" >&2
}

# restart_ready INDEX NAME START [--kill]: the process at line INDEX of flink's PID file
# (restart_flink_process) stopped with SIGTERM, or SIGKILL, and started again; ready once the
# cluster is (flink_ready).
restart_ready() {
  local index="$1" name="$2" starter="$3" signal=TERM old
  [[ "${4:-}" == --kill ]] && signal=KILL
  running flink || die "flink is not running"
  old="$(sed -n "$((index + 1))p" "$run/flink.pids")"
  restart_flink_process "$index" "$signal" "$starter"
  wait_for flink "a new $name" flink_ready
  echo "tools/engines.sh: $name $old stopped (SIG$signal), new one ready" >&2
}

# The PIDs of the Java SDK harnesses of these engines' jobs, one a line.
harness_pids() {
  # pgrep takes a pattern: the run directory's regex characters (a path may hold them) escaped.
  pgrep -f -- "-Dbeam_agents.engines=$(printf '%s' "$run" | sed 's/[][\.*^$+?(){}|]/\\&/g') " || true
}

signal_workers() {
  local pids
  pids="$(harness_pids)"
  [[ -n "$pids" ]] || die "no Java SDK harness of these engines is running"
  # shellcheck disable=SC2086
  kill "-$1" $pids
}

# A second task manager beside the first, the fourth line of flink's PID file: a job
# restored at parallelism 2 spreads its subtasks over both (cluster.evenly-spread-out-slots).
add_taskmanager() {
  local known
  running flink || die "flink is not running"
  (($(wc -l <"$run/flink.pids") == 3)) || die "a second task manager runs already"
  known="$(taskmanager_ids)"
  start_taskmanager "$(jars flink)" flink-taskmanager-2
  wait_for flink "a second task manager" new_taskmanager "$known"
  echo "tools/engines.sh: a second task manager is ready" >&2
}

# Stops the second task manager; done once the cluster no longer counts it, so no job is
# scheduled onto its slots.
remove_taskmanager() {
  local pid deadline
  pid="$(sed -n 4p "$run/flink.pids" 2>/dev/null)" || true
  [[ -n "$pid" ]] || die "no second task manager runs"
  kill "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 30))
  while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
  alive "$pid" && kill -9 "$pid" 2>/dev/null || true
  sed -i 4d "$run/flink.pids"
  wait_for flink "one task manager" flink_ready
  echo "tools/engines.sh: the second task manager stopped" >&2
}

# Checkpoints are DIR/JOB_ID/chk-N, complete once chk-N/_metadata is written.
latest_checkpoint() {
  local found
  found="$(ls -d "$run/flink-checkpoints/$1"/chk-*/_metadata 2>/dev/null | sort -V | tail -n 1)"
  [[ -n "$found" ]] || die "no complete checkpoint of job $1 in $run/flink-checkpoints"
  echo "file://$(dirname "$found")"
}

stop() {
  local service="$1" signal=TERM pids pid deadline
  [[ -z "${2:-}" || "$2" == --kill ]] || die "stop: unknown option $2"
  [[ "${2:-}" == --kill ]] && signal=KILL
  [[ -f "$run/$service.pids" ]] || return 0
  pids="$(cat "$run/$service.pids")"
  for pid in $pids; do ours "$pid" && kill "-$signal" "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 30))
  for pid in $pids; do
    while ours "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    ours "$pid" && kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$run/$service.pids"
  echo "tools/engines.sh: $service stopped (SIG$signal)" >&2
}

endpoints() {
  cat <<EOF
KAFKA_BOOTSTRAP=127.0.0.1:$kafka_port
EXPANSION_SERVICE=127.0.0.1:$expansion_port
FLINK_REST=http://127.0.0.1:$flink_rest_port
JOB_ENDPOINT=127.0.0.1:$job_port
FLINK_SAVEPOINTS=$run/flink-savepoints
FLINK_CHECKPOINTS=$run/flink-checkpoints
LOGS=$logs
EOF
}

flink_options() {
  # Checkpointing keeps the sources alive and lets stop-with-savepoint complete; without it
  # Beam's Flink runner finishes the Impulse source and a savepoint never completes.
  # --finish_bundle_before_checkpointing: a barrier that reaches an operator with a bundle open
  # otherwise makes Beam's runner finish it inside the snapshot and hold its outputs until the
  # operator next starts a bundle or sees a new watermark, and a loop that waits for each
  # answer sends nothing more: the stalls of tools/engines/RESULTS.md (flink_faults_test's
  # one-question-at-a-time test fails on its first question without it).
  echo "--runner=PortableRunner --job_endpoint=127.0.0.1:$job_port --environment_type=LOOPBACK" \
    "--streaming --checkpointing_interval=10000 --finish_bundle_before_checkpointing"
}

flink_jobs() {
  curl -sf "http://127.0.0.1:$flink_rest_port/jobs/overview" | python3 -c '
import json, sys
for job in json.load(sys.stdin)["jobs"]:
    print(job["jid"], job["state"])'
}

flink_demo() {
  local started=() service status=0 before jid state
  for service in kafka java flink; do
    running "$service" || started+=("$service")
    start "$service"
  done
  # A clean clone has no venv yet: make it (about a minute, once).
  [[ -x "$root/.venv/bin/python" ]] || bash "$root/tools/dev.sh" setup >&2
  before="$(flink_jobs | cut -d' ' -f1)"
  # `import apache_beam` warns that apitools, a Google Cloud dependency the demo never uses,
  # is missing (before any logging is configured): that one line is dropped.
  # shellcheck disable=SC2046
  "$root/.venv/bin/python" -m beam_agents.ops.demo --bus=kafka \
    --kafka_bootstrap="127.0.0.1:$kafka_port" --expansion_service="127.0.0.1:$expansion_port" \
    --flink_rest="http://127.0.0.1:$flink_rest_port" $(flink_options) "$@" 2> >(grep -v '^WARNING:root:apitools not found' >&2) || status=$?
  # The job server does not pass a cancel on to the cluster, and a LOOPBACK job outlives the
  # process whose workers it used: cancel the demo's job through Flink's REST API.
  while read -r jid state; do
    if [[ "$state" == RUNNING || "$state" == RESTARTING ]] && ! grep -qx "$jid" <<<"$before"; then
      curl -sf -X PATCH "http://127.0.0.1:$flink_rest_port/jobs/$jid?mode=cancel" >/dev/null
      echo "tools/engines.sh: cancelled the demo's Flink job $jid" >&2
    fi
  done < <(flink_jobs)
  for service in "${started[@]}"; do stop "$service"; done
  return "$status"
}

case "${1:-}" in
  fetch) fetch ;;
  prism) prism ;;
  # No --experiments=prism_disable_sdf_split here: RunAgent and ExecuteIntents add it to their
  # pipeline's options themselves (beam_agents.wire.beam_support.keep_each_key_in_one_bundle),
  # and the Prism run of the suite is what proves they do.
  prism-options)
    echo "--runner=PrismRunner --prism_location=$(prism) --environment_type=LOOPBACK" ;;
  worker) worker ;;
  # One word each, so that $(...) and $BEAM_AGENTS_PIPELINE_OPTIONS split them as given (a
  # JSON --environment_config holds a space).
  worker-options)
    echo "--environment_type=PROCESS --environment_options=process_command=$(worker)" ;;
  start) start "${2:?which service}" "${3:-}" ;;
  restart-taskmanager) restart_taskmanager "${2:-}" ;;
  add-taskmanager) add_taskmanager ;;
  remove-taskmanager) remove_taskmanager ;;
  # The job manager alone. A session cluster without HA keeps no job across a job manager's
  # death: the new one starts empty and the task manager registers with it again.
  restart-jobmanager) restart_ready 0 "job manager" start_jobmanager "${2:-}" ;;
  # Beam's job server alone: it only submits jobs and reports their state to their launchers;
  # the cluster runs them.
  restart-jobserver) restart_ready 2 "job server" start_jobserver "${2:-}" ;;
  latest-checkpoint) latest_checkpoint "${2:?which job id}" ;;
  harnesses) harness_pids ;;
  freeze-workers) signal_workers STOP ;;
  thaw-workers) signal_workers CONT ;;
  kill-workers) signal_workers KILL ;;
  stop) stop "${2:?which service}" "${3:-}" ;;
  status)
    for service in kafka java flink; do
      if running "$service"; then echo "$service running: $(tr '\n' ' ' <"$run/$service.pids")"
      else echo "$service stopped"; fi
    done ;;
  endpoints) endpoints ;;
  flink-options) flink_options ;;
  flink-demo) shift; flink_demo "$@" ;;
  *) sed -n '2,56p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
