#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 with a role and a
# database for Mercator's tests, and prints the DSN to use (and nothing else)
# on stdout:
#
#   MERCATOR_TEST_POSTGRES=$(bash scripts/ensure-postgres.sh) go test ./store/...
#
# What it does, each step only when needed, so running it again is cheap and
# changes nothing:
#   1. installs Debian's postgresql package when no server binary is present
#      (apt-get update first);
#   2. starts a server when nothing answers on 127.0.0.1:5432: the packaged
#      cluster on that port through pg_ctlcluster (which runs pg_ctl itself
#      where there is no systemd, as in a container), or else a cluster of its
#      own in /var/lib/postgresql/mercator-VERSION started with pg_ctl as the
#      postgres user;
#   3. creates the role mercator (password mercator, CREATEDB) and the
#      database mercator_test it owns, as the postgres superuser over the
#      local socket;
#   4. waits until the DSN accepts connections.
# Tests make a schema of their own per run inside mercator_test, so the
# database itself is never emptied or dropped here. Run as root (installing
# and starting need it); a server already serving the DSN needs nothing.
# Progress goes to stderr.
set -euo pipefail

host=127.0.0.1
port=5432
role=mercator
password=mercator
db=mercator_test
dsn="postgres://$role:$password@$host:$port/$db?sslmode=disable"
socket_dir=/var/run/postgresql

log() { echo "ensure-postgres: $*" >&2; }

# dsn_works: the test DSN opens a session (psql may be absent before step 1).
dsn_works() {
  command -v psql >/dev/null 2>&1 && psql "$dsn" -qAtc 'SELECT 1' >/dev/null 2>&1
}

# bin_dir: the newest installed server's bin directory, or nothing.
bin_dir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/postgres" ]; then echo "$d"; fi
}

answers() { "$bin/pg_isready" -h "$host" -p "$port" -q; }

# as_postgres runs a command as the postgres user from a directory it can
# read (the caller's may not be).
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

if dsn_works; then
  echo "$dsn"
  exit 0
fi

bin=$(bin_dir)
if [ -z "$bin" ]; then
  log "no PostgreSQL server installed; installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
  bin=$(bin_dir)
  if [ -z "$bin" ]; then
    log "the postgresql package installed no server under /usr/lib/postgresql"
    exit 1
  fi
fi
version=$(basename "$(dirname "$bin")")

if ! answers; then
  if [ "$(id -u)" -ne 0 ]; then
    log "nothing answers on $host:$port and starting a server needs root"
    exit 1
  fi
  mkdir -p "$socket_dir"
  chown postgres:postgres "$socket_dir"
  chmod 2775 "$socket_dir"

  # The packaged cluster on our port, if there is one ("VERSION NAME").
  cluster=""
  if command -v pg_lsclusters >/dev/null 2>&1; then
    cluster=$(pg_lsclusters -h 2>/dev/null | awk -v p="$port" '$3 == p { print $1, $2; exit }')
  fi
  if [ -n "$cluster" ]; then
    log "starting cluster $cluster with pg_ctlcluster"
    # shellcheck disable=SC2086 # two words on purpose
    pg_ctlcluster $cluster start >&2 || log "pg_ctlcluster $cluster start failed"
  fi

  if ! answers; then
    data=/var/lib/postgresql/mercator-$version
    if [ ! -s "$data/PG_VERSION" ]; then
      log "creating a cluster in $data"
      mkdir -p "$data"
      chown postgres:postgres "$data"
      chmod 700 "$data"
      as_postgres "$bin/initdb" -D "$data" -U postgres -E UTF8 --no-locale \
        --auth-local=peer --auth-host=scram-sha-256 >/dev/null
    fi
    log "starting the server in $data (log: $data/server.log)"
    as_postgres "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
      -o "-c listen_addresses=$host -p $port -c unix_socket_directories=$socket_dir" start >/dev/null ||
      { tail -n 30 "$data/server.log" >&2 || true; exit 1; }
  fi
fi

for _ in $(seq 1 60); do
  answers && break
  sleep 1
done
if ! answers; then
  log "PostgreSQL did not answer on $host:$port within 60s"
  exit 1
fi

if ! dsn_works; then
  if [ "$(id -u)" -ne 0 ] || [ ! -S "$socket_dir/.s.PGSQL.$port" ]; then
    log "a server answers on $host:$port but $dsn does not work, and creating the role needs root and the server's socket in $socket_dir"
    exit 1
  fi
  log "creating role $role and database $db"
  su_psql() { as_postgres psql -h "$socket_dir" -p "$port" -d postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
  if [ "$(su_psql -c "SELECT 1 FROM pg_roles WHERE rolname = '$role'")" = 1 ]; then
    su_psql -c "ALTER ROLE $role LOGIN CREATEDB PASSWORD '$password'" >&2
  else
    su_psql -c "CREATE ROLE $role LOGIN CREATEDB PASSWORD '$password'" >&2
  fi
  if [ "$(su_psql -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]; then
    su_psql -c "CREATE DATABASE $db OWNER $role" >&2
  fi
fi

for _ in $(seq 1 30); do
  if dsn_works; then
    log "PostgreSQL $version is up; DSN follows on stdout"
    echo "$dsn"
    exit 0
  fi
  sleep 1
done
log "PostgreSQL answers on $host:$port but $dsn does not accept connections"
exit 1
