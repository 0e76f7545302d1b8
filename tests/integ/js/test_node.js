// An independent client for bloomgrid-node: @grpc/grpc-js with the .proto
// files loaded at run time by @grpc/proto-loader (no generated code shared
// with the server).  Starts its own node on a free loopback port.
//
// usage: node test_node.js NODE_BINARY PROTO_DIRS DATA_DIR  (PROTO_DIRS: a:b)
'use strict';

const assert = require('assert');
const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [nodeBin, protoDir, dataDir] = process.argv.slice(2);
if (!nodeBin || !protoDir || !dataDir) {
  console.error('usage: node test_node.js NODE_BINARY PROTO_DIR DATA_DIR');
  process.exit(2);
}

const loadOpts = { keepCase: true, longs: String, enums: String, defaults: true,
                   includeDirs: protoDir.split(':') };
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(
  ['bloomgrid/v1/bloomgrid.proto', 'grpc/health/v1/health.proto'], loadOpts));

function startNode() {
  return new Promise((resolve, reject) => {
    const log = fs.openSync(dataDir + '.log', 'a');
    const child = spawn(nodeBin, ['--listen', '127.0.0.1:0', '--data-dir', dataDir,
                                  '--max-batch-keys', '1000'],
                        { stdio: ['ignore', 'pipe', log] });
    let out = '';
    child.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on (\S+)/);
      if (m) resolve({ child, addr: m[1] });
    });
    child.on('exit', (code) => reject(new Error('node exited early: ' + code)));
  });
}

function call(client, method, req) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 10000);
    client[method](req, { deadline }, (err, resp) => resolve({ err, resp }));
  });
}

async function expectCode(client, method, req, code, what) {
  const { err } = await call(client, method, req);
  assert(err, `${what}: expected ${code}, got OK`);
  assert.strictEqual(err.code, grpc.status[code],
                     `${what}: expected ${code}, got ${err.code} ${err.details}`);
  assert(err.details && err.details.length > 0, `${what}: no message`);
  console.log(`  ${what.padEnd(32)} ${code}: ${err.details}`);
}

