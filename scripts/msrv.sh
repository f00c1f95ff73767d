#!/usr/bin/env bash
# The declared minimum Rust version (`rust-version` in Cargo.toml) is the
# version CI builds with: only one toolchain can be installed where CI runs,
# so a lower declaration would be a claim nothing checks. Fails when the
# toolchain building the workspace is not the declared version.
set -euo pipefail
cd "$(dirname "$0")/.."
declared=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
built=$(rustc --version | awk '{print $2}')
case "$built" in
  "$declared" | "$declared".*) echo "msrv: building with rustc $built, declared $declared" ;;
  *) echo "msrv: rust-version is $declared but CI builds with rustc $built: declare what CI builds with" >&2; exit 1 ;;
esac
