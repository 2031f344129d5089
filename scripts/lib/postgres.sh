#!/usr/bin/env bash
# The PostgreSQL the tests run against. scripts/test sources this file and calls pg_ensure; it
# also runs on its own, around one command:
#
#   scripts/lib/postgres.sh psql -c 'select 1' "\$SPOTPLANE_TEST_POSTGRES_URL"
#
# pg_ensure decides, from SPOTPLANE_TEST_POSTGRES_URL:
# - a PostgreSQL at the URL (explicit or the default postgres://postgres@127.0.0.1:5432/test,
#   e.g. this machine's running one) lets the tests log in and query: it is used as it is;
# - the URL was set and nothing answers there, or it refuses the login: an error that says so
#   (a URL the user chose is never silently replaced);
# - the URL is the default and nothing answers there, or what answers refuses the login (the
#   cluster Debian's package starts wants a password): a throwaway PostgreSQL is started. Debian's
#   `postgresql` package is installed when no server binaries are found (apt-get, as root or
#   through sudo); `initdb` (trust auth, user postgres) into a temporary folder, run as the
#   `postgres` user when this script runs as root (initdb refuses root); `postgres` on a free port
#   of 127.0.0.1 with its socket in that folder; database `test`. SPOTPLANE_TEST_POSTGRES_URL is
#   exported pointing at it. pg_stop (the caller's EXIT trap) stops it by its PID and removes the
#   folder.
#
# Sourcing this file defines functions and variables prefixed pg_ and changes no shell options.

pg_default_url=postgres://postgres@127.0.0.1:5432/test
pg_pid=""
pg_dir=""

