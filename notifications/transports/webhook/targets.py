"""Which webhook URLs we are willing to call.

A webhook URL is chosen by a team manager, but the POST comes from inside our network; an
address that resolves to loopback, a private range, link-local (cloud metadata at
169.254.169.254) or anything else not globally routable would let a manager probe internal
services (SSRF). Such targets are refused unless the network is listed in
GPUBOOK_WEBHOOK_ALLOWED_NETWORKS. The check resolves the name and returns the address; the
transport then connects to exactly that address, so a second DNS answer cannot swap in an
internal one between check and connect (DNS rebinding).
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings


class UnsafeTarget(ValueError):
    """The URL is malformed or points somewhere we must not call."""


class UnresolvableTarget(OSError):
    """The host name did not resolve (may be temporary)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent in the request line
    address: str  # the vetted IP address to connect to


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [
        ipaddress.ip_network(network, strict=False)
        for network in settings.GPUBOOK_WEBHOOK_ALLOWED_NETWORKS
    ]


# IPv6 forms that carry an IPv4 address a host may route to: judged by that IPv4 address.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # ::a.b.c.d (deprecated, still routed by some stacks)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside ::ffff:a.b.c.d, ::a.b.c.d, 64:ff9b::a.b.c.d, 6to4 (2002::/16)
    or Teredo, or None."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64 or address in NAT64_LOCAL or (address in IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            if any(address in network for network in _allowed_networks()):
                return True
            address = inner
    if any(address in network for network in _allowed_networks()):
        return True
    return address.is_global and not address.is_multicast


def check_url(url: str) -> Target:
    """Parse, resolve and vet `url`. Raises UnsafeTarget or UnresolvableTarget."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UnsafeTarget(f"Not a valid URL: {error}.") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeTarget("A webhook URL must start with https:// or http://.")
    if not parts.hostname:
        raise UnsafeTarget("A webhook URL needs a host name.")
    if parts.username or parts.password:
        raise UnsafeTarget("Put credentials in the signature secret, not in the URL.")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise UnresolvableTarget(f"{parts.hostname} does not resolve: {error}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    refused = sorted({str(address) for address in addresses if not address_allowed(address)})
    if refused or not addresses:
        raise UnsafeTarget(
            f"{parts.hostname} resolves to a private, loopback or link-local address "
            f"({', '.join(refused)}); webhooks may only call public addresses."
        )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme=parts.scheme, host=parts.hostname, port=port, path=path, address=str(addresses[0]))
