"""The speed paths compute the same numbers as the plain ones.

Fused q/k/v projections, the sparse last layer of the pretraining model, the mask-free
attention of unpadded batches and activation checkpointing are all exact rewrites; these
tests hold them to that (values and gradients).
"""

import dataclasses

import pytest
import torch

from ctxkit.fast import FusedQKVAttention, SegmentedEncoder, fuse_qkv
from ctxkit.layers import MultiHeadAttention, TransformerEncoder
from ctxkit.models import BertForPreTraining, get_preset
from ctxkit.pretraining.masking import IGNORE_INDEX, MaskingConfig, MaskingIds, MLMCollator
from tolerance import assert_paths_agree

# "Exact rewrites" in exact arithmetic; in float32 they sum in other orders (other GEMM shapes,
# one fused GEMM), so values and gradients agree within twice the bound of tests/README.md.


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_projections_equal_separate_ones():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    assert fuse_qkv(attn) == 1 and isinstance(attn, FusedQKVAttention)  # ctxkit.fast: one GEMM per shared input
    x, mem = torch.randn(2, 7, 32), torch.randn(2, 5, 32)

    def reference(q_in, k_in, v_in):
        split = attn._split_heads
        q, k, v = split(attn.q_proj(q_in)), split(attn.k_proj(k_in)), split(attn.v_proj(v_in))
        w = (q @ k.transpose(-1, -2) / 8 ** 0.5).softmax(-1)
        return attn.out_proj((w @ v).transpose(1, 2).reshape(q_in.size(0), q_in.size(1), 32))

    block = dict(depth=4, k=32)  # projections, scores, mix, output projection
    assert_paths_agree(attn(x)[0], reference(x, x, x), name="q, k, v in one GEMM", **block)
    assert_paths_agree(attn(x, mem)[0], reference(x, mem, mem), name="k, v in one GEMM", **block)
    other = torch.randn(2, 5, 32)
    assert_paths_agree(attn(x, mem, other)[0], reference(x, mem, other), name="separate memories", **block)


def test_sparse_last_layer_equals_full_layer_values_and_grads():
    torch.manual_seed(0)
    for norm_first in (False, True):
        enc = TransformerEncoder(3, 32, 4, 64, dropout=0.0, attention_dropout=0.0, norm_first=norm_first)
        x = torch.randn(3, 10, 32, requires_grad=True)
        mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [1] * 8 + [0] * 2]).bool()[:, None, None, :]
        index = torch.tensor([[0, 3, 9], [0, 1, 5], [0, 7, 2]])
        full = enc(x, mask).last_hidden_state
        picked = full.gather(1, index[..., None].expand(-1, -1, 32))
        sparse = enc(x, mask, output_positions=index).last_hidden_state
        assert_paths_agree(sparse, picked, depth=4, k=64, name=f"values, norm_first={norm_first}")  # input + 3 layers
        (g_full,) = torch.autograd.grad((picked * torch.arange(32.0)).sum(), x)
        (g_sparse,) = torch.autograd.grad((sparse * torch.arange(32.0)).sum(), x)
        assert_paths_agree(g_sparse, g_full, depth=8, k=64, name=f"gradients, norm_first={norm_first}")  # back down again
        assert g_full.abs().sum() > 0


def test_sentence_classifier_runs_the_last_layer_at_cls_only_with_equal_logits_and_grads():
    from ctxkit.models import BertModel
    from ctxkit.tasks import get_task

    torch.manual_seed(0)
    config = get_preset("bert_4_256_4").config.replace(vocab_size=100, num_layers=3, dropout=0.0, attention_dropout=0.0)
    model = get_task("sst-2").build_model(BertModel(config))
    assert model.cls_only
    ids = torch.randint(5, 100, (3, 12))
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5, [1] * 9 + [0] * 3])
    labels = torch.tensor([0, 1, 1])
    seen = []
    hook = model.encoder.encoder.layers[-1].register_forward_hook(lambda m, args, out: seen.append(out[0].shape[1]))
    sparse = model(ids, mask, labels=labels)
    sparse["loss"].backward()
    g_sparse = _grads(model)
    model.zero_grad()
    model.cls_only = False
    dense = model(ids, mask, labels=labels)
    dense["loss"].backward()
    hook.remove()
    assert seen == [1, 12]  # the last layer produced one position, then all twelve
    # embeddings, 3 layers (FFN 1024), pooler and classifier; back down for the gradients
    assert_paths_agree(sparse["logits"], dense["logits"], depth=6, k=1024, name="logits")
    g_dense = _grads(model)
    assert g_sparse.keys() == g_dense.keys()
    # Gradients are sums that cancel: their scale is the size of their terms. The mean
    # cross-entropy gives each logit |p - y| / batch, at most 1 over the batch, which the
    # classifier multiplies by the tanh pooler output (|x| <= 1) and the layers below shrink
    # (weights of std 0.02): 1 (tests/test_trainer.py's gradient check argues the same).
    for name in g_dense:
        assert_paths_agree(g_sparse[name], g_dense[name], depth=12, k=1024, scale=1.0, name=f"gradient of {name}")


