// node-redis (npm "redis", with its bloom commands) against a bloomgrid
// node's Redis door, in RESP2 and RESP3: every BF command through the
// client's own API, MULTI/EXEC, auto-pipelined adds and reads, a password
// (a token) sent with HELLO, and errors as the client raises them.
// usage: node test_node_redis.js NODE_BIN WORK_DIR
'use strict';
const assert = require('assert');
const { spawn } = require('child_process');
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { createClient } = require('redis');

const [nodeBin, work] = process.argv.slice(2);

function startNode(extra) {
  fs.mkdirSync(work, { recursive: true });
  const out = path.join(work, 'node.out');
  const p = spawn(nodeBin, ['--listen', '127.0.0.1:0', '--data-dir', path.join(work, 'data'),
    '--durability', 'none', '--resp-listen', '127.0.0.1:0', ...extra],
  { stdio: ['ignore', fs.openSync(out, 'w'), fs.openSync(path.join(work, 'node.log'), 'w')] });
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const poll = () => {
      // The port, once the data directory is open (UNAVAILABLE before).
      const m = /resp (\S+):(\d+)/.exec(fs.readFileSync(out, 'utf8'));
      const open = /data directory \S+ open;/.test(fs.readFileSync(path.join(work, 'node.log'), 'utf8'));
      if (m && open) return resolve({ p, port: Number(m[2]) });
      if (p.exitCode !== null || Date.now() - t0 > 20000) return reject(new Error('node did not start'));
      setTimeout(poll, 50);
    };
    poll();
  });
}

async function rejects(promise, text) {
  try {
    await promise;
  } catch (e) {
    assert.ok(String(e.message).includes(text), `error "${e.message}" does not say "${text}"`);
    return;
  }
  assert.fail(`no error; expected one saying "${text}"`);
}

async function run(port, resp) {
  const c = createClient({ url: `redis://default:s3cret@127.0.0.1:${port}`, RESP: resp, name: `t${resp}` });
  c.on('error', () => {});
  await c.connect();
  const f = `users${resp}`;
  assert.strictEqual(await c.ping(), 'PONG');
  assert.strictEqual(await c.bf.reserve(f, 0.01, 100000, { NONSCALING: true }), 'OK');
  assert.strictEqual(await c.bf.add(f, 'alice'), true);
  assert.strictEqual(await c.bf.add(f, 'alice'), false);
  assert.deepStrictEqual(await c.bf.mAdd(f, ['bob', 'carol']), [true, true]);
  assert.strictEqual(await c.bf.exists(f, 'alice'), true);
  assert.strictEqual(await c.bf.exists(f, 'zed'), false);
  assert.deepStrictEqual(await c.bf.mExists(f, ['bob', 'zed']), [true, false]);
  assert.deepStrictEqual(await c.bf.insert(f, ['dave'], { NOCREATE: true }), [true]);
  assert.deepStrictEqual(await c.bf.insert(`grown${resp}`, ['x'], { CAPACITY: 1000, ERROR: 0.001 }), [true]);
  assert.strictEqual(await c.bf.card(f), 4);
  const info = await c.bf.info(f);
  // RESP2: the client's object; RESP3: the server's map as the client maps it.
  const get = (k) => (info instanceof Map ? info.get(k) : info[k]);
  assert.strictEqual(get('Capacity'), 100000, JSON.stringify(info));
  assert.strictEqual(get('Number of filters'), 1);
  assert.strictEqual(get('Number of items inserted'), 4);
  assert.strictEqual(get('Expansion rate'), null);
  await rejects(c.bf.exists('nosuch', 'a'), 'not found');
  await rejects(c.bf.reserve(f, 0.01, 10), 'item exists');
  // MULTI/EXEC: queued commands run in order.
  const res = await c.multi().bf.add(`m${resp}`, 'k').bf.exists(`m${resp}`, 'k').ping().exec();
  assert.deepStrictEqual(res, [true, true, 'PONG']);
  // Auto-pipelining: many commands written at once, answers in order.
  const adds = [];
  for (let i = 0; i < 500; i++) {
    adds.push(c.bf.add(`p${resp}`, `k${i}`));
    adds.push(c.bf.exists(`p${resp}`, `k${i}`));
  }
  const got = await Promise.all(adds);
  for (let i = 0; i < got.length; i += 2) assert.strictEqual(got[i + 1], true, `key ${i / 2} read 0`);
  await c.quit();
}

(async () => {
  const tokens = path.join(work, 'tokens');
  fs.mkdirSync(work, { recursive: true });
  fs.writeFileSync(tokens, `admin boss ${crypto.createHash('sha256').update('s3cret').digest('hex')}\n`);
  const node = await startNode(['--tokens-file', tokens]);
  try {
    await run(node.port, 2);
    await run(node.port, 3);
    // A wrong password is refused at connect.
    const bad = createClient({ url: `redis://default:wrong@127.0.0.1:${node.port}`, RESP: 3,
      socket: { reconnectStrategy: false } });
    bad.on('error', () => {});
    await rejects(bad.connect(), 'WRONGPASS');
    console.log('2 passed, 0 failed');
  } finally {
    node.p.kill('SIGTERM');
  }
})().catch((e) => {
  console.error('FAIL:', e);
  process.exit(1);
});
