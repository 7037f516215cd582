#!/usr/bin/env bash
# Slurm epilog for multi-node jobs whose logs stay on each node's local disk: every node ingests
# its own logs into one shared Parquet tree, and the node whose epilog finds every node of the
# job there analyzes the whole job (a follow-up job can do it instead: analyze-job.sbatch).
#
# Install: `Epilog=/etc/slurm/epilog.d/postmortem-multinode.sh` in slurm.conf. Slurm runs it on
# every node of the job as root with the job's SLURM_* variables (SLURMD_NODENAME names the node).
# Configure with:
#   POSTMORTEM_LOCAL_LOGS  this node's logs of the job (default /local/jobs/$SLURM_JOB_ID)
#   POSTMORTEM_PARQUET     the shared Parquet tree every node writes (default /shared/postmortem/parquet)
#   POSTMORTEM_OUT         where the job's verdict goes (default /shared/postmortem/jobs/$SLURM_JOB_ID)
#   POSTMORTEM_DB          the history database the verdict is recorded in (a shared path)
#   POSTMORTEM_TIMEOUT     seconds each step may take (default 300)
#   POSTMORTEM_ANALYZE     "last" (default: the last node to ingest analyzes) or "none" (a follow-up job does)
#
# It never fails the epilog (a failing epilog drains the node). The analysis' exit code (0 clean,
# 1 a finding at --fail-on or worse, 2 unreadable input) is written to $POSTMORTEM_OUT/postmortem.rc.
set -u

job=${SLURM_JOB_ID:-}
[ -n "$job" ] || exit 0
logs=${POSTMORTEM_LOCAL_LOGS:-/local/jobs/$job}
tree=${POSTMORTEM_PARQUET:-/shared/postmortem/parquet}
out=${POSTMORTEM_OUT:-/shared/postmortem/jobs/$job}
limit=${POSTMORTEM_TIMEOUT:-300}
mkdir -p "$tree" "$out" 2>/dev/null || exit 0

# This node's rows: job=$SLURM_JOB_ID, node=$SLURMD_NODENAME (from --scheduler-env). Running it
# again (a requeued epilog) replaces them; a node with no logs of the job writes nothing.
if [ -d "$logs" ]; then
    timeout "$limit" postmortem ingest "$logs" --parquet "$tree" --scheduler-env --no-history --quiet \
        >>"$out/ingest.log" 2>&1
fi

[ "${POSTMORTEM_ANALYZE:-last}" = "last" ] || exit 0

# The job's nodes, and how many of them have ingested (one partition directory each).
expected=0
if command -v scontrol >/dev/null 2>&1 && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    expected=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | wc -l)
fi
ingested=$(find "$tree/runs" -mindepth 3 -maxdepth 3 -type d -path "*/job=$job/node=*" 2>/dev/null | wc -l)
[ "$expected" -gt 0 ] && [ "$ingested" -ge "$expected" ] || exit 0

# Exactly one node analyzes: mkdir is atomic on a shared filesystem.
mkdir "$out/.analyzing" 2>/dev/null || exit 0
timeout "$limit" postmortem analyze --parquet "$tree" --job "$job" --format json --quiet \
    ${SLURM_JOB_NODELIST:+--nodes "$SLURM_JOB_NODELIST"} >"$out/postmortem.json.tmp" 2>"$out/postmortem.err"
rc=$?
[ -s "$out/postmortem.json.tmp" ] && mv -f "$out/postmortem.json.tmp" "$out/postmortem.json" \
    || rm -f "$out/postmortem.json.tmp"
echo "$rc" >"$out/postmortem.rc"
exit 0
