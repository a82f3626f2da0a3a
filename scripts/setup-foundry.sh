#!/usr/bin/env bash
# Installs the pinned non-Rust toolchain (Anvil, Forge, Cast, solc-js, OpenZeppelin) into the
# project-local, git-ignored folder `.tools/`. Idempotent: a second run with the same pins does
# nothing but check that the binaries run. Versions are pinned in contracts/package.json.
#
# Why npm: the Foundry npm packages carry the native binaries as platform packages
# (@foundry-rs/forge-linux-amd64, ...), so the only network this needs is the npm registry.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
# Direct versions pinned in package.json, every transitive one (with integrity hashes) in
# package-lock.json; `npm ci` installs exactly that.
pins="$root/contracts/package.json"
lock="$root/contracts/package-lock.json"
stamp="$tools/.installed-pins"

mkdir -p "$tools"
if [[ ! -f "$stamp" ]] || ! cat "$pins" "$lock" | cmp -s - "$stamp"; then
  cp "$pins" "$tools/package.json"
  cp "$lock" "$tools/package-lock.json"
  # The postinstall scripts of @foundry-rs/* only print hints; the binaries come from the
  # platform package, so --ignore-scripts keeps the install free of other downloads.
  npm ci --prefix "$tools" --no-audit --no-fund --ignore-scripts >&2
  cat "$pins" "$lock" >"$stamp"
fi

# The native binaries, called directly (the node wrapper would add a process per call).
for tool in anvil forge cast; do
  bin="$tools/node_modules/@foundry-rs/$tool-linux-amd64/bin/$tool"
  if [[ ! -x "$bin" ]]; then
    echo "setup-foundry: $bin missing; only linux x86-64 is supported by this setup" >&2
    exit 1
  fi
  ln -sf "$bin" "$tools/$tool"
  "$tools/$tool" --version >/dev/null
done
"$root/contracts/bin/solc" --version >/dev/null
echo "setup-foundry: ok ($("$tools/forge" --version | head -1); solc $("$root/contracts/bin/solc" --version | sed -n 's/^Version: //p'))" >&2
