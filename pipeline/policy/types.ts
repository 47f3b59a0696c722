// Policy values of service `llmproxy` (spec: llm-content-policy, "Policy keys"). Field names are the
// spec's, snake_case as they travel in JSON. Validated values have every default filled in.

export type Severity = 'log' | 'warn' | 'block' | 'redact';
export const SEVERITIES: readonly Severity[] = ['log', 'warn', 'block', 'redact'];

export type PolicyKey = 'model_policy' | 'content_inspection' | 'sidecar_inspection';
export const POLICY_KEYS: readonly PolicyKey[] = ['model_policy', 'content_inspection', 'sidecar_inspection'];

export type PiiType = 'email' | 'credit_card' | 'ssn';
export const PII_TYPES: readonly PiiType[] = ['email', 'credit_card', 'ssn'];

export type ModelMode = 'allowlist' | 'blocklist';

export interface ModelPolicy {
  immutable: boolean;
  mode: ModelMode;
  /** Globs in Go `path.Match` syntax. */
  models: string[];
}

export interface Toggle {
  enabled: boolean;
  severity: Severity;
}

export interface PiiToggle extends Toggle {
  /** `null` = every type (the field was omitted). */
  types: PiiType[] | null;
}

export interface CustomPattern {
  pattern: string;
  description: string;
  severity: Severity;
}

export interface ContentInspection {
  immutable: boolean;
  secrets_filter: Toggle;
  pii_detection: PiiToggle;
  api_key_detection: Toggle;
  patterns: CustomPattern[];
}

export interface Sidecar {
  name: string;
  url: string;
  timeout_ms: number;
  on_request: boolean;
  on_response: boolean;
  async: boolean;
  severity: Severity;
  include_context: boolean;
}

export interface SidecarInspection {
  immutable: boolean;
  sidecars: Sidecar[];
}

export interface PolicyValues {
  model_policy: ModelPolicy;
  content_inspection: ContentInspection;
  sidecar_inspection: SidecarInspection;
}

/** A policy document as `dvx inspect --policy` and the snapshot carry it: any subset of the keys. */
export type PolicyDocument = Partial<PolicyValues>;

/**
 * What the resolver hands the engine. `models` holds one layer per source (the base winner, then each
 * pack); a model is permitted only if every layer permits it (spec: packs compose models by AND).
 */
export interface ResolvedPolicy {
  /** Content hash: stable for equal policies, so compiled forms can be cached by it. */
  version: string;
  models: ModelPolicy[];
  content: ContentInspection | null;
  sidecars: Sidecar[];
}

// Default severities. The spec's request diagram marks the secrets filter "(block)" and PII, API keys
// and patterns "(block or warn)"; a sidecar's default is `warn` (spec table). docs/decisions.md.
export const DEFAULT_SEVERITY = {
  secrets_filter: 'block',
  pii_detection: 'warn',
  api_key_detection: 'warn',
  pattern: 'warn',
  sidecar: 'warn',
} as const satisfies Record<string, Severity>;

export const SIDECAR_DEFAULT_TIMEOUT_MS = 5000;
