"""What a failed hosted call means, and whose failure it is.

A hosted call touches three parties (see hubclient.py): the provider behind the router, the Hub (whose model API
says which providers serve a model, and which InferenceClient asks again), and the provider's file host. Each
failure is put on the one that failed: a Hub outage is not a provider's, an expired file link is not the Hub's.
Each becomes one line a user can act on, an outcome for the metrics, and `final` where no other provider or
hosted model would fare better (the account itself was refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..urlpolicy import redact_urls_in
from .hubclient import ProviderFileError

HUB_NAME = "the Hugging Face Hub"
# the Hub's own wording for a token it does not know (huggingface_hub reads it from X-Error-Message): a 401
# without it, on a repository's API, is the Hub's way of saying "no such repository, or private"
INVALID_TOKEN = "Invalid credentials in Authorization header"
ERROR_MESSAGE = "X-Error-Message"  # the header it comes in


@dataclass(frozen=True)
class Failure:
    outcome: str  # the metrics' outcome (metrics.PROVIDER_OUTCOMES)
    line: str  # one line for the user
    final: bool = False  # no other provider or hosted model is tried (the account was refused, or time is up)
    answered: bool = False  # the Hub answered (a refused token, no such model): not a failure to ask

    @property
    def account(self) -> bool:
        """The account itself was refused (a bad token, no credits): the rest of the request sends nothing there."""
        return self.outcome in ("unauthorized", "out_of_credits")


def status_of(exc: BaseException | None) -> int | None:
    """The HTTP status of the response an error came from, anywhere in the chain."""
    for _ in range(10):  # pragma: no mutate: a bound on the chain's length (a cause may loop); any will do
        if exc is None:
            return None
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return status
        exc = exc.__cause__ or exc.__context__
    return None


def timed_out(exc: BaseException | None) -> bool:
    """InferenceClient's timeout error, the HTTP client's, or a plain TimeoutError (replicate's `Prefer: wait`
    running out), anywhere in the chain."""
    import httpx2
    from huggingface_hub.errors import InferenceTimeoutError

    for _ in range(10):  # pragma: no mutate: a bound on the chain's length (a cause may loop); any will do
        if exc is None:
            return False
        if isinstance(exc, (httpx2.TimeoutException, InferenceTimeoutError, TimeoutError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _file_error(exc: BaseException | None) -> ProviderFileError | None:
    for _ in range(10):  # pragma: no mutate: a bound on the chain's length (a cause may loop); any will do
        if exc is None or isinstance(exc, ProviderFileError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def from_http(exc: BaseException | None) -> bool:
    """The error came from an HTTP exchange (a status, or the connection failing or timing out), not from the
    client's own checks of what it was answered (a ValueError about a task the model does not do)."""
    import httpx2

    for _ in range(10):  # pragma: no mutate: a bound on the chain's length (a cause may loop); any will do
        if exc is None:
            return False
        if isinstance(exc, httpx2.HTTPError) or isinstance(getattr(getattr(exc, "response", None), "status_code", None),
                                                            int):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def token_refused(exc: BaseException) -> bool:
    """The Hub refused the token itself (not "no such repository", which it also says with a 401)."""
    from huggingface_hub.errors import RepositoryNotFoundError

    if status_of(exc) != 401 or isinstance(exc, RepositoryNotFoundError):
        return False
    said = getattr(getattr(exc, "response", None), "headers", {}).get(ERROR_MESSAGE)
    return said in (None, INVALID_TOKEN)


def hub_failure(exc: BaseException, model_id: str, slow_after: float, line: str) -> Failure:
    """A failure of the Hub's model API (the provider mapping), from us or from InferenceClient. `line`: the
    error's own first line, redacted."""
    from huggingface_hub.errors import RepositoryNotFoundError

    if timed_out(exc):
        return Failure("timeout", f"{HUB_NAME} did not answer within {slow_after:g}s while looking up the providers of "
                                  f"{model_id}; try again")
    if token_refused(exc):
        return Failure("unauthorized", f"{HUB_NAME} refused huggingface.token (401 Unauthorized: the token is revoked, "
                                       "expired or mistyped): set a valid token in huggingface.token or "
                                       "HUGGINGFACE_ACCESS_TOKEN (https://huggingface.co/settings/tokens)", True, True)
    status = status_of(exc)
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return Failure("error", f"{model_id} is not on the Hub (or is private or gated for this token)", answered=True)
    if status == 429:
        return Failure("rate_limited", f"{HUB_NAME} is rate-limiting this server (429 Too Many Requests) while looking "
                                       f"up the providers of {model_id}; try again in a minute")
    if status is None:
        return Failure("error", f"{HUB_NAME} could not be reached to look up the providers of {model_id}: {line}")
    return Failure("unavailable" if status == 503 else "error",
                   f"{HUB_NAME} failed ({status}) while looking up the providers of {model_id}: {line}")


def provider_failure(exc: BaseException, who: str, model_id: str, timeout: float, left: float,
                     line: str) -> Failure:
    """A failure of the provider's call (`who`: its name in the line), or of fetching its output file. `left`:
    seconds until the request's deadline (inf: none)."""
    file = _file_error(exc)
    if file is not None:  # its own cause may be a socket's timeout: the file's failure, said as such
        if file.status in (401, 403, 404, 410):
            return Failure("error", f"the provider's file link expired or was refused (HTTP {file.status} from "
                                    f"{who}'s file host): the output of {model_id} could not be fetched; try again")
        if file.refused:
            return Failure("error", f"{who} returned an output file the URL policy refuses: {line}")
        if file.slow:
            return Failure("timeout", f"{who}'s output file of {model_id} was not fetched in time: {line}",
                           left <= 0.05)
        return Failure("error", f"{who}'s output file of {model_id} could not be fetched: {line}")
    if timed_out(exc):
        if left <= 0.05:
            return Failure("timeout", f"{who} timed out (the deadline passed)", True)
        if type(exc) is TimeoutError:  # the provider's own wait ran out (replicate: `Prefer: wait`), not our timer
            return Failure("timeout", f"{who} timed out: {line}")
        return Failure("timeout", f"{who} timed out (no answer for {timeout:.0f}s)")
    status = status_of(exc)
    if status == 401:
        return Failure("unauthorized", f"{who} refused the Hugging Face token (401 Unauthorized): check "
                                       "huggingface.token or HUGGINGFACE_ACCESS_TOKEN (a fine-grained token needs "
                                       "the permission to make calls to Inference Providers)", True)
    if status == 402:
        return Failure("out_of_credits", f"the Hugging Face account has no Inference Providers credits left (402 "
                                         f"Payment Required from {who}): add credits at "
                                         "https://huggingface.co/settings/billing, or run the task on the local "
                                         "models server (inference_mode: hybrid)", True)
    if status == 429:
        return Failure("rate_limited", f"{who} is rate-limiting this token (429 Too Many Requests): wait a minute, "
                                       "or allow more providers in huggingface.providers")
    if status == 503:
        return Failure("unavailable", f"{who} cannot serve {model_id} right now (503 Service Unavailable: the model "
                                      "is loading or the provider is overloaded); try again in a minute")
    return Failure("error", f"{who} failed{f' ({status})' if status else ''}: {line}")


def one_line(exc: BaseException, secret: str | None) -> str:
    """The first line of an error (the server's own message when it sent one), without secrets or URLs."""
    message = getattr(exc, "server_message", None) or str(exc) or exc.__class__.__name__
    message = message.strip().splitlines()[0] if message.strip() else exc.__class__.__name__
    if secret:
        message = message.replace(secret, "***")
    return redact_urls_in(message)[:300]
