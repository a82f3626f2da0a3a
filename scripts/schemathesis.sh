#!/usr/bin/env bash
# Schema-driven fuzzing of the HTTP APIs: schemathesis (PyPI, pinned) against the /openapi.json
# of a server on loopback, every check on. TARGET=exchange (the default): a `cx serve` (plain
# HTTP, a throwaway database, no chains). TARGET=provider: a `cx-provider serve` on a tiny
# generated model with two adapters and an adapter root, training on. It is the long,
# exploratory part of the hostile-input tests and is not run by scripts/test.sh; what it found
# and what was fixed is in docs/reliability.md.
#
#   scripts/schemathesis.sh                          # the exchange, 30 examples per operation
#   TARGET=provider scripts/schemathesis.sh          # the provider
#   EXAMPLES=200 scripts/schemathesis.sh             # more; extra arguments go to `st run`
#   SCHEMATHESIS_VENV=/tmp/st scripts/schemathesis.sh   # where schemathesis is installed
#
# The exit status is schemathesis's (non-zero while it reports failures).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${TARGET:-exchange}"
case "$target" in
  exchange) scripts/setup.sh >&2 ;;
  provider) ;; # no database, no chains
  *) echo "schemathesis: TARGET is exchange or provider, not $target" >&2; exit 2 ;;
esac

