"""Errors raised by services. Each carries a stable code, a sentence for people, the HTTP status
an API should answer with, and optional structured extras (conflicting bookings, quota left)."""


class DomainError(Exception):
    http_status = 400

    def __init__(self, code: str, detail: str, **extra: object) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.extra = extra


class Conflict(DomainError):
    http_status = 409


class NotPermitted(DomainError):
    http_status = 403


class NotFound(DomainError):
    http_status = 404
