#!/usr/bin/env bash
# Runs the tests between processes: builds tracejit-distributed's `mpi`
# test target, the root crate's `distributed_charlm` test and the
# train_charlm example (cargo feature `mpi`) and runs them under
# `mpiexec -n 2` (override with TRACEJIT_TEST_RANKS). The fault checks run
# as launches of their own, since they leave the world unusable (a silent
# rank; a rank that crashes). Fails when any check fails on any rank, or
# when a launch itself fails.
#
# Usage: scripts/test_distributed.sh   (after scripts/install_mpi.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS="${TRACEJIT_TEST_RANKS:-2}"
# One thread per rank: the ranks share this machine's cores.
export TRACEJIT_NUM_THREADS="${TRACEJIT_NUM_THREADS:-1}"

# Every cargo command here selects the same packages and features: the
# whole workspace (as `cargo test --workspace` does) plus `mpi`. Cargo
# unifies features over the packages a command selects, so a `-p` or a
# bare `--features mpi` selection built tracejit-kernels and everything
# above it again under other feature sets; this one rebuilds only
# tracejit-distributed and the crates above it.
MPI=(--workspace --features tracejit/mpi,tracejit-distributed/mpi)

# The executable of test target $1, built (and named by cargo) in one call.
test_binary() {
  cargo test "${MPI[@]}" --test "$1" --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}

# tracejit-distributed's collectives between processes (tests/mpi/).
bin=$(test_binary mpi)
[ -x "$bin" ] || { echo "test_distributed: the mpi test binary was not built" >&2; exit 1; }

# The root crate's targets with its feature `mpi`: the data-parallel
# character model (tests/distributed_charlm.rs) and the example itself.
charlm=$(test_binary distributed_charlm)
[ -x "$charlm" ] || { echo "test_distributed: the distributed_charlm test binary was not built" >&2; exit 1; }
cargo build "${MPI[@]}" --example train_charlm
example=target/debug/examples/train_charlm

# A hung launch must fail CI, not use up its time: generous outer bounds.
timeout 600 mpiexec -n "$RANKS" "$bin" --no-faults
timeout 120 mpiexec -n "$RANKS" "$bin" --faults
# The last rank crashes mid-run; the launcher must leave the others running
# for them to report (-disable-auto-cleanup), and the launch fails because
# a rank died: the survivors' lines are the verdict.
out=$(timeout 120 mpiexec -disable-auto-cleanup -n "$RANKS" "$bin" --dead-rank 2>&1) && status=0 || status=$?
echo "$out" | grep -v "^$"
[ "$status" != 124 ] || { echo "test_distributed: the dead-rank launch hung" >&2; exit 1; }
grep -q "^test a_dead_rank_is_an_error_not_a_hang ... ok (rank 0)" <<<"$out" \
  && grep -q "^1 passed, 0 failed" <<<"$out" \
  && ! grep -q FAILED <<<"$out" \
  || { echo "test_distributed: the dead-rank check did not pass on the survivors" >&2; exit 1; }

timeout 900 mpiexec -n "$RANKS" "$charlm"

# The example's command line: two ranks train an epoch, and one process
# resumes their checkpoint for a second (a small text, a few steps).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 60000 examples/data/war_and_peace.txt >"$work/text.txt"
run_example() { # <ranks> <extra options...>
  local n="$1"; shift
  timeout 600 mpiexec -n "$n" "$example" --data-parallel --data "$work/text.txt" --out "$work/out" \
    --steps 3 --batch 2 --f32 "$@" 2>&1
}
out=$(run_example 2 --epochs 2 --stop-after 1)
echo "$out"
grep -q "^\[rank 1/2\] data-parallel: rows 1..2 of every batch of 2" <<<"$out" \
  && grep -q "^\[rank 0/2\] epoch  1/2" <<<"$out" \
  && [ -s "$work/out/checkpoint.safetensors" ] && [ -s "$work/out/curve.svg" ] \
  || { echo "test_distributed: train_charlm --data-parallel on 2 ranks" >&2; exit 1; }
out=$(run_example 1 --epochs 2 --resume)
echo "$out"
grep -q "^\[rank 0/1\] resumed from .* after epoch 1" <<<"$out" && grep -q "^\[rank 0/1\] epoch  2/2" <<<"$out" \
  || { echo "test_distributed: train_charlm --resume of a 2-rank checkpoint in one process" >&2; exit 1; }
echo "test train_charlm --data-parallel: 2 ranks, then resumed on 1 ... ok"

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
other_dir="$work/other"
mkdir "$other_dir"
cp "$bin" "$other_dir/other_program"
expect_refusal "every rank must run the same program" mpiexec -n 1 "$bin" : -n 1 "$other_dir/other_program"
# a launcher of another MPI (Open MPI's variables) that started two processes.
expect_refusal "is not the launcher's" env OMPI_COMM_WORLD_SIZE=2 "$bin"
echo "test_distributed: all passed"
