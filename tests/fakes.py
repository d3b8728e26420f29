"""A fake engine over a tiny deterministic numpy "model", entering through the same registry as real backends."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specview.core.engine import Engine, EngineSettings, VocabInfo
from specview.core.registry import Backend, LoadedModel

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


class FakeLoaded(LoadedModel):
    def __init__(self, name: str):
        seed, _, rest = name.partition(":")
        self.path = name
        self.toy = ToyModel(int(seed or 0), noise=float(rest or 0.0))

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "file": self.path, "quantization": "toy", "architecture": "toy"}

    @property
    def vocab(self) -> VocabInfo:
        return VOCAB

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return FakeEngine(self.toy).tokenize(text)

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> FakeEngine:
        return FakeEngine(self.toy, n_ctx=n_ctx, n_batch=settings.n_batch)


class FakeBackend(Backend):
    """Model names are 'SEED' or 'SEED:NOISE'."""

    name = "fake"

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load(self, name: str, settings: EngineSettings) -> FakeLoaded:
        self.loaded.append(name)
        return FakeLoaded(name)
