"""The generation server under load: continuous batching against one request at a time (issue 40 item 2).

    PYTHONPATH=src python benchmarks/serve_generate.py --corpus .devdata/wiki                # GPU: GPT-2 small, 512 requests
    PYTHONPATH=src python benchmarks/serve_generate.py --preset tiny --device cpu \\
        --requests 16 --concurrency 1,4 --peer-requests 4 --prompt-tokens 8,32 --output-tokens 4,16   # CPU, a few seconds

The script builds a GPT-2 folder (HF layout) with random weights and a byte-level BPE
tokenizer trained on ``--corpus`` (text files, ``.xz`` read with lzma, or folders of them;
without it a built-in generated text): ``--preset gpt2`` is GPT-2 small (12 layers, width 768,
context 1024, the tokenizer's vocabulary, 50,257 from 8M characters of Wikipedia), ``--preset
tiny`` 2 layers of width 64 over a vocabulary of 300. The workload: ``--requests`` requests
whose prompt lengths are uniform in ``--prompt-tokens`` (16-512) and output lengths in
``--output-tokens`` (16-256), from a seeded RNG; each prompt is a window of the corpus cut to
its length in tokens, ``max_new_tokens`` is its output length, and each is sampled with its
own seed (temperature 1, ``--top-k`` 50). End-of-text may end a request early (rare with
random weights): throughput counts the tokens that arrive.

Three servers, each a subprocess on a loopback port, driven by the same streaming client
(``benchmarks/sse_load.py``: raw HTTP/1.1, server-sent events stamped as they arrive,
connections spread over ``--client-processes``):

* ctxkit: ``ctxkit serve FOLDER --max-batch S`` (the product; S = the largest concurrency),
  at each ``--concurrency``; concurrency 1 on the first ``--peer-requests`` requests. The
  server picks its precision (bf16 on a GPU, fp32 on a CPU), CUDA graphs per batch width
  (on a GPU) and its prefill chunk (``--prefill-chunk`` passes one on); the records say
  which, from its ``/health``;
* peer (a): the same command with ``--max-batch 1`` (one request at a time), concurrency 1,
  the first ``--peer-requests`` requests: the baseline of the target;
* peer (b): transformers' ``generate`` with its static cache behind the same HTTP API
  (``benchmarks/hf_generate_server.py``), one request at a time, the same requests, in the
  precision ctxkit serves in (bf16 on a GPU).

Each server gets ``--warmup`` requests first (not counted). Per run: output tokens per second
(all tokens received / wall time from first send to last answer), time to first token and
inter-token latency (gaps between a request's events) p50 and p99. Target on one H100: at
concurrency 64, >= 5x the throughput of (a) with a p99 inter-token latency <= 3x (a)'s.
Records (benchmarks/results/serve_generate.json, or ``--results``): one per concurrency
against (a) and one against (b), and (a) against (b).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import lzma
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from harness import command_line, device_name, speed_record, write_records
from sse_load import run_stream_load, summarize

import ctxkit
from ctxkit.models.gpt2.model import GPT2Config, GPT2LMHeadModel, save_gpt2
from ctxkit.tokenizers import ByteLevelBPETokenizer

HERE = Path(__file__).resolve().parent
PRESETS = {  # name: (layers, width, heads, context, tokenizer vocabulary, description)
    "gpt2": (12, 768, 12, 1024, 50257, "GPT-2 small (12 layers, width 768)"),
    "tiny": (2, 64, 4, 1024, 300, "tiny GPT-2 (2 layers, width 64)"),
}
_WORDS = ("the of and to in a is was for on as by with from that at his an were are which this be or has had first "
          "river bank city school season team album film music county village station line church war world year new "
          "two one after during between under north south national american born known played released built located "
          "population district university game series history family government party club league water music "
          "professional career music").split()


def read_corpus(paths, max_chars: int) -> str:
    """Up to ``max_chars`` characters of text from files and folders (``.xz``: lzma; wikiextractor's
    ``<doc>`` lines dropped)."""
    files = []
    for p in map(Path, paths):
        files += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    parts, total = [], 0
    for f in files:
        opener = lzma.open if f.suffix == ".xz" else open
        with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
            text = re.sub(r"</?doc[^>]*>\n?", "", fh.read(max_chars - total))
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if not total:
        raise SystemExit(f"--corpus {' '.join(map(str, paths))}: no text")
    return "".join(parts)


def builtin_text(chars: int, seed: int = 0) -> str:
    """Generated sentences over a small word list (no corpus): enough for prompts of any length."""
    rng = random.Random(seed)
    out, total = [], 0
    while total < chars:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 24))]
        sentence = " ".join(words).capitalize() + rng.choice(".,;.") + (" " if rng.random() < 0.9 else "\n")
        out.append(sentence)
        total += len(sentence)
    return "".join(out)


def build_folder(folder: Path, preset: str, text: str) -> tuple:
    """A GPT-2 folder (HF layout: config.json, weights, tokenizer files) with random weights
    (seed 0); returns (tokenizer, description)."""
    layers, width, heads, context, vocab, name = PRESETS[preset]
    tokenizer = ByteLevelBPETokenizer.train(iter([text]), vocab_size=vocab, min_frequency=2, show_progress=False, max_length=context)
    torch.manual_seed(0)
    config = GPT2Config(num_layers=layers, hidden_size=width, num_heads=heads, vocab_size=tokenizer.vocab_size, max_position=context,
                        ffn_size=4 * width, dropout=0.0, attention_dropout=0.0)
    save_gpt2(GPT2LMHeadModel(config).eval(), folder)
    tokenizer.save(folder)
    return tokenizer, f"{name}, random weights (fp32 on disk), vocabulary {tokenizer.vocab_size}, context {context}"


def workload(tokenizer, text: str, n: int, prompt_range, output_range, top_k: int, seed: int = 0) -> list:
    """``n`` request bodies: prompts of corpus text cut to a uniform number of tokens, uniform
    ``max_new_tokens``, sampled with each its own seed."""
    rng = random.Random(seed)
    ids = tokenizer.encode(text[:4_000_000])
    if len(ids) < prompt_range[1] + 2:
        raise SystemExit(f"the corpus has {len(ids)} tokens, fewer than the longest prompt ({prompt_range[1]})")
    bodies = []
    for i in range(n):
        want, new = rng.randint(*prompt_range), rng.randint(*output_range)
        start = rng.randrange(len(ids) - want)
        cut = ids[start:start + want]
        prompt = tokenizer.decode(cut)
        while len(cut) > 1 and len(tokenizer.encode(prompt)) > want:  # a cut inside a character encodes longer
            cut = cut[:-1]
            prompt = tokenizer.decode(cut)
        bodies.append({"prompt": prompt, "max_new_tokens": new, "temperature": 1.0, "top_k": top_k, "seed": seed * 100_003 + i})
    return bodies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(f"{url}/health", timeout=timeout) as answer:
        return json.loads(answer.read())


@contextlib.contextmanager
def servers(commands: dict, folder: Path, threads, optional=("hf",), wait_s: float = 900.0):
    """Start every server of ``commands`` (name -> argv, ``--port P`` added) at once and wait
    for each one's /health; yields name -> URL. Idle servers sit beside the one measured
    (their start-ups, imports mostly, overlap; none takes part in another's run). An
    ``optional`` server that does not come up is left out, with its log's tail printed."""
    src = str(Path(ctxkit.__file__).resolve().parents[1])  # ctxkit importable by the children, as here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
           "PYTHONUNBUFFERED": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    procs, urls = {}, {}
    try:
        for name, argv in commands.items():
            port = free_port()
            with open(folder / f"{name}.log", "ab") as log:
                procs[name] = subprocess.Popen([*argv, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
            urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.time() + wait_s
        for name, proc in procs.items():
            while name in urls:
                if proc.poll() is not None or time.time() > deadline:
                    tail = (folder / f"{name}.log").read_text(errors="replace")[-3000:]
                    if name not in optional:
                        raise RuntimeError(f"the {name} server did not come up (exit status {proc.poll()}):\n{tail}")
                    print(f"the {name} server did not come up (exit status {proc.poll()}), left out:\n{tail}", flush=True)
                    del urls[name]
                    break
                with contextlib.suppress(OSError, ValueError):
                    health(urls[name], 2.0)
                    break
                time.sleep(0.25)
        yield urls
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure(url: str, bodies: list, concurrency: int, processes: int, timeout: float) -> dict:
    """One run of the streaming client, with the server's step counters around it (ctxkit only)."""
    before = health(url)
    load = run_stream_load(url, bodies, concurrency, processes, timeout=timeout)
    figures = summarize(load, [b["max_new_tokens"] for b in bodies])
    after = health(url)
    steps = after.get("stats", {}).get("steps", 0) - before.get("stats", {}).get("steps", 0)
    if steps:
        figures["steps_per_s"] = steps / figures["wall_s"] if figures["wall_s"] > 0 else 0.0  # the batcher's step rate
        figures["mean_rows_per_step"] = (after["stats"]["rows_stepped"] - before["stats"]["rows_stepped"]) / steps  # computed
        if "rows_active" in after["stats"]:  # occupied (the computed rows round up to a power of two)
            figures["mean_active_rows_per_step"] = (after["stats"]["rows_active"] - before["stats"].get("rows_active", 0)) / steps
    figures["concurrency"], figures["health"] = concurrency, after
    return figures


def warm(url: str, bodies: list, count: int, concurrency: int, processes: int, timeout: float) -> None:
    """Untimed requests: the longest prompt with the most new tokens of the mix first (a static
    cache at its full size, compiled kernels), then the first ``count`` of the mix with short outputs."""
    longest = max(bodies, key=lambda b: len(b["prompt"]))
    run_stream_load(url, [{**longest, "max_new_tokens": max(b["max_new_tokens"] for b in bodies)}], 1, 1, timeout=timeout)
    short = [{**b, "max_new_tokens": min(b["max_new_tokens"], 16)} for b in bodies[:count]]
    if short:
        run_stream_load(url, short, max(1, min(concurrency, len(short))), processes, timeout=timeout)


def _rounded(figures: dict, prefix: str = "") -> dict:
    keys = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_mean_ms", "requests", "output_tokens",
            "asked_tokens", "ended_early", "events", "errors", "wall_s", "client_cores", "mean_rows_per_step", "steps_per_s",
            "first_error")
    return {prefix + k: round(figures[k], 3) if isinstance(figures[k], float) else figures[k] for k in keys if k in figures}


def _chunk_flag(args) -> list:
    """``--prefill-chunk N`` for the ctxkit servers when asked (else their default)."""
    return ["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt2")
    parser.add_argument("--corpus", nargs="+", default=None, help="text files or folders (.xz read with lzma; default: built-in text)")
    parser.add_argument("--corpus-chars", type=int, default=8_000_000, help="characters read to train the tokenizer (default: 8M)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated (default: 1,16,64)")
    parser.add_argument("--peer-requests", type=int, default=64,
                        help="requests of the one-at-a-time runs (the peers and concurrency 1): the first N of the mix (default: 64)")
    parser.add_argument("--prompt-tokens", default="16,512", help="MIN,MAX prompt length in tokens (default: 16,512)")
    parser.add_argument("--output-tokens", default="16,256", help="MIN,MAX max_new_tokens (default: 16,256)")
    parser.add_argument("--top-k", type=int, default=50, help="top-k of the sampling (0: all; default: 50)")
    parser.add_argument("--seed", type=int, default=0, help="the workload's RNG (default: 0)")
    parser.add_argument("--warmup", type=int, default=8, help="untimed requests per server (default: 8)")
    parser.add_argument("--client-processes", type=int, default=2, help="processes of the streaming client (1: in this process)")
    parser.add_argument("--server-threads", type=int, default=None, help="OMP_NUM_THREADS of the servers (default: unset)")
    parser.add_argument("--request-timeout", type=float, default=300.0,
                        help="seconds a request may take; then it counts as an error (default: 300)")
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help="ctxkit serve --prefill-chunk: prompt tokens prefilled per step while others decode (default: the server's)")
    parser.add_argument("--no-hf", action="store_true", help="skip peer (b), transformers' generate")
    parser.add_argument("--keep", default=None, help="keep the model folder and server logs here (default: a temporary folder)")
    parser.add_argument("--results", default=None, help="records file (default: benchmarks/results/serve_generate.json)")
    args = parser.parse_args(argv)
    concurrencies = sorted({int(c) for c in args.concurrency.split(",")})
    prompt_range = tuple(int(x) for x in args.prompt_tokens.split(","))
    output_range = tuple(int(x) for x in args.output_tokens.split(","))
    slots = max(concurrencies)
    context = PRESETS[args.preset][3]
    if prompt_range[1] + output_range[1] > context:
        raise SystemExit(f"prompts up to {prompt_range[1]} + outputs up to {output_range[1]} tokens exceed the context of {context}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device here")
    hf = not args.no_hf and importlib.util.find_spec("transformers") is not None
    if not hf and not args.no_hf:
        print("transformers is not installed: peer (b) skipped", flush=True)

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="serve_generate_"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        text = read_corpus(args.corpus, args.corpus_chars) if args.corpus else builtin_text(min(args.corpus_chars, 400_000))
        folder = tmp / f"gpt2-{args.preset}-random"
        tokenizer, model_case = build_folder(folder, args.preset, text)
        bodies = workload(tokenizer, text, args.requests, prompt_range, output_range, args.top_k, args.seed)
        few = bodies[:args.peer_requests]
        print(f"model folder and {len(bodies)} requests ready in {time.perf_counter() - start:.1f} s: {model_case}", flush=True)
        serve = [sys.executable, "-m", "ctxkit", "serve", str(folder), "--device", args.device, *_chunk_flag(args)]
        commands = {"ctxkit": [*serve, "--max-batch", str(slots)], "one": [*serve, "--max-batch", "1"]}
        if hf:  # in the precision ctxkit serves in: bf16 on a GPU (the server's default), fp32 on a CPU
            commands["hf"] = [sys.executable, str(HERE / "hf_generate_server.py"), str(folder), "--device", args.device,
                              "--dtype", "bfloat16" if args.device.startswith("cuda") else "float32"]
        runs = {}  # (server, concurrency) -> figures
        with servers(commands, tmp, args.server_threads) as urls:
            print(f"servers up in {time.perf_counter() - start:.1f} s", flush=True)
            warm(urls["ctxkit"], bodies, args.warmup, slots, args.client_processes, args.request_timeout)
            for c in concurrencies:
                runs["ctxkit", c] = measure(urls["ctxkit"], few if c == 1 else bodies, c, args.client_processes, args.request_timeout)
                print(f"ctxkit serve --max-batch {slots}, concurrency {c}: {runs['ctxkit', c]['tokens_per_s']:.1f} tokens/s", flush=True)
                _keep_runs(tmp, runs)
            for name in [n for n in urls if n != "ctxkit"]:
                warm(urls[name], bodies, args.warmup, 1, 1, args.request_timeout)
                runs[name, 1] = measure(urls[name], few, 1, 1, args.request_timeout)
                print(f"{name}, concurrency 1: {runs[name, 1]['tokens_per_s']:.1f} tokens/s", flush=True)
                _keep_runs(tmp, runs)
        hf_name = None
        if ("hf", 1) in runs:
            import transformers

            cache = runs["hf", 1]["health"]["cache"]
            hf_name = (f"transformers {transformers.__version__} generate, {cache} cache, {runs['hf', 1]['health'].get('dtype')}"
                       + (f" (static failed: {runs['hf', 1]['health']['static_error']})" if cache != "static" else "")
                       + f", one request at a time behind the same HTTP API, concurrency 1, first {len(few)} requests")

        records = report(args, argv, runs, concurrencies, slots, model_case, prompt_range, output_range, len(bodies), len(few), hf_name)
        print(f"wrote {write_records('serve_generate.json', records, args.results)}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _keep_runs(folder: Path, runs: dict) -> None:
    """The figures so far, in ``folder/runs.json``: a run stopped from outside keeps them."""
    (folder / "runs.json").write_text(json.dumps({f"{name} c={c}": r for (name, c), r in runs.items()}, default=str))


def report(args, argv, runs, concurrencies, slots, model_case, prompt_range, output_range, n, few, hf_name) -> list:
    """Print the table and the target; returns the records."""
    rows = [(f"ctxkit serve --max-batch {slots}", runs["ctxkit", c]) for c in concurrencies]
    rows.append(("ctxkit serve --max-batch 1", runs["one", 1]))
    if ("hf", 1) in runs:
        rows.append((f"transformers generate ({runs['hf', 1]['health']['cache']} cache)", runs["hf", 1]))
    print(f"\n{'server':36s} {'conc':>4s} {'reqs':>5s} {'tokens':>7s} {'tokens/s':>9s} {'TTFT p50':>9s} {'p99':>8s} "
          f"{'ITL p50':>8s} {'p99':>8s} {'rows/step':>9s} {'errors':>6s}")
    for name, r in rows:
        print(f"{name:36s} {r['concurrency']:4d} {r['requests']:5d} {r['output_tokens']:7d} {r['tokens_per_s']:9.1f} "
              f"{r['ttft_p50_ms']:9.1f} {r['ttft_p99_ms']:8.1f} {r['itl_p50_ms']:8.2f} {r['itl_p99_ms']:8.2f} "
              f"{r.get('mean_rows_per_step', float('nan')):9.1f} {r['errors']:6d}")
    one = runs["one", 1]
    top = runs["ctxkit", max(concurrencies)]
    speedup, itl_ratio = _ratio(top["tokens_per_s"], one["tokens_per_s"]), _ratio(top["itl_p99_ms"], one["itl_p99_ms"])
    met = speedup >= 5 and itl_ratio <= 3 and not any(r["errors"] for _, r in rows)
    for name, r in rows:
        if r["errors"]:
            print(f"{name}, concurrency {r['concurrency']}: {r['errors']} failed request(s), the first: {r.get('first_error')}")
    print(f"\ntarget (concurrency {max(concurrencies)}): {speedup:.2f}x the one-at-a-time throughput (>= 5x), p99 inter-token latency "
          f"{itl_ratio:.2f}x its (<= 3x): {'met' if met else 'not met'}", flush=True)

    device = device_name(args.device)
    server = runs["ctxkit", max(concurrencies)]["health"]
    workload_case = (f"{model_case}, served in {server.get('precision')}, prompts {prompt_range[0]}-{prompt_range[1]} tokens, "
                     f"outputs {output_range[0]}-{output_range[1]} tokens, sampled (temperature 1, top_k {args.top_k}), "
                     "streamed over HTTP (loopback)")
    chunk = " ".join(_chunk_flag(args))
    command = f"ctxkit serve FOLDER --max-batch {slots} --device {args.device}" + (f" {chunk}" if chunk else "")
    script = command_line("serve_generate.py", argv if argv is not None else sys.argv[1:])
    # how the server ran (its /health): precision, plan, CUDA graph widths, prefill chunk
    common = {"benchmark_command": script, "server_threads": args.server_threads, "client_processes": args.client_processes,
              "workload_seed": args.seed, "server_precision": server.get("precision"), "server_fast": server.get("fast"),
              "server_cuda_graphs": server.get("cuda_graphs"), "server_prefill_chunk": server.get("prefill_chunk")}
    one_name = f"ctxkit serve --max-batch 1 (one request at a time), concurrency 1, first {few} requests"
    records = []
    for c in concurrencies:
        r = runs["ctxkit", c]
        case = f"{workload_case}, concurrency {c} ({r['requests']} requests{', the first of the mix' if r['requests'] < n else ''}), " \
               f"--max-batch {slots}"
        extra = {**_rounded(r), **common, "itl_p99_ms_one_at_a_time": round(one["itl_p99_ms"], 3),
                 "itl_p99_vs_one_at_a_time": round(_ratio(r["itl_p99_ms"], one["itl_p99_ms"]), 3)}
        if c == max(concurrencies):
            extra.update(target="at the largest concurrency: >= 5x the one-at-a-time throughput, p99 inter-token latency "
                                "<= 3x its", target_met=met)
        records.append(speed_record("serve_generate", case, "output tokens per second", "tokens/s", r["tokens_per_s"], one_name,
                                    one["tokens_per_s"], command, device=device, **extra, **_rounded(one, "peer_")))
        if hf_name:
            records.append(speed_record("serve_generate", case, "output tokens per second", "tokens/s", r["tokens_per_s"], hf_name,
                                        runs["hf", 1]["tokens_per_s"], command, device=device, **_rounded(r), **common,
                                        **_rounded(runs["hf", 1], "peer_")))
    if hf_name:
        case = f"{workload_case}, one request at a time (--max-batch 1), concurrency 1 ({few} requests, the first of the mix)"
        records.append(speed_record("serve_generate", case, "output tokens per second", "tokens/s", one["tokens_per_s"], hf_name,
                                    runs["hf", 1]["tokens_per_s"], command.replace(f"--max-batch {slots}", "--max-batch 1"),
                                    device=device, **_rounded(one), **common, **_rounded(runs["hf", 1], "peer_")))
    return records


if __name__ == "__main__":
    raise SystemExit(main())