def test_pretraining_losses_and_grads_with_sparse_last_layer_equal_dense_ones():
    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64)
    model = BertForPreTraining(config).eval()
    ids = torch.randint(5, 300, (4, 16))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    positions = torch.tensor([[1, 4, 7], [2, 3, 10], [5, 6, 15], [1, 2, 3]])
    labels = ids.gather(1, positions)
    labels[1, 2] = IGNORE_INDEX  # a padded prediction slot
    ce = torch.nn.functional.cross_entropy

    mlm, nsp = model(ids, mask, token_type_ids=torch.zeros_like(ids), masked_positions=positions)
    (ce(mlm.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX) + nsp.logsumexp(-1).sum()).backward()
    sparse = _grads(model)
    model.zero_grad()
    mlm_full, nsp_full = model(ids, mask, token_type_ids=torch.zeros_like(ids))
    picked = mlm_full.gather(1, positions[..., None].expand(-1, -1, config.vocab_size))
    (ce(picked.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX) + nsp_full.logsumexp(-1).sum()).backward()
    dense = _grads(model)
    # embeddings, 2 layers (FFN 512), then the MLM transform and decoder / the pooler and NSP
    assert_paths_agree(mlm, picked, depth=5, k=512, name="MLM logits")
    assert_paths_agree(nsp, nsp_full, depth=4, k=512, name="NSP logits")
    assert sparse.keys() == dense.keys()
    # Gradients are sums that cancel: their scale is the size of their terms, set by the
    # loss's gradient w.r.t. the logits: softmax - one-hot, at most 1 per prediction for the
    # mean MLM loss, 1 per row (4 rows) for the summed NSP log-sum-exp: 4 at most.
    for name in dense:
        assert_paths_agree(sparse[name], dense[name], depth=10, k=512, scale=4.0, name=f"gradient of {name}")


def test_collator_drops_the_mask_only_when_nothing_is_padded():
    ids = MaskingIds(vocab_size=50, mask_id=3, special_ids=frozenset({0, 1, 2, 3}), pad_id=0)
    collator = MLMCollator(ids, MaskingConfig(max_predictions=3), seed=0)

    def feature(n):
        return {"input_ids": [1] + list(range(10, 10 + n)) + [2], "token_type_ids": [0] * (n + 2),
                "attention_mask": [1] * (n + 2), "next_sentence_label": 0}

    assert "attention_mask" not in collator([feature(6), feature(6)])
    padded = collator([feature(6), feature(4)])
    assert padded["attention_mask"].tolist() == [[1] * 8, [1] * 6 + [0] * 2]

    config = get_preset("bert_2_128_2").config.replace(vocab_size=50, max_position=16)
    model = BertForPreTraining(config).eval()
    x = torch.randint(4, 50, (2, 8))
    # the mask-free attention kernel vs the masked one: embeddings, 2 layers, the MLM head
    assert_paths_agree(model(x, attention_mask=None)[0], model(x, attention_mask=torch.ones_like(x))[0], depth=5, k=512,
                       name="no mask vs an all-ones mask")


def test_activation_checkpointing_gives_the_same_gradients_with_dropout():
    torch.manual_seed(0)
    enc = TransformerEncoder(2, 32, 4, 64, dropout=0.1, attention_dropout=0.1).train()
    x = torch.randn(2, 9, 32)
    results = []
    for ckpt in (False, True):
        enc.checkpoint_layers = ckpt
        enc.zero_grad()
        torch.manual_seed(1)  # the same dropout masks; checkpointing replays them in backward
        out = enc(x).last_hidden_state
        (out * torch.linspace(-1, 1, 32)).sum().backward()
        results.append((out.detach(), _grads(enc)))
    torch.testing.assert_close(results[1][0], results[0][0])
    for name, g in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], g, msg=name)


