"""Dynamic masking for BERT's masked-LM objective, drawn afresh for every batch.

Masking at batch time (RoBERTa's "dynamic masking") means an example is seen with a new
mask each epoch instead of the handful of fixed copies of BERT's TFRecords. The recipe is
otherwise BERT's: per sequence, ``min(max_predictions, max(1, round(n * mask_prob)))`` of
its ``n`` candidate tokens (everything but [CLS], [SEP], [PAD], ...) are chosen uniformly;
of those, 80% become [MASK], 10% a random non-special token, 10% stay as they are.

Everything is vectorised over ``(batch, seq)``: each candidate gets a uniform score and
the ``k`` highest scores of a row win, so no Python code runs per token or per row.

Besides full-length ``labels`` the result carries ``masked_positions`` / ``masked_labels``
so that :class:`ctxkit.models.BertForPreTraining` can project only the chosen positions to
the vocabulary (``model(..., masked_positions=batch["masked_positions"])``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from ..data.batching import balanced_batches, collate
from ..core.errors import UserError

__all__ = [
    "IGNORE_INDEX",
    "MLMCollator",
    "MaskedBatch",
    "MaskingConfig",
    "MaskingIds",
    "continuation_table",
    "mask_tokens",
    "packed_mask_slots",
    "word_start_mask",
    "word_starts_from_tokens",
]

IGNORE_INDEX = -100  # cross-entropy's default ignore_index


@dataclass(frozen=True)
class MaskingConfig:
    """How many tokens to mask and what to put in their place.

    Attributes:
        mask_prob: fraction of a sequence's candidate tokens to predict.
        replace_mask: of the chosen tokens, the share replaced by [MASK].
        replace_random: the share replaced by a random non-special token; the rest
            (``1 - replace_mask - replace_random``) is left unchanged.
        whole_word: choose whole words (a token plus its ``##`` continuations).
        max_predictions: cap on chosen tokens per sequence (BERT: 20 at length 128);
            ``None`` for no cap. When set it is also the width of ``masked_positions``,
            which keeps the MLM head's shape fixed from batch to batch.
    """

    mask_prob: float = 0.15
    replace_mask: float = 0.8
    replace_random: float = 0.1
    whole_word: bool = False
    max_predictions: Optional[int] = None

    def __post_init__(self):
        if not 0.0 <= self.mask_prob <= 1.0:
            raise UserError(f"mask_prob must be in [0, 1], got {self.mask_prob}")
        if self.replace_mask < 0 or self.replace_random < 0 or self.replace_mask + self.replace_random > 1 + 1e-9:
            raise UserError(f"replace_mask ({self.replace_mask}) and replace_random ({self.replace_random}) "
                             "must be >= 0 and sum to at most 1")
        if self.max_predictions is not None and self.max_predictions < 1:
            raise UserError(f"max_predictions must be >= 1 or None, got {self.max_predictions}")


@dataclass
class MaskedBatch:
    """Result of :func:`mask_tokens`.

    Attributes:
        input_ids: ``(batch, seq)`` the masked copy of the input.
        labels: ``(batch, seq)`` original id at chosen positions, -100 elsewhere.
        masked_positions: ``(batch, max_masked)`` chosen positions in ascending order,
            padded with 0 (any valid index works: its label is -100).
        masked_labels: ``(batch, max_masked)`` original ids there, -100 in the padding.
        num_masked: ``(batch,)`` how many positions each row chose.
    """

    input_ids: Tensor
    labels: Tensor
    masked_positions: Tensor
    masked_labels: Tensor
    num_masked: Tensor


@dataclass(frozen=True, eq=False)  # eq would compare the tensor field elementwise
class MaskingIds:
    """The vocabulary facts masking needs, for callers without a tokenizer object.

    Attributes:
        vocab_size: number of token ids.
        mask_id: id of [MASK].
        special_ids: ids never chosen and never drawn as random replacements
            (typically [PAD], [CLS], [SEP], [MASK]).
        pad_id: id used to pad ``input_ids`` in :class:`MLMCollator`.
        continuation: optional ``(vocab,)`` bool table, True for ``##`` tokens; needed
            for whole-word masking.
    """

    vocab_size: int
    mask_id: int
    special_ids: frozenset
    pad_id: int = 0
    continuation: Optional[Tensor] = None

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "MaskingIds":
        """Read ids from a :class:`ctxkit.tokenizers.WordPieceTokenizer`.

        [UNK] stays a candidate, as in BERT: it is an ordinary token of the corpus.
        """
        special = frozenset({tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id})
        return cls(tokenizer.vocab_size, tokenizer.mask_id, special, tokenizer.pad_id, continuation_table(tokenizer))


def continuation_table(vocab_or_tokenizer: Union[Mapping[str, int], object]) -> Tensor:
    """Bool lookup table over the vocabulary: True where the token starts with ``##``.

    Args:
        vocab_or_tokenizer: a token -> id mapping or anything with ``get_vocab()``.

    Returns:
        ``(vocab,)`` BoolTensor, indexed by token id.
    """
    vocab = vocab_or_tokenizer.get_vocab() if hasattr(vocab_or_tokenizer, "get_vocab") else vocab_or_tokenizer
    table = torch.zeros(max(vocab.values()) + 1, dtype=torch.bool)
    ids = [i for tok, i in vocab.items() if tok.startswith("##")]
    table[torch.tensor(ids, dtype=torch.long)] = True
    return table


def word_start_mask(input_ids: Tensor, continuation_ids: Tensor) -> Tensor:
    """Mark the tokens that begin a word, by table lookup.

    Args:
        input_ids: ``(batch, seq)`` token ids.
        continuation_ids: ``(vocab,)`` bool, True for ``##`` tokens (:func:`continuation_table`).

    Returns:
        ``(batch, seq)`` BoolTensor, True where the token does not start with ``##``.
    """
    return ~continuation_ids.to(input_ids.device)[input_ids]


def word_starts_from_tokens(tokens: Sequence) -> Tensor:
    """Word starts from token strings: a token begins a word unless it starts with ``##``.

    Args:
        tokens: one list of token strings, or a list of equally long lists.

    Returns:
        ``(seq,)`` or ``(batch, seq)`` BoolTensor.
    """
    if tokens and not isinstance(tokens[0], str):
        return torch.stack([word_starts_from_tokens(row) for row in tokens])
    return torch.tensor([not t.startswith("##") for t in tokens], dtype=torch.bool)


def _rand(shape, generator: Optional[torch.Generator], device) -> Tensor:
    # Draw on the generator's device so a CPU generator can drive CUDA tensors (and vice
    # versa); the stream of numbers then depends only on the generator, not the data's device.
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def _num_to_predict(n: Tensor, config: MaskingConfig) -> Tensor:
    """BERT's count per row: ``min(cap, max(1, round(n * p)))``, and never more than ``n``.

    ``torch.round`` rounds halves to even, like Python 3's ``round``.
    """
    k = torch.round(n.double() * config.mask_prob).long().clamp(min=1)
    if config.max_predictions is not None:
        k = k.clamp(max=config.max_predictions)
    return torch.minimum(k, n)


def packed_mask_slots(lengths: Sequence[int], batch_size: int, config: MaskingConfig, multiple_of: int = 64) -> int:
    """The masked-token slots a packed batch of :func:`~ctxkit.data.batching.balanced_batches`
    needs (``MLMCollator(pack_masked=...)``): the most any batch can mask, rounded up.

    A sequence of ``n`` tokens has at most ``n - 2`` candidates ([CLS] and [SEP] never are),
    and the count masked grows with the candidates, so each sequence's bound follows from its
    length alone; the batches' composition by length is the same every epoch, so one bound
    serves the whole run. (Whole-word masking may pass its target by part of a word: its
    bound is the cap, or the length.) The padded batch's ``batch_size * max_predictions`` slots
    are more: short sequences mask fewer tokens.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return 0
    if config.whole_word:
        bound = np.minimum(lengths, config.max_predictions) if config.max_predictions is not None else lengths
    else:
        bound = _num_to_predict(torch.from_numpy(np.maximum(lengths - 2, 0)), config).numpy()
    most = max(int(bound[batch].sum()) for batch in balanced_batches(lengths, batch_size, 0, 0))
    return -(-most // multiple_of) * multiple_of


def _top_k_rows(scores: Tensor, k: Tensor) -> Tensor:
    """Bool ``(batch, m)``: True at each row's ``k[row]`` highest scores."""
    order = scores.argsort(dim=1, descending=True)
    rank_ok = torch.arange(scores.size(1), device=scores.device)[None, :] < k[:, None]
    return torch.zeros_like(rank_ok).scatter(1, order, rank_ok)


def _choose_tokens(cand: Tensor, k: Tensor, generator, device) -> Tensor:
    scores = _rand(cand.shape, generator, device).masked_fill(~cand, -1.0)  # non-candidates rank last
    return _top_k_rows(scores, k) & cand


def _choose_words(cand: Tensor, word_starts: Tensor, k: Tensor, config: MaskingConfig, generator, device):
    """Whole-word choice. Returns (chosen tokens, word index of every token) both ``(batch, seq)``."""
    batch, seq = cand.shape
    prev_cand = torch.nn.functional.pad(cand[:, :-1], (1, 0), value=False)
    # A stray "##" right after [CLS]/[SEP] still has to begin some word.
    start = cand & (word_starts | ~prev_cand)
    word = (start.long().cumsum(1) - 1).clamp(min=0)  # word slot of each token, 0..seq-1
    word_len = torch.zeros(batch, seq, dtype=torch.long, device=device).scatter_add_(1, word, cand.long())
    scores = _rand((batch, seq), generator, device).masked_fill(word_len == 0, -1.0)
    order = scores.argsort(dim=1, descending=True)
    len_sorted = word_len.gather(1, order)
    taken_after = len_sorted.cumsum(1)
    taken_before = taken_after - len_sorted
    # Take words in random order while fewer than k tokens are taken, so the last word may
    # overshoot k by up to its length minus one (BERT's script skips such a word instead,
    # which is sequential). max_predictions, when set, stays a hard cap.
    keep = (taken_before < k[:, None]) & (len_sorted > 0)
    if config.max_predictions is not None:
        keep &= taken_after <= config.max_predictions
    chosen_word = torch.zeros_like(keep).scatter(1, order, keep)
    return chosen_word.gather(1, word) & cand, word


def mask_tokens(input_ids: Tensor, special_ids: Union[Iterable[int], Tensor], vocab_size: int, mask_id: int,
                config: MaskingConfig = MaskingConfig(), generator: Optional[torch.Generator] = None,
                word_starts: Optional[Tensor] = None) -> MaskedBatch:
    """Choose and corrupt tokens for masked-LM training.

    Args:
        input_ids: ``(batch, seq)`` LongTensor; padding must use an id in ``special_ids``.
        special_ids: ids never chosen (at least [CLS], [SEP], [PAD]); neither they nor
            ``mask_id`` are ever drawn as random replacements.
        vocab_size: random replacements are drawn from ``range(vocab_size)`` minus the
            special ids, uniformly.
        mask_id: id of [MASK].
        config: the recipe.
        generator: source of randomness (CPU or the tensors' device); the same
            generator state gives the same result. ``None`` uses torch's global RNG.
        word_starts: ``(batch, seq)`` bool, True where a token begins a word; required
            when ``config.whole_word`` (see :func:`word_start_mask`).

    Returns:
        A :class:`MaskedBatch`. With whole-word masking a row chooses whole words in random
        order until at least its target count is reached, so it may hold up to one word's
        length minus one tokens more than the target (never more than ``max_predictions``).
        The 80/10/10 decision is then drawn once per word, so a word is either all [MASK],
        all random tokens (each drawn independently) or all unchanged.
    """
    if input_ids.dim() != 2:
        raise UserError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    device = input_ids.device
    special = torch.as_tensor(sorted(special_ids) if not isinstance(special_ids, Tensor) else special_ids,
                              dtype=torch.long, device=device).flatten()
    cand = ~torch.isin(input_ids, special)
    k = _num_to_predict(cand.sum(1), config)

    if config.whole_word:
        if word_starts is None:
            raise UserError("whole_word masking needs word_starts (see word_start_mask)")
        if word_starts.shape != input_ids.shape:
            raise UserError(f"word_starts shape {tuple(word_starts.shape)} != input_ids shape {tuple(input_ids.shape)}")
        chosen, word = _choose_words(cand, word_starts.to(device=device, dtype=torch.bool), k, config, generator, device)
        # One draw per word slot, spread to the word's tokens.
        u = _rand(input_ids.shape, generator, device).gather(1, word)
    else:
        chosen = _choose_tokens(cand, k, generator, device)
        u = _rand(input_ids.shape, generator, device)

    to_mask = chosen & (u < config.replace_mask)
    to_random = chosen & (u >= config.replace_mask) & (u < config.replace_mask + config.replace_random)

    # Uniform over the allowed ids: draw an index into the list of non-special ids.
    allowed = torch.ones(vocab_size, dtype=torch.bool, device=device)
    allowed[special[(special >= 0) & (special < vocab_size)]] = False
    allowed[mask_id] = False
    allowed_ids = allowed.nonzero().squeeze(1)
    gen_device = generator.device if generator is not None else device
    pick = torch.randint(allowed_ids.numel(), input_ids.shape, generator=generator, device=gen_device)
    random_ids = allowed_ids[pick.to(device)]

    masked = input_ids.clone()
    masked[to_mask] = mask_id
    masked[to_random] = random_ids[to_random]
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

    num_masked = chosen.sum(1)
    width = config.max_predictions if config.max_predictions is not None else int(num_masked.max().item()) if num_masked.numel() else 0
    # Stable sort on "not chosen" lists a row's chosen positions first, in ascending order.
    order = (~chosen).to(torch.int8).sort(dim=1, stable=True).indices[:, :width]
    if order.size(1) < width:  # max_predictions longer than the sequence
        order = torch.nn.functional.pad(order, (0, width - order.size(1)))
    valid = torch.arange(width, device=device)[None, :] < num_masked[:, None]
    positions = torch.where(valid, order, torch.zeros_like(order))
    masked_labels = torch.where(valid, input_ids.gather(1, positions), torch.full_like(positions, IGNORE_INDEX))
    return MaskedBatch(masked, labels, positions, masked_labels, num_masked)


class MLMCollator:
    """Pad a list of pretraining features and mask them, for a DataLoader's ``collate_fn``.

    Features are dicts with ``input_ids``, ``token_type_ids``, ``attention_mask`` and
    ``next_sentence_label`` (other list/int fields are padded and passed through).

    Args:
        tokenizer_or_ids: a :class:`ctxkit.tokenizers.WordPieceTokenizer` or a
            :class:`MaskingIds`.
        config: the masking recipe.
        seed: seeds the masks. Called with a ``key`` (the trainer passes ``(epoch,
            batch position[, rank])``), a batch's masks depend only on ``(seed, key)``, so
            batches can be collated in any order, in worker processes, and a resumed run
            draws the same masks without any saved state. Called without a key, successive
            calls draw from one generator, and :meth:`state_dict` / :meth:`load_state_dict`
            let a resumed run continue that sequence.
        multiple_of: pad the sequence length up to a multiple of this.
        lengths: pad the sequence length up to the smallest of these instead (a fixed set
            of shapes: with ``torch.compile`` and CUDA graphs each is one compile and one
            graph, however the lengths of the data mix); a longer batch is an error.
        rows: fill a batch of fewer features up to this many rows with copies of its own
            rows whose targets are ignored (-100): an epoch's last, short batch keeps the
            shape of the others and trains on its real rows only.
        pack_width: pack the batch's sequences one after another into one row of this many
            tokens (no padding between them; the rest of the row is padding): every batch
            has the same shape whatever its lengths, and no compute goes to padding. Use
            with batches of about equal total length
            (:func:`~ctxkit.data.batching.balanced_batches`); a longer batch is an error.
        pack_max_len: the longest sequence (the row's padding is cut into segments no
            longer, so one bound sizes the attention kernel).
        pack_segments: how many segments the row's padding is cut into (empty ones at the
            end keep the count fixed; default: as many as the whole row could need). Each is
            a little work for the attention kernel, so a caller who knows the fewest tokens
            a batch holds gives the fewest that serve.
        pack_masked: how many masked-token slots a packed batch has (fixed, so the MLM head
            keeps one shape; unused slots repeat a [CLS] and are never scored). Default:
            ``rows * max_predictions``, what the padded batch would hold; a caller who knows
            the lengths gives the least that serves (:func:`packed_mask_slots`): short
            sequences mask fewer tokens, so the head and the last layer skip that much work.

    Returns (on call):
        Dict of tensors: ``input_ids`` (masked), ``token_type_ids``, ``attention_mask``
        (left out when the batch has no padding, unless ``lengths`` is set), ``labels`` ``(batch, seq)``, ``masked_positions``, ``masked_labels``
        ``(batch, max_masked)``, ``next_sentence_label`` ``(batch,)``. Packed
        (``pack_width``): ``input_ids``, ``token_type_ids`` and ``position_ids`` ``(1,
        pack_width)``, ``cu_seqlens`` (int32, the sequences' offsets then the padding's
        segments; ``batch + pack_segments + 1`` of them), ``seq_starts`` ``(batch,)``,
        ``next_sentence_label`` ``(batch,)``, and the positions the last layer computes:
        ``query_positions`` ``(1, batch + slots)`` (per sequence its [CLS], its masked
        tokens, then unused slots), ``cu_seqlens_q`` (int32, the queries' offsets per
        segment, like ``cu_seqlens``), ``masked_rows`` ``(slots,)`` (which queries the MLM
        head reads) and ``masked_labels`` ``(1, slots)``, -100 on unused slots.
    """

    def __init__(self, tokenizer_or_ids, config: MaskingConfig = MaskingConfig(), seed: int = 0, multiple_of: int = 1,
                 lengths: Optional[Sequence[int]] = None, rows: Optional[int] = None, pack_width: Optional[int] = None,
                 pack_max_len: int = 512, pack_segments: Optional[int] = None, pack_masked: Optional[int] = None):
        ids = tokenizer_or_ids if isinstance(tokenizer_or_ids, MaskingIds) else MaskingIds.from_tokenizer(tokenizer_or_ids)
        if config.whole_word and ids.continuation is None:
            raise UserError("whole_word masking needs MaskingIds.continuation (the '##' table)")
        self.ids = ids
        self.config = config
        self.multiple_of = multiple_of
        self.lengths = tuple(sorted(lengths)) if lengths else None
        self.rows = rows
        self.pack_width, self.pack_max_len, self.pack_segments = pack_width, pack_max_len, pack_segments
        self.pack_masked = pack_masked
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    keyed = True  # the Trainer may pass ``key=`` (see ``seed``)

    def __call__(self, features: Sequence[Mapping], key: Optional[Sequence[int]] = None) -> Dict[str, Tensor]:
        real = len(features)
        if self.rows is not None and 0 < real < self.rows:
            if self.pack_width:  # the fillers take room in the packed row: the shortest row's copies
                shortest = min(features, key=lambda f: len(f["input_ids"]))
                features = list(features) + [shortest] * (self.rows - real)
            else:
                features = list(features) + [features[i % real] for i in range(self.rows - real)]
        batch = collate(features, pad_values={"input_ids": self.ids.pad_id}, multiple_of=self.multiple_of)
        if self.lengths is not None:
            batch = self._pad_to_bucket(batch)
        word_starts = word_start_mask(batch["input_ids"], self.ids.continuation) if self.config.whole_word else None
        generator = self.generator
        if key is not None:
            # SeedSequence mixes (seed, *key) into well-separated streams, unlike seed + i.
            generator = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, *map(int, key)]).generate_state(1)[0]))
        out = mask_tokens(batch["input_ids"], self.ids.special_ids, self.ids.vocab_size, self.ids.mask_id,
                          self.config, generator, word_starts)
        batch.update(input_ids=out.input_ids, labels=out.labels, masked_positions=out.masked_positions,
                     masked_labels=out.masked_labels)
        if len(batch["input_ids"]) > real:  # the filler rows: inputs like real ones, no targets
            for name in ("labels", "masked_labels", "next_sentence_label"):
                if name in batch:
                    batch[name][real:] = IGNORE_INDEX
        if self.pack_width:
            return self._packed(batch)
        if self.lengths is None and bool(batch["attention_mask"].all()):
            # No padding: without a mask SDPA may pick the flash kernel (a boolean mask
            # rules it out), and the model attends everywhere exactly as the mask says.
            # Not with length buckets: there the mask stays, so a bucket is one shape and
            # one compile, whether or not a batch happens to fill it (a compile of a
            # BERT-base costs ~25 s on a GPU host; the mask, ~2 % of a step).
            del batch["attention_mask"]
        return batch

    def _packed(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The padded, masked batch as one packed row (see ``pack_width``)."""
        width, real = self.pack_width, batch["attention_mask"].bool()
        lengths = real.sum(1)
        total = int(lengths.sum())
        if total > width:
            raise UserError(f"a batch of {len(lengths)} sequences holds {total} tokens, more than the packed row's {width}")
        keep = real.flatten().nonzero().squeeze(1)

        def row(values: Tensor, pad: int) -> Tensor:
            out = values.new_full((1, width), pad)
            out[0, :total] = values.flatten()[keep]
            return out

        positions = torch.arange(real.size(1)).expand_as(real)
        # The padding after the sequences: segments of at most pack_max_len tokens (empty
        # ones at the end keep the count fixed), each attending only within itself.
        chunks = self.pack_segments or -(-width // self.pack_max_len)
        if (width - total) > chunks * self.pack_max_len:
            raise UserError(f"a batch of {total} tokens leaves {width - total} of the packed row's {width} as padding, more than "
                            f"{chunks} segments of {self.pack_max_len} hold")
        pad_ends = total + (torch.arange(1, chunks + 1) * self.pack_max_len).clamp(max=width - total)
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0), pad_ends]).to(torch.int32)
        starts = cu_seqlens[:len(lengths)].to(torch.long)
        return {"input_ids": row(batch["input_ids"], self.ids.pad_id), "token_type_ids": row(batch["token_type_ids"], 0),
                "position_ids": row(positions, 0), "cu_seqlens": cu_seqlens, "seq_starts": starts,
                "next_sentence_label": batch["next_sentence_label"],
                **self._packed_queries(starts, batch["masked_positions"], batch["masked_labels"], len(cu_seqlens))}

    def _packed_queries(self, starts: Tensor, masked_positions: Tensor, masked_labels: Tensor, offsets: int) -> Dict[str, Tensor]:
        """Where a packed batch's last layer runs: each sequence's [CLS], then its masked
        tokens (their count varies with its length), then a share of the unused slots (a
        repeat of its [CLS]); the queries of a sequence stay together, so ``cu_seqlens_q``
        segments them like ``cu_seqlens`` segments the keys. The padding's segments get none."""
        batch, width = masked_positions.shape
        scored = masked_labels != IGNORE_INDEX  # chosen tokens first in each row; filler rows have none
        counts = scored.sum(1)
        slots = self.pack_masked if self.pack_masked is not None else batch * width
        if int(counts.sum()) > slots:
            raise UserError(f"a packed batch masks {int(counts.sum())} tokens, more than its {slots} slots (pack_masked); "
                            "give the bound packed_mask_slots computes from the data's lengths")
        spare = slots - counts.sum()
        share = spare // batch + (torch.arange(batch) < spare % batch).long()  # the unused slots, spread over the sequences
        extra = int(share.max()) if batch else 0
        # One row per sequence: [CLS], masked positions, spare slots; `keep` marks what is used.
        cols = torch.arange(1 + width + extra)
        keep = (cols[None, :] == 0) | ((cols[None, :] <= width) & (cols[None, :] - 1 < counts[:, None])) \
            | ((cols[None, :] > width) & (cols[None, :] - 1 - width < share[:, None]))
        at = torch.cat([torch.zeros(batch, 1, dtype=torch.long), masked_positions, torch.zeros(batch, extra, dtype=torch.long)], 1)
        labels = torch.cat([torch.full((batch, 1), IGNORE_INDEX), masked_labels, torch.full((batch, extra), IGNORE_INDEX)], 1)
        keep = keep.flatten()
        queries = (starts[:, None] + at).flatten()[keep]
        is_masked = (cols[None, :] > 0).expand(batch, -1).flatten()[keep]
        per = keep.view(batch, -1).sum(1)
        cu_q = torch.cat([torch.zeros(1, dtype=torch.long), per.cumsum(0)])
        cu_q = torch.cat([cu_q, cu_q[-1:].expand(offsets - len(cu_q))]).to(torch.int32)
        return {"query_positions": queries[None], "cu_seqlens_q": cu_q, "masked_rows": is_masked.nonzero().squeeze(1),
                "masked_labels": labels.flatten()[keep][is_masked][None]}

    def _pad_to_bucket(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        width = batch["input_ids"].shape[1]
        target = next((n for n in self.lengths if n >= width), None)
        if target is None:
            raise UserError(f"a batch of {width} tokens is longer than the longest padding length {self.lengths[-1]}")
        if target == width:
            return batch
        pad = {"input_ids": self.ids.pad_id}
        return {k: (torch.nn.functional.pad(v, (0, target - width), value=pad.get(k, 0)) if v.dim() == 2 and v.shape[1] == width else v)
                for k, v in batch.items()}

    def state_dict(self) -> Dict[str, Tensor]:
        """The generator state, for exact resume."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore :meth:`state_dict`."""
        self.generator.set_state(state["generator"])
