// A real OpenID Provider for the SSO tests: panva's certified oidc-provider, in development
// mode (an http issuer on loopback and its built-in login and consent pages, devInteractions).
//
//   node op.mjs --port 4010 --redirect-uri http://127.0.0.1:8787/admin/sso/callback
//               [--public-client ID] [--access-ttl SECONDS]
//
// One static confidential client (client_secret_basic) that must use PKCE; fixed accounts
// whose claims include `groups`. Any password signs a known account in; an unknown login is
// refused by findAccount. Prints one JSON line {"issuer": ...} once it listens.
//
// For toolgate as an OAuth client of an upstream's authorization server:
// - `--public-client ID` adds a public client (no secret, `token_endpoint_auth_method: none`,
//   PKCE) with the same `--redirect-uri` list, which gets a refresh token with every code.
//   Refresh tokens of a public client rotate on each use (oidc-provider's default), and
//   presenting a used one revokes the whole grant.
// - `--access-ttl SECONDS` sets the access token lifetime (default one hour), so a test can
//   watch tokens expire and be refreshed; userinfo refuses one from the second it expires.
// Access tokens are opaque and accepted at /me (userinfo). `POST /token/revocation` revokes a
// token (the public client sends its client_id); revoking a refresh token revokes its grant.
// An RFC 8707 `resource` parameter is ignored, at /auth and /token alike: resource indicators
// are off here, so it is not among the parameters oidc-provider reads. (They are on by default,
// and then an unconfigured resource is refused with invalid_target, and a configured one binds
// the access token to that audience, which userinfo refuses.)
import Provider from 'oidc-provider';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: '4010' },
    'redirect-uri': { type: 'string', multiple: true, default: [] },
    'client-id': { type: 'string', default: 'toolgate' },
    'client-secret': { type: 'string', default: 'toolgate-test-secret' },
    'public-client': { type: 'string' },
    'access-ttl': { type: 'string' },
  },
});
const port = Number(values.port);
const issuer = `http://127.0.0.1:${port}`;

// The test accounts: login name -> claims.
export const ACCOUNTS = {
  alice: { preferred_username: 'alice', email: 'alice@example.test', groups: ['toolgate-admins'] },
  bob: { preferred_username: 'bob', email: 'bob@example.test', groups: ['staff', 'toolgate-auditors'] },
  carol: { preferred_username: 'carol', email: 'carol@example.test', groups: ['toolgate-members'] },
  // Signs in at the provider, but no group maps to a toolgate role.
  mallory: { preferred_username: 'mallory', email: 'mallory@example.test', groups: ['contractors'] },
  // A hostile username: toolgate must sanitise and escape it.
  eve: { preferred_username: '<script>alert(1)</script> eve', email: 'eve@example.test', groups: ['toolgate-viewers'] },
};

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: values['client-id'],
      client_secret: values['client-secret'],
      redirect_uris: values['redirect-uri'],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    ...(values['public-client'] ? [{
      client_id: values['public-client'],
      redirect_uris: values['redirect-uri'],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    }] : []),
  ],
  // A refresh token for every client allowed the grant, without `offline_access` (which would
  // also need prompt=consent): the default hook asks for that scope.
  async issueRefreshToken(_ctx, client) {
    return client.grantTypeAllowed('refresh_token');
  },
  // Short-lived access tokens that stop working when they expire: without clockTolerance 0
  // the provider still honours them for 15 s past their expiry.
  ...(values['access-ttl'] ? { ttl: { AccessToken: Number(values['access-ttl']) }, clockTolerance: 0 } : {}),
  // PKCE for every client, not only public ones.
  pkce: { required: () => true },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  // Put the scopes' claims in the ID token too; toolgate also reads userinfo when they are not.
  conformIdTokenClaims: false,
  features: {
    devInteractions: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: { enabled: false },
  },
  cookies: { keys: ['toolgate-test-only-cookie-key'] },
  async findAccount(_ctx, id) {
    const account = ACCOUNTS[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, name: id, email_verified: true, ...account };
      },
    };
  },
});
provider.proxy = false;

provider.listen(port, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
