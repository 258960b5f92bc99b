"""Encoder inference on one GPU: bf16 weights, flash attention, no work on padding,
CUDA graphs for fixed shapes.

Two kinds of batch reach a deployed encoder, and each has its own cost:

* **Fixed shapes** (every row the same length, e.g. a benchmark or a client that pads to
  a fixed width): at small batch the GPU finishes each kernel faster than Python can
  launch the next, so :class:`GPUEncoder` records the whole forward pass once per shape
  in a CUDA graph and replays it (one launch instead of ~150). With no padding there is
  no mask, so SDPA picks flash attention.
* **Variable lengths** (real sentences padded to the longest): the rows are packed into
  one row of real tokens (:class:`~ctxkit.layers.attention.PackedSequences`), so the
  GEMMs, norms and activations skip the padding and attention runs flash attention's
  variable-length kernel; outputs come back padded, so every task head works unchanged.
  With ``cuda_graphs`` the packed batch is also replayed from a graph: its token count is
  rounded up on a ladder (at most 1/8 more, :func:`token_bucket`) by filler sequences, so
  a few graphs serve every mix of lengths and Python launches nothing per layer.

Weights are cast to bf16 once (no autocast casts per call); LayerNorm and softmax still
accumulate in fp32 inside their kernels.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..fast import FastPlan, GraphCache, apply, capture_graph, prepare_inference, resolve
from ..layers.attention import PackedSequences

__all__ = ["GPUEncoder", "GPUTaskModel", "bucket_batch", "token_bucket"]

logger = logging.getLogger(__name__)


def _map_tensors(obj: Any, fn) -> Any:
    """Apply ``fn`` to every tensor in a model output (tensor, dict, tuple, dataclass)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)})
    return obj


def _pinned(t: Tensor) -> Tensor:
    """A host tensor in pinned memory: copies from pageable memory make the host wait for
    the GPU's earlier work, which would serialise preparing a batch with running the last."""
    return t.pin_memory() if t.device.type == "cpu" and not t.is_pinned() else t


