"""Autoregressive decoding with a KV cache: greedy, sampling and beam search.

Works with any model that maps ``(input_ids, cache=, attention_mask=, position_ids=)`` to
logits ``(batch, seq, vocab)`` (transformers' GPT-2 argument names) and has ``new_cache(batch, max_len)`` (e.g.
:class:`ctxkit.models.gpt2.model.GPT2LMHeadModel`). Prompts of different lengths are batched
with *left* padding, so every row's next token sits in the last column; the position
ids count real tokens only, so padding never shifts a row's positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .cpu_gemv import cpu_decoding_context
from .sampling import apply_repetition_penalty, filter_logits, next_tokens
from .static_decode import static_decoding_unsupported, static_generate
from ..core.errors import UserError
from ..fast import fuse_qkv, resolve, varying_shape_attention

__all__ = ["GenerationConfig", "generate", "filter_logits", "apply_repetition_penalty", "left_pad"]


@dataclass
class GenerationConfig:
    """How to pick tokens.

    Attributes:
        max_new_tokens: tokens to generate at most per sequence.
        do_sample: sample from the (filtered) distribution instead of taking the argmax.
        temperature: divides the logits before sampling (< 1 sharper, > 1 flatter).
        top_k: keep only the k most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches p
            (nucleus sampling; 1.0: all).
        repetition_penalty: > 1 discourages tokens already in the sequence (CTRL: divide
            positive logits, multiply negative ones).
        num_beams: beam search with this many beams when > 1 (deterministic).
        length_penalty: beam hypotheses are ranked by ``sum log p / length ** length_penalty``.
        early_stopping: beam search stops for a sequence once ``num_beams`` hypotheses
            have ended.
        eos_token_id: ends a sequence (None: only ``max_new_tokens`` ends it).
        pad_token_id: fills finished rows and left padding.
        stop_sequences: token-id sequences that end a sequence when generated (kept in
            the output).
    """

    max_new_tokens: int = 32
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = True
    eos_token_id: Optional[int] = None
    pad_token_id: int = 0
    stop_sequences: Sequence[Sequence[int]] = field(default_factory=tuple)

    def check(self) -> None:
        """Raise ValueError for settings that cannot work together."""
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise UserError(f"temperature must be > 0 (use do_sample=False for greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.num_beams < 1 or self.repetition_penalty <= 0:
            raise UserError("top_k must be >= 0, num_beams >= 1 and repetition_penalty > 0")
        if self.num_beams > 1 and self.do_sample:
            raise UserError("beam search is deterministic here: use num_beams=1 with do_sample=True")


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int = 0) -> Tuple[Tensor, Tensor]:
    """Batch token-id lists with left padding; returns ``(input_ids, attention_mask)``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token (e.g. the BOS / end-of-text token)")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids, mask


def _real_tokens(tokens: Tensor, mask: Tensor) -> Tensor:
    """``tokens`` with left padding replaced by each row's last token, so a repetition
    penalty counts only tokens that are really there (the last one always is)."""
    return torch.where(mask.bool(), tokens, tokens[:, -1:])


def _ends_with(tokens: Tensor, stops: Sequence[Sequence[int]]) -> Tensor:
    """Rows of ``tokens (batch, n)`` that end with one of ``stops``."""
    hit = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
    for stop in stops:
        if 0 < len(stop) <= tokens.size(1):
            hit |= (tokens[:, -len(stop):] == torch.tensor(list(stop), device=tokens.device)).all(dim=1)
    return hit


