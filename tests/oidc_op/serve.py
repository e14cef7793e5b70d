"""Start the test OpenID Provider on a free loopback port.

    python -m tests.oidc_op.serve '<json>'

The JSON names the provider's SQLite file (database, a path that does not exist yet), the
client (client_id, client_secret, redirect_uri) and the users (username,
password, email, given_name, family_name, groups). The provider migrates a fresh SQLite file,
makes an RSA signing key, the users and a confidential client that must ask for consent, then
prints one line of JSON, {"issuer": …}, and serves until it is terminated.
"""

import json
import os
import socketserver
import sys
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


def _setup(spec: dict) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oidc_provider.models import Client, ResponseType, RSAKey

    call_command("migrate", verbosity=0, interactive=False)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    RSAKey.objects.create(key=key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption(),
    ).decode())
    for person in spec["users"]:
        user = User.objects.create_user(
            person["username"], email=person.get("email", ""), password=person["password"],
            first_name=person.get("given_name", ""), last_name=person.get("family_name", ""),
        )
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in person.get("groups", [])])
    client = Client.objects.create(
        name="gpubook", client_type="confidential", client_id=spec["client_id"],
        client_secret=spec["client_secret"], jwt_alg="RS256", require_consent=True, reuse_consent=False,
    )
    client.redirect_uris = [spec["redirect_uri"]]
    client.save()
    client.response_types.set([ResponseType.objects.get(value="code")])


def main() -> None:
    spec = json.loads(sys.argv[1])
    server = make_server("127.0.0.1", 0, None, server_class=_Server, handler_class=_QuietHandler)
    issuer = f"http://127.0.0.1:{server.server_port}"
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "tests.oidc_op.settings",
        "OIDC_OP_DATABASE": spec["database"],
        "OIDC_OP_SITE_URL": issuer,
    })
    import django
    from django.core.wsgi import get_wsgi_application

    django.setup()
    _setup(spec)
    server.set_app(get_wsgi_application())
    print(json.dumps({"issuer": issuer}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
