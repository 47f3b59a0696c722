import { coded } from '../core/errors.ts';

// The control plane's error catalogue (CONTRIBUTING.md, "Errors"): the operator API answers every error
// as a problem document of the shared catalogue (core/problem.ts, re-exported here, documented in
// docs/api.md), and the package's own error classes, each a DvxError with a stable code (docs/errors.md,
// "controlplane").

export { ApiError, AuthenticationError, KmsError } from '../core/errors.ts';
export {
  PROBLEM_BASE,
  PROBLEMS,
  entryForStatus,
  problemOf,
  sendProblem,
  type CatalogueEntry,
} from '../core/problem.ts';

/** A control-plane option (flag or DVX_* variable) that is missing, malformed or inconsistent. */
export class ControlPlaneOptionsError extends coded('DVX_CONTROLPLANE_OPTIONS_INVALID') {}

/** A sealed value of an org whose data key was destroyed by erasure: it can never be opened again. */
export class OrgKeyShredded extends coded('DVX_ORG_KEY_SHREDDED') {}

/** The IdP refused or did not answer a provisioning call (discovery, token, client registration). */
export class IdpError extends coded('DVX_IDP_REFUSED') {}

/** A --idp-key service-account key file that is not a valid key. */
export class KeyFileError extends coded('DVX_IDP_KEY_FILE_INVALID') {}