def test_flat_and_overlapped_gradient_all_reduce_equal_ddp(tmp_path):
    import json
    from pathlib import Path

    from test_distributed import _launch

    script = Path(__file__).resolve().parent / "helpers" / "grad_sync.py"
    out = tmp_path / "sync.json"
    # The two ranks as torchrun --standalone starts them, without its agent process
    # (tests/test_distributed.py's _launch).
    _launch(script, [out], 2)
    result = json.loads(out.read_text())
    assert result["world"] == 2 and result["same_weights"]
    assert result["local_differs"]  # the ranks' own gradients really differed before the average
    assert result["max_diff_vs_ddp"] < 1e-6
    assert result["grad_storages_after_sync"] == 1  # the summed buffer became the gradients: no copy back
    assert result["loss_scale"] == 0.5 and result["prescaled_max_diff"] < 1e-6  # loss / world, then a plain sum
    assert result["bf16_is_rounded"] and result["bf16_max_rel_err"] < 1e-2  # bf16: ~3 significant digits
    # The overlapped reducer (buckets sent from gradient hooks during backward), two steps:
    assert result["reducer_buckets"] >= 2
    assert result["reducer_max_diff"] < 1e-6
    assert result["reducer_unused_none"]  # a parameter without gradient stays None, as in one process
    assert 0 < result["reducer_bf16_rel_err"] < 1e-2


def test_bf16_residual_stream_under_autocast():
    from ctxkit.fast import set_stream_dtype

    torch.manual_seed(0)
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64)
    model = BertForPreTraining(config).eval()
    ids = torch.randint(5, 300, (3, 12))
    seen = []
    hook = model.bert.encoder.layers[0].register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o[0].dtype)))
    with torch.autocast("cpu", torch.bfloat16):
        reference = model(ids)[0].float()
        assert seen[-1] == (torch.float32, torch.float32)  # autocast's LayerNorm returns float32
        assert set_stream_dtype(model, torch.bfloat16) == 1 + 2 * config.num_layers
        lowp = model(ids)[0].float()
        assert seen[-1] == (torch.bfloat16, torch.bfloat16)
    hook.remove()
    assert not torch.equal(lowp, reference)
    torch.testing.assert_close(lowp, reference, atol=0.1, rtol=0.05)  # bf16 rounding, same model
    fp32 = model(ids)[0]  # no autocast: the setting is inert
    set_stream_dtype(model, None)
    torch.testing.assert_close(model(ids)[0], fp32)


def _pretrain_steps(shards_dir, out, **config):
    from ctxkit.pretraining.train import pretrain
    from ctxkit.training import TrainConfig

    cfg = TrainConfig(**{**dict(batch_size=8, lr=1e-3, warmup_ratio=0.25, device="cpu", progress=False, log_every=1,
                                 eval_each_epoch=False, seed=3, max_steps=4, epochs=1), **config})
    pretrain(shards_dir, "bert_2_128_2", out, cfg, masking=MaskingConfig(max_predictions=6))
    import json

    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("event") == "train"]


def test_compiled_layers_and_checkpointing_train_like_eager(wiki_shards, tmp_path, monkeypatch):
    from ctxkit.zoo import presets

    # No dropout, so the compiled kernels (with their own RNG) must give the eager losses.
    # One layer: Inductor's C++ kernels (forward and backward, compiled cold in CI) are what
    # this test pays for, and a second layer adds kernels, not another code path.
    base = presets.get_preset("bert_2_128_2")
    quiet = dataclasses.replace(base, config=base.config.replace(dropout=0.0, attention_dropout=0.0, num_layers=1))
    monkeypatch.setitem(presets.PRESETS, "bert_2_128_2", quiet)
    eager = [r["loss"] for r in _pretrain_steps(wiki_shards, tmp_path / "eager", fast="reference")]
    compiled = [r["loss"] for r in _pretrain_steps(wiki_shards, tmp_path / "compiled", fast="compile")]
    ckpt = [r["loss"] for r in _pretrain_steps(wiki_shards, tmp_path / "ckpt", fast="ckpt")]
    assert len(eager) == 4 and len(set(eager)) == 4  # four real steps on different batches
    assert compiled == pytest.approx(eager, abs=2e-4)
    assert ckpt == pytest.approx(eager, abs=1e-5)


