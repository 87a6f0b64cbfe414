// The OpenID Connect provider the single sign-on tests sign in through: panva's certified
// oidc-provider, run as a real server on 127.0.0.1. Test fixture only: its built-in login form
// (devInteractions) takes any password.
//
// Environment:
//   OP_PORT            port (required); the issuer is http://127.0.0.1:OP_PORT
//   OP_REDIRECT_URI    the relying party's callback (required)
//   OP_CLIENT_ID, OP_CLIENT_SECRET
//   OP_USERS           JSON: login -> claims ({"ana": {"groups": ["admins"]}}); others have none
//   OP_KEY_FILE        the signing key (a private JWK), made on first use
//   OP_BAD_SIGNATURE=1 publish that key but sign with another under the same key id: every
//                      ID token's signature is wrong
//   OP_GROUPS_AT_USERINFO=1  keep the ID token to the standard claims: groups only at /me
import { generateKeyPairSync } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const port = Number(process.env.OP_PORT);
const issuer = `http://127.0.0.1:${port}`;
const users = JSON.parse(process.env.OP_USERS ?? '{}');

const newKey = () => ({
  ...generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' }),
  kid: 'test-key', alg: 'RS256', use: 'sig',
});
const keyFile = process.env.OP_KEY_FILE;
let trusted;
if (keyFile && existsSync(keyFile)) {
  trusted = JSON.parse(readFileSync(keyFile, 'utf8'));
} else {
  trusted = newKey();
  if (keyFile) writeFileSync(keyFile, JSON.stringify(trusted));
}
const badSignature = process.env.OP_BAD_SIGNATURE === '1';

const provider = new Provider(issuer, {
  clients: [{
    client_id: process.env.OP_CLIENT_ID ?? 'gpuledger',
    client_secret: process.env.OP_CLIENT_SECRET ?? 'test-secret',
    redirect_uris: [process.env.OP_REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: { keys: [badSignature ? newKey() : trusted] },
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  // Claims of the requested scopes in the ID token itself, as most company providers do; or
  // only at the user-info endpoint, as the specification's strict reading has it.
  conformIdTokenClaims: process.env.OP_GROUPS_AT_USERINFO === '1',
  pkce: { methods: ['S256'], required: () => true },
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, sub) {
    const claims = users[sub] ?? {};
    return { accountId: sub, async claims() { return { sub, preferred_username: sub, ...claims }; } };
  },
  // A first-party client: consent is granted without a second page.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope([...ctx.oidc.requestParamOIDCScopes].join(' '));
    grant.addOIDCClaims([...ctx.oidc.requestParamClaims]);
    await grant.save();
    return grant;
  },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));
if (badSignature) {
  const { kty, n, e, kid, alg, use } = trusted;
  provider.use(async (ctx, next) => {
    if (ctx.method === 'GET' && ctx.path === '/jwks') {
      ctx.type = 'application/jwk-set+json';
      ctx.body = { keys: [{ kty, n, e, kid, alg, use }] };
      return;
    }
    await next();
  });
}
provider.listen(port, '127.0.0.1', () => console.log(`ready ${issuer}`));
