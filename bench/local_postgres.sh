#!/usr/bin/env bash
# A throw-away PostgreSQL 15 server on a machine that has none (the GPU machine: no
# PostgreSQL, no network), from the package bench/postgres_carry.sh builds here.
# Here, once:   bash bench/postgres_carry.sh      (writes .pg-carry/; carry it, with .device-env)
# There:
#   source bench/local_postgres.sh                # start; the variables below are exported
#   python3 bench/storage_overhead.py --postgres "$GEMM_TUNE_PG_URL" ...
#   pg_stop                                       # or leave it: an EXIT trap stops it
#                                                 # (set only if the shell has no EXIT trap)
# or, executed: `bash bench/local_postgres.sh [--] CMD ARGS...` starts the server, runs CMD
# with the variables exported and stops the server after it (CMD's exit status is kept);
# with no CMD it starts one, leaves it running and prints `export ...` lines (for eval).
#
# What it does: unpacks .pg-carry/pg.tar.xz (or .gz) into /tmp/gemm-tune-pg.XXXXXX/pkg,
# installs the carried psycopg 3 wheels into /tmp/site (as .device-env/install.sh does with
# its wheels; --no-index) and puts /tmp/site on PYTHONPATH, initdb's a cluster there (trust
# auth, UTF8, C locale, the package's share/ via -L), starts it on a unix socket in that
# directory only (no TCP; fsync and the rest at their defaults, jit off, max_connections 200)
# and creates the database `gemmtune`. As root, the server runs as an unprivileged user
# (PostgreSQL refuses root): `postgres` if it exists, else `nobody`, else one made with
# useradd; switched to with runuser, setpriv, su or chroot --userspec, whichever works.
# Time zone: UTC, or GMT where the host has no /usr/share/zoneinfo (Debian's PostgreSQL
# reads the host's; GMT it knows without files; only named zones and pg_timezone_abbrevs
# then fail). The package's libraries reach only PostgreSQL's own processes (LD_LIBRARY_PATH is set
# per command, never exported), so python, torch and CUDA keep the host's.
#
# Exported: GEMM_TUNE_PG_URL and GEMM_TUNE_TEST_POSTGRES (the same URL, the name the tests
#   and bench/storage_overhead.py read): postgresql+psycopg://postgres@/gemmtune?host=DIR,
#   as .ci/postgres.sh forms it; GEMM_TUNE_TEST_PGCTL (a script: pg_ctl as the server's
#   user with its options; append `stop -m fast` or `start`; the restart test uses it);
#   GEMM_TUNE_PG_ROOT (the directory: data/, log, initdb.log, pkg/);
#   GEMM_TUNE_PG_PSQL (psql with its options: append `-c 'select 1'`).
# Settings (environment, all optional): GEMM_TUNE_PG_CARRY (the archive; default
#   .pg-carry/pg.tar.* of this checkout), GEMM_TUNE_PG_SITE (default /tmp/site),
#   GEMM_TUNE_PG_PYTHON (default python3), GEMM_TUNE_PG_DB (default gemmtune),
#   GEMM_TUNE_PG_OSUSER (the OS user the server runs as, when root), GEMM_TUNE_PG_SWITCH
#   (runuser|setpriv|su|chroot), GEMM_TUNE_PG_NO_TRAP=1 (sourced: no EXIT trap).
# Any failure is one line on stderr starting `local_postgres:`, and the sourced script
# returns 1 (executed: exits 1) with nothing left running.
# Needs on the host: glibc >= 2.34 and a libstdc++ with GLIBCXX_3.4.30 (else the carried
# one, which needs glibc 2.36); python3 with pip; tar (or python's tarfile).

_lp_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

_lp_fail() { echo "local_postgres: $*" >&2; return 1; }

