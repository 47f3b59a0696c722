import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { CONTROLPLANE_DEFAULTS } from '../../controlplane/options.ts';
import { BROKER_DEFAULTS } from '../../enclave/broker/options.ts';
import { GATEWAY_DEFAULTS } from '../../proxy/egress/options.ts';
import { DEFAULT_IMDS_SOCKET } from '../../proxy/imds/options.ts';
import { LLMPROXY_DEFAULTS } from '../../proxy/llm/options.ts';
import { runDvx } from '../fixtures/run-dvx.ts';

// The Kubernetes manifests, rendered by kustomize (the one built into kubectl: the machine image has it,
// Debian has no kustomize) and validated against the Kubernetes OpenAPI schemas that the npm package
// kubernetes-models ships compiled (no network at test time). The schemas accept unknown fields, so a
// strict pass is added the way kubeconform's -strict works: every key of every object is probed with a
// value of the wrong type, and a key the schema does not know (the probe passes) is reported. On top,
// what the operator relies on: ports and health paths from the code's defaults, the securityContext of
// every container, requests and limits, a PodDisruptionBudget per stateless component, every Secret and
// ConfigMap either rendered or listed in docs/operations.md, and the NetworkPolicies evaluated: the
// gateway is the agents' only egress (docs/decisions.md, "Kubernetes manifests checked without a cluster").

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const K8S = join(ROOT, 'deploy/k8s');

type Doc = Record<string, unknown> & {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
};
type Any = any;

const kubectl = spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8' });
const haveKubectl = kubectl.status === 0;