def _schedule_lrs(config, peak: float, steps: int, warmup_steps: int = 2, total_steps: int = 10) -> list:
    """The learning rate of each of ``steps`` steps under ``config``'s schedule."""
    from ctxkit.training.optim import build_schedule

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sched = build_schedule(config, opt, warmup_steps=warmup_steps, total_steps=total_steps)
    lrs = []
    for _ in range(steps):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


def test_cosine_schedule_warms_up_then_falls_to_the_floor():
    """``schedule="cosine"``: linear warmup, then half a cosine down to ``min_lr_ratio`` of the
    peak at the last step (what Transformer-XL trains with); ``ctxkit pretrain`` offers it
    (``--schedule cosine --min-lr-ratio R``)."""
    import math

    from ctxkit.cli.train_flags import VERBS
    from ctxkit.core.errors import UserError
    from ctxkit.training import TrainConfig
    from ctxkit.training.optim import build_schedule

    lrs = _schedule_lrs(TrainConfig(schedule="cosine", min_lr_ratio=0.1), peak=2.0, steps=11)
    want = [1.0, 2.0] + [2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 8))) for i in range(8)] + [0.2]
    assert lrs == pytest.approx(want, rel=1e-12)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(UserError, match="min_lr_ratio must be between 0 and 1"):
        build_schedule(TrainConfig(schedule="cosine", min_lr_ratio=1.5), opt, 2, 10)
    assert "min_lr_ratio" in VERBS["pretrain"].include and "cosine" in VERBS["pretrain"].choices["schedule"]


def test_polynomial_schedule_from_config_and_cli(wiki_shards, tmp_path, capsys):
    import json

    from ctxkit.cli import main
    from ctxkit.training import TrainConfig
    from ctxkit.training.optim import build_schedule

    lrs = _schedule_lrs(TrainConfig(schedule="polynomial", schedule_power=2.0), peak=1.0, steps=10)
    assert lrs == pytest.approx([0.5, 1.0] + [(1 - i / 8) ** 2 for i in range(8)])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="schedule must be"):
        build_schedule(TrainConfig(schedule="exponential"), opt, 1, 10)
    rc = main(["pretrain", "--data", str(wiki_shards), "--preset", "bert_2_128_2", "--out", str(tmp_path / "run"), "--max-steps", "2",
               "--batch-size", "4", "--device", "cpu", "--no-progress", "--schedule", "polynomial", "--schedule-power", "3",
               "--activation-checkpointing"])
    captured = capsys.readouterr()
    assert rc == 0 and json.loads(captured.out)["steps"] == 2
    start = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    # The old --activation-checkpointing flag still parses: it is the plan option ckpt now.
    assert (start["config"]["schedule"], start["config"]["schedule_power"], start["config"]["fast"]) == ("polynomial", 3.0, "auto+ckpt")
    assert start["fast"] == "qkv+ckpt" and "--fast auto+ckpt" in captured.err


def test_keyed_masks_depend_on_the_key_not_on_call_order():
    ids = MaskingIds(vocab_size=500, mask_id=3, special_ids=frozenset({0, 1, 2, 3}), pad_id=0)
    feats = [{"input_ids": [1] + list(range(10, 40)) + [2], "token_type_ids": [0] * 32, "attention_mask": [1] * 32,
              "next_sentence_label": 0} for _ in range(8)]
    a = MLMCollator(ids, MaskingConfig(max_predictions=5), seed=4)
    b = MLMCollator(ids, MaskingConfig(max_predictions=5), seed=4)
    first, second = a(feats, key=(0, 1)), a(feats, key=(0, 2))
    b(feats)  # unkeyed calls in between move only the sequential generator
    again_second, again_first = b(feats, key=(0, 2)), b(feats, key=(0, 1))
    assert torch.equal(first["input_ids"], again_first["input_ids"]) and torch.equal(second["input_ids"], again_second["input_ids"])
    assert not torch.equal(first["masked_positions"], second["masked_positions"])
    other_seed = MLMCollator(ids, MaskingConfig(max_predictions=5), seed=5)(feats, key=(0, 1))
    assert not torch.equal(other_seed["masked_positions"], first["masked_positions"])


