"""Decoding: cached == uncached logits, greedy == transformers' greedy, beam width 1 ==
greedy, reproducible sampling, top-k/top-p never emit a filtered token, stops and penalties."""

import pytest
import torch

from ctxkit.decoding import GenerationConfig, apply_repetition_penalty, filter_logits, generate, left_pad
from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel
from tolerance import assert_same_function, float64

CONFIG = GPT2Config(num_layers=2, hidden_size=64, num_heads=4, vocab_size=97, max_position=64, ffn_size=256)
PROMPTS = [[5, 17, 42, 8, 9, 30], [11, 3], [60, 61, 62, 63]]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(CONFIG).eval()


def test_cached_logits_equal_uncached_with_left_padding(model):
    ids, mask = left_pad(PROMPTS)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    extra = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]])
    full_ids = torch.cat([ids, extra], 1)
    full_mask = torch.cat([mask, torch.ones_like(extra)], 1)
    full_pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        reference = model(full_ids, attention_mask=full_mask, position_ids=full_pos)
        cache = model.new_cache(3, 20)
        pieces = [model(ids, cache, mask, position_ids=positions)]
        for j in range(3):  # then one token at a time
            width = ids.size(1) + j + 1
            pieces.append(model(extra[:, j : j + 1], cache, full_mask[:, :width], position_ids=full_pos[:, width - 1 : width]))
    assert cache.length == full_ids.size(1)
    cached = torch.cat(pieces, 1)
    real = full_mask.bool()
    with torch.no_grad():
        reference64 = float64(model)(full_ids, attention_mask=full_mask, position_ids=full_pos)
    # Both orders of the arithmetic against the float64 run (tests/README.md): the embeddings,
    # 2 layers (FFN 256), the final norm and the tied head
    assert_same_function(cached, reference, reference64, mask=real, depth=4, k=256, name="logits", labels=("cached", "uncached"))


def test_greedy_equals_transformers_greedy(model, tmp_path):
    transformers = pytest.importorskip("transformers")
    from ctxkit.models.gpt2.model import save_gpt2

    save_gpt2(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids, mask = left_pad(PROMPTS)
    ours = generate(model, ids, mask, GenerationConfig(max_new_tokens=12))
    theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(ours, theirs)


def test_greedy_matches_an_uncached_argmax_loop_and_beam_one(model):
    ids, mask = left_pad(PROMPTS)
    out = generate(model, ids, mask, GenerationConfig(max_new_tokens=8))
    tokens, m = ids, mask
    with torch.no_grad():
        for _ in range(8):  # the slow way: the whole sequence every step
            nxt = model(tokens, attention_mask=m, position_ids=(m.cumsum(-1) - 1).clamp(min=0))[:, -1].argmax(-1, keepdim=True)
            tokens, m = torch.cat([tokens, nxt], 1), torch.cat([m, torch.ones_like(nxt)], 1)
    assert torch.equal(out, tokens)
    assert torch.equal(generate(model, ids, mask, GenerationConfig(max_new_tokens=8, num_beams=1)), out)


def test_beam_search_finds_sequences_at_least_as_likely_as_greedy(model):
    def logprob(seq, prompt_len):
        with torch.no_grad():
            logp = model(seq[None])[0].log_softmax(-1)
        return sum(logp[t - 1, seq[t]].item() for t in range(prompt_len, len(seq)))

    prompt = torch.tensor([PROMPTS[0]])
    greedy = generate(model, prompt, config=GenerationConfig(max_new_tokens=6))[0]
    beam = generate(model, prompt, config=GenerationConfig(max_new_tokens=6, num_beams=4, length_penalty=0.0))[0]
    assert len(beam) == len(greedy)
    assert logprob(beam, 6) >= logprob(greedy, 6) - 1e-5


def test_sampling_is_reproducible_and_filters_hold(model):
    ids, mask = left_pad(PROMPTS)
    cfg = GenerationConfig(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=5)
    a = generate(model, ids, mask, cfg, generator=torch.Generator().manual_seed(3))
    b = generate(model, ids, mask, cfg, generator=torch.Generator().manual_seed(3))
    c = generate(model, ids, mask, cfg, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    # Every sampled token was among the 5 most likely at its step.
    with torch.no_grad():
        logits = model(a, attention_mask=torch.cat([mask, torch.ones(3, 10, dtype=torch.long)], 1),
                       position_ids=(torch.cat([mask, torch.ones(3, 10, dtype=torch.long)], 1).cumsum(-1) - 1).clamp(min=0))
    top5 = logits[:, ids.size(1) - 1 : -1].topk(5, dim=-1).indices
    assert (top5 == a[:, ids.size(1):, None]).any(-1).all()


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    kept = filter_logits(logits, top_p=0.8).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True, True, True, True]]  # 0.5+0.3 reaches 0.8
    assert filter_logits(logits, top_k=2).isfinite().sum(1).tolist() == [2, 4]  # ties with the k-th survive
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(filter_logits(logits[:1], top_p=0.8).softmax(-1).expand(2000, -1), 1, generator=g)
    assert set(draws.flatten().tolist()) == {0, 1}


