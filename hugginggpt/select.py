"""Stage 2: pick a model for each task.

JARVIS's fixed rules first (ControlNet tasks, text tasks the LLM does itself), then catalog candidates
ranked for the request, checked for availability in parallel, and the LLM choosing among several.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from . import cancel
from .backends import Backend, ModelStatus
from .catalog import Catalog, ModelCard, Ranker, RankQuery
from .catalog.scoring import Factors
from .catalog.store import Candidate, CatalogStore
from .errors import LLMError
from .llm import LLMClient, stage_cap
from .plan import TEXT_TASKS_FOR_LLM, PlanParseError, Task, extract_json
from .prompts import PromptSet
from .requestctx import ContextThreadPool

log = logging.getLogger(__name__)

LLM_MODEL_ID = "ChatGPT"  # JARVIS's name for "the LLM answers this text task itself"
RESOURCE_ARGS = ("image", "audio", "video")
MAX_STATUS_ENTRIES = 10_000  # cached status answers; past it, expired ones go (then all)
PERMIT_ROUNDS = 8  # searches past denied rows per task: 10 + 20 + ... + 1280 rows at most


def is_reference(value: str) -> bool:
    """A resource, not words: `<GENERATED>-N`, a URL, a data URI or a path."""
    v = value.strip()
    return v.startswith(("<GENERATED>", "http://", "https://", "data:", "/")) and " " not in v[:200]


@dataclass
class Question:
    """What the LLM is asked when the ranking alone does not decide (its lead is below the margin, or
    `choose_model: llm`): the candidates kept, best first, with the cards it reads."""

    kept: list[tuple[str, str]]  # (model id, backend)
    metas: list[dict[str, Any]]
    lead: float | None  # the top candidate's score lead over the next (None: `llm` asks whatever the lead)


@dataclass
class Selection:
    task_id: int
    task: str
    model_id: str | None
    hosted_on: str | None  # "local" | "huggingface" | "llm" | None
    reason: str = ""  # why this model (empty when none was chosen: `error` says why)
    available: dict[str, list[str]] = field(default_factory=dict)  # backend -> available ids, ranked
    error: str | None = None
    seconds: float = 0.0  # how long choosing took (ranking, status checks, the LLM's choice)
    # set while the LLM's choice is wanted: this selection is then the ranking's pick, which stands when the
    # LLM cannot answer (or, in `auto`, when the task is ready to run before it has answered)
    question: Question | None = field(default=None, repr=False, compare=False)

    def without_llm(self, why: str) -> Selection:
        """The ranking's pick as the final choice, saying why the LLM's choice was not waited for."""
        lead = self.question.lead if self.question is not None else None
        ahead = f"{lead:.3f} ahead of the next candidate, below choose_model_margin; " if lead is not None else ""
        return replace(self, question=None, reason=f"top-ranked for this request ({ahead}{why})")

    def choose(self) -> dict[str, str] | str:
        """JARVIS's `choose model result`: {"id", "reason"} (or "" when nothing was chosen)."""
        return {"id": self.model_id, "reason": self.reason} if self.model_id else ""

    def fallbacks(self) -> list[tuple[str, str]]:
        """(model, backend) pairs to try, the chosen one first."""
        order: list[tuple[str, str]] = []
        if self.model_id and self.hosted_on in ("local", "huggingface"):
            order.append((self.model_id, self.hosted_on))
        for backend in ("local", "huggingface"):
            for mid in self.available.get(backend, []):
                if (mid, backend) not in order:
                    order.append((mid, backend))
        return order