# run "$@" as the server's OS user (root: through $_lp_switch; otherwise as we are)
_lp_as() {
  if [ -z "${_lp_uid:-}" ]; then (cd / && "$@"); return; fi
  case $_lp_switch in
    runuser) (cd / && runuser -u "$_lp_user" -- "$@") ;;
    setpriv) (cd / && setpriv --reuid="$_lp_uid" --regid="$_lp_gid" --clear-groups -- "$@") ;;
    su) (cd / && su -s /bin/sh "$_lp_user" -c "$(printf "'%s' " "$@")") ;;
    chroot) (cd / && chroot --userspec="$_lp_uid:$_lp_gid" --skip-chdir / "$@") ;;
  esac
}
_lp_pick_user() {
  # sets _lp_user/_lp_uid/_lp_gid/_lp_switch, and chowns $1 to that user
  local dir=$1 u s cands switches
  if [ -n "${GEMM_TUNE_PG_OSUSER:-}" ]; then cands=$GEMM_TUNE_PG_OSUSER; else cands="postgres nobody +postgres"; fi
  if [ -n "${GEMM_TUNE_PG_SWITCH:-}" ]; then switches=$GEMM_TUNE_PG_SWITCH; else switches="runuser setpriv su chroot"; fi
  for u in $cands; do
    if [ "${u#+}" != "$u" ]; then  # +name: create it
      u=${u#+}
      id "$u" >/dev/null 2>&1 || { command -v useradd >/dev/null && useradd --system --no-create-home \
        --shell /bin/sh "$u" >/dev/null 2>&1; } || { command -v adduser >/dev/null && \
        adduser -S -H -s /bin/sh "$u" >/dev/null 2>&1; } || continue
    fi
    _lp_uid=$(id -u "$u" 2>/dev/null) || continue
    _lp_gid=$(id -g "$u" 2>/dev/null) || continue
    [ "$_lp_uid" != 0 ] || continue
    chown "$_lp_uid:$_lp_gid" "$dir" 2>/dev/null || continue
    _lp_user=$u
    for s in $switches; do
      case $s in su) command -v su ;; *) command -v "$s" ;; esac >/dev/null || continue
      _lp_switch=$s
      # it works when the command runs as that user and can write the directory
      [ "$(_lp_as sh -c 'touch "$1/.w" && rm "$1/.w" && id -u' sh "$dir" 2>/dev/null)" = "$_lp_uid" ] && return 0
    done
  done
  _lp_uid=; _lp_fail "running as root and found no unprivileged user to run PostgreSQL as (tried: $cands; with: $switches)"
}

