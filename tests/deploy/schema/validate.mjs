// Validate Kubernetes objects against the API schemas that kubernetes-models
// bundles (generated from the Kubernetes OpenAPI document; no network): field
// types, enums, formats and required fields of every nested object.  Unknown
// fields are not reported (the OpenAPI document allows them);
// tests/deploy/manifests.py checks the fields bloomgrid relies on by name.
//
// usage: node validate.mjs DOCS.json
//   DOCS.json: [{"file": ..., "doc": {...}}, ...]
// Exit 0 when every object is valid, 1 otherwise.
import { readFileSync } from "node:fs";

const docs = JSON.parse(readFileSync(process.argv[2], "utf8"));
let failed = 0;

// The class of apiVersion/kind: "apps/v1" -> kubernetes-models/apps/v1,
// "v1" (the core group) -> kubernetes-models/v1.
async function modelOf(apiVersion, kind) {
  const mod = await import(`kubernetes-models/${apiVersion}`).catch(() => null);
  return mod && typeof mod[kind] === "function" ? mod[kind] : null;
}

async function check(file, doc) {
  const where = `${file}: ${doc.kind}/${doc.metadata && doc.metadata.name}`;
  const Model = await modelOf(doc.apiVersion, doc.kind);
  if (!Model) {
    console.log(`FAIL: ${where}: no schema for ${doc.apiVersion} ${doc.kind}`);
    return false;
  }
  try {
    new Model(doc).validate();
  } catch (e) {
    console.log(`FAIL: ${where}: ${e.message}`);
    return false;
  }
  return true;
}

// The validator must refuse what the API server refuses: a wrong type and a
// missing required field, or a pass proves nothing.
const broken = [
  { apiVersion: "policy/v1", kind: "PodDisruptionBudget", metadata: { name: "x" },
    spec: { maxUnavailable: 1.5, selector: { matchLabels: { a: "b" } } } },
  { apiVersion: "apps/v1", kind: "StatefulSet", metadata: { name: "x" },
    spec: { serviceName: "x", selector: { matchLabels: { a: "b" } },
            template: { spec: { containers: [{ name: "c",
              securityContext: { readOnlyRootFilesystem: "yes" } }] } } } },
  { apiVersion: "networking.k8s.io/v1", kind: "NetworkPolicy", metadata: { name: "x" },
    spec: { policyTypes: ["Ingress"] } },
];
for (const b of broken) {
  const Model = await modelOf(b.apiVersion, b.kind);
  let refused = false;
  try { new Model(b).validate(); } catch (e) { refused = true; }
  if (!refused) {
    console.log(`FAIL: the validator accepts a broken ${b.kind}`);
    failed++;
  }
}

for (const { file, doc } of docs) {
  if (await check(file, doc))
    console.log(`ok: ${file}: ${doc.kind}/${doc.metadata.name}`);
  else
    failed++;
}
if (failed) {
  console.log(`${failed} check(s) failed`);
  process.exit(1);
}
console.log(`all ${docs.length} objects valid against the Kubernetes schemas`);