@torch.inference_mode()
def generate(model, input_ids: Tensor, attention_mask: Optional[Tensor] = None, config: GenerationConfig = GenerationConfig(),
             generator: Optional[torch.Generator] = None, on_tokens: Optional[Callable[[Tensor], None]] = None,
             static: Optional[bool] = None, cpu_gemv: Optional[bool] = None, plan="auto") -> Tensor:
    """Continue left-padded prompts.

    Args:
        model: see the module docstring; put it in eval mode first.
        input_ids: ``(batch, prompt)`` token ids, left-padded.
        attention_mask: ``(batch, prompt)``, 0 on the left padding (None: no padding).
        config: decoding settings.
        generator: RNG for sampling (seed it for reproducible samples).
        on_tokens: called with each step's new tokens ``(batch,)`` as soon as they are
            chosen (streaming; greedy and sampling only). It may return a bool tensor
            ``(batch,)`` marking rows to end now (e.g. a stop string seen in the text).
        static: decode over a static KV cache with fixed shapes
            (:mod:`ctxkit.decoding.static_decode`; with the plan's ``graphs`` the step is
            replayed from a CUDA graph, many times faster on a GPU). None: when the plan
            has ``graphs`` (on CUDA) or ``compile`` and the settings allow it (not beam
            search or stop sequences); True: insist (on CPU it runs the same fixed-shape
            step eagerly); False: the plain loop.
        cpu_gemv: route the one-token matrix-vector products of fp32 CPU decoding through
            NumPy's BLAS (:mod:`ctxkit.decoding.cpu_gemv`; same fp32 arithmetic, about
            twice the speed where MKL is slow). None: for batches of one or two rows.
        plan: how fast it runs (:class:`~ctxkit.fast.FastPlan` or its string; resolved
            for ``decode`` on the input's device; default ``auto``: on a GPU CUDA graphs,
            the compiled step, q/k/v as one GEMM, and for one row the Triton decoding layers
            and one-row products). ``compile`` compiles the static path's step (the first
            call per shape compiles: seconds on a GPU, about a minute on a CPU); ``reference``
            decodes with the plain modules.

    Returns:
        ``(batch, prompt + generated)``: the prompts followed by the new tokens; rows that
        finished early are filled with ``pad_token_id``.
    """
    config.check()
    plan = resolve(plan, use="decode", device=input_ids.device)
    module = model if isinstance(model, torch.nn.Module) else getattr(model, "model", None)  # decoding views hold one
    if isinstance(module, torch.nn.Module) and plan.fused_qkv:
        fuse_qkv(module)  # q/k/v in one GEMM over weights concatenated once per weight version (ctxkit.fast)
    if static is None:
        wanted = (input_ids.is_cuda and plan.cuda_graphs) or plan.compile != "off"
        static = wanted and static_decoding_unsupported(model, config, generator) is None
    if static:
        return static_generate(model, input_ids, attention_mask, config, generator, on_tokens, plan=plan)
    with cpu_decoding_context(input_ids, model, input_ids.size(0) * config.num_beams, enabled=cpu_gemv):
        if config.num_beams > 1:
            return _beam_search(model, input_ids, attention_mask, config)
        return _sample_loop(model, input_ids, attention_mask, config, generator, on_tokens)


def _sample_loop(model, input_ids: Tensor, attention_mask: Optional[Tensor], config: GenerationConfig,
                 generator: Optional[torch.Generator], on_tokens) -> Tensor:
    """Greedy decoding or sampling, one forward pass per token (see :func:`generate`)."""
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    # Without padding the model needs no key mask: the prompt pass is plainly causal and a
    # single new query may see every cached key, so each step skips building masks.
    padded = not bool(mask.all())
    cache = model.new_cache(batch, prompt_len + config.max_new_tokens)
    with varying_shape_attention(device):  # a prompt's length is a new shape (no per-shape attention plans)
        logits = model(input_ids, cache=cache, attention_mask=mask if padded else None, position_ids=positions)[:, -1].float()
    next_position = positions[:, -1:] + 1
    tokens = input_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in range(config.max_new_tokens):
        seen = _real_tokens(tokens, mask) if config.repetition_penalty != 1.0 else tokens
        new = next_tokens(logits, seen, config, generator)
        new = torch.where(finished, torch.full_like(new, config.pad_token_id), new)
        tokens = torch.cat([tokens, new[:, None]], dim=1)
        if on_tokens is not None:
            stop = on_tokens(new)
            if stop is not None:
                finished |= stop.to(device)
        if config.eos_token_id is not None:
            finished |= new == config.eos_token_id
        if config.stop_sequences:
            finished |= _ends_with(tokens[:, prompt_len:], config.stop_sequences)
        if bool(finished.all()) or step == config.max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(new[:, None])], dim=1)
        logits = model(new[:, None], cache=cache, attention_mask=mask if padded else None, position_ids=next_position)[:, -1].float()
        next_position = next_position + 1
    return tokens