def test_repetition_penalty_stop_sequences_and_eos(model):
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    assert apply_repetition_penalty(logits, torch.tensor([[0, 1]]), 2.0).tolist() == [[1.0, -4.0, 1.0]]
    ids, mask = left_pad(PROMPTS)
    plain = generate(model, ids, mask, GenerationConfig(max_new_tokens=10))
    row = plain[0, ids.size(1):].tolist()
    stop = row[2:4]  # a pair row 0 really produces; it may occur earlier too
    end = next(k + 2 for k in range(len(row) - 1) if row[k : k + 2] == stop)
    stopped = generate(model, ids, mask, GenerationConfig(max_new_tokens=10, stop_sequences=[stop], pad_token_id=0))
    assert stopped[0, ids.size(1) : ids.size(1) + end].tolist() == row[:end]  # kept up to and including the stop
    assert (stopped[0, ids.size(1) + end :] == 0).all()  # padded after it
    assert stopped[1:].tolist() == plain[1:].tolist() or _ends_before(plain[1:, ids.size(1):].tolist(), stop)
    eos = plain[1, ids.size(1)].item()  # row 1's first new token
    ended = generate(model, ids, mask, GenerationConfig(max_new_tokens=10, eos_token_id=eos))
    assert ended[1, ids.size(1)].item() == eos and (ended[1, ids.size(1) + 1 :] == 0).all()
    assert ended[0].tolist() == plain[0].tolist()  # rows that never emit it run to max_new_tokens
    penalised = generate(model, ids, mask, GenerationConfig(max_new_tokens=10, repetition_penalty=5.0))
    assert len(set(penalised[0, ids.size(1):].tolist())) >= len(set(plain[0, ids.size(1):].tolist()))
    with pytest.raises(ValueError, match="temperature"):
        generate(model, ids, mask, GenerationConfig(do_sample=True, temperature=0.0))


def _ends_before(rows, stop):
    return all(any(r[k : k + 2] == stop for k in range(len(r) - 1)) for r in rows)


@pytest.fixture(scope="module")
def gpt2_dir(shared_data, tmp_path_factory):
    """A tiny GPT-2 with a BPE vocabulary trained on real text, saved in the HF layout."""
    from ctxkit.models.gpt2.model import save_gpt2
    from ctxkit.tokenizers import ByteLevelBPETokenizer, read_lines

    lines = [line for line in read_lines(shared_data / "wikitext-2-raw" / "wiki.valid.raw.xz") if line.strip()]
    tok = ByteLevelBPETokenizer.train(iter(lines), vocab_size=500, show_progress=False)
    folder = tmp_path_factory.mktemp("gpt2cli")
    torch.manual_seed(0)
    save_gpt2(GPT2LMHeadModel(CONFIG.replace(vocab_size=tok.vocab_size)).eval(), folder)
    tok.save(folder)
    return folder, tok