def test_one_loader_serves_every_epoch_and_gives_the_same_run(minilm_dir, shared_data, tmp_path_factory, tmp_path, monkeypatch):
    """The Trainer's loader spans the run: its workers are forked once, and they take the
    next epoch's first batches before this epoch's end work (evaluation, checkpoint) is
    done. Two epochs with a worker process give the losses of the inline loader, bit for bit."""
    from shards import wiki_shards_of

    few = wiki_shards_of(6, shared_data, minilm_dir, tmp_path_factory)  # 33 instances: 5 steps of 8 an epoch, the last short
    from ctxkit.training import data as training_data
    from ctxkit.training.trainer import Trainer

    events, stream, end_epoch, items = [], Trainer._stream, Trainer._end_epoch, training_data.EpochItems.__iter__

    def streaming(self, *args):
        events.append("loader")
        return stream(self, *args)

    def sampling(self):
        last = None
        for item in items(self):
            if item[0] != last:
                events.append(f"batches of {item[0]}")
                last = item[0]
            yield item

    def ending(self, state, epoch, *rest):
        events.append(f"end {epoch}")
        return end_epoch(self, state, epoch, *rest)

    monkeypatch.setattr(Trainer, "_stream", streaming)
    monkeypatch.setattr(training_data.EpochItems, "__iter__", sampling)
    monkeypatch.setattr(Trainer, "_end_epoch", ending)
    settings = dict(max_steps=None, epochs=2, log_every=2, eval_each_epoch=True)
    inline = _pretrain_steps(few, tmp_path / "inline", data_workers=0, **settings)
    assert events == ["loader", "batches of 0", "end 0", "batches of 1", "end 1"]  # inline: collated when needed
    events.clear()
    workers = _pretrain_steps(few, tmp_path / "workers", data_workers=1, **settings)
    assert events == ["loader", "batches of 0", "batches of 1", "end 0", "end 1"]  # one loader, ahead across the boundary
    assert {r["epoch"] for r in inline} == {0, 1}
    assert [(r["step"], r["loss"]) for r in workers] == [(r["step"], r["loss"]) for r in inline]


def test_worker_processes_prepare_the_same_batches(wiki_shards, tmp_path):
    inline = [r["loss"] for r in _pretrain_steps(wiki_shards, tmp_path / "inline", data_workers=0)]
    workers = [r["loss"] for r in _pretrain_steps(wiki_shards, tmp_path / "workers", data_workers=2)]
    assert len(inline) == 4
    assert workers == inline  # the same masks and batches, bit for bit


def test_fused_weights_are_reused_in_inference_and_refreshed_after_updates():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2).eval()
    fuse_qkv(attn)
    x = torch.randn(1, 3, 16)
    with torch.inference_mode():
        first = attn(x)[0]
        (cached,) = [entry[1][0] for entry in attn._fused_cache.values()]  # one set: q/k/v
        assert attn(x)[0].equal(first)
        (again,) = [entry[1][0] for entry in attn._fused_cache.values()]
        assert again is cached  # reused, not rebuilt
    with torch.no_grad():
        attn.k_proj.weight.mul_(2.0)  # an in-place update (as an optimiser step would do)
    with torch.inference_mode():
        changed = attn(x)[0]
    fresh = MultiHeadAttention(16, 2).eval()
    fuse_qkv(fresh)
    fresh.load_state_dict(attn.state_dict())
    reference = fresh(x)[0].detach()  # with autograd on: concatenated afresh
    assert not changed.equal(first)
    torch.testing.assert_close(changed, reference)