def _beam_search(model, input_ids: Tensor, attention_mask: Optional[Tensor], config: GenerationConfig) -> Tensor:
    """Beam search: keep the ``num_beams`` best partial sequences per prompt; a beam that
    emits EOS becomes a finished hypothesis ranked with the length penalty."""
    batch, prompt_len = input_ids.shape
    beams, device = config.num_beams, input_ids.device
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    ids = input_ids.repeat_interleave(beams, dim=0)
    mask = mask.repeat_interleave(beams, dim=0)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model.new_cache(batch * beams, prompt_len + config.max_new_tokens)
    with varying_shape_attention(device):
        logits = model(ids, cache=cache, attention_mask=mask, position_ids=positions)[:, -1].float()
    next_position = positions[:, -1:] + 1
    scores = torch.zeros(batch, beams, device=device)
    scores[:, 1:] = float("-inf")  # all beams start equal: expand the first one only
    finished: List[List[Tuple[float, Tensor]]] = [[] for _ in range(batch)]
    done = [False] * batch
    for step in range(config.max_new_tokens):
        logp = apply_repetition_penalty(logits, _real_tokens(ids, mask), config.repetition_penalty).log_softmax(-1)
        vocab = logp.size(-1)
        candidates = (scores.view(-1, 1) + logp).view(batch, beams * vocab)
        top_scores, top_index = candidates.topk(2 * beams, dim=1)
        next_scores = torch.full((batch, beams), float("-inf"), device=device)
        next_origin = torch.zeros(batch, beams, dtype=torch.long, device=device)
        next_token = torch.full((batch, beams), config.pad_token_id, dtype=torch.long, device=device)
        for b in range(batch):
            kept = 0
            for score, index in zip(top_scores[b].tolist(), top_index[b].tolist()):
                origin, token = divmod(index, vocab)
                if done[b] or score == float("-inf"):
                    break
                if config.eos_token_id is not None and token == config.eos_token_id:
                    length = step + 1
                    seq = torch.cat([ids[b * beams + origin, prompt_len:], torch.tensor([token], device=device)])
                    finished[b].append((score / length ** config.length_penalty, seq))
                    continue
                next_scores[b, kept], next_origin[b, kept], next_token[b, kept] = score, origin, token
                kept += 1
                if kept == beams:
                    break
            if not done[b] and len(finished[b]) >= beams:
                best_open = next_scores[b].max().item() / (step + 1) ** config.length_penalty
                worst_kept = sorted(s for s, _ in finished[b])[-beams]
                done[b] = config.early_stopping or best_open <= worst_kept
        rows = (torch.arange(batch, device=device)[:, None] * beams + next_origin).view(-1)
        ids = torch.cat([ids.index_select(0, rows), next_token.view(-1, 1)], dim=1)
        mask = torch.cat([mask.index_select(0, rows), torch.ones_like(next_token.view(-1, 1))], dim=1)
        next_position = next_position.index_select(0, rows)
        cache.reorder(rows)
        scores = next_scores
        if all(done) or step == config.max_new_tokens - 1:
            break
        logits = model(next_token.view(-1, 1), cache=cache, attention_mask=mask, position_ids=next_position)[:, -1].float()
        next_position = next_position + 1
    out = []
    for b in range(batch):
        hyps = list(finished[b])
        for k in range(beams):  # unfinished beams compete too
            if scores[b, k] > float("-inf"):
                hyps.append((scores[b, k].item() / (ids.size(1) - prompt_len) ** config.length_penalty, ids[b * beams + k, prompt_len:]))
        best = max(hyps, key=lambda h: h[0])[1]
        out.append(best)
    width = max(len(s) for s in out)
    new = torch.full((batch, width), config.pad_token_id, dtype=torch.long, device=device)
    for b, seq in enumerate(out):
        new[b, : len(seq)] = seq
    return torch.cat([input_ids, new], dim=1)
