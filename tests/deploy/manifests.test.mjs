// deploy/kubernetes against the Kubernetes API schemas, strictly: every object must validate
// against its kind's OpenAPI schema (the Kubernetes API's own schemas, compiled to validators by
// the kubernetes-models package), and every field it sets must be a field of that schema — an unknown
// key (a typo such as `readinesProbe`) is an error, as kubeconform's -strict makes it. The
// Gateway API Inference Extension's resources are not in any npm package; they are checked
// against the fields of their v1 / v1alpha2 CRDs, written down below.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as yaml from 'js-yaml';
import Ajv from 'ajv';
import { validate as validateDeployment } from 'kubernetes-models/_schemas/IoK8sApiAppsV1Deployment';
import { validate as validateService } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Service';
import { validate as validatePdb } from 'kubernetes-models/_schemas/IoK8sApiPolicyV1PodDisruptionBudget';
import { validate as validateHpa } from 'kubernetes-models/_schemas/IoK8sApiAutoscalingV2HorizontalPodAutoscaler';

const DEPLOY = join(dirname(fileURLToPath(import.meta.url)), '../../deploy/kubernetes');

// The Inference Extension's objects: the fields of their CRDs (inference.networking.k8s.io/v1
// InferencePool, inference.networking.x-k8s.io/v1alpha2 InferenceObjective, as of v1.0), closed
// to unknown keys.
const dnsLabel = { type: 'string', minLength: 1, maxLength: 253 };
const port = { type: 'object', additionalProperties: false, required: ['number'],
  properties: { number: { type: 'integer', minimum: 1, maximum: 65535 } } };
const metadata = { type: 'object', required: ['name'], properties: { name: dnsLabel } };
const inferencePool = {
  type: 'object', additionalProperties: false, required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { const: 'inference.networking.k8s.io/v1' }, kind: { const: 'InferencePool' }, metadata,
    spec: {
      type: 'object', additionalProperties: false, required: ['selector', 'targetPorts', 'endpointPickerRef'],
      properties: {
        selector: { type: 'object', additionalProperties: false, required: ['matchLabels'],
          properties: { matchLabels: { type: 'object', additionalProperties: { type: 'string', maxLength: 63 } } } },
        targetPorts: { type: 'array', minItems: 1, maxItems: 1, items: port },
        endpointPickerRef: {
          type: 'object', additionalProperties: false, required: ['name'],
          properties: { group: { type: 'string' }, kind: { type: 'string' }, name: dnsLabel, port,
            failureMode: { enum: ['FailOpen', 'FailClose'] } },
        },
      },
    },
  },
};
const inferenceObjective = {
  type: 'object', additionalProperties: false, required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { const: 'inference.networking.x-k8s.io/v1alpha2' }, kind: { const: 'InferenceObjective' }, metadata,
    spec: {
      type: 'object', additionalProperties: false, required: ['poolRef'],
      properties: {
        priority: { type: 'integer' },
        poolRef: { type: 'object', additionalProperties: false, required: ['name'],
          properties: { group: { type: 'string' }, kind: { type: 'string' }, name: dnsLabel } },
      },
    },
  },
};
const ajv = new Ajv({ allErrors: true, strict: true });

const kubernetesValidators = {
  'apps/v1 Deployment': validateDeployment,
  'v1 Service': validateService,
  'policy/v1 PodDisruptionBudget': validatePdb,
  'autoscaling/v2 HorizontalPodAutoscaler': validateHpa,
};
const crdValidators = {
  'inference.networking.k8s.io/v1 InferencePool': ajv.compile(inferencePool),
  'inference.networking.x-k8s.io/v1alpha2 InferenceObjective': ajv.compile(inferenceObjective),
};

