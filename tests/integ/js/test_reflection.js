// gRPC server reflection of bloomgrid-node, -router and -merger, read by an
// independent client: @grpc/grpc-js with only the reflection service's own
// .proto (from the system), no bloomgrid .proto file.  For v1 and v1alpha:
// list the services; resolve a method's request and response types from the
// descriptors the server sends (decoded with protobufjs's descriptor.proto);
// call the method with a client built from those descriptors alone; unknown
// names answer NOT_FOUND without ending the stream.
//
// usage: node test_reflection.js NODE ROUTER MERGER GRPC_PROTO_DIR DATA_DIR
'use strict';

const assert = require('assert');
const { spawn } = require('child_process');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');
const descriptor = require('protobufjs/ext/descriptor');

const [nodeBin, routerBin, mergerBin, grpcProto, dataDir] = process.argv.slice(2);
if (!dataDir) {
  console.error('usage: node test_reflection.js NODE ROUTER MERGER GRPC_PROTO_DIR DATA_DIR');
  process.exit(2);
}
fs.mkdirSync(dataDir, { recursive: true });

const loadOpts = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
                   includeDirs: [grpcProto] };
const refl = {
  v1: grpc.loadPackageDefinition(protoLoader.loadSync(
    'grpc/reflection/v1/reflection.proto', loadOpts)).grpc.reflection.v1,
  v1alpha: grpc.loadPackageDefinition(protoLoader.loadSync(
    'grpc/reflection/v1alpha/reflection.proto', loadOpts)).grpc.reflection.v1alpha,
};

const children = [];
function start(bin, args, tag) {
  return new Promise((resolve, reject) => {
    const log = fs.openSync(`${dataDir}/${tag}.log`, 'a');
    const child = spawn(bin, ['--listen', '127.0.0.1:0', ...args],
                        { stdio: ['ignore', 'pipe', log] });
    children.push(child);
    let out = '';
    child.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on (\S+)/);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`${tag} exited early: ${code}`)));
  });
}

// One reflection stream: ask(request) resolves with the next response.
function session(version, addr) {
  const client = new refl[version].ServerReflection(addr, grpc.credentials.createInsecure());
  const call = client.ServerReflectionInfo();
  const waiting = [];
  call.on('data', (r) => waiting.shift().resolve(r));
  call.on('error', (e) => { while (waiting.length) waiting.shift().reject(e); });
  return {
    ask(req) {
      return new Promise((resolve, reject) => {
        waiting.push({ resolve, reject });
        call.write(req);
      });
    },
    end() { call.end(); client.close(); },
  };
}

// Decode FileDescriptorProtos and add them to a protobufjs root.
function addFiles(files, resp) {
  assert.strictEqual(resp.message_response, 'file_descriptor_response',
                     JSON.stringify(resp.error_response));
  for (const bytes of resp.file_descriptor_response.file_descriptor_proto) {
    const fd = descriptor.FileDescriptorProto.decode(bytes);
    files.set(fd.name, fd);
  }
}

