#!/usr/bin/env bash
# Packs a PostgreSQL 15 server and the psycopg 3 wheels into .pg-carry/ (git-ignored), for
# the GPU machine, which has no PostgreSQL and no network. Run here, from anywhere:
#
#     bash bench/postgres_carry.sh        # then name .pg-carry in the device tool's `carry`
#
# .pg-carry/ holds one archive, pg.tar.xz or pg.tar.gz (whichever is smaller; the other is
# dropped), and MANIFEST (versions, the highest GLIBC_ symbol version the package needs).
# Inside the archive, under pg/:
#   lib/postgresql/15/bin/   initdb postgres pg_ctl pg_isready createdb psql (bin/ links here)
#   lib/postgresql/15/lib/   the server's own modules (plpgsql, snowball, conversions; no JIT)
#   share/postgresql/15/     postgres.bki, the system SQL, timezonesets, tsearch_data, ...
#   lib/*.so.*               every shared library they need except glibc's own and the C++
#                            runtime; lib/cxx/ holds this machine's libstdc++ and libgcc_s, for
#                            a host whose own are too old for ICU (GLIBCXX_3.4.30) - they need
#                            glibc 2.36, the rest 2.34 (MANIFEST says)
#   wheels/                  psycopg, psycopg-binary (+ typing_extensions) for CPython 3.12
# The binaries stay at Debian's relative places (lib/postgresql/15/bin beside
# share/postgresql/15) because PostgreSQL finds its share/ and module directories relative to
# its own executable when that layout holds, and falls back to /usr/... when it does not.
# bench/local_postgres.sh unpacks it and starts a server on the GPU machine.
set -euo pipefail
die() { echo "postgres_carry: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PGVER=${PGVER:-15}
SRC_BIN=/usr/lib/postgresql/$PGVER/bin
SRC_PKGLIB=/usr/lib/postgresql/$PGVER/lib
SRC_SHARE=/usr/share/postgresql/$PGVER
BINS="initdb postgres pg_ctl pg_isready createdb psql"
LIMIT_MIB=45

for b in $BINS; do [ -x "$SRC_BIN/$b" ] || die "missing $SRC_BIN/$b (apt-get install postgresql-$PGVER)"; done
[ -f "$SRC_SHARE/postgres.bki" ] || die "missing $SRC_SHARE/postgres.bki"
for t in ldd objdump tar gzip xz python3; do command -v $t >/dev/null || die "needs $t"; done

STAGE=$(mktemp -d /tmp/pg-carry-stage.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
P=$STAGE/pg
mkdir -p "$P/lib/postgresql/$PGVER/bin" "$P/lib/postgresql/$PGVER/lib" "$P/share/postgresql" "$P/wheels"

# binaries, at Debian's layout; bin/ is a relative link to them
for b in $BINS; do cp -p "$SRC_BIN/$b" "$P/lib/postgresql/$PGVER/bin/"; done
ln -s "lib/postgresql/$PGVER/bin" "$P/bin"
# the server's modules, without the JIT (llvmjit needs libLLVM, ~100 MiB; jit is off anyway)
find "$SRC_PKGLIB" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp -p {} "$P/lib/postgresql/$PGVER/lib/" \;
# share/: everything but the manual pages
cp -a "$SRC_SHARE" "$P/share/postgresql/"
rm -rf "$P/share/postgresql/$PGVER/man"

# shared libraries: the closure of what the binaries and modules need, less glibc (which
# must be the host's own: libc, libm, libresolv, libpthread, libdl, librt, ld-linux, nss)
is_glibc() {
  case $1 in
    linux-vdso.so*|ld-linux*|libc.so.*|libm.so.*|libresolv.so.*|libpthread.so.*|libdl.so.*|\
    librt.so.*|libutil.so.*|libanl.so.*|libnss_*|libBrokenLocale.so.*|libmvec.so.*|libthread_db.so.*) return 0 ;;
  esac
  return 1
}
declare -A seen=()
for f in "$P"/lib/postgresql/$PGVER/bin/* "$P"/lib/postgresql/$PGVER/lib/*.so; do
  [ -L "$f" ] && continue
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_glibc "$name" && continue
    [ "$path" = "not" ] && die "$f: $name not found here"
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    cp -L "$path" "$P/lib/$name"   # under its soname, the file itself (no links)
  done < <(ldd "$f" 2>/dev/null)
done
# the C++ runtime apart: local_postgres.sh uses the host's when it serves, these if not
mkdir -p "$P/lib/cxx"
for n in libstdc++.so.6 libgcc_s.so.1; do [ -f "$P/lib/$n" ] && mv "$P/lib/$n" "$P/lib/cxx/"; done
echo "libraries: ${#seen[@]} ($(du -sh "$P/lib" --exclude=postgresql | cut -f1))"

# every non-glibc library now resolves into the package: check with the package first on
# the search path and the system's postgres directories out of the way of the answer
bad=$(for f in "$P"/lib/postgresql/$PGVER/bin/* "$P"/lib/*.so* "$P"/lib/cxx/*; do
        LD_LIBRARY_PATH=$P/lib:$P/lib/cxx ldd "$f" | awk -v p="$P/lib/" '$2=="=>" && index($3,p)!=1 {print $1}'
      done | sort -u | while read -r n; do is_glibc "$n" || echo "$n"; done)
[ -z "$bad" ] || die "not resolved into the package: $bad"

# the highest glibc (and libstdc++) symbol versions the package asks for
maxver() { local f; for f in "$@"; do objdump -T "$f" 2>/dev/null; done | grep -o "$VPAT" | sort -uV | tail -1; }
VPAT='GLIBC_[0-9.]*'
GLIBC_MAX=$(maxver "$P"/lib/postgresql/$PGVER/bin/* "$P"/lib/*.so* "$P"/lib/postgresql/$PGVER/lib/*.so)
GLIBC_CXX=$(maxver "$P"/lib/cxx/*)
VPAT='GLIBCXX_[0-9.]*'
GLIBCXX_MAX=$(maxver "$P"/lib/postgresql/$PGVER/bin/* "$P"/lib/*.so* "$P"/lib/postgresql/$PGVER/lib/*.so)
echo "highest glibc symbol version needed: $GLIBC_MAX (with the carried C++ runtime: $GLIBC_CXX); libstdc++: $GLIBCXX_MAX"

# psycopg 3 for CPython 3.12 on manylinux x86_64
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  'psycopg[binary]>=3.1' -d "$P/wheels" || die "pip download of psycopg[binary] failed"
ls "$P"/wheels/psycopg_binary-*.whl >/dev/null 2>&1 || die "no psycopg_binary wheel was downloaded"
PSYCOPG_GLIBC=$(ls "$P"/wheels/psycopg_binary-*.whl | grep -o 'manylinux_2_[0-9]*' | sort -V | head -1 || true)

{
  echo "PostgreSQL: $("$SRC_BIN/postgres" -V)"
  echo "built on: $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "highest GLIBC_ symbol version needed: $GLIBC_MAX (host libstdc++ with $GLIBCXX_MAX);"
  echo "  $GLIBC_CXX when the host's libstdc++ is older and lib/cxx/ is used"
  echo "psycopg-binary wheel tag (lowest manylinux): ${PSYCOPG_GLIBC:-?}"
  echo "packed: $(date -u +%FT%TZ)"
  echo "wheels:"; (cd "$P/wheels" && ls -1 | sed 's/^/  /')
  echo "libraries:"; (cd "$P/lib" && ls -1 *.so* cxx/* | sed 's/^/  /')
} > "$P/MANIFEST"

OUTD=$ROOT/.pg-carry
grep -qxF '/.pg-carry/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.pg-carry/' >> "$ROOT/.git/info/exclude"
rm -rf "$OUTD"; mkdir -p "$OUTD"
# PG_CARRY_COMPRESS=gz|xz forces one; by default the smaller (xz: ~24 MiB against gzip's ~33;
# local_postgres.sh unpacks with tar, or with python's tarfile where tar or xz is missing)
tar -C "$STAGE" -cf - pg | gzip -9 > "$STAGE/pg.tar.gz"
tar -C "$STAGE" -cf - pg | xz -9e -T1 > "$STAGE/pg.tar.xz"
gz=$(stat -c %s "$STAGE/pg.tar.gz"); xzs=$(stat -c %s "$STAGE/pg.tar.xz")
case ${PG_CARRY_COMPRESS:-} in
  gz) pick=gz ;; xz) pick=xz ;; "") pick=gz; [ "$xzs" -lt "$gz" ] && pick=xz ;;
  *) die "PG_CARRY_COMPRESS is gz or xz" ;;
esac
cp "$STAGE/pg.tar.$pick" "$OUTD/"
cp "$P/MANIFEST" "$OUTD/MANIFEST"
echo "gzip $((gz / 1024)) KiB, xz $((xzs / 1024)) KiB; unpacked $(du -sh "$P" | cut -f1)"
size=$(du -sb "$OUTD" | cut -f1)
echo "$OUTD: $(ls "$OUTD" | tr '\n' ' ')= $((size / 1024)) KiB ($(awk -v s="$size" 'BEGIN{printf "%.1f", s/1048576}') MiB)"
[ "$size" -le $((LIMIT_MIB * 1048576)) ] || die "package is over $LIMIT_MIB MiB"
