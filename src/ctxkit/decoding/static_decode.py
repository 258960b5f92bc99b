"""Fast token-by-token decoding: fixed shapes, one step captured in a CUDA graph.

Decoding a small model one token at a time is bound by kernel *launches*, not by the
GPU's arithmetic or memory: GPT-2 small launches ~200 kernels per token, and the Python
that issues them costs more than the kernels. So this path:

1. keeps every shape fixed: the KV cache is in static mode (a device-side write index;
   attention reads all ``max_len`` slots under a key mask), the new token, its position,
   the "finished" flags and the output buffer are preallocated tensors;
2. does the whole step on the device: model forward, token choice (greedy, or sampling
   with temperature / top-k / top-p / repetition penalty), EOS bookkeeping, writing the
   token into the output, advancing the indices;
3. records that step once in a CUDA graph and replays it per token, with no host
   synchronisation unless EOS can end the batch early (checked every 16 tokens) or a
   streaming callback wants each token.

The prompt pass is captured too, once per prompt length (eager on CPU). The captured graph, its buffers and
its KV cache are kept on the model for the next call of the same shape, like a compiled
kernel. On CPU (``capture=False``) the same fixed-shape step runs eagerly: that is how the
tests check it against the ordinary loop.

Sampling here draws with the exponential race (argmax of ``p / E``, ``E ~ Exp(1)``), which
picks token i with probability p_i like ``torch.multinomial`` but with a fixed-shape,
capturable kernel; seeded runs are reproducible, though not the same draws as the
eager loop's.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
from torch import Tensor

from .sampling import apply_repetition_penalty, filter_logits
from ..core.errors import UserError
from ..core.capabilities import StaticCacheDecoder, declares
from ..fast import (GraphCache, capture_graph, fuse_decode_layers, fuse_qkv, one_row_linears, resolve, unfuse_decode_layers,
                    varying_shape_attention)

__all__ = ["StaticDecoder", "chunked_argmax", "static_decoding_unsupported", "static_generate"]

CPU_COMPILE_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
_CHECK_EVERY = 16
_SLOT_MULTIPLE = 64  # replays between host checks for "every row finished" (EOS only)


def static_decoding_unsupported(model, config, generator: Optional[torch.Generator] = None) -> Optional[str]:
    """Why ``model``/``config`` cannot use the static path (None when they can)."""
    if not declares(model, StaticCacheDecoder):
        return f"{type(model).__name__} has no static-cache step"
    if config.num_beams > 1:
        return "beam search reorders the cache"
    if config.stop_sequences:
        return "stop sequences are checked on the host"
    if generator is not None and generator.device.type == "cuda" and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        return "this torch cannot capture a custom CUDA generator (use the default one)"
    return None


def chunked_argmax(logits: Tensor, chunk: int = 1024) -> Tensor:
    """``logits.argmax(-1)`` for ``(batch, vocab)`` in two stages (per chunk, then over the
    chunks): one block reducing 50k logits alone takes ~14 us on an H100, the two stages
    spread the work over many blocks. Ties resolve to the first index, as ``argmax``."""
    batch, vocab = logits.shape
    chunks = -(-vocab // chunk)
    padded = torch.nn.functional.pad(logits, (0, chunks * chunk - vocab), value=float("-inf"))
    best, where = padded.view(batch, chunks, chunk).max(-1)
    pick = best.argmax(-1, keepdim=True)
    return (pick * chunk + where.gather(1, pick)).squeeze(1)


class StaticDecoder:
    """Buffers, static KV cache and (on CUDA) the captured step for one decoding shape.

    Args:
        model: a causal LM with ``new_cache`` and a static-cache step
            (``supports_static_cache``), in eval mode.
        batch, slots, config: rows, KV-cache slots (prompt + new tokens; any prompt up to
            ``slots - max_new_tokens`` fits) and the decoding settings it serves.
        device: where the model lives.
        capture: record the step in a CUDA graph (CUDA only).
        compile_step: run the step (forward, token choice, bookkeeping) through
            ``torch.compile`` (fuses the elementwise work between GEMMs; the first call
            compiles); a string picks the Inductor mode on CUDA, e.g.
            ``"max-autotune-no-cudagraphs"``. On CPU it uses :data:`CPU_COMPILE_OPTIONS`.
        generator: RNG for sampling (None: the default generator of ``device``).
        fused_layers: run each pre-norm layer's step as five Triton kernels
            (:func:`~ctxkit.fast.fuse_decode_layers`). None: on CUDA for one row, when
            Triton is installed.
        one_row: with a compiled step on CUDA for one row, compute the one-row products as
            fused reductions (:func:`~ctxkit.fast.one_row_linears`; plan option ``rows``).
    """

    def __init__(self, model, batch: int, slots: int, config, device: torch.device, capture: bool,
                 compile_step=False, generator: Optional[torch.Generator] = None, fused_layers: Optional[bool] = None,
                 one_row: bool = True):
        self.model, self.config, self.generator = model, config, generator
        self.batch, self.slots, self.max_new = batch, slots, config.max_new_tokens
        total = slots
        self.cache = model.new_cache(batch, total)
        if self.cache.max_len < total:
            raise UserError(f"prompt + max_new_tokens ({slots}) exceeds the model's "
                             f"context length ({self.cache.max_len})")
        long = dict(dtype=torch.long, device=device)
        self.write_index = torch.zeros(1, **long)  # next cache slot
        self.key_mask = torch.zeros(batch, total, **long)  # filled (and real) cache slots
        self.token = torch.zeros(batch, 1, **long)  # the token the next step feeds in
        self.position = torch.zeros(batch, 1, **long)
        self.out = torch.full((batch, config.max_new_tokens), config.pad_token_id, **long)
        self.out_index = torch.zeros(1, **long)  # column of out the next step writes
        self.count = torch.ones(1, **long)  # generated columns that count (see step)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.seen = torch.zeros(batch, total, **long)  # tokens so far, for the repetition penalty
        self.step = self._step
        if fused_layers is None:
            fused_layers = device.type == "cuda" and batch == 1
        # Layers Triton cannot serve (or no Triton) keep the plain step: fused_layers counts them.
        self.fused_layers = fuse_decode_layers(model) if fused_layers else 0
        if not fused_layers:
            unfuse_decode_layers(model)  # an earlier batch-1 decoder may have fused them
        if compile_step:
            # One eager forward first: fills the attention layers' fused-weight caches, which
            # the compiled graph then reads as constants (no version checks, no graph breaks).
            self.cache.set_static(self.write_index)
            self._forward(self.token, self.key_mask, self.position)
            self.cache.set_static(None)
            if device.type == "cpu":
                # Frozen weights let Inductor pre-pack them, and its C++ GEMM templates
                # (max-autotune) beat MKL's matrix-vector product ~2x here; compiling
                # takes about a minute for GPT-2 small, once per shape.
                compiled = torch.compile(self._step, dynamic=False)

                def step() -> None:
                    # As a config patch: passed as torch.compile(options=...) they were not applied.
                    with torch._inductor.config.patch(CPU_COMPILE_OPTIONS):
                        compiled()

                self.step = step
            else:
                if batch == 1 and one_row:
                    # One row per matrix: a fused reduction kernel per matrix beats cuBLAS's
                    # GEMM kernels (ctxkit.fast.rows; eager calls are unchanged).
                    one_row_linears(model)
                mode = compile_step if isinstance(compile_step, str) else None
                self.step = torch.compile(self._step, dynamic=False, mode=mode)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self._prefills = GraphCache(8)  # prompt length, padded -> captured prompt pass
        if capture:
            self._capture()

    def _forward(self, token: Tensor, key_mask: Tensor, position: Tensor) -> Tensor:
        return self.model(token, self.cache, key_mask, position_ids=position)[:, -1].float()

    def choose(self, logits: Tensor, seen: Tensor) -> Tensor:
        """Next tokens ``(batch,)`` from ``logits (batch, vocab)``; ``seen (batch, n)`` feeds
        the repetition penalty. Fixed shapes and no host syncs (graph-safe)."""
        c = self.config
        logits = apply_repetition_penalty(logits, seen, c.repetition_penalty)
        if not c.do_sample:
            return chunked_argmax(logits)
        probs = filter_logits(logits / c.temperature, c.top_k, c.top_p).softmax(-1)
        race = torch.empty_like(probs).exponential_(generator=self.generator)
        return (probs / race).argmax(-1)

    def _step(self) -> None:
        """Feed ``token``, choose the next one, record it: all on the device."""
        c = self.config
        self.key_mask.index_fill_(1, self.write_index, 1)  # the new token's own slot
        logits = self._forward(self.token, self.key_mask, self.position)  # writes the cache, advances write_index
        new = self.choose(logits, self.seen)
        # A step counts while some row is still going (the eager loop would run it).
        self.count.add_((~self.finished.all()).long())
        new = torch.where(self.finished, torch.full_like(new, c.pad_token_id), new)
        if c.eos_token_id is not None:
            self.finished |= new == c.eos_token_id
        self.out.index_copy_(1, self.out_index, new[:, None])
        self.seen.index_copy_(1, self.write_index, new[:, None])
        self.out_index.add_(1)
        self.position.add_(1)
        self.token.copy_(new[:, None])

    def _prefill(self, input_ids: Tensor, mask: Optional[Tensor], positions: Tensor) -> Tensor:
        """Run the prompt into the (non-static) cache; last-position logits ``(batch, vocab)``.
        With CUDA graphs the prompt pass is captured too, once per prompt length: eagerly
        it costs ~5 ms of launches for GPT-2 small, 3-4 % of a 256-token answer."""
        self.cache.length = 0
        if self.graph is None:
            with varying_shape_attention(input_ids.device):  # each prompt length a new shape: no per-shape attention plans
                return self.model(input_ids, cache=self.cache, attention_mask=mask, position_ids=positions)[:, -1].float()
        key = (input_ids.size(1), mask is not None)
        entry = self._prefills.get(key)
        if entry is None:
            inputs = [input_ids.clone(), mask.clone() if mask is not None else None, positions.clone()]

            def run() -> Tensor:
                self.cache.length = 0
                with varying_shape_attention(inputs[0].device):
                    return self.model(inputs[0], cache=self.cache, attention_mask=inputs[1], position_ids=inputs[2])[:, -1].float()

            graph, logits = capture_graph(run, warmup=1)
            entry = self._prefills.put(key, (graph, inputs, logits))
        graph, inputs, logits = entry
        for buf, value in zip(inputs, (input_ids, mask, positions)):
            if buf is not None:
                buf.copy_(value)
        graph.replay()
        self.cache.length = input_ids.size(1)
        return logits

    def _capture(self) -> None:
        # Indices must be in range while warming up; start() resets everything after.
        self.write_index.zero_()
        self.cache.set_static(self.write_index)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # allocations, cuBLAS handles and (if compiled) compilation happen here
                self.out_index.zero_()
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.out_index.zero_()
        self.graph, _ = capture_graph(self.step, warmup=0, generator=self.generator)

    def run(self, input_ids: Tensor, mask: Tensor, on_tokens: Optional[Callable[[Tensor], Optional[Tensor]]] = None) -> Tensor:
        """Decode after the prompt ``input_ids`` (left-padded, ``mask`` 0 on padding);
        returns the new tokens ``(batch, n)`` exactly as the eager loop would."""
        c, cache = self.config, self.cache
        prompt_len = input_ids.size(1)
        if prompt_len + self.max_new > self.slots:
            raise UserError(f"a {prompt_len}-token prompt + {self.max_new} new tokens exceed this decoder's {self.slots} slots")
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        padded = not bool(mask.all())
        cache.set_static(None)
        logits = self._prefill(input_ids, mask if padded else None, positions)
        self.seen.copy_(input_ids[:, -1:].expand_as(self.seen))  # unfilled slots repeat a real token: harmless
        self.seen[:, :prompt_len] = torch.where(mask.bool(), input_ids, input_ids[:, -1:])
        first = self.choose(logits, self.seen)
        self.finished.zero_()
        self.out.fill_(c.pad_token_id)
        self.out[:, 0] = first
        self.count.fill_(1)
        if c.eos_token_id is not None:
            self.finished |= first == c.eos_token_id
        self.key_mask.zero_()
        self.key_mask[:, :prompt_len] = mask
        self.token.copy_(first[:, None])
        self.position.copy_(positions[:, -1:] + 1)
        self.write_index.fill_(prompt_len)
        self.seen[:, prompt_len] = first
        self.out_index.fill_(1)
        cache.set_static(self.write_index)
        try:
            if on_tokens is not None:
                stop = on_tokens(first)
                if stop is not None:
                    self.finished |= stop.to(self.finished.device)
            for i in range(1, self.max_new):
                if on_tokens is not None or (c.eos_token_id is not None and i % _CHECK_EVERY == 0):
                    if bool(self.finished.all()):
                        break
                self.graph.replay() if self.graph is not None else self.step()
                if on_tokens is not None:
                    stop = on_tokens(self.out[:, i])
                    if stop is not None:
                        self.finished |= stop.to(self.finished.device)
        finally:
            cache.set_static(None)
        return self.out[:, : int(self.count.item())].clone()


@torch.inference_mode()
def static_generate(model, input_ids: Tensor, attention_mask: Optional[Tensor], config, generator: Optional[torch.Generator] = None,
                    on_tokens: Optional[Callable[[Tensor], Optional[Tensor]]] = None, capture: Optional[bool] = None,
                    plan="auto") -> Tensor:
    """:func:`~ctxkit.decoding.generate` through a (cached) :class:`StaticDecoder`.

    Args:
        capture: record a CUDA graph (default: the plan's ``graphs``, on CUDA).
        plan: how fast it runs (:class:`~ctxkit.fast.FastPlan` or its string, resolved for
            ``decode``): ``graphs`` captures the step, ``compile`` (``autotune``: its mode)
            compiles it, ``decodelayers`` runs one row's layers as Triton kernels, ``rows``
            its products as reductions, ``qkv`` fuses the projections.

    Returns:
        ``(batch, prompt + generated)``, the same tokens as the eager loop for greedy decoding.
    """
    reason = static_decoding_unsupported(model, config, generator)
    if reason is not None:
        raise UserError(f"static decoding unavailable: {reason}")
    device = input_ids.device
    plan = resolve(plan, use="decode", device=device)
    if plan.fused_qkv:
        fuse_qkv(model)  # q/k/v in one GEMM over weights concatenated once (ctxkit.fast), in place
    capture = device.type == "cuda" and plan.cuda_graphs if capture is None else capture
    compile_step = (plan.compile_mode or True) if plan.compile != "off" else False
    fused_layers = plan.decode_layers and input_ids.size(0) == 1  # one row (CUDA, or Triton's interpreter)
    if capture and device.type != "cuda":
        raise UserError("CUDA graphs need a CUDA device")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    param = next(model.parameters())
    # Slots rounded up to a multiple of 64: prompts of similar length share one decoder
    # (one graph, one compilation); masked slots cost a little attention, not exactness.
    slots = input_ids.size(1) + config.max_new_tokens
    slots = min(-(-slots // _SLOT_MULTIPLE) * _SLOT_MULTIPLE, max(slots, getattr(model.config, "max_position", slots)))
    # Parameter versions: an in-place weight update invalidates cached fused weights.
    key = (input_ids.size(0), slots, repr(config), device, param.dtype, param.data_ptr(), capture, str(plan), id(generator),
           sum(p._version for p in model.parameters()))
    decoders: Dict = model.__dict__.setdefault("_ctxkit_static_decoders", {})
    decoder = decoders.get(key)
    if decoder is None:
        while len(decoders) >= 4:  # each holds a KV cache: keep a few shapes only
            decoders.pop(next(iter(decoders)))
        decoder = StaticDecoder(model, input_ids.size(0), slots, config, device, capture, compile_step, generator, fused_layers,
                                one_row=plan.one_row)
        decoders[key] = decoder
    return torch.cat([input_ids, decoder.run(input_ids, mask, on_tokens)], dim=1)
