#!/usr/bin/env bash
# Runs tracejit-distributed's tests between processes: builds the `mpi`
# test target (cargo feature `mpi`) and runs it under `mpiexec -n 2`
# (override with TRACEJIT_TEST_RANKS). The fault checks run as their own
# launch, since they leave the world unusable. Fails when any check fails
# on any rank, or when the launch itself fails.
#
# Usage: scripts/test_distributed.sh   (after scripts/install_mpi.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS="${TRACEJIT_TEST_RANKS:-2}"
# One thread per rank: the ranks share this machine's cores.
export TRACEJIT_NUM_THREADS="${TRACEJIT_NUM_THREADS:-1}"

bin=$(cargo test -p tracejit-distributed --features mpi --test mpi --no-run --message-format=json \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "test_distributed: the mpi test binary was not built" >&2; exit 1; }

# A hung launch must fail CI, not use up its time: generous outer bounds.
timeout 600 mpiexec -n "$RANKS" "$bin" --no-faults
timeout 120 mpiexec -n "$RANKS" "$bin" --faults

# `init` refuses a launch it cannot serve, with a clear error (and the
# process exits non-zero instead of training alone or hanging):
expect_refusal() { # <what the message must say> <command...>
  local want="$1"; shift
  local out
  if out=$(timeout 120 "$@" 2>&1); then
    echo "test_distributed: '$*' succeeded, expected a refusal" >&2; exit 1
  fi
  grep -q "$want" <<<"$out" || { echo "test_distributed: '$*' said: $out" >&2; exit 1; }
  echo "test init refuses: $want ... ok"
}
# ranks running different programs (the same binary under another name);
other_dir=$(mktemp -d)
trap 'rm -rf "$other_dir"' EXIT
cp "$bin" "$other_dir/other_program"
expect_refusal "every rank must run the same program" mpiexec -n 1 "$bin" : -n 1 "$other_dir/other_program"
# a launcher of another MPI (Open MPI's variables) that started two processes.
expect_refusal "is not the launcher's" env OMPI_COMM_WORLD_SIZE=2 "$bin"
echo "2 passed, 0 failed"