async function waitServing(health) {
  for (let i = 0; i < 250; i++) {
    const { err, resp } = await call(health, 'Check', { service: '' });
    if (!err && resp.status === 'SERVING') return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('node never SERVING');
}

async function main() {
  const { child, addr } = await startNode();
  const creds = grpc.credentials.createInsecure();
  const bg = new pkg.bloomgrid.v1.BloomGrid(addr, creds);
  const health = new pkg.grpc.health.v1.Health(addr, creds);
  await waitServing(health);

  let r = await call(bg, 'CreateFilter',
                     { name: 'js', capacity: 100000, error_rate: 0.01 });
  assert.ifError(r.err);
  assert.strictEqual(r.resp.name, 'js');
  assert.strictEqual(r.resp.kind, 'FILTER_KIND_BLOCKED');
  assert.strictEqual(r.resp.state, 'FILTER_STATE_READY');

  const keys = [];
  for (let i = 0; i < 1000; i++) keys.push(Buffer.from(`js-key-${i}`));
  r = await call(bg, 'Add', { filter: 'js', keys });
  assert.ifError(r.err);
  assert.strictEqual(r.resp.added.length, keys.length);
  assert(r.resp.added.filter((x) => x).length > 990, 'most keys new');
  r = await call(bg, 'Add', { filter: 'js', keys: keys.slice(0, 10) });
  assert.deepStrictEqual(r.resp.added, new Array(10).fill(false));

  r = await call(bg, 'MayContain', { filter: 'js', keys });
  assert.ifError(r.err);
  assert(r.resp.present.every((x) => x), 'no false negatives');
  const absent = [];
  for (let i = 0; i < 1000; i++) absent.push(Buffer.from(`other-${i}`));
  r = await call(bg, 'MayContain', { filter: 'js', keys: absent });
  const fp = r.resp.present.filter((x) => x).length;
  assert(fp < 50, `${fp} false positives`);
  // Answers come back in request order.
  r = await call(bg, 'MayContain',
                 { filter: 'js', keys: [keys[0], Buffer.from('nope-1'), keys[1]] });
  assert.strictEqual(r.resp.present[0], true);
  assert.strictEqual(r.resp.present[2], true);

  r = await call(bg, 'GetFilter', { name: 'js' });
  assert.ifError(r.err);
  assert(Number(r.resp.estimated_count) > 900, 'estimated_count');
  assert(Number(r.resp.bits) > 0 && r.resp.hashes > 0, 'geometry');

  await expectCode(bg, 'MayContain', { filter: 'missing', keys }, 'NOT_FOUND',
                   'unknown filter');
  await expectCode(bg, 'CreateFilter', { name: 'js', capacity: 10, error_rate: 0.1 },
                   'ALREADY_EXISTS', 'duplicate name');
  await expectCode(bg, 'CreateFilter', { name: 'z', capacity: 0, error_rate: 0.1 },
                   'INVALID_ARGUMENT', 'capacity 0');
  await expectCode(bg, 'CreateFilter', { name: 'z', capacity: 10, error_rate: 1.5 },
                   'INVALID_ARGUMENT', 'error_rate 1.5');
  await expectCode(bg, 'Add', { filter: 'js', keys: [Buffer.from('a'), Buffer.alloc(0)] },
                   'INVALID_ARGUMENT', 'empty key');
  await expectCode(bg, 'Add', { filter: 'js', keys: keys.concat(keys) },
                   'RESOURCE_EXHAUSTED', 'batch over the limit');
  await expectCode(bg, 'Remove', { filter: 'js', keys: [keys[0]] },
                   'FAILED_PRECONDITION', 'Remove on a blocked filter');
  await expectCode(health, 'Check', { service: 'no.such.Service' }, 'NOT_FOUND',
                   'health of unknown service');

  // A bidirectional stream: one response per request, in order.
  await new Promise((resolve, reject) => {
    const s = bg.AddStream({ deadline: new Date(Date.now() + 10000) });
    let got = 0;
    s.on('data', (resp) => {
      assert.strictEqual(resp.added.length, 100);
      got++;
    });
    s.on('error', reject);
    s.on('end', () => { assert.strictEqual(got, 5); resolve(); });
    for (let b = 0; b < 5; b++) {
      const ks = [];
      for (let i = 0; i < 100; i++) ks.push(Buffer.from(`stream-${b}-${i}`));
      s.write({ filter: b === 0 ? 'js' : '', keys: ks });
    }
    s.end();
  });
  r = await call(bg, 'MayContain', { filter: 'js', keys: [Buffer.from('stream-4-99')] });
  assert.deepStrictEqual(r.resp.present, [true]);

  // Export: server streaming; chunks add up to total_size.
  const chunks = await new Promise((resolve, reject) => {
    const parts = [];
    const s = bg.Export({ filter: 'js', chunk_size: 16384 },
                        { deadline: new Date(Date.now() + 10000) });
    s.on('data', (c) => parts.push(c));
    s.on('error', reject);
    s.on('end', () => resolve(parts));
  });
  const total = chunks.reduce((n, c) => n + c.data.length, 0);
  assert(chunks.length > 1 && total === Number(chunks[0].total_size), 'export size');
  console.log(`  export: ${chunks.length} chunks, ${total} bytes`);

  // Import it back (client streaming): OR-merging a filter into itself.
  const imp = await new Promise((resolve, reject) => {
    const s = bg.Import({ deadline: new Date(Date.now() + 10000) },
                        (err, resp) => (err ? reject(err) : resolve(resp)));
    chunks.forEach((c, i) => s.write({ filter: i === 0 ? 'js' : '', data: c.data }));
    s.end();
  });
  assert.strictEqual(Number(imp.bytes_received), total);

  bg.close();
  health.close();
  const code = await new Promise((resolve) => {
    child.removeAllListeners('exit');
    child.on('exit', (c) => resolve(c));
    child.kill('SIGTERM');
  });
  assert.strictEqual(code, 0, 'SIGTERM exits 0');
  console.log('js client: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