def _types(token_type_ids: Optional[Tensor]) -> dict:
    """``token_type_ids`` as a keyword, only when given: models without segments (GPT-2)
    take no such argument."""
    return {} if token_type_ids is None else {"token_type_ids": token_type_ids}


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _next_power_of_two(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def token_bucket(total: int) -> int:
    """``total`` rounded up on a ladder of 8 steps per power of two (at least 256 tokens):
    at most 1/8 of the compute is filler, and ~8 graphs cover each doubling."""
    top = 1 << max(total.bit_length() - 1, 0)
    return _round_up(max(total, 1), max(256, top // 8))


def bucket_batch(input_ids: Tensor, token_type_ids: Optional[Tensor], attention_mask: Tensor):
    """Pad a right-padded ``(batch, seq)`` batch to a bucketed shape on the host.

    The real rows keep their tokens; filler rows (pad id 0, none longer than the longest
    real row) bring the real-token count up to :func:`token_bucket`; empty rows bring the row count
    to a power of two (at least 32). Packed attention keeps every row to itself, so the real rows'
    outputs are those of the original batch. Powers of two, not multiples of 32, because a
    server's batches vary in size and length: with ~5 row counts and ~5 widths, its traffic
    falls into few graphs instead of capturing one per batch. The width (a power of two, at
    least 32, plus one) and the
    row count (> batch) differ from ``seq`` and ``batch``, which tells batch and token
    axes of the outputs apart (see ``GPUEncoder._cut``).

    Returns:
        ``(ids, types or None, mask)``, each ``(rows, width)`` on the host.
    """
    mask = attention_mask.bool().cpu()
    batch, seq = mask.shape
    lengths = mask.sum(1)
    total = int(lengths.sum())
    width = _next_power_of_two(max(seq, 32)) + 1
    filler = token_bucket(total) - total
    # Filler rows no longer than the longest real row: their positions stay in range.
    longest = max(int(lengths.max()), 1)
    fill = [longest] * (filler // longest) + ([filler % longest] if filler % longest else [])
    rows = _next_power_of_two(max(batch + len(fill) + 1, 32))
    all_lengths = torch.zeros(rows, dtype=torch.long)
    all_lengths[:batch] = lengths
    all_lengths[batch:batch + len(fill)] = torch.tensor(fill, dtype=torch.long)
    new_mask = torch.arange(width)[None, :] < all_lengths[:, None]
    ids = torch.zeros(rows, width, dtype=input_ids.dtype)
    ids[:batch, :seq] = input_ids.cpu()
    types = None
    if token_type_ids is not None:
        types = torch.zeros(rows, width, dtype=token_type_ids.dtype)
        types[:batch, :seq] = token_type_ids.cpu()
    return ids, types, new_mask


class GPUEncoder:
    """Run an encoder task model fast on one CUDA device.

    Args:
        model: a model called as ``model(input_ids, attention_mask, token_type_ids=...)`` (transformers' order)
            (a fine-tuned task model, e.g. :class:`~ctxkit.heads.classification.EncoderWithHead`,
            or a :class:`~ctxkit.models.bert.model.BertModel`). It is moved to ``device`` and
            ``dtype`` in place and put in eval mode.
        dtype: weight and activation dtype (bf16 by default; fp32 for checking).
        device: the CUDA device (default: the current one).
        plan: how fast it runs (:class:`~ctxkit.fast.FastPlan` or its string; default
            ``"auto"``: the fastest exact plan for inference on this GPU). The options that
            matter here: ``graphs`` (replay fixed-shape batches as they are, variable-length
            ones packed and bucketed, :func:`bucket_batch`, from captured CUDA graphs),
            ``compile`` (``torch.compile`` the forward; ``autotune`` for Inductor's GEMM
            autotuning; capture stays ctxkit's), ``qkv``, ``gelugemm`` (the exact GELU in a
            Triton GEMM epilogue, Hopper), and the declared precisions ``gelutanh`` (tanh GELU
            in the cuBLASLt epilogue: exact for GPT-2, |gelu_erf - gelu_tanh| < 5e-4 for
            BERT), ``fp8`` and ``fp8norm`` (float8 GEMMs, Hopper; see docs/performance.md).
        max_graphs: shapes kept captured at once, per path (each holds its activations).

    Call it like the model: ``encoder(input_ids, attention_mask, token_type_ids)`` with
    ``(batch, seq)`` tensors on any device. A batch whose mask is all ones (or None) takes
    the fixed-shape path; any padding takes the packed path. ``last_path`` says which ran;
    ``plan`` is the resolved plan (``plan.describe()`` says what is on and why anything is off).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, device=None, plan="auto", max_graphs: int = 16):
        if not torch.cuda.is_available():
            raise RuntimeError("GPUEncoder needs a CUDA device; use ctxkit.inference.backends on CPU")
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        self.plan: FastPlan = resolve(plan, use="infer", device=self.device, precision=precision)
        self.model = model.to(self.device, dtype).eval()
        # q/k/v as one GEMM over cached stacked weights, concatenated now (outside any
        # compiled graph); the GELU forms and fp8 GEMMs the plan names (ctxkit.fast).
        apply(self.model, self.plan)
        prepare_inference(self.model)
        self.dtype = dtype
        self.cuda_graphs = self.plan.cuda_graphs
        self.max_graphs = max_graphs
        self.forward = self.forward_packed = self.model
        if self.plan.compile != "off":
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            # Static shapes: each fixed shape gets its own specialised graph (and a CUDA graph
            # of it); variable-length traffic takes the packed path below instead.
            self.forward = torch.compile(self.model, mode=self.plan.compile_mode or "default", dynamic=False)
            # One graph for every packed length (fuses the norms and activations that
            # dominate once the padding is gone); the first few batches compile.
            self.forward_packed = torch.compile(self.model, dynamic=True)
        self._graphs = GraphCache(max_graphs)
        # Packed graphs need the varlen kernel, which reads the sequence boundaries on the
        # GPU (fp16/bf16); fp32 attends per sequence with host lengths a graph would freeze.
        self.packed_graphs = self.cuda_graphs and dtype in (torch.float16, torch.bfloat16)  # off if a capture fails
        self._packed_graphs = GraphCache(max_graphs)
        self.last_path: Optional[str] = None

    @torch.inference_mode()
    def warm_up(self, batch: int = 32, seq: int = 64) -> None:
        """Compile and capture what serving needs first: a padded batch of ``batch`` rows up
        to ``seq`` tokens (the packed path, compiled once for every length) and one unpadded
        row (the fixed-shape path), so no client waits for it."""
        lengths = torch.linspace(2, seq, steps=max(batch, 2)).long()[:batch] if batch > 1 else torch.tensor([seq])
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = torch.full((mask.shape[0], seq), 100) * mask
        if batch > 1:
            self(ids, mask, token_type_ids=torch.zeros_like(ids))
        self(ids[-1:], None, token_type_ids=torch.zeros_like(ids[-1:]))
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def __call__(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None):
        """The model's output for one batch (same structure; tensors on the GPU, fresh copies).

        Args:
            input_ids: ``(batch, seq)``.
            attention_mask: ``(batch, seq)``, 1 on real tokens (right padding), or None.
            token_type_ids: ``(batch, seq)`` or None.
        """
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            if self.cuda_graphs and self.packed_graphs:
                out = self._replay_packed(input_ids, token_type_ids, attention_mask)
                if out is not None:
                    self.last_path = "packed graph"
                    return out
            self.last_path = "packed"
            to = dict(device=self.device, non_blocking=True)
            packed = PackedSequences(attention_mask).to(self.device)
            types = _pinned(token_type_ids).to(**to) if token_type_ids is not None else None
            # Compiled with dynamic shapes when compile is on: one graph for every length.
            return self.forward_packed(_pinned(input_ids).to(**to), packed, **_types(types))
        if not self.cuda_graphs:
            self.last_path = "eager"
            types = token_type_ids.to(self.device) if token_type_ids is not None else None
            return self.forward(input_ids.to(self.device), None, **_types(types))
        self.last_path = "graph"
        return self._replay(input_ids, token_type_ids)

    def _replay(self, input_ids: Tensor, token_type_ids: Optional[Tensor]):
        batch, seq = input_ids.shape
        typed = token_type_ids is not None
        # A smaller batch of a width already captured runs in the smallest captured graph
        # that holds it, its extra rows zeros that are computed and dropped (rows never
        # attend to each other): a partial last batch cost seconds of compiling and
        # capturing a graph of its own, for milliseconds of work.
        rows = min((k[0][0] for k in self._graphs if k[0][1] == seq and k[1] == typed and k[0][0] > batch), default=batch)
        if rows > batch:
            input_ids = torch.cat([input_ids, input_ids.new_zeros(rows - batch, seq)])
            if typed:
                token_type_ids = torch.cat([token_type_ids, token_type_ids.new_zeros(rows - batch, seq)])
        key = ((rows, seq), typed)
        graph, inputs, outputs = self._graphs.get_or_capture(key, lambda: self._capture(input_ids, token_type_ids))
        inputs["input_ids"].copy_(_pinned(input_ids), non_blocking=True)
        if typed:
            inputs["token_type_ids"].copy_(_pinned(token_type_ids), non_blocking=True)
        graph.replay()
        return _map_tensors(outputs, lambda t: self._cut(t, rows, seq, batch, seq))

    def _capture(self, input_ids: Tensor, token_type_ids: Optional[Tensor]):
        inputs = {"input_ids": input_ids.to(self.device).clone()}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids.to(self.device).clone()
        graph, outputs = self._record(lambda: self.forward(inputs["input_ids"], None, **_types(inputs.get("token_type_ids"))))
        return graph, inputs, outputs

    def _record(self, run):
        """Warm ``run`` up on a side stream, then capture it; returns ``(graph, outputs)``."""
        # cuBLAS workspaces, autotuning and compilation happen in the warm-up, not in the graph.
        return capture_graph(run, warmup=3, device=self.device)

    @staticmethod
    def _cut(t: Tensor, rows: int, width: int, batch: int, seq: int) -> Tensor:
        """A bucketed output back to the caller's batch: batch axis first, token axis second."""
        if t.dim() >= 1 and t.shape[0] == rows:
            t = t[:batch]
        if t.dim() >= 2 and t.shape[1] == width:
            t = t[:, :seq]
        return t.clone()

    def _replay_packed(self, input_ids: Tensor, token_type_ids: Optional[Tensor], attention_mask: Tensor):
        """The packed batch through a bucketed graph; None where a graph cannot serve it."""
        batch, seq = attention_mask.shape
        ids, types, mask = bucket_batch(input_ids, token_type_ids, attention_mask)
        packed = PackedSequences(mask)
        rows, width = mask.shape
        key = (rows, width, packed.total, types is not None)
        if key not in self._packed_graphs:
            try:
                entry = self._capture_packed(ids, types, packed, input_ids, token_type_ids, attention_mask)
            except RuntimeError as err:  # e.g. a model whose packed path synchronises: run it ungraphed
                logger.warning("packed batches of %s run without CUDA graphs: capture failed (%s)", type(self.model).__name__, err)
                self.packed_graphs = False
                return None
            self._packed_graphs.put(key, entry)
        entry = self._packed_graphs.get(key)
        if entry is None:  # outputs whose axes cannot be told apart: this shape runs ungraphed
            return None
        graph, static, outputs = entry
        static["input_ids"].copy_(_pinned(ids), non_blocking=True)
        if types is not None:
            static["token_type_ids"].copy_(_pinned(types), non_blocking=True)
        static["index"].copy_(_pinned(packed.index), non_blocking=True)
        static["cu_seqlens"].copy_(_pinned(packed.cu_seqlens), non_blocking=True)
        graph.replay()
        return _map_tensors(outputs, lambda t: self._cut(t, rows, width, batch, seq))

    def _capture_packed(self, ids, types, packed: PackedSequences, input_ids, token_type_ids, attention_mask):
        rows, width = ids.shape
        static = {"input_ids": ids.to(self.device), "index": packed.index.to(self.device),
                  "cu_seqlens": packed.cu_seqlens.to(self.device)}
        if types is not None:
            static["token_type_ids"] = types.to(self.device)
        graphed = object.__new__(PackedSequences)
        # The width bounds every length, so one graph serves any batch of this bucket.
        graphed.__dict__.update(packed.__dict__, index=static["index"], cu_seqlens=static["cu_seqlens"], max_len=width)
        # The axes test: the outputs, cut back, must have the shapes of the plain packed call.
        to = dict(device=self.device)
        plain = self.forward_packed(input_ids.to(**to), PackedSequences(attention_mask).to(self.device),
                                    **_types(token_type_ids.to(**to) if token_type_ids is not None else None))
        graph, outputs = self._record(lambda: self.forward_packed(static["input_ids"], graphed, **_types(static.get("token_type_ids"))))
        batch, seq = attention_mask.shape
        got, want = [], []
        _map_tensors(outputs, lambda t: got.append(tuple(self._cut(t, rows, width, batch, seq).shape)))
        _map_tensors(plain, lambda t: want.append(tuple(t.shape)))
        return (graph, static, outputs) if got == want else None


class GPUTaskModel(nn.Module):
    """A task model behind a :class:`GPUEncoder`, with the task model's interface
    (``model(input_ids=..., token_type_ids=..., attention_mask=...)`` -> dict), so
    ``predict``, ``evaluate`` and ``serve`` use it unchanged (``--backend gpu``).

    Args: as :class:`GPUEncoder`.
    """

    # predict() hands it host tensors: it copies them from pinned memory into its graphs itself.
    takes_host_inputs = True

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, **options):
        super().__init__()
        self.runner = GPUEncoder(model, dtype=dtype, **options)
        self.model = self.runner.model  # registered, so .parameters() and .device work as usual

    def warm_up(self, batch: int = 32, seq: int = 64) -> None:
        """See :meth:`GPUEncoder.warm_up`."""
        self.runner.warm_up(batch, seq)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None, **_):
        """The task model's output dict (tensors on the GPU; floating outputs in fp32)."""
        out = self.runner(input_ids, attention_mask, token_type_ids=token_type_ids)
        return _map_tensors(out, lambda t: t.float() if t.is_floating_point() else t)
