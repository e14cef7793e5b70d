"""A real OpenID Provider for the single sign-on tests: django-oidc-provider in its own process
(`python -m tests.oidc_op.serve`), with its own tiny settings. See tests/e2e/test_single_sign_on.py."""