_lp_start() {
  local carry pkg pgbin share ldp py site tz out pgroot opts db
  command -v mktemp >/dev/null || { _lp_fail "mktemp is missing"; return 1; }
  # the archive
  carry=${GEMM_TUNE_PG_CARRY:-}
  if [ -z "$carry" ]; then
    for carry in "$_lp_here"/../.pg-carry/pg.tar.xz "$_lp_here"/../.pg-carry/pg.tar.gz ""; do
      [ -f "$carry" ] && break
    done
  fi
  if [ -n "${GEMM_TUNE_PG_CARRY:-}" ] && [ ! -f "$carry" ]; then
    _lp_fail "GEMM_TUNE_PG_CARRY=$carry: no such file"; return 1
  fi
  [ -n "$carry" ] && [ -f "$carry" ] || { _lp_fail "no .pg-carry/pg.tar.xz or .gz beside this checkout: run bench/postgres_carry.sh on the dev machine and carry .pg-carry"; return 1; }
  py=${GEMM_TUNE_PG_PYTHON:-python3}
  command -v "$py" >/dev/null || { _lp_fail "$py is missing"; return 1; }

  pgroot=$(mktemp -d /tmp/gemm-tune-pg.XXXXXX) || { _lp_fail "mktemp -d /tmp/... failed"; return 1; }
  GEMM_TUNE_PG_ROOT=$pgroot
  chmod 755 "$pgroot"
  mkdir "$pgroot/pkg"
  # unpack: tar (it calls xz or gzip), else python's tarfile
  if ! tar -xf "$carry" -C "$pgroot/pkg" 2>/dev/null; then
    rm -rf "$pgroot/pkg"; mkdir "$pgroot/pkg"
    "$py" -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' \
      "$carry" "$pgroot/pkg" || { _lp_fail "could not unpack $carry (tar and python tarfile both failed)"; return 1; }
  fi
  pkg=$pgroot/pkg/pg
  pgbin=$pkg/lib/postgresql/15/bin
  share=$pkg/share/postgresql/15
  for b in initdb postgres pg_ctl pg_isready createdb; do
    [ -x "$pgbin/$b" ] || { _lp_fail "the package lacks $b ($carry)"; return 1; }
  done
  [ -f "$share/postgres.bki" ] || { _lp_fail "the package lacks share/postgresql/15/postgres.bki"; return 1; }

  # the libraries: the host's C++ runtime if it serves, else the carried one
  ldp=$pkg/lib
  if ! out=$(env LD_LIBRARY_PATH="$ldp" "$pgbin/postgres" -V 2>&1); then
    ldp=$pkg/lib:$pkg/lib/cxx
    if ! out=$(env LD_LIBRARY_PATH="$ldp" "$pgbin/postgres" -V 2>&1); then
      _lp_fail "the packaged postgres does not run here ($(ldd --version 2>&1 | head -1); it needs GLIBC_2.34): $(echo "$out" | head -1)"
      return 1
    fi
  fi
  env LD_LIBRARY_PATH="$ldp" "$pgbin/initdb" -V >/dev/null 2>&1 || { _lp_fail "the packaged initdb does not run here: $(env LD_LIBRARY_PATH="$ldp" "$pgbin/initdb" -V 2>&1 | head -1)"; return 1; }

  # psycopg 3, from the carried wheels, into $site (on PYTHONPATH)
  site=${GEMM_TUNE_PG_SITE:-/tmp/site}
  case ":${PYTHONPATH:-}:" in *":$site:"*) ;; *) export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} ;; esac
  if ! "$py" -c 'import psycopg' >/dev/null 2>&1; then
    local wheels="$pkg/wheels/psycopg-*.whl $pkg/wheels/psycopg_binary-*.whl"
    "$py" -c 'from typing_extensions import Buffer' >/dev/null 2>&1 || wheels="$wheels $pkg/wheels/typing_extensions-*.whl"
    # shellcheck disable=SC2086
    out=$("$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --disable-pip-version-check --target "$site" $wheels 2>&1) \
      || { _lp_fail "pip could not install the carried psycopg wheels into $site: $(echo "$out" | grep -v '^ *$' | tail -1)"; return 1; }
    out=$("$py" -c 'import psycopg; print(psycopg.pq.__impl__)' 2>&1) \
      || { _lp_fail "psycopg does not import after the install: $(echo "$out" | tail -1)"; return 1; }
  fi

  # the OS user
  if [ "$(id -u)" = 0 ]; then
    _lp_pick_user "$pgroot" || return 1
  else
    _lp_uid=
  fi
  # time zone: UTC from the host's tzdata when there is one (PostgreSQL reads
  # /usr/share/zoneinfo), else GMT, which it knows without files
  tz=GMT; [ -f /usr/share/zoneinfo/UTC ] && tz=UTC

  if ! _lp_as env LD_LIBRARY_PATH="$ldp" TZ="$tz" LC_ALL=C "$pgbin/initdb" -D "$pgroot/data" \
      -A trust -U postgres -E UTF8 --locale=C -L "$share" >"$pgroot/initdb.log" 2>&1; then
    _lp_fail "initdb failed: $(grep -v '^ *$' "$pgroot/initdb.log" | tail -1) (log: $pgroot/initdb.log)"
    return 1
  fi
  opts="-k $pgroot -c listen_addresses= -c max_connections=200 -c jit=off -c timezone=$tz -c log_timezone=$tz"
  # pg_ctl as the server's user, with the package's libraries and these options: one
  # script, so that `$GEMM_TUNE_TEST_PGCTL start` works from any shell (the tests use sh)
  local inner="env LD_LIBRARY_PATH=$ldp $pgbin/pg_ctl -D $pgroot/data -o '$opts' -l $pgroot/log -w -t 60"
  {
    echo '#!/bin/sh'
    echo 'cd /'
    case ${_lp_uid:+$_lp_switch} in
      "") echo "exec $inner \"\$@\"" ;;
      runuser) echo "exec runuser -u $_lp_user -- $inner \"\$@\"" ;;
      setpriv) echo "exec setpriv --reuid=$_lp_uid --regid=$_lp_gid --clear-groups -- $inner \"\$@\"" ;;
      su) echo "exec su -s /bin/sh $_lp_user -c \"$inner \$*\"" ;;
      chroot) echo "exec chroot --userspec=$_lp_uid:$_lp_gid --skip-chdir / $inner \"\$@\"" ;;
    esac
  } > "$pgroot/pg_ctl.sh"
  chmod 755 "$pgroot/pg_ctl.sh"
  export GEMM_TUNE_TEST_PGCTL=$pgroot/pg_ctl.sh
  if ! "$pgroot/pg_ctl.sh" start >/dev/null 2>&1; then
    _lp_fail "the server did not start: $(grep -v '^ *$' "$pgroot/log" 2>/dev/null | tail -1) (log: $pgroot/log)"
    return 1
  fi
  local i
  for i in $(seq 1 60); do
    env LD_LIBRARY_PATH="$ldp" "$pgbin/pg_isready" -q -h "$pgroot" -U postgres && break
    sleep 0.5
  done
  env LD_LIBRARY_PATH="$ldp" "$pgbin/pg_isready" -q -h "$pgroot" -U postgres \
    || { _lp_fail "the server does not answer on $pgroot (log: $pgroot/log)"; return 1; }
  db=${GEMM_TUNE_PG_DB:-gemmtune}
  out=$(env LD_LIBRARY_PATH="$ldp" "$pgbin/createdb" -h "$pgroot" -U postgres "$db" 2>&1) \
    || { _lp_fail "createdb $db failed: $(echo "$out" | tail -1)"; return 1; }
  export GEMM_TUNE_PG_ROOT=$pgroot
  export GEMM_TUNE_PG_URL="postgresql+psycopg://postgres@/$db?host=$pgroot"
  export GEMM_TUNE_TEST_POSTGRES=$GEMM_TUNE_PG_URL
  export GEMM_TUNE_PG_PSQL="env LD_LIBRARY_PATH=$ldp $pgbin/psql -h $pgroot -U postgres -d $db"
  # a last check, through the driver python will use
  out=$("$py" -c 'import sys, psycopg
with psycopg.connect(host=sys.argv[1], user="postgres", dbname=sys.argv[2]) as c:
    print(c.execute("select version()").fetchone()[0].split(" on ")[0])' "$pgroot" "$db" 2>&1) \
    || { _lp_fail "psycopg cannot connect to the new server: $(echo "$out" | tail -1)"; return 1; }
  echo "local_postgres: $out as OS user ${_lp_user:-$(id -un)} via ${_lp_switch:-none}, up: $GEMM_TUNE_PG_URL" >&2
}

