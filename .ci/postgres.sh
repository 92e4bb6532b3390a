#!/usr/bin/env bash
# Makes sure a PostgreSQL server is reachable for the tests and prints the
# admin URL they should use. Order of preference:
#   1. $SESSIONSTORE_TEST_POSTGRES_URL, or the local server on 127.0.0.1:5432, if it answers;
#   2. the local cluster, started with pg_ctlcluster, if it is installed but down;
#   3. Debian's postgresql package, installed (as root) and started.
set -euo pipefail

url="${SESSIONSTORE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

answers() {
  command -v psql >/dev/null 2>&1 && psql "$1" -tAc 'select 1' >/dev/null 2>&1
}

wait_for() {
  for _ in $(seq 1 60); do
    answers "$1" && return 0
    sleep 0.5
  done
  return 1
}

if answers "$url"; then
  echo "$url"
  exit 0
fi

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "PostgreSQL is not installed: installing Debian's postgresql package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
echo "starting PostgreSQL $version" >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true

if wait_for "$url"; then
  echo "$url"
  exit 0
fi

# A fresh Debian install asks for a password over TCP: give the postgres
# role one for the tests.
su postgres -c "psql -qc \"ALTER USER postgres PASSWORD 'sessionstore'\"" >&2
url="postgres://postgres:sessionstore@127.0.0.1:5432/postgres"
if wait_for "$url"; then
  echo "$url"
  exit 0
fi
echo "PostgreSQL did not come up" >&2
exit 1