async function checkProcess(tag, addr, services, symbol, method, call) {
  for (const version of ['v1', 'v1alpha']) {
    const s = session(version, addr);
    const ls = await s.ask({ host: '', list_services: '' });
    assert.strictEqual(ls.message_response, 'list_services_response');
    const names = ls.list_services_response.service.map((x) => x.name).sort();
    const want = [...services, 'grpc.reflection.v1.ServerReflection',
                  'grpc.reflection.v1alpha.ServerReflection'].sort();
    assert.deepStrictEqual(names, want, `${tag} ${version} services`);

    // The service's file, with its imports, then every type its method uses.
    const files = new Map();
    addFiles(files, await s.ask({ file_containing_symbol: symbol }));
    const svcName = symbol.split('.').pop();
    let svc = null;
    for (const fd of files.values())
      for (const sd of fd.service || [])
        if (sd.name === svcName) svc = sd;
    assert(svc, `${tag}: service ${symbol} not in the files sent`);
    const m = svc.method.find((x) => x.name === method);
    assert(m, `${tag}: no method ${method}`);
    for (const type of [m.inputType, m.outputType]) {
      const r = await s.ask({ file_containing_symbol: type.replace(/^\./, '') });
      if (r.message_response === 'file_descriptor_response') addFiles(files, r);
      // else: already sent on this stream (allowed), must then be known
    }
    // Unknown names: NOT_FOUND, and the stream goes on.
    const nf = await s.ask({ file_containing_symbol: 'bloomgrid.v1.NoSuchThing' });
    assert.strictEqual(nf.message_response, 'error_response');
    assert.strictEqual(nf.error_response.error_code, grpc.status.NOT_FOUND);
    const nf2 = await s.ask({ file_by_filename: 'no/such.proto' });
    assert.strictEqual(nf2.error_response.error_code, grpc.status.NOT_FOUND);
    const ext = await s.ask({ file_containing_extension:
                              { containing_type: 'bloomgrid.v1.Filter', extension_number: 100 } });
    assert.strictEqual(ext.error_response.error_code, grpc.status.NOT_FOUND);
    const again = await s.ask({ list_services: '' });
    assert.strictEqual(again.message_response, 'list_services_response');
    s.end();

    // A client built from the reflected descriptors alone.
    const set = descriptor.FileDescriptorSet.create({ file: [...files.values()] });
    const root = protobuf.Root.fromDescriptor(set);
    const svcType = root.lookupService(symbol);
    const reqType = root.lookupType(m.inputType.replace(/^\./, ''));
    const respType = root.lookupType(m.outputType.replace(/^\./, ''));
    assert(svcType.methods[method], `${tag}: ${method} not in the rebuilt root`);
    const resp = await new Promise((resolve, reject) => {
      const c = new grpc.Client(addr, grpc.credentials.createInsecure());
      c.makeUnaryRequest(`/${symbol}/${method}`,
                         (o) => Buffer.from(reqType.encode(reqType.fromObject(o)).finish()),
                         (b) => respType.decode(b),
                         call.request, { deadline: new Date(Date.now() + 10000) },
                         (err, r) => { c.close(); if (err) reject(err); else resolve(r); });
    });
    call.check(resp);
    console.log(`ok: ${tag} ${version}: ${names.length} services, ${symbol}/${method} ` +
                `(${m.inputType} -> ${m.outputType}) called from reflected types`);
  }
}

async function main() {
  const node = await start(nodeBin, ['--data-dir', `${dataDir}/node`], 'node');
  fs.writeFileSync(`${dataDir}/topo.ini`, `version = 1\n[group g0]\ncopies = ${node}\n`);
  const router = await start(routerBin, ['--topology', `${dataDir}/topo.ini`], 'router');
  fs.writeFileSync(`${dataDir}/sources.ini`,
                   `[filter refl]\ndatacenter = dc1 ${dataDir}/topo.ini\n`);
  const merger = await start(mergerBin, ['--sources', `${dataDir}/sources.ini`,
                                         '--state-dir', `${dataDir}/merger`,
                                         '--interval-s', '3600'], 'merger');

  await checkProcess('node', node,
                     ['bloomgrid.v1.BloomGrid', 'bloomgrid.v1.Internal', 'grpc.health.v1.Health'],
                     'bloomgrid.v1.BloomGrid', 'ListFilters',
                     { request: {}, check: (r) => assert(Array.isArray(r.filters)) });
  await checkProcess('router', router, ['bloomgrid.v1.BloomGrid', 'grpc.health.v1.Health'],
                     'bloomgrid.v1.BloomGrid', 'ListFilters',
                     { request: {}, check: (r) => assert(Array.isArray(r.filters)) });
  await checkProcess('merger', merger, ['bloomgrid.v1.Merger', 'grpc.health.v1.Health'],
                     'grpc.health.v1.Health', 'Check',
                     { request: { service: '' }, check: (r) => assert('status' in r) });
  console.log('reflection OK');
}

main().then(() => {
  for (const c of children) c.kill('SIGTERM');
  process.exit(0);
}, (e) => {
  console.error('FAIL:', e && e.stack ? e.stack : e);
  for (const c of children) c.kill('SIGKILL');
  process.exit(1);
});