function render(dir: string): { docs: Doc[]; stderr: string; status: number | null } {
  const r = spawnSync('kubectl', ['kustomize', join(K8S, dir)], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
  const docs = r.status === 0 ? parseAllDocuments(r.stdout).map((d) => d.toJSON() as Doc) : [];
  return { docs, stderr: r.stderr, status: r.status };
}

/** The schema's validate() of one manifest: its errors (ajv's), [] when valid. */
async function schemaErrors(doc: unknown): Promise<{ instancePath: string; message?: string }[]> {
  const d = doc as Doc;
  const mod = (await import(`kubernetes-models/${d.apiVersion}/${d.kind}`)) as Record<
    string,
    new (
      x: unknown,
    ) => { validate(): void }
  >;
  try {
    new mod[d.kind](doc).validate();
    return [];
  } catch (err) {
    const errors = (err as { errors?: { instancePath: string; message?: string }[] }).errors;
    if (!errors) throw err;
    return errors;
  }
}

/** Keys the schema does not know: a wrong-typed probe at the key's path draws no error there. */
async function unknownFields(doc: unknown): Promise<string[]> {
  const unknown: string[] = [];
  const walk = async (node: unknown, path: string[]) => {
    if (Array.isArray(node)) {
      for (const [i, v] of node.entries()) await walk(v, [...path, String(i)]);
      return;
    }
    if (!node || typeof node !== 'object') return;
    for (const [k, v] of Object.entries(node)) {
      const at = [...path, k];
      if (at.length === 1 && (k === 'apiVersion' || k === 'kind')) continue;
      const probe = structuredClone(doc) as Any;
      let p = probe;
      for (const step of path) p = p[step];
      p[k] = typeof v === 'boolean' ? 'not-a-boolean' : true;
      const pointer = `/${at.map((s) => s.replaceAll('~', '~0').replaceAll('/', '~1')).join('/')}`;
      const errors = await schemaErrors(probe);
      if (!errors.some((e) => e.instancePath === pointer || e.instancePath.startsWith(`${pointer}/`))) {
        unknown.push(pointer); // what is under an unknown key is unknown too: reported once
        continue;
      }
      await walk(v, at);
    }
  };
  await walk(doc, []);
  return unknown;
}

/** The port of a listen address like ":8443" or "0.0.0.0:8443". */
const portOf = (addr: string) => Number(addr.slice(addr.lastIndexOf(':') + 1));

const COMPONENTS = {
  controlplane: { port: portOf(CONTROLPLANE_DEFAULTS.addr), health: 'controlplane/plugins/health.ts' },
  broker: { port: portOf(BROKER_DEFAULTS.addr), health: 'enclave/broker/server.ts' },
  llmproxy: { port: portOf(LLMPROXY_DEFAULTS.addr), health: 'proxy/llm/proxy.ts' },
  gateway: { port: portOf(GATEWAY_DEFAULTS.addr), health: 'proxy/egress/gateway.ts' },
} as const;
const STATELESS = ['controlplane', 'llmproxy', 'gateway'];

function podSpecs(docs: Doc[]): { owner: string; labels: Record<string, string>; spec: Any }[] {
  return docs
    .filter((d) => d.kind === 'StatefulSet' || d.kind === 'Deployment')
    .map((d) => ({
      owner: `${d.kind}/${d.metadata.name}`,
      labels: (d as Any).spec.template.metadata.labels,
      spec: (d as Any).spec.template.spec,
    }));
}

// ---- NetworkPolicy evaluation (networking.k8s.io/v1 semantics, one namespace) -------------------------

interface Peer {
  labels?: Record<string, string>;
  namespace?: Record<string, string>; // another namespace's labels; absent: the policies' own namespace
  ip?: string;
  port: number;
  protocol?: 'TCP' | 'UDP';
}

const matches = (sel: Any, labels: Record<string, string> | undefined) =>
  !!labels &&
  Object.entries(sel?.matchLabels ?? {}).every(([k, v]) => labels[k] === v) &&
  (sel?.matchExpressions ?? []).length === 0;

function ipIn(ip: string, cidr: string): boolean {
  if (ip.includes(':') !== cidr.includes(':')) return false;
  if (ip.includes(':')) return cidr === '::/0';
  const [base, bits] = cidr.split('/');
  const n = (a: string) => a.split('.').reduce((x, o) => x * 256 + Number(o), 0);
  const mask = Number(bits) === 0 ? 0 : 2 ** 32 - 2 ** (32 - Number(bits));
  return (n(ip) & mask) >>> 0 === (n(base) & mask) >>> 0;
}

function peerMatches(rulePeer: Any, p: Peer): boolean {
  if (rulePeer.ipBlock)
    return (
      !!p.ip &&
      ipIn(p.ip, rulePeer.ipBlock.cidr) &&
      !(rulePeer.ipBlock.except ?? []).some((c: string) => ipIn(p.ip as string, c))
    );
  if (p.ip) return false;
  if (rulePeer.namespaceSelector) {
    if (!p.namespace || !matches(rulePeer.namespaceSelector, p.namespace)) return false;
  } else if (p.namespace) return false;
  return rulePeer.podSelector ? matches(rulePeer.podSelector, p.labels) : true;
}

function portMatches(ports: Any[] | undefined, p: Peer) {
  return (
    !ports ||
    ports.length === 0 ||
    ports.some((x) => x.port === p.port && (x.protocol ?? 'TCP') === (p.protocol ?? 'TCP'))
  );
}

/** Whether `direction` traffic of the pod with `labels` to/from `peer` is allowed by the policies. */
function allowed(
  policies: Any[],
  direction: 'Egress' | 'Ingress',
  labels: Record<string, string>,
  peer: Peer,
): boolean {
  const selecting = policies.filter(
    (np) => matches(np.spec.podSelector, labels) && (np.spec.policyTypes ?? ['Ingress']).includes(direction),
  );
  if (selecting.length === 0) return true;
  const key = direction === 'Egress' ? 'egress' : 'ingress';
  const side = direction === 'Egress' ? 'to' : 'from';
  return selecting.some((np) =>
    (np.spec[key] ?? []).some(
      (rule: Any) =>
        portMatches(rule.ports, peer) &&
        (!rule[side] || rule[side].length === 0 || rule[side].some((rp: Any) => peerMatches(rp, peer))),
    ),
  );
}

const both = (policies: Any[], src: Record<string, string>, dst: Peer): boolean =>
  allowed(policies, 'Egress', src, dst) &&
  // The destination's own ingress policies, when it is a pod of this namespace.
  (!dst.labels ||
    !!dst.namespace ||
    allowed(policies, 'Ingress', dst.labels, { labels: src, port: dst.port, protocol: dst.protocol }));

// ---- the tests --------------------------------------------------------------------------------------------

t.test('kubectl (kustomize) is installed', async (t) => {
  t.ok(
    haveKubectl,
    `kubectl must be on the PATH to render deploy/k8s (kubectl kustomize): ${kubectl.error?.message ?? kubectl.stderr}`,
  );
});

const skip = !haveKubectl && 'kubectl is missing (failed above)';

for (const dir of ['base', 'overlays/example']) {
  t.test(
    `${dir} renders, and every manifest is valid against the Kubernetes schemas, strictly`,
    { skip },
    async (t) => {
      const r = render(dir);
      t.equal(r.status, 0, `kubectl kustomize exits 0: ${r.stderr}`);
      t.equal(r.stderr.trim(), '', 'with no warning');
      t.ok(r.docs.length > 20, `${r.docs.length} manifests`);
      for (const doc of r.docs) {
        const name = `${doc.kind}/${doc.metadata.name}`;
        t.same(await schemaErrors(doc), [], `${name} is valid`);
        t.same(await unknownFields(doc), [], `${name} has no field the schema does not know`);
      }
    },
  );
}

t.test('the validation is no rubber stamp: a misspelt field and a wrong type are found', async (t) => {
  const { docs } = render('base');
  const sts = docs.find((d) => d.kind === 'StatefulSet') as Any;
  const typo = structuredClone(sts);
  typo.spec.template.spec.containers[0].readinessProbes = typo.spec.template.spec.containers[0].readinessProbe;
  t.same(await schemaErrors(typo), [], 'the schema alone lets an unknown field through');
  t.same(await unknownFields(typo), ['/spec/template/spec/containers/0/readinessProbes'], 'the strict pass finds it');
  const wrong = structuredClone(sts);
  wrong.spec.template.spec.containers[0].ports[0].containerPort = 'https';
  t.match(await schemaErrors(wrong), [{ instancePath: '/spec/template/spec/containers/0/ports/0/containerPort' }]);
  const pdb = structuredClone(docs.find((d) => d.kind === 'PodDisruptionBudget')) as Any;
  pdb.apiVersion = 'policy/v1';
  pdb.spec.minAvailable = { x: 1 };
  t.not((await schemaErrors(pdb)).length, 0, 'a PDB with an object for minAvailable is refused');
});

t.test(
  'each component: the code default port, /healthz probes over HTTPS, DVX_* keys of its flags',
  { skip },
  async (t) => {
    const { docs } = render('overlays/example');
    for (const [c, want] of Object.entries(COMPONENTS)) {
      t.match(readFileSync(join(ROOT, want.health), 'utf8'), /'\/healthz'/, `${c} serves /healthz (${want.health})`);
      const sts = docs.find((d) => d.kind === 'StatefulSet' && d.metadata.name === `dvx-${c}`) as Any;
      t.ok(sts, `${c} is rendered`);
      if (!sts) continue;
      const main = sts.spec.template.spec.containers.find((x: Any) => x.name === c);
      t.same(main.args, ['serve', c], `runs dvx serve ${c}`);
      t.equal(main.image, 'registry.example.com/dvx:0.1.0', 'the overlay pins the image');
      const port = main.ports.find((p: Any) => p.containerPort === want.port);
      t.ok(port, `listens on ${want.port}, the code's default`);
      for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
        const get = main[probe]?.httpGet;
        t.same(
          get && { scheme: get.scheme, path: get.path, port: get.port },
          { scheme: 'HTTPS', path: '/healthz', port: port?.name },
          `${probe}: HTTPS /healthz`,
        );
      }
      const cm = docs.find((d) => d.kind === 'ConfigMap' && d.metadata.name === `dvx-${c}`) as Any;
      t.equal(portOf(cm.data.DVX_ADDR), want.port, 'DVX_ADDR agrees');
      const help = await runDvx(['serve', c, '--help']);
      const known = new Set(help.stdout.match(/DVX_[A-Z0-9_]+/g));
      const keys = [...Object.keys(cm.data), ...main.env.map((e: Any) => e.name)];
      for (const k of keys) t.ok(known.has(k), `${k} is a flag of dvx serve ${c}`);
      const svc = docs.find((d) => d.kind === 'Service' && d.metadata.name === `dvx-${c}`) as Any;
      t.ok(
        matches({ matchLabels: svc.spec.selector }, sts.spec.template.metadata.labels),
        'its Service selects its pods',
      );
      for (const sp of svc.spec.ports)
        t.ok(
          main.ports.some((p: Any) => p.name === sp.targetPort),
          `Service port ${sp.name} targets a container port`,
        );
      const pdb = docs.find(
        (d) => d.kind === 'PodDisruptionBudget' && matches((d as Any).spec.selector, sts.spec.template.metadata.labels),
      );
      if (STATELESS.includes(c)) {
        t.ok(pdb, `${c} has a PodDisruptionBudget over its pods`);
        t.ok(sts.spec.replicas >= 2, `${c} runs more than one replica`);
      } else t.notOk(pdb, `${c} (one per enclave) has none: it would block node drains`);
    }
  },
);

