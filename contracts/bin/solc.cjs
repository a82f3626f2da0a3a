// Forge speaks to a solc binary in two ways: `solc --version` (it parses the `Version:` line)
// and `solc --standard-json` (input on stdin, output on stdout). solc-js has the same compiler
// compiled to WebAssembly; this wrapper maps those two calls onto it.
'use strict';
const path = require('path');
const fs = require('fs');
const solc = require(path.join(__dirname, '..', '..', '.tools', 'node_modules', 'solc'));

const args = process.argv.slice(2);
function main() {
if (args.includes('--version')) {
  // solc-js reports e.g. "0.8.30+commit.73712a01.Emscripten.clang".
  process.stdout.write(
    'solc, the solidity compiler commandline interface\nVersion: ' + solc.version() + '\n',
  );
  return;
}
if (args.includes('--standard-json')) {
  const input = fs.readFileSync(0, 'utf8');
  // Imports are resolved by Forge into `sources` already; anything else is read relative to the
  // allowed paths Forge passes (`--allow-paths a,b`) or the working directory.
  const allowIdx = args.indexOf('--allow-paths');
  const bases = [process.cwd()];
  if (allowIdx >= 0 && args[allowIdx + 1]) bases.push(...args[allowIdx + 1].split(','));
  const baseIdx = args.indexOf('--base-path');
  if (baseIdx >= 0 && args[baseIdx + 1]) bases.unshift(args[baseIdx + 1]);
  const findImports = (p) => {
    for (const b of bases) {
      const full = path.resolve(b, p);
      if (fs.existsSync(full)) return { contents: fs.readFileSync(full, 'utf8') };
    }
    return { error: 'File not found: ' + p };
  };
  // No process.exit here: it would cut the output at the pipe buffer (64 KiB).
  process.stdout.write(solc.compile(input, { import: findImports }));
  return;
}
process.stderr.write('solc wrapper: only --version and --standard-json are supported\n');
process.exitCode = 2;
}
main();