class Availability:
    """Which candidates each backend can serve now, and why not; answers are cached for `ttl` seconds (a failure to
    ask, such as the Hub down or slow, is not an answer and is asked again next time)."""

    def __init__(self, backends: dict[str, Backend], ttl: float = 30.0, max_workers: int = 16):
        self.backends = backends
        self.ttl = ttl
        self._cache: dict[tuple[str, str], tuple[ModelStatus, float]] = {}
        self._lock = threading.Lock()
        self._pool = ContextThreadPool(max_workers=max_workers, thread_name_prefix="status")

    def _cached(self, backend: str, model_id: str, now: float) -> ModelStatus | None:
        hit = self._cache.get((backend, model_id))
        return hit[0] if hit and hit[1] > now else None

    def _ask(self, backend: str, model_id: str) -> ModelStatus:
        b = self.backends[backend]
        model_status = getattr(b, "model_status", None)
        if model_status is not None:
            return model_status(model_id)
        return ModelStatus(bool(b.is_available(model_id)))

    def _check(self, backend: str, model_id: str) -> ModelStatus:
        # shared work, cached for every request: the client that asked first leaving must not cut the check
        # (a cut check would read "not available" for everyone); status_timeout bounds it
        cancel.CURRENT.set(None)
        now = time.monotonic()
        with self._lock:
            hit = self._cached(backend, model_id, now)
        if hit is not None:
            return hit
        status = self._ask(backend, model_id)
        if self.ttl > 0 and status.lasting:
            with self._lock:
                if len(self._cache) >= MAX_STATUS_ENTRIES:  # ids a caller names (MCP run_model) come and go
                    self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
                    if len(self._cache) >= MAX_STATUS_ENTRIES:
                        self._cache.clear()
                self._cache[(backend, model_id)] = (status, now + self.ttl)
        return status

    def check(self, model_ids: list[str], backends: list[str]) -> dict[str, list[str]]:
        """backend -> the ids it can serve now, in the order asked."""
        return self.check_why(model_ids, backends)[0]

    def check_why(self, model_ids: list[str], backends: list[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
        """(backend -> the ids it can serve now, model id -> why a backend cannot, where it said). Answers still
        fresh are read here; only the others go to the status threads, all at once."""
        pairs = [(b, m) for b in backends if b in self.backends for m in model_ids]
        now = time.monotonic()
        with self._lock:
            known = {pair: self._cached(*pair, now) for pair in pairs}
        jobs = {pair: self._pool.submit(self._check, *pair) for pair in pairs if known[pair] is None}
        out: dict[str, list[str]] = {b: [] for b in backends}
        why: dict[str, str] = {}
        for (b, m) in pairs:
            try:
                status = known[(b, m)] if (b, m) not in jobs else jobs[(b, m)].result()
            except Exception:  # noqa: BLE001 - a broken status check means "not available"
                log.warning("status check of %s on %s failed", m, b)
                continue
            if status is not None and status.available:
                out[b].append(m)
            elif status is not None and status.why:
                why.setdefault(m, status.why)
        return out, why


# A reason that names a setting tells the user what to change: it is shown whatever its model's rank.
SETTING_RE = re.compile(r"huggingface\.(?:providers|token|base_url)|allowed_models|denied_models|inference_mode|"
                        r"local_deployment")


def _names(models: list[str], shown: int) -> str:
    named = models[:shown]
    rest = len(models) - len(named)
    if rest:
        return f"{', '.join(named)} and {rest} more"
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def why_none(ids: list[str], why: dict[str, str], shown: int = 3) -> str:
    """Why none of `ids` can run, in one line. One reason when they share it, each model's name aside (a refused
    token, the Hub down: "... the providers of a, b and c"); else the first few models' own, and every one that
    names a setting, whatever its rank, each said once with its model's name."""
    pairs = [(m, why[m]) for m in ids if m in why]
    if not pairs:
        return ""
    shapes: dict[str, list[str]] = {}
    for m, reason in pairs:
        shapes.setdefault(reason.replace(m, "\0"), []).append(m)
    if len(shapes) == 1:
        [(shape, models)] = shapes.items()
        return shape.replace("\0", _names(models, shown))
    listed = [(m, r) for k, (m, r) in enumerate(pairs) if k < shown or SETTING_RE.search(r)]
    more = len(pairs) - len(listed)
    return "; ".join(r if m in r else f"{m}: {r}" for m, r in listed) + (f" (and {more} more)" if more > 0 else "")


def control_task_fixup(task: Task) -> None:
    """JARVIS: a `<control>-text-to-image` task without text is really the annotator (or seg/depth)."""
    if task.task.endswith("-text-to-image") and "text" not in task.args:
        control = task.task.split("-")[0]
        task.task = {"seg": "image-segmentation", "depth": "depth-estimation"}.get(control, f"{control}-control")


def parse_choice(text: str, candidates: list[str]) -> tuple[str | None, str]:
    """The LLM's {"id", "reason"}, read tolerantly; the id must be one of the candidates."""
    chosen, reason = None, ""
    try:
        data = extract_json(text)
        if isinstance(data, list) and data:
            data = data[0]
        if isinstance(data, dict):
            chosen = str(data.get("id") or data.get("model") or data.get("model_id") or "") or None
            reason = str(data.get("reason") or "")
    except PlanParseError:
        pass
    if chosen is None:
        m = re.search(r"""["']?id["']?\s*[:=]\s*["']([^"']+)["']""", text)
        chosen = m.group(1) if m else None
        r = re.search(r"""["']?reason["']?\s*[:=]\s*["'](.+?)["']\s*[,}]?\s*$""", text, re.DOTALL)
        reason = r.group(1) if r else reason
    if chosen not in candidates:
        mentioned = [c for c in candidates if c in text]
        if chosen:
            mentioned += [c for c in candidates if c.endswith("/" + chosen.split("/")[-1]) and c not in mentioned]
        chosen = mentioned[0] if mentioned else None
    return chosen, reason or "chosen by the LLM"


class Selector:
    def __init__(
        self,
        *,
        catalog: Catalog,
        ranker: Ranker,
        availability: Availability,
        prompts: PromptSet,
        inference_mode: str,
        num_candidates: int,
        max_description_length: int,
        language: str | None = None,
        max_size_mb: float | None = None,
        choose: str = "auto",
        margin: float = 0.01,
        allowed: tuple[str, ...] = (),
        denied: tuple[str, ...] = (),
    ):
        """choose: "llm" asks the LLM whenever several candidates are available (JARVIS); "ranking" takes the
        top-ranked one; "auto" takes it when it leads the next by at least `margin` and asks the LLM otherwise."""
        self.choose = choose
        self.margin = margin
        self.language = language
        self.max_size_mb = max_size_mb
        self.catalog = catalog
        self.ranker = ranker
        self.availability = availability
        self.prompts = prompts
        self.inference_mode = inference_mode
        self.num_candidates = num_candidates
        self.max_description_length = max_description_length
        self.store: CatalogStore | None = None  # once open (at warm-up): candidates come from the Hub catalog
        self.allowed, self.denied = allowed, denied

    def permitted(self, model_id: str) -> bool:
        """`allowed_models` / `denied_models` (fnmatch patterns, case-sensitive; a denial wins): what clients may
        make this server run on its own keys and hardware."""
        if any(fnmatch.fnmatchcase(model_id, p) for p in self.denied):
            return False
        return not self.allowed or any(fnmatch.fnmatchcase(model_id, p) for p in self.allowed)

    def use_store(self, store: CatalogStore | None) -> None:
        """Rank from the catalog store from now on: Hub-sized, with popularity, size, latency, availability
        and each model's health in the score (None: the curated catalog in memory)."""
        self.store = store

    def backends_in_order(self) -> list[str]:
        return {"local": ["local"], "huggingface": ["huggingface"], "hybrid": ["local", "huggingface"]}[
            self.inference_mode
        ]

    def query(self, user_input: str, task: Task) -> RankQuery:
        """What the ranker reads for `task`: the user's request, after the task's text arguments it does not
        already contain. The candidates are the task type's own, so the type itself adds nothing, and the
        tasks of a request whose arguments come from the request (the usual case) share one query: one
        embedding per request. Resources (image/audio paths, URLs, data URIs, `<GENERATED>-N`) say nothing
        about which model fits and would only fill the ranker's bounded query, so they are left out."""
        lowered = user_input.lower()
        args = [str(v) for k, v in task.args.items()
                if k not in RESOURCE_ARGS and not is_reference(str(v)) and str(v).lower() not in lowered]
        return RankQuery(task=task.task, text=" ".join([*args, user_input]),
                         language=self.language, max_size_mb=self.max_size_mb)

    def needs_ranking(self, task: Task) -> bool:
        """False for the tasks a fixed rule decides (ControlNet, text tasks the LLM does itself)."""
        return not (task.error or task.task.endswith("-text-to-image") or task.task.endswith("-control")
                    or task.task in TEXT_TASKS_FOR_LLM)

    def prepare(self, user_input: str, tasks: Iterable[Task]) -> None:
        """Embed the ranking queries of all of a request's tasks in one batch, before they are selected one by
        one (in parallel): each `select` then finds its query's vector in the ranker's cache."""
        prepare = getattr(self.ranker, "prepare", None)
        if prepare is None:
            return
        try:
            prepare([self.query(user_input, t) for t in tasks if self.needs_ranking(t)])
        except Exception:  # noqa: BLE001 - each select embeds its own query if this fails
            log.exception("embedding the request's ranking queries failed")

    def rank(self, user_input: str, task: Task, exclude: Iterable[str] = ()) -> list[tuple[ModelCard, float]]:
        """The catalog's candidates for `task`, best first, with their scores."""
        return [(c.card, c.score) for c in self.candidates(user_input, task, exclude)]

    def candidates(self, user_input: str, task: Task, exclude: Iterable[str] = ()) -> list[Candidate]:
        """The best candidates for `task` with their scores and what decided them; `exclude`: never these."""
        query = self.query(user_input, task)
        limit = max(self.num_candidates * 2, 10)
        store = self.store
        if store is not None:
            vectors = getattr(self.ranker, "query_vectors", None)
            vector = vectors([query])[0] if vectors is not None else None

            def search(n: int, skip: set[str]) -> list[Candidate]:
                return store.search(task.task, query.text, limit=n, language=query.language,
                                    max_size_mb=query.max_size_mb, exclude=skip, query_vector=vector)
        else:
            def search(n: int, skip: set[str]) -> list[Candidate]:
                ranked = self.catalog.ranked(query, self.ranker, limit=n + len(skip))
                return [Candidate(card, score, Factors(meaning=score)) for card, score in ranked
                        if card.id not in skip][:n]
        return self._permitted_best(search, limit, set(exclude))

    def _permitted_best(self, search: Callable[[int, set[str]], list[Candidate]], limit: int,
                        skip: set[str]) -> list[Candidate]:
        """The `limit` best candidates that allowed_models / denied_models permit. The filter comes before the
        limit: when the best rows are denied, the search is asked again past them (excluding every row it has
        returned, asking for more each time), so permitted models ranked below denied ones are still found."""
        kept: list[Candidate] = []
        want = limit
        for _ in range(PERMIT_ROUNDS):
            found = search(want, skip)
            kept += [c for c in found if self.permitted(c.card.id)]
            if len(kept) >= limit or len(found) < want:  # enough, or the catalog has no more rows
                break
            skip = skip | {c.card.id for c in found}
            want *= 2
        kept.sort(key=lambda c: -c.score)
        return kept[:limit]

    def search(self, task: str | None, text: str, limit: int) -> list[dict[str, Any]]:
        """The catalog as people browse it (GET /models/search): cards for `task` (or every task), best first."""
        tasks = [task] if task else self.tasks()
        found: list[Candidate] = []
        for name in tasks:
            probe = Task(task=name, id=0, dep=[-1], args={})  # pragma: no mutate: only the type of a browsing task is read
            found += self.candidates(text, probe)[:limit]
        found.sort(key=lambda c: -c.score)
        return [{"id": c.card.id, "task": c.card.task, "downloads": c.card.downloads, "likes": c.card.likes,
                 "score": round(c.score, 4), "reason": c.reason} for c in found[:limit]]

    def tasks(self) -> list[str]:
        return sorted(self.store.tasks()) if self.store is not None else self.catalog.tasks()

    def select(self, user_input: str, task: Task, llm: LLMClient, logit_bias: float = 0.0,
               exclude: frozenset[str] = frozenset()) -> Selection:
        """The final choice for `task`, the LLM asked when the ranking does not decide.
        exclude: models that already failed in this request (a replan never picks them again)."""
        started = time.perf_counter()
        selection = self.by_ranking(user_input, task, exclude)
        if selection.question is not None:
            selection = self.ask_llm(selection, user_input, task, llm, logit_bias)
        selection.seconds = time.perf_counter() - started
        return selection

    def by_ranking(self, user_input: str, task: Task, exclude: frozenset[str] = frozenset()) -> Selection:
        """Everything but the LLM: the fixed rules, the ranking and the status checks. When the LLM's choice is
        wanted the answer is the ranking's pick with its `question` set (`ask_llm` asks it): the caller decides
        whether to wait for the LLM."""
        started = time.perf_counter()
        selection = self._select(user_input, task, exclude)
        selection.seconds = time.perf_counter() - started
        return selection

    def _select(self, user_input: str, task: Task, exclude: frozenset[str] = frozenset()) -> Selection:
        base = dict(task_id=task.id, task=task.task)
        if task.task.endswith("-text-to-image") or task.task.endswith("-control"):
            if self.inference_mode == "huggingface":
                return Selection(**base, model_id=None, hosted_on=None,
                                 error="ControlNet tasks need the local models server (inference_mode local or hybrid)")
            control = task.task.split("-")[0]
            model_id = f"lllyasviel/sd-controlnet-{control}" if task.task.endswith("-text-to-image") else task.task
            if not self.permitted(model_id):
                return Selection(**base, model_id=None, hosted_on=None,
                                 error=f"{model_id} is not permitted here (allowed_models / denied_models)")
            if not self.availability.check([model_id], ["local"]).get("local"):
                return Selection(**base, model_id=None, hosted_on=None, available={"local": []},
                                 error=f"the local models server cannot serve {model_id} (its /status says so: "
                                       "the weights are missing or the deployment level does not include it)")
            return Selection(**base, model_id=model_id, hosted_on="local", available={"local": [model_id]},
                             reason="ControlNet is the best model for this task.")
        if task.task in TEXT_TASKS_FOR_LLM:
            return Selection(**base, model_id=LLM_MODEL_ID, hosted_on="llm",
                             reason="The LLM performs well on this text task itself.")
        by_id = {c.card.id: c for c in self.candidates(user_input, task, exclude)}  # best first
        if not by_id:
            return Selection(**base, model_id=None, hosted_on=None,
                             error=f"no model in the catalog does {task.task}"
                                   + (" among those allowed_models / denied_models permit"
                                      if self.allowed or self.denied else ""))
        ids = list(by_id)
        order = self.backends_in_order()
        found, why = self.availability.check_why(ids, order)
        ranked_ids = {b: [m for m in ids if m in found[b]] for b in order}
        # JARVIS keeps at most num_candidate_models, local ones first.
        kept: list[tuple[str, str]] = []
        for b in order:
            for m in ranked_ids[b]:
                if len(kept) < self.num_candidates and m not in [k for k, _ in kept]:
                    kept.append((m, b))
        available = {b: [m for m, bb in kept if bb == b] for b in order}
        if not kept:
            where = " or ".join("the local models server" if b == "local" else "hosted inference" for b in order)
            reason = why_none(ids, why)
            return Selection(**base, model_id=None, hosted_on=None, available=available,
                             error=f"no available model for {task.task} on {where}" + (f": {reason}" if reason else ""))
        if len(kept) == 1:
            mid, b = kept[0]
            return Selection(**base, model_id=mid, hosted_on=b, reason="Only one model available.", available=available)
        lead = by_id[kept[0][0]].score - by_id[kept[1][0]].score
        mid, b = kept[0]
        if self.choose == "ranking" or (self.choose == "auto" and lead >= self.margin):
            return Selection(**base, model_id=mid, hosted_on=b, available=available,
                             reason=f"top-ranked for this request ({lead:.2f} ahead of the next candidate"
                                    f"{': ' + by_id[mid].reason if by_id[mid].reason else ''}); "
                                    "chosen without asking the LLM")
        metas: list[dict[str, Any]] = [by_id[m].card.meta(self.max_description_length, bb) for m, bb in kept]
        return Selection(**base, model_id=mid, hosted_on=b, available=available, reason="top-ranked candidate",
                         question=Question(kept, metas, lead if self.choose == "auto" else None))

    def ask_llm(self, pick: Selection, user_input: str, task: Task, llm: LLMClient,
                logit_bias: float = 0.0) -> Selection:
        """The LLM's choice among `pick.question`'s candidates; the ranking's pick when it cannot choose."""
        question = pick.question
        if question is None:
            return pick
        final = replace(pick, question=None)
        try:
            reply = llm.chat(self.prompts.choose_model(user_input, task.to_dict(), question.metas),
                             logit_bias_weight=logit_bias, max_tokens=stage_cap(llm, "choose_model"))
        except LLMError as exc:
            final.reason = f"top-ranked candidate (the LLM could not choose: {exc})"
            return final
        chosen, reason = parse_choice(reply, [m for m, _ in question.kept])
        if chosen is None:
            final.reason = "top-ranked candidate (the LLM's choice was not one of the candidates)"
            return final
        final.model_id, final.reason = chosen, reason
        final.hosted_on = next(b for m, b in question.kept if m == chosen)
        return final
