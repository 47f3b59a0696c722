import { coded } from '../core/errors.ts';

// The enclave package's error classes (the broker, the pullers), each a DvxError with a stable code
// (docs/errors.md, "enclave").

/** A broker option (flag or DVX_* variable) that is missing, malformed or inconsistent. */
export class BrokerOptionsError extends coded('DVX_BROKER_OPTIONS_INVALID') {}
