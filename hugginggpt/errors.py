"""One exception hierarchy; each message tells the user what to do next."""

from __future__ import annotations


class HuggingGPTError(Exception):
    """Base of every error this package raises on purpose."""

    status = 500
    kind = "server_error"


class ConfigError(HuggingGPTError):
    kind = "config_error"


class NoLLMConfigured(ConfigError):
    """The config names an LLM backend but not its key or endpoint (the offline demo still works)."""


class BadRequest(HuggingGPTError):
    """The client sent something we cannot act on (HTTP 400)."""

    status = 400
    kind = "invalid_request_error"


class PayloadTooLarge(BadRequest):
    status = 413


class UnsupportedMediaType(BadRequest):
    status = 415


class StorageFull(HuggingGPTError):
    """A quota on disk is used up (HTTP 507); nothing already stored is removed to make room."""

    status = 507
    kind = "storage_error"


class LLMError(HuggingGPTError):
    """The LLM backend failed or is unreachable (HTTP 502)."""

    status = 502
    kind = "llm_backend_error"


class ResourceError(BadRequest):
    """An input image/audio could not be resolved or fetched."""


class PlanError(HuggingGPTError):
    """The planner's output could not be turned into a task list."""

    kind = "plan_error"


class BackendError(HuggingGPTError):
    """A model backend (local models server, hosted inference) failed for one task."""

    kind = "backend_error"


class Unauthorized(HuggingGPTError):
    """No valid bearer token (HTTP 401)."""

    status = 401
    kind = "authentication_error"


class Forbidden(HuggingGPTError):
    """The request is understood but this server's config does not allow it (HTTP 403)."""

    status = 403
    kind = "permission_error"


class DeadlineExceeded(LLMError):
    """The request ran past `request_timeout` (HTTP 504 when nothing can be answered)."""

    status = 504
    kind = "timeout_error"


class NotFound(BadRequest):
    """The client named something this server does not have, e.g. an unknown model on /v1 (HTTP 404)."""

    status = 404
