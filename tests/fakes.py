"""Fake engines for the tests, entering through the same registry as real backends.

* :class:`ToyModel` / :class:`FakeEngine` -- a tiny deterministic numpy "model"
  whose every logit is known in advance (``shape_eps`` adds an error to rows of
  passes wider than one token: batched-versus-single numerics of known size).
* :class:`FaultyEngine` -- wraps ANY engine (a fake, a tiny GGUF, the demo) and
  plants a KV-cache fault at its first rollback of each run: it keeps a rejected
  draft's entry, or drops an accepted token's entry.  The rollback faults of a
  hybrid target (a checkpoint restored late, a snapshot off by one, a replay
  skipped or keeping a rejected token) are ``plants_rollback.RollbackFaultEngine``.
* :class:`HybridFakeEngine` -- a fake whose memory cannot drop positions: it rolls
  back only as a snapshot or checkpoint engine can, and refuses anything else.
* :func:`accepting_unpicked` -- a faulty acceptance rule for the speculative
  loop (``monkeypatch.setattr(generate, "accepted_prefix", ...)``): it also
  accepts the first draft token the target did not pick.
* :class:`FaultyBackend` -- wraps a backend so the engines opened on chosen
  model files are :class:`FaultyEngine` (or ``RollbackFaultEngine``) contexts.
* :class:`BrokenBackend` -- fake engines whose GPU side (or all-threads side)
  computes garbage: what the backend check must flag.
* :class:`KernelToy` -- models named ``dispatch:WIDE:EPS`` (:class:`DispatchToy`, a
  planted kernel switch at width WIDE) or ``noisy`` (:class:`Noisy` engines: fresh
  noise on every pass), for the kernel map.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from specview.core.engine import Engine, EngineSettings, VocabInfo
from specview.core.registry import Backend, LoadedModel
from specview.core.inprocess import InProcessBackend

N_VOCAB = 40
EOS = 2


class ToyModel:
    """logits(prefix) = A[last] + B[second to last] + a position ripple; ``shape_eps`` adds a T-dependent error."""

    def __init__(self, seed: int = 0, *, noise: float = 0.0, shape_eps: float = 0.0, eos_bias: float = -4.0):
        rng = np.random.default_rng(seed)
        self.A = rng.standard_normal((N_VOCAB, N_VOCAB)).astype(np.float32) * 3
        self.B = rng.standard_normal((N_VOCAB, N_VOCAB)).astype(np.float32)
        if noise:
            nrng = np.random.default_rng(seed + 100)
            self.A += nrng.standard_normal(self.A.shape).astype(np.float32) * noise
        self.A[:, EOS] += eos_bias
        self.shape_eps = shape_eps

    def logits(self, prefix: Sequence[int], T: int = 1) -> np.ndarray:
        last = prefix[-1]
        prev = prefix[-2] if len(prefix) > 1 else 0
        row = self.A[last] + self.B[prev] + np.float32(0.01) * np.sin(np.arange(N_VOCAB) * len(prefix))
        if self.shape_eps and T > 1:
            row = row + np.float32(self.shape_eps) * np.cos(np.arange(N_VOCAB) * (T + len(prefix)))
        return row.astype(np.float32)

    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        seq = list(prompt)
        out = []
        for _ in range(n):
            t = int(np.argmax(self.logits(seq, 1)))
            out.append(t)
            seq.append(t)
        return out


class DispatchToy(ToyModel):
    """Rows of a pass at least ``wide`` tokens wide are off by ``eps``: a kernel switch at that width."""

    def __init__(self, wide: int, eps: float, seed: int = 0):
        super().__init__(seed)
        self.wide, self.eps = wide, eps

    def logits(self, prefix: Sequence[int], T: int = 1) -> np.ndarray:
        row = ToyModel.logits(self, prefix, 1)
        if T >= self.wide:
            row = row + np.float32(self.eps) * np.cos(np.arange(N_VOCAB) * (T + len(prefix))).astype(np.float32)
        return row.astype(np.float32)


VOCAB = VocabInfo(
    n_vocab=N_VOCAB, vocab_type="toy", bos=1, eos=EOS, add_bos=True, add_eos=False,
    eog=frozenset({EOS}), texts=tuple(f"t{i}" for i in range(N_VOCAB)),
)


class FakeEngine(Engine):
    backend = "fake"

    def __init__(self, model: ToyModel, n_ctx: int = 4096, n_batch: int = 64, vocab: VocabInfo = VOCAB):
        super().__init__()
        self.model = model
        self.kv: list[int] = []
        self._n_ctx = n_ctx
        self._n_batch = n_batch
        self._vocab = vocab
        self.batch_sizes: list[int] = []
        self.truncations: list[int] = []

    @property
    def vocab(self) -> VocabInfo:
        return self._vocab

    def model_facts(self) -> dict[str, Any]:
        return {"path": "toy", "file": "toy", "quantization": "toy", "architecture": "toy", "n_vocab": N_VOCAB}

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return [1] + [3 + (ord(c) % (N_VOCAB - 3)) for c in text]

    def piece(self, token: int) -> str:
        return f"<{token}>"

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        n = len(tokens)
        assert 0 < n <= self._n_batch
        assert len(self.kv) == self.n_past
        self.kv.extend(tokens)
        self.batch_sizes.append(n)
        out = []
        for r in rows:
            r = r + n if r < 0 else r
            out.append(self.model.logits(self.kv[: self.n_past + r + 1], n))
        self.n_past += n
        self.n_evals += 1
        return np.stack(out)

    def truncate(self, n: int) -> None:
        assert 0 <= n <= self.n_past
        del self.kv[n:]
        self.truncations.append(n)
        self.n_past = n


class HybridFakeEngine(FakeEngine):
    """A fake whose memory cannot drop positions, like a recurrent state: it rolls back only as ``mode`` can.

    * ``snapshots``: up to ``depth`` tokens (``plan_rollbacks`` raises it), the last pass's or a prepared run of
      single-token passes';
    * ``checkpoint``: back to where ``prepare_rollback`` saved its state (a replay of the tokens past it when the
      truncation is later), and nowhere else.

    Anything else raises, so a loop that forgets to prepare a rollback, or truncates past its checkpoint, fails
    here.  ``restores`` records each as (mode, replay width); :meth:`rollbacks` counts them by mechanism, as the
    llama.cpp engine does.
    """

    def __init__(self, model: ToyModel, mode: str = "checkpoint", depth: int = 3, **kw: Any):
        super().__init__(model, **kw)
        self.mode, self.depth = mode, depth
        self.ckpt: int | None = None
        self.last_width = 0
        self.kept: set[int] = set()
        self.restores: list[tuple[str, int]] = []

    def rollback_mode(self, n_drop: int) -> str:
        return "checkpoint" if self.mode == "snapshots" and n_drop > self.depth else self.mode

    def prepare_rollback(self, n_drop: int) -> str:
        self.kept = set()
        if n_drop <= 0:
            return ""
        mode = self.rollback_mode(n_drop)
        if mode == "checkpoint":
            self.ckpt = self.n_past
        else:
            self.kept = {self.n_past}
        return mode

    def plan_rollbacks(self, n_drop: int) -> None:
        if self.mode == "snapshots":
            self.depth = max(self.depth, n_drop)

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        out = super().eval(tokens, rows)
        self.last_width = len(tokens)
        if self.kept and len(tokens) == 1:
            self.kept.add(self.n_past)
        return out

    def truncate(self, n: int):
        from specview.core.engine import Rollback

        drop = self.n_past - n
        if drop == 0:
            return None
        if n == 0:
            super().truncate(0)
            self.ckpt, self.kept = None, set()
            return None
        if self.mode == "snapshots" and drop <= self.depth and (drop < self.last_width or n in self.kept):
            super().truncate(n)
            self.restores.append(("snapshots", 0))
            return Rollback("snapshots")
        if self.ckpt is None or n < self.ckpt:
            raise AssertionError(f"a {self.mode} memory cannot drop {drop} tokens back to {n} "
                                 f"(checkpoint at {self.ckpt})")
        replay = n - self.ckpt
        super().truncate(n)
        self.restores.append(("checkpoint", replay))
        return Rollback("checkpoint", replay=replay)

    def rollbacks(self) -> dict[str, int]:
        """The restores by mechanism: a snapshot is an n_rs_seq one; a checkpoint, and a replay where it had one."""
        used = {"n_rs_seq": sum(m == "snapshots" for m, _ in self.restores),
                "checkpoint": sum(m == "checkpoint" for m, _ in self.restores),
                "replay": sum(m == "checkpoint" and r > 0 for m, r in self.restores)}
        return {k: v for k, v in used.items() if v}


class FakeLoaded(LoadedModel):
    def __init__(self, name: str):
        seed, _, rest = name.partition(":")
        noise, _, eps = rest.partition(":")
        self.path = name
        self.toy = ToyModel(int(seed or 0), noise=float(noise or 0.0), shape_eps=float(eps or 0.0))

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "file": self.path, "quantization": "toy", "architecture": "toy"}

    @property
    def vocab(self) -> VocabInfo:
        return VOCAB

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return FakeEngine(self.toy).tokenize(text)

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> FakeEngine:
        return FakeEngine(self.toy, n_ctx=n_ctx, n_batch=settings.n_batch)


class FakeBackend(InProcessBackend):
    """Model names are 'SEED', 'SEED:NOISE' or 'SEED:NOISE:SHAPE_EPS'."""

    name = "fake"

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load(self, name: str, settings: EngineSettings) -> FakeLoaded:
        self.loaded.append(name)
        return FakeLoaded(name)


# -- planted faults --------------------------------------------------------------------------
FAULTS = ("keep-rejected", "drop-accepted")


class WrappedEngine(Engine):
    """An engine over another one: its facts and its rollback questions are the inner engine's.

    A fault-planting wrapper overrides what it plants (positions, truncation, evaluation); ``MARGIN`` context
    positions are kept back for the positions a fault may add.
    """

    MARGIN = 1

    def __init__(self, inner: Engine):
        super().__init__()
        self.inner = inner
        self.backend = f"faulty-{inner.backend}"

    @property
    def vocab(self) -> VocabInfo:
        return self.inner.vocab

    @property
    def n_ctx(self) -> int:
        return self.inner.n_ctx - self.MARGIN

    @property
    def threads(self) -> Any:
        return getattr(self.inner, "threads", None)

    def model_facts(self) -> dict[str, Any]:
        return self.inner.model_facts()

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.inner.tokenize(text, chat=chat)

    def piece(self, token: int) -> str:
        return self.inner.piece(token)

    def rollback_mode(self, n_drop: int) -> str:
        return self.inner.rollback_mode(n_drop)

    def prepare_rollback(self, n_drop: int) -> str:
        return self.inner.prepare_rollback(n_drop)

    def plan_rollbacks(self, n_drop: int) -> None:
        self.inner.plan_rollbacks(n_drop)

    def rollbacks(self) -> dict[str, int]:
        return self.inner.rollbacks()

    def snapshots_by_checkpoint(self) -> bool:
        return self.inner.snapshots_by_checkpoint()

    def close(self) -> None:
        self.inner.close()


class FaultyEngine(WrappedEngine):
    """Any engine, with one KV-cache fault planted at its first rollback of each run.

    * ``keep-rejected``: the rollback keeps the first rejected draft token's KV entry;
    * ``drop-accepted``: the rollback also drops the entry of the last token it
      should keep (an accepted token).

    Engines like llama.cpp's need a sequence's positions to stay consecutive, so
    the wrapper shifts every later token by one position in the inner engine:
    callers see ``n_past`` as they expect, the model sees one token too many (or
    too few) in its context.  ``truncate(0)``, the start of every prefill,
    re-arms the fault; ``faults`` counts how often it fired.
    """

    def __init__(self, inner: Engine, fault: str):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        super().__init__(inner)
        self.fault = fault
        self.shift = 0
        self.armed = True
        self.faults = 0

    @property
    def n_batch(self) -> int:
        return self.inner.n_batch

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        e0 = self.inner.eval_seconds
        out = self.inner.eval(tokens, rows)
        self.eval_seconds += self.inner.eval_seconds - e0
        self.n_past += len(tokens)
        self.n_evals += 1
        return out

    def truncate(self, n: int) -> None:
        if n == 0:
            self.shift, self.armed = 0, True
            self.inner.truncate(0)
        elif self.armed and n < self.n_past and (self.fault == "keep-rejected" or n > 1):
            self.shift = 1 if self.fault == "keep-rejected" else -1
            self.inner.truncate(n + self.shift)
            self.armed = False
            self.faults += 1
        else:
            self.inner.truncate(n + self.shift)
        self.n_past = n


def accepting_unpicked(real: Callable[[Sequence[int], Sequence[int]], int]) -> Callable[..., int]:
    """An acceptance rule with a bug: it also accepts the first draft token the target did not pick."""

    def accepted_prefix(draft: Sequence[int], argmax: Sequence[int]) -> int:
        n = real(draft, argmax)
        return n + 1 if n < len(draft) else n

    return accepted_prefix


class _FaultyLoaded(LoadedModel):
    def __init__(self, inner: LoadedModel, owner: "FaultyBackend"):
        self.inner = inner
        self.owner = owner
        self.path = inner.path

    def facts(self) -> dict[str, Any]:
        return self.inner.facts()

    @property
    def vocab(self) -> VocabInfo:
        return self.inner.vocab

    @property
    def n_ctx_train(self) -> int | None:
        return self.inner.n_ctx_train

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.inner.tokenize(text, chat=chat)

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> Engine:
        from plants_rollback import MARGIN, ROLLBACK_FAULTS, RollbackFaultEngine

        fault = self.owner.faults.get(self.path)
        if fault is None:
            return self.inner.new_engine(settings, n_ctx)
        if fault in ROLLBACK_FAULTS:
            eng: Engine = RollbackFaultEngine(self.inner.new_engine(settings, n_ctx + MARGIN), fault)
        else:
            eng = FaultyEngine(self.inner.new_engine(settings, n_ctx + 1), fault)
        self.owner.engines.append(eng)
        return eng

    def close(self) -> None:
        self.inner.close()


class FaultyBackend(InProcessBackend):
    """``base`` (a backend) with :class:`FaultyEngine` contexts on the files named in ``faults`` (path -> fault).

    Register it with ``register_backend(name, lambda: FaultyBackend(base))``
    and set ``faults`` (keyed by the loaded model's ``path``) before a run.
    """

    def __init__(self, base: Backend, name: str = "faulty"):
        self.base = base
        self.name = name
        self.faults: dict[str, str] = {}
        self.engines: list[FaultyEngine] = []

    def resolve(self, name: str, *, progress=None) -> str:
        return self.base.resolve(name, progress=progress)

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        return self.base.model_key(name, settings)

    def environment(self) -> dict[str, Any]:
        return self.base.environment()

    def decide(self, cfg, **kw):
        return self.base.decide(cfg, **kw)

    def check(self, cfg) -> None:
        self.base.check(cfg)

    def load(self, name: str, settings: EngineSettings) -> LoadedModel:
        return _FaultyLoaded(self.base.load(name, settings), self)


# -- a broken backend ----------------------------------------------------------------------
class BrokenEngine(FakeEngine):
    """A fake engine that computes the model wrongly: its logits are the toy model's scrambled and scaled."""

    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        out = super().eval(tokens, rows)
        return (out[:, ::-1] * np.float32(3.0)).astype(np.float32)


class _BrokenLoaded(FakeLoaded):
    def __init__(self, name: str, broken: Callable[[EngineSettings], bool]):
        super().__init__(name)
        self.broken = broken

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> FakeEngine:
        cls = BrokenEngine if self.broken(settings) else FakeEngine
        return cls(self.toy, n_ctx=n_ctx, n_batch=settings.n_batch)


class BrokenBackend(InProcessBackend):
    """Fake engines that claim a GPU; contexts opened with ``-ngl`` != 0 are :class:`BrokenEngine` contexts.

    With ``gpu=False`` it is a CPU-only build whose multi-threaded contexts are broken instead.
    """

    def __init__(self, *, gpu: bool = True, name: str = "broken"):
        self.gpu = gpu
        self.name = name

    def environment(self) -> dict[str, Any]:
        return {"gpu_offload": self.gpu}

    def load(self, name: str, settings: EngineSettings) -> LoadedModel:
        if self.gpu:
            return _BrokenLoaded(name, lambda s: s.gpu_layers != 0)
        return _BrokenLoaded(name, lambda s: s.threads > 1)

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        return (name, settings.gpu_layers != 0)


class Noisy:
    """Mixed into an engine: every forward pass adds fresh noise (a backend that does not reproduce itself)."""

    rng = np.random.default_rng(3)

    def eval(self, tokens, rows):  # type: ignore[no-untyped-def]
        out = super().eval(tokens, rows)  # type: ignore[misc]
        return out + self.rng.standard_normal(out.shape).astype(np.float32) * 1e-3


class NoisyEngine(Noisy, FakeEngine):
    pass


class KernelToy(LoadedModel):
    """Names: 'dispatch:WIDE:EPS' (a kernel switch at width WIDE) or 'noisy'; subclasses pick the engines."""

    engine: type = FakeEngine
    noisy_engine: type = NoisyEngine
    max_text: int | None = None  # characters of a prompt text it tokenizes

    def __init__(self, name: str):
        self.path = name
        kind, *rest = name.split(":")
        self.kind = kind
        self.toy = DispatchToy(int(rest[0]), float(rest[1])) if kind == "dispatch" else ToyModel(0)

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "file": self.path, "quantization": "toy", "architecture": "toy"}

    @property
    def vocab(self):
        return VOCAB

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return [1] + [3 + (ord(c) % (N_VOCAB - 3)) for c in text[:self.max_text]]

    def new_engine(self, settings: EngineSettings, n_ctx: int):
        cls = self.noisy_engine if self.kind == "noisy" else self.engine
        return cls(self.toy, n_ctx=n_ctx, n_batch=settings.n_batch)


class ToyText:
    """The text side of the locate and kernel-cause tests' toy engines: a 16-token vocabulary, one token per
    character, pieces that name their id."""

    TOY_VOCAB = 16

    @property
    def vocab(self) -> VocabInfo:
        return VocabInfo(n_vocab=self.TOY_VOCAB, vocab_type="spm", bos=1, eos=2, add_bos=True, add_eos=False)

    def model_facts(self) -> dict[str, Any]:
        return {"path": "toy"}

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return [1] + [3 + (ord(c) % 10) for c in text]

    def piece(self, token: int) -> str:
        return f"<{token}>"