venv="${SCHEMATHESIS_VENV:-.tools/schemathesis}"
[[ "$venv" == /* ]] || venv="$root/$venv"
if ! "$venv/bin/st" --version >/dev/null 2>&1; then
  echo "schemathesis: installing schemathesis into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'schemathesis==4.32.5'
fi

if [[ "$target" == provider ]]; then
  cargo build -q -p cx-provider --bin cx-provider
  port="${PORT:-19001}"
  work="$(mktemp -d -t cx-schemathesis-provider.XXXXXX)"
  bin=target/debug/cx-provider
  # The tests' tiny model (provider/tests/it/common.rs): a forward costs microseconds, so
  # every generated completion runs for real.
  "$bin" gen-model --out "$work/model" --hidden 32 --layers 2 --heads 4 --kv-heads 2 \
    --intermediate 48 --vocab 300 --max-positions 64 --seed 1 >/dev/null
  "$bin" gen-adapters --model "$work/model" --out "$work/adapters" --count 2 --ranks 4 \
    --seed 2 >/dev/null
  mkdir -p "$work/root"
  cp -r "$work/adapters/adapter-000" "$work/root/extra"
  log="$work/serve.log"
  "$bin" serve --model "$work/model" --served-model-name tiny --adapters "$work/adapters" \
    --adapter-root "$work/root" --training-dir "$work/trained" --host 127.0.0.1 \
    --port "$port" --max-training-clients 1024 >"$log" 2>&1 &
  serve=$!
  trap 'kill "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true; rm -rf "$work"' EXIT
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$serve" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
  done
  echo "schemathesis: cx-provider serve on 127.0.0.1:$port (log $log)" >&2
  config="$work/schemathesis.toml"
  # Each exclusion is one check on the operations where it reports no defect: the body is
  # schema-valid but what makes it acceptable is not the API's to describe.
  # The checks are all enabled here, not by `--checks all`, which would override the
  # per-operation lines. --max-training-clients is raised above: a run creates hundreds of
  # clients, and the limit's 503 `training_limit` (with Retry-After) is by design.
  cat >"$config" <<'TOML'
[checks]
enabled = true

# Token ids must be in the served model's vocabulary and prompt + max_tokens within its
# context (300 and 64 here): properties of the model loaded, not of the API, so a schema-valid
# completion or sample can be refused 400 (`context_length_exceeded`, `invalid_request`).
[[operations]]
include-operation-id = ["create_completion", "create_chat_completion", "sample"]
checks.positive_data_acceptance.enabled = false

# lora_path must name a PEFT adapter folder under an --adapter-root: a generated string is
# refused 400 `invalid_lora_path` or 422 `invalid_adapter` by design.
[[operations]]
include-operation-id = "load_lora_adapter"
checks.positive_data_acceptance.enabled = false

# rank is bounded by the server's --max-lora-rank (64 by default) and alpha / rank must be a
# finite f32 scale: limits of the running server, refused 400 with the flag named.
[[operations]]
include-operation-id = "create_training_client"
checks.positive_data_acceptance.enabled = false

# loss_mask must have the shape of tokens (a row per sequence, a weight per token) and the
# tokens must be in the vocabulary: relations between fields a schema cannot state.
[[operations]]
include-operation-id = "forward_backward"
checks.positive_data_acceptance.enabled = false

# optim_step applies the gradients of earlier forward_backward calls: on a client with none
# it is refused 400 "call forward_backward first", whatever the body.
[[operations]]
include-operation-id = "optim_step"
checks.positive_data_acceptance.enabled = false
TOML
  status=0
  # From the work folder: schemathesis keeps its cache of crashes in the current directory.
  (cd "$work" && "$venv/bin/st" --config-file "$config" run \
    "http://127.0.0.1:$port/openapi.json" --max-examples "${EXAMPLES:-30}" --workers 1 \
    "$@") || status=$?
  # A 5xx is logged by the server: show them beside schemathesis's report.
  grep -i "panick" "$log" >&2 || true
  exit "$status"
fi

cargo build -q -p cx-cli --bin cx
port="${PORT:-18443}"
db="${SCHEMATHESIS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/cx_schemathesis}"
log="$(mktemp -t cx-schemathesis-serve.XXXXXX.log)"
target/debug/cx serve --listen "127.0.0.1:$port" --insecure-http --database-url "$db" \
  >"$log" 2>&1 &
serve=$!
trap 'kill "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  kill -0 "$serve" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.2
done
echo "schemathesis: cx serve on 127.0.0.1:$port (log $log)" >&2
work="$(mktemp -d -t cx-schemathesis-exchange.XXXXXX)"
trap 'kill "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true; rm -rf "$work"' EXIT
config="$work/schemathesis.toml"
# As for the provider: every check on, and each exclusion one check on the operations where a
# schema-valid body is refused for what no schema can say. This server runs with no chains and
# no settlement (a throwaway database), so:
cat >"$config" <<'TOML'
[checks]
enabled = true

# Signed orders and what carries a signature (an EIP-712 signature that must recover the
# account, an ML-DSA signature under a bound key, a provider's signed offer or receipt), on a
# chain this exchange serves: a generated body is refused 400/401 by design. The bodies' shapes
# are checked by the other checks, and their decoders by the cargo fuzz targets.
[[operations]]
include-operation-id = ["bind", "submit_intent", "submit_reserve", "submit_rent", "submit_search", "open", "register", "result", "claim_rent", "bid", "take_or_pay", "witness"]
checks.positive_data_acceptance.enabled = false

# chain_id must be a chain this exchange serves (GET /v1/chains; none in this run).
[[operations]]
include-operation-id = ["claim", "eip712"]
checks.positive_data_acceptance.enabled = false

# A session key (cxs_…) must name an open session: any other is 401 whatever the body, and
# which bodies a session may send (its model, its price cap) is the session's, not the schema's.
[[operations]]
include-operation-id = ["chat_completions", "completions"]
checks.positive_data_acceptance.enabled = false

# adapter_config and the dataset are JSON documents inside strings (and adapter weights base64
# safetensors): what makes them acceptable is a PEFT config and a tokenised dataset.
[[operations]]
include-operation-id = ["put", "put_dataset"]
checks.positive_data_acceptance.enabled = false

# Closing a tab needs settlement (cx serve --settlement): here it is 503 `not_settling`, with
# Retry-After, by design.
[[operations]]
include-operation-id = "close_tab"
checks.not_a_server_error.enabled = false
checks.positive_data_acceptance.enabled = false
TOML
# From the work folder: schemathesis keeps its cache of crashes in the current directory.
(cd "$work" && "$venv/bin/st" --config-file "$config" run "http://127.0.0.1:$port/openapi.json" \
  --max-examples "${EXAMPLES:-30}" --workers 1 "$@")
