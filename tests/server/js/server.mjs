// Starts `mnemo serve` on 127.0.0.1 (a free port) for the tests and stops it afterwards.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export async function startServer(extra = []) {
  const bin = process.env.MNEMO_BIN;
  const shared = process.env.MNEMO_SHARED_DIR;
  if (!bin || !shared) throw new Error('MNEMO_BIN and MNEMO_SHARED_DIR must be set (ctest sets them)');
  const dir = mkdtempSync(join(tmpdir(), 'mnemo-js-'));
  const context = extra.includes('--max-context') ? [] : ['--max-context', '512'];  // extra may set it
  const args = ['serve', '--model', join(shared, 'models/stories260K/stories260K.gguf'), '--port', '0',
    ...context, '--db', join(dir, 'mnemo.db'), '--api-key', 'test-key', ...extra];
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start: ' + log)), 60000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}: ${log}`)));
  });
  return {
    baseURL: `http://127.0.0.1:${port}/v1`,
    async stop() {
      proc.kill('SIGTERM');
      await new Promise((r) => proc.once('exit', r));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
