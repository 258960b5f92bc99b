"""Whole-step CUDA graphs train exactly like eager steps (GPU only; skipped on CPU CI)."""

import pytest
import torch

from ctxkit.heads.classification import EncoderWithHead, SequenceClassificationHead
from ctxkit.models import BertModel, get_preset
from ctxkit.training import TrainConfig, Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _features(n=256):
    g = torch.Generator().manual_seed(0)
    feats = []
    for i in range(n):
        length = int(torch.randint(4, 60, (1,), generator=g))
        ids = [2] + torch.randint(8, 500, (length,), generator=g).tolist() + [3]
        feats.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids), "labels": i % 2})
    return feats


def _model():
    torch.manual_seed(0)
    config = get_preset("bert_4_256_4").config.replace(vocab_size=512, dropout=0.0, attention_dropout=0.0)
    return EncoderWithHead(BertModel(config), SequenceClassificationHead(256, 2, 0.0))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graphed_steps_match_eager_steps(tmp_path, precision):
    feats = _features()
    common = dict(epochs=2, batch_size=16, lr=1e-4, device="cuda", precision=precision, progress=False, pad_multiple=16, seed=3)
    eager = Trainer(_model(), feats, TrainConfig(fast="reference+qkv", **common), tmp_path / "eager")
    graphed = Trainer(_model(), feats, TrainConfig(fast="graphs+qkv", **common), tmp_path / "graphed")
    a, b = eager.train(), graphed.train()
    assert graphed.graphed is not None and graphed.graphed.replays > 0.6 * len(b.losses)
    tol = 2e-4 if precision == "fp32" else 3e-2
    assert b.losses == pytest.approx(a.losses, rel=tol, abs=tol)
    for p, q in zip(eager.model.parameters(), graphed.model.parameters()):
        assert torch.allclose(p, q, atol=tol * 10, rtol=tol * 10)


@pytest.mark.parametrize("compiled", ["blocks", "segments"])
def test_overlapped_reducer_and_compiled_layers_inside_graphs(tmp_path, compiled):
    """One rank: the reducer's bucket views, hooks and zeroing captured in the graph, with
    per-layer compiled blocks or the model compiled in 2 segments, train like plain eager
    steps."""
    from ctxkit.training.graphs import GraphedTrainStep
    from ctxkit.training.optim import build_adamw
    from ctxkit.training.reducer import OverlappedGradReducer
    from ctxkit.training.speed import compile_blocks, compile_model

    feats = _features(64)
    from ctxkit.data.batching import collate

    batches = [{k: v.cuda() for k, v in collate(feats[i : i + 16], multiple_of=64).items()} for i in range(0, 64, 16)]
    losses = []
    for mode in ("eager", "graphed"):
        model = _model().cuda()
        opt = build_adamw(model, 1e-4, 0.01, capturable=True)
        if mode == "graphed":
            compile_blocks(model) if compiled == "blocks" else compile_model(model, segments=2)
        step = GraphedTrainStep(model, opt, 1.0, lambda: torch.autocast("cuda", torch.bfloat16, cache_enabled=False),
                                grad_sync=OverlappedGradReducer(model, bucket_mb=1.0) if mode == "graphed" else None)
        run = [step(b)["loss"].item() if mode == "graphed" else step.eager(b)["loss"].item() for b in batches * 3]
        losses.append(run)
    assert step.replays >= 6
    assert losses[1] == pytest.approx(losses[0], rel=3e-2, abs=3e-2)


@pytest.mark.parametrize("compile_step", [False, True])
def test_graph_captured_decoding_equals_the_plain_loop(compile_step):
    plan = "graphs+qkv" + ("+compile" if compile_step else "")
    from ctxkit.decoding import GenerationConfig, generate, left_pad
    from ctxkit.decoding.static_decode import static_generate
    from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=97, max_position=64,
                                       ffn_size=256)).cuda().eval()
    ids, mask = left_pad([[5, 17, 42, 8, 9, 30], [11, 3], [60, 61, 62, 63]])
    ids, mask = ids.cuda(), mask.cuda()
    for cfg in (GenerationConfig(max_new_tokens=24), GenerationConfig(max_new_tokens=24, repetition_penalty=1.3)):
        plain = generate(model, ids, mask, cfg, static=False)
        for _ in range(2):  # the second call replays the cached graph
            assert torch.equal(static_generate(model, ids, mask, cfg, plan=plan), plain)
    same = ids[:1].expand(2, -1).contiguous()
    first = generate(model, same, None, GenerationConfig(max_new_tokens=3), static=False)[0, -1].item()
    cfg = GenerationConfig(max_new_tokens=40, eos_token_id=first)
    assert torch.equal(static_generate(model, same, None, cfg, plan=plan),
                       generate(model, same, None, cfg, static=False))
    sampled = static_generate(model, ids, mask, GenerationConfig(max_new_tokens=16, do_sample=True, top_k=3))
    full = torch.ones_like(sampled)
    full[:, : ids.size(1)] = mask
    with torch.no_grad():
        logits = model(sampled, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(min=0))
    top3 = logits[:, ids.size(1) - 1 : -1].topk(3, dim=-1).indices
    assert (top3 == sampled[:, ids.size(1):, None]).any(-1).all()


