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
// - `--exchange-trust ISSUER` makes it a security token service too: both clients may use
//   RFC 8693 token exchange, with a subject token (a JWT) that ISSUER signed, checked
//   against ISSUER's published keys (/.well-known/jwks.json), for this provider's token
//   endpoint as audience, at most two minutes old (`--exchange-jwks URL` fetches the keys
//   from elsewhere than ISSUER, as a test gateway serves them on a port of its own). It issues an access token for the account
//   `sts|agent=<sub>` or `sts|agent=<sub>|person=<act.sub>`, good at /me like any other.
//   (oidc-provider has no built-in token exchange; this registers the grant, as its
//   documentation says extensions do.)
// Access tokens are opaque and accepted at /me (userinfo). `POST /token/revocation` revokes a
// token (the public client sends its client_id); revoking a refresh token revokes its grant.
// An RFC 8707 `resource` parameter is ignored, at /auth and /token alike: resource indicators
// are off here, so it is not among the parameters oidc-provider reads. (They are on by default,
// and then an unconfigured resource is refused with invalid_target, and a configured one binds
// the access token to that audience, which userinfo refuses.)
import Provider, { errors } from 'oidc-provider';
import { createRemoteJWKSet, jwtVerify } from 'jose';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: '4010' },
    'redirect-uri': { type: 'string', multiple: true, default: [] },
    'client-id': { type: 'string', default: 'toolgate' },
    'client-secret': { type: 'string', default: 'toolgate-test-secret' },
    'public-client': { type: 'string' },
    'access-ttl': { type: 'string' },
    'exchange-trust': { type: 'string' },
    'exchange-jwks': { type: 'string' },
  },
});
const port = Number(values.port);
const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
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
      grant_types: ['authorization_code', ...(values['exchange-trust'] ? [TOKEN_EXCHANGE] : [])],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    ...(values['public-client'] ? [{
      client_id: values['public-client'],
      redirect_uris: values['redirect-uri'],
      grant_types: ['authorization_code', 'refresh_token', ...(values['exchange-trust'] ? [TOKEN_EXCHANGE] : [])],
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
  async findAccount(_ctx, id, token) {
    // An exchanged token's account is whoever the subject token named.
    if (token?.gty === TOKEN_EXCHANGE && id.startsWith('sts|')) {
      return { accountId: id, async claims() { return { sub: id }; } };
    }
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

if (values['exchange-trust']) {
  const trusted = values['exchange-trust'];
  const keys = createRemoteJWKSet(new URL(values['exchange-jwks'] ?? `${trusted}/.well-known/jwks.json`));
  const parameters = ['audience', 'resource', 'scope', 'requested_token_type', 'subject_token',
    'subject_token_type', 'actor_token', 'actor_token_type'];
  provider.registerGrantType(TOKEN_EXCHANGE, async (ctx) => {
    const { params, client } = ctx.oidc;
    if (params.subject_token_type !== 'urn:ietf:params:oauth:token-type:jwt') {
      throw new errors.InvalidRequest('subject_token_type must be urn:ietf:params:oauth:token-type:jwt');
    }
    let claims;
    try {
      ({ payload: claims } = await jwtVerify(params.subject_token ?? '', keys, {
        issuer: trusted, audience: `${issuer}/token`, maxTokenAge: '120s', requiredClaims: ['sub', 'exp', 'iat'],
      }));
    } catch (e) {
      throw new errors.InvalidGrant(`subject_token refused: ${e.code ?? e.message}`);
    }
    const accountId = `sts|agent=${claims.sub}${claims.act?.sub ? `|person=${claims.act.sub}` : ''}`;
    const grant = new provider.Grant({ accountId, clientId: client.clientId });
    grant.addOIDCScope('openid');
    const grantId = await grant.save();
    const token = new provider.AccessToken({ accountId, client, grantId, gty: TOKEN_EXCHANGE, scope: 'openid' });
    const value = await token.save();
    ctx.body = {
      access_token: value,
      issued_token_type: 'urn:ietf:params:oauth:token-type:access_token',
      token_type: 'Bearer',
      expires_in: token.expiration,
      scope: 'openid',
    };
  }, parameters, ['audience', 'resource']);
}

provider.listen(port, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