# pg_host_port URL: prints "HOST PORT" of a postgres:// URL (port 5432 when it has none).
pg_host_port() {
  local hostport=${1#*://}
  hostport=${hostport%%/*}
  hostport=${hostport%%\?*}
  hostport=${hostport##*@}
  local host=${hostport%:*} port=${hostport##*:}
  [ "$host" = "$hostport" ] && port=5432
  [ -n "$host" ] || host=127.0.0.1
  printf '%s %s\n' "$host" "$port"
}

# pg_answers URL: whether something accepts TCP connections at the URL's host and port.
pg_answers() {
  local host port
  read -r host port < <(pg_host_port "$1")
  timeout 5 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null
}

# pg_bindir: prints the folder with initdb, postgres, pg_isready and psql: the newest of Debian's
# /usr/lib/postgresql/*/bin, else the one on PATH; fails when there is none.
pg_bindir() {
  local dir
  dir=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | while read -r d; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_isready" ] && [ -x "$d/psql" ] && echo "$d"
  done | tail -n 1)
  if [ -z "$dir" ] && command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
    dir=$(dirname "$(command -v initdb)")
    [ -x "$dir/pg_isready" ] && [ -x "$dir/psql" ] || dir=""
  fi
  [ -n "$dir" ] && echo "$dir"
}

# pg_install: Debian's postgresql package; root installs it directly, others through sudo.
pg_install() {
  local sudo_=""
  [ "$(id -u)" -ne 0 ] && sudo_="sudo"
  echo "installing Debian's postgresql package (apt-get install postgresql)"
  $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq --no-install-recommends postgresql >/dev/null \
    || { echo "error: could not install PostgreSQL (apt-get install postgresql); install it, or start one and set SPOTPLANE_TEST_POSTGRES_URL" >&2; return 1; }
}

pg_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# pg_start: starts the throwaway PostgreSQL and exports SPOTPLANE_TEST_POSTGRES_URL at it.
pg_start() {
  local bin
  if ! bin=$(pg_bindir); then
    pg_install || return 1
    bin=$(pg_bindir) || {
      echo "error: the postgresql package is installed but no initdb/postgres/pg_isready/psql was found in /usr/lib/postgresql/*/bin" >&2
      return 1
    }
  fi
  # initdb and postgres refuse to run as root: as root they run as the postgres user (which
  # Debian's package creates), everyone else runs them as themselves.
  local as=()
  if [ "$(id -u)" -eq 0 ]; then
    id -u postgres >/dev/null 2>&1 || {
      echo "error: running as root, and there is no 'postgres' user to run the throwaway PostgreSQL as (install Debian's postgresql package, or run scripts/test as a normal user)" >&2
      return 1
    }
    as=(setpriv --reuid=postgres --regid=postgres --init-groups --reset-env --)
  fi
  # In /tmp whatever TMPDIR says: the postgres user must reach it, and the socket's path must
  # stay under the 107 bytes a Unix socket allows.
  pg_dir=$(mktemp -d /tmp/spotplane-postgres.XXXXXX) || { echo "error: could not create a temporary folder for PostgreSQL" >&2; return 1; }
  [ "$(id -u)" -eq 0 ] && chown postgres: "$pg_dir"
  echo "starting a throwaway PostgreSQL ($bin) in $pg_dir"
  if ! (cd "$pg_dir" && "${as[@]}" "$bin/initdb" -D "$pg_dir/data" -U postgres -A trust -E UTF8 \
    --locale=C --no-sync >"$pg_dir/initdb.log" 2>&1); then
    echo "error: initdb failed; its log ($pg_dir/initdb.log):" >&2
    tail -n 40 "$pg_dir/initdb.log" >&2
    return 1
  fi
  local port attempt
  for attempt in 1 2 3; do
    port=$(pg_free_port) || { echo "error: could not find a free port (python3 is needed)" >&2; return 1; }
    # exec: the PID in $! is postgres itself (setpriv execs too), the one pg_stop signals.
    # Nothing here must survive a crash, so durability is off: the tests run faster.
    (cd "$pg_dir" && exec "${as[@]}" "$bin/postgres" -D "$pg_dir/data" -p "$port" \
      -c listen_addresses=127.0.0.1 -c unix_socket_directories="$pg_dir" -c max_connections=200 \
      -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
      >"$pg_dir/postgres.log" 2>&1) &
    pg_pid=$!
    for _ in $(seq 1 100); do
      "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres && break
      kill -0 "$pg_pid" 2>/dev/null || break
      sleep 0.1
    done
    if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then
      break
    fi
    # Another process may have taken the port between pg_free_port and the bind: try another.
    if kill -0 "$pg_pid" 2>/dev/null || [ "$attempt" -eq 3 ] || ! grep -q 'could not bind' "$pg_dir/postgres.log"; then
      echo "error: the throwaway PostgreSQL did not start; its log ($pg_dir/postgres.log):" >&2
      tail -n 40 "$pg_dir/postgres.log" >&2
      return 1
    fi
    wait "$pg_pid" 2>/dev/null || true
    pg_pid=""
  done
  "$bin/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null \
    || { echo "error: could not create database test in the throwaway PostgreSQL ($pg_dir/postgres.log)" >&2; return 1; }
  export SPOTPLANE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/test"
  echo "throwaway PostgreSQL (PID $pg_pid) at $SPOTPLANE_TEST_POSTGRES_URL"
}

# pg_stop: stops the throwaway PostgreSQL, if one was started, by its PID (fast shutdown, then
# SIGKILL after 10 s) and removes its folder. Safe to call more than once.
pg_stop() {
  if [ -n "$pg_pid" ]; then
    kill -INT "$pg_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pg_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pg_pid" 2>/dev/null && kill -KILL "$pg_pid" 2>/dev/null
    wait "$pg_pid" 2>/dev/null || true
    pg_pid=""
  fi
  if [ -n "$pg_dir" ]; then
    rm -rf "$pg_dir"
    pg_dir=""
  fi
}

# pg_accepts URL: whether the tests can log in at URL and query (psql, 5 s); when not, pg_why
# holds psql's error. Without a psql anywhere it cannot tell, and says yes.
pg_why=""
pg_accepts() {
  local bin psql=psql out
  if bin=$(pg_bindir); then
    psql=$bin/psql
  elif ! command -v psql >/dev/null 2>&1; then
    return 0
  fi
  if out=$(PGCONNECT_TIMEOUT=5 "$psql" "$1" -XAtq -c 'SELECT 1' 2>&1); then
    return 0
  fi
  pg_why=$(printf '%s' "$out" | head -n 1)
  return 1
}

# pg_ensure: see the top of this file. Returns non-zero, after one clear error line, when there
# is no PostgreSQL to test against.
pg_ensure() {
  local url=${SPOTPLANE_TEST_POSTGRES_URL:-}
  if [ -n "$url" ]; then
    if ! pg_answers "$url"; then
      echo "error: PostgreSQL is not reachable at SPOTPLANE_TEST_POSTGRES_URL=$url (set by you; unset it to let scripts/test start a throwaway one)" >&2
      return 1
    fi
    if ! pg_accepts "$url"; then
      echo "error: the PostgreSQL at SPOTPLANE_TEST_POSTGRES_URL=$url (set by you) does not let the tests in: $pg_why" >&2
      return 1
    fi
    return 0
  fi
  if pg_answers "$pg_default_url"; then
    if pg_accepts "$pg_default_url"; then
      export SPOTPLANE_TEST_POSTGRES_URL=$pg_default_url
      return 0
    fi
    # E.g. the cluster Debian's package starts, which wants a password over TCP.
    echo "something answers at $pg_default_url but does not let the tests in ($pg_why)"
  else
    echo "nothing answers at $pg_default_url"
  fi
  pg_start
}

# Run on its own: ensure a PostgreSQL, run the command with SPOTPLANE_TEST_POSTGRES_URL set,
# stop what was started.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  trap pg_stop EXIT
  pg_ensure
  if [ "$#" -gt 0 ]; then
    "$@"
  else
    echo "SPOTPLANE_TEST_POSTGRES_URL=$SPOTPLANE_TEST_POSTGRES_URL"
  fi
fi