@pytest.mark.parametrize("plan", ["graphs+qkv", "graphs+compile+qkv"])
def test_gpu_encoder_graphs_and_packed_batches_match_eager(plan):
    """GPUEncoder: the graph replay of a full batch equals the plain forward (fp32), a second
    replay with new inputs is not stale, and the packed (unpadded, flash varlen) path in bf16
    agrees with the fp32 padded forward at every real token."""
    from ctxkit.inference.gpu import GPUEncoder

    ref = _model().eval()
    g = torch.Generator().manual_seed(0)
    full = torch.randint(8, 500, (4, 32), generator=g)
    fp32 = GPUEncoder(_model(), dtype=torch.float32, plan=plan)
    with torch.no_grad():
        for ids in (full, full.flip(0)):
            expect = ref(ids)["logits"]
            got = fp32(ids, torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))["logits"]
            assert fp32.last_path == "graph"
            assert torch.allclose(got.cpu(), expect, atol=1e-4, rtol=1e-4)
        mask = torch.ones_like(full)
        for row, n in enumerate((32, 5, 17, 1)):
            mask[row, n:] = 0
        ids = full * mask
        expect = ref.encoder(ids, mask).last_hidden_state
        bf16 = GPUEncoder(_model().encoder, dtype=torch.bfloat16, plan=plan)
        got = bf16(ids, mask).last_hidden_state.float().cpu()
        assert bf16.last_path == "packed graph"  # packed, bucketed, replayed
        real = mask.bool()
        assert (got[real] - expect[real]).abs().max() < 0.1 and expect[real].abs().mean() > 0.5
        assert got[~real].abs().max() == 0


def test_gpu_backend_predicts_like_pytorch():
    """predict() through with_backend(..., "gpu") (graphs for full batches, packed batches
    otherwise) gives the CPU fp32 logits: closely in fp32, within bf16 rounding in bf16, and
    within e4m3 rounding with fp8 matrix products."""
    from ctxkit.inference.backends import with_backend
    from ctxkit.training import predict

    def sharp_model():
        # A random head barely separates inputs (logits spread ~0.01); scale it so that a
        # wrong answer for some inputs cannot hide inside the tolerance.
        model = _model().eval()
        model.head.classifier.weight.data.mul_(100)
        return model

    feats = _features(96)
    ref = predict(sharp_model(), feats, batch_size=32, device="cpu")
    spread = max(float(abs(a - ref[0]).max()) for a in ref)
    assert spread > 0.3
    for precision, tol in (("fp32", 1e-3 * spread), ("bf16", 0.25 * spread), ("fp8", 0.35 * spread)):
        model, description = with_backend(sharp_model(), "gpu", precision)
        assert description.startswith(f"GPU encoder ({precision}")
        got = predict(model, feats, batch_size=32, device="cuda", precision="fp32")  # no autocast on top
        assert len(got) == len(ref)
        assert max(float(abs(a - b).max()) for a, b in zip(got, ref)) < tol
        assert model.runner.last_path in ("graph", "packed", "packed graph")


def test_pipelined_chunked_predict_on_the_gpu_matches_cpu():
    """predict() on the GPU (batches collated ahead into pinned memory, host tensors to the
    GPU encoder, outputs read back asynchronously), fed chunk by chunk as a task feeds it,
    gives every feature its own CPU fp32 logits within bf16 rounding, in input order."""
    from ctxkit.inference.backends import with_backend
    from ctxkit.training import featurized_ahead, predict

    model = _model().eval()
    model.head.classifier.weight.data.mul_(100)
    feats = _features(300)
    ref = predict(model, feats, batch_size=32, device="cpu")
    spread = max(float(abs(a - ref[0]).max()) for a in ref)
    gpu, _ = with_backend(model, "gpu", "bf16", plan="graphs+qkv")
    got = predict(gpu, featurized_ahead(list, feats, 64), batch_size=32, device="cuda", total=len(feats))
    assert len(got) == len(ref) and spread > 0.3
    assert max(float(abs(a - b).max()) for a, b in zip(got, ref)) < 0.25 * spread


def test_a_partial_batch_reuses_the_captured_graph():
    """A batch smaller than one already captured (same width) runs in that graph, its
    padding rows dropped: no new capture, and the rows' outputs equal a run on their own."""
    from ctxkit.inference.backends import with_backend

    model = _model().eval()
    gpu, _ = with_backend(model, "gpu", "fp32", plan="graphs+qkv")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(8, 500, (64, 24), generator=g)
    full = gpu(input_ids=ids)["logits"]
    assert len(gpu.runner._graphs) == 1
    part = gpu(input_ids=ids[:20])["logits"]
    assert part.shape == (20, 2) and len(gpu.runner._graphs) == 1
    assert torch.allclose(part, full[:20], rtol=0, atol=1e-4 * float(full.abs().max()))


