#!/usr/bin/env -S node --max-semi-space-size=16
// Installed entry point: runs the compiled CLI from dist/ (npm run build).
import { main } from '../dist/cmd/main.js';

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    process.stderr.write(`egress-proxies-operator: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exitCode = 1;
  },
);