pg_stop() {
  [ -n "${GEMM_TUNE_PG_ROOT:-}" ] || return 0
  if [ -f "$GEMM_TUNE_PG_ROOT/data/postmaster.pid" ] && [ -n "${GEMM_TUNE_TEST_PGCTL:-}" ]; then
    eval "$GEMM_TUNE_TEST_PGCTL stop -m fast" >/dev/null 2>&1 \
      || eval "$GEMM_TUNE_TEST_PGCTL stop -m immediate" >/dev/null 2>&1 || true
  fi
  case $GEMM_TUNE_PG_ROOT in /tmp/gemm-tune-pg.*) rm -rf "$GEMM_TUNE_PG_ROOT" ;; esac
  unset GEMM_TUNE_PG_ROOT GEMM_TUNE_PG_URL GEMM_TUNE_TEST_POSTGRES GEMM_TUNE_TEST_PGCTL GEMM_TUNE_PG_PSQL
}

_lp_sourced=0
(return 0 2>/dev/null) && _lp_sourced=1
if [ "$_lp_sourced" = 1 ]; then
  if _lp_start; then
    if [ -z "${GEMM_TUNE_PG_NO_TRAP:-}" ] && [ -z "$(trap -p EXIT)" ]; then trap pg_stop EXIT; fi
    true
  else
    pg_stop >/dev/null 2>&1; false
  fi
else
  [ "${1:-}" = "--" ] && shift
  _lp_start || { pg_stop >/dev/null 2>&1; exit 1; }
  if [ $# -gt 0 ]; then
    trap pg_stop EXIT
    "$@"
    exit $?
  fi
  for v in GEMM_TUNE_PG_ROOT GEMM_TUNE_PG_URL GEMM_TUNE_TEST_POSTGRES GEMM_TUNE_TEST_PGCTL GEMM_TUNE_PG_PSQL PYTHONPATH; do
    printf 'export %s=%q\n' "$v" "${!v}"
  done
  echo "local_postgres: left running; stop: $GEMM_TUNE_TEST_PGCTL stop -m fast; rm -rf $GEMM_TUNE_PG_ROOT" >&2
fi