def test_segmented_compile_equals_eager_and_hands_upper_gradients_over_first(monkeypatch):
    from ctxkit.training.speed import compile_model

    # The graph breaks, the graphs' backward nodes and the gradients they hand over are made
    # by dynamo and AOTAutograd; the "aot_eager" backend runs exactly those and skips
    # Inductor's C++ codegen (test_compiled_layers_and_checkpointing_train_like_eager trains
    # through compile_model with Inductor).
    real_compile, backends = torch.compile, []

    def aot_eager_compile(fn, *args, **kwargs):
        backends.append(kwargs.pop("backend", "inductor"))
        return real_compile(fn, *args, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", aot_eager_compile)
    torch.manual_seed(0)
    # Two layers, two segments of one layer each: the smallest model with a graph break
    # between layers (what is checked is the hand-over between graphs, not their depth).
    config = get_preset("bert_2_128_2").config.replace(vocab_size=300, max_position=64, dropout=0.0, attention_dropout=0.0)
    eager = BertForPreTraining(config).train()
    compiled = BertForPreTraining(config).train()
    compiled.load_state_dict(eager.state_dict())
    compile_model(compiled, segments=2)
    assert backends == ["inductor"]  # compile_model compiled the model once, with the default backend
    encoder = compiled.bert.encoder
    assert isinstance(encoder, SegmentedEncoder) and encoder.compile_breaks == {0}  # layer 0 | layer 1
    ids = torch.randint(5, 300, (3, 12))
    positions = torch.tensor([[1, 4, 7], [2, 3, 10], [5, 6, 11]])
    labels = ids.gather(1, positions)
    ce = torch.nn.functional.cross_entropy

    def compiled_nodes(fn):  # backward nodes of compiled graphs reachable from fn
        seen, stack, found = set(), [fn], 0
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            found += "CompiledFunction" in type(node).__name__
            stack.extend(n for n, _ in node.next_functions)
        return found

    nodes = []

    def step(model):
        mlm, nsp = model(ids, None, token_type_ids=torch.zeros_like(ids), masked_positions=positions)
        loss = ce(mlm.flatten(0, 1), labels.flatten()) + nsp.logsumexp(-1).sum()
        nodes.append(compiled_nodes(loss.grad_fn))
        loss.backward()
        return loss.detach()

    torch._dynamo.reset()
    torch.testing.assert_close(step(compiled), step(eager), atol=1e-5, rtol=1e-5)
    # Several graphs (embeddings, layer 0, layer 1, heads), so several backward
    # nodes: the upper segment's gradients are complete (and their hooks fire) before the
    # lower segment's backward runs, which is what lets an all-reduce of the upper buckets
    # overlap it. One whole-model graph has a single node.
    assert nodes[0] >= 3 and nodes[1] == 0
    want, got = _grads(eager), _grads(compiled)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)


def test_fused_weights_are_refreshed_after_updates_no_version_counter_sees():
    """A replayed CUDA graph (a graphed training step) writes the parameters without moving
    their version counters; ``.data`` writes do the same on CPU. Switching the mode (what
    every evaluation does: eval(), then train()) drops the cached concatenation, so an
    evaluation after such updates computes with the current weights."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2).eval()
    fuse_qkv(attn)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        first = attn(x)[0]  # fills the cache
    attn.train()
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        before = proj.weight._version
        proj.weight.data.add_(0.5 * torch.randn_like(proj.weight))  # unseen by the version check
        assert proj.weight._version == before
    attn.eval()
    with torch.no_grad():
        after = attn(x)[0]
    plain = MultiHeadAttention(16, 2).eval()
    plain.load_state_dict(attn.state_dict())
    with torch.no_grad():
        reference = plain.double()(x.double())[0]
    assert not torch.allclose(after, first)
    # float32 against float64: a few units of rounding on outputs of magnitude ~1.
    torch.testing.assert_close(after.double(), reference, rtol=0, atol=64 * torch.finfo(torch.float32).eps * reference.abs().max().item())
    assert "_fused_cache" in attn.__dict__
    attn.train()
    assert "_fused_cache" not in attn.__dict__  # training sees the module as it was first traced


def test_epoch_items_run_from_the_resumed_step_through_the_last_epoch():
    """The one loader's sampler: the first epoch from the step a run resumes at, then every
    later epoch from its start, each item ``(epoch, key, example ids)`` as the epoch's order
    has it; nothing left when the run is done."""
    from ctxkit.training.data import EpochItems
    from ctxkit.training.world_resume import EpochOrder

    lengths = [5, 9, 3, 7, 7, 2, 8, 4, 6, 1]

    def order(epoch):
        return EpochOrder(lengths, 4, 1, seed=3, epoch=epoch, group_factor=0)

    first = order(1)
    items = list(EpochItems((first, 1), order, 3))
    expected = [(1, first.keys[j], first.micro[j]) for j in range(first.bounds[1], len(first.micro))]
    second = order(2)
    expected += [(2, second.keys[j], second.micro[j]) for j in range(len(second.micro))]
    assert items == expected and len(items) == 2 + 3
    assert sorted(i for _, _, ids in items[2:] for i in ids) == list(range(10))  # epoch 2 whole
    assert not EpochItems((first, 1), order, 3).empty()
    assert EpochItems((first, len(first.bounds) - 1), order, 2).empty()  # the last epoch consumed
    assert EpochItems((order(3), 0), order, 3).empty() and list(EpochItems((order(3), 0), order, 3)) == []
