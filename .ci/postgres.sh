#!/usr/bin/env bash
# A throw-away PostgreSQL server for the tests: `source .ci/postgres.sh start` starts one
# on a unix socket in a temporary data directory (as the unprivileged `postgres` user when
# run as root: initdb and postgres refuse root), creates the database `gemmtune`, and
# exports GEMM_TUNE_TEST_POSTGRES (its URL) and GEMM_TUNE_TEST_PGCTL (the command that
# stops/starts it, for the restart test). `pg_stop` stops it and removes the directory.
set -euo pipefail
_pg_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && { echo "$d"; return; }
  done
  return 1
}
if ! PGBIN=$(_pg_bin); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    PGBIN=$(_pg_bin)
  else
    echo "PostgreSQL server binaries (initdb, postgres) are missing; install Debian's postgresql" >&2
    exit 1
  fi
fi
PGROOT=$(mktemp -d /tmp/gemm-tune-pg.XXXXXX)
chmod 755 "$PGROOT"
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  chown postgres "$PGROOT"
  _as_pg() { runuser -u postgres -- "$@"; }
else
  _as_pg() { "$@"; }
fi
_as_pg "$PGBIN/initdb" -D "$PGROOT/data" -A trust -U postgres >/dev/null
_sudo=""; [ "$(id -u)" = 0 ] && _sudo="runuser -u postgres --"
export GEMM_TUNE_TEST_PGCTL="$_sudo $PGBIN/pg_ctl -D $PGROOT/data -o '-k $PGROOT -c listen_addresses= -c max_connections=200' -l $PGROOT/log -w -t 60"
eval "$GEMM_TUNE_TEST_PGCTL start" >/dev/null
_as_pg "$PGBIN/createdb" -h "$PGROOT" -U postgres gemmtune
export GEMM_TUNE_TEST_POSTGRES="postgresql+psycopg://postgres@/gemmtune?host=$PGROOT"
pg_stop() {
  eval "$GEMM_TUNE_TEST_PGCTL stop -m immediate" >/dev/null 2>&1 || true
  rm -rf "$PGROOT"
}
set +e +u +o pipefail
