#!/usr/bin/env bash
# Fresh-machine check: do the README's two commands work on a clean checkout?
#
#   ci/fresh_machine_check.sh [REPO]
#
# Clones the committed HEAD of REPO (default: the repository holding this
# script) into a temporary directory, takes the first fenced ```sh block of its
# README.md, and runs that block's first command (the main job) and its second
# command (the tests) verbatim with bash in the clone, one after the other.
# Nothing of this machine's checkout leaks in: no untracked or uncommitted
# file, no virtualenv (the commands make their own), no METRALE_ORCH_*
# setting, and an empty metrale-orch local cache. Fails (exit 1) if either
# command fails; prints each command's wall time.
#
# FRESH_CHECK_KEEP=1 keeps the temporary directory for a post-mortem.
set -euo pipefail

repo="${1:-$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)}"
repo="$(cd "$repo" && pwd)"

work="$(mktemp -d "${TMPDIR:-/tmp}/metrale-fresh.XXXXXX")"
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if [ "${FRESH_CHECK_KEEP:-0}" = "1" ]; then
    echo "fresh-machine check: kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

clone="$work/repo"
git init --quiet "$clone"
git -C "$clone" fetch --quiet --depth 1 "file://$repo" HEAD
git -C "$clone" -c advice.detachedHead=false checkout --quiet --detach FETCH_HEAD
head="$(git -C "$clone" rev-parse HEAD)"
echo "fresh-machine check: ${head:0:12} of $repo in $clone"

readme="$clone/README.md"
if [ ! -f "$readme" ]; then
  echo "fresh-machine check: FAILED: README.md is missing at ${head:0:12}" >&2
  exit 1
fi
# The first fenced ```sh block, blank lines dropped.
mapfile -t commands < <(
  awk '
    !inside && /^```sh[[:space:]]*$/ { inside = 1; next }
    inside && /^```/ { exit }
    inside && NF { print }
  ' "$readme"
)
if [ "${#commands[@]}" -lt 2 ]; then
  echo "fresh-machine check: FAILED: README.md: the first \`\`\`sh block must hold two" \
    "commands (the main job, then the tests); found ${#commands[@]}" >&2
  exit 1
fi
for cmd in "${commands[@]:0:2}"; do
  case "$cmd" in
    *\\) echo "fresh-machine check: FAILED: README.md: a command continues on the next" \
      "line; keep each of the two commands on one line: $cmd" >&2
      exit 1 ;;
  esac
done

# A clean environment: nothing of an active virtualenv or of this project's settings.
unset VIRTUAL_ENV PYTHONPATH PYTHONHOME PYTHONSTARTUP
while IFS= read -r var; do
  unset "$var"
done < <(compgen -e | grep '^METRALE_ORCH_' || true)
export METRALE_ORCH_LOCAL_CACHE="$work/local-cache"

status=0
names=("main job" "tests")
for i in 0 1; do
  cmd="${commands[$i]}"
  echo "fresh-machine check: ${names[$i]}: \$ $cmd"
  start="$(date +%s.%N)"
  if (cd "$clone" && bash -c "$cmd"); then rc=0; else rc=$?; fi
  elapsed="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
  if [ "$rc" -eq 0 ]; then
    echo "fresh-machine check: ${names[$i]}: ok in ${elapsed} s"
  else
    echo "fresh-machine check: ${names[$i]}: FAILED (exit $rc) after ${elapsed} s" >&2
    status=1
    break
  fi
done
if [ "$status" -eq 0 ]; then
  echo "fresh-machine check: passed"
fi
exit "$status"