def test_serve_gpu_backend_answers_like_pytorch_and_keeps_fp32_embed(tmp_path):
    """`ctxkit serve --backend gpu`: /classify through the GPU encoder (bf16 copy of the
    model) gives the fp32 PyTorch probabilities within bf16 rounding and the same labels;
    /embed still runs the fp32 encoder (equal vectors); /health names the backend."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ctxkit.inference.serve import create_app
    from ctxkit.tasks import get_task
    from ctxkit.tokenizers import WordPieceTokenizer

    words = "a film great bad movie the it is was fine worst best mess of year moving wonderful , .".split()
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")
    task = get_task("sst-2")
    torch.manual_seed(0)
    config = get_preset("bert_4_256_4").config.replace(vocab_size=len(words) + 5)
    texts = ["a wonderful , moving film", "the worst mess of the year", "it is fine", "best film", "bad",
             "the film was a mess of bad and great and fine and wonderful"]

    def answers(backend):
        torch.manual_seed(0)
        model = task.build_model(BertModel(config)).cuda().eval()
        with torch.no_grad():
            for p in model.head.parameters():  # wide logits: answers far from ties
                p.normal_(0.0, 0.5)
        with TestClient(create_app((task, model, tokenizer, {}), backend=backend, max_batch=4, max_wait_ms=20)) as client:
            health = client.get("/health").json()
            preds = client.post("/classify", json={"texts": texts}).json()["predictions"]
            vector = client.post("/embed", json={"text": texts[0]}).json()["embedding"]
        assert next(model.parameters()).dtype == torch.float32  # the served copy took the bf16 cast
        return health["backend"], preds, vector

    name, ours, our_vector = answers("gpu")
    ref_name, ref, ref_vector = answers("pytorch")
    assert name.startswith("GPU encoder (bf16") and ref_name.startswith("PyTorch")
    assert [p["label"] for p in ours] == [p["label"] for p in ref]
    for a, b in zip(ours, ref):
        assert abs(max(a["probs"].values()) - max(b["probs"].values())) < 0.03
    assert our_vector == pytest.approx(ref_vector, abs=1e-5)


def test_gpu_encoder_gelu_epilogue_stays_close_to_erf_gelu():
    """gelu_epilogue=True (cuBLASLt bias + tanh GELU epilogue) under compile and graphs:
    fp32 logits within tanh-vs-erf distance of the plain model, and the same labels."""
    from ctxkit.inference.gpu import GPUEncoder

    ref = _model().eval()
    ids = torch.randint(8, 500, (8, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expect = ref(ids)["logits"]
    fused = GPUEncoder(_model(), dtype=torch.float32, plan="graphs+compile+qkv+gelutanh")
    got = fused(ids, torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))["logits"].cpu()
    assert fused.last_path == "graph"
    assert 0 < (got - expect).abs().max() < 1e-2
    assert torch.equal(got.argmax(-1), expect.argmax(-1))
    mask = torch.ones_like(ids)
    mask[1:, 20:] = 0
    with torch.no_grad():
        expect = ref(ids * mask, mask)["logits"]
    got = fused(ids * mask, mask)["logits"].cpu()  # the packed path, compiled with dynamic shapes
    assert fused.last_path == "packed"  # fp32: packed, not graphed
    assert 0 < (got - expect).abs().max() < 1e-2


@pytest.mark.parametrize("compile", ["", "+compile"])
def test_gpu_encoder_replays_packed_batches_from_bucketed_graphs(compile):
    """Variable-length batches replay from bucketed graphs: the same answers as the
    ungraphed packed path, fresh inputs on every replay (no stale rows), one graph per
    bucket, and cut back to each caller's shape."""
    from ctxkit.inference.gpu import GPUEncoder

    graphed = GPUEncoder(_model(), dtype=torch.bfloat16, plan="graphs+qkv" + compile)
    plain = GPUEncoder(_model(), dtype=torch.bfloat16, plan="qkv" + compile)
    g = torch.Generator().manual_seed(3)
    shapes = [(4, 32), (4, 32), (6, 20), (40, 64)]  # the first three share a bucket
    for rows, seq in shapes:
        ids = torch.randint(8, 500, (rows, seq), generator=g)
        lengths = torch.randint(1, seq + 1, (rows,), generator=g)
        lengths[0] = seq
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        lengths[-1] = max(1, seq // 3)
        mask[-1] = (torch.arange(seq) < lengths[-1]).long()
        got = graphed(ids, mask)["logits"]
        assert graphed.last_path == "packed graph"
        expect = plain(ids, mask)["logits"]
        assert plain.last_path == "packed"
        assert got.shape == expect.shape == (rows, 2)
        assert (got.float() - expect.float()).abs().max() < 2e-2 and expect.float().abs().mean() > 1e-2  # bf16
    assert len(graphed._packed_graphs) == 2
    fp32 = GPUEncoder(_model(), dtype=torch.float32, plan="graphs+qkv")  # fp32 attends per sequence: packed, never graphed
    fp32(ids, mask)
    assert fp32.last_path == "packed" and not fp32._packed_graphs