t.test('imds runs as a sidecar of the agent, probed on its socket', { skip }, async (t) => {
  const { docs } = render('overlays/example');
  const agent = podSpecs(docs).find((p) => p.labels['dvx.dev/agent'] === 'true');
  t.ok(agent, 'an example agent pod');
  const imds = agent?.spec.initContainers.find((c: Any) => c.name === 'imds');
  t.equal(imds?.restartPolicy, 'Always', 'a native sidecar');
  t.ok(imds.args.includes(`--imds-socket=${DEFAULT_IMDS_SOCKET}`), 'on the default socket');
  t.same(
    imds.env,
    [{ name: 'DVX_HEALTHCHECK_SOCKET', value: DEFAULT_IMDS_SOCKET }],
    'the probe script asks that socket',
  );
  t.match(imds.readinessProbe.exec.command.join(' '), /healthcheck\.mjs$/);
  const agentContainer = agent?.spec.containers.find((c: Any) => c.name === 'agent');
  t.notOk(
    agentContainer.volumeMounts.some((m: Any) => ['satellite', 'broker-key'].includes(m.name)),
    'the agent container mounts neither the satellite token nor the enclave key',
  );
  t.equal(
    agentContainer.securityContext.runAsGroup,
    agent?.spec.securityContext.runAsGroup,
    "the agent is in imds's group (the socket is 0660)",
  );
  t.not(agentContainer.securityContext.runAsUser, agent?.spec.securityContext.runAsUser, 'but not imds’s user');
});

