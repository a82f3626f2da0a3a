// Writes the committed artifacts (ABI + creation and runtime bytecode with the runtime code's
// immutable references, which `cx chain deploy` needs to verify deployed code; nothing
// path-dependent)
// from a Forge output folder: node bin/export-artifacts.cjs <forge-out-dir> <dest-dir>.
// Rust reads them through alloy's `sol!`, so `cargo build` never needs Node or Forge.
'use strict';
const fs = require('fs');
const path = require('path');

// The deployable contracts; Escrow is abstract (its ABI is part of Settlement's).
const CONTRACTS = ['Settlement', 'ProviderRegistry', 'TestStablecoin', 'FrostGasProbe'];

const [outDir, destDir] = process.argv.slice(2);
if (!outDir || !destDir) {
  process.stderr.write('usage: export-artifacts.cjs <forge-out-dir> <dest-dir>\n');
  process.exit(2);
}
fs.mkdirSync(destDir, { recursive: true });
for (const name of CONTRACTS) {
  const src = JSON.parse(fs.readFileSync(path.join(outDir, `${name}.sol`, `${name}.json`), 'utf8'));
  const artifact = {
    contractName: name,
    abi: src.abi,
    bytecode: { object: src.bytecode.object },
    deployedBytecode: {
      object: src.deployedBytecode.object,
      // Byte ranges solc fills at construction, as [start, length] pairs in offset order.
      immutableRanges: Object.values(src.deployedBytecode.immutableReferences || {})
        .flat()
        .map((r) => [r.start, r.length])
        .sort((a, b) => a[0] - b[0]),
    },
  };
  fs.writeFileSync(path.join(destDir, `${name}.json`), JSON.stringify(artifact, null, 2) + '\n');
}
