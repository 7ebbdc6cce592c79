"""What a method releases: the declaration the upload mechanism reads, so that it never needs to know a rule.

A method states, as class (or instance) attributes, what its clients upload and how the privacy
mechanism may treat it:

``released``: every upload key mapped to its kind (a client part that declares its ``uploads``,
``fdlit.messages.Upload``, gives each its kind there instead, and ``released`` is not read):

* ``rows``: released data, a matrix whose every row is clipped to L2 norm c; any two clipped
  releases differ by at most 2c per row (the public-set logits, a density's mean rows);
* ``positive_rows``: the same, and the noisy values are made positive afterwards (absolute value,
  floored at 0.01: post-processing), for standard deviations;
* ``clear``: sent as is, outside the mechanism, and documented as not protected (e.g. the label set a
  density covers);
* ``unbounded``: released data with no sensitivity bound (parameters, likelihoods): differential
  privacy is refused while the method sends it.

The default (``fdlit.methods.Aggregator.released``) is ``{"logits": "rows"}``: the public-set
logits every client uploads. A method whose client part uploads more declares ``released`` in the
same class (or below it, or on the instance); otherwise the mechanism refuses it with DP on, since
its declaration may not cover what it sends. Likewise ``summed`` is trusted only from the class that
defines ``aggregate`` (or below it, or the instance).

``summed`` (optional, for the central threat model): ``"logits"`` or ``"probabilities"`` when the
rule's teacher depends on the uploads only through the clients' mean of that quantity (logit
averaging; probability averaging), so that secure aggregation may replace the uploads by one noisy
mean. ``None`` (the default): the rule combines the uploads non-linearly.

``evaluates_logits`` (optional, default False): the server evaluates something on the uploaded logits
themselves, which encodings (they send probabilities or labels) cannot serve.

``privacy_advice`` (optional): one sentence that a refusal of the method appends (what to set instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from fdlit.messages import Upload

ROWS, POSITIVE_ROWS, CLEAR, UNBOUNDED = "rows", "positive_rows", "clear", "unbounded"
KINDS = (ROWS, POSITIVE_ROWS, CLEAR, UNBOUNDED)
NOISED = (ROWS, POSITIVE_ROWS)  # the kinds that enter the Gaussian release
SUMMANDS = ("logits", "probabilities")
DEFAULT = {"logits": ROWS}


class UploadsPart(Protocol):
    """What of a method's client part the mechanism reads."""

    uploads: tuple[Upload, ...] | None


class Declaring(Protocol):
    """What the privacy mechanism reads on a method (``fdlit.methods.Aggregator`` declares each of them,
    with its meaning)."""

    exchange: str
    released: dict[str, str]
    summed: str | None
    evaluates_logits: bool
    privacy_advice: str
    secure_refusal: str
    secure_setup: str
    secure_levels: int

    @property
    def has_setup(self) -> bool: ...

    @property
    def sums_uploads(self) -> bool: ...

    def client_part(self) -> UploadsPart: ...

    def secure_summands(self, upload: dict[str, torch.Tensor], client: int
                        ) -> dict[str, tuple[torch.Tensor, float]]: ...

    def secure_level(self, upload: dict[str, torch.Tensor], client: int) -> torch.Tensor: ...


def declared_in(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO that defines ``name`` (None: none does)."""
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def stale(cls: type, declaration: str, behaviour: str) -> bool:
    """Whether ``behaviour`` (a method) is overridden below the class that made ``declaration``, so the
    declaration was written for other code."""
    declares, behaves = declared_in(cls, declaration), declared_in(cls, behaviour)
    return declares is not None and behaves is not None and behaves is not declares and issubclass(behaves, declares)


def part_uploads(method: Declaring) -> bool:
    """Whether the method's client part overrides ``upload`` (the base's sends nothing besides the logits)."""
    return len([k for k in type(method.client_part()).__mro__ if "upload" in vars(k)]) > 1


def part_declaration(method: Declaring | None) -> tuple[Upload, ...] | None:
    """The ``uploads`` a method's client part declares itself (None: it leaves them to ``released``)."""
    return None if method is None else method.client_part().uploads


class Release:
    """A method's declaration, read once and checked (``method``: None reads the defaults above)."""

    def __init__(self, method: Declaring | None = None):
        self.name = type(method).__name__ if method is not None else "the method"
        declared = part_declaration(method)  # the client part's own ``uploads``, where it declares them
        released = DEFAULT if method is None else method.released
        self.released: dict[str, str] = dict(released) if declared is None else {u.name: u.kind for u in declared}
        for key, kind in self.released.items():
            if kind not in KINDS:
                raise TypeError(f"{self.name}.released[{key!r}] = {kind!r}; allowed kinds: {', '.join(KINDS)}")
        self.summed: str | None = None if method is None else method.summed
        if self.summed is not None and self.summed not in SUMMANDS:
            raise TypeError(f"{self.name}.summed = {self.summed!r}; allowed: None, {', '.join(SUMMANDS)}")
        self.evaluates_logits = method is not None and bool(method.evaluates_logits)
        self.advice = "" if method is None else method.privacy_advice or ""
        cls, own = type(method), {} if method is None else vars(method)  # own: declared on the instance itself
        # a hook that uploads more, defined below the class that declared ``released`` (an old-style
        # ``client_upload`` on the method, or a client part whose ``upload`` is its own)
        self.undeclared_upload = method is not None and declared is None and "released" not in own and (
            stale(cls, "released", "client_upload") or (part_uploads(method) and stale(cls, "released", "client_part")))
        self.undeclared_teacher = method is not None and "summed" not in own and stale(cls, "summed", "aggregate")

    def keys(self, *kinds: str) -> list[str]:
        return [k for k, kind in self.released.items() if kind in kinds]

    def refusal(self, reason: str) -> str:
        return f"{reason}{'; ' + self.advice if self.advice else ''}"