t.test('every pod and container is locked down, with requests and limits', { skip }, async (t) => {
  const { docs } = render('overlays/example');
  for (const pod of podSpecs(docs)) {
    t.equal(pod.spec.securityContext.runAsNonRoot, true, `${pod.owner}: runAsNonRoot`);
    t.equal(pod.spec.securityContext.seccompProfile.type, 'RuntimeDefault', `${pod.owner}: seccomp RuntimeDefault`);
    t.equal(pod.spec.automountServiceAccountToken, false, `${pod.owner}: no API token mounted`);
    t.ok(pod.spec.securityContext.runAsUser > 0, `${pod.owner}: a non-root uid`);
    for (const c of [...(pod.spec.initContainers ?? []), ...pod.spec.containers]) {
      const at = `${pod.owner} ${c.name}`;
      t.equal(c.securityContext?.readOnlyRootFilesystem, true, `${at}: read-only root`);
      t.equal(c.securityContext?.allowPrivilegeEscalation, false, `${at}: no privilege escalation`);
      t.same(c.securityContext?.capabilities?.drop, ['ALL'], `${at}: drops ALL capabilities`);
      t.notOk(c.securityContext?.capabilities?.add, `${at}: adds none`);
      t.notOk(c.securityContext?.privileged, `${at}: not privileged`);
      for (const k of ['requests', 'limits'])
        for (const r of ['cpu', 'memory']) t.ok(c.resources?.[k]?.[r], `${at}: ${k}.${r}`);
      t.match(c.image, /^[^:]+:\d[\w.-]*$/, `${at}: a versioned image tag (${c.image})`);
      if (c.securityContext?.runAsUser !== undefined) t.ok(c.securityContext.runAsUser > 0, `${at}: non-root uid`);
    }
  }
});

t.test('every Secret and ConfigMap a pod needs is rendered or listed in docs/operations.md', { skip }, async (t) => {
  const { docs } = render('overlays/example');
  const ops = readFileSync(join(ROOT, 'docs/operations.md'), 'utf8');
  const rendered = new Set(docs.map((d) => `${d.kind}/${d.metadata.name}`));
  const refs = new Set<string>();
  for (const pod of podSpecs(docs)) {
    for (const v of pod.spec.volumes ?? []) {
      if (v.secret) refs.add(`Secret/${v.secret.secretName}`);
      if (v.configMap) refs.add(`ConfigMap/${v.configMap.name}`);
      if (v.persistentVolumeClaim) refs.add(`PersistentVolumeClaim/${v.persistentVolumeClaim.claimName}`);
    }
    for (const c of [...(pod.spec.initContainers ?? []), ...pod.spec.containers]) {
      for (const e of c.envFrom ?? []) if (e.configMapRef) refs.add(`ConfigMap/${e.configMapRef.name}`);
      for (const e of c.env ?? []) if (e.valueFrom?.secretKeyRef) refs.add(`Secret/${e.valueFrom.secretKeyRef.name}`);
    }
  }
  t.ok(refs.size > 5);
  for (const ref of refs)
    t.ok(rendered.has(ref) || ops.includes(`\`${ref.split('/')[1]}\``), `${ref} is rendered or documented`);
  t.notOk(
    docs.some((d) => d.kind === 'Secret'),
    'no Secret is shipped',
  );
});