// The compiled schema validators read exactly the fields their schema knows, and enumerate the
// keys of maps (labels, resource lists). Watching which keys they read finds every key no schema
// knows.
function unknownFields(object, validate) {
  const watched = new Map();  // plain object -> { read: Set of keys, enumerated }
  const proxies = new WeakMap();
  const watch = (value) => {
    if (value === null || typeof value !== 'object') return value;
    if (proxies.has(value)) return proxies.get(value);
    const record = { read: new Set(), enumerated: false };
    watched.set(value, record);
    const proxy = new Proxy(value, {
      get(target, key, receiver) {
        if (typeof key === 'string') record.read.add(key);
        return watch(Reflect.get(target, key, receiver));
      },
      has(target, key) {
        if (typeof key === 'string') record.read.add(key);
        return Reflect.has(target, key);
      },
      ownKeys(target) {
        record.enumerated = true;
        return Reflect.ownKeys(target);
      },
    });
    proxies.set(value, proxy);
    return proxy;
  };
  const valid = validate(watch(object));
  const unknown = [];
  const walk = (value, path) => {
    if (value === null || typeof value !== 'object') return;
    const record = watched.get(value);
    for (const [key, child] of Object.entries(value)) {
      const childPath = Array.isArray(value) ? `${path}[${key}]` : `${path}.${key}`;
      if (!Array.isArray(value) && record && !record.enumerated && !record.read.has(key)) unknown.push(childPath);
      walk(child, childPath);
    }
  };
  walk(object, '');
  return { valid, errors: validate.errors, unknown };
}

function documents() {
  const docs = [];
  for (const file of readdirSync(DEPLOY).filter((f) => f.endsWith('.yaml')).sort()) {
    yaml.loadAll(readFileSync(join(DEPLOY, file), 'utf8'), (doc) => { if (doc) docs.push({ file, doc }); });
  }
  return docs;
}

function check({ file, doc }) {
  const type = `${doc.apiVersion} ${doc.kind}`;
  const where = `${file}: ${type} ${doc.metadata?.name}`;
  if (kubernetesValidators[type]) {
    const { valid, errors, unknown } = unknownFields(doc, kubernetesValidators[type]);
    return [...(valid ? [] : errors.map((e) => `${where}: ${e.instancePath} ${e.keyword} ${JSON.stringify(e.params)}`)),
      ...unknown.map((path) => `${where}: ${path} is not a field of ${type}`)];
  }
  if (crdValidators[type]) {
    const validate = crdValidators[type];
    return validate(doc) ? [] : validate.errors.map((e) => `${where}: ${e.instancePath} ${e.message} ${JSON.stringify(e.params)}`);
  }
  return [`${where}: no schema for ${type}`];
}

test('every manifest in deploy/kubernetes validates strictly against its API schema', () => {
  const docs = documents();
  const kinds = docs.map(({ doc }) => doc.kind).sort();
  assert.deepEqual(kinds, ['Deployment', 'HorizontalPodAutoscaler', 'InferenceObjective', 'InferencePool',
    'PodDisruptionBudget', 'Service']);
  assert.deepEqual(docs.flatMap(check), []);
});

test('the checks catch what they are for: a misspelt field, a wrong type, a missing required field', () => {
  const docs = documents();
  const copy = (kind) => structuredClone(docs.find(({ doc }) => doc.kind === kind));
  const deployment = copy('Deployment');
  const container = deployment.doc.spec.template.spec.containers[0];
  container.readinesProbe = container.readinessProbe;
  delete container.readinessProbe;
  assert.match(check(deployment).join('\n'), /containers\[0\]\.readinesProbe is not a field/);
  const hpa = copy('HorizontalPodAutoscaler');
  hpa.doc.spec.maxReplicas = 'eight';
  assert.match(check(hpa).join('\n'), /maxReplicas type \{"type":"integer"\}/);
  const service = copy('Service');
  service.doc.spec.ports[0].port = 'http';
  assert.match(check(service).join('\n'), /ports\/0\/port type \{"type":"integer"\}/);
  const pool = copy('InferencePool');
  delete pool.doc.spec.targetPorts;
  pool.doc.spec.extensionRef = pool.doc.spec.endpointPickerRef;  // the pre-v1 name
  const errors = check(pool).join('\n');
  assert.match(errors, /targetPorts/);
  assert.match(errors, /extensionRef/);
  // Maps (labels, resource lists) take any key; the check must not call those unknown.
  const labelled = copy('Deployment');
  labelled.doc.metadata.labels['example.com/team'] = 'serving';
  labelled.doc.spec.template.spec.containers[0].resources.requests['ephemeral-storage'] = '1Gi';
  assert.deepEqual(check(labelled), []);
});