def test_cli_generate_streams_the_same_text_as_the_api(gpt2_dir, capsys, monkeypatch):
    import io

    from ctxkit.cli import main
    from ctxkit.models.gpt2.model import load_gpt2

    folder, tok = gpt2_dir
    model = load_gpt2(folder)
    ids = tok.encode("The history of")
    expected = tok.decode(generate(model, torch.tensor([ids]), config=GenerationConfig(max_new_tokens=12, eos_token_id=tok.eos_id,
                                                                                      pad_token_id=tok.eos_id))[0, len(ids):].tolist())
    assert main(["generate", str(folder), "--prompt", "The history of", "--max-new-tokens", "12", "--greedy", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == "The history of" + expected + "\n"
    # A stop string cuts the continuation where it first appears.
    stop = expected[3:6]
    assert main(["generate", str(folder), "--prompt", "The history of", "--max-new-tokens", "12", "--greedy", "--stop", stop,
                 "--no-echo", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == expected[: expected.find(stop)] + "\n"
    # Sampling with a seed is reproducible; the interactive loop reads one prompt per line.
    monkeypatch.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
    args = ["generate", str(folder), "--max-new-tokens", "8", "--seed", "5", "--device", "cpu"]
    assert main(args) == 0
    first = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
    assert main(args) == 0
    assert capsys.readouterr().out == first and first.startswith("one") and "\ntwo" in first
    assert main(["generate", str(folder), "--prompt", "x", "--max-new-tokens", "64", "--device", "cpu"]) == 2
    assert "leaves no room" in capsys.readouterr().err


# --- the fixed-shape (static cache) step that CUDA graphs replay, run eagerly on CPU ---

@pytest.mark.parametrize("settings", [dict(), dict(repetition_penalty=1.4), dict(eos_token_id="row1")])
def test_static_cache_decoding_equals_the_plain_loop(model, settings):
    ids, mask = left_pad(PROMPTS)
    if settings.get("eos_token_id") == "row1":
        settings = dict(eos_token_id=generate(model, ids, mask, GenerationConfig(max_new_tokens=2))[1, -1].item())
    cfg = GenerationConfig(max_new_tokens=20, **settings)
    plain = generate(model, ids, mask, cfg, static=False)
    fixed = generate(model, ids, mask, cfg, static=True)
    assert torch.equal(plain, fixed)
    assert generate(model, ids, mask, cfg, static=True).tolist() == fixed.tolist()  # the cached decoder is reset per call


def test_static_decoding_stops_when_every_row_ended(model):
    """Identical rows end at the same step: the output stops there, like the plain loop."""
    ids, mask = left_pad([PROMPTS[0]] * 2)
    first = generate(model, ids, mask, GenerationConfig(max_new_tokens=3))[0, ids.size(1):].tolist()
    cfg = GenerationConfig(max_new_tokens=30, eos_token_id=first[-1])
    end = first.index(first[-1]) + 1  # the token's first occurrence ends the rows
    plain = generate(model, ids, mask, cfg, static=False)
    fixed = generate(model, ids, mask, cfg, static=True)
    assert plain.size(1) == ids.size(1) + end and torch.equal(plain, fixed)
    streamed = []
    generate(model, ids, mask, GenerationConfig(max_new_tokens=30), static=True,
             on_tokens=lambda new: streamed.append(new.tolist()) or torch.tensor([len(streamed) >= 5] * 2))
    assert len(streamed) == 5  # a callback's stop ends the rows too


def test_static_sampling_is_reproducible_and_filters_hold(model):
    ids, mask = left_pad(PROMPTS)
    cfg = GenerationConfig(max_new_tokens=12, do_sample=True, top_k=4, temperature=1.5)
    a = generate(model, ids, mask, cfg, generator=torch.Generator().manual_seed(5), static=True)
    b = generate(model, ids, mask, cfg, generator=torch.Generator().manual_seed(5), static=True)
    c = generate(model, ids, mask, cfg, generator=torch.Generator().manual_seed(6), static=True)
    assert torch.equal(a, b) and not torch.equal(a, c)
    full = torch.cat([mask, torch.ones(3, 12, dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(a, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(min=0))
    top4 = logits[:, ids.size(1) - 1 : -1].topk(4, dim=-1).indices
    assert (top4 == a[:, ids.size(1):, None]).any(-1).all()
    with pytest.raises(ValueError, match="beam search"):
        generate(model, ids, mask, GenerationConfig(num_beams=2), static=True)


def test_numpy_gemv_decoding_equals_torch_and_restores_threads(model):
    from ctxkit.decoding.cpu_gemv import NumpyGemv

    x, w, b = torch.randn(2, 1, 64), torch.randn(96, 64), torch.randn(96)
    with torch.no_grad(), NumpyGemv():
        routed = torch.nn.functional.linear(x, w, b)
    # 64-term dot products plus a bias, each at the size sum |x_j w_ij| + |b_i| (tests/README.md)
    exact = x.double() @ w.double().T + b.double()
    assert_same_function(routed, x @ w.T + b, exact, k=65, scale=x.double().abs() @ w.double().abs().T + b.double().abs(),
                         name="linear", labels=("numpy GEMV", "torch"))
    threads = torch.get_num_threads()
    for prompts in (PROMPTS[:1], PROMPTS[:2]):
        ids, mask = left_pad(prompts)
        cfg = GenerationConfig(max_new_tokens=12)
        assert torch.equal(generate(model, ids, mask, cfg, cpu_gemv=True), generate(model, ids, mask, cfg, cpu_gemv=False))
    assert torch.get_num_threads() == threads


def test_compiled_static_step_on_cpu_equals_the_plain_loop():
    """The CPU fast path: frozen weights and Inductor's C++ GEMMs, autotuned per GEMM shape.

    Max-autotune compiles and times every candidate kernel of every distinct GEMM (shape and
    input strides; ~3-5 s each on 2 cores), so this model has two: q/k/v and the 96-token LM
    head are 96 x 32, the attention output and both FFN matrices 32 x 32. Two rows, not one:
    a one-row step's (1, 32) inputs come with two stride layouts, which made three.
    """
    torch.manual_seed(0)
    small = GPT2LMHeadModel(GPT2Config(num_layers=1, hidden_size=32, num_heads=2, vocab_size=96, max_position=64, ffn_size=32)).eval()
    ids, mask = left_pad([[5, 17, 42, 8, 9, 30], [11, 3]])  # the second row left-padded: the step's key mask too
    cfg = GenerationConfig(max_new_tokens=16)
    assert torch.equal(generate(small, ids, mask, cfg, plan="auto+compile"), generate(small, ids, mask, cfg, static=False, cpu_gemv=False))


def test_static_decoders_are_shared_across_prompt_lengths(model):
    model.__dict__.pop("_ctxkit_static_decoders", None)
    cfg = GenerationConfig(max_new_tokens=7)
    for prompt in ([5, 6, 7], [8, 9, 10, 11, 12, 13], [4]):
        ids, mask = left_pad([prompt])
        assert torch.equal(generate(model, ids, mask, cfg, static=True), generate(model, ids, mask, cfg, static=False))
    assert len(model._ctxkit_static_decoders) == 1  # one 64-slot decoder served all three


def test_chunked_argmax_equals_argmax_including_ties():
    from ctxkit.decoding.static_decode import chunked_argmax

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50257, generator=g)
    logits[1, 7] = logits[1, 3000] = 100.0  # a tie across chunks: the first index wins
    logits[2, 1025] = logits[2, 1030] = 100.0  # a tie inside one chunk
    logits[3, -1] = 100.0  # the last, partial chunk
    got = chunked_argmax(logits)
    assert got.tolist() == logits.argmax(-1).tolist()
    assert got[1:4].tolist() == [7, 1025, 50256]
    assert chunked_argmax(logits[:, :300], chunk=64).tolist() == logits[:, :300].argmax(-1).tolist()


def test_generate_and_perplexity_take_a_run_folder_or_a_model_name(gpt2_dir, tmp_path, capsys, monkeypatch):
    """One way to name a model: the run folder (runs/x, its best/ inside), the folder itself,
    or a name the zoo knows (gpt2: resolved to its Hub repository; offline and not cached, one
    clear line)."""
    import shutil

    from ctxkit.cli import main

    folder, _ = gpt2_dir
    run = tmp_path / "runs" / "gpt"
    shutil.copytree(folder, run / "best")
    args = ["--prompt", "The history of", "--max-new-tokens", "6", "--greedy", "--device", "cpu"]
    assert main(["generate", str(folder), *args]) == 0
    direct = capsys.readouterr().out
    assert main(["generate", str(run), *args]) == 0
    assert capsys.readouterr().out == direct
    (tmp_path / "text.txt").write_text("The history of the world is long.\n" * 4, encoding="utf-8")
    assert main(["perplexity", str(run), str(tmp_path / "text.txt"), "--device", "cpu", "--no-progress"]) == 0
    assert "perplexity" in capsys.readouterr().out
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["generate", "gpt2", *args]) == 2
    assert "openai-community/gpt2" in capsys.readouterr().err  # the name was resolved, then the cache was asked


def test_generate_a_preset_only_with_random_init(capsys):
    """`ctxkit generate gpt2_2_128_2` says it is a preset; with --random-init it samples from
    random weights over a byte-level vocabulary, reproducibly for a seed (issue 38 item 5)."""
    from ctxkit.cli import main

    assert main(["generate", "gpt2_2_128_2", "--prompt", "hi"]) == 2
    assert "is a preset (an architecture, no weights): add --random-init" in capsys.readouterr().err
    runs = []
    for _ in range(2):
        assert main(["generate", "gpt2_2_128_2", "--random-init", "--prompt", "hi", "--max-new-tokens", "6", "--seed", "3",
                     "--device", "cpu", "--fast", "reference"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] and runs[0].startswith("hi") and len(runs[0].encode("utf-8")) > len("hi\n")
