// Starts `mnemo serve` (stories260K, a free port) for the tests in this folder and stops it.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function env() {
  const bin = process.env.MNEMO_BIN;
  const shared = process.env.MNEMO_SHARED_DIR;
  if (!bin || !shared) throw new Error('MNEMO_BIN and MNEMO_SHARED_DIR must be set (ctest sets them)');
  return { bin, shared };
}

// Resolves with {url, dir, stop()} once the server prints "mnemo serving ... on http://127.0.0.1:PORT".
export async function startServer(extra = []) {
  const { bin, shared } = env();
  const dir = mkdtempSync(join(tmpdir(), 'mnemo-web-'));
  const args = ['serve', '--model', join(shared, 'models/stories260K/stories260K.gguf'), '--port', '0',
    '--db', join(dir, 'mnemo.db'), '--threads', '1', ...extra];
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject0) => {
    let settled = false;
    const reject = (e) => {
      if (settled) return;
      settled = true;
      rmSync(dir, { recursive: true, force: true });
      reject0(e);
    };
    const timer = setTimeout(() => { proc.kill('SIGTERM'); reject(new Error('server did not start: ' + log)); }, 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/mnemo serving .* on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m && !settled) {
        clearTimeout(timer);
        if (m[1].endsWith(':0')) {  // the real port must be printed, or no client can connect
          proc.kill('SIGTERM');
          return reject(new Error('the server printed port 0 instead of the port it bound: ' + log));
        }
        settled = true;
        resolve(m[1]);
      }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited with ${code}: ${log}`)); });
  });
  return {
    url,
    dir,
    async stop() {
      proc.kill('SIGTERM');
      await new Promise((r) => (proc.exitCode !== null ? r() : proc.once('exit', r)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
