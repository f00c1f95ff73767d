#!/usr/bin/env bash
# Runs one fuzz target under AFL++ (cargo-afl) for a number of minutes:
#
#   scripts/fuzz.sh TARGET MINUTES     e.g. scripts/fuzz.sh digest 4
#   scripts/fuzz.sh --list             the targets
#
# Installs cargo-afl (and builds its AFL++) if missing, builds the
# target's instrumented harness (in target/afl, apart from ordinary
# builds), and fuzzes from the committed corpus (fuzz/corpus/TARGET).
# Findings go to fuzz/out/TARGET/ (ignored by git): crashes/ and hangs/
# hold the inputs to look at, queue/ the inputs that reached new code.
# How a crash becomes a regression test: CONTRIBUTING.md, "Fuzzing".
set -euo pipefail
cd "$(dirname "$0")/.."

targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^idemgate-fuzz$')
if [ "${1:-}" = "--list" ]; then
  echo "$targets"
  exit 0
fi
if [ $# -ne 2 ] || ! grep -qx -- "$1" <<<"$targets" || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 TARGET MINUTES   (targets: $(echo $targets))" >&2
  exit 2
fi
target=$1
minutes=$2

if ! cargo afl --version >/dev/null 2>&1; then
  cargo install cargo-afl --locked
fi
# Builds AFL++ once per toolchain; says so (and fails) when it is built.
cargo afl config --build >/dev/null 2>&1 || true

export CARGO_TARGET_DIR=target/afl
cargo afl build --release -p idemgate-fuzz --features afl --bin "$target"

out=fuzz/out/$target
mkdir -p "$out"
# This machine is a shared VM: no CPU frequency governor to check, no
# core dump handler to change, and nobody at a terminal.
export AFL_SKIP_CPUFREQ=1
export AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
export AFL_NO_UI=1
export AFL_NO_AFFINITY=1
export AFL_SKIP_CRASHES=1
# Resume from an earlier run's queue when there is one.
input=fuzz/corpus/$target
if [ -d "$out/default/queue" ]; then
  input=-
fi
cargo afl fuzz -V $((minutes * 60)) -t 2000 -m none -i "$input" -o "$out" \
  "target/afl/release/$target"
stats=$out/default/fuzzer_stats
if [ -f "$stats" ]; then
  grep -E '^(execs_done|corpus_count|saved_crashes|saved_hangs|run_time)' "$stats"
fi
crashes=$(find "$out/default/crashes" -type f -name 'id:*' 2>/dev/null | wc -l)
if [ "$crashes" -gt 0 ]; then
  echo "$crashes crashing inputs in $out/default/crashes" >&2
  exit 1
fi
