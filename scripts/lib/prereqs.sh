#!/usr/bin/env bash
# What scripts/test needs before it starts, checked at once: each missing thing is one line
# saying what it is and how to get it, all of them before it gives up. scripts/test sources this
# file and calls prereqs_check; it also runs on its own (scripts/lib/prereqs.sh).
#
# Not checked here, because scripts/test installs them itself when they are missing: PostgreSQL
# (scripts/lib/postgres.sh), chromium and podman (apt-get), the Python and npm packages (into
# ~/.cache/spotplane), Terraform and checkov (scripts/test-terraform).

# prereqs_check REPO: prints "missing: …" lines on stderr and returns 1 if anything is missing;
# a note, not a failure, for cargo-nextest (the tests fall back to cargo test without it).
prereqs_check() {
  local repo=${1:-.} missing=()
  local channel
  channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$repo/rust-toolchain.toml" 2>/dev/null)
  if ! command -v cargo >/dev/null 2>&1; then
    missing+=("cargo: install rustup (https://rustup.rs, or apt-get install rustup); it installs the pinned toolchain ${channel:-from rust-toolchain.toml}")
  elif [ -z "$channel" ]; then
    missing+=("rust-toolchain.toml with a channel in $repo (is this a spotplane checkout?)")
  else
    local rustc
    rustc=$(cd "$repo" && rustc --version 2>/dev/null) || rustc=""
    case "$rustc" in
      "rustc $channel "* | "rustc $channel") ;;
      *)
        missing+=("the pinned Rust toolchain $channel (rust-toolchain.toml; found: ${rustc:-none}): rustup toolchain install $channel --profile minimal --component rustfmt,clippy")
        ;;
    esac
    if [ -n "$rustc" ]; then
      (cd "$repo" && cargo fmt --version >/dev/null 2>&1) \
        || missing+=("rustfmt for Rust $channel: rustup component add rustfmt --toolchain $channel")
      (cd "$repo" && cargo clippy --version >/dev/null 2>&1) \
        || missing+=("clippy for Rust $channel: rustup component add clippy --toolchain $channel")
    fi
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    missing+=("python3 (3.11 or newer, with venv; the emulators and Terraform's checks run in virtual environments): apt-get install python3 python3-venv")
  elif ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    missing+=("python3 3.11 or newer (found $(python3 --version 2>&1)): apt-get install python3 python3-venv, or put a newer python3 first on PATH")
  elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=("python3's venv (python3 -m venv needs ensurepip): apt-get install python3-venv")
  fi
  command -v node >/dev/null 2>&1 \
    || missing+=("node (Azurite, the Azure Blob emulator, runs on it): apt-get install nodejs npm")
  command -v npm >/dev/null 2>&1 \
    || missing+=("npm (installs Azurite into ~/.cache/spotplane/npm): apt-get install npm")
  command -v curl >/dev/null 2>&1 \
    || missing+=("curl (waits for the emulators to answer): apt-get install curl")
  command -v git >/dev/null 2>&1 \
    || missing+=("git: apt-get install git")
  if command -v cargo >/dev/null 2>&1 && ! (cd "$repo" && cargo nextest --version >/dev/null 2>&1); then
    echo "note: cargo-nextest is not installed; the tests run with cargo test instead (cargo install cargo-nextest --locked)" >&2
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    local m
    for m in "${missing[@]}"; do echo "missing: $m" >&2; done
    echo "error: scripts/test needs the ${#missing[@]} thing(s) above" >&2
    return 1
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  prereqs_check "$(cd "$(dirname "$0")/../.." && pwd)"
  echo "all prerequisites are here"
fi