t.test('the network policies: the gateway is the agents’ only egress', { skip }, async (t) => {
  const { docs } = render('overlays/example');
  const policies = docs.filter((d) => d.kind === 'NetworkPolicy') as Any[];
  const agent = { 'dvx.dev/agent': 'true', 'app.kubernetes.io/name': 'example-agent' };
  const pod = (name: string) => ({ 'app.kubernetes.io/name': `dvx-${name}`, 'app.kubernetes.io/part-of': 'dvx' });
  const dns = {
    labels: { 'k8s-app': 'kube-dns' },
    namespace: { 'kubernetes.io/metadata.name': 'kube-system' },
    port: 53,
    protocol: 'UDP' as const,
  };
  const cases: [string, Record<string, string>, Peer, boolean][] = [
    ['agent → gateway', agent, { labels: pod('gateway'), port: 8460 }, true],
    ['agent → broker agent listener (identity)', agent, { labels: pod('broker'), port: 8450 }, true],
    ['agent → DNS', agent, dns, true],
    ['agent → internet', agent, { ip: '93.184.216.34', port: 443 }, false],
    ['agent → a private address', agent, { ip: '10.1.2.3', port: 443 }, false],
    ['agent → llmproxy directly', agent, { labels: pod('llmproxy'), port: 8480 }, false],
    ['agent → control plane', agent, { labels: pod('controlplane'), port: 8443 }, false],
    ['agent → broker operator listener', agent, { labels: pod('broker'), port: 8451 }, false],
    ['agent → gateway on another port', agent, { labels: pod('gateway'), port: 8443 }, false],
    ['agent → another agent', agent, { labels: agent, port: 8080 }, false],
    [
      'agent → a pod in another namespace',
      agent,
      { labels: { app: 'db' }, namespace: { 'kubernetes.io/metadata.name': 'db' }, port: 5432 },
      false,
    ],
    ['gateway → internet', pod('gateway'), { ip: '93.184.216.34', port: 443 }, true],
    ['gateway → internet (IPv6)', pod('gateway'), { ip: '2606:2800::1', port: 443 }, true],
    ['gateway → llmproxy', pod('gateway'), { labels: pod('llmproxy'), port: 8480 }, true],
    ['gateway → broker', pod('gateway'), { labels: pod('broker'), port: 8450 }, true],
    ['gateway → control plane', pod('gateway'), { labels: pod('controlplane'), port: 8443 }, true],
    ['gateway → DNS', pod('gateway'), dns, true],
    ['gateway → the audit store (the overlay)', pod('gateway'), { ip: '10.20.30.4', port: 8123 }, true],
    ['gateway → another private address', pod('gateway'), { ip: '10.1.2.3', port: 443 }, false],
    ['gateway → cloud metadata', pod('gateway'), { ip: '169.254.169.254', port: 80 }, false],
    ['gateway → an agent', pod('gateway'), { labels: agent, port: 8080 }, false],
    ['control plane → llmproxy', pod('controlplane'), { labels: pod('llmproxy'), port: 8480 }, false],
    ['broker → llmproxy', pod('broker'), { labels: pod('llmproxy'), port: 8480 }, false],
    ['llmproxy → broker', pod('llmproxy'), { labels: pod('broker'), port: 8450 }, true],
    ['llmproxy → a provider', pod('llmproxy'), { ip: '160.79.104.10', port: 443 }, true],
    ['broker → control plane', pod('broker'), { labels: pod('controlplane'), port: 8443 }, true],
    ['anyone → an agent', pod('controlplane'), { labels: agent, port: 8080 }, false],
  ];
  for (const [name, src, dst, want] of cases)
    t.equal(both(policies, src, dst), want, `${name}: ${want ? 'allowed' : 'refused'}`);
});
