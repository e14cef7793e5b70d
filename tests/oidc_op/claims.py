"""The provider's claims: the standard profile and e-mail, and `groups` (the user's Django
groups) under a scope of the same name, as identity providers commonly send them."""

from django.utils.translation import gettext_lazy as _
from oidc_provider.lib.claims import ScopeClaims


def userinfo(claims, user):
    claims.update({
        "preferred_username": user.username, "email": user.email, "email_verified": True,
        "given_name": user.first_name, "family_name": user.last_name,
    })
    return claims


class GroupsScopeClaims(ScopeClaims):
    info_groups = (_("Groups"), _("The groups you belong to."))

    def scope_groups(self):
        return {"groups": sorted(self.user.groups.values_list("name", flat=True))}
