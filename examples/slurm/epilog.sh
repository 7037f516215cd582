#!/usr/bin/env bash
# Slurm epilog: analyze a finished job's logs and leave the verdict next to them.
#
# Install: `Epilog=/etc/slurm/epilog.d/postmortem.sh` in slurm.conf (or a file in an
# epilog.d directory). Slurm runs it on each node as root with the job's SLURM_* variables.
# Configure with:
#   POSTMORTEM_LOG_ROOT  where jobs keep their logs, one directory per job id (default /shared/jobs)
#   POSTMORTEM_LOG_DIR   the job's log directory, if not $POSTMORTEM_LOG_ROOT/$SLURM_JOB_ID
#   POSTMORTEM_DB        the history database (a shared path collects every node's runs)
#   POSTMORTEM_TIMEOUT   seconds the analysis may take (default 300)
#   POSTMORTEM_ONLY_NODE run on this node only (default: the job's first node, SLURMD_NODENAME match)
#
# It never fails the epilog: an epilog that exits non-zero drains the node, and a log
# analyzer must not take machines out of service. The analysis' own exit code (0 clean,
# 1 a finding at --fail-on or worse, 2 unreadable input) is written to postmortem.rc.
set -u

job=${SLURM_JOB_ID:-}
[ -n "$job" ] || exit 0
dir=${POSTMORTEM_LOG_DIR:-${POSTMORTEM_LOG_ROOT:-/shared/jobs}/$job}
[ -d "$dir" ] || exit 0

# One node per job does the work: the first of the job's nodes, unless told otherwise.
first=${POSTMORTEM_ONLY_NODE:-}
if [ -z "$first" ] && command -v scontrol >/dev/null 2>&1 && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
fi
if [ -n "$first" ] && [ -n "${SLURMD_NODENAME:-}" ] && [ "$first" != "$SLURMD_NODENAME" ]; then
    exit 0
fi

out="$dir/postmortem.json"
timeout "${POSTMORTEM_TIMEOUT:-300}" postmortem analyze "$dir" --format json --quiet --scheduler-env \
    >"$out.tmp" 2>"$dir/postmortem.err"
rc=$?
[ -s "$out.tmp" ] && mv -f "$out.tmp" "$out" || rm -f "$out.tmp"
echo "$rc" >"$dir/postmortem.rc"
exit 0
